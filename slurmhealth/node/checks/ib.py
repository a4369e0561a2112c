"""InfiniBand checks from sysfs (the `ib` section of a snapshot, see sources/sysfs.py).

Sources: the kernel's Documentation/ABI/stable/sysfs-class-infiniband and
drivers/infiniband/core/sysfs.c (layout, counter widths), the thresholds gpud and Meta's GCM use
(docs/sources.md). Ports must be ACTIVE/LinkUp at the expected rate in the prolog; counters are
judged as deltas in the epilog.

Which ports are judged: the `ports` expectation when set; else every port of the present HCAs
whose link layer is the expected one (InfiniBand by default), so a RoCE/Ethernet port is only
judged when it is listed. The firmware check looks at the HCAs carrying those ports plus the
expected `devices`, so an unrelated Ethernet NIC does not count as firmware drift; and among
those it compares only HCAs of one product (hca_type, else board_id: product()), so an iWARP
NIC listed beside the Mellanox HCAs is not their drift either.

Counter thresholds are deltas since the previous run on this node (prolog to epilog, epilog to
next prolog). A delta at or above `<counter>_warn` warns, at or above `<counter>_fail` fails
(drain). Defaults, per counter:
- symbol_error (16 bit): warn 10, fail 100. 10 is the SymbolErrorCounter threshold that
  infiniband-diags ships for ibqueryerrors (rdma-core infiniband-diags/etc/error_thresholds);
  100 is GCM's critical. On HDR/NDR the counter counts errors left after FEC (see the rates).
- port_rcv_errors (16 bit): warn 10, fail 100. Bad packets received, mostly the same physical
  cause as symbol errors, so the same scale (ibqueryerrors' PortRcvErrors=10, GCM's 100); NVIDIA's
  UFM PDR plugin isolates a port at a receive-error-to-packet ratio of 1e-12 (MAX_PDR), which a
  loaded port crosses with any error at all.
- link_downed (8 bit): warn 1, fail 3. Every increment is a link flap that kills in-flight
  traffic; gpud calls 3 flaps a flapping port (gpud; Meta GCM check-ib).
- link_error_recovery (8 bit): warn 1, fail 10. A successful retrain stalls traffic; repeated
  retrains mean a marginal link; 10 is ibqueryerrors' LinkErrorRecoveryCounter threshold.
- local_link_integrity_errors, excessive_buffer_overrun_errors (4 bit): warn 1, fail 5. Any
  increment is a signal-integrity problem (sysfs-class-infiniband); 5 is a third of the 4-bit range.
Meta GCM warns on any error counter above 0 and goes critical above 100 (its check-ib); the
per-counter scale above fails the 16-bit counters at GCM's 100 but warns only from 10, and is
stricter on link flaps.

Saturated counters: PMA counters stop at their maximum instead of wrapping (sysfs-class-infiniband),
so a counter at its maximum hides every new error; that warns "saturated, reset counters"
(`perfquery -R`), even without a baseline.

Rates, not raw counts, for symbol errors and link flaps: the baseline keeps the time it was read
(`taken_at`), and these two counters are judged per hour over the interval between the readings
as well as by the counts above. A level is reached when the count reaches its `<counter>_warn`/
`_fail` AND the rate its `<counter>_warn_per_h`/`_fail_per_h`: the count is the minimum that
keeps a short interval (two runs 1 s apart) from turning one error into a huge rate, the rate
keeps a long one (a week between two health checks) from adding line noise into a failure.
- symbol_error: warn 10/h, fail 100/h. Bits per hour: NDR 400 Gb/s x 3600 s = 1.44e15, HDR
  7.2e14, EDR 3.6e14; a count is taken as one bit error (NVIDIA's telemetry counts error bits).
  The InfiniBand specification asks for a BER below 1e-12 (NVIDIA DGX SuperPOD cabling guide,
  "Bit Error Rate"): 1440/h at NDR, 720/h at HDR. That is the line's raw figure, and HDR/NDR
  run FEC: there "symbol errors ... are the actual errors seen by the application level after
  error correction" (NVIDIA ibdiagnet manual, "Bit Error Rate (BER)"); corrected errors are
  counted apart (mlxlink, UFM's Raw_Errors_Lane). NVIDIA's field thresholds for that post-FEC
  (+PLR) Symbol BER (UFM PDR plugin, Field_BER_Thresholds.csv): warning 5e-15 and error 1e-14
  for NDR and 7 nm HDR with PLR; error 1e-13 without PLR, for 16 nm HDR and for EDR. At NDR
  1e-14 is 14.4/h, 1e-13 144/h. Warn 10/h: BER 6.9e-15 at NDR, between NVIDIA's warning and
  error; 1.4e-14 at HDR. Fail 100/h: 6.9e-14 at NDR (7x NVIDIA's error level with PLR, 0.7x
  without), 1.4e-13 at HDR, 2.8e-13 at EDR: near NVIDIA's error levels, with the margin a drain
  needs, and under the specification's 1e-12 at every rate from QDR up. The former 1000/h
  (6.9e-13 at NDR) matched 1e-12 only by setting a post-FEC count against the raw line's figure.
- link_downed: warn at any rate (every flap killed in-flight traffic: GCM warns on any error
  counter above 0), fail at 0.5/h: gpud's 3 flaps within Azure's 6-hour window
  (azurehpc-health-checks azure_ib_link_flapping.nhc: no flap within 6 hours), 3 / 6 h.
When the interval is unknown (a baseline saved without its time, a clock that went backwards)
the counts alone judge, as before.
A counter lower than its baseline was cleared in between (`perfquery -R`, an HCA reset, a
driver reload, a reboot): it counts from 0 again, so its value now is what it counted since the
reset, and that value is the delta, judged like any other: never a negative delta, and the flaps
that followed the reset are not hidden (three link_downed after a `perfquery -R` between the
prolog and the epilog are three flaps of this job). Some increments may be lost: those between
the baseline and the reset; the rate is the value over the whole interval, a lower bound, since
the reset happened somewhere in it. The message says "since a counter reset" (a judged level)
or "counter reset, counted from 0" (ok). node/counters.py counts a reset the same way for the
fleet's trends.
"""

