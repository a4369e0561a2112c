"""Validation of the rising-counter finder on fleet models it was not written from
(bench/trend_fleets.py; docs/trends.md, "Validation").

For each model, health-check cadence and seed: a planted fleet's records go into a fleet store
through records.import_ndjson (the path `collect` and `import` take); its GPU models are read
back once, then the finder runs every --every hours over the last --sweep days as `slurmhealth
trends --now <that hour>` runs it: the series summed in SQL (queries.counter_series), then
judged (trends.judged). Beside it, a plain per-device rate test at the
same alpha: the errors of the last 24 h against the device's own 7 days before, Poisson, at
least twice the rate.

Reported per model and cadence, pooled over seeds:
- recall: planted series flagged by a sweep within 24 h of their onset;
- hours from onset to the first flag (median);
- held: of the sweeps from the first flag to the end of the record, the share that flag the
  planted series (a device still rising stays named);
- precision: nodes flagged on their planted series / nodes flagged on anything;
- healthy nodes flagged.

Run: `.venv/bin/python bench/validate_trends.py [--models drift workload clustered]
[--steps 5 15 60] [--seeds 2] [--nodes 128] [--days 18]`
"""

from __future__ import annotations

import argparse
import bisect
import io
import json
import math
import os
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trend_fleets import DAY, HOUR, START, Fleet  # noqa: E402

from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import queries, records, trends  # noqa: E402
from slurmhealth.fleet.policy import ln_poisson_sf  # noqa: E402

BUSY = 5.0  # episodes a day: a base from which a tenfold rise can pass ALPHA within a day


def plain(rows: list, now: float, alpha: float = trends.ALPHA) -> set:
    """{(node, device, counter)} a plain per-device rate test flags: errors in the last 24 h
    against the device's rate over the 7 days before, Poisson, P <= alpha and >= 2x."""
    sums: dict = {}
    for node, device, counter, t, delta, _ in rows:
        if delta is None or delta <= 0 or counter in trends.NOT_TRENDS:
            continue
        recent, past = sums.get((node, device, counter), (0.0, 0.0))
        if t > now - DAY:
            recent += delta
        elif t > now - 8 * DAY:
            past += delta
        sums[(node, device, counter)] = (recent, past)
    out = set()
    for key, (recent, past) in sums.items():
        expected = max(past / 7.0, 0.5 / 7)
        if recent >= 2 * expected and ln_poisson_sf(recent, expected) <= math.log(alpha):
            out.add(key)
    return out


def one(args: tuple) -> dict:
    model, step, seed, nodes, days, planted, every, sweep_days, alpha = args
    fleet = Fleet(model, seed, nodes, days, step * 60.0, planted)
    lines = fleet.records()
    with tempfile.TemporaryDirectory() as tmp:
        conn = store.connect(os.path.join(tmp, "fleet.db"))
        header = json.dumps({"type": "header", "format": records.FORMAT})
        records.import_ndjson(conn, io.StringIO("\n".join([header, *lines]) + "\n"))
        end = START + days * DAY
        rows = queries.counter_rows(conn, START, end)
        models = queries.node_models(conn, fleet.names, end, days * DAY)
        times = [r[3] for r in rows]
        reach = max(trends.WINDOWS) + trends.BASELINE
        plants = {n: (p.device[0], p.counter, p.onset, p.base) for n, p in fleet.plants.items()}
        tally = {name: {"flagged": {}, "first": {}, "held": {}} for name in ("finder", "plain")}
        # the finder as `slurmhealth trends` runs it: the series summed in SQL, then judged
        hours = trends.hours_of(trends.WINDOWS, trends.BASELINE)
        limits = (trends.FACTOR, trends.MIN_EPISODES, alpha)
        t = end - sweep_days * DAY
        while t <= end:
            lo, hi = bisect.bisect_right(times, t - reach), bisect.bisect_right(times, t)
            series = queries.counter_series(conn, t, hours, trends.NOT_TRENDS)
            judged = trends.judged(series, models, trends.WINDOWS, limits, trends.BASELINE)
            found = {
                "finder": {(f["node"], f["device"], f["counter"]) for f in judged},
                "plain": plain(rows[lo:hi], t, alpha),
            }
            for name, keys in found.items():
                _count(tally[name], keys, plants, t)
            t += every * HOUR
        conn.close()
    return {name: _summary(tally[name], plants, end, every) for name in tally} | {
        "rows": len(lines), "node_days": nodes * sweep_days,
    }


