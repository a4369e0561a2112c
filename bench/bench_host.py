"""Benchmark: what the host areas (fs, hw, time) add to a run, in process, on this machine.

1. Each source's gather on the live node, as a job hook does it (`fs`: mountinfo and a bounded
   statvfs of the mounts holding /, /tmp and /var; `host`: meminfo, the CPU lists and topology,
   adjtimex with ctypes already loaded), then parse and every check with default expectations:
   p50 and p99 over --runs runs of each, and of the whole (both sources, all three areas).
   The fs area again with three file tests (`[fs] files`: /etc a readable directory,
   /etc/passwd a non-empty file, /dev/null a writable character device), each path stat'ed in
   its own thread beside the mounts: what a translated NHC check_file_test costs a hook.
2. The same through the runner (`runner.run(areas=["fs", "hw", "time"])`: a gather thread per
   source, each under its deadline, as a hook runs them), p50 and p99.
3. The import of the five modules (checks/fs, hw, time; sources/fs, host), in a fresh
   interpreter that has the runner's own imports already, p50 over 10 processes.
4. The ctypes import that adjtimex needs, in a fresh interpreter (`python -X importtime`),
   p50 over 10 processes: what a job hook on a node without NVML would pay, which is why the
   job hooks leave the clock to the health check there (sources/host.py).

Run: `python bench/bench_host.py [--runs 2000]` from the checkout. Prints figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import pct  # noqa: E402

from slurmhealth.node import config, runner  # noqa: E402
from slurmhealth.node.checks import AREAS  # noqa: E402
from slurmhealth.node.checks.base import Context  # noqa: E402
from slurmhealth.node.sources import Options, fs, host  # noqa: E402


def options() -> Options:
    """The options a job hook's run hands the sources (runner.run sets the fs ones)."""
    expect = config.defaults()
    opts = Options(costly=False)
    opts.mounts = AREAS["fs"].stat_paths(expect["fs"])
    opts.stat_timeout = expect["fs"]["stat_timeout"]
    return opts


def checks(area: str, raw: object, expect: dict) -> None:
    module = AREAS[area]
    facts = module.parse(raw)
    ctx = Context(expect=expect[area])
    for check in module.CHECKS:
        check(facts, ctx)


def one_run(opts: Options, expect: dict, which: str) -> float:
    """Milliseconds of one gather + parse + checks of `which` ("fs", "host" or "both")."""
    started = time.perf_counter()
    if which in ("fs", "both"):
        checks("fs", fs.gather(opts), expect)
    if which in ("host", "both"):
        raw = host.gather(opts)
        checks("hw", raw, expect)
        checks("time", raw, expect)
    return (time.perf_counter() - started) * 1000


def import_ms(before: str, modules: list, column: int = 0) -> float:
    """p50 over 10 fresh interpreters of the summed import time (ms; column 0: self, 1:
    cumulative) of `modules` imported after `before` ran (python -X importtime)."""
    costs = []
    code = f"{before}; " + "; ".join(f"import {m}" for m in modules)
    for _ in range(10):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            capture_output=True, text=True, check=False,
            env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)) or "."),
        )
        rows = [x.split("|") for x in proc.stderr.splitlines() if x.startswith("import time:")]
        found = [int(r[column].split(":")[-1]) for r in rows if r[2].strip() in modules]
        costs.append(sum(found) / 1000)
    return statistics.median(costs)


def runner_ms(runs: int) -> list:
    """Milliseconds of runner.run over the three host areas, defaults, no store."""
    expect = config.defaults()
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        runner.run("bench", expect, Options(costly=False), ["fs", "hw", "time"], "prolog")
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    import ctypes  # noqa: F401, PLC0415 - loaded, as on a GPU node: the clock is read

    opts, expect = options(), config.defaults()
    print(f"mounts stat'ed: {fs.judged(fs.gather(opts)['mountinfo'], opts.mounts)}")
    for which in ("fs", "host", "both"):
        for _ in range(50):  # warm the page cache and the interpreter's caches
            one_run(opts, expect, which)
        times = [one_run(opts, expect, which) for _ in range(args.runs)]
        print(
            f"{which:>4}: gather+parse+checks p50 {statistics.median(times):.3f} ms, "
            f"p99 {pct(times, 0.99):.3f} ms over {args.runs} runs"
        )
    files = {"/etc": "dr", "/etc/passwd": "fs", "/dev/null": "cw"}
    opts.files = list(files)
    expect["fs"]["files"] = files
    for _ in range(50):
        one_run(opts, expect, "fs")
    times = [one_run(opts, expect, "fs") for _ in range(args.runs)]
    print(
        f"fs with {len(files)} files: gather+parse+checks p50 {statistics.median(times):.3f} ms, "
        f"p99 {pct(times, 0.99):.3f} ms over {args.runs} runs"
    )
    runner_ms(50)
    times = runner_ms(args.runs)
    print(
        f"runner.run fs,hw,time: p50 {statistics.median(times):.3f} ms, "
        f"p99 {pct(times, 0.99):.3f} ms over {args.runs} runs"
    )
    ours = ["slurmhealth.node.sources.fs", "slurmhealth.node.sources.host"]
    ours += [f"slurmhealth.node.checks.{m}" for m in ("fs", "hw", "time")]
    print(f"import of the five modules: p50 {import_ms('import threading', ours):.2f} ms "
          "(their own time, fresh interpreter, 10 runs)")
    ctypes_ms = import_ms("pass", ["ctypes"], column=1)
    print(f"ctypes import (cumulative, fresh interpreter, p50 of 10): {ctypes_ms:.2f} ms")


if __name__ == "__main__":
    main()