from __future__ import annotations

import time

from slurmhealth.core.result import DRAIN, SERVICE, Result, counted, fail, ok, skip, warn
from slurmhealth.node.checks.base import DIGITS_MAX, Context, summarize, uint

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "ib"
SOURCE = "ib"

# Counter -> (width in bits, warn delta, fail delta, why). Widths from PORT_PMA_ATTR in the
# kernel's drivers/infiniband/core/sysfs.c (sysfs-class-infiniband); the defaults are argued above.
_COUNTERS = {
    "symbol_error": (16, 10, 100, "10 is ibqueryerrors' threshold, 100 GCM's critical"),
    "link_downed": (8, 1, 3, "each one is a link flap; 3 is a flapping port (gpud)"),
    "link_error_recovery": (8, 1, 10, "each retrain stalls traffic; 10: ibqueryerrors' threshold"),
    "port_rcv_errors": (16, 10, 100, "bad packets received, same scale as symbol errors"),
    "local_link_integrity_errors": (4, 1, 5, "any is a signal-integrity problem"),
    "excessive_buffer_overrun_errors": (4, 1, 5, "any is misconfiguration or very poor SI"),
}


def _threshold_defaults() -> dict[str, Any]:
    """`<counter>_warn` and `<counter>_fail`: flat int keys, one line each in the sample config."""
    out = {}
    for name, (_width, warn_at, fail_at, why) in _COUNTERS.items():
        out[f"{name}_warn"] = (warn_at, int, f"{name} delta since last run that warns: {why}")
        out[f"{name}_fail"] = (fail_at, int, f"{name} delta since last run that fails (drain)")
    return out


# Counter -> (warn per hour, fail per hour, why): rates over the interval between two readings,
# judged together with the counts above (argued in the module docstring).
_RATES = {
    "symbol_error": (10.0, 100.0, "NDR post-FEC BER 6.9e-15; 100/h: 6.9e-14 (NVIDIA: 1e-14)"),
    "link_downed": (0.0, 0.5, "any flap warns; 3 flaps in 6 hours fail (gpud, Azure HPC)"),
}


