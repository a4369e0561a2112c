"""Lemons judged by what they predict: the next 28 days' faults on the nodes each sweep flags.

A sweep every 7 days scores the 28 days before it (policy.score, exactly as `slurmhealth
lemons --now T` over a store holding the same records) and, beside it, the plain per-node
Poisson test: each node's faults against the fleet's pooled rate times its days in service,
p below the same budget (fp_per_node_month x 28 / 30.44), no floor, no minimum, no incident
filter. Every sweep is then scored on the following 28 days' faults (the node's own: an
incident's faults, where the record knows them, are nobody's). Reported per fleet, pooled over
seeds, for both tests:

- node-windows flagged, and the next-window faults on them;
- the rate ratio: next-window faults per node-day in service on flagged node-windows over the
  same on the rest (how much more a flagged node fails next);
- the share of all next-window faults that fell on flagged nodes;
- where the record plants lemons: recall (lemons flagged by some sweep while bad) and
  precision (flagged node-windows of a node bad at that sweep);
- for the records, how flags age: the same rate ratio for ours in days 0-7, 7-28, 28-56 and
  56-112 after each sweep (a repaired lemon fails like the rest).

The fleets: bench/fleet_records.py (record models written apart from the simulator, each with
assumptions of its own, and the real LANL record when its CSV is given), and each model of
bench/validate_lemons.py (slurmhealth's simulator, 84 days, 5 lemons at k = 30), whose plain
test is validate_lemons.baseline (hardware-failed jobs per job). docs/lemons.md has the
figures and what each model assumes.

Run: `.venv/bin/python bench/validate_predictive.py [--seeds 4] [--records all|NAME,...]
[--sim all|NAME,...|none] [--lanl PATH] [--systems 18,19,20]`
"""

from __future__ import annotations

import argparse
import math
import os
import sqlite3
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fleet_records  # noqa: E402
import validate_lemons  # noqa: E402

from sim import simulate  # noqa: E402
from slurmhealth.core import store  # noqa: E402
from slurmhealth.fleet import lemons, policy  # noqa: E402

DAY = 86400.0
WINDOW = 28 * DAY
STEP = 7 * DAY
SIM_DAYS = 84
SIM_K = 30
REPLACED = "gpu replaced"  # a record's cause that is a repair: the evidence starts afresh


def ln_cut(days: float = 28.0) -> float:
    return validate_lemons.ln_budget({}, days)


# --- a record's signals (docs/signals.md) ---------------------------------------------------


def _down(record: dict, node: str) -> list:
    """The node's spans out of service: its out spans and its faults' repairs, sorted."""
    spans = list(record["nodes"][node]["out"])
    spans += [(f["start"], f["end"]) for f in record["by_node"].get(node, ())]
    return sorted(spans)


