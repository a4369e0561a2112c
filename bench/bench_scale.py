"""Benchmark: a simulated month of a large fleet (issue 14, "A 10,000-node fleet").

The simulator (sim/simulate.py) with a health check every 5 minutes and about 10
jobs per node-day:

1. month: NODES nodes x 28 days written to a fleet store; its size, then the rollup of passing
   health checks older than 2 days (`collect --rollup-after 2d`) and VACUUM: the size kept.
2. `lemons --window 28d` and `report --since 28d` over it, each a fresh process: seconds and
   peak RSS.
3. cycle: one 5-minute cycle of NODES nodes' incremental exports (the records of the last
   5 minutes plus the 2-minute overlap, one file per node) collected with --consume into a
   store holding 2 days of the same fleet: head-node CPU seconds; then a cycle with nothing
   new, the same files left in place (unchanged: not read), and the hourly rollup as collect
   runs it, at most `--rollup-max` node-hours a cycle (rollup.ROLLUP_MAX): the most CPU one
   cycle spends on it.

Run: `make bench` (200 nodes) or `.venv-bench/bin/python bench/bench_scale.py --nodes 1000`;
`--url postgresql://USER@HOST:PORT/postgres` runs it on a PostgreSQL server (a local one: its
processes' CPU is counted beside the collector's; the rollup steps count both);
`--nodes 10000 --only cycle` measures the collect cycle at 10,000 nodes (the month at 10,000
nodes needs ~30 GB and ~25 minutes to write before its rollup: see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim import simulate  # noqa: E402
from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import collect, pgstore, records, rollup  # noqa: E402

DAY = 86400


def fleet(nodes: int, days: int) -> simulate.Fleet:
    return simulate.Fleet(nodes=nodes, days=days, seed=14, jobs_per_node_day=10.0)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def size_mib(path: str) -> float:
    if path.startswith(store.SERVER_PREFIXES):
        conn = pgstore.connect(path)
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        conn.close()
        return float(size) / 2**20
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s)) / 2**20


SERVER = ""  # --url: the stores are databases made on this PostgreSQL server


def new_store(tmp: str, name: str) -> tuple:
    """(its path or URL, an open connection): a SQLite file in `tmp`, or with --url a fresh
    database of that name on the server (dropped first if a run left it)."""
    if not SERVER:
        path = os.path.join(tmp, f"{name}.db")
        return path, store.connect(path)
    import psycopg  # noqa: PLC0415

    with psycopg.connect(SERVER, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS bench_{name}")
        admin.execute(f"CREATE DATABASE bench_{name} TEMPLATE template0 LOCALE 'C'")
    base = SERVER.rsplit("/", 1)[0]
    url = f"{base}/bench_{name}"
    return url, pgstore.connect(url)


def server_cpu() -> float:
    """CPU seconds of every local postgres process so far (0 without --url): the server's share
    of a collect, beside the collector's own."""
    if not SERVER:
        return 0.0
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)
            if "(postgres" in fields[0]:
                parts = fields[1].split()
                total += (int(parts[11]) + int(parts[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


# The CLI in a fresh process that reports its own peak RSS (VmHWM) on exit: ru_maxrss of a
# child counts the parent's memory it was forked from.
_CLI = (
    "import atexit, sys\n"
    "def hwm():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM'): sys.stderr.write('hwm ' + line.split()[1] + '\\n')\n"
    "atexit.register(hwm)\n"
    "from slurmhealth.cli import cli\n"
    "cli(sys.argv[1:])\n"
)


def child(args: list) -> tuple:
    """(wall seconds, peak RSS MiB) of one CLI command in a fresh process."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CLI, *args],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wall = time.perf_counter() - started
    lines = proc.stderr.decode().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("hwm "):
        sys.exit(f"{' '.join(args)}: failed: {lines[-3:]}")
    return wall, int(lines[-1].split()[1]) / 1024


def month(nodes: int, tmp: str) -> dict:
    f = fleet(nodes, 28)
    t = time.perf_counter()
    history = simulate.events(f)
    path, conn = new_store(tmp, "month")
    counts = simulate.write_store(history, conn)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    out = {"runs": counts["runs"], "jobs": counts["jobs"], "write_s": time.perf_counter() - t}
    out["raw_mib"] = size_mib(path)
    t, c = time.perf_counter(), cpu()
    done = rollup.rollup(conn, f.end - 2 * DAY)
    out.update(rollup_s=time.perf_counter() - t, rollup_cpu_s=cpu() - c, folded=done["runs"])
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    out["rows_kept"] = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    out["rolled_mib"] = size_mib(path)
    conn.close()
    now = str(f.end)
    out["lemons_s"], out["lemons_mib"] = child(
        ["lemons", "--db", path, "--window", "28d", "--now", now, "--json"]
    )
    report = ["report", "--db", path, "--since", "28d", "--now", now, "--format", "json"]
    out["report_s"], out["report_mib"] = child([*report, "-o", os.path.join(tmp, "r.json")])
    return out


def write_spool(spool: str, by_node: dict) -> None:
    header = {"type": "header", "format": records.FORMAT, "schema": store.SCHEMA_VERSION}
    for node, rows in by_node.items():
        with open(os.path.join(spool, f"{node}.ndjson"), "w") as out:
            out.write(json.dumps(header) + "\n")
            for row in rows:
                out.write(json.dumps(row, separators=(",", ":")) + "\n")


def cycle(nodes: int, tmp: str) -> dict:
    """One 5-minute collect cycle at the end of 2 days of `nodes` nodes."""
    f = fleet(nodes, 2)
    history = simulate.events(f)
    path, conn = new_store(tmp, "cycle")
    end = f.end - 300  # the last cycle: its records are the spool, the rest already merged
    simulate.write_store(history, conn)
    conn.execute("DELETE FROM runs WHERE started >= ?", (end - 300 - records.OVERLAP,))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    spool = os.path.join(tmp, "spool")
    os.makedirs(spool, exist_ok=True)
    by_node = simulate.spool_records(history, end - 300 - records.OVERLAP, end)
    write_spool(spool, by_node)
    out = {"files": len(by_node), "records": sum(len(r) for r in by_node.values())}
    t, c, sc = time.perf_counter(), cpu(), server_cpu()
    report = collect.collect(conn, spool, end - 2 * DAY, consume=True)
    out.update(cycle_s=time.perf_counter() - t, cycle_cpu_s=cpu() - c)
    out["server_cpu_s"] = server_cpu() - sc
    out["added"] = sum(report["added"].values())
    t, c = time.perf_counter(), cpu()
    collect.collect(conn, spool, end - 2 * DAY, consume=True)
    out.update(empty_s=time.perf_counter() - t, empty_cpu_s=cpu() - c)
    write_spool(spool, by_node)
    collect.collect(conn, spool, end - 2 * DAY)  # in place: their identities recorded
    t, c = time.perf_counter(), cpu()
    again = collect.collect(conn, spool, end - 2 * DAY)
    out.update(unchanged_s=time.perf_counter() - t, unchanged_cpu_s=cpu() - c)
    out["unchanged"] = len(again["unchanged"])
    # A real node's passing runs carry skip results (no fabric state, no NVLink on a PCIe
    # GPU...): the simulator's have none. Two per passing check of the hour rolled up, as the
    # healthy H100 snapshot's runs carry three.
    conn.execute(
        "INSERT OR IGNORE INTO results (run_id, check_name, status, message, action, data, "
        "duration) SELECT id, c.name, 'skip', 'not reported', '', '{}', 0.0 FROM runs, "
        "(SELECT 'gpu.fabric' AS name UNION ALL SELECT 'nvlink.link_state') AS c "
        "WHERE phase = 'healthcheck' AND verdict = 'ok' AND started < ?",
        (f.start + 3600,),
    )
    conn.commit()
    # The fleet's first hour, rolled up as collect does: at most ROLLUP_MAX node-hours a cycle.
    steps, own, folded = [], [], 0
    while True:
        c, sc = cpu(), server_cpu()
        done = rollup.rollup(conn, f.start + 3600, rollup.ROLLUP_MAX)
        own.append(cpu() - c)
        steps.append(own[-1] + server_cpu() - sc)
        folded += done["runs"]
        if not done["behind"]:
            break
    out.update(rollup_steps=steps, rollup_own=own, rollup_hour_runs=folded)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--only", choices=("month", "cycle"), default=None)
    parser.add_argument("--dir", default=None, help="where the stores go [a temp dir]")
    parser.add_argument(
        "--url",
        default="",
        help="a PostgreSQL server's maintenance database (postgresql://USER@HOST:PORT/postgres): "
        "the stores are databases made there, and its local processes' CPU is counted",
    )
    args = parser.parse_args()
    global SERVER  # noqa: PLW0603 - one setting for the whole run
    SERVER = args.url
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=args.dir) as tmp:
        print(f"bench_scale: {args.nodes:,} nodes, health check every 5 min, ~10 jobs/node-day")
        if args.only in (None, "month"):
            m = month(args.nodes, tmp)
            print(
                f"  month (28 d): {m['runs']:,} runs, {m['jobs']:,} job rows, written in "
                f"{m['write_s']:.0f} s; store {m['raw_mib']:,.0f} MiB"
            )
            print(
                f"  rollup after 2 d: {m['folded']:,} runs folded in {m['rollup_s']:.1f} s "
                f"({m['rollup_cpu_s']:.1f} s CPU); {m['rows_kept']:,} rows kept; store "
                f"{m['rolled_mib']:,.0f} MiB (x{10_000 / args.nodes:g} for 10,000 nodes: "
                f"{m['rolled_mib'] * 10_000 / args.nodes / 1024:.1f} GiB)"
            )
            print(f"  lemons --window 28d: {m['lemons_s']:.1f} s, {m['lemons_mib']:.0f} MiB")
            print(f"  report --since 28d:  {m['report_s']:.1f} s, {m['report_mib']:.0f} MiB")
        if args.only in (None, "cycle"):
            c = cycle(args.nodes, tmp)
            print(
                f"  collect cycle: {c['files']:,} files, {c['records']:,} records "
                f"({c['added']:,} added): {c['cycle_cpu_s']:.2f} s CPU ({c['cycle_s']:.2f} s)"
                + (f"; the server's {c['server_cpu_s']:.2f} s CPU" if SERVER else "")
            )
            print(f"  collect, nothing new: {c['empty_cpu_s']:.3f} s CPU")
            print(
                f"  collect, {c['unchanged']:,} files unchanged in place: "
                f"{c['unchanged_cpu_s']:.2f} s CPU"
            )
            steps = c["rollup_steps"]
            print(
                f"  hourly rollup: {c['rollup_hour_runs']:,} runs folded in {len(steps)} "
                f"cycle{'s' if len(steps) > 1 else ''} "
                f"of at most {rollup.ROLLUP_MAX:,} node-hours: {max(steps):.2f} s CPU at most, "
                f"{sum(steps):.2f} s in all"
                + (f" (the collector's own {max(c['rollup_own']):.2f} s at most)" if SERVER else "")
            )
            print(
                f"  the cycle that also rolls up, at most: "
                f"{c['cycle_cpu_s'] + max(steps):.2f} s CPU (goal <= 5 s)"
                + (
                    f"; the collector's own {c['cycle_cpu_s'] + max(c['rollup_own']):.2f} s"
                    if SERVER
                    else ""
                )
            )


if __name__ == "__main__":
    main()