def _rate_defaults() -> dict[str, Any]:
    out = {}
    for name, (warn_at, fail_at, why) in _RATES.items():
        out[f"{name}_warn_per_h"] = (warn_at, float, f"{name} per hour that warns: {why}")
        out[f"{name}_fail_per_h"] = (fail_at, float, f"{name} per hour that fails (drain)")
    return out


DEFAULTS: Schema = {
    "devices": (None, list, "HCAs expected present (mlx5_0, ...); unset: whatever is present"),
    "ports": (None, list, "ports expected up, as mlx5_0:1; unset: every InfiniBand port present"),
    "rate": (None, int, "minimum Gb/s per port (400 for NDR); unset: all ports alike"),
    "link_layer": ("InfiniBand", str, "link layer of the expected ports (InfiniBand/Ethernet)"),
    "fw_ver": (None, str, "golden HCA firmware; unset: all HCAs alike; drift warns"),
    "pcie_gen": (None, int, "HCA PCIe link generation that is full speed; unset: as the peers"),
    "pcie_width": (None, int, "HCA PCIe link width that is full width; unset: as the peers"),
    **_threshold_defaults(),
    **_rate_defaults(),
}

# ib_port_state (include/rdma/ib_verbs.h) and PortPhysicalState (drivers/infiniband/core/
# sysfs.c phys_state_show).
_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
_ACTIVE = 4
_LINK_UP = 5
_IDENTITY = ("fw_ver", "hca_type", "board_id", "node_guid")
_NAME_MAX = 32  # bound on any file-derived name that can reach a message
# PCIe transfer rate (GT/s) -> generation: the speeds the kernel's pci_speed_string() names
# (drivers/pci/probe.c), printed as "32.0 GT/s PCIe" (older kernels: "32 GT/s").
_PCIE_GENS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


# ---------------------------------------------------------------- parse (pure, never raises)


def _str(value: object) -> str | None:
    return value[:_NAME_MAX].strip() if isinstance(value, str) else None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}



def parse_state(text: object, names: dict[int, str]) -> tuple[int | None, str | None]:
    """State text "4: ACTIVE" -> (4, "ACTIVE"): the number decides, the name is for messages.

    A bare known name ("ACTIVE") gives its number; anything else gives (None, name or None).
    """
    if not isinstance(text, str):
        return (None, None)
    head, sep, tail = text.partition(":")
    number = uint(head) if sep else None
    name = (tail if sep else text).strip()[:_NAME_MAX]
    if number is None:
        number = next((n for n, known in names.items() if known == name), None)
    return (number, names.get(number, name) if number is not None else (name or None))


def parse_rate(text: object) -> tuple[float | None, str | None, str | None]:
    """Rate text -> (Gb/s, width, speed): "400 Gb/sec (4X NDR)" -> (400.0, "4X", "NDR").

    The kernel prints "%d%s Gb/sec (%dX%s)" (rate_show in sysfs.c); old kernels leave the
    speed name out for SDR ("10 Gb/sec (4X)"). Unparseable parts are None.
    """
    if not isinstance(text, str):
        return (None, None, None)
    number, _, rest = text.strip().partition(" Gb/sec")
    gbps = _float(number)
    inner = rest.strip()
    if not (inner.startswith("(") and inner.endswith(")")):
        return (gbps, None, None)
    words = inner[1:-1].split()
    width = _str(words[0]) if words else None
    speed = _str(words[1]) if len(words) > 1 else None
    return (gbps, width, speed)


def _float(text: str) -> float | None:
    whole, _, frac = text.strip().partition(".")
    if not whole or len(text) > DIGITS_MAX or not (whole + frac).isascii():
        return None
    if not whole.isdigit() or (frac and not frac.isdigit()):
        return None
    return float(text)


def parse_link_speed(text: object) -> int | None:
    """PCIe speed text -> generation: "32.0 GT/s PCIe" -> 5, "8 GT/s" -> 3; "Unknown" -> None."""
    if not isinstance(text, str):
        return None
    number, sep, _ = text.strip().partition(" GT/s")
    speed = _float(number) if sep else None
    return _PCIE_GENS.get(speed) if speed is not None else None


