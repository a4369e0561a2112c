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

A larger fleet on PostgreSQL: `--copies K` then copies the written fleet K-1 times on the server
(INSERT ... SELECT, every node renamed: `ga0001` -> `ha0001`, ...; every id suffixed), so ten
parts and ten copies are a 100,000-node fleet without simulating or sending it ten times. The
copies' records are the originals' (the same faults on the same days): the sweeps' cost is
what it measures, not what they find. `--days 7 --rollup-after 1` keeps such a fleet within a
disk of ~60 GB (docs/benchmarks.md, "100,000 nodes").

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
from slurmhealth.fleet import collect, pgstore, records, rollup  # noqa: E402

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
    parser.add_argument("--days", type=int, default=28, help="days of history (default 28)")
    parser.add_argument(
        "--rollup-after",
        type=int,
        default=2,
        metavar="DAYS",
        help="passing health checks older than this are rolled up each day (default 2)",
    )
    parser.add_argument(
        "--copies",
        type=int,
        default=1,
        help="PostgreSQL: the fleet this many times over, renamed copies made on the server",
    )
    parser.add_argument(
        "--cycle",
        action="store_true",
        help="write nothing: into the store written with the same --parts and --days, one "
        "5-minute collect cycle of the simulated parts' nodes, then one rollup step",
    )
    opts = parser.parse_args()
    if not 1 <= opts.parts <= 26:
        parser.error("--parts: 1 to 26")
    if not 1 <= opts.copies <= 20:
        parser.error("--copies: 1 to 20")
    server = opts.store.startswith(store.SERVER_PREFIXES)  # a PostgreSQL database's URL
    if opts.copies > 1 and not server:
        parser.error("--copies: a PostgreSQL store only")
    conn = pgstore.connect(opts.store) if server else store.connect(opts.store)
    started = time.perf_counter()
    parts = [
        simulate.events(
            simulate.Fleet(
                nodes=1000,
                days=opts.days,
                seed=14 + part,
                jobs_per_node_day=10.0,
                prefix=f"g{chr(97 + part)}",
            )
        )
        for part in range(opts.parts)
    ]
    print(f"simulated: {time.perf_counter() - started:.0f} s", flush=True)
    first, end = parts[0].fleet.start, parts[0].fleet.end
    if opts.cycle:
        _cycle(conn, opts, parts)
        return
    largest = 0.0
    for day in range(first, end, DAY):
        for part in parts:
            simulate.write_store(part, conn, between=(day, day + DAY))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the day's pages into the file
        largest = max(largest, _sizes(conn)[0])
        rollup.rollup(conn, day + DAY - opts.rollup_after * DAY)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        print(
            f"day {(day - first) // DAY + 1}: {time.perf_counter() - started:.0f} s, "
            f"file {_sizes(conn)[0]:.2f} GiB",
            flush=True,
        )
    if opts.copies > 1:
        _copies(opts.store, opts.copies, started)
        # The copies are rolled-up history, as their originals: the rollup's mark moves past
        # them. Left behind, the next rollup step reads them all as runs imported late into
        # hours it rolled up (`collect --full` of old exports): 220 s of the server's per
        # step at 100,000 nodes, a cost no running fleet pays each cycle.
        done = store.get_meta(conn, "rollup")
        if isinstance(done, dict):
            done["rowid"] = conn.execute("SELECT max(rowid) FROM runs").fetchone()[0]
            store.set_meta(conn, "rollup", done)
            conn.commit()
    if opts.vacuum:
        conn.execute("VACUUM")
        print(f"vacuumed: {time.perf_counter() - started:.0f} s", flush=True)
    file, used = _sizes(conn)
    conn.close()
    print(f"{opts.parts * 1000 * opts.copies:,} nodes written; END = {end}")
    print(f"file {file:.2f} GiB, largest after a day's writes {largest:.2f}; in use {used:.2f}")


