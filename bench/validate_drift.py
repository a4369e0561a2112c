"""Validation of the odd node out (configuration drift) on planted fleets (docs/report.md,
"Configuration drift: the odd node out").

For each seed: a fleet store of N nodes (default 512) in two hardware classes (60% H100 with 8
ConnectX-7 HCAs at 400 Gb/s, 40% A100 with 4 ConnectX-6 at 200 Gb/s) and a small third class
(H200) of 3, 4, 5, 6, 8 or 12 nodes (SMALL, by seed). Every node runs the fleet's driver, CUDA
and kernel, its class's VBIOS, HCA firmware and application clocks, persistence and ECC on, MIG
off. Over the 3 days before the report, each node records its versions every 6 hours
(runner.VERSIONS_EVERY, from a random phase) and on any change (the next 5-minute health
check), each record a `check` run
whose sources carry the `versions` that checks/gpu.py, checks/ib.py and checks/xid.py's
versions_of give (application clocks included: the health check reads them, and the runner
carries them into the job hooks' records), written through store.record_run.

Planted, per fleet: --planted nodes of the two large classes per drift (DRIFTS): an old driver
(with its older CUDA), one GPU with an old VBIOS, one HCA with old firmware, an old kernel, one
GPU with lower application clocks; and one node of the small class with one of them. Each
drift starts at a random time in the day before the report.
Not to be flagged: a rolling update in each large class, at the same stage in both (STAGES, by
seed: 30%, 60%, and 5%, 15%, 90% to show the edges): the H100 class moving to a new driver (and
CUDA), the A100 class to a new kernel, each updated node at a random time in the 2 days before.
Noise: the newest versions record of --gpuless (1%) of the other nodes has no GPU facts (the
GPU source failed on that run, as on a node whose NVML hangs: its IB firmware and kernel are
recorded, not its GPU model).

The report at the end (a UTC midnight) is built as `slurmhealth report --since 1d` builds it
(report.build.build) and its `drift` section read: a node is flagged when it is in an item's
`differ`. Drift shows in the first report after it (versions are recorded on change), so
recall is recall within a day.

Reported, pooled over seeds: recall per drift and of the small class by its size; per stage,
the rollout's nodes flagged and the precision of the nodes flagged (planted, flagged on their
drift / all flagged); nodes flagged in the unknown-GPU class.

Run: `.venv/bin/python bench/validate_drift.py [--seeds 100] [--nodes 512] [--planted 2]
[--gpuless 0.01]`
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurmhealth import __version__  # noqa: E402
from slurmhealth.core import store  # noqa: E402
from slurmhealth.node.runner import VERSIONS_EVERY  # noqa: E402
from slurmhealth.report import build  # noqa: E402

DAY = 86400.0
NOW = 20_003 * 86400.0  # the report's time: a UTC midnight (2024-10-07)
DAYS = 3  # of records before it
STEP = 300.0  # the health check's cadence: a change is recorded within it
GPUS = 8
DRIVER, CUDA, KERNEL = "550.90.07", "12.4", "5.15.0-113-generic"
CLASSES = {
    "H100": {
        "model": "NVIDIA H100 80GB HBM3",
        "vbios": ("96.00.99.00.01", "96.00.74.00.0D"),  # (the class's, an old one)
        "fw": ("28.39.1002", "28.36.1010"),
        "clocks": ("1980/2619 MHz", "1755/2619 MHz"),  # application clocks, SM/memory
        "hcas": 8,
        "rate": 400.0,
    },
    "A100": {
        "model": "NVIDIA A100-SXM4-80GB",
        "vbios": ("92.00.45.00.06", "92.00.36.00.02"),
        "fw": ("20.39.1002", "20.36.1010"),
        "clocks": ("1410/1593 MHz", "1275/1593 MHz"),
        "hcas": 4,
        "rate": 200.0,
    },
    "H200": {
        "model": "NVIDIA H200",
        "vbios": ("96.00.A5.00.01", "96.00.99.00.03"),
        "fw": ("28.39.1002", "28.36.1010"),
        "clocks": ("1980/3201 MHz", "1755/3201 MHz"),
        "hcas": 8,
        "rate": 400.0,
    },
}
SHARE = 0.6  # of the large classes, H100
SMALL = (3, 4, 5, 6, 8, 12)  # the small class's size, by seed
DRIFTS = ("driver", "vbios", "ib_fw", "kernel", "app_clocks")
OLD = {"driver": ("535.161.08", "12.2"), "kernel": "5.15.0-105-generic"}
# What the report calls each drift's items (fleet/drift.py ITEMS)
WHAT = {
    "driver": {"driver", "CUDA (driver)"},
    "vbios": {"VBIOS"},
    "ib_fw": {"IB firmware"},
    "kernel": {"kernel"},
    "app_clocks": {"application clocks"},
}
# The rollouts: class -> (what changes, the new values), and the items the report names for it
ROLLOUT = {
    "H100": ("driver", {"driver": "560.35.03", "cuda": "12.6"}),
    "A100": ("kernel", {"kernel": "5.15.0-122-generic"}),
}
STAGES = (0.3, 0.6, 0.05, 0.15, 0.9)  # share of the class updated at the report, by seed


class Fleet:
    """Each node's class, and what changes on it when: plants, rollouts, GPU-less records."""

    def __init__(self, seed: int, nodes: int, planted: int, gpuless: float) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - a simulation, not a secret
        small = SMALL[seed % len(SMALL)]
        cut = round((nodes - small) * SHARE)
        self.cls = {
            f"gpu{i:04d}": "H100" if i < cut else "A100" if i < nodes - small else "H200"
            for i in range(nodes)
        }
        self.small = small
        self.stage = STAGES[seed % len(STAGES)]
        large = [n for n, c in self.cls.items() if c != "H200"]
        chosen = self.rng.sample(large, planted * len(DRIFTS))
        # node -> (drift, its time)
        self.planted = {
            n: (DRIFTS[k % len(DRIFTS)], NOW - self.rng.uniform(STEP, DAY))
            for k, n in enumerate(chosen)
        }
        odd = self.rng.choice([n for n, c in self.cls.items() if c == "H200"])
        self.planted[odd] = (self.rng.choice(DRIFTS), NOW - self.rng.uniform(STEP, DAY))
        self.updated: dict = {}  # node -> time of its rollout update
        for name in ROLLOUT:
            members = [n for n, c in self.cls.items() if c == name]
            for n in self.rng.sample(members, round(self.stage * len(members))):
                self.updated[n] = NOW - self.rng.uniform(STEP, 2 * DAY)
        # (the plants' records are whole: one without GPU facts hides a GPU drift, plainly)
        others = sorted(set(self.cls) - set(self.planted))
        self.gpuless = set(self.rng.sample(others, round(gpuless * nodes)))

    def versions(self, node: str, when: float) -> dict:
        """{source: versions} as the runner records them on the node at `when`."""
        spec = CLASSES[self.cls[node]]
        driver, cuda, kernel = DRIVER, CUDA, KERNEL
        vbios, fw = [spec["vbios"][0]] * GPUS, [spec["fw"][0]] * spec["hcas"]
        clocks = [spec["clocks"][0]] * GPUS
        if node in self.updated and when >= self.updated[node]:
            new = ROLLOUT[self.cls[node]][1]
            driver, cuda = new.get("driver", driver), new.get("cuda", cuda)
            kernel = new.get("kernel", kernel)
        drift, onset = self.planted.get(node, (None, 0.0))
        if drift and when >= onset:
            if drift == "driver":
                driver, cuda = OLD["driver"]
            elif drift == "kernel":
                kernel = OLD["kernel"]
            elif drift == "vbios":
                vbios[0] = spec["vbios"][1]  # one GPU
            elif drift == "app_clocks":
                clocks[0] = spec["clocks"][1]  # one GPU's, set lower (nvidia-smi -ac)
            else:
                fw[-1] = spec["fw"][1]
        gpu = {
            "driver": driver,
            "cuda": cuda,
            "vbios": sorted(set(vbios)),
            "model": [spec["model"]],
            "persistence": [1],
            "ecc": [1],
            "mig": [0],
            "app_clocks": sorted(set(clocks)),
        }
        ib = {"fw_ver": {f"mlx5_{h}": v for h, v in enumerate(fw)}, "rate": [spec["rate"]]}
        return {"gpu": gpu, "ib": ib, "kmsg": {"kernel": kernel}}