def _parse_link(device: dict[str, Any]) -> dict[str, Any]:
    """The HCA's PCIe link now and at most; a width of 0 (link not trained) is unknown. `pci`:
    whether the source read the link at all (an HCA without a PCI device has none)."""
    widths = [uint(device.get(f"{k}_link_width")) for k in ("current", "max")]
    keys = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
    return {
        "pci": any(k in device for k in keys),
        "gen": parse_link_speed(device.get("current_link_speed")),
        "width": widths[0] or None,
        "max_gen": parse_link_speed(device.get("max_link_speed")),
        "max_width": widths[1] or None,
    }


def _parse_port(device: str, port: str, raw: dict[str, Any]) -> dict[str, Any]:
    state, state_name = parse_state(raw.get("state"), _STATES)
    phys, phys_name = parse_state(raw.get("phys_state"), _PHYS_STATES)
    gbps, width, speed = parse_rate(raw.get("rate"))
    counters = _dict(raw.get("counters"))
    return {
        "device": device,
        "port": port,
        "state": state,
        "state_name": state_name,
        "phys_state": phys,
        "phys_name": phys_name,
        "rate": gbps,
        "width": width,
        "speed": speed,
        "link_layer": _str(raw.get("link_layer")),
        "counters": {name: uint(counters.get(name)) for name in _COUNTERS},
    }


def parse(raw: object) -> dict[str, Any]:
    """Raw sysfs strings -> {"devices": {dev: identity}, "ports": {"dev:port": facts}, "errors"}.

    Pure and total: any input gives facts; what cannot be parsed is None.
    """
    facts: Facts = {"devices": {}, "ports": {}, "errors": {}}
    raw = _dict(raw)
    for name, device_raw in _dict(raw.get("devices")).items():
        device = _dict(device_raw)
        dev = str(name)[:_NAME_MAX]
        facts["devices"][dev] = {f: _str(device.get(f)) for f in _IDENTITY}
        facts["devices"][dev]["link"] = _parse_link(device)
        for port, port_raw in _dict(device.get("ports")).items():
            key = f"{dev}:{str(port)[:_NAME_MAX]}"
            facts["ports"][key] = _parse_port(dev, str(port)[:_NAME_MAX], _dict(port_raw))
    errors = _dict(raw.get("errors"))
    facts["errors"] = {str(k)[:200]: str(v)[:_NAME_MAX] for k, v in errors.items()}
    return facts


# ---------------------------------------------------------------- expectations and scope


def _expect(ctx: Context, key: str) -> Any:
    value = ctx.expect.get(key)
    return DEFAULTS[key][0] if value is None else value


def expected_ports(facts: Facts, ctx: Context) -> list[Any]:
    """The listed ports; else every present port whose link layer is the expected one."""
    listed = _expect(ctx, "ports")
    if listed is not None:
        return [str(p) for p in listed]
    layer = _expect(ctx, "link_layer")
    return sorted(k for k, p in facts["ports"].items() if p["link_layer"] == layer)


def _plural(problems: list[Any], noun: str) -> str:
    """First problem plus "(+N more <noun>s)": one line for a Slurm Reason."""
    return summarize(problems, f" {noun}" if noun else "")


def _verdict(
    fails: list[str], warns: list[str], data: dict[str, Any], action: str, noun: str
) -> Result | None:
    """fail when any fail, else warn when any warn, else None (the caller says ok)."""
    if fails:
        return fail(_plural(fails + warns, noun), data, action)
    if warns:
        return warn(_plural(warns, noun), data)
    return None


# ---------------------------------------------------------------- checks


def devices_present(facts: Facts, ctx: Context) -> Result:
    """Expected HCAs present: a missing HCA fell off the bus or lost its driver (service)."""
    present = sorted(facts["devices"])
    wanted = _expect(ctx, "devices")
    data = {"present": present}
    if wanted is None:
        if not present:
            return skip("no InfiniBand devices", data)
        return ok(f"{counted(len(present), 'HCA')} present", data)
    missing = [str(d) for d in wanted if str(d) not in facts["devices"]]
    data["missing"] = missing
    if missing:
        return fail(_plural([f"{d} missing" for d in missing], "HCA"), data, SERVICE)
    if not present:
        return skip("no InfiniBand devices", data)
    return ok(f"{counted(len(wanted), 'expected HCA')} present", data)


