"""The nightly report's own reads of the fleet store (report/build.py is their one consumer), as
named functions; the reads it shares with the lemon sweep and the other commands are
fleet/queries.py's.
"""

from __future__ import annotations

import math
import sqlite3

from slurmhealth.fleet import queries

DAY = 86400
WEEK = 7 * DAY  # the longest job: how far back a job's start is looked for


# --- a node's state --------------------------------------------------------------------------


def last_action(conn: sqlite3.Connection, node: str, now: float) -> tuple | None:
    """(time, action, reason, actor) of the node's latest successful drain or resume before
    `now`, or None."""
    return conn.execute(
        "SELECT time, action, reason, actor FROM actions WHERE node = ? AND time < ? AND ok = 1 "
        "AND action IN ('drain', 'resume') ORDER BY time DESC LIMIT 1",
        (node, now),
    ).fetchone()


def last_run(conn: sqlite3.Connection, node: str, now: float) -> tuple | None:
    """(id, verdict, started) of the node's latest run before `now`, or None."""
    return conn.execute(
        "SELECT id, verdict, started FROM runs WHERE node = ? AND started < ? "
        "ORDER BY started DESC LIMIT 1",
        (node, now),
    ).fetchone()


# Each node's latest successful drain or resume and latest run before `now` (last_action,
# last_run), queries.BATCH nodes a statement. A statement per node was 200,000 round trips for
# a 100,000-node report on a server (docs/benchmarks.md). An action: one index seek for the
# row's key and one by it. A run: its start and verdict from the (node, started, verdict)
# index alone, two seeks per node and no table row (in a table larger than the server's memory
# the rows were most of the read); its id is read for a failing node alone (its failed checks
# are shown).
# {} is the VALUES rows' placeholders.
_LAST_ACTIONS = """WITH q(node) AS (VALUES {}), k(node, id) AS (SELECT q.node,
        (SELECT id FROM actions WHERE actions.node = q.node AND time < ? AND ok = 1
         AND action IN ('drain', 'resume') ORDER BY time DESC LIMIT 1) FROM q)
    SELECT k.node, a.time, a.action, a.reason, a.actor FROM k JOIN actions a ON a.id = k.id"""
_LAST_RUNS = """WITH q(node) AS (VALUES {}), k(node, started) AS (SELECT q.node,
        (SELECT max(started) FROM runs WHERE runs.node = q.node AND started < ?) FROM q)
    SELECT k.node, r.verdict, r.started FROM k
    JOIN runs r ON r.node = k.node AND r.started = k.started"""


def latest(conn: sqlite3.Connection, nodes: list, now: float) -> tuple:
    """({node: last_action(conn, node, now)}, {node: last_run(conn, node, now)}) of every
    node, read queries.BATCH nodes a statement; a node with none is absent. A run's id is
    None but where it failed; a node whose latest runs started at the same instant is read
    alone, as last_run reads it."""
    actions: dict = {}
    runs: dict = {}
    again: set = set()  # failing, or two latest runs
    for first in range(0, len(nodes), queries.BATCH):
        chunk = nodes[first : first + queries.BATCH]
        rows = ", ".join("(?)" for _ in chunk)  # placeholders only
        for node, *row in conn.execute(_LAST_ACTIONS.format(rows), (*chunk, now)):
            actions[node] = tuple(row)
        for node, verdict, started in conn.execute(_LAST_RUNS.format(rows), (*chunk, now)):
            if node in runs or verdict == "fail":
                again.add(node)
            runs[node] = (None, verdict, started)
    for node in again:
        runs[node] = last_run(conn, node, now)
    return actions, runs


def busy(conn: sqlite3.Connection, node: str, now: float) -> bool:
    """A job still runs on the node (a drained node with a job is draining): started within
    a week (the longest job) and not ended by `now`, as far as the hooks and sacct know."""
    row = conn.execute(
        "SELECT 1 FROM jobs WHERE node = ? AND start >= ? AND start < ? AND (end > ? OR "
        "(end IS NULL AND state = 'running' AND coalesce(slurm_state, 'RUNNING') = 'RUNNING')) "
        "LIMIT 1",
        (node, now - WEEK, now, now),
    ).fetchone()
    return row is not None


