"""Validation of the held-back finder on planted fleets (docs/trends.md, "Passive: the node that
held a job back").

For each seed: a fleet store of N nodes (default 256, 8 GPUs each) running jobs for 7 days.
Jobs arrive as a Poisson stream that keeps about 90% of the fleet busy (LOAD); sizes 1-32 nodes
(SIZES: 30% one node, 70% multi-node), durations log-uniform 1-24 h; a job takes random free
nodes (or waits for the earliest to free up). Each node of a job records a prolog run at its
start and an epilog run at its end (a few seconds apart between nodes), through
store.record_run with the job columns node/agent.py writes (start, state, num_nodes; end,
state). Their counter rows are what node/counters.py makes of the GPUs' cumulative
perf_power_ns and perf_thermal_ns (NVML fields 74/75, ns): readings() and changes() with the
node's baseline carried from run to run, so first readings (delta None) and resets (a reboot
between jobs, RESET) are recorded as on a node. Idle GPUs are never held back, so a health
check between or during jobs would only split a job's increase into more rows: health checks
are left out.

The share of a job's time each GPU is held back (healthy):
- the job's own level (JOB_LEVELS): 70% of jobs light (0-5%), 20% medium (5-25%), 10% power
  hungry (30-80%, every node capped);
- x the GPU's own factor (log-normal, sd 0.25, fixed: some parts reach the power limit sooner)
  x the node's noise in that job x the GPU's noise in that job (log-normal, sd 0.2 each);
- uneven jobs (UNEVEN, 20%): up to a quarter of the job's nodes (one pipeline stage, the rank
  that writes the checkpoints) carry 1-2x the job's level;
- warm nodes (WARM, 5% of nodes, fixed): thermally slowed 0-6% of every job (a rack's inlet).
Planted per fleet: --planted nodes at each extra (EXTRAS: 10%, 20%, 40% of the job's time), on
one GPU (power or thermal, at random: a lower enforced power limit, a failed fan), in every job
the node runs from day --onset on. The share of a GPU is capped at 100%.

At every midnight the sweep reads the jobs that ended in the 7 days before it as the report's
and the lemon sweep's warnings do (fleet/signals.py `_ahead`): queries.held_back_jobs, then
telemetry.repeated. Reported, pooled over seeds, per extra: recall by the last sweep and by day
1, 2 and 3; the median number of the node's compared jobs (3+ nodes, what held_back_jobs
compares) up to the one that made it repeated (a sweep after every job would have named it
then), and the median hours from onset to that job's end. Over all: precision of the nodes
named by any sweep, healthy nodes named (and how many of them hold one of the fleet's top 5%
GPUs by own factor, or are warm), jobs whose held-back finding names a healthy node.

--signal base plants a slowdown the policy counters do not see (a power brake, an overheating
HBM stack): the planted GPU spends the extra share of each job below its base clock (NVML field
81), which the epilog records per GPU in jobs.gpu_energy ("b", node/counters.py job_telemetry)
and the finder reads when the policy counters name nobody. Every GPU's share below base clocks
is then the job's idle share (IDLE: jobs that leave their GPUs idle part of the time, data
loading, checkpoints; the same on each of the job's nodes, x the node's noise) plus its policy
share (held back by the power or thermal policy: counted as below base too, the worst case).

--gpu-sd, --noise-sd and --uneven change the model; --margin and --factor set the finder's
telemetry.MARGIN and FACTOR in the workers, --repeat the `least` given to telemetry.repeated
(the defaults are the module's own).

Run: `.venv/bin/python bench/validate_heldback.py [--seeds 40] [--nodes 256] [--planted 2]
[--onset 0] [--uneven 0.2] [--gpu-sd 0.25] [--noise-sd 0.2] [--margin 0.1] [--factor 2]
[--repeat 2] [--signal policy|base]`
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
from slurmhealth.fleet import queries, telemetry  # noqa: E402
from slurmhealth.node import counters  # noqa: E402

DAY = 86400.0
HOUR = 3600.0
START = 20_000 * DAY  # a UTC midnight (2024-10-04)
DAYS = 7
GPUS = 8
LOAD = 0.9  # node-hours asked / node-hours there are
SIZES = {1: 0.30, 2: 0.15, 3: 0.05, 4: 0.15, 8: 0.15, 16: 0.12, 32: 0.08}
DURATION_H = (1.0, 24.0)  # log-uniform
# (share of jobs, lowest, highest level): the share of the job's time its GPUs are power-capped
JOB_LEVELS = ((0.70, 0.0, 0.05), (0.20, 0.05, 0.25), (0.10, 0.30, 0.80))
GPU_SD = 0.25  # log-normal sd of a GPU's own factor (fixed)
NOISE_SD = 0.2  # log-normal sd of the node's and of the GPU's noise in one job
UNEVEN = 0.2  # share of jobs where some nodes carry more (1-2x the level)
WARM = (0.05, 0.06)  # share of nodes thermally slowed in every job, and their highest share
RESET = 0.01  # chance of a reboot (counters restart at 0) before a job
EXTRAS = (0.10, 0.20, 0.40)
# (share of jobs, lowest, highest): the share of the job's time its GPUs sit idle (below base)
IDLE = ((0.6, 0.0, 0.05), (0.3, 0.05, 0.20), (0.1, 0.20, 0.40))
BUSES = [f"00000000:{0x18 + 0x10 * g:02X}:00.0" for g in range(GPUS)]


class Fleet:
    """Nodes, their GPUs' fixed factors, the warm nodes and the plants."""

    def __init__(self, seed: int, nodes: int, planted: int, onset: int, opts: dict) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - a simulation, not a secret
        self.opts = opts
        self.names = [f"gpu{i:04d}" for i in range(nodes)]
        self.factor = {
            (n, g): math.exp(self.rng.gauss(0, opts["gpu_sd"]))
            for n in self.names
            for g in range(GPUS)
        }
        warm = self.rng.sample(self.names, round(WARM[0] * nodes))
        self.warm = {n: self.rng.uniform(0, WARM[1]) for n in warm}
        chosen = self.rng.sample(self.names, planted * len(EXTRAS))
        # node -> (extra share, GPU, counter)
        kinds = ("perf_power_ns", "perf_thermal_ns") if opts["signal"] == "policy" else ("base",)
        self.planted = {
            n: (EXTRAS[k % len(EXTRAS)], self.rng.randrange(GPUS), self.rng.choice(kinds))
            for k, n in enumerate(chosen)
        }
        self.onset = START + onset * DAY

    def job_shares(self, nodes: list, start: float) -> dict:
        """{node: [(power share, thermal share, share below base clocks)] per GPU} of one job."""
        weights = [w for w, _, _ in JOB_LEVELS]
        _, low, high = self.rng.choices(JOB_LEVELS, weights)[0]
        level = self.rng.uniform(low, high)
        _, low, high = self.rng.choices(IDLE, [w for w, _, _ in IDLE])[0]
        idle = self.rng.uniform(low, high)
        more = {}
        if self.rng.random() < self.opts["uneven"]:
            heavy = self.rng.sample(nodes, self.rng.randint(1, max(1, len(nodes) // 4)))
            more = {n: self.rng.uniform(1.0, 2.0) for n in heavy}
        out = {}
        for node in nodes:
            node_noise = math.exp(self.rng.gauss(0, self.opts["noise_sd"]))
            gpus = []
            for g in range(GPUS):
                noise = math.exp(self.rng.gauss(0, self.opts["noise_sd"]))
                power = level * more.get(node, 1.0) * self.factor[(node, g)] * node_noise * noise
                thermal = self.warm.get(node, 0.0) * math.exp(self.rng.gauss(0, 0.2))
                plant = self.planted.get(node)
                extra = 0.0
                if plant and plant[1] == g and start >= self.onset:
                    if plant[2] == "perf_power_ns":
                        power += plant[0]
                    elif plant[2] == "perf_thermal_ns":
                        thermal += plant[0]
                    else:
                        extra = plant[0]
                total = power + thermal
                if total > 1.0:
                    power, thermal = power / total, thermal / total
                below = min(1.0, idle * node_noise + power + thermal + extra)
                gpus.append((power, thermal, below))
            out[node] = gpus
        return out


def schedule(rng: random.Random, names: list, horizon: float) -> list:
    """[(job id, start, end, [nodes])]: Poisson arrivals at LOAD, random free nodes."""
    sizes, weights = list(SIZES), list(SIZES.values())
    low, high = math.log(DURATION_H[0]), math.log(DURATION_H[1])
    mean_hours = (DURATION_H[1] - DURATION_H[0]) / (high - low)
    mean_size = sum(s * w for s, w in SIZES.items())
    gap = mean_size * mean_hours * HOUR / (LOAD * len(names))
    free = dict.fromkeys(names, START)
    jobs, t, job_id = [], START, 1000
    while True:
        t += rng.expovariate(1 / gap)
        if t >= horizon:
            return jobs
        size = min(rng.choices(sizes, weights)[0], len(names))
        idle = [n for n in names if free[n] <= t]
        if len(idle) >= size:
            chosen, begin = rng.sample(idle, size), t
        else:
            chosen = sorted(names, key=lambda n: (free[n], rng.random()))[:size]
            begin = max(free[n] for n in chosen)
        if begin >= horizon:
            continue
        end = begin + HOUR * math.exp(rng.uniform(low, high))
        for n in chosen:
            free[n] = end + rng.uniform(10, 60)  # the epilog, then the next prolog
        jobs.append((str(job_id), begin, end, sorted(chosen)))
        job_id += 1


class Node:
    """One node's cumulative counters and the baseline node/counters.py carries."""

    def __init__(self, rng: random.Random) -> None:
        # counted since the driver loaded, before the store began: first readings
        self.values = {
            (g, c): rng.randrange(0, 10**15) for g in range(GPUS) for c in telemetry.PERF
        }
        self.baseline: dict = {}

    def rows(self, when: float) -> list:
        gpu = {
            "devices": [
                {
                    "index": g,
                    "bus_id": BUSES[g],
                    "fields": {c: self.values[(g, c)] for c in telemetry.PERF},
                }
                for g in range(GPUS)
            ]
        }
        rows, self.baseline = counters.changes(self.baseline, counters.readings(gpu, None), when)
        return rows


def record(conn, node: str, job: str, phase: str, when: float, rows: list, columns: dict) -> None:
    run = {
        "node": node,
        "job_id": job,
        "phase": phase,
        "started": when,
        "duration": 0.04,
        "verdict": "ok",
        "tool_version": __version__,
        "sources": "{}",
    }
    records = {"run": run, "results": [], "events": [], "baselines": {}, "counters": rows}
    store.record_run(conn, records, columns)


def plan(fleet: Fleet, horizon: float) -> tuple:
    """(jobs, every run in time order, {node: [(start, its end)] of its compared jobs (3+
    nodes)}); a run is (time, order, node, job, phase, GPU shares (epilog), job columns)."""
    jobs = schedule(fleet.rng, fleet.names, horizon)
    runs = []
    compared: dict = {}
    for job_id, begin, end, chosen in jobs:
        shares = fleet.job_shares(chosen, begin)
        for node in chosen:
            start = begin + fleet.rng.uniform(0, 2)  # prologs do not start at once
            finish = end + fleet.rng.uniform(0, 2)
            opening = {"uid": 1000, "user": "u", "start": start, "state": "running"}
            opening["num_nodes"] = len(chosen)
            closing = {"end": finish, "state": "ended", "exit_code": 0, "signal": 0}
            runs.append((start, 0, node, job_id, "prolog", None, opening))
            if finish < horizon:
                runs.append((finish, 1, node, job_id, "epilog", shares[node], closing))
                if len(chosen) > telemetry.MIN_OTHERS:
                    compared.setdefault(node, []).append((begin, finish))
    runs.sort(key=lambda r: (r[0], r[1], r[2]))
    return jobs, runs, compared


def one_fleet(job: tuple) -> dict:
    seed, nodes, planted, onset, opts = job
    # the finder's thresholds: the module's own unless --margin / --factor say otherwise
    telemetry.MARGIN, telemetry.FACTOR = opts["margin"], opts["factor"]
    fleet = Fleet(seed, nodes, planted, onset, opts)
    horizon = START + DAYS * DAY
    state = {n: Node(fleet.rng) for n in fleet.names}
    jobs, runs, compared = plan(fleet, horizon)
    began: dict = {}
    named: dict = {}  # node -> the first midnight that named it
    held: list = []
    with tempfile.TemporaryDirectory() as folder:
        conn = store.connect(os.path.join(folder, "fleet.db"))
        conn.execute("PRAGMA synchronous = OFF")  # a throwaway store: no fsync per run
        midnight = START + DAY
        for when, _order, node, job_id, phase, shares, opened in runs:
            columns = opened
            while when >= midnight:
                held = sweep(conn, midnight, named, opts["repeat"])
                midnight += DAY
            mine = state[node]
            if phase == "prolog":
                if fleet.rng.random() < RESET:  # a reboot: the counters restart at 0
                    mine.values = dict.fromkeys(mine.values, 0)
                began[(node, job_id)] = when
            else:
                span = when - began[(node, job_id)]
                for g, (power, thermal, _below) in enumerate(shares):
                    mine.values[(g, "perf_power_ns")] += round(power * span * 1e9)
                    mine.values[(g, "perf_thermal_ns")] += round(thermal * span * 1e9)
                if opts["signal"] == "base":  # the epilog's figures (job_telemetry's shape)
                    below = {str(g): round(b * span, 1) for g, (_, _, b) in enumerate(shares)}
                    figures = {"s": round(span, 3), "j": {}, "b": below}
                    text = json.dumps(figures, sort_keys=True)
                    share = counters.below_share(figures)
                    columns = dict(columns, gpu_energy=text, below_base=share)
            record(conn, node, job_id, phase, when, mine.rows(when), columns)
        while midnight <= horizon:
            held = sweep(conn, midnight, named, opts["repeat"])
            midnight += DAY
        conn.close()
    # `held` is the last sweep's: every job of the week. The job that made each planted node
    # repeated is its REPEAT-th held-back job.
    held_times: dict = {}
    for node, t in held:
        held_times.setdefault(node, []).append(t)
    first_jobs, first_hours = {}, {}
    for node in fleet.planted:
        times = sorted(held_times.get(node, []))
        if len(times) >= opts["repeat"]:
            made = times[opts["repeat"] - 1]
            mine = compared.get(node, [])
            first_jobs[node] = sum(1 for b, t in mine if b >= fleet.onset and t <= made)
            first_hours[node] = (made - fleet.onset) / HOUR
    # the healthy nodes named: how many hold one of the fleet's top 5% GPUs by own factor
    worst = {n: max(fleet.factor[(n, g)] for g in range(GPUS)) for n in fleet.names}
    cut = sorted(worst.values(), reverse=True)[max(0, round(0.05 * nodes) - 1)]
    return {
        "planted": fleet.planted,
        "named": named,
        "nodes": nodes,
        "compared": {n: len(compared.get(n, [])) for n in fleet.planted},
        "first_jobs": first_jobs,
        "first_hours": first_hours,
        "held": len(held),
        "wrong_jobs": sum(1 for node, _t in held if node not in fleet.planted),
        "leaky": sum(1 for n in named if n not in fleet.planted and worst[n] >= cut),
        "warm": sum(1 for n in named if n not in fleet.planted and n in fleet.warm),
        "jobs": len(jobs),
        "multi": sum(1 for j in jobs if len(j[3]) > telemetry.MIN_OTHERS),
        "onset": fleet.onset,
    }


def sweep(conn, end: float, named: dict, least: int) -> list:
    """The report's and the lemon sweep's read at `end` (fleet/signals.py _ahead): the jobs held
    back in the LOOKBACK before it, then the nodes repeated. Returns the jobs held back."""
    held = queries.held_back_jobs(conn, end - telemetry.LOOKBACK, end)
    for node, _t in telemetry.repeated(held, least):
        named.setdefault(node, end)
    return held


def summarize(results: list) -> tuple:
    per = {
        x: {"planted": 0, "found": 0, "days": [0, 0, 0], "jobs": [], "hours": []} for x in EXTRAS
    }
    compared = []
    true = false = 0
    for r in results:
        for node, (extra, _gpu, _counter) in r["planted"].items():
            row = per[extra]
            row["planted"] += 1
            compared.append(r["compared"][node])
            if node in r["named"]:
                row["found"] += 1
                for k in range(3):
                    row["days"][k] += r["named"][node] <= r["onset"] + (k + 1) * DAY
            if node in r["first_jobs"]:
                row["jobs"].append(r["first_jobs"][node])
                row["hours"].append(r["first_hours"][node])
        true += len(set(r["named"]) & set(r["planted"]))
        false += len(set(r["named"]) - set(r["planted"]))
    return per, true, false, compared


def table(results: list) -> str:
    per, true, false, compared = summarize(results)
    healthy = sum(r["nodes"] - len(r["planted"]) for r in results)
    precision = true / (true + false) if true + false else math.nan
    lines = [
        "| extra held back | planted | recall (7 days) | by day 1 | by day 2 | by day 3 "
        "| median compared jobs to the flag | median hours onset -> flagging job |",
        "|" + "---|" * 8,
    ]
    for extra, row in per.items():
        n = row["planted"]
        lines.append(
            f"| +{extra:.0%} | {n} | {row['found'] / n:.2f} | {row['days'][0] / n:.2f} "
            f"| {row['days'][1] / n:.2f} | {row['days'][2] / n:.2f} "
            f"| {_median(row['jobs'])} | {_median(row['hours'], 1)} |"
        )
    held = sum(r["held"] for r in results)
    wrong = sum(r["wrong_jobs"] for r in results)
    multi = sum(r["multi"] for r in results)
    leaky = sum(r["leaky"] for r in results)
    warm = sum(r["warm"] for r in results)
    lines += [
        "",
        f"precision (nodes named) {precision:.2f} ({true} of {true + false}); healthy nodes "
        f"named {false} of {healthy}: {leaky} with one of the fleet's top 5% GPUs by own "
        f"factor, {warm} warm",
        f"jobs with a held-back finding {held} of {multi} compared (3+ nodes), {wrong} naming a "
        "healthy node",
        f"compared jobs per planted node in the week: median {statistics.median(compared):g}, "
        f"fewest {min(compared)}",
    ]
    return "\n".join(lines)


def _median(values: list, digits: int = 0) -> str:
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--planted", type=int, default=2, help="planted nodes per extra")
    parser.add_argument("--onset", type=int, default=0, help="the day the plants start")
    parser.add_argument("--uneven", type=float, default=UNEVEN, help="share of uneven jobs")
    parser.add_argument("--gpu-sd", type=float, default=GPU_SD, help="sd of a GPU's factor")
    parser.add_argument("--noise-sd", type=float, default=NOISE_SD, help="sd of job noise")
    parser.add_argument("--margin", type=float, default=telemetry.MARGIN)
    parser.add_argument("--factor", type=float, default=telemetry.FACTOR)
    parser.add_argument("--repeat", type=int, default=telemetry.REPEAT, help="jobs to name")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--signal", choices=("policy", "base"), default="policy", help="what the plants move"
    )
    args = parser.parse_args()
    started = time.time()
    opts = {
        "uneven": args.uneven,
        "gpu_sd": args.gpu_sd,
        "noise_sd": args.noise_sd,
        "margin": args.margin,
        "factor": args.factor,
        "repeat": args.repeat,
        "signal": args.signal,
    }
    jobs = [(seed, args.nodes, args.planted, args.onset, opts) for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(one_fleet, jobs))
    print(
        f"{args.seeds} seeds: {args.nodes} nodes x {GPUS} GPUs, {DAYS} days of jobs "
        f"(median {statistics.median(r['jobs'] for r in results):g} jobs a fleet, "
        f"{statistics.median(r['multi'] for r in results):g} on 3+ nodes), {args.planted} "
        f"nodes held back by each of {', '.join(f'+{x:.0%}' for x in EXTRAS)} from day "
        f"{args.onset}; uneven jobs {args.uneven:.0%}, GPU factor sd {args.gpu_sd:g}, job noise "
        f"sd {args.noise_sd:g}; margin {args.margin:g}, factor {args.factor:g}, repeat "
        f"{args.repeat}; planted: {args.signal}; sweeps at midnight\n"
    )
    print(table(results))
    print(f"\nwall time {time.time() - started:.0f} s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