def _state_problem(key: str, port: dict[str, Any] | None) -> tuple[Any, ...]:
    """(severity, text) for one port's state; severity None when ACTIVE and LinkUp."""
    if port is None:
        return ("fail", f"{key} absent")
    if port["state"] is None or port["phys_state"] is None:
        return ("warn", f"{key} state unknown")
    if port["state"] == _ACTIVE and port["phys_state"] == _LINK_UP:
        return (None, "")
    return ("fail", f"{key} state {port['state_name']}, phys {port['phys_name']}")


def port_state(facts: Facts, ctx: Context) -> Result:
    """Every expected port ACTIVE and LinkUp (Polling: no peer/cable; Disabled: port off)."""
    keys = expected_ports(facts, ctx)
    if not keys:
        return skip("no InfiniBand ports")
    fails, warns, data = [], [], {}
    for key in keys:
        port = facts["ports"].get(key)
        severity, text = _state_problem(key, port)
        if severity == "fail":
            fails.append(text)
        elif severity == "warn":
            warns.append(text)
        data[key] = {"state": port["state_name"], "phys_state": port["phys_name"]} if port else None
    bad = _verdict(fails, warns, data, DRAIN, "port")
    return bad or ok(f"{counted(len(keys), 'port')} ACTIVE/LinkUp", data)


def _active_rates(facts: Facts, keys: list[Any]) -> dict[str, Any]:
    """Rate of each expected port that is ACTIVE and reports a rate: a down port's rate is
    meaningless (port_state reports the port)."""
    out = {}
    for key in keys:
        port = facts["ports"].get(key)
        if port and port["state"] == _ACTIVE and port["rate"] is not None:
            out[key] = port
    return out


def _rate_text(key: str, port: dict[str, Any]) -> str:
    lanes = " ".join(x for x in (port["width"], port["speed"]) if x)
    return f"{key} at {port['rate']:g} Gb/s" + (f" ({lanes})" if lanes else "")


def port_rate(facts: Facts, ctx: Context) -> Result:
    """Active ports at least at the expected Gb/s; unset: all ports at the same rate, else warn.

    A port that trained down (NDR -> HDR, 4X -> 2X) slows every collective of the job to its pace.
    """
    ports = _active_rates(facts, expected_ports(facts, ctx))
    if not ports:
        return skip("no active InfiniBand ports")
    data = {k: p["rate"] for k, p in ports.items()}
    wanted = _expect(ctx, "rate")
    floor = max(data.values()) if wanted is None else wanted
    word = "peers" if wanted is None else "expected"
    slow = [f"{_rate_text(k, p)}, {word} {floor:g}" for k, p in ports.items() if p["rate"] < floor]
    # Unconfigured, a slower port only warns: nobody said what this node should reach.
    fails, warns = ([], slow) if wanted is None else (slow, [])
    bad = _verdict(fails, warns, data, DRAIN, "port")
    return bad or ok(f"{counted(len(ports), 'port')} at >= {floor:g} Gb/s", data)


def link_layer(facts: Facts, ctx: Context) -> Result:
    """Expected ports on the expected link layer (a VPI port left in Ethernet mode is not IB)."""
    keys = [k for k in expected_ports(facts, ctx) if k in facts["ports"]]
    if not keys:
        return skip("no InfiniBand ports")
    wanted = _expect(ctx, "link_layer")
    data = {k: facts["ports"][k]["link_layer"] for k in keys}
    wrong = [f"{k} link layer {v}, expected {wanted}" for k, v in data.items() if v and v != wanted]
    unknown = [f"{k} link layer unreadable" for k, v in data.items() if not v]
    bad = _verdict(wrong, unknown, data, DRAIN, "port")
    return bad or ok(f"{counted(len(keys), 'port')} {wanted}", data)


def _scope(facts: Facts, ctx: Context) -> list[Any]:
    """The present HCAs carrying expected ports or listed in `devices`, sorted."""
    names = {facts["ports"][k]["device"] for k in expected_ports(facts, ctx) if k in facts["ports"]}
    names.update(str(d) for d in (_expect(ctx, "devices") or []))
    return sorted(n for n in names if n in facts["devices"])


