"""Every read of the fleet and node store tables that the head-node side makes (the nightly
report, job summaries, `slurmhealth history`), as named functions: a schema change is one
place to look. The lemon signals (fleet/signals.py), the bulk export and import, collect and
the rollup (fleet/records.py, collect.py, rollup.py) keep their own spec-driven statements;
every write of a node's run lives in core/store.py.
"""

from __future__ import annotations

import json
import math
import sqlite3

from slurmhealth.fleet import drift

DAY = 86400
WEEK = 7 * DAY  # the longest job: how far back a job's start is looked for


def _dicts(cursor: sqlite3.Cursor) -> list:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor]


# --- the report: a node's state -----------------------------------------------------------------


def last_action(conn: sqlite3.Connection, node: str, now: float) -> tuple | None:
    """(time, action, reason, actor) of the node's latest successful drain or resume before
    `now`, or None."""
    return conn.execute(
        "SELECT time, action, reason, actor FROM actions WHERE node = ? AND time < ? AND ok = 1 "
        "AND action IN ('drain', 'resume') ORDER BY time DESC LIMIT 1",
        (node, now),
    ).fetchone()


def drains_by(conn: sqlite3.Connection, actor: str, until: float) -> dict:
    """{node: time of `actor`'s latest drain of it that Slurm took, at or before `until`}."""
    return dict(
        conn.execute(
            "SELECT node, max(time) FROM actions WHERE actor = ? AND action = 'drain' "
            "AND ok = 1 AND time <= ? GROUP BY node",
            (actor, until),
        )
    )


def last_run(conn: sqlite3.Connection, node: str, now: float) -> tuple | None:
    """(id, verdict, started) of the node's latest run before `now`, or None."""
    return conn.execute(
        "SELECT id, verdict, started FROM runs WHERE node = ? AND started < ? "
        "ORDER BY started DESC LIMIT 1",
        (node, now),
    ).fetchone()


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


# --- the report: the period ---------------------------------------------------------------------


def actions_between(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(time, node, action, reason, actor, ok, detail)] of every action in [start, end),
    newest first."""
    return conn.execute(
        "SELECT time, node, action, reason, actor, ok, detail FROM actions "
        "WHERE time >= ? AND time < ? ORDER BY time DESC, node",
        (start, end),
    ).fetchall()


# Every node of the runs table: a loose scan of the (node, started, verdict) index, one seek per
# node. Joined per node on that index, a window's runs are read from the index alone (no table
# row per run): 10,000 nodes' month of runs is read ~5x faster than through the time index.
_NODES = """WITH RECURSIVE n(node) AS (
    SELECT min(node) FROM runs
    UNION ALL
    SELECT (SELECT min(node) FROM runs WHERE node > n.node) FROM n WHERE n.node IS NOT NULL)"""


def heard_from(conn: sqlite3.Connection, now: float) -> dict:
    """{node: the start of its newest run before `now`} for every node with a run: one seek
    per node on the (node, started, verdict) index (10,000 nodes: one seek each)."""
    sql = (
        f"{_NODES} SELECT node, (SELECT max(started) FROM runs "  # noqa: S608 - constants
        "WHERE runs.node = n.node AND started < ?) FROM n WHERE node IS NOT NULL"
    )
    return {node: t for node, t in conn.execute(sql, (now,)) if t is not None}


def not_ok_runs(conn: sqlite3.Connection, start: float, end: float) -> sqlite3.Cursor:
    """(node, started, verdict) rows of the runs started in [start, end) that did not pass:
    from their partial index alone (store migration 10), never a passing run."""
    return conn.execute(
        "SELECT node, started, verdict FROM runs INDEXED BY runs_not_ok "
        "WHERE verdict != 'ok' AND started >= ? AND started < ?",
        (start, end),
    )


def verdict_counts(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(verdict, runs)]: runs started in [start, end) per verdict, with the passing runs
    rolled up in the hours that start in it (rollup.rollup). The passing runs are counted, never
    read one by one: all runs from the time index, less those that did not pass
    (not_ok_runs)."""
    total = conn.execute(
        "SELECT count(*) FROM runs INDEXED BY runs_started_phase "
        "WHERE started >= ? AND started < ?",
        (start, end),
    ).fetchone()[0]
    others: dict = {}
    for _node, _started, verdict in not_ok_runs(conn, start, end):
        others[verdict] = others.get(verdict, 0) + 1
    rolled = conn.execute(
        "SELECT sum(runs) FROM run_hours WHERE hour >= ? AND hour < ?", (start, end)
    ).fetchone()[0]
    counts = [("ok", total - sum(others.values()) + (rolled or 0)), *sorted(others.items())]
    return [(verdict, n) for verdict, n in counts if n > 0]


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
    runs = _dicts(
        conn.execute(
            "SELECT id, node, started, duration, verdict, sources FROM runs "
            "WHERE phase = 'diag' AND started >= ? AND started < ? ORDER BY started, node",
            (start, end),
        )
    )
    for run in runs:
        run["results"] = _dicts(
            conn.execute(
                "SELECT check_name, status, message, data FROM results WHERE run_id = ? "
                "ORDER BY check_name",
                (run.pop("id"),),
            )
        )
    return runs


