"""Validation of the slow-node finder on planted fleets (docs/diagnose.md, "Slow nodes against
their peers").

For each seed: a fleet store of N nodes (default 256) of two GPU models, each node diagnosed once
a day at a random hour for 7 days (level long: all-reduce, RDMA write bandwidth and read latency
per port, the built-in GPU tests per GPU), each diagnosis written through store.record_run as
node/diag/run.py records a `diag` run. A figure is its model's true value x the unit's own
factor (manufacturing spread: 1% sd per GPU, port or node, fixed for the week) x run-to-run
noise (0.5-2% sd per figure, FIGURES). Planted: per fleet, --slow nodes at each slowdown (7%,
10%), each slow on one figure of one unit (a GPU, a port, the node's all-reduce), from its
diagnosis on day --onset on. At the end of every day the sweep reads the --window days before
it through queries.diag_figures and peers.slow, as `slurmhealth slow --now <that midnight>`
does.

Reported, pooled over seeds, per slowdown: recall (the planted node flagged on the planted
figure by the last day); recall within a day of its second slow diagnosis (min_samples = 2
allows nothing earlier); the median days from its first slow diagnosis to the sweep that flags
it. Over all: precision of the nodes flagged, and findings that name a figure not planted.

Run: `.venv/bin/python bench/validate_slow.py [--seeds 40] [--nodes 256] [--margin 0.05]
[--onset 0] [--window 7]`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurmhealth import __version__  # noqa: E402
from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import peers, queries  # noqa: E402

DAY = 86400
START = 20_000 * DAY  # a UTC midnight (2024-10-04)
SLOWDOWNS = (0.07, 0.10)
MANUFACTURING = 0.01  # sd of a unit's own factor
# Two fleet halves of different hardware; ports are the node's active HCA ports. True values
# are of the order the tools report on these parts (8-GPU HGX boards, NDR 400 / HDR 200 ports).
MODELS = {
    "NVIDIA H100 80GB HBM3": {"share": 0.6, "gpus": 8, "ports": 8, "rate": 400.0},
    "NVIDIA A100-SXM4-80GB": {"share": 0.4, "gpus": 8, "ports": 4, "rate": 200.0},
}
# (probe, figure, unit kind, run-to-run sd, {model: true value}). Latencies: lower is better.
FIGURES = (
    ("nccl", "busbw_gbps", "node", 0.01, (480.0, 230.0)),
    ("nccl", "avg_busbw_gbps", "node", 0.015, (180.0, 90.0)),
    ("ib_write_bw", "bw_avg_gbps", "port", 0.005, (392.0, 196.0)),
    ("ib_read_lat", "typical_usec", "port", 0.02, (2.6, 2.9)),
    ("ib_read_lat", "avg_usec", "port", 0.02, (2.7, 3.0)),
    ("cuda", "matmul_tflops", "gpu", 0.015, (700.0, 260.0)),
    ("cuda", "memory_write_gbps", "gpu", 0.01, (2900.0, 1750.0)),
    ("cuda", "p2p_gbps", "gpu", 0.02, (360.0, 230.0)),
)
# The figures a slowdown is planted on (the averages move with their headline figure).
PLANTABLE = ("busbw_gbps", "bw_avg_gbps", "typical_usec", "matmul_tflops", "memory_write_gbps")
PLANTABLE += ("p2p_gbps",)
# Counts and sizes node/diag records beside the speeds: never compared, here to show it.
COUNTS = {
    "nccl": {"wrong": 0, "max_bytes": 8 << 30},
    "ib_write_bw": {"bytes": 65536},
    "ib_read_lat": {"bytes": 2},
    "cuda": {"matmul_mismatches": 0, "matmul_runs": 180, "memory_mismatches": 0},
}


class Fleet:
    """The hardware: each node's model, its units, their fixed factors, and the plants."""

    def __init__(self, seed: int, nodes: int, slow: int, onset: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - a simulation, not a secret
        names = list(MODELS)
        cut = round(nodes * MODELS[names[0]]["share"])
        self.model = {f"gpu{i:04d}": names[0 if i < cut else 1] for i in range(nodes)}
        self.factor = {
            (node, unit): self.rng.gauss(1.0, MANUFACTURING)
            for node in self.model
            for unit in (*self.units(node, "gpu"), *self.units(node, "port"), "node")
        }
        chosen = self.rng.sample(sorted(self.model), slow * len(SLOWDOWNS))
        self.planted: dict = {}  # node -> (figure, unit, slowdown)
        for k, node in enumerate(chosen):
            figure = self.rng.choice(PLANTABLE)
            kind = next(f[2] for f in FIGURES if f[1] == figure)
            unit = self.rng.choice(self.units(node, kind))
            self.planted[node] = (figure, unit, SLOWDOWNS[k % len(SLOWDOWNS)])
        self.onset = START + onset * DAY

    def units(self, node: str, kind: str) -> list:
        spec = MODELS[self.model[node]]
        if kind == "gpu":
            return [f"gpu{g}" for g in range(spec["gpus"])]
        if kind == "port":
            return [f"mlx5_{p}:1" for p in range(spec["ports"])]
        return ["node"]

    def value(self, node: str, figure: tuple, unit: str, when: float) -> float:
        probe, name, _kind, noise, truth = figure
        model = list(MODELS).index(self.model[node])
        got = truth[model] * self.factor[(node, unit)] * self.rng.gauss(1.0, noise)
        plant = self.planted.get(node)
        if plant and plant[:2] == (name, unit) and when >= self.onset:
            got *= 1 + plant[2] if name.endswith("_usec") else 1 - plant[2]
        return round(got, 3)


def records(fleet: Fleet, node: str, when: float) -> dict:
    """One diagnosis as node/diag/run.py Diagnosis.records() gives it to store.record_run."""
    spec = MODELS[fleet.model[node]]
    outcomes: dict = {"checks": [_outcome("node", {}, "pass")]}
    for figure in FIGURES:
        probe, name, kind = figure[:3]
        for unit in fleet.units(node, kind):
            found = outcomes.setdefault(probe, [])
            mine = next((o for o in found if o["unit"] == unit), None)
            if mine is None:
                mine = _outcome(unit, dict(COUNTS[probe]), "pass")
                found.append(mine)
            mine["figures"][name] = fleet.value(node, figure, unit, when)
            if name == "bw_avg_gbps" and mine["figures"][name] < 0.9 * spec["rate"]:
                mine["status"] = "fail"  # the probe's own floor (settings.diag_ib_min_share)
    sources = {"diag": {"level": "long", "seconds": 1500.0, "gpu_model": fleet.model[node]}}
    sources["diag"]["gpus"] = spec["gpus"]
    results = [
        {
            "check_name": f"diag.{probe}",
            "status": "fail" if any(o["status"] == "fail" for o in found) else "ok",
            "message": "",
            "action": "none",
            "data": json.dumps({"level": "long", "outcomes": found}),
            "duration": 60.0,
        }
        for probe, found in outcomes.items()
    ]
    verdict = "fail" if any(r["status"] == "fail" for r in results) else "ok"
    run = {
        "node": node,
        "job_id": None,
        "phase": "diag",
        "started": when,
        "duration": 1500.0,
        "verdict": verdict,
        "tool_version": __version__,
        "sources": json.dumps(sources),
    }
    return {"run": run, "results": results, "events": [], "baselines": {}}


def _outcome(unit: str, figures: dict, status: str) -> dict:
    return {"unit": unit, "status": status, "figures": figures, "evidence": ""}


def one_fleet(job: tuple) -> dict:
    seed, nodes, days, slow, onset, margin, window = job
    fleet = Fleet(seed, nodes, slow, onset)
    flagged: dict = {}  # (node, figure) -> first sweep that flagged it
    slow_runs: dict = {}  # planted node -> times of its slow diagnoses
    with tempfile.TemporaryDirectory() as folder:
        conn = store.connect(os.path.join(folder, "fleet.db"))
        conn.execute("PRAGMA synchronous = OFF")  # a throwaway store: no fsync per run
        for day in range(days):
            for node in sorted(fleet.model):
                when = START + day * DAY + fleet.rng.uniform(0, DAY - 1)
                store.record_run(conn, records(fleet, node, when))
                if node in fleet.planted and when >= fleet.onset:
                    slow_runs.setdefault(node, []).append(when)
            end = START + (day + 1) * DAY
            rows = queries.diag_figures(conn, end - window * DAY, end)
            for f in peers.slow(rows, margin=margin):
                flagged.setdefault((f["node"], f["figure"]), end)
        conn.close()
    return {"planted": fleet.planted, "flagged": flagged, "slow_runs": slow_runs, "nodes": nodes}


def summarize(results: list) -> tuple:
    """({slowdown: {planted, found, within_day, median_days}}, precision of the nodes flagged,
    findings on a figure not planted, healthy nodes flagged)."""
    per: dict = {s: {"planted": 0, "found": 0, "within_day": 0, "days": []} for s in SLOWDOWNS}
    true_nodes = false_nodes = false_findings = 0
    for r in results:
        for node, (figure, _unit, slowdown) in r["planted"].items():
            row = per[slowdown]
            row["planted"] += 1
            at = r["flagged"].get((node, figure))
            runs = sorted(r["slow_runs"].get(node, []))
            if at is None:
                row["days"].append(math.inf)
                continue
            row["found"] += 1
            row["days"].append((at - runs[0]) / DAY)
            row["within_day"] += len(runs) >= 2 and at - runs[1] <= DAY
        nodes = {node for node, _figure in r["flagged"]}
        true_nodes += len(nodes & set(r["planted"]))
        false_nodes += len(nodes - set(r["planted"]))
        false_findings += sum(
            1 for node, figure in r["flagged"] if r["planted"].get(node, ("",))[0] != figure
        )
    for row in per.values():
        row["median_days"] = statistics.median(row.pop("days")) if row["planted"] else math.nan
    flagged = true_nodes + false_nodes
    precision = true_nodes / flagged if flagged else math.nan
    return per, precision, false_findings, false_nodes


def table(results: list, margin: float) -> str:
    per, precision, false_findings, false_nodes = summarize(results)
    healthy = sum(r["nodes"] - len(r["planted"]) for r in results)
    lines = [
        "| slowdown | planted | recall | recall within a day of the 2nd slow diagnosis "
        "| median days 1st slow diagnosis -> flagged | precision (nodes) "
        "| healthy nodes flagged | findings on a figure not planted |",
        "|" + "---|" * 8,
    ]
    for slowdown, row in per.items():
        n = row["planted"]
        lines.append(
            f"| {slowdown:.0%} | {n} | {row['found'] / n:.2f} | {row['within_day'] / n:.2f} "
            f"| {_f(row['median_days'])} | {_f(precision)} | {false_nodes} of {healthy} "
            f"| {false_findings} |"
        )
    return "\n".join(lines) + f"\n\nmargin {margin:.0%}"


def _f(value: float) -> str:
    if math.isnan(value):
        return "-"
    return "never" if math.isinf(value) else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--slow", type=int, default=4, help="planted nodes per slowdown")
    parser.add_argument("--onset", type=int, default=0, help="the day the slowdowns start")
    parser.add_argument("--window", type=int, default=7, help="days each sweep reads")
    parser.add_argument("--margin", type=float, default=peers.MARGIN)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    started = time.time()
    jobs = [
        (seed, args.nodes, args.days, args.slow, args.onset, args.margin, args.window)
        for seed in range(args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(one_fleet, jobs))
    print(
        f"{args.seeds} seeds: {args.nodes} nodes ({', '.join(MODELS)}), a diagnosis a day for "
        f"{args.days} days, {args.slow} nodes slow by each of "
        f"{', '.join(f'{s:.0%}' for s in SLOWDOWNS)} from day {args.onset}, daily sweeps over "
        f"{args.window} days\n"
    )
    print(table(results, args.margin))
    print(f"\nwall time {time.time() - started:.0f} s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
