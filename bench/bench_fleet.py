"""Benchmark: the fleet store at scale (issue 4, "Performance").

1. Fleet stores of 100k and 1M recorded runs from 2,000 nodes (health checks, prolog/epilog
   pairs of single- and multi-node jobs, warn/fail results, Xids, drains), built by direct inserts.
2. `lemons` over a 28-day window: signals.signals (+ policy.score when it exists), each in a fresh
   process: seconds and peak RSS (goal <= 10 s and <= 1 GiB at 1M; 10x data <= 11x time).
3. export of the 1M store to NDJSON and `import` of it into an empty fleet store (records/s),
   then the same import again (idempotent: adds nothing).

Run: `make bench` or `.venv-bench/bin/python bench/bench_fleet.py [--sizes 100000,1000000]`.
Temp files live in one temp dir, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from slurmhealth.core import store
from slurmhealth.fleet import records

NODES = 2000
END = 1_780_000_000.0  # 2026-05-28: a fixed "now", so every run measures the same data
WINDOW = 28 * 86400
SPAN = 30 * 86400  # records reach a little before the window, as in a real store
SOURCES = json.dumps(
    {
        area: {"status": "ok", "message": "", "seconds": 0.0123}
        for area in ("gpu", "nvlink", "ib", "kmsg")
    }
)
CHECKS = ("gpu.ecc", "gpu.thermal", "nvlink.errors", "ib.port_state", "xid.hardware")
XIDS = (
    (13, "app"),
    (31, "app"),
    (43, "app"),
    (63, "warn"),
    (92, "warn"),
    (79, "fail"),
    (48, "fail"),
)
STATES = (("COMPLETED", 0.88), ("FAILED", 0.09), ("CANCELLED", 0.02), ("TIMEOUT", 0.007))


class Builder:
    """Rows for one fleet store, generated with a seeded RNG."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - data, not secrets
        self.rows: dict = {kind: [] for kind in records.KINDS}
        self.runs = 0
        self.job_id = 1000

    def new_id(self) -> str:
        return f"{self.rng.getrandbits(96):024x}"

    def node(self) -> str:
        return f"gpu{self.rng.randrange(NODES):04d}"

    def verdict(self) -> str:
        x = self.rng.random()
        return "fail" if x < 0.005 else "warn" if x < 0.02 else "ok"

    def run(self, node: str, job: str | None, phase: str, started: float, verdict: str) -> str:
        run_id = self.new_id()
        row = (run_id, node, job, phase, started, 0.04, verdict, "0.1.0", SOURCES)
        self.rows["run"].append(row)
        self.runs += 1
        if verdict != "ok":
            check = self.rng.choice(CHECKS)
            message = f"{check} {verdict}: 1 problem"
            self.rows["result"].append((run_id, check, verdict, message, "none", "{}", 0.01))
        if self.rng.random() < 0.003:
            self.event(run_id, node, job if phase == "epilog" else None, started)
        if self.rng.random() < 0.002:
            action = "drain" if self.rng.random() < 0.7 else "resume"
            row = (self.new_id(), node, started, action, "slurmhealth: bench", "bench", 1, "")
            self.rows["action"].append(row)
        return run_id

    def event(self, run_id: str, node: str, job: str | None, when: float) -> None:
        code, klass = self.rng.choice(XIDS)
        seq = self.rng.getrandbits(32)
        row = (f"xid:{node}:boot:{seq}:{code}", run_id, node, job, when, "xid", code)
        row += (0, "00000000:18:00.0", 4242, "python", klass, "none", f"Xid {code}", 1)
        self.rows["event"].append(row)

    def slurm_state(self) -> str:
        x = self.rng.random()
        for state, share in STATES:
            if x < share:
                return state
            x -= share
        return "NODE_FAIL"

    def job(self) -> None:
        self.job_id += 1
        size = 1 if self.rng.random() < 0.85 else self.rng.randint(2, 8)
        start = END - self.rng.random() * SPAN
        end = start + self.rng.uniform(60, 36000)
        state = self.slurm_state()
        for node in {self.node() for _ in range(size)}:
            prolog = "fail" if self.rng.random() < 0.002 else self.verdict()
            job = str(self.job_id)
            self.run(node, job, "prolog", start, prolog)
            self.run(node, job, "epilog", end, self.verdict())
            kind = "prolog_failed" if prolog == "fail" else "ended"
            row = (node, job, 1000, "alice", start, end, 0, 0, kind, size, state)
            self.rows["job"].append(row)

    def build(self, target: int) -> dict:
        while self.runs < target:
            if self.rng.random() < 0.25:
                self.job()
            else:
                when = END - self.rng.random() * SPAN
                self.run(self.node(), None, "healthcheck", when, self.verdict())
        return self.rows


