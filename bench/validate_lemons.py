"""Validation of the lemon policy on planted fleets (issues 4 and 11, docs/lemons.md).

For each seed and each k: a 512-node fleet over 28 days with 5 planted lemons at k times the
base hardware fault rate (and the fleet-wide incident on day 14). Every day d the sweep scores
the 28-day window ending at the end of day d (in-memory signals, as `slurmhealth lemons` would
see them). Reported, pooled over seeds, for policy.score and for the baseline, a plain per-node
Poisson test on hardware job failures alone at the same false-positive budget, and the limit
of any count test (the lemon's true faults against the true base rate of its generation, at
that budget):
- precision and recall of the nodes ever flagged;
- the same of one sweep at the end of the 28 days alone (issue 11's protocol: `lemons --now`);
- median days from a lemon's third recorded hardware fault to its first flagging (lemons with
  at least 3 faults; never flagged counts as never; negative: flagged before the third);
- healthy nodes ever flagged per 1,000 healthy node-months;
- the incident: drains attempted, made and stopped by the circuit breaker, the most drains in
  any breaker window, and nodes flagged in fleets with the incident and no lemon at all;
- steady state (--steady): fleets of 112 days without lemons, swept daily over a sliding
  28-day window: healthy nodes newly flagged per 1,000 node-months once the window is full.

Run: `.venv/bin/python bench/validate_lemons.py [--seeds 10] [--steady 10] [--models all|NAME,...]
[--detail]`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim import simulate  # noqa: E402
from slurmhealth.fleet import policy  # noqa: E402

KS = (5, 10, 30, 100)
LEMONS = 5
NODES = 512
DAYS = 28
WINDOW = 28  # days each sweep scores (`slurmhealth lemons --window 28d`)
STEADY_DAYS = 112
NODE_MONTH_DAYS = policy.NODE_MONTH_DAYS
DAY = simulate.DAY


def ln_budget(params: dict, days: float) -> float:
    """ln of the false-positive budget over a window of `days` (policy.score's whole budget)."""
    fp = params.get("fp_per_node_month", policy.DEFAULT_PARAMS["fp_per_node_month"])
    return math.log(fp * max(days, 1.0) / NODE_MONTH_DAYS)


def baseline(signals: dict, cut: float) -> set:
    """Plain per-node Poisson test of hardware job failures against the fleet's pooled rate
    times the node's jobs, p below `cut` (the whole budget); no floor, no minimum evidence."""
    jobs = sum(s["jobs"] for s in signals.values())
    failed = sum(s["hw_job_failures"] for s in signals.values())
    rate = failed / jobs if jobs else 0.0
    return {
        node
        for node, s in signals.items()
        if policy.ln_poisson_sf(s["hw_job_failures"], rate * s["jobs"]) < cut
    }


def _less(total: dict, gone: dict) -> None:
    """total -= gone, per node and signal (a day leaving the sliding window)."""
    for node, counts in gone.items():
        mine = total[node]
        for key, value in counts.items():
            mine[key] -= value


def sweep(history: simulate.History, params: dict) -> tuple:
    """Daily sweeps of the WINDOW days up to each day's end: ({node: [times newly flagged by
    score]}, {node: [... by the baseline]}, (nodes the last day's sweep flags by score, by the
    baseline)); a node is newly flagged on a day it is a lemon after a day it was not."""
    fleet = history.fleet
    daily = simulate.daily_signals(history)
    items = simulate.fault_items(history, fleet.start, fleet.end)
    first_day = fleet.start // DAY
    classes = simulate.gpu_classes(fleet)  # what fleet.signals reads from each node's runs
    window: dict = {}
    ours: dict = {}
    base: dict = {}
    before: tuple = (set(), set())
    for d in range(fleet.days):
        simulate.add_signals(window, daily.get(first_day + d, {}))
        if d >= WINDOW:
            _less(window, daily.get(first_day + d - WINDOW, {}))
        at = fleet.start + (d + 1) * DAY
        since = max(fleet.start, at - WINDOW * DAY)
        seen = {}
        for node in set(window) | set(items):
            mine = items.get(node, {})
            seen[node] = dict(
                window.get(node) or dict.fromkeys(policy.SIGNALS, 0),
                faults=simulate.window_items(mine.get("faults", []), since, at),
                warnings=simulate.window_items(mine.get("warnings", []), since, at),
                gpu_class=classes.get(node, ""),
            )
        seen = {n: s for n, s in seen.items() if s["node_days"] or s["faults"] or s["warnings"]}
        flagged = {r["node"] for r in policy.score(seen, params) if r["lemon"]}
        plain = baseline(seen, ln_budget(params, (at - since) / DAY))
        for node in flagged - before[0]:
            ours.setdefault(node, []).append(at)
        for node in plain - before[1]:
            base.setdefault(node, []).append(at)
        before = (flagged, plain)
    return ours, base, before


# The fleet models (docs/lemons.md, "Validation"): each a set of simulate.Fleet fields. Every
# model but the first has lemons that warn no more than healthy nodes (hardware evidence only).
HW_ONLY = {"warn_factor": 1.0}
MODELS = {
    "warn-excess": ("lemons warn k times as often as healthy nodes", {}),
    "hw-only": ("lemons warn no more than healthy nodes", HW_ONLY),
    "single-check": (
        "every fault fails one health check, then passes",
        {**HW_ONLY, "repair_hours": 0},
    ),
    "no-drains": ("monitor mode: no drain records", {**HW_ONLY, "drains": False}),
    "no-node-events": ("accounting has no node events", {**HW_ONLY, "node_event_share": 0.0}),
    "generations": (
        "two GPU generations, the second failing 2.5x as often",
        {**HW_ONLY, "generations": ((0.5, 1.0), (0.5, 2.5))},
    ),
    "no-incident": ("no fleet-wide incident", {**HW_ONLY, "incident_day": None}),
    "bursts": ("lemons fail in bursts of 3", {**HW_ONLY, "lemon_burst": 3}),
    "rate-4.5": (
        "the base rate fixed at 4.5 per 1,000 node-days (issue 11's fleets)",
        {**HW_ONLY, "base_rate": 0.0045},
    ),
}
# Fleets without lemons, STEADY_DAYS long, for the rate at which a sliding window flags
# healthy nodes once it is full (--steady).
STEADY = {
    "steady": ("base rate drawn in the literature's range", HW_ONLY),
    "steady-4.5": ("base rate 4.5 per 1,000 node-days", {**HW_ONLY, "base_rate": 0.0045}),
}


def sufficed(history: simulate.History, node: str, params: dict) -> float | None:
    """When the node's true faults would first convince a plain per-node Poisson test at the
    true rate of its pool (its generation's) at the whole budget (the sweep at the end of that
    day), or None: the limit of any test of fault counts."""
    fleet = history.fleet
    times = history.faults.get(node, [])
    rate = history.base_rate  # the node's own generation's, where the fleet has generations
    if fleet.generations:
        rate *= fleet.generations[history.generation[history.names.index(node)]][1]
    for d in range(1, fleet.days + 1):
        at = fleet.start + d * DAY
        days = min(d, WINDOW)
        seen = sum(at - days * DAY <= t < at for t in times)
        if seen and policy.ln_poisson_sf(seen, rate * days) < ln_budget(params, days):
            return at
    return None


def one_fleet(job: tuple) -> dict:
    seed, k, model, params = job
    fields = dict(MODELS, **STEADY)[model][1]
    days = STEADY_DAYS if model in STEADY else DAYS
    fleet = simulate.Fleet(nodes=NODES, days=days, seed=seed, **fields)
    if k:
        fleet.lemons = simulate.pick_lemons(fleet, LEMONS, k)
    history = simulate.events(fleet)
    ours, base, (last, last_plain) = sweep(history, params)
    least = params.get("min_faults", policy.DEFAULT_PARAMS["min_faults"])
    return {
        "k": k,
        "model": model,
        "days": days,
        "base_rate": history.base_rate,
        "evident": sum(len(history.faults.get(n, [])) >= least for n in fleet.lemons),
        "lemons": {n: history.faults.get(n, []) for n in fleet.lemons},
        "sufficed": {n: sufficed(history, n, params) for n in fleet.lemons},
        "healthy": NODES - len(fleet.lemons),
        "ours": {n: times[0] for n, times in ours.items()},
        "base": {n: times[0] for n, times in base.items()},
        "ours_end": dict.fromkeys(last, fleet.end),
        "base_end": dict.fromkeys(last_plain, fleet.end),
        "ours_all": ours,
        "base_all": base,
        "breaker": history.breaker,
    }


def _delays(results: list, key: str) -> list:
    out = []
    for r in results:
        for node, faults in r["lemons"].items():
            if len(faults) >= 3:
                flagged = r[key].get(node)
                out.append(math.inf if flagged is None else (flagged - faults[2]) / DAY)
    return out


def _late(results: list, key: str) -> list:
    """Days from the evidence sufficing (sufficed()) to the first flag; never: inf."""
    out = []
    for r in results:
        for node, at in r["sufficed"].items():
            if at is not None:
                flagged = r[key].get(node)
                out.append(math.inf if flagged is None else (flagged - at) / DAY)
    return out


def summarize(results: list, key: str) -> dict:
    lemons = sum(len(r["lemons"]) for r in results)
    found = sum(len(set(r[key]) & set(r["lemons"])) for r in results)
    false = sum(len(set(r[key]) - set(r["lemons"])) for r in results)
    months = sum(r["healthy"] * r["days"] for r in results) / NODE_MONTH_DAYS
    delays, late = _delays(results, key), _late(results, key)
    limit = sum(at is not None for r in results for at in r["sufficed"].values())
    return {
        "precision": found / (found + false) if found + false else math.nan,
        "recall": found / lemons if lemons else math.nan,
        "limit": limit / lemons if lemons else math.nan,
        "median_days": statistics.median(delays) if delays else math.nan,
        "median_late": statistics.median(late) if late else math.nan,
        "with3": len(delays),
        "fp_rate": 1000 * false / months,
        "false": false,
    }


def _f(value: float, spec: str = ".2f") -> str:
    if math.isnan(value):
        return "-"
    return "never" if math.isinf(value) else format(value, spec)


def _lemons(results: list) -> str:
    counts = [len(f) for r in results for f in r["lemons"].values()]
    evident = sum(r["evident"] for r in results)
    at_least = [sum(c >= n for c in counts) for n in (1, 2, 3)]
    return f"{len(counts)} | " + " / ".join(map(str, at_least)) + f" | {evident}"


def table(by_k: dict) -> str:
    head = (
        "| k | lemons | with >= 1 / 2 / 3 faults | with min_faults | precision | recall "
        "| median days 3rd fault -> flagged "
        "| healthy flagged / 1k node-months | baseline precision | baseline recall "
        "| baseline median days | baseline healthy / 1k node-months |"
    )
    lines = [head, "|" + "---|" * 12]
    for k, results in by_k.items():
        a, b = summarize(results, "ours"), summarize(results, "base")
        lines.append(
            f"| {k} | {_lemons(results)} | {_f(a['precision'])} | {_f(a['recall'])} "
            f"| {_f(a['median_days'], '.1f')} | {_f(a['fp_rate'])} ({a['false']}) "
            f"| {_f(b['precision'])} | {_f(b['recall'])} | {_f(b['median_days'], '.1f')} "
            f"| {_f(b['fp_rate'])} ({b['false']}) |"
        )
    return "\n".join(lines)


def breaker_lines(results: list, clean: list) -> str:
    stats = [r["breaker"] for r in results]
    cap = stats[0]["cap"]
    worst = max(s["max_in_window"] for s in stats)
    mean = {key: statistics.mean(s[key] for s in stats) for key in ("attempts", "drained")}
    stopped = statistics.mean(s["stopped"] for s in stats)
    flagged = sum(len(r["ours"]) for r in clean)
    flagged_base = sum(len(r["base"]) for r in clean)
    return (
        f"- Circuit breaker (cap {cap} drains per hour on {NODES} nodes): per fleet "
        f"{mean['attempts']:.0f} drain attempts, {mean['drained']:.0f} drains made, "
        f"{stopped:.0f} stopped by the breaker (nearly all in the incident); the most drains in "
        f"any hour: {worst} (cap {cap}){' OK' if worst <= cap else ' OVER THE CAP'}.\n"
        f"- Incident only (no lemon planted, {len(clean)} fleets): nodes flagged by score: "
        f"{flagged}; by the baseline: {flagged_base}."
    )


def _pairs(by_model: dict, ours: str, base: str) -> Iterator[tuple]:
    """(model, k, summarize of ours, of the baseline, the model's results) per model and k."""
    for model, results in by_model.items():
        for k in KS:
            rs = [r for r in results if r["k"] == k]
            yield model, k, summarize(rs, ours), summarize(rs, base), results


def summary(by_model: dict) -> str:
    """One line per model and k: ours against the baseline on the same fleets."""
    lines = [
        "| model | k | recall | baseline recall | limit of a count test | precision "
        "| baseline precision "
        "| healthy flagged / 1k node-months (baseline) | median days 3rd fault -> flagged "
        "(baseline) | median days evidence sufficed -> flagged | incident-only fleets: "
        "nodes flagged (baseline) |",
        "|" + "---|" * 11,
    ]
    for model, k, a, b, results in _pairs(by_model, "ours", "base"):
        clean = [r for r in results if r["k"] == 0]
        quiet = f"{sum(len(r['ours']) for r in clean)} ({sum(len(r['base']) for r in clean)})"
        lines.append(
            f"| {model} | {k} | {_f(a['recall'])} | {_f(b['recall'])} | {_f(a['limit'])} "
            f"| {_f(a['precision'])} | {_f(b['precision'])} "
            f"| {_f(a['fp_rate'])} ({_f(b['fp_rate'])}) "
            f"| {_f(a['median_days'], '.1f')} ({_f(b['median_days'], '.1f')}) "
            f"| {_f(a['median_late'], '.1f')} | {quiet if k == KS[0] else ''} |"
        )
    return "\n".join(lines)


def end_lines(by_model: dict) -> str:
    """Issue 11's protocol: one sweep at the end of the DAYS (`slurmhealth lemons --now`), not
    a sweep a day; a node counts when that sweep flags it."""
    lines = [
        "| model | k | recall (baseline) | precision (baseline) "
        "| healthy flagged / 1k node-months (baseline) |",
        "|" + "---|" * 5,
    ]
    for model, k, a, b, _ in _pairs(by_model, "ours_end", "base_end"):
        lines.append(
            f"| {model} | {k} | {_f(a['recall'])} ({_f(b['recall'])}) "
            f"| {_f(a['precision'])} ({_f(b['precision'])}) "
            f"| {_f(a['fp_rate'])} ({_f(b['fp_rate'])}) |"
        )
    return "\n".join(lines)


def steady_lines(results: list) -> str:
    """Healthy nodes newly flagged per 1,000 node-months once the sliding window is full (days
    WINDOW on), by score and by the baseline; each fleet's base rate beside."""
    lines = []
    for model in STEADY:
        rs = [r for r in results if r["model"] == model]
        if not rs:
            continue
        months = sum(r["healthy"] * (r["days"] - WINDOW) for r in rs) / NODE_MONTH_DAYS
        full = {r["base_rate"]: r for r in rs}
        count = {
            key: sum(
                t >= simulate.EPOCH + WINDOW * DAY
                for r in rs
                for times in r[key].values()
                for t in times
            )
            for key in ("ours_all", "base_all")
        }
        rates = ", ".join(f"{1000 * rate:.2f}" for rate in sorted(full))
        lines.append(
            f"- {model} ({STEADY[model][0]}; {len(rs)} fleets of {rs[0]['days']} days, base "
            f"rates per 1,000 node-days {rates}): healthy nodes newly flagged after day "
            f"{WINDOW}: {count['ours_all']} in {months:,.0f} node-months, "
            f"{1000 * count['ours_all'] / months:.2f} per 1,000 (baseline "
            f"{count['base_all']}, {1000 * count['base_all'] / months:.2f})"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--budget",
        type=float,
        default=policy.DEFAULT_PARAMS["fp_per_node_month"],
        help="false-positive budget: healthy nodes flagged per node-month",
    )
    parser.add_argument(
        "--steady", type=int, default=10, help=f"seeds of each {STEADY_DAYS}-day fleet model"
    )
    parser.add_argument("--params", default="{}", help="policy parameters (JSON) to override")
    parser.add_argument(
        "--models",
        default="all",
        help=f"comma-separated fleet models, or all: {', '.join(MODELS)}",
    )
    parser.add_argument("--detail", action="store_true", help="also the full table per model")
    args = parser.parse_args()
    models = list(MODELS) if args.models == "all" else args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    started = time.time()
    params = dict(json.loads(args.params), fp_per_node_month=args.budget)
    jobs = [(s, k, m, params) for m in models for k in (*KS, 0) for s in range(args.seeds)]
    jobs += [(1000 + s, 0, m, params) for m in STEADY for s in range(args.steady)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(one_fleet, jobs))
    by_model = {m: [r for r in results if r["model"] == m] for m in models}
    print(
        f"{args.seeds} seeds x k in {KS} x {len(models)} models: {NODES} nodes, {DAYS} days, "
        f"swept daily over {WINDOW} days, "
        f"{LEMONS} lemons, params {params}\n"
    )
    for m in models:
        print(f"- {m}: {MODELS[m][0]}")
    print()
    print(summary(by_model))
    print(f"\nOne sweep at the end of the {DAYS} days (issue 11's protocol):\n")
    print(end_lines(by_model))
    print()
    print(steady_lines(results))
    for m in models if args.detail else ():
        rs = by_model[m]
        print(f"\n### {m}\n")
        print(table({k: [r for r in rs if r["k"] == k] for k in KS}))
        print()
        print(breaker_lines([r for r in rs if r["k"]], [r for r in rs if r["k"] == 0]))
    print(f"\nwall time {time.time() - started:.0f} s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
