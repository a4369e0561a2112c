"""Rollup: old passing health checks counted per node-hour in the fleet store (docs/fleet.md)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from slurmhealth.core import store
from slurmhealth.fleet import records

# ---------------------------------------------------------------------------------------------
# rollup

# Passing health checks rolled up into per-node hourly counts after a set age (docs/fleet.md).
#
# A 10,000-node fleet with a health check every 5 minutes records 2.9M runs a day, nearly all of
# them passing: kept as rows, a month is ~30 GB. After `before` (collect --rollup-after 2d), each
# node-hour in which every run of the node passed, none with a result, an Xid or a counter
# reading, keeps its first passing health check as a row and counts the others in `run_hours`
# (how many, their total wall time). Every failure, warning and job run (prolog, epilog) stays a
# row, and so does every health check that recorded the node's versions (its sources hold
# "versions": node/runner.py records them every 6 h or on a change, by whichever run is due):
# they are the node's driver and firmware history that the report's configuration drift reads
# (queries.version_sources), never counted, never removed. What the readers need stays exact:
# a node's days with a run, its first passing run after any time (the hour's first passing run
# is kept, and an hour with anything but passes is not rolled up), and its version records;
# run counts add `run_hours` by the hour (each run is kept or counted, once).
HOUR = 3600
DAY = 86400
# Node-hours one collect rolls up (`collect --rollup-max`): a 10,000-node fleet adds 834 per
# 5-minute cycle, so this keeps up with 30,000 nodes; a cycle of 2,500 costs a fraction of a
# whole 10,000-node hour's rollup in one cycle (docs/benchmarks.md).
ROLLUP_MAX = 2500
# Whole hours a bounded rollup may be behind before collect says so: one hour is due each
# hour, and a large fleet's takes a few cycles.
ROLLUP_BEHIND = 2
# An Xid is recorded by the run that read it from the kernel log, at most this long after it
# happened (the first health check after a boot reads the boot's backlog).
EVENT_LAG_S = DAY

# Per node-hour: how many of its passing health checks may be folded (`runs`: none that recorded
# versions) and their total wall time, how many recorded versions, when its first one started.
# Whether a run recorded versions is read once per run: the subquery's LIMIT -1 (no limit)
# keeps SQLite from flattening it into the aggregate, which would test each run twice.
_ROLL_HOURS = """CREATE TEMP TABLE roll AS
SELECT node, hour, sum(plain) AS runs, sum(plain * duration) AS duration,
       count(*) - sum(plain) AS versions, min(started) AS first
FROM (SELECT u.node, CAST(u.started / 3600 AS INTEGER) * 3600 AS hour, u.started, u.duration,
             CASE WHEN instr(u.sources, '"versions"') THEN 0 ELSE 1 END AS plain
      FROM temp.batch b CROSS JOIN runs u INDEXED BY runs_node_started_verdict
      WHERE u.node = b.node AND u.started >= :lo AND u.started < :hi
      AND u.phase = 'healthcheck' LIMIT -1)
GROUP BY node, hour"""
# Node-hours with a run that must stay whole: not passing, or with a result that is not a skip,
# an Xid or a counter. A skip ("no NVLink on this GPU", "fabric state not reported") is stored
# with nearly every run of a real node, the same each time: it says nothing the hour's first
# run (kept, with its own) does not, and when skips kept hours whole nothing was ever rolled up
# (the simulator's passing runs have no results, so its fleets did not show it). The runs
# folded take their skips with them (_FOLDED, _fold). Each hour's own runs are read, by
# (node, started): the list of such hours built at once had a server's planner read a whole
# day of the node's runs for each of its hours.
_KEEP = """DELETE FROM temp.roll WHERE EXISTS (
    SELECT 1 FROM runs u INDEXED BY runs_node_started_verdict
    WHERE u.node = roll.node AND u.started >= roll.hour AND u.started < roll.hour + 3600
    AND (u.verdict != 'ok'
        OR EXISTS (SELECT 1 FROM results WHERE run_id = u.id AND status != 'skip')
        OR u.id IN (SELECT run_id FROM events WHERE time >= :lo - :lag AND time < :hi)
        OR u.id IN (SELECT run_id FROM counters WHERE time >= :lo - :lag AND time < :hi + 3600)))"""
_KEPT_RUN = """ALTER TABLE temp.roll ADD COLUMN keep TEXT"""
# The hour's first health check stays a row; `runs` and `duration` become what the hour's
# run_hours gains: the runs that may be folded less that one (unless it recorded versions, so
# was never among them). By (node, started), named: the planner took (started, phase), which
# reads every node's health check of that second where a fleet's checks start together (for
# 10,000 nodes' hour: CHANGELOG.md).
_PICK = """UPDATE temp.roll SET (keep, runs, duration) = (
    SELECT runs.id, roll.runs - CASE WHEN instr(runs.sources, '"versions"') THEN 0 ELSE 1 END,
           roll.duration
           - (CASE WHEN instr(runs.sources, '"versions"') THEN 0 ELSE runs.duration END)
    FROM runs INDEXED BY runs_node_started_verdict
    WHERE runs.node = roll.node AND runs.started = roll.first
    AND runs.phase = 'healthcheck' ORDER BY runs.id LIMIT 1)"""
_COUNT = """INSERT INTO run_hours (node, hour, phase, runs, duration)
SELECT node, hour, 'healthcheck', runs, duration FROM temp.roll WHERE runs > 0
ON CONFLICT (node, hour, phase) DO UPDATE SET runs = run_hours.runs + excluded.runs,
    duration = run_hours.duration + excluded.duration"""
# The runs that recorded versions in the hours to fold (few hours have one: a node's every 6 h).
# Found here, not by the DELETE: any function in a DELETE of many rows has SQLite keep a
# statement journal inside the transaction (a function may fail midway), and the DELETE took
# ~1.4x as long.
_VERSIONED = """CREATE TEMP TABLE versioned AS
SELECT u.rowid AS id FROM temp.batch b CROSS JOIN runs u INDEXED BY runs_node_started_verdict
    CROSS JOIN temp.roll r
