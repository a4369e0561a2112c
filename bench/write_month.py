"""Write a simulated month of a large fleet into one fleet store, in 1,000-node parts.

simulate.events holds a whole fleet's month in memory; ten 1,000-node fleets (seeds 14.., node
prefixes ga, gb, ...) written one after the other make a 10,000-node store in bounded memory
(~250 MiB). After each part, the passing health checks older than 2 days are rolled up
(`collect --rollup-after 2d`) and the WAL is checkpointed, so the store stays near its rolled-up
size (docs/benchmarks.md, "The month at 10,000 nodes"). 90 minutes for 10 parts on 2 cores.
The last part's rollup leaves its freed pages in the file (a real fleet's next hour reuses
them); `--vacuum` returns them, as `slurmhealth prune` does (2.4 minutes at 10 parts).

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

from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import simulate, sync  # noqa: E402

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
    conn = store.connect(opts.store)
    started = time.perf_counter()
    end = None
    for part in range(opts.parts):
        fleet = simulate.Fleet(
            nodes=1000, days=28, seed=14 + part, jobs_per_node_day=10.0, prefix=f"g{chr(97 + part)}"
        )
        simulate.write_store(simulate.events(fleet), conn)
        conn.execute("DELETE FROM meta WHERE key = 'rollup'")  # roll the new part's hours too
        conn.commit()
        sync.rollup(conn, fleet.end - 2 * DAY)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        end = fleet.end
        print(f"part {part + 1}: {time.perf_counter() - started:.0f} s", flush=True)
    if opts.vacuum:
        conn.execute("VACUUM")
        print(f"vacuumed: {time.perf_counter() - started:.0f} s", flush=True)
    pages, free, size = (
        conn.execute(f"PRAGMA {name}").fetchone()[0]
        for name in ("page_count", "freelist_count", "page_size")
    )
    conn.close()
    print(f"{opts.parts * 1000:,} nodes written; END = {end}")
    print(f"file {pages * size / 2**30:.2f} GiB, in use {(pages - free) * size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