# What a diagnosis's outcome measured (node/diag/probes.py PASS and FAIL): a skipped outcome
# (no tool, no floor to judge against) says nothing about this node against its peers.
_MEASURED = ("pass", "fail")


def diag_figures(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(node, time, gpu_model, probe, unit, figure, value)] of every numeric figure of the
    passed and failed outcomes of the `diag` runs started in [start, end) (node/diag/run.py
    records them), by time. gpu_model is the hardware class the run recorded
    (`sources.diag`): `8x NVIDIA H100 80GB HBM3`, the count first because an all-reduce over 4
    GPUs is no peer of one over 8; the bare model when the count is unknown, "" when neither
    is. A run or result whose JSON cannot be read gives nothing. Text is as stored: untrusted."""
    rows = conn.execute(
        "SELECT u.node, u.started, u.sources, r.check_name, r.data "
        "FROM runs u JOIN results r ON r.run_id = u.id "
        "WHERE u.phase = 'diag' AND u.started >= ? AND u.started < ? "
        "AND r.check_name LIKE 'diag.%' ORDER BY u.started, u.node, r.check_name",
        (start, end),
    )
    out: list = []
    seen, model, level = None, None, None  # a run's results come together: sources read once
    for node, started, sources, check, data in rows:
        if sources != seen:
            seen, (model, level) = sources, _diag_class(sources)
        if model is not None:
            probe = check[len("diag.") :]
            out.extend(
                (node, started, model, probe, *f)
                for f in _measured_figures(data)
                if not (level == "quick" and f[1] in LENGTH_BOUND)
            )
    return out


# Figures that depend on how long their test ran (a GPU warms and lowers its clocks within
# seconds): the quick level's 2-second tests are no peers of the medium level's 20. Copy
# bandwidths do the same work at every level and are compared from any level.
LENGTH_BOUND = ("matmul_tflops", "memory_write_gbps")


def _diag_class(sources: str) -> tuple:
    """(hardware class, level) of a diag run (diag_figures); (None, None) when its JSON is
    unreadable."""
    try:
        diag = json.loads(sources).get("diag") or {}
        model, gpus, level = diag.get("gpu_model") or "", diag.get("gpus"), diag.get("level")
    except (ValueError, TypeError, AttributeError):
        return None, None
    if not isinstance(model, str):
        return None, None
    counted = isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0
    return (f"{gpus}x {model}" if model and counted else model), level


def _measured_figures(data: str) -> list:
    """[(unit, figure, value)] of a diag result's data: finite numbers of measured outcomes."""
    try:
        outcomes = json.loads(data).get("outcomes")
    except (ValueError, TypeError, AttributeError):
        return []
    out = []
    for o in outcomes if isinstance(outcomes, list) else ():
        if not isinstance(o, dict) or o.get("status") not in _MEASURED:
            continue
        figures, unit = o.get("figures"), o.get("unit")
        if not isinstance(figures, dict) or not isinstance(unit, str):
            continue
        out.extend(
            (unit, name, float(value))
            for name, value in figures.items()
            if isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
        )
    return out


