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

SM clock: each node's epilog also records, per GPU of the job, the seconds its SM clock was
held below its base clock since the prolog (NVML field 81, NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_
CLOCKS: for any reason, the power and thermal policies' and the hardware's own slowdowns, a
power brake or an overheating HBM stack, that fields 74 and 75 do not count). When the power
and thermal policy counters name no node, the same rule runs on that share (clock_figures):
a node whose worst GPU spent far more of the job below its base clock than the other nodes'
ran slower. An idle GPU clocks down too, so a job that leaves its GPUs idle part of the time
raises every node's share alike, and the factor keeps such a job from naming one.

Utilisation and SM clock in MHz: the health checks during the job sample each busy GPU (NVML
utilisation over the last sample period, and the SM clock then), and the epilog records their
means. They are shown, and the finding quotes the named node's mean utilisation against the
others' (a node whose GPUs idle while below base clocks was starved, not throttled), but they
name no node: samples minutes apart on each node catch different moments of the job.
"""

from __future__ import annotations

import json
import math
import statistics

from slurmhealth.core.result import clean, counted
from slurmhealth.fleet.trends import LABELS
from slurmhealth.node.counters import AER_TOTALS, GPU_COUNTERS, LINK_COUNTERS, PORT_COUNTERS

HOUR = 3600.0
DAY = 86400.0
NS = 1e9

# The policy counters, and what the held-back finding calls the time each counts.
PERF = {"perf_power_ns": "power-capped", "perf_thermal_ns": "thermally slowed"}
BELOW_BASE = "below base clocks"  # ... and the time below base clocks (clock_figures)
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
    if worst is not None and not worst["share"] > 0:
        worst = None  # no GPU lost any time: none is the worst
    return {
        "span_s": span,
        "share": worst["share"] if worst is not None else 0.0,
        "worst_gpu": worst["gpu"] if worst is not None else None,
        "cause": _cause(worst) if worst is not None else None,
        "gpus": sorted(gpus.values(), key=lambda g: (-g["share"], str(g["gpu"]))),
        "errors": sorted(errors, key=lambda e: (str(e["device"]), e["counter"])),
    }


def _cause(gpu: dict) -> str:
    return PERF["perf_power_ns"] if gpu["power_s"] >= gpu["thermal_s"] else PERF["perf_thermal_ns"]


def held_back(figures: dict, duration: float, clocks: dict | None = None) -> dict | None:
    """The node that held the job back, or None.

    figures: {node: node_figures(...)} of the nodes that ran one finished job; duration: the
    job's time, seconds (for the words); clocks: {node: clock_figures(...) or None} of the same
    nodes. The node whose worst GPU was held back by the power or thermal policy the largest
    share of its time, when that share is at least MARGIN above the median of the other nodes'
    and at least FACTOR times it, with at least MIN_OTHERS other nodes. When none is, the same
    rule on the share below base clocks, among the nodes that recorded it. Returns {node, gpu,
    cause, share, others_median, duration_s}, and util and others_util (mean utilisation of
    the node's and the median of the others' sampled GPUs) where sampled.
    """
    shares = {node: (f["share"], f["worst_gpu"], f["cause"]) for node, f in figures.items()}
    found = _odd_one(shares, duration)
    if found is None and clocks:
        below = {
            node: (c["share"], c.get("worst_gpu"), BELOW_BASE)
            for node, c in clocks.items()
            if c is not None and c.get("share") is not None
        }
        found = _odd_one(below, duration)
    if found is not None and clocks:
        mine = clocks.get(found["node"]) or {}
        others = [
            c["util"]
            for node, c in clocks.items()
            if node != found["node"] and c is not None and c.get("util") is not None
        ]
        if mine.get("util") is not None and others:
            found.update(util=mine["util"], others_util=statistics.median(others))
    return found


def _odd_one(shares: dict, duration: float) -> dict | None:
    """held_back's rule on {node: (share, worst GPU, cause)}."""
    if len(shares) < MIN_OTHERS + 1:
        return None
    ranked = sorted(shares.items(), key=lambda item: (-item[1][0], item[0]))
    node, (share, gpu, cause) = ranked[0]
    median = statistics.median(s[0] for _, s in ranked[1:])
    if share - median < MARGIN or share < FACTOR * median:
        return None
    return {
        "node": node,
        "gpu": gpu,
        "cause": cause,
        "share": share,
        "others_median": median,
        "duration_s": duration,
    }