def _count(tally: dict, keys: set, plants: dict, t: float) -> None:
    for node, device, counter in keys:
        tally["flagged"].setdefault(node, set()).add((device, counter))
    for node, (device, counter, onset, _) in plants.items():
        hit = (node, device, counter) in keys
        if hit and t > onset and node not in tally["first"]:
            tally["first"][node] = t - onset
        if node in tally["first"] and t > onset:
            got = tally["held"].setdefault(node, [0, 0])
            got[0] += hit
            got[1] += 1


def _summary(tally: dict, plants: dict, end: float, every: float) -> dict:
    flagged = tally["flagged"]
    true = {n for n, got in flagged.items() if n in plants and plants[n][:2] in got}
    held = [h / n for h, n in tally["held"].values() if n]
    return {
        "planted": len(plants),
        # per planted series: (its base in episodes a day, hours from onset to the first flag or
        # None, hours of record after its onset)
        "plants": [
            (base, tally["first"][n] / HOUR if n in tally["first"] else None, (end - onset) / HOUR)
            for n, (_, _, onset, base) in plants.items()
        ],
        "within_day": sum(1 for d in tally["first"].values() if d <= DAY),
        "hours": [d / HOUR for d in tally["first"].values()],
        "held": held,
        "flagged": len(flagged),
        "true": len(true),
        "healthy": len([n for n in flagged if n not in plants]),
    }


def _line(name: str, results: list, node_days: int) -> str:
    planted = sum(r["planted"] for r in results)
    within = sum(r["within_day"] for r in results)
    hours = [h for r in results for h in r["hours"]]
    held = [h for r in results for h in r["held"]]
    flagged = sum(r["flagged"] for r in results)
    true = sum(r["true"] for r in results)
    healthy = sum(r["healthy"] for r in results)
    median = f"{statistics.median(hours):.1f} h" if hours else "-"
    kept = f"{statistics.mean(held):.2f}" if held else "-"
    precision = f"{true / flagged:.2f}" if flagged else "-"
    bands = _bands([p for r in results for p in r["plants"]])
    return (
        f"    {name:7s} recall {within / planted:.2f} ({within}/{planted}), {bands}, "
        f"median {median}, held {kept}, precision {precision} ({true}/{flagged}), healthy "
        f"flagged {healthy} in {node_days} node-days"
    )


def _bands(plants: list) -> str:
    """Recall within 24 h of the rises from a base of at least BUSY episodes a day, and within
    72 h of the rest (of those with 72 h of record after their onset)."""
    busy = [h for base, h, _ in plants if base >= BUSY]
    quiet = [h for base, h, after in plants if base < BUSY and after >= 72]
    day = sum(1 for h in busy if h is not None and h <= 24)
    days = sum(1 for h in quiet if h is not None and h <= 72)
    return f">={BUSY:g}/day in 24 h {day}/{len(busy)}, fewer in 72 h {days}/{len(quiet)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["drift", "workload", "clustered"])
    parser.add_argument("--steps", type=float, nargs="+", default=[5, 15, 60], help="minutes")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--days", type=int, default=18)
    parser.add_argument("--planted", type=int, default=8)
    parser.add_argument("--every", type=float, default=1.0, help="hours between sweeps")
    parser.add_argument("--alpha", type=float, default=trends.ALPHA, help="both tests' bar")
    parser.add_argument("--sweep", type=float, default=8.0, help="days swept, to the end")
    opts = parser.parse_args()
    jobs = [
        (m, s, seed, opts.nodes, opts.days, opts.planted, opts.every, opts.sweep, opts.alpha)
        for m in opts.models
        for s in opts.steps
        for seed in range(opts.seeds)
    ]
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        results = list(pool.map(one, jobs))
    print(
        f"trends: {opts.seeds} fleets per model and cadence, {opts.nodes} nodes, {opts.days} "
        f"days, {opts.planted} planted (10x), sweeps every {opts.every:g} h over the last "
        f"{opts.sweep:g} days, alpha {opts.alpha:g}"
    )
    for model in opts.models:
        for step in opts.steps:
            group = [r for j, r in zip(jobs, results) if j[0] == model and j[1] == step]
            node_days = sum(r["node_days"] for r in group)
            rows = statistics.mean(r["rows"] for r in group)
            print(f"  {model}, readings every {step:g} min ({rows:.0f} records a fleet)")
            for name in ("finder", "plain"):
                print(_line(name, [r[name] for r in group], node_days))


if __name__ == "__main__":
    main()
