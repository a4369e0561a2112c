"""Benchmark: checks/xid.py parse over a kernel log, in process (the hook's kmsg cost after the
read). Default log: the H200 snapshot's 358 live records (tests/fixtures/snapshots/
h200-live.json); `--log PATH` reads any form `--kmsg` reads. `--faults` appends one copy of the
fault fixtures' lines (Xid, SXid, RmInitAdapter) to measure the cost where lines match; `--hca`
appends an 8-HCA boot's mlx5_core lines (tests/fixtures/kmsg/hca-boot.dmesg).

`--against FILE` times an older checks/xid.py too (`git show REV:slurmhealth/node/checks/xid.py
> /tmp/xid_old.py`), loaded beside the current one, in alternated rounds in this one process:
before and after on the same machine state. The older file imports its siblings (core, base,
driver_faults) from this checkout, so it must still run against them.

Run: `.venv/bin/python bench/bench_xid_parse.py [--repeat 7] [--number 2000]`. Prints the best
and median per parse in microseconds; asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import timeit
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from slurmhealth.node.checks import xid  # noqa: E402
from slurmhealth.node.sources import kmsg  # noqa: E402

SNAPSHOT = os.path.join(REPO, "tests", "fixtures", "snapshots", "h200-live.json")
FAULTS = ("same-faults.kmsg", "sxid.kmsg", "driver-init.kmsg")
HCA = ("hca-boot.dmesg",)


def raw_log(path: str | None, names: tuple[str, ...]) -> dict:
    if path:
        raw = kmsg.read(path)
    else:
        with open(SNAPSHOT, encoding="utf-8") as handle:
            raw = json.load(handle)["kmsg"]
    records = list(raw["records"])
    for name in names:
        fixture = os.path.join(REPO, "tests", "fixtures", "kmsg", name)
        if os.path.exists(fixture):
            records += kmsg.read(fixture)["records"]
    return dict(raw, records=records)


def older(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("xid_against", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--hca", action="store_true")
    parser.add_argument("--against")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    raw = raw_log(args.log, (FAULTS if args.faults else ()) + (HCA if args.hca else ()))
    modules = {"this": xid}
    if args.against:
        modules = {"against": older(args.against), **modules}
    per: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(args.repeat):  # alternated rounds: both see the same machine
        for name, module in modules.items():
            run = min(timeit.repeat(lambda m=module: m.parse(raw), repeat=3, number=args.number))
            per[name].append(run / args.number * 1e6)
    for name, runs in per.items():
        print(
            f"{name}: {len(raw['records'])} records: best {min(runs):.1f} us, "
            f"median {statistics.median(runs):.1f} us per parse"
        )


if __name__ == "__main__":
    main()
