"""NVLink checks from the same NVML sweep as the GPU checks.

Links are enumerated 0.. until NVML says NotSupported (nvml.h, nvmlDeviceGetNvLinkState); a GPU
without NVLink (PCIe cards, a single H200 in a VM) reports NotSupported on link 0: skip unless
links are expected.
Error counters (DL replay, recovery, CRC) are cumulative: only deltas since the last run matter.

Rates, not raw counts (DCGM's NVLink health watch, DcgmHealthWatch::MonitorNVLink, with its
limits in dcgm_gpu_hardware_limits.h; docs/sources.md):
- CRC errors are judged per second over the time between the two readings: DCGM fails a GPU at
  DCGM_LIMIT_MAX_NVLINK_CRC_ERROR, 100 CRC errors per second ("RM has informed us that CRC errors
  only matter at rates of 100+ per second"). A CRC error is caught by the link and the flit is
  replayed, so a slow trickle costs nothing; 100/s is a link that spends its time retrying.
  `crc_warn` (a count during the interval) still warns on a trickle worth a look.
- Replays and recoveries are counted during the interval (a job: epilog against its prolog).
  DCGM fails on any replay or recovery (DCGM_LIMIT_MAX_NVLINK_ERROR, 1) inside its watch window,
  one minute by default; our window is a whole job (hours at hundreds of GB/s per link), so the
  per-job counts below stay more lenient than DCGM's per-minute one (warn 1 recovery, fail 10).
- A short interval must not turn one error into a huge rate: the CRC rate is taken over at least
  `crc_min_interval_s`, 60 s by default, DCGM's own default watch window (MonitorNVLink starts a
  blank window one minute back): two runs 1 s apart with 1 CRC error give 1/60 per second.
- The interval is unknown when the baseline has no time (saved before rates were judged) or the
  clock went backwards: then CRC counts are judged against `crc_fail` as before.
- A counter lower than its baseline was reset (GPU reset, driver reload): DCGM's health watch
  does the same ("someone likely reset the volatile counter. Just reset ours"): a new baseline,
  never a negative delta and never a fail; the message says "counter reset: new baseline".
"""

from __future__ import annotations

import time

from slurmhealth.core.result import DRAIN, RESET_GPU, Result, counted, fail, ok, skip, warn
from slurmhealth.node.checks import gpu
from slurmhealth.node.checks.base import Context, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "nvlink"
SOURCE = "gpu"

COUNTERS = ("replay", "recovery", "crc")

# Thresholds on the increase since the last run, one key per counter and level (so the config
# validator type-checks each). A recovery is a link retrain: rare on a healthy link.
_THRESHOLDS = {"replay": (100, 10000), "recovery": (1, 10), "crc": (100, 10000)}

DEFAULTS: Schema = {
    "links_per_gpu": (None, int, "active NVLinks expected per GPU (H100 SXM: 18); unset: all seen"),
}
for _name, (_warn, _fail) in _THRESHOLDS.items():
    DEFAULTS[f"{_name}_warn"] = (_warn, int, f"{_name} counter increase since last run that warns")
    DEFAULTS[f"{_name}_fail"] = (_fail, int, f"{_name} counter increase since last run that fails")
DEFAULTS["crc_fail"] = (
    10000,
    int,
    "crc increase that fails when the interval is unknown (a baseline saved without its time)",
)
DEFAULTS["crc_fail_per_s"] = (
    100.0,
    float,
    "CRC errors per second over the interval that fail: DCGM's NVLink health watch limit",
)
DEFAULTS["crc_min_interval_s"] = (
    60.0,
    float,
    "shortest interval a CRC rate is taken over (DCGM's default watch window, one minute)",
)


def parse(raw: object) -> dict[str, Any]:
    """The GPU facts (shared source); links normalised to {link, active, counters...}."""
    facts = gpu.parse(raw)
    for dev in facts["devices"]:
        if dev["nvlink"] is not None:
            dev["nvlink"] = [_link(x) for x in dev["nvlink"]]
    return facts


def _link(entry: dict[str, Any]) -> dict[str, Any]:
    link = entry.get("link")
    out: dict[str, int | None] = {
        "link": link if isinstance(link, int) else -1, "active": entry.get("active") is True
    }
    for name in COUNTERS:
        value = entry.get(name)
        out[name] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return out


def _linked(facts: Facts) -> list[Any]:
    return [d for d in facts["devices"] if not d["error"] and d["nvlink"] is not None]


def link_state(facts: Facts, ctx: Context) -> Result:
    """Every NVLink expected active is active; no NVLink and none expected: skip."""
    expected = ctx.expect.get("links_per_gpu")
    devices = [d for d in facts["devices"] if not d["error"]]
    if not _linked(facts):
        if expected:
            wanted = counted(expected, "link")
            return fail(f"NVLink not reported, {wanted} per GPU expected", {}, DRAIN)
        return skip("NVLink not supported on these GPUs")
    problems, counts = [], {}
    for dev in devices:
        links = dev["nvlink"] or []
        active = [x["link"] for x in links if x["active"]]
        counts[str(dev["index"])] = len(active)
        want = expected if expected is not None else len(links)
        if len(active) < want:
            down = [x["link"] for x in links if not x["active"]]
            problems.append(f"{gpu.label(dev)} {len(active)}/{want} NVLinks active, down {down}")
    data = {"active": counts, "problems": problems}
    if problems:
        return fail(summarize(problems, " GPU"), data, RESET_GPU)
    return ok(f"all NVLinks active on {counted(len(devices), 'GPU')}", data)


