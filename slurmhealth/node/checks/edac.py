"""Memory errors the EDAC drivers count (the `edac` part of the kernel source:
/sys/devices/system/edac/mc, Documentation/admin-guide/ras.rst, sysfs-devices-edac).

Each memory controller counts corrected (ce_count) and uncorrected (ue_count) errors since its
driver loaded (at boot) or since `reset_counters` was written; the totals include the errors
without a location (ce_noinfo_count, ue_noinfo_count). Judged as the ib area judges its counters:
the increase since the previous run on this node, with the previous run's time and boot.
- A baseline from another boot: the counters started again at 0, so all of today's count is new.
- A lower count in the same boot (reset_counters, a driver reload): a new baseline, never a fail.
- No baseline at all (the first run on the node): a count above 0 is of unknown age: warn.

Uncorrected: any new one fails (`ue_fail` = 1) with the service hint: ECC could not correct the
data, the kernel poisoned or lost the page, and the DIMM (or the controller) needs replacing;
mcelog's per-DIMM `uc-error-threshold` is 1 / 24h for the same reason.
Corrected: warn at `ce_warn_per_day` per memory controller, the rate taken over the interval
between the readings but at least a day, so a short interval needs that many errors at once.
The default 10/day is mcelog's per-DIMM `ce-error-threshold` (10 / 24h); per controller (several
DIMMs) it is stricter than mcelog's per DIMM and far below its per-socket 100 / 24h and
rasdaemon's page isolation (PAGE_CE_THRESHOLD 50 per PAGE_CE_REFRESH_CYCLE 24h, one page).
Corrected errors foretell uncorrected ones: in Google's fleet a DIMM with a corrected error was
9-400 times more likely to see an uncorrected one in the same month (Schroeder, Pinheiro and
Weber, "DRAM Errors in the Wild", SIGMETRICS 2009). They only warn: ECC did its job.

No EDAC tree (containers, most VMs, a platform without an EDAC driver): not judged (ok, saying
so: a skip would be stored with every run of every such node), never a fail, unless
`expected = true` (a node whose EDAC driver should be loaded). The other host areas say "not
judged" the same way when nothing is expected of them.
"""

from __future__ import annotations

import time

from slurmhealth.core.result import SERVICE, Result, counted, fail, ok, warn
from slurmhealth.node.checks.base import Context, summarize, uint

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "edac"
SOURCE = "kernel"

DEFAULTS: Schema = {
    "expected": (False, bool, "an EDAC tree is expected (its absence fails); default: skip"),
    "ue_fail": (1, int, "new uncorrected memory errors since the last run that fail (service)"),
    "ce_warn_per_day": (
        10.0,
        float,
        "corrected memory errors per day per controller that warn (mcelog: 10 / 24h per DIMM)",
    ),
}

_FIELDS = {"ce": "ce_count", "ue": "ue_count", "ce_noinfo": "ce_noinfo_count",
           "ue_noinfo": "ue_noinfo_count"}
_NAME_MAX = 64
DAY = 86400.0



def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dimm(raw: dict[str, Any]) -> dict[str, Any]:
    label = raw.get("label")
    return {
        "ce": uint(raw.get("ce_count")),
        "ue": uint(raw.get("ue_count")),
        "label": label.strip()[:_NAME_MAX] if isinstance(label, str) and label.strip() else None,
    }


def parse(raw: object) -> Facts:
    """The kernel source's raw facts -> {"present", "mcs": {mc: counts and dimms}, "boot_id"}."""
    raw = _dict(raw)
    tree = raw.get("edac")
    mcs: dict[str, Any] = {}
    for name, value in _dict(tree).items():
        counts = _dict(value)
        mc: dict[str, Any] = {k: uint(counts.get(f)) for k, f in _FIELDS.items()}
        dimms = _dict(counts.get("dimms")).items()
        mc["dimms"] = {str(d)[:_NAME_MAX]: _dimm(_dict(v)) for d, v in dimms}
        mcs[str(name)[:_NAME_MAX]] = mc
    boot = raw.get("boot_id")
    return {"present": isinstance(tree, dict), "mcs": mcs,
            "boot_id": boot if isinstance(boot, str) else None}


def _absent(facts: Facts, ctx: Context) -> Result | None:
    """The result when there is nothing to judge: no tree (fail only when expected)."""
    if facts["present"] and facts["mcs"]:
        return None
    if ctx.expect.get("expected"):
        return fail("no EDAC memory controllers (EDAC driver not loaded?)", {}, SERVICE)
    return ok("no EDAC memory controllers: not judged")


def _before(facts: Facts, ctx: Context) -> tuple[dict[str, Any] | None, bool]:
    """(the baseline's counts per controller or None without one, same boot?)."""
    base = _dict(ctx.baseline)
    counts = base.get("mcs")
    if not isinstance(counts, dict):
        return None, True
    return counts, base.get("boot_id") == facts["boot_id"]


