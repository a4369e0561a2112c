"""Benchmark: the kernel source's gather, parse and checks per run (ps, modules, net, edac).

Times, in one process, what a run adds for the host areas on the live /proc and /sys: the
gather as the job hooks do it (`Options(costly=False)`: PID 1's children, EDAC totals) and as
the health check does it (every process, DIMM counts), then each area's parse and checks with
the expectations a GPU node's genconf would write. The job hook's read is timed three ways: with
no process names to find, with names all among PID 1's children (the usual path: the read stays
PID 1's children) and with a name that is not (a daemon under a supervisor: every process
read). With `--processes N` it first starts N sleeping processes (children of this script,
ended by their ids at the end), so the full read is timed on a node running that many
processes; they are not PID 1's children, as a job's processes are not.

Run: `PYTHONPATH=. .venv/bin/python bench/bench_kernel.py [--processes 2000] [--runs 300]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time

from slurmhealth.node.checks import AREAS
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import Options, kernel

HOST_AREAS = ("ps", "modules", "net", "edac")
EXPECT = {
    "ps": {"daemons": ["munged", "nvidia-persistenced", "nv-fabricmanager"], "absent": ["nslcd"]},
    "modules": {"loaded": ["nvidia", "nvidia_uvm", "mlx5_ib"], "absent": ["nouveau"]},
    "net": {"up": ["eth0"], "mtu": {"eth0": 1500}, "flaps_warn": 0.0, "flaps_fail": 0.5},
    "edac": {"expected": False, "ue_fail": 1, "ce_warn_per_day": 10.0},
}


def judge(raw: object) -> None:
    for area in HOST_AREAS:
        module = AREAS[area]
        facts = module.parse(raw)
        ctx = Context(expect=EXPECT[area], baseline=module.baseline(facts, 0.0), now=300.0)
        for check in module.CHECKS:
            check(facts, ctx)


def p50(costly: bool, runs: int, names: list[str] | None = None) -> tuple:
    """(p50 ms of gather, of gather + parse + checks, processes read); `names`: the process
    names the ps checks look for (Options.processes)."""
    gathers, totals, seen = [], [], 0
    for _ in range(runs):
        start = time.perf_counter()
        options = Options(costly=costly)
        options.processes = names
        raw = kernel.gather(options)
        gathered = time.perf_counter()
        judge(raw)
        gathers.append(gathered - start)
        totals.append(time.perf_counter() - start)
        seen = sum(raw["processes"]["names"].values())
    gathers.sort()
    totals.sort()
    return gathers[runs // 2] * 1e3, totals[runs // 2] * 1e3, seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    sleep = shutil.which("sleep") or "/bin/sleep"
    extra = [subprocess.Popen([sleep, "3600"]) for _ in range(args.processes)]
    try:
        time.sleep(1.0 if extra else 0.0)
        total = sum(1 for name in os.listdir("/proc") if name.isdigit())
        print(f"processes on the host: {total}")
        children = kernel.processes("/proc", everything=False)["names"]
        ways = (
            (False, None, "job hook (PID 1's children)"),
            (False, sorted(children), "job hook, names all PID 1's children"),
            (False, ["no-such-daemon"], "job hook, a name not PID 1's child"),
            (True, None, "health check (all)"),
        )
        for costly, names, what in ways:
            gather, whole, seen = p50(costly, args.runs, names)
            print(f"{what}: gather p50 {gather:.2f} ms, gather+parse+checks p50 {whole:.2f} ms,"
                  f" {seen} processes read")
    finally:
        for proc in extra:
            proc.send_signal(signal.SIGTERM)
        for proc in extra:
            proc.wait()


if __name__ == "__main__":
    main()