def sources(found: dict, gpu_failed: bool) -> str:
    """A run's sources JSON as runner.Gathered.to_dict writes it (docs/report.md)."""
    out = {}
    for name, seconds in (("gpu", 0.012), ("ib", 0.002), ("kmsg", 0.001)):
        out[name] = {"status": "ok", "message": "", "seconds": seconds}
        if name == "gpu" and gpu_failed:
            out[name].update(status="error", message="NVML: timed out")
        else:
            out[name]["versions"] = found[name]
    return json.dumps(out)


def record(conn, node: str, when: float, text: str) -> None:
    run = {
        "node": node,
        "job_id": None,
        "phase": "check",
        "started": when,
        "duration": 0.05,
        "verdict": "ok",
        "tool_version": __version__,
        "sources": text,
    }
    store.record_run(conn, {"run": run, "results": [], "events": [], "baselines": {}})


def one_fleet(job: tuple) -> dict:
    seed, nodes, planted, gpuless = job
    fleet = Fleet(seed, nodes, planted, gpuless)
    with tempfile.TemporaryDirectory() as folder:
        conn = store.connect(os.path.join(folder, "fleet.db"))
        conn.execute("PRAGMA synchronous = OFF")  # a throwaway store: no fsync per run
        for node in sorted(fleet.cls):
            # every VERSIONS_EVERY from a random phase, and at the check after each change
            times = []
            t = NOW - DAYS * DAY + fleet.rng.uniform(0, VERSIONS_EVERY)
            while t < NOW:
                times.append(t)
                t += VERSIONS_EVERY
            changes = [fleet.updated.get(node), fleet.planted.get(node, (None, None))[1]]
            times += [c + fleet.rng.uniform(0, STEP) for c in changes if c is not None]
            times = sorted(t for t in times if t < NOW)
            for t in times:
                failed = node in fleet.gpuless and t == times[-1]
                record(conn, node, t, sources(fleet.versions(node, t), failed))
        doc = build.build(conn, NOW, DAY)
        conn.close()
    flagged: dict = {}  # node -> {(class, what)}
    cut = 0  # items whose list drift.LIST_MAX cut: the nodes left out are not counted
    for item in doc["drift"]["items"]:
        cut += item["differ_count"] > len(item["differ"])
        for d in item["differ"]:
            flagged.setdefault(d["node"], set()).add((item["class"], item["what"]))
    return {
        "seed": seed,
        "stage": fleet.stage,
        "small": fleet.small,
        "cls": fleet.cls,
        "planted": {n: d for n, (d, _t) in fleet.planted.items()},
        "updated": set(fleet.updated),
        "gpuless": fleet.gpuless,
        "flagged": flagged,
        "unknown": doc["drift"]["unknown"],
        "cut": cut,
    }


