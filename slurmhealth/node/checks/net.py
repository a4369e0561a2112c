"""Network links: Ethernet and IPoIB interfaces up with carrier, at their MTU, not flapping (the
`net` part of the kernel source: /sys/class/net, Documentation/ABI/testing/sysfs-class-net).

Which interfaces are judged: the `up` list (config, else the interfaces this node had up with
carrier in its own known-good runs: learned.py); without either none is required up. Virtual
interfaces are never judged unless listed: an interface without a `device` link (no parent bus
device: lo, bridges, veth, bonds, tunnels), of type loopback (772, include/uapi/linux/if_arp.h),
or named as container and virtualisation software names its own (docker*, veth*, virbr*, ...).

Up: operstate "up" (RFC 2863 as the kernel reports it; "unknown" where a driver does not track
it) and carrier 1. A listed interface that is missing or down fails (drain): jobs that use it
lose their storage, their Slurm traffic or their IPoIB.

Flaps: carrier_changes counts every carrier transition since the interface was created (a
reboot or a driver reload starts it again at 0), so one flap (down, then up) is two changes.
Judged as the ib area judges its counters: the delta since the previous run on this node, per
hour over the interval between the readings. A lower value, or another boot (boot_id), is a new
baseline, never a flap. Warn at `flaps_warn` per hour with at least one flap (any flap killed
in-flight traffic); fail at `flaps_fail` per hour with at least 3 flaps: gpud's 3 flaps within
Azure's 6-hour window (azurehpc-health-checks azure_ib_link_flapping.nhc), 3 / 6 h = 0.5/h, the
ib area's link_downed rule. With no interval known (a baseline without its time) the counts
alone judge. Every physical interface is judged for flaps, listed or not: a flapping link is
plainly wrong on any node.
"""

from __future__ import annotations

import time

from slurmhealth.core.result import DRAIN, Result, counted, fail, ok, warn
from slurmhealth.node.checks.base import Context, summarize, uint

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "net"
SOURCE = "kernel"

DEFAULTS: Schema = {
    "up": (
        None,
        list,
        "interfaces expected up with carrier (eth0, ib0); unset: those up in the node's "
        "known-good runs, else none",
    ),
    "mtu": (None, dict, "interface -> expected MTU ({ ib0 = 4092, eth0 = 9000 }); unset: any"),
    "flaps_warn": (0.0, float, "link flaps per hour that warn, with at least 1 flap: any"),
    "flaps_fail": (
        0.5,
        float,
        "link flaps per hour that fail, with at least 3 flaps: 3 in 6 h (gpud, Azure HPC)",
    ),
}

FAIL_MIN = 3  # flaps before a rate may fail: gpud's flapping port
LOOPBACK = 772  # ARPHRD_LOOPBACK
# Names container and virtualisation software gives its own interfaces (Docker, libvirt, CNI
# plugins, Open vSwitch, the kernel's ifb/dummy/tunnel drivers).
VIRTUAL = (
    "lo",
    "docker",
    "veth",
    "virbr",
    "br-",
    "cali",
    "flannel",
    "cni",
    "vxlan",
    "tun",
    "tap",
    "ifb",
    "dummy",
    "kube-",
    "ovs-",
    "genev",
)
_NAME_MAX = 32



def physical(name: str, link: dict[str, Any]) -> bool:
    """A link to judge unlisted: has a parent device, is not loopback, not a virtual name."""
    return bool(link.get("device")) and link["type"] != LOOPBACK and not name.startswith(VIRTUAL)