def durations(conn: sqlite3.Connection, start: float, end: float, phases: tuple) -> dict:
    """{phase: [runs.duration]} of the phases' runs started in [start, end): slurmhealth's own
    wall time. One scan of the time index for all the phases (it holds every run's phase and
    duration): a 10,000-node month has 17M runs in it, two thirds of them health checks."""
    out: dict = {phase: [] for phase in phases}
    marks = ", ".join("?" for _ in phases)  # placeholders only
    rows = conn.execute(
        f"SELECT phase, duration FROM runs WHERE started >= ? AND started < ? "  # noqa: S608
        f"AND phase IN ({marks})",
        (start, end, *phases),
    )
    for phase, duration in rows:
        out[phase].append(duration)
    return out


def nodes_with_runs(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[node] of every node with a run started in [start, end): two index seeks per node."""
    rows = conn.execute(
        f"{_NODES} SELECT node FROM n WHERE node IS NOT NULL AND EXISTS (SELECT 1 FROM runs u "  # noqa: S608 - constants
        "WHERE u.node = n.node AND u.started >= ? AND u.started < ?)",
        (start, end),
    )
    return [row[0] for row in rows]


def large_store(conn: sqlite3.Connection, runs: int = 100_000) -> bool:
    """Does the store hold `runs` runs or more (worth a progress bar)? max(rowid): no
    count(*) over 1M rows."""
    return (conn.execute("SELECT max(rowid) FROM runs").fetchone()[0] or 0) >= runs


# --- the report: the window ---------------------------------------------------------------------


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


def version_sources(
    conn: sqlite3.Connection, node: str, start: float, end: float, oldest: bool = False
) -> sqlite3.Cursor:
    """(sources JSON text,) rows of the node's runs started in [start, end) that recorded
    versions, newest first (oldest first with `oldest`)."""
    return conn.execute(_VERSIONS_OLDEST if oldest else _VERSIONS_NEWEST, (node, start, end))


_VERSIONS = (
    "SELECT sources FROM runs WHERE node = ? AND started >= ? AND started < ?"
    " AND instr(sources, '\"versions\"') ORDER BY started "
)
_VERSIONS_NEWEST = _VERSIONS + "DESC"
_VERSIONS_OLDEST = _VERSIONS + "ASC"


# --- job summaries (fleet/jobs.py) ---------------------------------------------------------------


def job_rows(conn: sqlite3.Connection, job_id: str) -> list:
    """[{node, uid, user, start, end, exit_code, signal, state, slurm_state, gpu_energy}] of
    the job, one per node, by node."""
    return _dicts(
        conn.execute(
            "SELECT node, uid, user, start, end, exit_code, signal, state, slurm_state, "
            "gpu_energy "
            "FROM jobs WHERE job_id = ? ORDER BY node",
            (job_id,),
        )
    )


def hook_runs(conn: sqlite3.Connection, job_id: str) -> dict:
    """{(node, phase): run} of the job's prolog and epilog runs; the latest of each wins (a
    requeued job may start twice on one node)."""
    rows = _dicts(
        conn.execute(
            "SELECT id, node, phase, started, verdict FROM runs WHERE job_id = ? "
            "AND phase IN ('prolog', 'epilog') ORDER BY started",
            (job_id,),
        )
    )
    return {(r["node"], r["phase"]): r for r in rows}


def health_checks_not_ok(conn: sqlite3.Connection, node: str, start: float, end: float) -> list:
    """[{id, phase, started}] of the health checks on the node in [start, end] that did not
    pass, oldest first."""
    return _dicts(
        conn.execute(
            "SELECT id, phase, started FROM runs WHERE node = ? AND started >= ? "
            "AND started <= ? AND verdict != 'ok' AND phase = 'healthcheck' ORDER BY started",
            (node, start, end),
        )
    )


def problems(conn: sqlite3.Connection, runs: list) -> list:
    """[{phase, time, check, status, message}] of the failed, warning and erroring checks of
    each run ({id, phase, started}), run by run."""
    out = []
    for run in runs:
        rows = conn.execute(
            "SELECT check_name, status, message FROM results WHERE run_id = ? "
            "AND status IN ('fail', 'warn', 'error') ORDER BY check_name",
            (run["id"],),
        )
        for check, status, message in rows:
            out.append(
                {
                    "phase": run["phase"],
                    "time": run["started"],
                    "check": check,
                    "status": status,
                    "message": message,
                }
            )
    return out


def job_xids(conn: sqlite3.Connection, node: str, job_id: str) -> list:
    """[{time, gpu, bus_id, code, class, process}] of the Xids the epilog gave the job on the
    node (those on its GPUs, read after its prolog)."""
    return _dicts(
        conn.execute(
            "SELECT time, gpu, bus_id, code, class, process FROM events "
            "WHERE node = ? AND job_id = ? "
            "AND kind = 'xid' ORDER BY time, gpu, code",
            (node, job_id),
        )
    )


def drains_and_resumes(conn: sqlite3.Connection, node: str, since: float) -> list:
    """[(time, action, reason)] of slurmhealth's successful drains and resumes of the node
    from `since` on, oldest first."""
    return conn.execute(
        "SELECT time, action, reason FROM actions WHERE node = ? AND time >= ? AND ok = 1 "
        "AND action IN ('drain', 'resume') ORDER BY time",
        (node, since),
    ).fetchall()


def finished_jobs(conn: sqlite3.Connection, start: float, end: float) -> list:
    """Ids of the jobs with a node that ended in [start, end], in numeric order (store
    migration 4 indexes jobs by end)."""
    rows = conn.execute(
        "SELECT DISTINCT job_id FROM jobs WHERE end >= ? AND end <= ?", (start, end)
    ).fetchall()
    return sorted((r[0] for r in rows), key=lambda j: (len(j), j))


def published_digest(conn: sqlite3.Connection, job_id: str) -> str | None:
    """The digest of the summary `publish` last wrote for the job, or None."""
    row = conn.execute("SELECT digest FROM published WHERE job_id = ?", (job_id,)).fetchone()
    return row[0] if row else None


# --- `slurmhealth history` -----------------------------------------------------------------------


_COUNTER_KEYS = ("device", "counter", "delta", "value")


def rolled_up(conn: sqlite3.Connection, node: str | None, since: float) -> int:
    """Passing health checks from `since` on (of the node) that a rollup counts per hour
    (rollup.rollup) instead of keeping as rows: an hour is counted when it ends after `since`."""
    sql = "SELECT coalesce(sum(runs), 0) FROM run_hours WHERE hour > ?"
    args: list = [since - 3600]
    if node:
        sql += " AND node = ?"
        args.append(node)
    return int(conn.execute(sql, args).fetchone()[0])


def run_history(
    conn: sqlite3.Connection,
    node: str | None,
    job: str | None,
    since: float,
    limit: int,
    failures: bool = False,
) -> list:
    """[{id, node, job, phase, started, duration, verdict, problems}] of the runs started
    from `since` on (of the node, of the job; failures: only those that did not pass), newest
    first, at most `limit`, each with its non-ok results."""
    where, args = ["started >= ?"], [since]
    if failures:
        where.append("verdict != 'ok'")
    if node:
        where.append("node = ?")
        args.append(node)
    if job:
        where.append("job_id = ?")
        args.append(job)
    # Only the fixed clauses above are joined into the text; every value is a parameter.
    sql = f"SELECT id, node, job_id, phase, started, duration, verdict FROM runs WHERE {' AND '.join(where)} ORDER BY started DESC LIMIT ?"  # noqa: S608, E501
    rows = conn.execute(sql, (*args, limit)).fetchall()
    out = []
    for run_id, run_node, job_id, phase, started, duration, verdict in rows:
        problems = conn.execute(
            "SELECT check_name, status, message, action FROM results "
            "WHERE run_id = ? AND status NOT IN ('ok', 'skip') ORDER BY check_name",
            (run_id,),
        ).fetchall()
        # the run's counter readings that changed (node/counters.py), by the time index
        changed = conn.execute(
            "SELECT label, counter, delta, value FROM counters WHERE time = ? AND run_id = ? "
            "ORDER BY label, counter",
            (started, run_id),
        ).fetchall()
        out.append(
            {
                "id": run_id,
                "node": run_node,
                "job": job_id,
                "phase": phase,
                "started": started,
                "duration": duration,
                "verdict": verdict,
                "problems": [
                    dict(zip(("check", "status", "message", "action"), p)) for p in problems
                ],
                "counters": [dict(zip(_COUNTER_KEYS, c)) for c in changed],
            }
        )
    return out


def action_history(conn: sqlite3.Connection, node: str | None, since: float) -> list:
    """[{node, time, action, reason, actor, ok, detail}] of every action from `since` on (of
    the node), newest first."""
    sql = "SELECT node, time, action, reason, actor, ok, detail FROM actions WHERE time >= ?"
    args: list = [since]
    if node:
        sql += " AND node = ?"
        args.append(node)
    keys = ("node", "time", "action", "reason", "actor", "ok", "detail")
    return [dict(zip(keys, row)) for row in conn.execute(sql + " ORDER BY time DESC", args)]


def job_history(conn: sqlite3.Connection, job: str) -> list:
    """[{node, job, uid, user, start, end, exit_code, signal}] of the job, one per node."""
    keys = ("node", "job", "uid", "user", "start", "end", "exit_code", "signal")
    rows = conn.execute(
        "SELECT node, job_id, uid, user, start, end, exit_code, signal FROM jobs WHERE job_id = ?",
        (job,),
    )
    return [dict(zip(keys, row)) for row in rows]


# --- error counters over time (fleet/trends.py) ------------------------------------------------


def counter_rows(conn: sqlite3.Connection, start: float, end: float, skip: tuple = ()) -> list:
    """[(node, device, counter, time, delta, label)] of the counter readings recorded in
    (start, end] with an increase (node/counters.py records a reading only when it changed;
    a first reading or a reset has no delta), by time, but those of the counters in `skip`."""
    marks = ", ".join("?" * len(skip))  # placeholders only: the names are parameters
    sql = f"SELECT node, device, counter, time, delta, label FROM counters WHERE time > ? AND time <= ? AND delta > 0 AND counter NOT IN ({marks}) ORDER BY time"  # noqa: S608, E501
    return conn.execute(
        sql,
        (start, end, *skip),
    ).fetchall()


# Each series' hourly summary (trends.summaries, which documents the columns), read in one
# pass: the window's rows by time, summed per series and hour, then per series. The hour is
# the floor of (now - time) / 3600 as Python's // takes it: a quotient rounded up to a whole
# hour is taken back. A series' last label is its newest row's, read by its key.
_SERIES = """WITH rows AS (
        SELECT node, device, counter, time, delta,
            CAST((:now - time) / 3600 AS INTEGER) AS q FROM counters
        WHERE time > :start AND time <= :now AND delta > 0 AND counter NOT IN ({skip})),
    hours AS (
        SELECT node, device, counter, q - (:now - time < q * 3600.0) AS hour,
            sum(delta) AS e, count(*) AS r, max(time) AS last
        FROM rows GROUP BY node, device, counter, hour),
    series AS (
        SELECT node, device, counter, max(last) AS last, {windows},
            total(e) FILTER (WHERE hour >= :first AND hour < :end),
            coalesce(sum(r) FILTER (WHERE hour >= :first AND hour < :end), 0),
            total(e) FILTER (WHERE hour >= :newer AND hour < :end),
            coalesce(sum(r) FILTER (WHERE hour >= :newer AND hour < :end), 0),
            total(e * e) FILTER (WHERE hour >= :first AND hour < :end),
            coalesce(sum(r * r) FILTER (WHERE hour >= :first AND hour < :end), 0), {days}
        FROM hours GROUP BY node, device, counter)
    SELECT series.*, (SELECT label FROM counters AS c WHERE c.node = series.node
        AND c.device = series.device AND c.counter = series.counter AND c.time = series.last)
    FROM series"""
_WINDOW = """coalesce(sum(r) FILTER (WHERE hour < :w{0}), 0), total(e) FILTER (WHERE hour < :w{0}),
    coalesce(max(e) FILTER (WHERE hour < :w{0}), 0.0)"""
_DAY = "total(e) FILTER (WHERE hour >= :d{0} AND hour < :d{1})"


def counter_series(conn: sqlite3.Connection, now: float, hours: tuple, skip: tuple = ()) -> list:
    """[(node, device, counter, last time, last label, recent, past)]: trends.summaries of
    the counter rows in (now - the baseline's end, now] with an increase, but those of the
    counters in `skip`, summed in SQL (hours: trends.hours_of): a series is one row here, where
    the rows it sums are a million at 10,000 nodes (docs/benchmarks.md)."""
    ends, first, end, newer, days = hours
    params: dict = {"now": now, "start": now - end * 3600.0, "first": first, "end": end}
    params.update({"newer": newer, **{f"s{i}": name for i, name in enumerate(skip)}})
    params.update({f"w{i}": h for i, h in enumerate(ends)})
    params.update({f"d{i}": h for i, h in enumerate(days)})
    sql = _SERIES.format(  # placeholders only: the names and hours are parameters
        skip=", ".join(f":s{i}" for i in range(len(skip))),
        windows=", ".join(_WINDOW.format(i) for i in range(len(ends))),
        days=", ".join(_DAY.format(i, i + 1) for i in range(len(days) - 1)),
    )
    out = []
    width = 3 * len(ends)
    for row in conn.execute(sql, params):
        got = row[4 : 4 + width]
        recent = tuple(tuple(got[i : i + 3]) for i in range(0, width, 3))
        past = row[4 + width : 10 + width] + (tuple(row[10 + width : -1]),)
        out.append(row[:4] + (row[-1], recent, past))
    return out


def recorded_versions(
    conn: sqlite3.Connection, node: str, end: float, lookback: float, oldest: bool = False
) -> dict | None:
    """The versions the node's latest run recorded (runner.Gathered.versions, as
    drift.versions reads them) within `lookback` before `end` (with `oldest`, its earliest run
    there: what it ran before); None when it recorded none (no run, or no facts parsed).

    A run whose GPU source failed (NVML did not answer that once) records its other sources'
    versions alone: taken as they are, the node would fall into a class of its own, "unknown
    GPUs", and be compared across hardware. So the newest run decides each key it has, and
    older runs fill in the keys it lacks, until one names the GPU model or its GPU source
    answered (at most VERSIONS_MERGE runs)."""
    merged: dict = {}
    for count, (text,) in enumerate(version_sources(conn, node, end - lookback, end, oldest)):
        try:
            sources = json.loads(text)
            found = drift.versions(sources)
        except (ValueError, RecursionError):
            continue
        for key, value in found.items():
            merged.setdefault(key, value)
        if merged.get("model") or drift.gpu_answered(sources) or count + 1 >= VERSIONS_MERGE:
            break
    return merged or None


VERSIONS_MERGE = 20  # runs read back for keys the newest run lacks (recorded_versions)


def node_models(
    conn: sqlite3.Connection, nodes: list, end: float, lookback: float, known: dict | None = None
) -> dict:
    """{node: GPU model} from each node's recorded versions in [end - lookback, end) ("" when
    none named one): the hardware class peers are compared in. known: {node: model} already
    read (the report's drift section), taken as they are."""
    out = {}
    for node in nodes:
        if known and node in known:
            out[node] = known[node]
        else:
            out[node] = str((recorded_versions(conn, node, end, lookback) or {}).get("model") or "")
    return out


MODEL_LOOKBACK = 2 * DAY  # versions are recorded at least every 6 h (node/runner.py)


def rising_counters(
    conn: sqlite3.Connection,
    now: float,
    models: dict | None = None,
    factor: float | None = None,
) -> tuple:
    """(findings of trends.rising as of `now`, nodes compared): the series' hourly summaries of
    the longest window and the 7 days before it, and the GPU model of every node that ran in
    the last two days (models: {node: model} already known, not read again); factor: the
    finder's, its default when None."""
    from slurmhealth.fleet import trends  # noqa: PLC0415

    hours = trends.hours_of(trends.WINDOWS, trends.BASELINE)
    series = counter_series(conn, now, hours, trends.NOT_TRENDS)
    nodes = set(nodes_with_runs(conn, now - MODEL_LOOKBACK, now)) | {s[0] for s in series}
    found = node_models(conn, sorted(nodes), now, MODEL_LOOKBACK, models)
    limits = (factor or trends.FACTOR, trends.MIN_EPISODES, trends.ALPHA)
    return trends.judged(series, found, trends.WINDOWS, limits, trends.BASELINE), len(nodes)


# --- per-job GPU telemetry (fleet/telemetry.py) --------------------------------------------------

# A node's devices with a counter row in [low, high): a loose scan of the counters key (node,
# device, counter, time), one seek per device, however long the node's history.
_DEVICES = """WITH RECURSIVE d(device) AS (
    SELECT min(device) FROM counters WHERE node = :node AND device >= :low AND device < :high
    UNION ALL
    SELECT (SELECT min(device) FROM counters
            WHERE node = :node AND device > d.device AND device < :high)
    FROM d WHERE d.device IS NOT NULL)
    SELECT device FROM d WHERE device IS NOT NULL"""


def counter_devices(conn: sqlite3.Connection, node: str, kind: str = "") -> list:
    """[device] of the node with any counter row (of the kind: "gpu", ...), by name."""
    low, high = (f"{kind}:", f"{kind};") if kind else ("", "\U0010ffff")
    return [r[0] for r in conn.execute(_DEVICES, {"node": node, "low": low, "high": high})]


# Per device and counter of a node in (start, end]: the rows with an increase and their sum (a
# first reading's unknown increase counts 0); the label its readings gave (a reading of 0 after a
# reset is labelled by the device's name). Only placeholders are formatted in.
_JOB_SUMS = """SELECT device, coalesce(max(nullif(label, device)), device), counter,
    sum(coalesce(delta, 0) > 0), sum(max(coalesce(delta, 0), 0)) FROM counters
    WHERE node = ? AND device IN ({}) AND counter IN ({}) AND time > ? AND time <= ?
    GROUP BY device, counter ORDER BY device, counter"""


def job_counter_sums(
    conn: sqlite3.Connection,
    node: str,
    start: float,
    end: float,
    kinds: tuple = (),
    known: dict | None = None,
) -> list:
    """[(device, label, counter, episodes, total)] of the node's counter rows in (start, end]:
    episodes the rows with an increase, total the sum of the increases (a first reading's
    unknown one counts 0). kinds: the device kinds to read (telemetry.COUNTERS), all by
    default. Each kind's devices and counters are exact ranges of the counters key. known:
    {(node, kind): devices} read before in the same read transaction, filled in here (a sweep
    reads each node's devices once, not once per job: most nodes have none)."""
    from slurmhealth.fleet import telemetry, trends  # noqa: PLC0415

    devices: dict = {}
    for kind in kinds or ("",):
        found = None if known is None else known.get((node, kind))
        if found is None:
            found = counter_devices(conn, node, kind)
            if known is not None:
                known[(node, kind)] = found
        for device in found:
            devices.setdefault(trends.kind_of(device), []).append(device)
    out: list = []
    for kind, names in devices.items():
        counters = telemetry.COUNTERS.get(kind)
        if not names or not counters:
            continue
        sql = _JOB_SUMS.format(", ".join("?" * len(names)), ", ".join("?" * len(counters)))
        out += conn.execute(sql, (node, *names, *counters, start, end)).fetchall()
    return out


def job_telemetry(
    conn: sqlite3.Connection, spans: list, kinds: tuple = (), known: dict | None = None
) -> dict:
    """{node: telemetry.node_figures} of each (node, start, end) a job ran, from the node's
    counter rows in (start, end + the epilog's slack]. known: as job_counter_sums."""
    from slurmhealth.fleet import telemetry  # noqa: PLC0415

    out = {}
    for node, start, end in spans:
        slack = end + telemetry.EPILOG_SLACK_S
        rows = job_counter_sums(conn, node, start, slack, kinds, known)
        out[node] = telemetry.node_figures(rows, end - start)
    return out


# The nodes of one job end within this of each other (slurmd runs their epilogs together;
# accounting gives them one End): the rows read around a window to see each job whole.
JOB_END_SPREAD = 3600.0


def job_figures(conn: sqlite3.Connection, node: str, job_id: str) -> str | None:
    """The job's GPU figures the node's epilog recorded (jobs.gpu_energy), or None."""
    row = conn.execute(
        "SELECT gpu_energy FROM jobs WHERE node = ? AND job_id = ?", (node, job_id)
    ).fetchone()
    return row[0] if row else None


def held_back_jobs(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(node, time)] of held_back_findings: the node that held back each job, at its end."""
    return [(f["node"], f["time"]) for f in held_back_findings(conn, start, end)]


def held_back_findings(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[{node, time, job, finding}] of the node that held back each multi-node job whose last
    node ended in [start, end) (telemetry.held_back), at the job's end (time); nodes the prolog
    refused never ran it. A job is judged whole, in the one window its last end falls in: a
    window edge between its nodes' epilogs must not leave some of them out. Only the GPUs'
    policy counters and the job rows' `below_base` are read: a few key seeks per node of each
    job; the figures of a job with a finding are read to name its GPU and utilisation."""
    from slurmhealth.fleet import telemetry  # noqa: PLC0415

    jobs: dict = {}
    shares: dict = {}  # job -> {node: its worst GPU's share below base clocks}
    rows = conn.execute(
        "SELECT job_id, node, start, end, below_base FROM jobs WHERE end >= ? AND end < ? "
        "AND num_nodes > 1 AND start IS NOT NULL AND end > start "
        "AND coalesce(state, '') != 'prolog_failed'",
        (start - JOB_END_SPREAD, end + JOB_END_SPREAD),
    )
    for job_id, node, begin, finish, below in rows:
        jobs.setdefault(job_id, []).append((node, begin, finish))
        share = telemetry.share_of(below)
        if share is not None:
            shares.setdefault(job_id, {})[node] = {"share": share}
    out = []
    known: dict = {}  # each node's GPU devices, read once for all its jobs
    for job_id, spans in jobs.items():
        if len(spans) <= telemetry.MIN_OTHERS or not start <= max(s[2] for s in spans) < end:
            continue
        duration = max(s[2] for s in spans) - min(s[1] for s in spans)
        figures = job_telemetry(conn, spans, ("gpu",), known)
        found = telemetry.held_back(figures, duration, shares.get(job_id))
        if found:  # judged again on the nodes' whole figures, for the GPU and utilisation
            clocks = {n: telemetry.clock_figures(job_figures(conn, n, job_id)) for n, _, _ in spans}
            found = telemetry.held_back(figures, duration, clocks) or found
            ended = max(s[2] for s in spans)
            out.append({"node": found["node"], "time": ended, "job": job_id, "finding": found})
    return out
