"""Validation of the rising-counter finder on planted fleets (docs/trends.md, "Validation").

For each seed: a fleet store of N nodes (default 512) of two GPU models over 28 days. Every node
has its GPUs (8), NVLinks (18 per H100, 12 per A100) and IB ports (8 and 4), each with the error
counters of node/counters.py that this bench models (KINDS): most devices never count an error;
the others have their own rate (log-normal over devices), which drifts from day to day
(log-normal, DRIFT), and their errors come in bursts (geometric sizes, mean BURST). A node's
counters are read every 5 minutes, as the health check does, and only a reading that changed
is recorded (node/counters.py): one row per 5-minute bin with errors, its delta the errors in
it. Rows go into the fleet store as `counter` records through sync.import_ndjson, the path
`collect` takes, with a daily run per node that records its GPU model.

Planted: per fleet, --planted nodes, each on one series of a random kind: from a base rate
(log-uniform in --base episodes a day) to --rise times that rate from a random onset in days
21-26. The sweep runs every --every hours from day 8 to day 28 through queries.rising_counters,
as `slurmhealth trends --now <that hour>` does.

Reported, pooled over seeds: recall within a day (the planted series flagged by a sweep in the
24 h after its onset); median hours from onset to the first flagging sweep; precision (planted
nodes flagged on their series / every node flagged by any sweep); healthy nodes flagged per
1,000 node-days swept.

Run: `.venv/bin/python bench/validate_trends.py [--seeds 4] [--nodes 512] [--rise 10]
[--base 2 20] [--every 1]`
"""

from __future__ import annotations

import argparse
import bisect
import io
import json
import math
import os
import random
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import queries, sync, trends  # noqa: E402

DAY = 86400.0
HOUR = 3600.0
START = 20_000 * DAY  # a UTC midnight
DAYS = 28
STEP = 300.0  # the health check's cadence
BURST = 3.0  # mean errors per episode (geometric)
DRIFT = 0.3  # sd of the day-to-day log-rate change of a healthy device
MODELS = {
    "NVIDIA H100 80GB HBM3": {"share": 0.6, "links": 18, "ports": 8},
    "NVIDIA A100-SXM4-80GB": {"share": 0.4, "links": 12, "ports": 4},
}
# counter: (device kind, share of devices that ever count, median episodes a day of those)
KINDS = {
    "pcie_replay": ("gpu", 0.3, 1.0),
    "ecc_sbe_volatile": ("gpu", 0.1, 0.3),
    "aer_correctable": ("gpu", 0.1, 0.5),
    "nvlink_crc": ("nvlink", 0.02, 1.0),
    "symbol_error": ("ib", 0.2, 0.5),
}


def devices(node: int, model: str, kind: str) -> list:
    spec = MODELS[model]
    if kind == "gpu":
        return [(f"gpu:0000:{0x18 + 16 * g:02x}:00.0", f"GPU {g}") for g in range(8)]
    if kind == "nvlink":
        return [
            (f"nvlink:0000:{0x18 + 16 * g:02x}:00.0:{k}", f"GPU {g} link {k}")
            for g in range(8)
            for k in range(spec["links"])
        ]
    return [(f"ib:mlx5_{p}:1", f"mlx5_{p} port 1") for p in range(spec["ports"])]


def series_rows(rng: random.Random, rate_of_day, onset: float | None = None, rise: float = 1.0):
    """(time, delta) rows of one device's counter over the month: episodes of a Poisson
    process whose rate (episodes/day) is rate_of_day(day), x rise after onset, binned to the
    5-minute readings."""
    bins: dict = {}
    for day in range(DAYS):
        t0 = START + day * DAY
        for part in ((t0, t0 + DAY),) if onset is None or not t0 < onset < t0 + DAY else (
            (t0, onset),
            (onset, t0 + DAY),
        ):
            rate = rate_of_day(day) * (rise if onset is not None and part[0] >= onset else 1.0)
            count = _poisson(rng, rate * (part[1] - part[0]) / DAY)
            for _ in range(count):
                t = rng.uniform(*part)
                size = 1 + int(math.log(rng.random()) / math.log(1 - 1 / BURST))
                reading = START + math.ceil((t - START) / STEP) * STEP
                bins[reading] = bins.get(reading, 0) + size
    return sorted(bins.items())