def _link(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    operstate = raw.get("operstate")
    link = {
        "operstate": operstate.strip()[:_NAME_MAX] if isinstance(operstate, str) else None,
        "carrier": uint(raw.get("carrier")),
        "changes": uint(raw.get("carrier_changes")),
        "type": uint(raw.get("type")),
        "mtu": uint(raw.get("mtu")),
        "speed": uint(raw.get("speed")),
        "device": raw.get("device") is True,
    }
    link["physical"] = physical(name, link)
    return link


def parse(raw: object) -> Facts:
    """The kernel source's raw facts -> {"links": {name: facts}, "boot_id"}; pure and total."""
    raw = raw if isinstance(raw, dict) else {}
    found = raw.get("net")
    part = found if isinstance(found, dict) else {}
    links = {
        str(name)[:_NAME_MAX]: _link(str(name)[:_NAME_MAX], value)
        for name, value in part.items()
        if isinstance(value, dict)
    }
    boot = raw.get("boot_id")
    return {"links": links, "boot_id": boot if isinstance(boot, str) else None}


def _listed(ctx: Context) -> list[str]:
    value = ctx.expect.get("up")
    return [str(v) for v in value] if isinstance(value, list) else []


def names(expect: dict[str, Any]) -> list[str]:
    """The interfaces the checks name (up, then mtu): runner.run hands them to the kernel
    source, whose job-hook read skips the link files of an unnamed interface without a parent
    device."""
    up = expect.get("up")
    mtu = expect.get("mtu")
    listed = [str(v) for v in up] if isinstance(up, list) else []
    return list(dict.fromkeys(listed + ([str(k) for k in mtu] if isinstance(mtu, dict) else [])))


def is_up(link: dict[str, Any]) -> bool:
    return link["operstate"] in ("up", "unknown") and link["carrier"] == 1


def link_up(facts: Facts, ctx: Context) -> Result:
    """Every expected interface is present, up and has carrier (missing or down: drain)."""
    wanted = _listed(ctx)
    if not wanted:
        return ok("no interfaces expected up: not judged")
    problems: list[str] = []
    data: dict[str, Any] = {}
    for name in wanted:
        link = facts["links"].get(name)
        if link is None:
            problems.append(f"{name} missing")
            data[name] = None
            continue
        data[name] = {"operstate": link["operstate"], "carrier": link["carrier"]}
        if not is_up(link):
            carrier = "no carrier" if link["carrier"] != 1 else "carrier"
            problems.append(f"{name} {link['operstate'] or 'state unknown'}, {carrier}")
    if problems:
        return fail(summarize(problems, " interface"), data, DRAIN)
    return ok(f"{counted(len(wanted), 'interface')} up", data)


def mtu(facts: Facts, ctx: Context) -> Result:
    """Interfaces at their expected MTU (a jumbo-frame or IPoIB MTU lost breaks jobs' traffic)."""
    wanted = ctx.expect.get("mtu")
    if not isinstance(wanted, dict) or not wanted:
        return ok("no MTU expected: not judged")
    problems: list[str] = []
    data: dict[str, Any] = {}
    for name, value in wanted.items():
        link = facts["links"].get(str(name))
        data[str(name)] = link["mtu"] if link else None
        if link is None:
            problems.append(f"{name} missing")
        elif link["mtu"] != value:
            problems.append(f"{name} MTU {link['mtu']}, expected {value}")
    if problems:
        return fail(summarize(problems, " interface"), data, DRAIN)
    return ok(f"{counted(len(wanted), 'interface')} at the expected MTU", data)


def interval(ctx: Context) -> float | None:
    """Seconds since the baseline was taken; None when unknown or not positive."""
    then = ctx.baseline.get("taken_at") if isinstance(ctx.baseline, dict) else None
    if isinstance(then, bool) or not isinstance(then, (int, float)):
        return None
    seconds = float(ctx.now) - float(then)
    return seconds if seconds > 0 else None


def _level(count: int, seconds: float | None, ctx: Context) -> tuple[str | None, str]:
    """("fail"/"warn"/None, text) for `count` flaps over `seconds` (None: unknown)."""
    if count < 1:
        return None, ""
    default: float = DEFAULTS["flaps_fail"][0]
    warn_at = float(ctx.expect.get("flaps_warn", 0.0))
    fail_at = float(ctx.expect.get("flaps_fail", default))
    if seconds is None:
        level = "fail" if count >= FAIL_MIN else "warn"
        return level, f"{counted(count, 'flap')} since the last run"
    per_h = count * 3600.0 / seconds
    text = f"{counted(count, 'flap')} ({per_h:.3g}/h over {seconds / 3600:.3g} h)"
    if count >= FAIL_MIN and per_h >= fail_at:
        return "fail", text
    if per_h >= warn_at:
        return "warn", text
    return None, ""


def _judged(facts: Facts, ctx: Context) -> list[str]:
    listed = set(_listed(ctx))
    return sorted(n for n, x in facts["links"].items() if x["physical"] or n in listed)


def flaps(facts: Facts, ctx: Context) -> Result:
    """Carrier changes since the last run: a link that flaps warns, 3 flaps at 0.5/h fail."""
    names = [n for n in _judged(facts, ctx) if facts["links"][n]["changes"] is not None]
    if not names:
        return ok("no physical interfaces: not judged")
    before = ctx.baseline if isinstance(ctx.baseline, dict) else {}
    counts = before.get("carrier_changes")
    counts = counts if isinstance(counts, dict) else {}
    same_boot = before.get("boot_id") == facts["boot_id"]
    seconds = interval(ctx)
    fails: list[str] = []
    warns: list[str] = []
    data: dict[str, int] = {}
    fresh = 0
    for name in names:
        now, then = facts["links"][name]["changes"], counts.get(name)
        if not same_boot or not isinstance(then, int) or isinstance(then, bool) or now < then:
            fresh += 1
            continue
        data[name] = (now - then) // 2
        level, text = _level(data[name], seconds, ctx)
        if level:
            (fails if level == "fail" else warns).append(f"{name} {text}")
    if fails:
        return fail(summarize(fails + warns, " interface"), {"flaps": data}, DRAIN)
    if warns:
        return warn(summarize(warns, " interface"), {"flaps": data})
    if fresh == len(names):
        return ok("baseline recorded", {"flaps": data})
    note = f", new baseline for {fresh}" if fresh else ""
    return ok(f"no flaps on {counted(len(data), 'interface')} since last run{note}",
              {"flaps": data})


CHECKS = (link_up, mtu, flaps)


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """Carrier changes of every interface, the boot they were read in, and when."""
    changes = {n: x["changes"] for n, x in facts["links"].items() if x["changes"] is not None}
    return {
        "carrier_changes": changes,
        "boot_id": facts["boot_id"],
        "taken_at": time.time() if now is None else now,
    }


def expectations(facts: Facts) -> dict[str, Any]:
    """The physical interfaces this (known-good) node has up with carrier, and their MTUs."""
    up = sorted(n for n, x in facts["links"].items() if x["physical"] and is_up(x))
    if not up:
        return {}
    mtus = {n: facts["links"][n]["mtu"] for n in up if facts["links"][n]["mtu"] is not None}
    return {"up": up, "mtu": mtus} if mtus else {"up": up}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The links are expected readable when some are listed up."""
    return bool(expect.get("up"))
