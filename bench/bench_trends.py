"""What one sweep of the rising-counter finder costs on a 10,000-node month of counter readings.

Writes ten 1,000-node fleets of a model of bench/trend_fleets.py (node prefixes ga, gb, ...;
seeds 0..) into one fleet store through records.import_ndjson, as `collect` and `import` do: 28
days of counter readings at the packaged health-check cadence (5 minutes) and a daily run per
node that names its GPU model. Then times what `slurmhealth trends` does, in this process:
summing each series' rows of the longest window and the baseline before it per hour in SQL
(queries.counter_series; "rows" counts the rows it sums), the nodes' GPU models, and the finder
on those sums (trends.judged), each the median of --repeat runs, with the peak memory.

Run: `.venv/bin/python bench/bench_trends.py STORE [--parts 10] [--model workload] [--step 5]`
(about 4 minutes to write at 10 parts on 2 cores; an existing STORE is swept as it is), then
the whole command as a site runs it: `/usr/bin/time -v slurmhealth trends --db STORE --now END
--json` (END is printed). docs/benchmarks.md, "Error counters over time", has the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trend_fleets import DAY, START, Fleet  # noqa: E402

from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import queries, records, trends  # noqa: E402


def write(path: str, parts: int, model: str, step: float, days: int) -> None:
    conn = store.connect(path)
    header = json.dumps({"type": "header", "format": records.FORMAT})
    for part in range(parts):
        started = time.perf_counter()
        fleet = Fleet(model, part, 1000, days, step * 60.0, 8)
        prefix = f'"node": "g{chr(97 + part)}'
        lines = [line.replace('"node": "gpu', prefix) for line in fleet.records()]
        records.import_ndjson(conn, io.StringIO("\n".join([header, *lines]) + "\n"))
        print(
            f"part {part + 1}: {len(lines)} records, {time.perf_counter() - started:.0f} s",
            flush=True,
        )
    conn.close()


def sweep(path: str, end: float) -> dict:
    conn = store.connect(path)
    hours = trends.hours_of(trends.WINDOWS, trends.BASELINE)
    started = time.perf_counter()
    series = queries.counter_series(conn, end, hours, trends.NOT_TRENDS)
    read = time.perf_counter()
    nodes = [n for (n,) in conn.execute("SELECT DISTINCT node FROM counters")]
    models = queries.node_models(conn, nodes, end, queries.MODEL_LOOKBACK)
    named = time.perf_counter()
    limits = (trends.FACTOR, trends.MIN_EPISODES, trends.ALPHA)
    found = trends.judged(series, models, trends.WINDOWS, limits, trends.BASELINE)
    done = time.perf_counter()
    (rows,) = conn.execute(
        "SELECT count(*) FROM counters WHERE time > ? AND time <= ? AND delta > 0",
        (end - hours[2] * trends.HOUR, end),
    ).fetchone()
    conn.close()
    return {
        "rows": rows,
        "series": len(series),
        "nodes": len(nodes),
        "found": len(found),
        "read": read - started,
        "models": named - read,
        "rising": done - named,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", help="the fleet store (written when it does not exist)")
    parser.add_argument("--parts", type=int, default=10, help="1,000-node fleets, at most 26")
    parser.add_argument("--model", default="workload", choices=("drift", "workload", "clustered"))
    parser.add_argument("--step", type=float, default=5.0, help="minutes between readings")
    parser.add_argument("--days", type=int, default=28)
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    if not 1 <= opts.parts <= 26:
        parser.error("--parts: 1 to 26")
    if not os.path.exists(opts.store):
        write(opts.store, opts.parts, opts.model, opts.step, opts.days)
    end = START + opts.days * DAY
    runs = [sweep(opts.store, end) for _ in range(opts.repeat)]
    first = runs[0]
    print(
        f"END {end:.0f}: {first['rows']} rows in the window ({first['series']} series), "
        f"{first['nodes']} nodes, "
        f"{first['found']} rising"
    )
    for key in ("read", "models", "rising"):
        values = [r[key] for r in runs]
        print(
            f"  {key}: {statistics.median(values):.2f} s ("
            + ", ".join(f"{v:.2f}" for v in values)
            + ")"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak memory {peak:.0f} MiB")


if __name__ == "__main__":
    main()