def share_of(value: object) -> float | None:
    """A jobs row's `below_base` (node/counters.py below_share: a share, 0-1) or None when
    absent or not that (the fleet store's rows come from node exports: never trusted)."""
    share = _number(value)
    return share if share is not None and share <= 1.0 else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _job_figures(raw: object) -> tuple:
    """A node's `gpu_energy` (JSON text from the store: {"s": seconds, "j": {index: joules},
    "b": {index: seconds below base clocks}, "u": {index: [samples, MHz, %]}}) as (span, the
    parsed object); (None, {}) when absent or not that shape (the fleet store's rows come from
    node exports: never trusted)."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        return None, {}
    if not isinstance(data, dict):
        return None, {}
    return _number(data.get("s")) or None, data


def _per_gpu(data: dict, key: str) -> list:
    """[(GPU name, value)] of one of the figures' maps, sound entries only."""
    values = data.get(key)
    out = []
    for index, value in (values.items() if isinstance(values, dict) else ()):
        if str(index).isdigit() and len(str(index)) <= 4:
            out.append((f"GPU {int(index)}", value))
    return out


def power(raw: object) -> dict | None:
    """A node's GPU power over the job, from its `gpu_energy` (_job_figures), as {span_s,
    mean_w (over its GPUs), gpus [{gpu, joules, watts}] lowest first}; None without one."""
    span, data = _job_figures(raw)
    if not span:
        return None
    gpus = []
    for gpu, joules in _per_gpu(data, "j"):
        used = _number(joules)
        if used is not None:
            gpus.append({"gpu": gpu, "joules": used, "watts": used / span})
    if not gpus:
        return None
    gpus.sort(key=lambda g: (g["watts"], g["gpu"]))
    mean = statistics.fmean(g["watts"] for g in gpus)
    return {"span_s": span, "mean_w": mean, "gpus": gpus}


def clock_figures(raw: object) -> dict | None:
    """A node's GPU clocks over the job, from its `gpu_energy` (_job_figures): {span_s, share
    (the worst GPU's share of the job below base clocks, None when not recorded), worst_gpu,
    util and mhz (the means of the sampled GPUs' means, None when not sampled), samples (the
    most any GPU had), gpus [{gpu, below_s, share, samples, mhz, util}] worst first}; None
    without either figure."""
    span, data = _job_figures(raw)
    if not span:
        return None
    gpus: dict = {}
    for gpu, seconds in _per_gpu(data, "b"):
        below = _number(seconds)
        if below is not None:
            gpus[gpu] = {"gpu": gpu, "below_s": below, "share": _share(below, span)}
    for gpu, sampled in _per_gpu(data, "u"):
        if not isinstance(sampled, list) or len(sampled) != 3:
            continue
        count, mhz, util = (_number(v) for v in sampled)
        if count and mhz is not None and util is not None and util <= 100:
            entry = gpus.setdefault(gpu, {"gpu": gpu, "below_s": None, "share": None})
            entry.update(samples=int(count), mhz=mhz, util=util)
    if not gpus:
        return None
    shared = [g for g in gpus.values() if g["share"] is not None]
    sampled = [g for g in gpus.values() if g.get("samples")]
    worst = max(shared, key=lambda g: (g["share"], g["gpu"]), default=None)
    return {
        "span_s": span,
        "share": worst["share"] if worst else None,
        "worst_gpu": worst["gpu"] if worst else None,
        "util": statistics.fmean(g["util"] for g in sampled) if sampled else None,
        "mhz": statistics.fmean(g["mhz"] for g in sampled) if sampled else None,
        "samples": max((g["samples"] for g in sampled), default=0),
        "gpus": sorted(gpus.values(), key=lambda g: (-(g["share"] or 0), g["gpu"])),
    }


def clock_words(figures: dict) -> str:
    """ "below base clocks 34% (GPU 3); SM 1740 MHz, utilisation 79% (12 samples)"."""
    parts = []
    if figures.get("share") is not None:
        worst = f" ({clean(figures['worst_gpu'], 10)})" if figures["share"] else ""
        parts.append(f"below base clocks {percent(figures['share'])}{worst}")
    if figures.get("util") is not None:
        parts.append(
            f"SM {figures['mhz']:.0f} MHz, utilisation {figures['util']:.0f}% "
            f"({counted(figures['samples'], 'sample')})"
        )
    return "; ".join(parts)


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
    2%", and "; utilisation 97%, others' median 96%" where sampled."""
    text = (
        f"{clean(finding['node'], 40)} held the job back: {clean(finding['gpu'] or 'a GPU', 40)} "
        f"{clean(finding['cause'], 20)} {percent(finding['share'])} of the job's "
        f"{span_words(finding['duration_s'])}, others' median {percent(finding['others_median'])}"
    )
    if finding.get("util") is not None:
        text += (
            f"; utilisation {finding['util']:.0f}%, others' median {finding['others_util']:.0f}%"
        )
    return text


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