WHERE u.node = b.node AND u.started >= :lo AND u.started < :hi AND u.phase = 'healthcheck'
    AND r.node = u.node AND r.hour = CAST(u.started / 3600 AS INTEGER) * 3600
    AND r.versions > 0 AND r.runs > 0 AND instr(u.sources, '"versions"')"""
# The runs to fold: rowid and id, so their skip results go too, then the runs. Read as the
# roll's were, each batch node's runs of the range, joined to their hour by name and hour (a
# join on the hour's range let a server's planner read every run of the nodes).
_FOLDED = """CREATE TEMP TABLE folded AS
SELECT u.rowid AS rid, u.id AS id
FROM temp.batch b CROSS JOIN runs u INDEXED BY runs_node_started_verdict CROSS JOIN temp.roll r
WHERE u.node = b.node AND u.started >= :lo AND u.started < :hi AND u.phase = 'healthcheck'
    AND r.node = u.node AND r.hour = CAST(u.started / 3600 AS INTEGER) * 3600
    AND r.runs > 0 AND u.id != r.keep AND u.rowid NOT IN (SELECT id FROM temp.versioned)"""
_FOLD_RESULTS = "DELETE FROM results WHERE run_id IN (SELECT id FROM temp.folded)"
_FOLD_RUNS = "DELETE FROM runs WHERE rowid IN (SELECT rid FROM temp.folded)"
# A passing health check imported into an hour already rolled up (an old export imported
# again, `collect --full`) is one of the runs that hour counts: it goes, unless it is the
# hour's first (the one kept) or recorded versions (never counted: it stays). The runs merged
# since the mark are found first, by rowid, in a subquery its LIMIT keeps whole: a server's
# planner without statistics yet (a store just written) otherwise started from every
# run_hours row, at each step. `rowid <= :top` (the highest now) is always true: it is there
# for that planner, which reads a bounded range as narrow and an open one as a third of the
# table.
_LATE = """CREATE TEMP TABLE folded AS SELECT rid, id FROM (
    SELECT rowid AS rid, id, node, started, sources FROM runs
    WHERE rowid > :rowid AND rowid <= :top AND started < :until AND verdict = 'ok'
    AND phase = 'healthcheck' LIMIT :all) AS fresh
    WHERE NOT instr(sources, '"versions"')
    AND EXISTS (SELECT 1 FROM run_hours h WHERE h.node = fresh.node AND h.phase = 'healthcheck'
                AND h.hour = CAST(fresh.started / 3600 AS INTEGER) * 3600)
    AND NOT EXISTS (SELECT 1 FROM results WHERE run_id = fresh.id AND status != 'skip')
    AND EXISTS (SELECT 1 FROM runs f WHERE f.node = fresh.node AND f.phase = 'healthcheck'
                AND f.started >= CAST(fresh.started / 3600 AS INTEGER) * 3600
                AND (f.started < fresh.started
                     OR (f.started = fresh.started AND f.id < fresh.id)))"""


# The next nodes after :after, in name order, :n of them (ALL: all): one seek each into the
# (node, started, verdict) index. A node with no run in the hour costs its seek and no more.
# The walk is a co-routine: it stops when the outer LIMIT has its rows.
ALL = 1 << 62  # a LIMIT no fleet reaches (PostgreSQL takes no negative one)
_BATCH = """CREATE TEMP TABLE batch AS WITH RECURSIVE walk(node) AS (
    SELECT (SELECT min(node) FROM runs WHERE node > :after)
    UNION ALL SELECT (SELECT min(node) FROM runs WHERE node > walk.node)
    FROM walk WHERE walk.node IS NOT NULL)