def _poisson(rng: random.Random, mu: float) -> int:
    if mu > 50:
        return max(0, round(rng.gauss(mu, math.sqrt(mu))))
    k, p, limit = 0, 1.0, math.exp(-mu)
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def fleet(seed: int, nodes: int, planted: int, base: tuple, rise: float) -> tuple:
    """(NDJSON lines, {node: (device, counter, onset)} planted, {node: model})."""
    rng = random.Random(seed)  # noqa: S311 - a simulation, not a secret
    names = [f"gpu{i:04d}" for i in range(nodes)]
    models = {
        n: ("NVIDIA H100 80GB HBM3" if rng.random() < 0.6 else "NVIDIA A100-SXM4-80GB")
        for n in names
    }
    plants = {}
    for node in rng.sample(names, planted):
        counter = rng.choice(sorted(KINDS))
        device = rng.choice(devices(0, models[node], KINDS[counter][0]))
        onset = START + rng.uniform(21, 26) * DAY
        rate = math.exp(rng.uniform(math.log(base[0]), math.log(base[1])))
        plants[node] = (device, counter, onset, rate)
    lines = []
    for node in names:
        for day in range(DAYS):
            sources = {"gpu": {"status": "ok", "versions": {"model": [models[node]]}}}
            lines.append(_record("run", {
                "id": f"{node}-{day}", "node": node, "phase": "check",
                "started": START + day * DAY + 60, "duration": 0.05, "verdict": "ok",
                "tool_version": "bench", "sources": json.dumps(sources),
            }))
        for counter, (kind, share, median) in KINDS.items():
            for device, label in devices(0, models[node], kind):
                plant = plants.get(node)
                if plant and plant[0] == (device, label) and plant[1] == counter:
                    rate = plant[3]
                    rows = series_rows(rng, lambda _d, r=rate: r, plant[2], rise)
                elif rng.random() < share:
                    rate = median * math.exp(rng.gauss(0, 1.0))
                    drift = [math.exp(rng.gauss(0, DRIFT)) for _ in range(DAYS)]
                    rows = series_rows(rng, lambda d, r=rate, f=drift: r * f[d])
                else:
                    continue
                value = 0
                for t, delta in rows:
                    value += delta
                    lines.append(_record("counter", {
                        "node": node, "device": device, "counter": counter, "time": t,
                        "value": value, "delta": delta, "label": label,
                    }))
    return lines, {n: (p[0][0], p[1], p[2]) for n, p in plants.items()}, models


def _record(kind: str, fields: dict) -> str:
    return json.dumps(dict(fields, type=kind))


def one(args: tuple) -> dict:
    seed, nodes, planted, base, rise, every = args
    lines, plants, _models = fleet(seed, nodes, planted, base, rise)
    with tempfile.TemporaryDirectory() as tmp:
        conn = store.connect(os.path.join(tmp, "fleet.db"))
        header = json.dumps({"type": "header", "format": sync.FORMAT})
        sync.import_ndjson(conn, io.StringIO("\n".join([header, *lines]) + "\n"))
        # What `slurmhealth trends --now T` reads (queries.rising_counters), read once: each
        # sweep takes the rows of its own 8 days.
        found, nodes = queries.rising_counters(conn, START + DAYS * DAY)
        rows = queries.counter_rows(conn, START, START + DAYS * DAY)
        models = queries.node_models(conn, sorted(_models), START + DAYS * DAY, 2 * DAY)
        times = [r[3] for r in rows]
        flagged: dict = {}
        first: dict = {}
        sweeps = 0
        t = START + 8 * DAY
        reach = max(trends.WINDOWS) + trends.BASELINE
        while t <= START + DAYS * DAY:
            sweeps += 1
            lo, hi = bisect.bisect_right(times, t - reach), bisect.bisect_right(times, t)
            found = trends.rising(rows[lo:hi], models, t)
            for f in found:
                flagged.setdefault(f["node"], set()).add((f["device"], f["counter"]))
                plant = plants.get(f["node"])
                if plant and (f["device"], f["counter"]) == plant[:2] and f["node"] not in first:
                    if t > plant[2]:
                        first[f["node"]] = t - plant[2]
            t += every * HOUR
        conn.close()
    true_flagged = {
        n for n, got in flagged.items() if n in plants and plants[n][:2] in got
    }
    return {
        "seed": seed,
        "rows": len(lines),
        "planted": len(plants),
        "within_day": sum(1 for d in first.values() if d <= DAY),
        "hours": [d / HOUR for d in first.values()],
        "flagged": len(flagged),
        "true_flagged": len(true_flagged),
        "healthy_flagged": len([n for n in flagged if n not in plants]),
        "node_days": nodes * (DAYS - 8),
        "sweeps": sweeps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--planted", type=int, default=5)
    parser.add_argument("--base", type=float, nargs=2, default=(2.0, 20.0))
    parser.add_argument("--rise", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=1.0, help="hours between sweeps")
    parser.add_argument("--detail", action="store_true", help="one line per seed")
    opts = parser.parse_args()
    jobs = [
        (s, opts.nodes, opts.planted, tuple(opts.base), opts.rise, opts.every)
        for s in range(opts.seeds)
    ]
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        results = list(pool.map(one, jobs))
    if opts.detail:
        for r in results:
            print(json.dumps({k: v for k, v in r.items() if k != "hours"}))
    planted = sum(r["planted"] for r in results)
    within = sum(r["within_day"] for r in results)
    hours = [h for r in results for h in r["hours"]]
    flagged = sum(r["flagged"] for r in results)
    true = sum(r["true_flagged"] for r in results)
    healthy = sum(r["healthy_flagged"] for r in results)
    node_days = sum(r["node_days"] for r in results)
    print(
        f"trends: {opts.seeds} fleets x {opts.nodes} nodes, {planted} planted "
        f"({opts.rise:g}x from {opts.base[0]:g}-{opts.base[1]:g} episodes/day), sweeps every "
        f"{opts.every:g} h over 20 days, {statistics.mean(r['rows'] for r in results):.0f} "
        "records per fleet"
    )
    print(
        f"  recall within a day {within / planted:.2f}; median {statistics.median(hours):.1f} h "
        f"from onset to the first flag" if hours else "  nothing flagged"
    )
    print(
        f"  precision {true / flagged if flagged else 1:.2f} ({true} of {flagged} flagged nodes); "
        f"healthy nodes flagged {healthy} ({1000 * healthy / node_days:.2f} per 1,000 node-days)"
    )


if __name__ == "__main__":
    main()