def judge(r: dict) -> dict:
    """One fleet's flags: planted nodes found, and why each other node was flagged."""
    out = {"found": {}, "true": 0, "rollout": 0, "unknown_class": 0, "other": 0, "false": []}
    for node, drift in r["planted"].items():
        got = {what for _cls, what in r["flagged"].get(node, ())}
        out["found"][node] = bool(got & WHAT[drift])
    for node, items in r["flagged"].items():
        if out["found"].get(node):
            out["true"] += 1
            continue
        classes = {c for c, _what in items}
        whats = {w for _c, w in items}
        rollout = ROLLOUT.get(r["cls"][node])
        if classes == {"unknown GPUs"}:
            out["unknown_class"] += 1
        elif rollout and whats <= WHAT[rollout[0]]:
            out["rollout"] += 1  # updated early (stage < 20%) or not yet (stage > 80%)
        else:
            out["other"] += 1
        out["false"].append((node, sorted(items)))
    return out


def report(results: list) -> str:
    judged = [(r, judge(r)) for r in results]
    lines = ["| drift | planted (large classes) | recall within a day |", "|---|---|---|"]
    for drift in DRIFTS:
        hits = [
            j["found"][n]
            for r, j in judged
            for n, d in r["planted"].items()
            if d == drift and r["cls"][n] != "H200"
        ]
        lines.append(f"| {drift} | {len(hits)} | {sum(hits) / len(hits):.2f} |")
    lines += ["", "| small class size | planted | recall |", "|---|---|---|"]
    for size in SMALL:
        hits = [
            j["found"][n]
            for r, j in judged
            if r["small"] == size
            for n in r["planted"]
            if r["cls"][n] == "H200"
        ]
        if hits:
            lines.append(f"| {size} | {len(hits)} | {sum(hits) / len(hits):.2f} |")
    lines += [
        "",
        "| rollout stage | fleets | nodes flagged | planted, flagged on their drift | rollout "
        "nodes flagged | unknown-GPU class flagged | other flagged | precision |",
        "|" + "---|" * 8,
    ]
    for stage in STAGES:
        rows = [j for r, j in judged if r["stage"] == stage]
        if not rows:
            continue
        true = sum(j["true"] for j in rows)
        roll = sum(j["rollout"] for j in rows)
        unknown = sum(j["unknown_class"] for j in rows)
        other = sum(j["other"] for j in rows)
        flagged = true + roll + unknown + other
        precision = f"{true / flagged:.2f}" if flagged else "-"
        lines.append(
            f"| {stage:.0%} | {len(rows)} | {flagged} | {true} | {roll} | {unknown} | {other} "
            f"| {precision} |"
        )
    cut = sum(r["cut"] for r in results)
    if cut:
        lines += ["", f"items whose node list drift.LIST_MAX cut: {cut}"]
    others = [(r["seed"], f) for r, j in judged for f in j["false"] if j["other"]]
    if others:
        lines += ["", "other flags (seed, node, items):"]
        lines += [f"  {seed} {node} {items}" for seed, (node, items) in others[:10]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--planted", type=int, default=2, help="planted nodes per drift")
    parser.add_argument("--gpuless", type=float, default=0.01, help="share of GPU-less records")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    started = time.time()
    jobs = [(seed, args.nodes, args.planted, args.gpuless) for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(one_fleet, jobs))
    print(
        f"{args.seeds} seeds: {args.nodes} nodes (H100 and A100, {SHARE:.0%}/{1 - SHARE:.0%}, "
        f"and an H200 class of {', '.join(map(str, SMALL))} by seed); {args.planted} nodes per "
        f"drift ({', '.join(DRIFTS)}) and one in the H200 class; rollouts (H100 driver, A100 "
        f"kernel) at {', '.join(f'{s:.0%}' for s in STAGES)} by seed; {args.gpuless:.0%} "
        "GPU-less newest records; one report at the end\n"
    )
    print(report(results))
    print(f"\nwall time {time.time() - started:.0f} s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