def failing_results(conn: sqlite3.Connection, run_id: str) -> list:
    """[(check_name, message)] of the run's first two failed checks, by check name."""
    return conn.execute(
        "SELECT check_name, message FROM results WHERE run_id = ? AND status = 'fail' "
        "ORDER BY check_name LIMIT 2",
        (run_id,),
    ).fetchall()


# --- the period ---------------------------------------------------------------------------------


def actions_between(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(time, node, action, reason, actor, ok, detail)] of every action in [start, end),
    newest first."""
    return conn.execute(
        "SELECT time, node, action, reason, actor, ok, detail FROM actions "
        "WHERE time >= ? AND time < ? ORDER BY time DESC, node",
        (start, end),
    ).fetchall()


def verdict_counts(
    conn: sqlite3.Connection, start: float, end: float, total: int | None = None
) -> list:
    """[(verdict, runs)]: runs started in [start, end) per verdict, with the passing runs
    rolled up in the hours that start in it (fleet/rollup.py). The passing runs are counted, never
    read one by one: all runs from the time index (`total` when the caller counted them already:
    run_figures), less those that did not pass (queries.not_ok_runs)."""
    if total is None:
        total = _runs_between(conn, start, end)
    others: dict = {}
    for _node, _started, verdict in queries.not_ok_runs(conn, start, end):
        others[verdict] = others.get(verdict, 0) + 1
    rolled = conn.execute(
        "SELECT sum(runs) FROM run_hours WHERE hour >= ? AND hour < ?", (start, end)
    ).fetchone()[0]
    counts = [("ok", total - sum(others.values()) + (rolled or 0)), *sorted(others.items())]
    return [(verdict, n) for verdict, n in counts if n > 0]


def _runs_between(conn: sqlite3.Connection, start: float, end: float) -> int:
    """How many runs started in [start, end), counted in the time index."""
    return conn.execute(
        "SELECT count(*) FROM runs INDEXED BY runs_started_phase "
        "WHERE started >= ? AND started < ?",
        (start, end),
    ).fetchone()[0]


def check_counts(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(check_name, node, fails, warns)] of the runs started in [start, end). Only runs that
    were not ok keep results (store.record_run): a partial index holds just those (store
    migration 8), so the window's failures are read, never its passing runs."""
    return conn.execute(
        "SELECT r.check_name, u.node, sum(r.status = 'fail'), sum(r.status = 'warn') "
        "FROM runs u INDEXED BY runs_not_ok JOIN results r ON r.run_id = u.id "
        "WHERE u.verdict != 'ok' AND u.started >= ? AND u.started < ? "
        "AND r.status IN ('fail', 'warn') GROUP BY r.check_name, u.node",
        (start, end),
    ).fetchall()


def first_record(conn: sqlite3.Connection, start: float, end: float) -> float | None:
    """The time of the first run or job start in [start, end) (indexes runs_started_phase and
    jobs_start), None when there is none."""
    row = conn.execute(
        "SELECT min(t) FROM (SELECT min(started) AS t FROM runs WHERE started >= ? AND started < ?"
        " UNION ALL SELECT min(start) FROM jobs WHERE start >= ? AND start < ?)",
        (start, end, start, end),
    ).fetchone()
    return row[0] if row else None


def xids_between(conn: sqlite3.Connection, start: float, end: float) -> sqlite3.Cursor:
    """(class, code, node, process) rows of every Xid event in [start, end). The process
    names come from the kernel log: untrusted."""
    return conn.execute(
        "SELECT class, code, node, process FROM events "
        "WHERE kind = 'xid' AND time >= ? AND time < ?",
        (start, end),
    )