# What a copy changes: the node (its first letter), and every id and place name that must stay
# distinct (a suffix); jobs keep their ids, as one job's nodes share it.
_RENAMED = {
    "runs": {"id": "id || %(tag)s", "node": "%(letter)s || substr(node, 2)"},
    "results": {"run_id": "run_id || %(tag)s"},
    "events": {
        "id": "id || %(tag)s",
        "run_id": "run_id || %(tag)s",
        "node": "%(letter)s || substr(node, 2)",
    },
    "jobs": {"node": "%(letter)s || substr(node, 2)"},
    "actions": {"id": "id || %(tag)s", "node": "%(letter)s || substr(node, 2)"},
    "node_events": {"node": "%(letter)s || substr(node, 2)"},
    "counters": {"node": "%(letter)s || substr(node, 2)", "run_id": "run_id || %(tag)s"},
    "run_hours": {"node": "%(letter)s || substr(node, 2)"},
    "places": {"node": "%(letter)s || substr(node, 2)", "name": "name || %(tag)s"},
}


def _copies(url: str, copies: int, started: float) -> None:
    """The written fleet copies-1 more times on the server, a table and a copy a transaction;
    the originals are the nodes whose name starts with `g`."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(url, autocommit=True) as raw:
        for copy in range(1, copies):
            args = {"letter": chr(ord("g") + copy), "tag": f"~{copy}"}
            for table, renamed in _RENAMED.items():
                names = store.TABLE[table].names()
                quoted = ", ".join(f'"{n}"' for n in names)  # `user`, `end` are keywords
                chosen = ", ".join(renamed.get(n, f'"{n}"') for n in names)
                where = "node LIKE 'g%%'" if "node" in names else "run_id NOT LIKE '%%~%%'"
                raw.execute(
                    f"INSERT INTO {table} ({quoted}) "  # noqa: S608 - our names
                    f"SELECT {chosen} FROM {table} WHERE {where}",
                    args,
                )
            print(f"copy {copy + 1}: {time.perf_counter() - started:.0f} s", flush=True)
        raw.execute("ANALYZE")


def _cycle(conn: object, opts: argparse.Namespace, parts: list) -> None:
    """One collector's 5-minute cycle at the end of the written history, as bench_scale.py
    measures it on a 2-day store: the parts' runs of the last cycle (and its overlap) taken out
    of the store, their records spooled one file per node and collected with --consume (the
    collector's CPU and, on a local server, the server's); then one rollup step of at most
    rollup.ROLLUP_MAX node-hours, of the hour that has just aged past --rollup-after."""
    import tempfile  # noqa: PLC0415

    import bench_scale  # noqa: PLC0415 - bench/ is on the path: the CPU readers

    if opts.store.startswith(store.SERVER_PREFIXES):
        bench_scale.SERVER = opts.store
    last = parts[0].fleet.end - 300
    since = last - 300 - records.OVERLAP
    conn.execute("DELETE FROM runs WHERE started >= ? AND node LIKE 'g%'", (since,))  # the parts
    conn.commit()
    with tempfile.TemporaryDirectory(prefix="write-month-") as spool:
        files = added = 0
        for part in parts:
            by_node = simulate.spool_records(part, since, last)
            bench_scale.write_spool(spool, by_node)
            files += len(by_node)
            added += sum(len(rows) for rows in by_node.values())
        wall, own, server = time.perf_counter(), bench_scale.cpu(), bench_scale.server_cpu()
        done = collect.collect(conn, spool, last - 2 * DAY, consume=True)
        wall, own = time.perf_counter() - wall, bench_scale.cpu() - own
        server = bench_scale.server_cpu() - server
    print(
        f"collect cycle: {files:,} files, {added:,} records "
        f"({sum(done['added'].values()):,} added): {own:.2f} s CPU ({wall:.2f} s); "
        f"the server's {server:.2f} s CPU"
    )
    before = parts[0].fleet.end - opts.rollup_after * DAY + 3600
    wall, own, server = time.perf_counter(), bench_scale.cpu(), bench_scale.server_cpu()
    step = rollup.rollup(conn, before, rollup.ROLLUP_MAX)
    wall, own = time.perf_counter() - wall, bench_scale.cpu() - own
    server = bench_scale.server_cpu() - server
    print(
        f"rollup step: {step['runs']:,} runs folded: {own:.2f} s CPU ({wall:.2f} s); "
        f"the server's {server:.2f} s CPU"
    )
    conn.close()


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