SELECT node FROM walk WHERE node IS NOT NULL LIMIT :n"""


def rollup(conn: sqlite3.Connection, before: float, limit: int | None = None) -> dict:
    """Roll up the passing health checks of the whole hours before `before` not rolled up yet:
    all of them (a day per transaction), or at most `limit` node-hours, oldest hour first, its
    nodes in name order (an hour per transaction; the next call goes on where this one stopped).
    {"runs": runs folded, "hours": node-hours they went into, "late": runs imported again into
    hours already rolled up and removed, "behind": whole hours before `before` still to do}.
    StoreError (one line) when the store cannot be written."""
    try:
        # a 10,000-node hour dirties more pages than the default cache holds
        with records.bulk(conn):
            return _rollup(conn, before, limit)
    except sqlite3.Error as exc:
        raise store.StoreError(str(exc)) from None


def _rollup(conn: sqlite3.Connection, before: float, limit: int | None) -> dict:
    until = int(before // HOUR) * HOUR
    out = {"runs": 0, "hours": 0, "late": 0}
    with store.immediate(conn):
        out["late"] = _late(conn, *_rolled(conn, until))
    budget = limit
    while budget is None or budget > 0:
        # Where the last step stopped, read in this step's transaction: a second collect
        # rolling up at the same time goes on from there (a node-hour rolled up twice is
        # left as it was: its kept run is all there is to fold).
        with store.immediate(conn), _temp_tables(conn, "batch"):
            lo, after, rowid = _rolled(conn, until)
            if lo >= until:
                break
            # Runs another collect merged between two steps (its write came between them):
            # those in hours rolled up already go, before the mark moves past them.
            out["late"] += _late(conn, lo, after, rowid)
            # Unbounded and at an hour's start: up to a day of every node at once. Else one
            # hour, as many nodes as the budget allows.
            hi = min(until, (lo // DAY + 1) * DAY) if budget is None and not after else lo + HOUR
            want = -1 if budget is None else budget
            conn.execute(_BATCH, {"after": after, "n": want if want >= 0 else ALL})
            nodes, last = conn.execute("SELECT count(*), max(node) FROM temp.batch").fetchone()
            folded, hours = _rollup_range(conn, lo, hi) if nodes else (0, 0)
            if budget is not None:
                budget -= max(1, nodes)
            if want < 0 or nodes < want:  # the hours' last nodes done
                lo, after = hi, ""
            else:
                after = last
            top = conn.execute("SELECT max(rowid) FROM runs").fetchone()[0] or 0
            store.set_meta(conn, "rollup", {"until": lo, "after": after, "rowid": top})
        out["runs"] += folded
        out["hours"] += hours
    out["behind"] = max(0, int(until - _rolled(conn, until)[0]) // HOUR)
    return out


def _rolled(conn: sqlite3.Connection, until: float) -> tuple:
    """Where the rollup stopped: (the first hour not wholly rolled up, the last node done in it
    or "", the highest run rowid then: 0 before any rollup)."""
    done = store.get_meta(conn, "rollup")
    if not isinstance(done, dict):  # none yet (rollup() writes only dicts)
        done = {}
    lo = done.get("until")
    if lo is None:
        first = conn.execute("SELECT min(started) FROM runs").fetchone()[0]
        lo = int(first // HOUR) * HOUR if first is not None else until
    return lo, str(done.get("after") or ""), done.get("rowid", 0) if done.get("until") else 0


def _rollup_range(conn: sqlite3.Connection, lo: float, hi: float) -> tuple:
    """Roll up [lo, hi) of the nodes in temp.batch inside the caller's transaction: (runs
    folded, node-hours)."""
    args = {"lo": lo, "hi": hi, "lag": EVENT_LAG_S}
    with _temp_tables(conn, "roll", "versioned", "folded"):
        conn.execute(_ROLL_HOURS, args)
        conn.execute(_KEEP, args)
        conn.execute(_KEPT_RUN)
        conn.execute(_PICK)
        hours = conn.execute(_COUNT).rowcount
        conn.execute(_VERSIONED, args)
        conn.execute(_FOLDED, args)
        folded = _fold(conn)
    return folded, hours


@contextlib.contextmanager
def _temp_tables(conn: sqlite3.Connection, *names: str) -> Iterator:
    """The rollup's temp tables, dropped before (a run that died left them) and after."""
    for name in names:
        conn.execute(f"DROP TABLE IF EXISTS temp.{name}")  # names from this module only
    try:
        yield
    finally:
        for name in names:
            conn.execute(f"DROP TABLE IF EXISTS temp.{name}")


def _late(conn: sqlite3.Connection, lo: float, after: str, rowid: int) -> int:
    """Inside the caller's transaction: the passing health checks merged since the rollup's
    mark (`rowid`) into hours it rolled up already (before `lo`, or `lo`'s hour when stopped
    inside it, after node `after`), folded; how many."""
    if not rowid:
        return 0
    with _temp_tables(conn, "folded"):
        top = conn.execute("SELECT max(rowid) FROM runs").fetchone()[0] or 0
        until = lo + HOUR if after else lo
        conn.execute(_LATE, {"rowid": rowid, "top": top, "until": until, "all": ALL})
        return _fold(conn)


def _fold(conn: sqlite3.Connection) -> int:
    """Delete the runs in temp.folded and their (skip) results; the runs deleted."""
    conn.execute(_FOLD_RESULTS)
    return conn.execute(_FOLD_RUNS).rowcount