def _counters(facts: Facts) -> dict[str, Any]:
    """{"<GPU index>:<link>": {counter: value}} of every link that reports a counter."""
    out = {}
    for dev in _linked(facts):
        for x in dev["nvlink"]:
            values = {n: x[n] for n in COUNTERS if x[n] is not None}
            if values:
                out[f"{dev['index']}:{x['link']}"] = values
    return out


def _deltas(now: dict[str, int], before: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """(increase per counter, counters lower than their baseline): a lower value means the
    counter was reset (GPU reset, driver reload), so it starts a new baseline and has no delta."""
    deltas: dict[str, int]
    deltas, reset = {}, []
    for name, value in now.items():
        then = before.get(name)
        if not isinstance(then, int) or isinstance(then, bool):
            continue
        if value < then:
            reset.append(name)
        else:
            deltas[name] = value - then
    return deltas, reset


def interval(ctx: Context) -> float | None:
    """Seconds since the baseline was taken; None when unknown (no time saved, or the clock went
    backwards or stood still: no rate can be judged)."""
    then = ctx.baseline.get("taken_at")
    if isinstance(then, bool) or not isinstance(then, (int, float)):
        return None
    seconds = float(ctx.now) - float(then)
    return seconds if seconds > 0 else None


def _limit(ctx: Context, key: str) -> float:
    value = ctx.expect.get(key)
    limit: float = DEFAULTS[key][0] if value is None else value
    return limit


def _level(name: str, delta: int, seconds: float | None, ctx: Context) -> tuple[Any, ...]:
    """(fail/warn/None, text) for one counter's increase over `seconds` (None: unknown)."""
    text = f"+{delta}"
    if name == "crc" and seconds is not None:
        per_s = delta / max(seconds, _limit(ctx, "crc_min_interval_s"))
        text = f"+{delta} ({per_s:.3g}/s)"
        if per_s >= _limit(ctx, "crc_fail_per_s"):
            return "fail", text
    elif delta >= _limit(ctx, f"{name}_fail"):
        return "fail", text
    return ("warn" if delta >= _limit(ctx, f"{name}_warn") else None), text


def error_counters(facts: Facts, ctx: Context) -> Result:
    """NVLink CRC errors per second (DCGM: fail at 100/s), replays and recoveries per interval.

    Replays and recoveries are counted during the interval (a job); a counter that went down
    starts a new baseline."""
    current = _counters(facts)
    if not current:
        return skip("NVLink error counters not supported")
    before = ctx.baseline.get("counters") or {}
    if not before:
        return ok("baseline recorded", {"links": len(current)})
    seconds = interval(ctx)
    names = {str(d["index"]): gpu.label(d) for d in facts["devices"]}
    deltas: dict[str, dict[str, int]]
    fails, warns, deltas, resets = [], [], {}, []
    for key, values in current.items():
        index, link = key.split(":")
        where = f"{names.get(index, f'GPU {index}')} link {link}"
        grew, reset = _deltas(values, before.get(key, {}))
        resets += [f"{where} {name}" for name in reset]
        for name, delta in grew.items():
            if delta <= 0:
                continue
            deltas.setdefault(key, {})[name] = delta
            level, amount = _level(name, delta, seconds, ctx)
            text = f"{where} {name} {amount}"
            if level == "fail":
                fails.append(text)
            elif level == "warn":
                warns.append(text)
    data = {"deltas": deltas, "interval_s": seconds, "reset": resets}
    if fails:
        return fail(summarize(fails + warns), data, RESET_GPU)
    if warns:
        return warn(summarize(warns), data)
    if resets:
        return ok(f"counter reset: new baseline ({summarize(resets)})", data)
    return ok("NVLink error counters steady", data)


CHECKS = (link_state, error_counters)

# Judged GPU by GPU in the job hooks (checks/base.py job_verdict), on the GPU area's facts.
SCOPED = CHECKS
for_gpus = gpu.for_gpus


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """The link counters and the time they were read (`now`, else the clock: the run's time),
    so the next run knows the interval its deltas span."""
    return {"counters": _counters(facts), "taken_at": time.time() if now is None else now}


def expectations(facts: Facts) -> dict[str, Any]:
    active = [sum(x["active"] for x in d["nvlink"]) for d in _linked(facts)]
    return {"links_per_gpu": min(active)} if active else {}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """NVLinks are expected when the config names links per GPU (never on a PCIe card)."""
    return bool(expect.get("links_per_gpu"))
