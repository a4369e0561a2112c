"""The node that held a multi-node job back, from what the hooks already record (pure).

A synchronous multi-node job (data-parallel training: an all-reduce every step) runs at the
pace of its slowest node, because every rank waits for the others at each collective. Its
nodes run the same code on the same shapes, so each should spend about the same share of the
job with its GPU clocks held back by the power or thermal policy. A node that spent far more
(a failed fan or a blocked inlet, a power-supply fault that lowered the board's power limit, a
GPU with a lower enforced limit than its peers) ran slower, and the whole job waited for it.
Comparing the nodes of one job cancels the workload: a job that keeps every GPU at its power
limit caps all its nodes alike.

What is read: the `counters` rows (node/counters.py, docs/trends.md) each prolog, epilog and
health check records when a cumulative counter changed. Per GPU, `perf_power_ns` and
`perf_thermal_ns` (NVML fields 74 and 75, NVML_FI_DEV_PERF_POLICY_POWER and _THERMAL: the time
the power or thermal policy held the clocks back, nanoseconds as node/sources/nvml.py records
them), and the error counters. A node's rows count when their time lies in (its start, its end
+ EPILOG_SLACK_S]: the prolog's reading at the start closes the time before the job, the
epilog's reading at the end closes the job. A node with no row had no change: 0.

Power: each node's epilog records the energy its job's GPUs used since the prolog
(jobs.gpu_energy, node/counters.py job_energy: NVML's energy counter, field 83), shown as each
GPU's mean power. It names no node: a node held back by its clocks draws less than its peers,
and a node its peers wait for (a slow memory stack, a link trained down) draws more, so a
difference alone says neither which node nor why (docs/trends.md).

Not recorded per job, so not compared: SM clocks and utilisation.
"""

from __future__ import annotations

import json
import math
import statistics

from slurmhealth.core.result import clean
from slurmhealth.fleet.trends import LABELS
from slurmhealth.node.counters import AER_TOTALS, GPU_COUNTERS, LINK_COUNTERS, PORT_COUNTERS

HOUR = 3600.0
DAY = 86400.0
NS = 1e9

# The policy counters, and what the held-back finding calls the time each counts.
PERF = {"perf_power_ns": "power-capped", "perf_thermal_ns": "thermally slowed"}
_AER = tuple(f"aer_{name}" for name in AER_TOTALS)
# The counters read for a job, per kind of device (the part of the device name before ':').
COUNTERS = {
    "gpu": GPU_COUNTERS + _AER,
    "nvlink": tuple(f"nvlink_{name}" for name in LINK_COUNTERS),
    "hca": _AER,
    "ib": PORT_COUNTERS,
}

# The epilog's reading is dated by the epilog's start, which is the node's end as the hooks
# record it; accounting's End (collect --sacct) can come a little before it. Two minutes take
# the epilog in and leave out the next health check (minutes apart), whose delta would be the
# idle time after the job.
EPILOG_SLACK_S = 120.0

# The held-back finding. These are judgement, not published limits (no vendor publishes one),
# checked on planted fleets (bench/validate_heldback.py, docs/trends.md), not on a real fleet:
# - MARGIN: the odd node's worst GPU is held back at least 10 points of the job's time more
#   than the median of the other nodes. Below that, the difference is within what one rank's
#   own extra work (logging, checkpoint writes, data loading) and the policy's short bursts
#   under load explain; 10% of a synchronous job's time is also a loss worth a look.
# - FACTOR: and at least three times that median. A job that holds every GPU at its power
#   limit (median 60%) varies by more than 10 points between nodes with nothing wrong; the
#   factor keeps such a job from naming a node (a job capped everywhere names none). Twice
#   named healthy nodes whose GPUs reach their power limit sooner than their peers' (precision
#   0.78 on planted fleets with a 25% spread between parts; three times: 0.98, the same recall
#   by the week's end).
# - MIN_OTHERS: at least two other nodes. With one, there is no telling which of the two is
#   odd; the median of two or more is robust to one other odd node.
MARGIN = 0.10
FACTOR = 3.0
MIN_OTHERS = 2
# The lemon sweep: a node that held back at least REPEAT multi-node jobs that ended in the last
# LOOKBACK (and in the sweep's window) is a warning. Once can be the job (one rank with more
# work); twice in a week, with other jobs, is the node.
REPEAT = 2
LOOKBACK = 7 * DAY


def _share(seconds: float, span: float) -> float:
    """Time held back as a share of the span, at most 1: a node whose previous reading came
    before the job (no prolog reading) can count time from before it."""
    return min(1.0, seconds / span) if span > 0 else 0.0


