"""Validation of the slow-node finder on planted fleets of several models (docs/diagnose.md,
"Slow nodes against their peers", "Validation").

Each fleet: 96-160 nodes of two hardware classes (8 H100 with 8 NDR ports; 8 A100 with 4 HDR
ports), 14-18 days of `diag` runs written in the export format (docs/fleet.md: a run record and
one result record per probe) and merged with records.import_ndjson, as `slurmhealth import` and
`collect` do, then read back with queries.diag_figures. Per fleet, --slow nodes are planted
8-15% slow (uniform) on one figure of one unit: a GPU, an HCA port or the node's all-reduce (a
latency that much higher), from an onset drawn uniformly between day 4 and 6 days before the
end. Every --cadences minutes the finders read the --window before that moment, as a site's
timer running `slurmhealth slow --now <that moment>` would.

The fleet models (MODELS) are stories of how real figures vary, written without the finder's
rules in mind; docs/diagnose.md states each one's assumptions:
  gauss     the plain baseline: Gaussian run-to-run noise (0.5-2% sd by figure), 1%
            part-to-part spread, one diagnosis a day per node at a random hour
  bursty    one-off low readings: run-to-run noise Student-t with 3 degrees of freedom (the
            same median deviation, far heavier tails); noisy-neighbour episodes (2-30 h, the
            node's network figures 10-40% worse) and thermal episodes (1-12 h, one GPU's
            compute figures 10-30% worse) that catch whichever diagnoses fall inside them; 0.5%
            of single readings 20-40% low; half of the failed diagnoses run again 0.2-2 h later
  workload  day-scale variation: Gaussian noise; each class's level changes at random times
            (on average every 12 h: network figures 2% sd, GPU and host figures 0.7%), a
            rollout across each class over 1-3 days (all-reduce 10% and peer copies 8% slower,
            host copies 5% faster), 5% of node-days without a diagnosis, 5% of nodes away for
            3-4 days, 3% of nodes noisy but steady (3x the run-to-run noise)
  sparse    nodes with few diagnoses: as gauss, and 30% of the nodes diagnosed on about a
            third of the days
  sku       a class with a slower SKU: as gauss, and 30% of the H100 nodes a variant 4% slower
            on every GPU and host-copy figure, recorded under the same GPU model
  combined  all of bursty, workload and sku, and 15% of nodes diagnosed on a third of days

Finders on the same rows: `slow`, peers.slow at its defaults (the margin: --margin), and `old`,
the finder before the persistence rules (peers.py at OLD, read with git; left out when git or
that commit is not there), at the coarsest cadence only. Reported per model, finder and
cadence: planted, recall (flagged on the planted figure at a sweep after its onset, by the
end), that recall for the nodes diagnosed daily (not the sparse ones), hours from onset to that
first flag (median and 90th percentile of those found), healthy nodes ever flagged, and
precision: nodes flagged on their plant after its onset over all nodes ever flagged.

Run: `.venv/bin/python bench/validate_slow.py [--seeds 20] [--models all] [--slow 4]
[--cadences 60] [--window 7] [--margin 0.05]`; `--cadences 5,15,60` sweeps every 5 minutes
and reads the 15- and 60-minute cadences off the same sweeps (2 cores: about 3 minutes a
fleet). `--cost NODES` only times the finders on one window of NODES nodes diagnosed daily
(rows built in memory); `--groups DRAWS` only counts how often peers._groups splits a class
of one level (node levels Gaussian, 12 to 160 nodes), DRAWS classes of each size, and how far
a split moves a side's median; `--store DIR` only builds the largest fleet the validation draws (160
nodes, 18 days, of the last of --models) and leaves its fleet store in DIR.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from bisect import bisect_left
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from slurmhealth import __version__  # noqa: E402
from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import peers, queries, records  # noqa: E402

HOUR = 3600.0
DAY = 86400.0
START = 20_000 * DAY  # a UTC midnight (2024-10-04)
OLD = "eb21abe4fb4b4c0e03adbcd8a9203f0830ccd314"  # the last peers.py without persistence rules
SLOWDOWN = (0.08, 0.15)
SPREAD = 0.01  # sd of a unit's own factor (manufacturing), fixed for the period
T3_SCALE = 0.6745 / 0.7649  # the Gaussian's MAD over Student-t(3)'s: the same typical spread
# (GPU model, GPUs, active ports, port rate Gb/s, share of the fleet, index into the values)
CLASSES = (
    ("NVIDIA H100 80GB HBM3", 8, 8, 400.0, 0.6, 0),
    ("NVIDIA A100-SXM4-80GB", 8, 4, 200.0, 0.4, 1),
)
# (probe, figure, unit kind, run-to-run sd, (H100 value, A100 value), what moves it)
FIGURES = (
    ("nccl", "busbw_gbps", "node", 0.01, (478.0, 231.0), "net"),
    ("nccl", "avg_busbw_gbps", "node", 0.015, (181.0, 92.0), "net"),
    ("ib_write_bw", "bw_avg_gbps", "port", 0.005, (391.0, 195.0), "net"),
    ("ib_read_lat", "typical_usec", "port", 0.02, (2.55, 2.85), "net"),
    ("ib_read_lat", "avg_usec", "port", 0.02, (2.68, 2.97), "net"),
    ("cuda", "matmul_tflops", "gpu", 0.015, (702.0, 262.0), "gpu"),
    ("cuda", "memory_write_gbps", "gpu", 0.01, (2890.0, 1740.0), "gpu"),
    ("cuda", "hbm_gbps", "gpu", 0.01, (2950.0, 1800.0), "gpu"),
    ("cuda", "h2d_gbps", "gpu", 0.015, (55.0, 24.5), "host"),
    ("cuda", "p2p_gbps", "gpu", 0.02, (361.0, 232.0), "gpu"),
)
PLANTABLE = ("busbw_gbps", "bw_avg_gbps", "typical_usec", "matmul_tflops", "memory_write_gbps")
PLANTABLE += ("hbm_gbps", "h2d_gbps", "p2p_gbps")
THERMAL = ("matmul_tflops", "memory_write_gbps", "hbm_gbps")  # what a hot GPU slows
ROLLOUT = {"busbw_gbps": -0.10, "avg_busbw_gbps": -0.10, "p2p_gbps": -0.08, "h2d_gbps": 0.05}

BURSTY = {
    "tails": True,  # Student-t(3) run-to-run noise
    "neighbour": (20.0, (2.0, 30.0), (0.10, 0.40)),  # every N days a node, hours, how much worse
    "thermal": (30.0, (1.0, 12.0), (0.10, 0.30)),  # the same, of one GPU's compute figures
    "single": 0.005,  # single readings 20-40% worse
    "rerun": 0.5,  # failed diagnoses run again 0.2-2 h later
}
WORKLOAD = {
    "level": (12.0, {"net": 0.02, "gpu": 0.007, "host": 0.007}),  # mean hours between, sd
    "rollout": (1.0, 3.0),  # days it takes to reach every node of a class
    "out": 0.05,  # node-days without a diagnosis
    "away": (0.05, (3, 4)),  # nodes away, for that many days
    "noisy": (0.03, 3.0),  # nodes noisy but steady, their run-to-run sd that many times
}
SPARSE = {"sparse": (0.3, 0.35)}  # nodes, the share of days each is diagnosed
SKU = {"sku": (0.3, 0.04)}  # H100 nodes of a slower variant, how much slower its GPU figures
MODELS = {
    "gauss": {},
    "bursty": BURSTY,
    "workload": WORKLOAD,
    "sparse": SPARSE,
    "sku": SKU,
    "combined": {**BURSTY, **WORKLOAD, **SKU, "sparse": (0.15, 0.35)},
}


class Fleet:
    """One planted fleet of a model: its nodes, their units' factors, the plants, and the
    model's episodes, class levels, rollouts and absences."""

    def __init__(self, seed: int, model: str, slow: int, count: int = 0, days: int = 0) -> None:
        self.rng = rng = random.Random(f"{model}:{seed}")  # noqa: S311 - a simulation
        self.m = m = MODELS[model]
        self.days = days or rng.randint(14, 18)
        count = count or rng.randint(96, 160)
        cut = round(count * CLASSES[0][4])
        self.cls = {f"n{i:03d}": CLASSES[0 if i < cut else 1] for i in range(count)}
        nodes = sorted(self.cls)
        self.factor = {
            (node, unit): rng.gauss(1.0, SPREAD)
            for node in nodes
            for kind in ("node", "port", "gpu")
            for unit in self.units(node, kind)
        }
        self.planted: dict = {}  # node -> (figure, unit, slowdown, onset)
        for node in rng.sample(nodes, slow):
            figure = rng.choice(PLANTABLE)
            unit = rng.choice(self.units(node, next(f[2] for f in FIGURES if f[1] == figure)))
            onset = START + rng.uniform(4, self.days - 6) * DAY
            self.planted[node] = (figure, unit, rng.uniform(*SLOWDOWN), onset)
        end = START + (self.days + 1) * DAY
        self.episodes = {node: self._episodes(node, end) for node in nodes}
        self.levels = {}  # (class, what) -> [(from, factor)], change points in time order
        if "level" in m:
            every, sd = m["level"]
            for c in CLASSES:
                for area, s in sd.items():
                    t, steps = START - DAY, []
                    while t < end:
                        steps.append((t, rng.gauss(1.0, s)))
                        t += rng.expovariate(1 / (every * HOUR))
                    self.levels[(c[0], area)] = steps
        self.rolled = {}
        if "rollout" in m:
            began = {c[0]: START + rng.uniform(3, self.days - 4) * DAY for c in CLASSES}
            for node in nodes:
                span = rng.uniform(*m["rollout"]) * DAY
                self.rolled[node] = began[self.cls[node][0]] + rng.uniform(0, span)
        share, times = m.get("noisy", (0.0, 1.0))
        self.noisy = {n: times for n in nodes if rng.random() < share}
        share, attend = m.get("sparse", (0.0, 1.0))
        self.attend = {n: attend for n in nodes if rng.random() < share}
        share, self.sku_drop = m.get("sku", (0.0, 0.0))
        self.sku = {n for n in nodes if self.cls[n] is CLASSES[0] and rng.random() < share}

    def units(self, node: str, kind: str) -> list:
        _model, gpus, ports = self.cls[node][:3]
        if kind == "gpu":
            return [f"gpu{g}" for g in range(gpus)]
        if kind == "port":
            return [f"mlx5_{p}:1" for p in range(ports)]
        return ["node"]

    def _episodes(self, node: str, end: float) -> list:
        """[(from, to, "net" or a GPU, how much worse)] of the node's noisy-neighbour and
        thermal episodes: a Poisson process over the period."""
        out = []
        for name in ("neighbour", "thermal"):
            if name not in self.m:
                continue
            every, hours, drop = self.m[name]
            t = START - DAY + self.rng.expovariate(1 / (every * DAY))
            while t < end:
                what = "net" if name == "neighbour" else self.rng.choice(self.units(node, "gpu"))
                length = self.rng.uniform(*hours) * HOUR
                out.append((t, t + length, what, self.rng.uniform(*drop)))
                t += self.rng.expovariate(1 / (every * DAY))
        return out

    def diagnoses(self, node: str) -> list:
        """The times of the node's scheduled diagnoses over the period (reruns come later)."""
        rng, m = self.rng, self.m
        away_share, away_days = m.get("away", (0.0, (0, 0)))
        away = rng.uniform(2, self.days - 4) if rng.random() < away_share else -99
        back = away + rng.choice(away_days) if away_days[0] else away
        out = []
        for day in range(self.days):
            if rng.random() >= self.attend.get(node, 1.0) or rng.random() < m.get("out", 0.0):
                continue
            if not away <= day < back:
                out.append(START + (day + rng.uniform(0, 0.999)) * DAY)
        return out

    def noise(self, node: str, sd: float) -> float:
        """A run's factor: Gaussian, or Student-t(3) scaled to the same median deviation;
        never below half (a measurement is no negative rate)."""
        sd *= self.noisy.get(node, 1.0)
        if not self.m.get("tails"):
            return self.rng.gauss(1.0, sd)
        chi = math.sqrt(sum(self.rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
        return max(0.5, 1.0 + T3_SCALE * sd * self.rng.gauss(0, 1) / chi)

    def level(self, model: str, area: str, when: float) -> float:
        steps = self.levels.get((model, area))
        if not steps:
            return 1.0
        return steps[bisect_left(steps, (when, math.inf)) - 1][1]

    def reading(self, node: str, figure: tuple, unit: str, when: float) -> float:
        _probe, name, _kind, sd, truth, area = figure
        model, index = self.cls[node][0], self.cls[node][5]
        better = self.factor[(node, unit)] * self.noise(node, sd) * self.level(model, area, when)
        if node in self.sku and area != "net":
            better *= 1 - self.sku_drop
        if when >= self.rolled.get(node, math.inf) and name in ROLLOUT:
            better *= 1 + ROLLOUT[name]
        plant = self.planted.get(node)
        if plant and plant[:2] == (name, unit) and when >= plant[3]:
            better *= 1 - plant[2]
        for began, ended, what, drop in self.episodes[node]:
            hit = area == "net" if what == "net" else what == unit and name in THERMAL
            if hit and began <= when < ended:
                better *= 1 - drop
        if self.rng.random() < self.m.get("single", 0.0):
            better *= 1 - self.rng.uniform(0.2, 0.4)
        value = truth[index] / better if name.endswith("_usec") else truth[index] * better
        return round(value, 3)


def export_lines(fleet: Fleet, node: str, when: float, run_id: str) -> tuple:
    """(export records of one diagnosis: its run and one result per probe, failed or not).
    The probes' own floors fail an outcome: RDMA bandwidth under 90% of the port's rate, an
    all-reduce under 85% of the class's typical one."""
    model, gpus, _ports, rate, _share, index = fleet.cls[node]
    outcomes: dict = {}
    for figure in FIGURES:
        probe, name, kind = figure[:3]
        for unit in fleet.units(node, kind):
            mine = outcomes.setdefault(probe, {}).setdefault(
                unit, {"unit": unit, "status": "pass", "figures": {}, "evidence": ""}
            )
            value = mine["figures"][name] = fleet.reading(node, figure, unit, when)
            floor = {"bw_avg_gbps": 0.9 * rate, "busbw_gbps": 0.85 * figure[4][index]}
            if value < floor.get(name, 0.0):
                mine["status"] = "fail"
    diag = {"level": "long", "seconds": 1500.0, "gpu_model": model, "gpus": gpus}
    failed = any(o["status"] == "fail" for found in outcomes.values() for o in found.values())
    run = {"type": "run", "id": run_id, "node": node, "job_id": None, "phase": "diag"}
    run.update(started=when, duration=1500.0, verdict="fail" if failed else "ok")
    run.update(tool_version=__version__, sources=json.dumps({"diag": diag}))
    lines = [run]
    for probe, found in outcomes.items():
        bad = any(o["status"] == "fail" for o in found.values())
        data = json.dumps({"level": "long", "outcomes": list(found.values())})
        lines.append(
            {
                "type": "result",
                "run_id": run_id,
                "check_name": f"diag.{probe}",
                "status": "fail" if bad else "ok",
                "message": "",
                "action": "none",
                "data": data,
                "duration": 60.0,
            }
        )
    return lines, failed


def fleet_rows(fleet: Fleet, keep: str = "") -> list:
    """Every figure row of the fleet's period as queries.diag_figures reads them after
    `slurmhealth import` of its diagnoses; keep: a folder to leave the fleet store in."""
    with tempfile.TemporaryDirectory() as temporary:
        folder = keep or temporary
        path = os.path.join(folder, "export.ndjson")
        with open(path, "w", encoding="utf-8") as out:
            header = {"type": "header", "format": records.FORMAT, "schema": store.SCHEMA_VERSION}
            out.write(json.dumps({**header, "tool_version": __version__, "exported": 0}) + "\n")
            for node in sorted(fleet.cls):
                times = fleet.diagnoses(node)
                while times:
                    when = times.pop(0)
                    lines, failed = export_lines(fleet, node, when, f"{node}-{int(when * 10)}")
                    out.writelines(json.dumps(line) + "\n" for line in lines)
                    if failed and fleet.rng.random() < fleet.m.get("rerun", 0.0):
                        times.insert(0, when + fleet.rng.uniform(0.2, 2.0) * HOUR)
        conn = store.connect(os.path.join(folder, "fleet.db"))
        report = records.import_ndjson(conn, path)
        assert report["bad_count"] == 0, report["bad"]
        rows = queries.diag_figures(conn, START, START + (fleet.days + 1) * DAY)
        conn.close()
    return rows


def old_finder():
    """peers.slow as it was at OLD (read with git), or None when git or that commit is not at
    hand."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        text = subprocess.run(
            [git, "-C", ROOT, "show", f"{OLD}:slurmhealth/fleet/peers.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "old_peers.py")
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        spec = importlib.util.spec_from_file_location("old_peers", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.slow


def finders() -> dict:
    out = {"slow": peers.slow}
    old = old_finder()
    if old is not None:
        out["old"] = old
    return out


def one_fleet(job: tuple) -> dict:
    """Every sweep of every finder over one fleet: {planted, flagged: {(finder, cadence):
    {(node, figure): [sweep times]}}, nodes, sparse}. The sweeps of the finest cadence are
    run, and each coarser one is those of its moments (cadences that divide each other);
    `old` only at the coarsest. A sweep whose window holds the same rows as the one before
    is not run again: it would find the same."""
    model, seed, slow, cadences, window, margin = job
    fleet = Fleet(seed, model, slow)
    rows = fleet_rows(fleet)
    times = [r[1] for r in rows]
    step, found = min(cadences), finders()
    flagged: dict = {}
    last: dict = {}
    k, end = 1, START + fleet.days * DAY
    while START + k * step * 60 <= end:
        moment = START + k * step * 60
        span = (bisect_left(times, moment - window * DAY), bisect_left(times, moment))
        for name, finder in found.items():
            due = [c for c in cadences if k * step % c == 0]
            due = due if name == "slow" else [c for c in due if c == max(cadences)]
            if due and last.get(name, ((),))[0] != span:
                flags = finder(rows[span[0] : span[1]], margin=margin)
                last[name] = (span, [(f["node"], f["figure"]) for f in flags])
            for cadence in due:
                mine = flagged.setdefault((name, cadence), {})
                for key in last[name][1]:
                    mine.setdefault(key, []).append(moment)
        k += 1
    sparse = set(fleet.planted) & set(fleet.attend)
    return {"planted": fleet.planted, "flagged": flagged, "nodes": len(fleet.cls), "sparse": sparse}


def summarize(results: list, finder: tuple) -> dict:
    """{planted, found, daily, daily_found, hours: [onset -> first flag], true, false,
    healthy, healthy_flagged, precision} over a model's fleets."""
    out = {"planted": 0, "found": 0, "daily": 0, "daily_found": 0, "hours": []}
    out.update(true=0, false=0, healthy=0, healthy_flagged=0)
    for r in results:
        flags = r["flagged"].get(finder, {})
        out["healthy"] += r["nodes"] - len(r["planted"])
        for node, (figure, _unit, _slowdown, onset) in r["planted"].items():
            out["planted"] += 1
            out["daily"] += node not in r["sparse"]
            after = [t for t in flags.get((node, figure), []) if t >= onset]
            if after:
                out["found"] += 1
                out["daily_found"] += node not in r["sparse"]
                out["hours"].append((after[0] - onset) / HOUR)
        for node in {node for node, _figure in flags}:
            plant = r["planted"].get(node)
            right = plant and any(t >= plant[3] for t in flags.get((node, plant[0]), []))
            out["true" if right else "false"] += 1
            out["healthy_flagged"] += plant is None
    flagged = out["true"] + out["false"]
    out["precision"] = out["true"] / flagged if flagged else math.nan
    return out


def table(by_model: dict, finders_run: list) -> str:
    """One line per fleet model, finder and cadence (minutes between sweeps)."""
    lines = [
        "| fleet model | finder | cadence, min | planted | recall | recall, daily nodes "
        "| onset -> flag, h: median | 90th pct | healthy nodes flagged | precision (nodes) |",
        "|" + "---|" * 10,
    ]
    for model, results in by_model.items():
        for name, cadence in finders_run:
            s = summarize(results, (name, cadence))
            hours = sorted(s["hours"])
            p90 = hours[min(len(hours) - 1, int(0.9 * len(hours)))] if hours else math.nan
            daily = s["daily_found"] / s["daily"] if s["daily"] else math.nan
            lines.append(
                f"| {model} | {name} | {cadence:g} | {s['planted']} "
                f"| {s['found'] / s['planted']:.2f} "
                f"| {_f(daily, 2)} | {_f(statistics.median(hours) if hours else math.nan)} "
                f"| {_f(p90)} | {s['healthy_flagged']} of {s['healthy']} "
                f"| {_f(s['precision'], 3)} |"
            )
    return "\n".join(lines)


def _f(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def cost(nodes: int, days: float) -> str:
    """The finders' CPU time on one window of a large `gauss` fleet, each node diagnosed once
    a day, the rows built in memory as queries.diag_figures gives them."""
    fleet = Fleet(0, "gauss", 0, nodes)
    rows = []
    for day in range(int(days)):
        for node in sorted(fleet.cls):
            when = START + (day + fleet.rng.random()) * DAY
            model = f"{fleet.cls[node][1]}x {fleet.cls[node][0]}"
            for figure in FIGURES:
                for unit in fleet.units(node, figure[2]):
                    value = fleet.reading(node, figure, unit, when)
                    rows.append((node, when, model, figure[0], unit, figure[1], value))
    rows.sort(key=lambda r: r[1])
    lines = [f"{nodes:,} nodes, {days:g} days of daily diagnoses: {len(rows):,} rows"]
    for name, finder in finders().items():
        began = time.process_time()
        found = finder(rows)
        took = time.process_time() - began
        lines.append(f"  {name}: {took:.2f} s CPU, {len(found)} findings")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return "\n".join([*lines, f"  peak RSS {peak:.0f} MiB (the rows included)"])


def false_groups(draws: int) -> str:
    """How often peers._groups splits a class whose node levels are one Gaussian (sd 5 about
    100: the gap's 1% floor a fifth of an sd, hardly a help), and by how many sds the larger
    side's median then moves from the class's."""
    rng = random.Random(0)  # noqa: S311 - a simulation
    lines = ["nodes | classes split | median shift of a split, sd: median, max"]
    for nodes in (12, 16, 24, 40, 100, 160):
        shifts = []
        for _ in range(draws):
            levels = {f"n{i}": rng.gauss(100.0, 5.0) for i in range(nodes)}
            groups = peers._groups(levels, peers.MIN_PEERS)
            if len(groups) > 1:
                centre = statistics.median(levels.values())
                side = max(groups, key=len)
                shifts.append(abs(statistics.median(levels[n] for n in side) - centre) / 5.0)
        shifts.sort()
        middle = f"{shifts[len(shifts) // 2]:.2f}, {shifts[-1]:.2f}" if shifts else "-"
        lines.append(f"{nodes} | {len(shifts)} of {draws} | {middle}")
    return "\n".join(lines)


def largest_store(path: str, model: str) -> str:
    """Build the largest fleet the validation draws (160 nodes, 18 days) of `model` and leave
    its fleet store in the folder `path`: the store to time `slurmhealth slow` on."""
    fleet = Fleet(0, model, 4, count=160, days=18)
    os.makedirs(path, mode=0o700, exist_ok=True)
    rows = fleet_rows(fleet, keep=path)
    db = os.path.join(path, "fleet.db")
    end = START + fleet.days * DAY
    return f"{len(fleet.cls)} nodes, {len(rows):,} figure rows: {db}; its last day: --now {end:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="fleets per model")
    parser.add_argument("--models", default="all", help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--slow", type=int, default=4, help="planted nodes per fleet")
    parser.add_argument("--cadences", default="60", help="minutes between sweeps, e.g. 5,15,60")
    parser.add_argument("--window", type=float, default=peers.WINDOW / DAY, help="days read")
    parser.add_argument("--margin", type=float, default=peers.MARGIN)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cost", type=int, default=0, help="only time the finders: NODES")
    parser.add_argument("--store", default="", help="only build the largest fleet's store here")
    parser.add_argument("--groups", type=int, default=0, help="only count false splits: DRAWS")
    args = parser.parse_args()
    if args.cost:
        print(cost(args.cost, args.window))
        return 0
    if args.groups:
        print(false_groups(args.groups))
        return 0
    names = list(MODELS) if args.models == "all" else args.models.split(",")
    if args.store:
        print(largest_store(args.store, names[-1]))
        return 0
    cadences = sorted(float(c) for c in args.cadences.split(","))
    if any(c % cadences[0] for c in cadences):
        parser.error("each cadence must be a multiple of the finest")
    started = time.time()
    jobs = [
        (m, seed, args.slow, cadences, args.window, args.margin)
        for m in names
        for seed in range(args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(one_fleet, jobs))
    by_model = {m: [r for j, r in zip(jobs, results) if j[0] == m] for m in names}
    print(
        f"{args.seeds} fleets per model, {args.slow} nodes each {SLOWDOWN[0]:.0%}-"
        f"{SLOWDOWN[1]:.0%} slow; sweeps every {args.cadences} min over {args.window:g} "
        f"days, margin {args.margin:.0%}\n"
    )
    run = [("slow", c) for c in cadences] + [("old", cadences[-1])] * ("old" in finders())
    print(table(by_model, run))
    print(f"\nwall time {time.time() - started:.0f} s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