def _fw_scope(facts: Facts, ctx: Context) -> dict[str, Any]:
    """HCA -> firmware for the HCAs carrying expected ports or listed in `devices`."""
    return {n: facts["devices"][n]["fw_ver"] for n in _scope(facts, ctx)}


def product(device: dict[str, Any]) -> str:
    """What an HCA is, so firmware is compared only between HCAs of one product: its hca_type
    (mlx5: `MT4129`, `MT` and the PCI device id, ConnectX-7; cxgb4: the driver's name; qedr:
    `FastLinQ QL...`), else its board_id (mlx5: the board's PSID; cxgb4: PCI vendor.device),
    else "" (a driver that exports neither: compared with the others that export neither).
    Firmware numbering is per product (ConnectX-7 runs 28.x, ConnectX-6 Dx 22.x, a Chelsio
    T6 1.x), so a version seen on another product says nothing about this one."""
    return device.get("hca_type") or device.get("board_id") or ""


def _majority(versions: list[str]) -> str:
    """Most common version; a tie goes to the version of the first HCA."""
    return max(versions, key=lambda v: (versions.count(v), -versions.index(v)))


def firmware(facts: Facts, ctx: Context) -> Result:
    """HCA firmware as `fw_ver`, or uniform per product when unset: drift warns, naming the HCA.

    Only HCAs of one product are compared (product(): an iWARP NIC's firmware is no drift
    of a Mellanox HCA's); `fw_ver` is the firmware of the node's main product, the one most
    HCAs in scope are (a tie: the first HCA's)."""
    fws = _fw_scope(facts, ctx)
    known = {n: v for n, v in fws.items() if v}
    if not known:
        return skip("no HCA firmware to compare", {"fw_ver": fws})
    wanted = _expect(ctx, "fw_ver")
    products = {n: product(facts["devices"][n]) for n in known}
    found: dict[str, dict[str, str]] = {}
    for name, version in known.items():
        found.setdefault(products[name], {})[name] = version
    main = next(iter(found)) if len(found) == 1 else _majority(list(products.values()))
    # the main product first, then the most HCAs
    groups = {k: found[k] for k in sorted(found, key=lambda k: (k != main, -len(found[k]), k))}
    refs, odd = {}, []
    for kind, members in groups.items():
        golden = wanted if kind == main else None
        refs[kind] = golden if golden is not None else _majority(list(members.values()))
        word = "expected" if golden is not None else "others"
        tag = f" ({kind})" if len(groups) > 1 and kind else ""
        odd += [
            f"{n}{tag} firmware {v}, {word} {refs[kind]}"
            for n, v in members.items()
            if v != refs[kind]
        ]
    data = {"fw_ver": fws, "reference": refs[main], "products": products}
    bad = _verdict([], odd, data, DRAIN, "HCA")
    if bad:
        return bad
    if len(groups) == 1:
        return ok(f"{counted(len(known), 'HCA')} on firmware {refs[main]}", data)
    each = [
        f"{counted(len(m), f'{kind} HCA' if kind else 'HCA')} on {refs[kind]}"
        for kind, m in groups.items()
    ]
    return ok(f"firmware per product: {', '.join(each)}", data)


def _gen_width(gen: object, width: object) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def _short(value: int | None, wanted: int | None) -> bool:
    return value is not None and wanted is not None and value < wanted