def diagnoses(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[{node, started, duration, verdict, sources, results: [{check_name, status, message,
    data}]}] of the `diag` runs started in [start, end), by time."""
    runs = queries.dicts(
        conn.execute(
            "SELECT id, node, started, duration, verdict, sources FROM runs "
            "WHERE phase = 'diag' AND started >= ? AND started < ? ORDER BY started, node",
            (start, end),
        )
    )
    for run in runs:
        run["results"] = queries.dicts(
            conn.execute(
                "SELECT check_name, status, message, data FROM results WHERE run_id = ? "
                "ORDER BY check_name",
                (run.pop("id"),),
            )
        )
    return runs


def run_figures(
    conn: sqlite3.Connection, start: float, end: float, phases: tuple, qs: tuple
) -> tuple:
    """(runs started in [start, end), {phase: (runs, [the q-quantile of runs.duration by
    nearest rank, for each q of qs])} of the phases' runs): the period's denominator and
    slurmhealth's own wall time. A server counts them all and orders the phases' durations
    itself in one pass over the period's runs (percentile_disc is the nearest rank; a
    100,000-node week has millions of prolog and epilog runs, and a second pass read the
    store's largest table twice: docs/benchmarks.md), and sends one row. SQLite counts them
    from the time index, which holds every run's phase and duration, and reads the phases'
    durations from it in one more scan; Python orders them."""
    where = "FROM runs WHERE started >= ? AND started < ?"
    if not isinstance(conn, sqlite3.Connection):  # a PostgreSQL store (fleet/pgstore.py)
        quantiles = ", ".join(repr(float(q)) for q in qs)  # the caller's constants
        figures = ", ".join(
            f"count(*) FILTER (WHERE phase = ?), percentile_disc(ARRAY[{quantiles}]) "
            "WITHIN GROUP (ORDER BY duration) FILTER (WHERE phase = ?)"
            for _ in phases
        )  # one sort of each phase's durations for all its quantiles
        sql = f"SELECT count(*), {figures} {where}"  # noqa: S608 - placeholders, constants
        args = [p for p in phases for _ in range(2)]
        total, *row = conn.execute(sql, (*args, start, end)).fetchone()
        return total, {
            p: (row[2 * i] or 0, list(row[2 * i + 1] or [None] * len(qs)))
            for i, p in enumerate(phases)
        }
    total = _runs_between(conn, start, end)
    durations: dict = {phase: [] for phase in phases}
    marks = ", ".join("?" for _ in phases)  # placeholders only
    sql = f"SELECT phase, duration {where} AND phase IN ({marks})"  # noqa: S608
    for phase, duration in conn.execute(sql, (start, end, *phases)):
        durations[phase].append(duration)
    out: dict = {}
    for phase, values in durations.items():
        values.sort()
        out[phase] = (len(values), [_rank(values, q) for q in qs])
    return total, out


def _rank(ordered: list, q: float) -> float | None:
    """The q-quantile of the ordered values by nearest rank, None when there are none."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def large_store(conn: sqlite3.Connection, runs: int = 100_000) -> bool:
    """Does the store hold `runs` runs or more (worth a progress bar)? max(rowid): no
    count(*) over 1M rows."""
    return (conn.execute("SELECT max(rowid) FROM runs").fetchone()[0] or 0) >= runs


# --- the window ---------------------------------------------------------------------------------


def drains_between(conn: sqlite3.Connection, start: float, end: float) -> sqlite3.Cursor:
    """(time, node, reason) rows of every successful drain in [start, end)."""
    return conn.execute(
        "SELECT time, node, reason FROM actions WHERE action = 'drain' AND ok = 1 "
        "AND time >= ? AND time < ?",
        (start, end),
    )


def refused_between(conn: sqlite3.Connection, start: float, end: float) -> sqlite3.Cursor:
    """(time, node, reason) rows of every drain the circuit breaker refused in [start, end)."""
    return conn.execute(
        "SELECT time, node, reason FROM actions WHERE action = 'breaker' "
        "AND time >= ? AND time < ?",
        (start, end),
    )


def node_fails_between(conn: sqlite3.Connection, start: float, end: float) -> sqlite3.Cursor:
    """(time, node, job_id) rows of the nodes that crashed under a job in [start, end).

    NODE_FAIL is the job's state on all its nodes; the node that crashed is the one whose
    epilog never ran (state not 'ended'). Dated by the job's end (sacct's End), else its
    start; the index range on start reaches back a week, the longest job."""
    return conn.execute(
        "SELECT coalesce(end, start), node, job_id FROM jobs WHERE start >= ? AND start < ? "
        "AND slurm_state = 'NODE_FAIL' AND coalesce(state, 'running') != 'ended' "
        "AND coalesce(end, start) >= ? AND coalesce(end, start) < ?",
        (start - WEEK, end, start, end),
    )
