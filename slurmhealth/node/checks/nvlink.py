"""NVLink checks from the same NVML sweep as the GPU checks.

Links are enumerated 0.. until NVML says NotSupported (nvml.h, nvmlDeviceGetNvLinkState); a GPU
without NVLink (PCIe cards, a single H200 in a VM) reports NotSupported on link 0: skip unless
links are expected.
Error counters (DL replay, recovery, CRC) are cumulative: only deltas since the last run matter.
"""

from __future__ import annotations

from slurmhealth.core.result import DRAIN, RESET_GPU, Result, fail, ok, skip, warn
from slurmhealth.node.checks import gpu
from slurmhealth.node.checks.base import Context, summarize

AREA = "nvlink"
SOURCE = "gpu"

COUNTERS = ("replay", "recovery", "crc")

# Thresholds on the increase since the last run, one key per counter and level (so the config
# validator type-checks each). A recovery is a link retrain: rare on a healthy link.
_THRESHOLDS = {"replay": (100, 10000), "recovery": (1, 10), "crc": (100, 10000)}

DEFAULTS = {
    "links_per_gpu": (None, int, "active NVLinks expected per GPU (H100 SXM: 18); unset: all seen"),
}
for _name, (_warn, _fail) in _THRESHOLDS.items():
    DEFAULTS[f"{_name}_warn"] = (_warn, int, f"{_name} counter increase since last run that warns")
    DEFAULTS[f"{_name}_fail"] = (_fail, int, f"{_name} counter increase since last run that fails")


def parse(raw: object) -> dict:
    """The GPU facts (shared source); links normalised to {link, active, counters...}."""
    facts = gpu.parse(raw)
    for dev in facts["devices"]:
        if dev["nvlink"] is not None:
            dev["nvlink"] = [_link(x) for x in dev["nvlink"]]
    return facts


def _link(entry: dict) -> dict:
    link = entry.get("link")
    out = {"link": link if isinstance(link, int) else -1, "active": entry.get("active") is True}
    for name in COUNTERS:
        value = entry.get(name)
        out[name] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return out


def _linked(facts: dict) -> list:
    return [d for d in facts["devices"] if not d["error"] and d["nvlink"] is not None]


def link_state(facts: dict, ctx: Context) -> Result:
    """Every NVLink expected active is active; no NVLink and none expected: skip."""
    expected = ctx.expect.get("links_per_gpu")
    devices = [d for d in facts["devices"] if not d["error"]]
    if not _linked(facts):
        if expected:
            return fail(f"NVLink not reported, {expected} links per GPU expected", {}, DRAIN)
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
    return ok(f"all NVLinks active on {len(devices)} GPUs", data)


def _counters(facts: dict) -> dict:
    out = {}
    for dev in _linked(facts):
        for x in dev["nvlink"]:
            values = {n: x[n] for n in COUNTERS if x[n] is not None}
            if values:
                out[f"{dev['index']}:{x['link']}"] = values
    return out


def _deltas(now: dict, before: dict) -> dict:
    """Increase per counter; a lower value means the counters were reset: take it whole."""
    return {n: v - before[n] if v >= before.get(n, 0) else v for n, v in now.items() if n in before}


def error_counters(facts: dict, ctx: Context) -> Result:
    """NVLink replay, recovery and CRC counters rose no more than the thresholds since last run."""
    current = _counters(facts)
    if not current:
        return skip("NVLink error counters not supported")
    before = ctx.baseline.get("counters") or {}
    if not before:
        return ok("baseline recorded", {"links": len(current)})
    fails, warns, deltas = [], [], {}
    for key, values in current.items():
        for name, delta in _deltas(values, before.get(key, {})).items():
            if delta <= 0:
                continue
            deltas.setdefault(key, {})[name] = delta
            text = f"GPU {key.replace(':', ' link ')} {name} +{delta}"
            if delta >= ctx.expect.get(f"{name}_fail", _THRESHOLDS[name][1]):
                fails.append(text)
            elif delta >= ctx.expect.get(f"{name}_warn", _THRESHOLDS[name][0]):
                warns.append(text)
    data = {"deltas": deltas}
    if fails:
        return fail(summarize(fails + warns), data, RESET_GPU)
    if warns:
        return warn(summarize(warns), data)
    return ok("NVLink error counters steady", data)


CHECKS = (link_state, error_counters)


def baseline(facts: dict) -> dict:
    return {"counters": _counters(facts)}


def expectations(facts: dict) -> dict:
    active = [sum(x["active"] for x in d["nvlink"]) for d in _linked(facts)]
    return {"links_per_gpu": min(active)} if active else {}


def expected(expect: dict, found: object = None) -> bool:
    """NVLinks are expected when the config names links per GPU (never on a PCIe card)."""
    return bool(expect.get("links_per_gpu"))