def pcie_link(facts: Facts, ctx: Context) -> Result:
    """HCA PCIe links at full generation and width now; a downtrained link (lanes, speed) warns.

    Full: `pcie_gen`/`pcie_width` when set, else the best current link of the peers, capped by
    each HCA's own max.

    The HCA's link is read as the kernel shows it (sysfs-bus-pci current_link_speed/_width).
    Unlike a GPU's, it is judged at any time: a ConnectX HCA does not lower its link when idle
    (to confirm per model); the kernel's pcie_print_link_status(), which mlx5 calls at probe,
    reports a link below the device's capability as "limited by" it."""
    names = _scope(facts, ctx)
    if not names:
        return skip("no InfiniBand HCAs")
    links = {n: facts["devices"][n]["link"] for n in names}
    if not any(x["pci"] for x in links.values()):  # nothing to judge, nothing wrong
        return ok("no HCA PCIe link in sysfs: not judged", {})
    links = {n: x for n, x in links.items() if x["gen"] is not None or x["width"] is not None}
    if not links:
        return skip("HCA PCIe link not readable")
    want_gen, want_width = _expect(ctx, "pcie_gen"), _expect(ctx, "pcie_width")
    gens = [x["gen"] for x in links.values() if x["gen"] is not None]
    widths = [x["width"] for x in links.values() if x["width"] is not None]
    slow = []
    for name, link in links.items():
        ref_gen, ref_width = want_gen, want_width
        if ref_gen is None and gens:
            ref_gen = min(x for x in (max(gens), link["max_gen"]) if x is not None)
        if ref_width is None and widths:
            ref_width = min(x for x in (max(widths), link["max_width"]) if x is not None)
        if _short(link["gen"], ref_gen) or _short(link["width"], ref_width):
            now = _gen_width(link["gen"], link["width"])
            slow.append(f"{name} PCIe link {now}, expected {_gen_width(ref_gen, ref_width)}")
    data = {n: _gen_width(x["gen"], x["width"]) for n, x in links.items()}
    bad = _verdict([], slow, data, DRAIN, "HCA")
    return bad or ok(f"{counted(len(links), 'HCA')} at full PCIe link", data)


def _limits(ctx: Context, name: str) -> tuple[Any, Any]:
    return (_expect(ctx, f"{name}_warn"), _expect(ctx, f"{name}_fail"))


def interval(ctx: Context) -> float | None:
    """Seconds since the baseline was taken; None when unknown (no time saved, or the clock went
    backwards or stood still)."""
    then = _dict(ctx.baseline).get("taken_at")
    if isinstance(then, bool) or not isinstance(then, (int, float)):
        return None
    seconds = float(ctx.now) - float(then)
    return seconds if seconds > 0 else None


def _level(name: str, delta: int, seconds: float | None, ctx: Context) -> tuple[str | None, str]:
    """("fail"/"warn"/None, text) for one counter's increase over `seconds` (None: unknown)."""
    warn_at, fail_at = _limits(ctx, name)
    if name in _RATES and seconds is not None:
        per_h = delta * 3600.0 / seconds
        rate_warn = _expect(ctx, f"{name}_warn_per_h")
        rate_fail = _expect(ctx, f"{name}_fail_per_h")
        span = f"{per_h:.3g}/h over {seconds / 3600:.3g} h"
        if delta >= fail_at and per_h >= rate_fail:
            return "fail", f"+{delta} ({span}, fail at {fail_at} and {rate_fail:g}/h)"
        if delta >= warn_at and per_h >= rate_warn:
            return "warn", f"+{delta} ({span}, warn at {warn_at} and {rate_warn:g}/h)"
        return None, ""
    if delta >= fail_at:
        return "fail", f"+{delta} (fail at {fail_at})"
    if delta >= warn_at:
        return "warn", f"+{delta} (warn at {warn_at})"
    return None, ""


def _port_counters(
    key: str, now: dict[str, Any], before: dict[str, Any], ctx: Context
) -> tuple[list[str], list[str], dict[str, Any]]:
    """(fails, warns, data) of one port's counters against its baseline (may be {})."""
    fails, warns, deltas, saturated, reset = [], [], {}, [], []
    seconds = interval(ctx)
    for name, value in now.items():
        if value is None:
            continue
        if value >= (1 << _COUNTERS[name][0]) - 1:
            saturated.append(name)
            warns.append(f"{key} {name} saturated at {value}, reset counters")
        base = before.get(name)
        if not isinstance(base, int) or isinstance(base, bool):
            continue
        if value < base:  # cleared since (perfquery -R, HCA reset, reboot): counts from 0
            reset.append(name)
        deltas[name] = value - base if value >= base else value
        level, text = _level(name, deltas[name], seconds, ctx)
        since = " since a counter reset" if value < base else ""
        if level == "fail":
            fails.append(f"{key} {name} {text}{since}")
        elif level == "warn":
            warns.append(f"{key} {name} {text}{since}")
    unreadable = sorted(n for n, v in now.items() if v is None)
    data = {"delta": deltas, "unreadable": unreadable, "saturated": saturated, "reset": reset}
    return fails, warns, data


