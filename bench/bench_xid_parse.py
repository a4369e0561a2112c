"""Benchmark: checks/xid.py parse over a kernel log, in process (the hook's kmsg cost after the
read). Default log: the H200 snapshot's 358 live records (tests/fixtures/snapshots/
h200-live.json); `--log PATH` reads any form `--kmsg` reads. `--faults` appends one copy of the
fault fixtures' lines (Xid, SXid, RmInitAdapter) to measure the cost where lines match.

Run: `.venv/bin/python bench/bench_xid_parse.py [--repeat 7] [--number 2000]`. Prints the best
and median per parse in microseconds; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from slurmhealth.node.checks import xid  # noqa: E402
from slurmhealth.node.sources import kmsg  # noqa: E402

SNAPSHOT = os.path.join(REPO, "tests", "fixtures", "snapshots", "h200-live.json")
FAULTS = ("same-faults.kmsg", "sxid.kmsg", "driver-init.kmsg")


def raw_log(path: str | None, faults: bool) -> dict:
    if path:
        raw = kmsg.read(path)
    else:
        with open(SNAPSHOT, encoding="utf-8") as handle:
            raw = json.load(handle)["kmsg"]
    records = list(raw["records"])
    if faults:
        for name in FAULTS:
            fixture = os.path.join(REPO, "tests", "fixtures", "kmsg", name)
            if os.path.exists(fixture):
                records += kmsg.read(fixture)["records"]
    return dict(raw, records=records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    raw = raw_log(args.log, args.faults)
    runs = timeit.repeat(lambda: xid.parse(raw), repeat=args.repeat, number=args.number)
    per = [r / args.number * 1e6 for r in runs]
    print(
        f"{len(raw['records'])} records: best {min(per):.1f} us, "
        f"median {statistics.median(per):.1f} us per parse"
    )


if __name__ == "__main__":
    main()