def _delta(now: int | None, then: object, same_boot: bool) -> int | None:
    """The increase since `then`; None when unknown or the counter was reset (new baseline)."""
    if now is None:
        return None
    if not same_boot:
        return now
    if not isinstance(then, int) or isinstance(then, bool) or now < then:
        return None
    return now - then


def _dimms(mc: dict[str, Any], before: dict[str, Any], key: str) -> list[str]:
    """The DIMMs (labels where known) whose `key` count rose, where both readings have them."""
    rose: list[str] = []
    for name, dimm in mc["dimms"].items():
        then = _dict(_dict(before.get("dimms")).get(name)).get(key)
        if dimm[key] is not None and isinstance(then, int) and dimm[key] > then:
            rose.append(dimm["label"] or name)
    return rose


def _where(mc: str, dimms: list[str]) -> str:
    return f"{mc} ({summarize(dimms)})" if dimms else mc


def uncorrected(facts: Facts, ctx: Context) -> Result:
    """No new uncorrected memory error (ECC could not correct it: the DIMM needs service)."""
    nothing = _absent(facts, ctx)
    if nothing:
        return nothing
    counts, same_boot = _before(facts, ctx)
    fails: list[str] = []
    unknown: list[str] = []
    data: dict[str, Any] = {}
    for name, mc in facts["mcs"].items():
        if counts is None:
            data[name] = {"since_boot": mc["ue"]}
            if mc["ue"]:
                unknown.append(f"{name} {counted(mc['ue'], 'uncorrected error')} since boot")
            continue
        before = _dict(counts.get(name))
        delta = _delta(mc["ue"], before.get("ue"), same_boot)
        data[name] = {"new": delta}
        if delta is not None and delta >= int(ctx.expect.get("ue_fail", 1)):
            where = _where(name, _dimms(mc, before, "ue") if same_boot else [])
            fails.append(f"{where}: {counted(delta, 'new uncorrected memory error')}")
    if fails:
        return fail(summarize(fails, " controller"), data, SERVICE)
    if unknown:
        return warn(summarize(unknown, " controller") + ", before the first baseline", data)
    return ok(f"no new uncorrected errors on {counted(len(data), 'memory controller')}", data)


def corrected(facts: Facts, ctx: Context) -> Result:
    """Corrected memory errors below `ce_warn_per_day` per controller (more foretell a UE)."""
    nothing = _absent(facts, ctx)
    if nothing:
        return nothing if nothing.status != "fail" else ok("no EDAC memory controllers")
    counts, same_boot = _before(facts, ctx)
    if counts is None:
        return ok("baseline recorded", {})
    seconds = _interval(ctx)
    days = max(seconds / DAY, 1.0) if seconds is not None else 1.0
    default: float = DEFAULTS["ce_warn_per_day"][0]
    limit = float(ctx.expect.get("ce_warn_per_day", default))
    warns: list[str] = []
    data: dict[str, Any] = {}
    for name, mc in facts["mcs"].items():
        before = _dict(counts.get(name))
        delta = _delta(mc["ce"], before.get("ce"), same_boot)
        data[name] = {"new": delta}
        if delta and delta / days >= limit:
            where = _where(name, _dimms(mc, before, "ce") if same_boot else [])
            warns.append(f"{where}: {counted(delta, 'corrected memory error')} "
                         f"({delta / days:.3g}/day, warn at {limit:g})")
    if warns:
        return warn(summarize(warns, " controller"), data)
    return ok(f"corrected errors below {limit:g}/day on "
              f"{counted(len(data), 'memory controller')}", data)


def _interval(ctx: Context) -> float | None:
    then = _dict(ctx.baseline).get("taken_at")
    if isinstance(then, bool) or not isinstance(then, (int, float)):
        return None
    seconds = float(ctx.now) - float(then)
    return seconds if seconds > 0 else None


CHECKS = (uncorrected, corrected)


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """Every controller's counts (and its DIMMs' where read), the boot, and when."""
    mcs: dict[str, Any] = {}
    for name, mc in facts["mcs"].items():
        entry: dict[str, Any] = {k: mc[k] for k in ("ce", "ue") if mc[k] is not None}
        dimms = {d: {k: v[k] for k in ("ce", "ue") if v[k] is not None}
                 for d, v in mc["dimms"].items()}
        if dimms:
            entry["dimms"] = dimms
        mcs[name] = entry
    return {"mcs": mcs, "boot_id": facts["boot_id"],
            "taken_at": time.time() if now is None else now}


def expectations(facts: Facts) -> dict[str, Any]:
    """A node with EDAC memory controllers expects them."""
    return {"expected": True} if facts["present"] and facts["mcs"] else {}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The EDAC tree is expected when `expected` is set."""
    return bool(expect.get("expected"))
