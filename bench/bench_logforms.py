"""Benchmark: the kernel-log source's parse cost per log form, and the aer area's parse.

Renders the H200 snapshot's kernel log (tests/fixtures/snapshots/h200-live.json, 358 records)
as a file in several forms (/dev/kmsg records, dmesg, dmesg -x, journalctl short-iso-precise,
journalctl -o json), then times `kmsg.read` of each file plus the three kmsg areas' parse (xid,
mce, aer), and `aer.parse` alone on the snapshot's records (what the new area adds to every
run, the job hooks included). Best and median of --runs runs, in one process.

Run: `PYTHONPATH=. .venv/bin/python bench/bench_logforms.py [--runs 300]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from slurmhealth.node.checks import aer, mce, xid
from slurmhealth.node.sources import kmsg

SNAPSHOT = os.path.join(
    os.path.dirname(__file__), "..", "tests", "fixtures", "snapshots", "h200-live.json"
)


def _stamp(usec: int) -> str:
    return f"{usec // 1000000:5d}.{usec % 1000000:06d}"


FORMS = {
    "kmsg": lambda r: f"{r['pri']},{r['seq']},{r['usec']},-;{r['msg']}",
    "dmesg": lambda r: f"[{_stamp(r['usec'])}] {r['msg']}",
    "dmesg -x": lambda r: f"kern  :{kmsg.LEVELS[r['pri']]:<6}: [{_stamp(r['usec'])}] {r['msg']}",
    "short-iso-precise": lambda r: f"2026-11-30T12:00:00.{r['usec'] % 1000000:06d}+00:00 gpu01 "
    f"kernel: {r['msg']}",
    "json": lambda r: json.dumps(
        {"__CURSOR": "s=0", "__REALTIME_TIMESTAMP": "1790000000000000", "_TRANSPORT": "kernel",
         "PRIORITY": str(r["pri"]), "SYSLOG_FACILITY": "0", "SYSLOG_IDENTIFIER": "kernel",
         "_SOURCE_MONOTONIC_TIMESTAMP": str(r["usec"]), "_HOSTNAME": "gpu01", "MESSAGE": r["msg"]}
    ),  # fmt: skip
}


def timed(fn, runs: int) -> tuple[float, float]:
    """(best, median) milliseconds of `runs` calls."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with open(SNAPSHOT, encoding="utf-8") as handle:
        raw = json.load(handle)["kmsg"]
    records = [r for r in raw["records"] if r.get("usec") is not None and r.get("pri") is not None]
    print(f"{len(records)} records of the H200 snapshot's kernel log, {args.runs} runs each")
    best, median = timed(lambda: aer.parse(raw), args.runs)
    print(f"aer.parse of the snapshot's records: best {best:.3f} ms, median {median:.3f} ms")
    with tempfile.TemporaryDirectory() as folder:
        for name, render in FORMS.items():
            path = os.path.join(folder, name.replace(" ", ""))
            with open(path, "w", encoding="utf-8") as out:
                out.write("".join(render(r) + "\n" for r in records))

            def run(path: str = path) -> None:
                facts = kmsg.read(path)
                xid.parse(facts), mce.parse(facts), aer.parse(facts)

            assert len(kmsg.read(path)["records"]) == len(records), name
            best, median = timed(run, args.runs)
            print(f"{name:<18} read + 3 parses: best {best:.2f} ms, median {median:.2f} ms")


if __name__ == "__main__":
    main()
