"""Lemon signals: the fleet store turned into per-node evidence (docs/signals.md).

Counts per node (the SIGNALS of fleet/policy.py, shown as evidence) and the node's hardware
evidence items and warning items, each with the node's next passing run, from which
fleet/faults.py counts distinct faults.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from typing import Any

from slurmhealth.core.constants import LEMON
from slurmhealth.fleet import faults, peers, policy, queries, telemetry

# A loose index scan: each distinct node of a table in ~2,000 index seeks, not a full scan.
_NODES = """WITH RECURSIVE n(node) AS (
    SELECT min(node) FROM {0}
    UNION ALL
    SELECT (SELECT min(node) FROM {0} WHERE node > n.node) FROM n WHERE n.node IS NOT NULL)
    SELECT node FROM n WHERE node IS NOT NULL"""

# A node's days in service from its runs: per node and UTC day of the window, one seek of the
# (node, started, verdict) index (store migration 3) for a run that did not fail,
# queries.BATCH nodes a statement; {} is the VALUES rows' placeholders. Reading every run of
# the window instead cost 3x the time on PostgreSQL and 10x on SQLite (docs/benchmarks.md).
_RUN_DAYS = """WITH RECURSIVE days(d) AS (
    SELECT CAST(? / 86400 AS INTEGER)
    UNION ALL
    SELECT d + 1 FROM days WHERE (d + 1) * 86400 < ?),
    q(node) AS (VALUES {})
    SELECT q.node, d FROM q, days WHERE EXISTS (SELECT 1 FROM runs WHERE runs.node = q.node
        AND started >= max(?, d * 86400) AND started < min(?, (d + 1) * 86400)
        AND verdict != 'fail')"""
# Each node's failed and warning runs: the partial index of the runs that did not pass.
_RUN_VERDICTS = (
    ("check_fails", "check_warns"),
    """SELECT node, sum(verdict = 'fail'), sum(verdict = 'warn') FROM runs INDEXED BY runs_not_ok
       WHERE verdict != 'ok' AND started >= ? AND started < ? GROUP BY node""",
)
# Each node's jobs over [start, end), a range of a covering index (store migration 3) per node,
# queries.BATCH nodes a statement ({} is the VALUES rows' placeholders; a statement per node
# was 100,000 round trips at 100,000 nodes: docs/benchmarks.md): a row per node and UTC day
# with a job's start, the counts summed over the days. A job failed by hardware when its
# prolog failed, it ended NODE_FAIL, or a hardware Xid on the node names it (_XID_JOBS).
_JOBS = (
    ("jobs", "hw_job_failures", "multi_node_jobs", "multi_node_failures"),
    """WITH q(node) AS (VALUES {})
       SELECT j.node, CAST(j.start / 86400 AS INTEGER) AS d, count(*),
              sum(j.state = 'prolog_failed' OR j.slurm_state = 'NODE_FAIL'),
              sum(j.num_nodes > 1),
              sum(j.num_nodes > 1 AND j.slurm_state = 'FAILED')
       FROM q JOIN jobs j ON j.node = q.node WHERE j.start >= ? AND j.start < ?
       GROUP BY j.node, d""",
)
# The window's other jobs a hardware Xid on their node names: from the partial index of the
# failing Xids by job (store migration 3; a few), each job's row by its key, once per job. A
# probe of the Xids for every job row cost the per-node read half its time (docs/benchmarks.md).
_XID_JOBS = """SELECT DISTINCT j.node, j.job_id FROM events e
    JOIN jobs j ON j.node = e.node AND j.job_id = e.job_id
    WHERE e.class = 'fail' AND e.job_id IS NOT NULL AND j.start >= ? AND j.start < ?
    AND coalesce(j.state, '') != 'prolog_failed' AND coalesce(j.slurm_state, '') != 'NODE_FAIL'"""
# Events and actions are few: one grouped query each.
_GROUPED = (
    (
        ("hw_xids", "warn_xids"),
        """SELECT node, sum(class = 'fail'), sum(class = 'warn')
           FROM events WHERE time >= ? AND time < ? GROUP BY node""",
    ),
    (
        ("drains",),
        """SELECT node, sum(action = 'drain' AND ok = 1 AND substr(reason, 1, ?) != ?)
           FROM actions WHERE time >= ? AND time < ? GROUP BY node""",
    ),
)

# The items (fleet/faults.py), each query a range of an index. Each item's next passing run:
# one index seek per (node, time), queries.BATCH of them a statement (a round trip each cost a
# server sweep seconds: docs/benchmarks.md); {} is the VALUES rows' placeholders.
_NEXT_OK = (
    "WITH q(node, t) AS (VALUES {}) SELECT q.node, q.t, (SELECT min(started) FROM runs "
    "WHERE runs.node = q.node AND started > q.t AND started < ? AND verdict = 'ok') FROM q"
)
_XIDS = (
    "SELECT node, time, class, code FROM events WHERE time >= ? AND time < ? "
    "AND class IN ('fail', 'warn')"
)
# Each failed run with the checks that failed in it (their names are the fault's scope).
_FAILED_RUNS = (
    "SELECT node, started, (SELECT group_concat(check_name) FROM results "
    "WHERE run_id = runs.id AND status = 'fail') FROM runs INDEXED BY runs_not_ok "
    "WHERE verdict != 'ok' AND verdict = 'fail' AND started >= ? AND started < ?"
)
_DRAINS = (
    "SELECT node, time, reason FROM actions WHERE time >= ? AND time < ? "
    "AND action = 'drain' AND ok = 1"
)
_PROLOGS = (
    "SELECT node, start, job_id FROM jobs WHERE start >= ? AND start < ? "
    "AND state = 'prolog_failed'"
)
_NODE_FAILS = (
    "SELECT node, job_id, start, end, state FROM jobs "
    "WHERE start >= ? AND start < ? AND slurm_state = 'NODE_FAIL'"
)
_NODE_EVENTS = "SELECT node, start, state, reason FROM node_events WHERE start >= ? AND start < ?"

_PLACES = "SELECT node, kind, name, last FROM places"
# A partition that holds more than this share of the nodes is no place: every fault would share
# it (most sites have one partition of GPU nodes), and unrelated faults must stay each node's.
PARTITION_MAX_SHARE = 0.25
DAY = 86400

OWN_LEMON = f"slurmhealth: {LEMON}"
# What ends a bad spell (docs/lemons.md): the sweep's own drain of a lemon (the site acted on
# it: what follows is the repaired node's), or a GPU whose UUID, bus id or serial changed (a
# part replaced: the inventory check warns).
_RESETS = (
    "SELECT node, max(time), 'drained as a lemon' FROM actions WHERE time >= ? AND time < ? "
    "AND action = 'drain' AND ok = 1 AND substr(reason, 1, ?) = ? GROUP BY node",
    # from the runs that did not pass (their partial index), each one's result by its key
    "SELECT node, max(started), 'GPU replaced' FROM runs INDEXED BY runs_not_ok "
    "WHERE verdict != 'ok' AND verdict = 'warn' AND started >= ? AND started < ? "
    "AND EXISTS (SELECT 1 FROM results WHERE run_id = runs.id "
    "AND check_name = 'gpu.inventory' AND status = 'warn') GROUP BY node",
)


def _days(counts: dict, since: float | None) -> int:
    """node_days, the node's days in service: the UTC days with a run of the node that did not
    fail or the start of a job on it (a node whose history is accounting's alone still has
    days, not a floor of one; a node down, or failing its checks all day during a repair, was
    not in service), from the day of `since` (a reset) on."""
    days: set[int] = set()
    for key in ("run_days", "job_days"):
        days.update(counts.pop(key, None) or ())
    first = -1 if since is None else int(since // 86400)
    return sum(1 for d in days if d >= first)


def places(conn: sqlite3.Connection, start: float) -> dict:
    """{node: (scope, ...)}: where Slurm put each node (the places table, `collect --sacct`),
    as fault scopes ("switch:s12", "block:b3", "partition:a100"). Each kind's places the node
    was seen in from `start` on, or its last known ones (a store collected once, or a replay
    before the collect); a partition only where it holds at most PARTITION_MAX_SHARE of the
    nodes with a partition."""
    newest: dict = {}  # (node, kind): (last, [names])
    for node, kind, name, last in conn.execute(_PLACES):
        seen = newest.setdefault((node, kind), [])
        seen.append((last, name))
    members: dict = {}
    chosen: dict = {}
    for (node, kind), seen in newest.items():
        top = max(t for t, _ in seen)
        names = sorted({n for t, n in seen if t >= start or t == top})
        chosen[(node, kind)] = names
        for name in names:
            members.setdefault((kind, name), set()).add(node)
    partitioned = len({node for node, kind in chosen if kind == "partition"})
    out: dict = {}
    for (node, kind), names in sorted(chosen.items()):
        for name in names:
            big = len(members[(kind, name)]) > PARTITION_MAX_SHARE * partitioned
            if kind == "partition" and big:
                continue
            out.setdefault(node, []).append(faults.scope_key(kind, name))
    return {node: tuple(scopes) for node, scopes in out.items()}


def _nodes(conn: sqlite3.Connection, table: str) -> list:
    return [row[0] for row in conn.execute(_NODES.format(table))]


def _run_days(conn: sqlite3.Connection, start: float, end: float, nodes: list) -> dict:
    """{node: [UTC day]} of each node's days with a run that did not fail in [start, end) (the
    first and last day only from start, up to end). nodes: the nodes to read (every node of the
    runs table, or half of them: queries.halves)."""
    out: dict = {}
    for i in range(0, len(nodes), queries.BATCH):
        chunk = nodes[i : i + queries.BATCH]
        sql = _RUN_DAYS.format(", ".join("(?)" for _ in chunk))  # placeholders only
        args = (float(start), float(end), *chunk, float(start), float(end))
        for node, day in conn.execute(sql, args):
            out.setdefault(node, []).append(int(day))
    return out


def _job_days(conn: sqlite3.Connection, start: float, end: float, nodes: list) -> dict:
    """{node: [(node, UTC day, the counts of _JOBS that day)]} of each node's days with a
    job's start in [start, end). nodes: the nodes to read (every node of the jobs table, or half
    of them: queries.halves)."""
    _names, sql = _JOBS
    out: dict = {}
    for first in range(0, len(nodes), queries.BATCH):
        chunk = nodes[first : first + queries.BATCH]
        query = sql.format(", ".join("(?)" for _ in chunk))  # placeholders only
        for row in conn.execute(query, (*chunk, start, end)):
            out.setdefault(row[0], []).append(row)
    return out


class Service:
    """Each node's days in service and its jobs' counts over one window [start, end), as
    signals() reads them: runs {node: [UTC day with a run that did not fail]}, jobs {node:
    ((counts of _JOBS, summed), [UTC day with a job's start])}."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.runs: dict = {}
        self.jobs: dict = {}


def service(conn: sqlite3.Connection, windows: list, run_nodes: list | None = None) -> list:
    """[Service] of each (start, end) window, read together: the days of the span they cover
    in one sweep (one index seek per node and day, as one window's), and apart only the part
    of a day that a window's edge cuts inside the span (the report's whole-day window and the
    lemon sweep's 28 days up to now: one more seek per node, where two sweeps cost twice).
    run_nodes: every node with a run before the last window's end, when the caller read them
    (queries.heard_from); else every node of the runs table, read here."""
    lo, hi = min(s for s, _ in windows), max(e for _, e in windows)
    out = [Service(s, e) for s, e in windows]
    if run_nodes is None:
        run_nodes = _nodes(conn, "runs")
    job_nodes = _nodes(conn, "jobs")
    # each half of the nodes on its own server process (queries.halves): the sweep's seeks
    runs = queries.halves(conn, lambda c, nodes: _run_days(c, lo, hi, nodes), run_nodes)
    jobs = queries.halves(conn, lambda c, nodes: _job_days(c, lo, hi, nodes), job_nodes)
    every = (int(lo // DAY), int(-(-hi // DAY)) - 1)  # the days the sweep read
    for w in out:
        first, last = _inner((w.start, w.end), lo, hi)
        if (first, last) == every:  # the whole span: every day read is the window's
            w.runs, picked = dict(runs), dict(jobs)
        else:
            w.runs = _within(runs, first, last, lambda day: day)
            picked = _within(jobs, first, last, lambda row: row[1])
        for a, b in _edges(w.start, w.end, first, last):  # a cut day's part, read apart
            for node, days in _run_days(conn, a, b, run_nodes).items():
                w.runs[node] = w.runs.get(node, []) + days
            for node, rows in _job_days(conn, a, b, job_nodes).items():
                picked[node] = picked.get(node, []) + rows
        by_xid = _xid_jobs(conn, w.start, w.end)
        for node, rows in picked.items():
            sums = [sum(r[i] or 0 for r in rows) for i in range(2, len(_JOBS[0]) + 2)]
            sums[1] += by_xid.get(node, 0)
            w.jobs[node] = (tuple(sums), [int(r[1]) for r in rows])
    return out


def _within(found: dict, first: int, last: int, day_of: Callable[[Any], int]) -> dict:
    """{node: its items of days first..last} of found's, a node with none left out."""
    out: dict = {}
    for node, items in found.items():
        kept = [item for item in items if first <= day_of(item) <= last]
        if kept:
            out[node] = kept
    return out


def _inner(window: tuple, lo: float, hi: float) -> tuple:
    """(first, last) UTC day of a window that the span [lo, hi)'s sweep gives exactly: a day
    the window holds whole, or holds as far as the span does; a day an edge of the window
    cuts inside the span is read apart (_edges)."""
    start, end = window
    first, last = int(start // DAY), int(-(-end // DAY)) - 1
    if start != lo and start % DAY:
        first += 1
    if end != hi and end % DAY:
        last -= 1
    return first, last


def _edges(start: float, end: float, first: int, last: int) -> list:
    """The parts of days [a, b) of the window [start, end) outside its days first..last."""
    if first > last:  # no whole day: the window's own span, read alone
        return [(start, end)]
    out: list[tuple[float, float]] = []
    if start < first * DAY:
        out.append((start, first * DAY))
    if end > (last + 1) * DAY:
        out.append(((last + 1) * DAY, end))
    return out


def _xid_jobs(conn: sqlite3.Connection, start: float, end: float) -> dict:
    """{node: its jobs of [start, end) failed by a hardware Xid alone} (_XID_JOBS)."""
    out: dict = {}
    for node, _job in conn.execute(_XID_JOBS, (start, end)):
        out[node] = out.get(node, 0) + 1
    return out


def _next_ok(conn: sqlite3.Connection, wanted: set, end: float) -> dict:
    """{(node, time): the node's first passing run after `time` and before `end`, None if
    none} for each (node, time) wanted, each half on its own server process (queries.halves)."""
    return queries.halves(conn, lambda c, some: _next_ok_of(c, some, end), sorted(wanted))


def _next_ok_of(conn: sqlite3.Connection, pairs: list, end: float) -> dict:
    out: dict = {}
    for i in range(0, len(pairs), queries.BATCH):
        chunk = pairs[i : i + queries.BATCH]
        sql = _NEXT_OK.format(", ".join("(?, ?)" for _ in chunk))  # placeholders only
        for node, t, ok in conn.execute(sql, (*(v for pair in chunk for v in pair), end)):
            out[(node, t)] = ok
    return out


def _items(conn: sqlite3.Connection, counts: dict, start: float, end: float, read: Read) -> None:
    """Add each node's "faults" and "warnings" items (fleet/faults.py) to counts, in place.
    read: as _ahead's."""
    found: dict = {}  # node: [(time, kind, weight, scopes)]
    warned: dict = {}  # node: [time]

    def add(node: str, time: float, kind: str, scopes: tuple, weight: float = 1.0) -> None:
        found.setdefault(node, []).append((time, kind, weight, scopes))

    for node, t, verdict in queries.not_ok_runs(conn, start, end):
        if node in counts and verdict == "warn":
            warned.setdefault(node, []).append(t)
    for node, t, names in conn.execute(_FAILED_RUNS, (start, end)):
        if node in counts:
            checks = sorted(set(str(names).split(","))) if names else []
            add(node, t, "check", tuple(faults.scope_key("check", c) for c in checks))
    for node, t, cls, code in conn.execute(_XIDS, (start, end)):
        if cls == "fail":
            add(node, t, "xid", (faults.scope_key("xid", code),))
        else:
            warned.setdefault(node, []).append(t)
    early = start - faults.LONGEST_JOB_S
    drains: dict = {}
    for node, t, reason in conn.execute(_DRAINS, (early, end)):
        if not reason.startswith(OWN_LEMON):
            drains.setdefault(node, []).append(t)
            if t >= start:
                add(node, t, "drain", (faults.scope_key("reason", faults.own_reason(reason)),))
    for node, t, job_id in conn.execute(_PROLOGS, (start, end)):
        add(node, t, "prolog", (faults.scope_key("job", job_id),))
    downs: dict = {}
    for node, t, state, reason in conn.execute(_NODE_EVENTS, (early, end)):
        if faults.names_node(state, reason, OWN_LEMON):
            downs.setdefault(node, []).append(t)
        if t >= start and faults.is_fault_reason(reason, OWN_LEMON):
            add(node, t, "down", (faults.scope_key("reason", faults.own_reason(reason)),))
    jobs: dict = {}
    for node, job_id, begin, finish, state in conn.execute(_NODE_FAILS, (early, end)):
        jobs.setdefault(job_id, []).append((node, begin, finish, state))
    for job_id, rows in jobs.items():
        weights = faults.attribute(rows, downs, drains)
        for node, begin, finish, _state in rows:
            t = finish if finish is not None else begin
            if start <= t < end and weights.get(node):
                add(node, t, "node_fail", (faults.scope_key("job", job_id),), weights[node])
    for node, t in _ahead(conn, start, end, read):
        warned.setdefault(node, []).append(t)
    for node in set(found) | set(warned):
        if node not in counts:
            counts[node] = dict.fromkeys(policy.SIGNALS, 0)
    where = places(conn, start)
    kept: dict = {}  # node: (fault items, warning times) since its reset
    for node, c in counts.items():
        since = (c.get("reset") or {}).get("time", start)
        kept[node] = (
            sorted(i for i in found.get(node, ()) if i[0] >= since),
            sorted(t for t in warned.get(node, ()) if t >= since),
        )
    wanted = {(node, t) for node, (items, times) in kept.items() for t in times}
    wanted.update((node, i[0]) for node, (items, _) in kept.items() for i in items)
    oks = _next_ok(conn, wanted, end)
    for node, (items, times) in kept.items():
        here = where.get(node, ())
        counts[node]["faults"] = [
            (t, k, w, oks[(node, t)], scopes + here) for t, k, w, scopes in items
        ]
        counts[node]["warnings"] = [(t, "warn", 1.0, oks[(node, t)]) for t in times]


def resets(conn: sqlite3.Connection, start: float, end: float) -> dict:
    """{node: {"time", "why"}}: the latest event in [start, end) that ends the node's bad spell
    (_RESETS); its evidence starts afresh there."""
    out: dict = {}
    lemon_args = (start, end, len(OWN_LEMON), OWN_LEMON)
    for sql, args in zip(_RESETS, (lemon_args, (start, end))):
        for node, t, why in conn.execute(sql, args):
            if t is not None and t > out.get(node, {}).get("time", -1.0):
                out[node] = {"time": t, "why": why}
    return out


def _ahead(conn: sqlite3.Connection, start: float, end: float, read: Read) -> list:
    """(node, time) warnings of what comes before a failure, as of `end`: each rising error
    counter (fleet/trends.py, at the newest episode), each node slower than its peers
    (fleet/peers.py, at its newest diagnosis), both at their defaults, as `slurmhealth trends`
    and `slurmhealth slow` list them, and each node that held back telemetry.REPEAT multi-node
    jobs ended in the last telemetry.LOOKBACK (fleet/telemetry.py, at the newest such job's
    end). What `read` holds is taken as it is."""
    out: list[tuple[str, float]] = []
    if read.rising is None:
        read.rising = queries.rising_counters(conn, end, read.models)
    rising, _ = read.rising
    out.extend((f["node"], f["last"]) for f in rising if start <= f["last"] < end)
    figures = queries.diag_figures(conn, end - peers.WINDOW, end)
    last: dict = {}
    for node, t, *_ in figures:
        last[node] = max(t, last.get(node, t))
    out.extend((f["node"], last[f["node"]]) for f in peers.slow(figures) if f["node"] in last)
    held = read.held
    if held is None:
        held = queries.held_back_jobs(conn, max(start, end - telemetry.LOOKBACK), end)
    out.extend(telemetry.repeated(held))
    return [(node, t) for node, t in out if start <= t < end]


def counts(conn: sqlite3.Connection, start: float, end: float, days: Service | None = None) -> dict:
    """{node: {signal: count, "node_days": days in service, "reset": ...}} of every node with a
    run, a job, an Xid or a drain in [start, end): signals() without the fault and warning
    items and the GPU class (what a count of node-days needs). days: the window's Service,
    read with another window's (service()); read here when None. In the caller's read
    transaction."""
    out: dict = {}

    def add(node: str, names: tuple, values: tuple) -> None:
        counts = out.get(node)
        if counts is None:
            counts = out[node] = dict.fromkeys(policy.SIGNALS, 0)
        for name, value in zip(names, values):
            if name:
                counts[name] = value or 0

    if days is None:
        days = service(conn, [(start, end)])[0]
    elif (days.start, days.end) != (start, end):
        raise ValueError("the days read are another window's")
    for node, run_days in days.runs.items():
        add(node, ("run_days",), (run_days,))
    verdict_names, verdict_sql = _RUN_VERDICTS
    for node, *values in conn.execute(verdict_sql, (start, end)):
        add(node, verdict_names, values)
    job_names, _ = _JOBS
    for node, (sums, job_days) in days.jobs.items():
        add(node, (*job_names, "job_days"), (*sums, job_days))
    (xid_names, xid_sql), (drain_names, drain_sql) = _GROUPED
    for node, *values in conn.execute(xid_sql, (start, end)):
        add(node, xid_names, values)
    for node, *values in conn.execute(drain_sql, (len(OWN_LEMON), OWN_LEMON, start, end)):
        add(node, drain_names, values)
    for node, reset in resets(conn, start, end).items():
        if node in out:
            out[node]["reset"] = reset
    for c in out.values():
        c["node_days"] = _days(c, (c.get("reset") or {}).get("time"))
    return out


@dataclasses.dataclass
class Read:
    """What a caller read already in the same read transaction, taken as it is by signals()
    over [start, end) (the report reads them for its own sections too): held, the held-back jobs as
    queries.held_back_jobs gives them for (max(start, end - telemetry.LOOKBACK), end); models,
    {node: GPU model} over queries.MODEL_LOOKBACK before `end` (used where the window is that
    long); rising, queries.rising_counters as of `end`; days, the window's Service (as
    counts')."""

    held: list | None = None
    models: dict | None = None
    rising: tuple | None = None
    days: Service | None = None


def signals(
    conn: sqlite3.Connection, start: float, end: float, read: Read | None = None
) -> dict:
    """{node: {signal: count, "faults": items, "warnings": items, "gpu_class": GPU model or ""}}
    for every node with any record in [start, end), per docs/signals.md; application Xids and
    ordinary job failures count nowhere.

    One read transaction: a consistent snapshot while collect writes. read: as Read's.
    """
    read = read or Read()
    with queries.snapshot(conn):
        out = counts(conn, start, end, read.days)
        # each node's hardware class, which the lemon policy pools apart where classes differ:
        # the model its runs of the last 2 days recorded (versions come every 6 h; reading the
        # whole window for a node that recorded none read every run it had: CHANGELOG.md).
        # Read once: the rising counters compare nodes by the same models.
        lookback = min(end - start, queries.MODEL_LOOKBACK)
        same = lookback == queries.MODEL_LOOKBACK
        known = read.models if same else None
        models = queries.node_models(conn, sorted(out), end, lookback, known)
        _items(conn, out, start, end, Read(read.held, models if same else None, read.rising))
        models = queries.node_models(conn, sorted(out), end, lookback, models)
        for node, model in models.items():
            out[node]["gpu_class"] = model
    return {node: out[node] for node in sorted(out)}
