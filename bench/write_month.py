"""Write a simulated month of a large fleet into one fleet store, day by day, as a fleet records it.

simulate.events simulates a whole fleet's month in memory; ten 1,000-node fleets (seeds 14..,
node prefixes ga, gb, ...) make a 10,000-node fleet (~250 MiB each). Each day, every part's
records of that day are written, then the passing health checks older than 2 days are rolled
up (`collect --rollup-after 2d`: the pages freed are reused by the next day's records, as on a
running fleet) and the WAL is checkpointed. The store file's largest size, measured after each
day's writes, is printed with its final size and what of it is in use (docs/benchmarks.md,
"The month at 10,000 nodes"). About 40 minutes for 10 parts on 2 cores. `--vacuum` returns
the free pages at the end, as `slurmhealth prune` does.

STORE may be a PostgreSQL database's URL (postgresql://USER@HOST/DB: docs/fleet.md).

Run: `.venv/bin/python bench/write_month.py STORE [--parts 10] [--vacuum]`, then time
`slurmhealth lemons --db STORE --window 28d --now END --json` and
`slurmhealth report --db STORE --since 28d --now END --format json -o r.json` (END is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim import simulate  # noqa: E402
from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import pgstore, rollup  # noqa: E402

DAY = 86400


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", help="the fleet store to write (created)")
    parser.add_argument("--parts", type=int, default=10, help="1,000-node fleets, at most 26")
    parser.add_argument(
        "--vacuum",
        action="store_true",
        help="VACUUM at the end, as `slurmhealth prune` does (the parts' rollups leave free pages)",
    )
    opts = parser.parse_args()
    if not 1 <= opts.parts <= 26:
        parser.error("--parts: 1 to 26")
    server = opts.store.startswith(store.SERVER_PREFIXES)  # a PostgreSQL database's URL
    conn = pgstore.connect(opts.store) if server else store.connect(opts.store)
    started = time.perf_counter()
    parts = [
        simulate.events(
            simulate.Fleet(
                nodes=1000,
                days=28,
                seed=14 + part,
                jobs_per_node_day=10.0,
                prefix=f"g{chr(97 + part)}",
            )
        )
        for part in range(opts.parts)
    ]
    print(f"simulated: {time.perf_counter() - started:.0f} s", flush=True)
    first, end = parts[0].fleet.start, parts[0].fleet.end
    largest = 0.0
    for day in range(first, end, DAY):
        for part in parts:
            simulate.write_store(part, conn, between=(day, day + DAY))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the day's pages into the file
        largest = max(largest, _sizes(conn)[0])
        rollup.rollup(conn, day + DAY - 2 * DAY)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        print(
            f"day {(day - first) // DAY + 1}: {time.perf_counter() - started:.0f} s, "
            f"file {_sizes(conn)[0]:.2f} GiB",
            flush=True,
        )
    if opts.vacuum:
        conn.execute("VACUUM")
        print(f"vacuumed: {time.perf_counter() - started:.0f} s", flush=True)
    file, used = _sizes(conn)
    conn.close()
    print(f"{opts.parts * 1000:,} nodes written; END = {end}")
    print(f"file {file:.2f} GiB, largest after a day's writes {largest:.2f}; in use {used:.2f}")


def _sizes(conn: object) -> tuple:
    """The store file's size and what of it is in use, GiB (the WAL checkpointed or not); on
    PostgreSQL the database's size twice (its free space is not counted apart)."""
    if isinstance(conn, pgstore.Connection):
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        return size / 2**30, size / 2**30
    pages, free, size = (
        conn.execute(f"PRAGMA {name}").fetchone()[0]  # type: ignore[attr-defined]
        for name in ("page_count", "freelist_count", "page_size")
    )
    return pages * size / 2**30, (pages - free) * size / 2**30


if __name__ == "__main__":
    main()
