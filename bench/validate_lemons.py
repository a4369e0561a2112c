"""Validation of the lemon policy on planted fleets (issue 4, docs/lemons.md).

For each seed and each k: a 512-node fleet over 28 days with 5 planted lemons at k times the
base hardware fault rate (and the fleet-wide incident on day 14). Every day d the sweep scores
the window ending at the end of day d (in-memory signals, as `slurmhealth lemons` would see
them). Reported, pooled over seeds, for policy.score and for the baseline, a plain per-node
Poisson test on hardware job failures alone at the same false-positive budget:
- precision and recall of the nodes ever flagged;
- median days from a lemon's third recorded hardware fault to its first flagging (lemons with
  at least 3 faults; never flagged counts as never; negative: flagged before the third);
- healthy nodes ever flagged per 1,000 healthy node-months;
- the incident: drains attempted, made and stopped by the circuit breaker, the most drains in
  any breaker window, and nodes flagged in fleets with the incident and no lemon at all.

Run: `.venv/bin/python bench/validate_lemons.py [--seeds 20] [--workers 2] [--no-warn-excess]`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurmhealth.fleet import policy, simulate  # noqa: E402

KS = (5, 10, 30, 100)
LEMONS = 5
NODES = 512
DAYS = 28
NODE_MONTH_DAYS = 365.25 / 12
DAY = simulate.DAY


def baseline(signals: dict, alpha: float) -> set:
    """Plain per-node Poisson test of hardware job failures against the fleet's pooled rate
    times the node's jobs, at alpha / fleet size; no floor, no minimum evidence."""
    jobs = sum(s["jobs"] for s in signals.values())
    failed = sum(s["hw_job_failures"] for s in signals.values())
    rate = failed / jobs if jobs else 0.0
    cut = math.log(alpha / len(signals))
    return {
        node
        for node, s in signals.items()
        if policy.ln_poisson_sf(s["hw_job_failures"], rate * s["jobs"]) < cut
    }


def sweep(history: simulate.History, params: dict) -> tuple:
    """Daily sweeps: ({node: first time flagged by score}, {node: ... by the baseline})."""
    fleet = history.fleet
    daily = simulate.daily_signals(history)
    items = simulate.fault_items(history, fleet.start, fleet.end)
    first_day = fleet.start // DAY
    window: dict = {}
    ours: dict = {}
    base: dict = {}
    for d in range(fleet.days):  # the fleet is no longer than the 28-day window
        simulate.add_signals(window, daily.get(first_day + d, {}))
        at = fleet.start + (d + 1) * DAY
        seen = {}
        for node in set(window) | set(items):
            mine = items.get(node, {})
            seen[node] = dict(
                window.get(node) or dict.fromkeys(policy.SIGNALS, 0),
                faults=simulate.window_items(mine.get("faults", []), fleet.start, at),
                warnings=simulate.window_items(mine.get("warnings", []), fleet.start, at),
            )
        seen = {n: s for n, s in seen.items() if s["node_days"] or s["faults"] or s["warnings"]}
        for r in policy.score(seen, params):
            if r["lemon"]:
                ours.setdefault(r["node"], at)
        for node in baseline(seen, params["alpha"]):
            base.setdefault(node, at)
    return ours, base


def one_fleet(job: tuple) -> dict:
    seed, k, warn_excess, params = job
    fleet = simulate.Fleet(nodes=NODES, days=DAYS, seed=seed)
    if k:
        fleet.lemons = simulate.pick_lemons(fleet, LEMONS, k)
    if not warn_excess:
        fleet.warn_factor = 1.0
    history = simulate.events(fleet)
    ours, base = sweep(history, params)
    least = params.get("min_faults", policy.DEFAULT_PARAMS["min_faults"])
    return {
        "k": k,
        "evident": sum(len(history.faults.get(n, [])) >= least for n in fleet.lemons),
        "lemons": {n: history.faults.get(n, []) for n in fleet.lemons},
        "healthy": NODES - len(fleet.lemons),
        "ours": ours,
        "base": base,
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


def summarize(results: list, key: str) -> dict:
    lemons = sum(len(r["lemons"]) for r in results)
    found = sum(len(set(r[key]) & set(r["lemons"])) for r in results)
    false = sum(len(set(r[key]) - set(r["lemons"])) for r in results)
    months = sum(r["healthy"] for r in results) * DAYS / NODE_MONTH_DAYS
    delays = _delays(results, key)
    return {
        "precision": found / (found + false) if found + false else math.nan,
        "recall": found / lemons if lemons else math.nan,
        "median_days": statistics.median(delays) if delays else math.nan,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--alpha", type=float, default=policy.DEFAULT_PARAMS["alpha"])
    parser.add_argument("--params", default="{}", help="policy parameters (JSON) to override")
    parser.add_argument(
        "--no-warn-excess",
        action="store_true",
        help="lemons show no more warnings than healthy nodes (hardware evidence only)",
    )
    args = parser.parse_args()
    started = time.time()
    params = dict(json.loads(args.params), alpha=args.alpha)
    jobs = [(s, k, not args.no_warn_excess, params) for k in (*KS, 0) for s in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(one_fleet, jobs))
    by_k = {k: [r for r in results if r["k"] == k] for k in KS}
    clean = [r for r in results if r["k"] == 0]
    print(
        f"{args.seeds} seeds x k in {KS}: {NODES} nodes, {DAYS} days, {LEMONS} lemons, "
        f"lemons' warnings {'1x' if args.no_warn_excess else 'k x'}, params {params}\n"
    )
    print(table(by_k))
    print()
    print(breaker_lines([r for rs in by_k.values() for r in rs] + clean, clean))
    print(f"\nwall time {time.time() - started:.0f} s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
