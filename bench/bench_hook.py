"""Benchmark: the prolog as slurmd runs it, on a replayed 8-GPU / 8-IB-port node.

The GPUs, InfiniBand ports and kernel log are replayed; the host areas (mounts, memory, CPUs,
processes, modules, links, EDAC) are read live from this host, as a node's prolog reads them.

1. 50 sequential prologs (each a fresh process, store and config as on a node) vs
   `python -c pass` of the same interpreter: p50, p99, ratio (goal <= 4x).
2. 64 prologs started at once on one node: all recorded? Batch wall time vs the CPU it needs,
   64 x (one prolog's CPU time) / cores (goal <= 1.5x: nobody waits on locks beyond CPU).
3. The cost of node_exporter metrics (settings.metrics_file): prologs with and without,
   alternated on two nodes' worth of store and config: p50 of each and the difference.

Run: `make bench` or `.venv-bench/bin/python bench/bench_hook.py [--runs 50]`. Prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

from common import pct, timed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(REPO, "tests", "fixtures", "snapshots", "h100-hgx-healthy.json")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def node_env(tmp: str, job: str) -> dict:
    return {
        "SLURMD_NODENAME": "gpu01",
        "SLURMHEALTH_CONFIG": os.path.join(tmp, "slurmhealth.toml"),
        "SLURMHEALTH_STATE_DIR": os.path.join(tmp, "state"),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
    }


def write_config(tmp: str, snapshot: str, metrics_file: str = "", host_root: str = "") -> None:
    """The node's config: GPUs, InfiniBand and kernel log replayed from `snapshot`; the host
    areas read live where `host_root` names the host ("/." reads / as a live node's hook does:
    "/" itself would replay the snapshot's host sections, as any default path beside one)."""
    settings = {"gpu_source": snapshot, "slurm_bin": "/nonexistent", "metrics_file": metrics_file}
    if host_root:
        settings["host_root"] = host_root
    with open(os.path.join(tmp, "slurmhealth.toml"), "w") as handle:
        handle.write(
            "[settings]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
        )


def sequential(prolog: list, python: str, tmp: str, runs: int) -> None:
    base, walls, cpus = [], [], []
    timed(prolog, node_env(tmp, "0"))  # the node's first prolog creates the store
    for n in range(runs):
        base.append(timed([python, "-c", "pass"], {}))
        before = children_cpu()
        walls.append(timed(prolog, node_env(tmp, str(n + 1))))
        cpus.append((children_cpu() - before) * 1000)
    p50 = statistics.median(walls)
    print(
        f"sequential prologs ({runs}): p50 {p50:.1f} ms, p99 {pct(walls, 0.99):.1f} ms; "
        f"python -c pass p50 {statistics.median(base):.1f} ms; "
        f"ratio {p50 / statistics.median(base):.2f}x (goal <= 4x); "
        f"CPU per prolog {statistics.median(cpus):.1f} ms"
    )
    return statistics.mean(cpus)


def concurrent(prolog: list, tmp: str, cpu_ms: float, count: int) -> None:
    db = os.path.join(tmp, "state", "gpu01.db")
    first = sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone()[0]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            prolog,
            env=node_env(tmp, f"c{n}"),
            cwd=os.sep,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(count)
    ]
    errors = [p.communicate()[1] for p in procs]
    wall = (time.perf_counter() - started) * 1000
    recorded = sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone()[0] - first
    locked = sum("locked" in e for e in errors)
    ideal = count * cpu_ms / (os.cpu_count() or 1)
    print(
        f"{count} prologs at once: {recorded}/{count} recorded, {locked} 'locked' errors, "
        f"exit codes {sorted({p.returncode for p in procs})}; batch {wall:.0f} ms vs "
        f"{count} x {cpu_ms:.1f} ms CPU / {os.cpu_count()} cores = {ideal:.0f} ms: "
        f"{wall / ideal:.2f}x (goal <= 1.5x)"
    )


def metrics_cost(prolog: list, snapshot: str, runs: int) -> None:
    """Prologs without and with metrics, alternated so both see the same machine load."""
    walls: dict = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as off, tempfile.TemporaryDirectory() as on:
        write_config(off, snapshot)
        write_config(on, snapshot, os.path.join(on, "slurmhealth.prom"))
        for tmp in (off, on):
            timed(prolog, node_env(tmp, "0"))  # store created, config cached
        for n in range(runs):
            walls["off"].append(timed(prolog, node_env(off, str(n + 1))))
            walls["on"].append(timed(prolog, node_env(on, str(n + 1))))
        size = os.path.getsize(os.path.join(on, "slurmhealth.prom"))
    p50 = {k: statistics.median(v) for k, v in walls.items()}
    print(
        f"metrics on vs off ({runs} each, alternated): p50 {p50['on']:.1f} vs {p50['off']:.1f} ms "
        f"(+{p50['on'] - p50['off']:.1f} ms); p99 {pct(walls['on'], 0.99):.1f} vs "
        f"{pct(walls['off'], 0.99):.1f} ms; file {size} bytes"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--snapshot", default=SNAPSHOT)
    parser.add_argument(
        "--host-root",
        default="/.",
        help='the host areas read live under this root, as on a node ("/." is this host); '
        '"" replays them from the snapshot (an install older than the host areas)',
    )
    opts = parser.parse_args()
    python = sys.executable
    script = os.path.join(os.path.dirname(python), "slurmhealth")
    prolog = (
        [script, "prolog"] if os.path.exists(script) else [python, "-m", "slurmhealth", "prolog"]
    )
    print(f"interpreter: {python} (Python {sys.version.split()[0]}), {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        write_config(tmp, opts.snapshot, host_root=opts.host_root)
        cpu_ms = sequential(prolog, python, tmp, opts.runs)
        concurrent(prolog, tmp, cpu_ms, opts.concurrent)
    metrics_cost(prolog, opts.snapshot, opts.runs)


if __name__ == "__main__":
    main()