def build_store(path: str, runs: int, seed: int = 1) -> dict:
    """A fleet store of about `runs` runs; returns the number of rows per record type."""
    rows = Builder(seed).build(runs)
    conn = store.connect(path)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")
    conn.execute("BEGIN")
    for kind, spec in records.KINDS.items():
        marks = ", ".join("?" * len(spec.columns))
        width = len(spec.columns)  # columns added since (jobs.gpu_energy, below_base): NULL
        padded = (row + (None,) * (width - len(row)) for row in rows[kind])
        conn.executemany(f"INSERT OR IGNORE INTO {spec.table} VALUES ({marks})", padded)  # noqa: S608
    conn.execute("COMMIT")
    conn.close()
    return {kind: len(r) for kind, r in rows.items()}


MEASURE = """
import json, resource, sys, time
from slurmhealth.fleet import records, signals
from slurmhealth.core import store
conn = store.connect(sys.argv[1])
end = float(sys.argv[2]); start = end - float(sys.argv[3])
t0 = time.perf_counter()
sig = signals.signals(conn, start, end)
t1 = time.perf_counter()
scored = None
try:
    from slurmhealth.fleet import policy
except ImportError:
    policy = None
if policy is not None and hasattr(policy, "score"):
    try:
        scored = len(policy.score(sig))
    except Exception as exc:
        scored = "error: " + str(exc)[:60]
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
try:  # Linux keeps the parent's peak in ru_maxrss across fork+exec; VmHWM is this program's own
    with open("/proc/self/status") as status:
        rss = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmHWM:"))
except (OSError, StopIteration):
    pass
print(json.dumps({"signals_s": t1 - t0, "lemons_s": t2 - t0, "rss": rss, "nodes": len(sig),
                  "scored": scored}))
"""


def measure(path: str) -> dict:
    """signals (+ score) over the 28-day window in a fresh process: the CLI's cost."""
    argv = [sys.executable, "-c", MEASURE, path, str(END), str(WINDOW)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def timed_import(path: str, spool: str) -> tuple:
    conn = store.connect(path)
    started = time.perf_counter()
    report = records.import_ndjson(conn, spool)
    seconds = time.perf_counter() - started
    conn.close()
    return seconds, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="runs per fleet store")
    parser.add_argument("--tmp", default=None, help="where temp files go [$TMPDIR]")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"fleet store: {NODES} nodes, window 28 days, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-", dir=args.tmp) as tmp:
        timings = {}
        print(
            f"{'runs':>9}  {'records':>9}  {'build s':>7}  {'signals s':>9}  "
            f"{'lemons s':>8}  {'RSS MiB':>7}  nodes  policy.score"
        )
        for size in sizes:
            path = os.path.join(tmp, f"fleet-{size}.db")
            started = time.perf_counter()
            counts = build_store(path, size)
            built = time.perf_counter() - started
            m = measure(path)
            timings[size] = m["lemons_s"]
            print(
                f"{size:>9,}  {sum(counts.values()):>9,}  {built:>7.1f}  {m['signals_s']:>9.2f}  "
                f"{m['lemons_s']:>8.2f}  {m['rss'] / 2**20:>7.0f}  {m['nodes']:>5}  "
                f"{'n/a' if m['scored'] is None else m['scored']}"
            )
        if len(sizes) >= 2:
            small, big = sizes[0], sizes[-1]
            ratio = timings[big] / timings[small]
            print(f"scaling: {big / small:g}x data -> {ratio:.1f}x time (goal <= 11x for 10x)")
        biggest = os.path.join(tmp, f"fleet-{sizes[-1]}.db")
        spool = os.path.join(tmp, "fleet.ndjson")
        conn = store.connect(biggest)
        started = time.perf_counter()
        with open(spool, "w") as out:
            counts = records.export(conn, out)
        exported = time.perf_counter() - started
        conn.close()
        written = sum(counts.values())
        size_mb = os.path.getsize(spool) / 2**20
        print(
            f"export: {written:,} records ({size_mb:.0f} MiB) in {exported:.1f} s "
            f"= {written / exported:,.0f} records/s"
        )
        target = os.path.join(tmp, "imported.db")
        for label in ("import", "again"):
            seconds, report = timed_import(target, spool)
            added = sum(report["added"].values())
            print(
                f"{label}: {report['records']:,} records in {seconds:.1f} s = "
                f"{report['records'] / seconds:,.0f} records/s, {added:,} added"
            )
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"(this process, building and importing: peak RSS {peak:.0f} MiB)")


if __name__ == "__main__":
    main()