def counters(facts: Facts, ctx: Context) -> Result:
    """Error-counter deltas since the last run (symbol errors, flaps also per hour); saturation.

    A counter that went down was cleared (perfquery -R, HCA reset): its value is what it
    counted since, judged as the delta, never a negative one."""
    keys = [k for k in expected_ports(facts, ctx) if k in facts["ports"]]
    if not keys:
        return skip("no InfiniBand ports")
    previous = _dict(_dict(ctx.baseline).get("counters"))
    fails, warns, data, fresh = [], [], {}, 0
    for key in keys:
        before = previous.get(key)
        if not isinstance(before, dict):
            fresh += 1
        now = facts["ports"][key]["counters"]
        f, w, data[key] = _port_counters(key, now, _dict(before), ctx)
        data[key]["baseline"] = isinstance(before, dict)
        fails += f
        warns += w
    bad = _verdict(fails, warns, data, DRAIN, "")
    if bad:
        return bad
    if fresh == len(keys):
        return ok("baseline recorded", data)
    note = f", baseline recorded for {fresh}" if fresh else ""
    resets = [f"{k} {n}" for k in keys for n in data[k]["reset"]]
    if resets:
        note += f", counter reset, counted from 0 ({summarize(resets)})"
    judged = counted(len(keys) - fresh, "port")
    return ok(f"no counter errors on {judged} since last run{note}", data)


CHECKS = (devices_present, port_state, port_rate, link_layer, firmware, pcie_link, counters)


# ---------------------------------------------------------------- memory and genconf


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """Readable counters of every port and the time they were read (`now`, else the clock: the
    run's time), for the next run's deltas and rates."""
    out = {}
    for key, port in facts["ports"].items():
        out[key] = {n: v for n, v in port["counters"].items() if v is not None}
    return {"counters": out, "taken_at": time.time() if now is None else now}


def versions_of(facts: Facts) -> dict[str, Any]:
    """The versions and settings each run records (the nightly report's odd node out):
    firmware per HCA and, where known, its product (product(): the report compares firmware
    per product), and the set of rates of the active ports (Gb/s)."""
    named = {n: d for n, d in sorted(facts["devices"].items()) if d["fw_ver"]}
    out: dict[str, Any] = {"fw_ver": {n: d["fw_ver"] for n, d in named.items()}}
    products = {n: product(d) for n, d in named.items() if product(d)}
    if products:
        out["product"] = products
    rates = {p["rate"] for p in facts["ports"].values() if p["state"] == _ACTIVE and p["rate"]}
    if rates:
        out["rate"] = sorted(rates)
    return out


def expectations(facts: Facts) -> dict[str, Any]:
    """What this (known-good) node implies: its HCAs, its active ports, their lowest rate, the
    link layer, the firmware when uniform and the HCAs' lowest current PCIe link."""
    active = {k: p for k, p in facts["ports"].items() if p["state"] == _ACTIVE}
    layers = sorted({p["link_layer"] for p in active.values() if p["link_layer"]})
    # A RoCE-only node expects Ethernet; any InfiniBand port makes it an InfiniBand node.
    layer = "InfiniBand" if "InfiniBand" in layers or not layers else layers[0]
    ports = {k: p for k, p in active.items() if p["link_layer"] == layer}
    out: dict[str, Any] = {
        "devices": sorted(facts["devices"]), "ports": sorted(ports), "link_layer": layer
    }
    rates = [p["rate"] for p in ports.values() if p["rate"] is not None]
    if rates:
        out["rate"] = int(min(rates))
    carrying = [facts["devices"][n] for n in sorted({p["device"] for p in ports.values()})]
    if carrying:  # `fw_ver` is the main product's firmware (firmware()): when it is uniform
        main = _majority([product(d) for d in carrying])
        fws = {d["fw_ver"] for d in carrying if product(d) == main}
        if len(fws) == 1 and None not in fws:
            out["fw_ver"] = fws.pop()
    links = [facts["devices"][n]["link"] for n in sorted({p["device"] for p in ports.values()})]
    for key in ("gen", "width"):
        values = [x[key] for x in links if x[key] is not None]
        if values:
            out[f"pcie_{key}"] = min(values)
    return out


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """InfiniBand is expected when the config names HCAs or ports."""
    return bool(expect.get("devices") or expect.get("ports"))
