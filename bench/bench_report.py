"""Benchmark: the nightly report over a fleet store of 1M runs (issue 5, "Performance").

The store is bench_fleet's (2,000 nodes, 1M runs over 30 days, results, Xids, jobs, drains),
its runs carrying the versions a real run records (runner.Gathered.versions). Then
`slurmhealth report` in HTML, Markdown and JSON, each in a fresh process as cron runs it:
wall time and that process's own peak RSS (goal <= 10 s and <= 1 GiB each).

Run: `make bench` or `.venv-bench/bin/python bench/bench_report.py [--runs 1000000]`.
Temp files live in one temp dir, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import bench_fleet

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim import simulate  # noqa: E402

GOAL_S, GOAL_RSS = 10.0, 2**30


def sources_with_versions() -> str:
    """A run's sources JSON as runner.Gathered.to_dict writes it, versions included."""
    found = simulate.node_versions(None)
    out = {
        source: {"status": "ok", "message": "", "seconds": 0.0123, "versions": found[source]}
        for source in ("gpu", "ib")
    }
    out["kmsg"] = {"status": "ok", "message": "", "seconds": 0.001}
    return json.dumps(out)


def timed_report(path: str, fmt: str, out: str) -> tuple:
    """(seconds, peak RSS in bytes) of one `slurmhealth report` process (its own rusage)."""
    argv = [sys.executable, "-m", "slurmhealth", "report", "--db", path]
    argv += ["--now", str(bench_fleet.END + 6 * 3600), "--format", fmt, "-o", out]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        message = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"report --format {fmt} failed: {message.strip()}")
    return seconds, usage.ru_maxrss * 1024


def build(path: str, runs: int) -> dict:
    """Build the store in a child process: Linux carries a parent's peak RSS into its
    children's ru_maxrss, and building 1M rows in memory would inflate every figure."""
    code = (
        "import json, sys, bench_fleet, bench_report\n"
        "bench_fleet.SOURCES = bench_report.sources_with_versions()\n"
        "print(json.dumps(bench_fleet.build_store(sys.argv[1], int(sys.argv[2]))))"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, "-c", code, path, str(runs)]
    return json.loads(subprocess.run(argv, capture_output=True, check=True, env=env).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs in the fleet store")
    parser.add_argument("--tmp", default=None, help="where temp files go [$TMPDIR]")
    args = parser.parse_args()
    print(f"report: {bench_fleet.NODES} nodes, {args.runs:,} runs, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-report-", dir=args.tmp) as tmp:
        path = os.path.join(tmp, "fleet.db")
        started = time.perf_counter()
        counts = build(path, args.runs)
        built = time.perf_counter() - started
        size = os.path.getsize(path) / 2**20
        print(f"store: {sum(counts.values()):,} records, {size:.0f} MiB, built in {built:.0f} s")
        print(f"{'format':>6}  {'wall s':>6}  {'RSS MiB':>7}  {'size KiB':>8}  goal")
        for fmt in ("html", "md", "json"):
            out = os.path.join(tmp, f"report.{fmt}")
            seconds, rss = timed_report(path, fmt, out)
            ok = "ok" if seconds <= GOAL_S and rss <= GOAL_RSS else "MISSED"
            kib = os.path.getsize(out) / 1024
            print(f"{fmt:>6}  {seconds:>6.2f}  {rss / 2**20:>7.0f}  {kib:>8.0f}  {ok}")


if __name__ == "__main__":
    main()