def service_days(down: list, t0: float, t1: float) -> set:
    """UTC days in [t0, t1) on which the node was in service at some time (a passing health
    check that day: what node_days counts over a store)."""
    days: set = set()
    at = t0
    for a, b in down + [(t1, t1)]:
        if a > at:
            lo, hi = at, min(a, t1)
            if hi > lo:
                days.update(range(int(lo // DAY), int((hi - 1e-6) // DAY) + 1))
        at = max(at, b)
        if at >= t1:
            break
    return days


def service_time(down: list, t0: float, t1: float) -> float:
    """Days in service in [t0, t1) (for the rate ratio's denominators)."""
    busy, at = 0.0, t0
    for first, last in down:
        a, b = max(first, at), min(last, t1)
        if b > a:
            busy += b - a
            at = b
    return max(0.0, t1 - t0 - busy) / DAY


def record_signals(record: dict, t0: float, t1: float) -> dict:
    """{node: signals} of the record's window [t0, t1), as a store that recorded it gives
    them: each fault one item (a node event) with its scopes, its end the next passing run;
    days in service; a replaced GPU's fault ends its bad spell (a reset)."""
    out = {}
    for node, info in record["nodes"].items():
        down = record["down"][node]
        days = service_days(down, t0, t1)
        mine = [f for f in record["by_node"].get(node, ()) if t0 <= f["start"] < t1]
        if not days and not mine:
            continue
        sig = dict.fromkeys(policy.SIGNALS, 0)
        fixed = [f["end"] for f in mine if f["cause"] == REPLACED and f["end"] < t1]
        reset = max(fixed, default=None)
        if reset is not None:
            sig["reset"] = {"time": reset, "why": "GPU replaced"}
            mine = [f for f in mine if f["start"] >= reset]
            days = {d for d in days if d >= reset // DAY}
        sig["node_days"] = len(days)
        sig["faults"] = [
            (f["start"], "down", 1.0, f["end"] if f["end"] < t1 else None, tuple(f["scopes"]))
            for f in mine
        ]
        sig["warnings"] = []
        sig["gpu_class"] = info.get("class", "")
        out[node] = sig
    return out


def plain_test(signals: dict, cut: float) -> set:
    """The plain per-node Poisson test of a record: faults (every one, none left out) against
    the pooled rate times the node's days in service; no floor, no minimum."""
    counts = {n: len(s["faults"]) for n, s in signals.items()}
    days = {n: max(s["node_days"], 1) for n, s in signals.items()}
    rate = sum(counts.values()) / sum(days.values()) if days else 0.0
    return {n for n, c in counts.items() if c and policy.ln_poisson_sf(c, rate * days[n]) < cut}


def _prepare(record: dict) -> dict:
    record["by_node"] = {}
    for f in record["faults"]:
        record["by_node"].setdefault(f["node"], []).append(f)
    record["down"] = {n: _down(record, n) for n in record["nodes"]}
    return record


def _sweeps(start: float, end: float) -> list:
    return [t for t in _frange(start + WINDOW, end - WINDOW + 1) if t + WINDOW <= end]


def _frange(lo: float, hi: float) -> list:
    out, t = [], lo
    while t < hi:
        out.append(t)
        t += STEP
    return out


def _bad_at(spans: list, t: float) -> bool:
    return any(a <= t < b for a, b in spans)


def score_record(record: dict) -> dict:
    """Weekly sweeps over a record: the tally for ours and the plain test."""
    record = _prepare(record)
    tally = _empty()
    own = [f for f in record["faults"] if not f["shared"]]
    lemons = record.get("lemons") or {}
    for t in _sweeps(record["start"], record["end"]):
        signals = record_signals(record, t - WINDOW, t)
        flagged = {
            "ours": {r["node"] for r in policy.score(signals) if r["lemon"]},
            "plain": plain_test(signals, ln_cut()),
        }
        nxt: dict = {}
        for f in own:
            if t <= f["start"] < t + WINDOW:
                nxt[f["node"]] = nxt.get(f["node"], 0) + 1
        days = {n: service_time(record["down"][n], t, t + WINDOW) for n in record["nodes"]}
        bad = {n for n, spans in lemons.items() if _bad_at(spans, t)}
        _add(tally, flagged, nxt, days, bad)
        _age(tally["age"], record, own, t, flagged["ours"])
    tally["lemons"] = len(lemons)
    return tally


# How a flag ages: the weeks after a sweep, each span's faults per node-day in service on the
# nodes that sweep flagged against the rest (a lemon that was repaired fails like the rest).
AGES = ((0, 7), (7, 28), (28, 56), (56, 112))


def _age(ages: dict, record: dict, own: list, t: float, flagged: set) -> None:
    """One sweep's flagged nodes and the rest, in each span of AGES after it (within the
    record): {(a, b): {"flagged": [faults, days], "rest": [...]}} added in place."""
    for a, b in AGES:
        lo, hi = t + a * DAY, t + b * DAY
        if hi > record["end"]:
            continue
        cell = ages.setdefault((a, b), {"flagged": [0, 0.0], "rest": [0, 0.0]})
        for f in own:
            if lo <= f["start"] < hi:
                cell["flagged" if f["node"] in flagged else "rest"][0] += 1
        for n in record["nodes"]:
            side = "flagged" if n in flagged else "rest"
            cell[side][1] += service_time(record["down"][n], lo, hi)


def age_row(name: str, t: dict) -> str:
    """The rate ratio flagged / rest in each span of AGES after the sweep ('-': none)."""
    cells = [name]
    for span in AGES:
        cell = t["age"].get(span)
        if not cell or not cell["flagged"][1] or not cell["rest"][0]:
            cells.append("-")
            continue
        (f, fd), (r, rd) = cell["flagged"], cell["rest"]
        cells.append(f"{f / fd / (r / rd):.1f} ({f})")
    return "| " + " | ".join(cells) + " |"


AGE_HEADER = (
    "| fleet | " + " | ".join(f"days {a}-{b}" for a, b in AGES) + " |\n"
    "|---|" + "---|" * len(AGES)
)


# --- a record written to a fleet store, swept as `slurmhealth lemons --now T` -------------


def _in_service(down: list, t0: float, t1: float) -> list:
    """The spans in [t0, t1) outside `down` (sorted)."""
    out, at = [], t0
    for a, b in down + [(t1, t1)]:
        if a > at:
            out.append((at, min(a, t1)))
        at = max(at, b)
        if at >= t1:
            break
    return out


def _run(node: str, n: int, verdict: str, at: float, check: str | None = None) -> list:
    """A health check's rows: the run, and its check's result when one is named."""
    rid = f"{node}:rec:{n}"
    rows = [("runs", {"id": rid, "node": node, "phase": "healthcheck", "started": at,
                      "duration": 0.1, "verdict": verdict, "tool_version": "record"})]
    if check:
        status = "warn" if verdict == "warn" else "fail"
        rows.append(("results", {"run_id": rid, "check_name": check, "status": status,
                                 "message": check, "action": "none"}))
    return rows


def record_rows(record: dict) -> list:
    """(table, row dict) of a fleet store that recorded the record: a passing health check
    when each in-service span begins (a fault's end: its next passing run) and at each UTC
    midnight within it, a failing one with the fault's cause as its failed check where each
    fault starts, for a replaced GPU a warning of the gpu.inventory check at its end, and the
    node's racks and switches as places."""
    out: list = []
    for node in sorted(record["nodes"]):
        runs = []
        for a, b in _in_service(record["down"][node], record["start"], record["end"]):
            runs.append(("ok", a, None))
            midnight = (a // DAY + 1) * DAY
            while midnight < b:
                runs.append(("ok", midnight, None))
                midnight += DAY
        for f in record["by_node"].get(node, ()):
            runs.append(("fail", f["start"], f["cause"]))
            if f["cause"] == REPLACED and f["end"] < record["end"]:
                runs.append(("warn", f["end"] - 1e-3, "gpu.inventory"))
        for n, (verdict, at, check) in enumerate(runs):
            out += _run(node, n, verdict, at, check)
        # its places (racks, switches) as `collect --sacct` stores where Slurm puts a node
        for scope in sorted({s for f in record["by_node"].get(node, ()) for s in f["scopes"]}):
            kind, _, name = scope.partition(":")
            if kind in ("rack", "switch"):
                out.append(("places", {"node": node, "kind": kind, "name": name,
                                       "first": record["start"], "last": record["start"]}))
    return out


def write_record(record: dict, conn: sqlite3.Connection) -> int:
    """Write the record's rows into a fleet store; how many."""
    rows = 0
    with store.immediate(conn):
        for table, values in record_rows(record):
            conn.execute(store.insert_sql(table), store.row(table, values))
            rows += 1
    return rows


def store_sweeps(record: dict) -> dict:
    """{sweep time: set of lemons} from a fleet store holding the record, each sweep as
    `slurmhealth lemons --now T --window 28d` scores it (fleet/lemons.py sweep)."""
    record = _prepare(record)
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        conn = store.connect(os.path.join(tmp, "fleet.db"))
        write_record(record, conn)
        out = {}
        for t in _sweeps(record["start"], record["end"]):
            out[t] = {e["node"] for e in lemons.sweep(conn, t, WINDOW) if e["lemon"]}
        conn.close()
    return out


def record_sweeps(record: dict) -> dict:
    """{sweep time: set of lemons} from record_signals, as score_record sweeps."""
    record = _prepare(record)
    return {
        t: {r["node"] for r in policy.score(record_signals(record, t - WINDOW, t)) if r["lemon"]}
        for t in _sweeps(record["start"], record["end"])
    }


# --- the simulator's models (bench/validate_lemons.py) --------------------------------------


def score_sim(job: tuple) -> dict:
    """One simulated fleet of a validate_lemons model, 84 days, swept weekly from day 28."""
    model, seed = job
    fields = validate_lemons.MODELS[model][1]
    fleet = simulate.Fleet(nodes=validate_lemons.NODES, days=SIM_DAYS, seed=seed, **fields)
    fleet.lemons = simulate.pick_lemons(fleet, validate_lemons.LEMONS, SIM_K)
    history = simulate.events(fleet)
    tally = _empty()
    for t in _sweeps(fleet.start, fleet.end):
        signals = simulate.signals(history, t - WINDOW, t)
        flagged = {
            "ours": {r["node"] for r in policy.score(signals) if r["lemon"]},
            "plain": validate_lemons.baseline(signals, ln_cut()),
        }
        nxt = {
            n: sum(t <= x < t + WINDOW for x in times) for n, times in history.faults.items()
        }
        days = dict.fromkeys(history.names, WINDOW / DAY)
        _add(tally, flagged, nxt, days, set(fleet.lemons))
    tally["lemons"] = len(fleet.lemons)
    return tally


# --- the tally ------------------------------------------------------------------------------

GROUPS = ("both", "ours", "plain", "neither")  # which test flagged a node-window


def _empty() -> dict:
    out: dict = {g: {"windows": 0, "faults": 0, "days": 0.0, "true": 0} for g in GROUPS}
    out["found"] = {"ours": set(), "plain": set()}
    out["lemons"] = 0
    out["age"] = {}
    return out


def _add(tally: dict, flagged: dict, nxt: dict, days: dict, bad: set) -> None:
    """One sweep: each node-window into its group, with its next-window faults and days."""
    for node, d in days.items():
        ours, plain = node in flagged["ours"], node in flagged["plain"]
        group = ("both" if plain else "ours") if ours else ("plain" if plain else "neither")
        g = tally[group]
        g["windows"] += 1
        g["faults"] += nxt.get(node, 0)
        g["days"] += d
        g["true"] += node in bad
        for name, hit in (("ours", ours), ("plain", plain)):
            if hit and node in bad:
                tally["found"][name].add(node)


def merge(tallies: list) -> dict:
    out = _empty()
    for i, t in enumerate(tallies):
        for g in GROUPS:
            for key, value in t[g].items():
                out[g][key] += value
        for name in ("ours", "plain"):  # lemons are counted per fleet
            out["found"][name] |= {(i, n) for n in t["found"][name]}
        out["lemons"] += t["lemons"]
        for span, cell in t.get("age", {}).items():
            mine = out["age"].setdefault(span, {"flagged": [0, 0.0], "rest": [0, 0.0]})
            for side in ("flagged", "rest"):
                mine[side][0] += cell[side][0]
                mine[side][1] += cell[side][1]
    return out


def _sum(t: dict, groups: tuple) -> dict:
    return {k: sum(t[g][k] for g in groups) for k in ("windows", "faults", "days", "true")}


def _rate(part: dict) -> float:
    return part["faults"] / part["days"] if part["days"] else math.nan


def figures(t: dict, name: str) -> dict:
    """A test's figures: its flagged node-windows (both + its own) against the rest."""
    mine = _sum(t, ("both", name))
    rest = _sum(t, tuple(g for g in GROUPS if g not in ("both", name)))
    total = mine["faults"] + rest["faults"]
    return {
        "windows": mine["windows"],
        "faults": mine["faults"],
        "ratio": _rate(mine) / _rate(rest) if _rate(rest) else math.inf,
        "share": mine["faults"] / total if total else math.nan,
        "recall": len(t["found"][name]) / t["lemons"] if t["lemons"] else None,
        "precision": mine["true"] / mine["windows"] if t["lemons"] and mine["windows"] else None,
    }


def _f(x: float | None, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if x == math.inf else format(x, spec)


def _alone(t: dict, group: str) -> str:
    """A group flagged by one test alone: windows, next faults, rate vs the unflagged."""
    g, rest = t[group], t["neither"]
    ratio = _rate(g) / _rate(rest) if _rate(rest) else math.nan
    return f"{g['windows']} / {g['faults']} / {_f(ratio, '.1f')}"


def row(name: str, t: dict) -> str:
    ours, plain = figures(t, "ours"), figures(t, "plain")
    cells = [name]
    for key, spec in (("windows", "d"), ("faults", "d"), ("ratio", ".1f"), ("share", ".2f")):
        cells.append(f"{_f(ours[key], spec)} ({_f(plain[key], spec)})")
    cells.append(f"{_f(ours['recall'])} ({_f(plain['recall'])})")
    cells.append(f"{_f(ours['precision'])} ({_f(plain['precision'])})")
    cells += [_alone(t, "ours"), _alone(t, "plain")]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| fleet | node-windows flagged | next-window faults on them | rate ratio flagged / rest "
    "| share of next-window faults | recall of planted lemons | precision "
    "| flagged by ours alone: windows / faults / rate vs unflagged | by the plain test alone |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def _record_job(job: tuple) -> dict:
    name, seed = job
    return score_record(fleet_records.MODELS[name][1](seed))


def _lanl_job(job: tuple) -> dict:
    path, system, categories = job
    return score_record(fleet_records.load_lanl(path, system, categories))


def _pick(text: str, names: list) -> list:
    if text == "none":
        return []
    return list(names) if text == "all" else text.split(",")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--records", default="all", help="record models (all, none or names)")
    ap.add_argument("--sim", default="all", help="validate_lemons models (all, none or names)")
    ap.add_argument("--lanl", default=None, help="the LANL failure data CSV (LA-UR-05-7318)")
    ap.add_argument("--systems", default="18,19,20")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    began = time.time()
    lines = [HEADER]
    ages = [AGE_HEADER]
    with ProcessPoolExecutor(args.workers) as pool:
        for name in _pick(args.records, list(fleet_records.MODELS)):
            jobs = [(name, seed) for seed in range(1, args.seeds + 1)]
            merged = merge(list(pool.map(_record_job, jobs)))
            lines.append(row(f"{name} ({args.seeds} seeds)", merged))
            ages.append(age_row(name, merged))
            print(lines[-1], flush=True)
        if args.lanl:
            for system in args.systems.split(","):
                for label, cats in (("all causes", None), ("hardware", ("Hardware",))):
                    job = (args.lanl, system, cats or fleet_records.LANL_CATEGORIES)
                    merged = merge([_lanl_job(job)])
                    lines.append(row(f"LANL system {system}, {label}", merged))
                    ages.append(age_row(f"LANL system {system}, {label}", merged))
                    print(lines[-1], flush=True)
        for name in _pick(args.sim, list(validate_lemons.MODELS)):
            jobs = [(name, seed) for seed in range(1, args.seeds + 1)]
            merged = merge(list(pool.map(score_sim, jobs)))
            lines.append(row(f"sim {name} ({args.seeds} seeds)", merged))
            print(lines[-1], flush=True)
    print()
    print("\n".join(lines))
    print("\nHow flags age: rate ratio flagged / rest (flagged nodes' faults) in each span "
          "after the sweep\n")
    print("\n".join(ages))
    print(f"\n({time.time() - began:.0f} s; ours, the plain test in brackets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
