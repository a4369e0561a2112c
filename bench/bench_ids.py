"""Benchmark: random record ids against time-ordered ones (core/store.py new_id), at fleet size.

A fleet store's runs table gains every node's health checks in time order, and the hourly
rollup deletes one hour of them (fleet/rollup.py). With random ids, each record's entry in the
id index lands on its own page; with time-ordered ids, the records written together sit
together. This builds the same day of 5-minute checks from N nodes twice, in time order, into a
table with the runs table's id, node and time keys, once per kind of id, then deletes one hour
of it as the rollup does, and prints the build time, the delete's time and CPU, and the WAL the
delete wrote.

Run: `.venv/bin/python bench/bench_ids.py [--nodes 10000]` (about 3.5 minutes at 10,000).
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import tempfile
import time

from slurmhealth.core import store

T0 = 1.7e9
STEP = 300.0  # a health check every 5 minutes
HOUR = 3600.0


def random_id(_t: float) -> str:
    return os.urandom(12).hex()  # the ids before 2026-12-01


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(path: str, nodes: int, make_id: object) -> dict:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, node TEXT, started REAL, phase TEXT)")
    conn.execute("CREATE INDEX runs_node ON runs (node, started)")
    conn.execute("CREATE INDEX runs_time ON runs (started, phase)")
    names = [f"gpu{i:05d}" for i in range(nodes)]
    started = time.perf_counter()
    for slot in range(int(86400 / STEP)):  # one day, one write per 5 minutes of the fleet's
        rows = []
        for i, node in enumerate(names):
            t = T0 + slot * STEP + i % int(STEP)  # splayed over the 5 minutes
            rows.append((make_id(t), node, t, "healthcheck"))  # type: ignore[operator]
        conn.executemany("INSERT INTO runs VALUES (?, ?, ?, ?)", rows)
        conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    build = time.perf_counter() - started
    started, before = time.perf_counter(), cpu()
    conn.execute("BEGIN IMMEDIATE")
    deleted = conn.execute(
        "DELETE FROM runs WHERE started >= ? AND started < ?", (T0 + HOUR, T0 + 2 * HOUR)
    ).rowcount
    conn.execute("COMMIT")
    out = {
        "build_s": build,
        "deleted": deleted,
        "delete_s": time.perf_counter() - started,
        "delete_cpu_s": cpu() - before,
        "wal_mib": os.path.getsize(path + "-wal") / 2**20,
    }
    conn.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ids-") as tmp:
        print(f"bench_ids: {opts.nodes:,} nodes, one day of 5-minute health checks")
        for name, make_id in (("random ids", random_id), ("time-ordered ids", store.new_id)):
            r = one(os.path.join(tmp, f"{name[0]}.db"), opts.nodes, make_id)
            print(
                f"  {name:16s} built in {r['build_s']:.0f} s; one hour ({r['deleted']:,} runs) "
                f"deleted in {r['delete_s']:.2f} s, {r['delete_cpu_s']:.2f} s CPU, "
                f"{r['wal_mib']:.0f} MiB of WAL"
            )


if __name__ == "__main__":
    main()