def node_figures(rows: list, span: float) -> dict:
    """One node's figures for one job.

    rows: [(device, label, counter, episodes, total)] of the node's counter rows in the job's
    time (episodes: rows with an increase; total: the sum of the increases, a first reading's
    unknown increase counted 0, a reset's already the value since it). span: the node's time
    in the job, seconds. Returns {span_s, share (the worst GPU's), worst_gpu, cause, gpus
    [{gpu, power_s, thermal_s, share}], errors [{device, counter, episodes, errors}]}.
    """
    gpus: dict = {}
    errors = []
    for device, label, counter, episodes, summed in rows:
        total = max(float(summed or 0), 0.0)
        if counter in PERF:
            gpu = gpus.setdefault(device, {"gpu": label, "power_s": 0.0, "thermal_s": 0.0})
            gpu["power_s" if counter == "perf_power_ns" else "thermal_s"] += total / NS
        elif episodes:
            errors.append(
                {"device": label, "counter": counter, "episodes": int(episodes), "errors": total}
            )
    for gpu in gpus.values():
        gpu["share"] = _share(gpu["power_s"] + gpu["thermal_s"], span)
    worst = max(gpus.values(), key=lambda g: g["share"], default=None)
    found = worst is not None and worst["share"] > 0
    return {
        "span_s": span,
        "share": worst["share"] if found else 0.0,  # type: ignore[index]
        "worst_gpu": worst["gpu"] if found else None,  # type: ignore[index]
        "cause": _cause(worst) if found else None,
        "gpus": sorted(gpus.values(), key=lambda g: (-g["share"], str(g["gpu"]))),
        "errors": sorted(errors, key=lambda e: (str(e["device"]), e["counter"])),
    }


def _cause(gpu: dict) -> str:
    return PERF["perf_power_ns"] if gpu["power_s"] >= gpu["thermal_s"] else PERF["perf_thermal_ns"]


def held_back(figures: dict, duration: float) -> dict | None:
    """The node that held the job back, or None.

    figures: {node: node_figures(...)} of the nodes that ran one finished job; duration: the
    job's time, seconds (for the words). The node whose worst GPU was held back the largest
    share of its time, when that share is at least MARGIN above the median of the other nodes'
    and at least FACTOR times it, with at least MIN_OTHERS other nodes. Returns {node, gpu,
    cause, share, others_median, duration_s}.
    """
    if len(figures) < MIN_OTHERS + 1:
        return None
    ranked = sorted(figures.items(), key=lambda item: (-item[1]["share"], item[0]))
    node, top = ranked[0]
    median = statistics.median(f["share"] for _, f in ranked[1:])
    if top["share"] - median < MARGIN or top["share"] < FACTOR * median:
        return None
    return {
        "node": node,
        "gpu": top["worst_gpu"],
        "cause": top["cause"],
        "share": top["share"],
        "others_median": median,
        "duration_s": duration,
    }


def _number(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok and value >= 0 else None  # type: ignore[operator]


def power(raw: object) -> dict | None:
    """A node's `gpu_energy` (JSON text from the store: {"s": seconds, "j": {index: joules}})
    as {span_s, mean_w (over its GPUs), gpus [{gpu, joules, watts}] lowest first}; None when
    absent or not that shape (the fleet store's rows come from node exports: never trusted)."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("j"), dict):
        return None
    span = _number(data.get("s"))
    if not span:
        return None
    gpus = []
    for index, joules in data["j"].items():
        used = _number(joules)
        if used is None or not str(index).isdigit() or len(str(index)) > 4:
            continue
        gpus.append({"gpu": f"GPU {int(index)}", "joules": used, "watts": used / span})
    if not gpus:
        return None
    gpus.sort(key=lambda g: (g["watts"], g["gpu"]))
    mean = statistics.fmean(g["watts"] for g in gpus)
    return {"span_s": span, "mean_w": mean, "gpus": gpus}


def power_words(figures: dict) -> str:
    """ "612 W per GPU (lowest GPU 3 480 W)"; "612 W per GPU" with one GPU."""
    text = f"{figures['mean_w']:.0f} W per GPU"
    if len(figures["gpus"]) > 1:
        low = figures["gpus"][0]
        text += f" (lowest {clean(low['gpu'], 10)} {low['watts']:.0f} W)"
    return text


def percent(share: float) -> str:
    return f"{round(100 * share)}%"


def span_words(seconds: float) -> str:
    """6.0 h, 45 min, 30 s."""
    if seconds >= HOUR:
        return f"{seconds / HOUR:.1f} h"
    if seconds >= 60:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds)} s"


def words(finding: dict) -> str:
    """ "gpu07 held the job back: GPU 3 power-capped 34% of the job's 6.0 h, others' median
    2%"."""
    return (
        f"{clean(finding['node'], 40)} held the job back: {clean(finding['gpu'], 40)} "
        f"{clean(finding['cause'], 20)} {percent(finding['share'])} of the job's "
        f"{span_words(finding['duration_s'])}, others' median {percent(finding['others_median'])}"
    )


def error_words(errors: list) -> str:
    """ "GPU 3 PCIe replays +40 (2 episodes)"; "none" when no counter grew."""
    if not errors:
        return "none"
    parts = []
    for e in errors:
        what = LABELS.get(e["counter"], e["counter"])
        times = "episode" if e["episodes"] == 1 else "episodes"
        count = f"+{e['errors']:.0f} ({e['episodes']} {times})"
        parts.append(f"{clean(e['device'], 40)} {clean(what, 60)} {count}")
    return ", ".join(parts)


def repeated(findings: list, least: int = REPEAT) -> list:
    """[(node, time)] of each node that held back at least `least` jobs: findings are (node,
    time) of each job held back; the time is the newest such job's."""
    seen: dict = {}
    for node, time in findings:
        count, last = seen.get(node, (0, time))
        seen[node] = (count + 1, max(last, time))
    return sorted((node, last) for node, (count, last) in seen.items() if count >= least)
