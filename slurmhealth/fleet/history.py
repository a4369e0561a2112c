"""Which node stores the admin commands read and prune (`slurmhealth history`, `slurmhealth
prune`), history's reads of them and `history` itself; the pruning is store.prune."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import sqlite3
from typing import Any

from slurmhealth.core import store
from slurmhealth.core.command import CommandError, Console, denied
from slurmhealth.fleet import pgstore, text


def store_paths(db: str | None, node: str | None) -> list:
    """--db, else $SLURMHEALTH_DB, else the node's store, else every store in the state
    directory (store.default_path: $SLURMHEALTH_DB names the one store, as for the hooks).
    PermissionError when the state directory cannot be listed (it is root's): no stores found
    would read as no records."""
    db = db or os.environ.get("SLURMHEALTH_DB")
    if db:
        return [db]
    if node:
        return [store.default_path(node)]
    directory = store.state_dir()
    if os.path.isdir(directory):
        os.listdir(directory)  # glob says nothing of a directory it may not read
    return sorted(glob.glob(os.path.join(directory, "*.db")))


def read(
    conn: sqlite3.Connection,
    node: str | None,
    job: str | None,
    since: float,
    limit: int,
    failures: bool = False,
) -> tuple:
    """(runs, actions, jobs, rolled) of one store as the reads below give them (jobs only
    with a job; failures: only the runs that did not pass; rolled: the passing health checks a
    fleet store's rollup counts instead of keeping, none for a job); StoreError with one line
    when the store cannot be read (locked, damaged)."""
    try:
        runs = run_history(conn, node, job, since, limit, failures)
        actions = action_history(conn, node, since)
        jobs = job_history(conn, job) if job else []
        rolled = 0 if job else rolled_up(conn, node, since)
    except sqlite3.Error as exc:
        raise store.StoreError(str(exc)) from None
    return runs, actions, jobs, rolled


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
    where = ["started >= ?"]
    args: list[object] = [since]
    if failures:
        where.append("verdict != 'ok'")
    if node:
        where.append("node = ?")
        args.append(node)
    if job:
        where.append("job_id = ?")
        args.append(job)
    # Only the fixed clauses above are joined into the text; every value is a parameter.
    sql = f"SELECT id, node, job_id, phase, started, duration, verdict FROM runs WHERE {' AND '.join(where)} ORDER BY started DESC, id DESC LIMIT ?"  # noqa: S608, E501
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
    rows = conn.execute(sql + " ORDER BY time DESC, id DESC", args)
    return [dict(zip(keys, row)) for row in rows]


def job_history(conn: sqlite3.Connection, job: str) -> list:
    """[{node, job, uid, user, start, end, exit_code, signal}] of the job, one per node."""
    keys = ("node", "job", "uid", "user", "start", "end", "exit_code", "signal")
    rows = conn.execute(
        "SELECT node, job_id, uid, user, start, end, exit_code, signal FROM jobs WHERE job_id = ?",
        (job,),
    )
    return [dict(zip(keys, row)) for row in rows]


@dataclasses.dataclass(frozen=True)
class Request:
    """What one `slurmhealth history` is asked: --db, --node, --job, the start (--since back
    from --now), --limit, --quiet (only what did not pass) and --json."""

    db: str | None
    node: str | None
    job: str | None
    start: float
    limit: int = 200
    quiet: bool = False
    as_json: bool = False


def show(request: Request, console: Console) -> None:
    """`slurmhealth history`: every store's runs, drains and resumes, newest first, as text or
    JSON; CommandError with one line when a store cannot be listed, opened or read."""
    runs: list[dict[str, Any]] = []
    actions: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    rolled = 0
    for path in _paths(request):
        try:
            found = read(
                pgstore.open_store(path, "history"), request.node, request.job, request.start,
                request.limit, request.quiet,
            )  # fmt: skip
        except store.StoreError as exc:
            raise CommandError(f"{path}: {exc}") from None
        runs, actions, jobs = runs + found[0], actions + found[1], jobs + found[2]
        rolled += found[3]
    runs.sort(key=lambda r: _order(r["started"]), reverse=True)
    actions.sort(key=lambda a: _order(a["time"]), reverse=True)
    if request.as_json:  # json.dumps escapes control characters (and, ensure_ascii, all but ASCII)
        doc = {"runs": runs[: request.limit], "actions": actions, "jobs": jobs, "rolled_up": rolled}
        console.out(json.dumps(doc, indent=1, ensure_ascii=True, default=str))
        return
    shown = [] if request.job else actions
    if runs or shown or not request.quiet:  # quiet, and nothing went wrong: nothing to say
        console.out(text.history(runs[: request.limit], shown))
    if rolled and not request.quiet:
        console.out(
            f"{rolled:,} more passing health checks are counted per hour, not listed "
            "(collect --rollup-after)"
        )


def _paths(request: Request) -> list:
    """store_paths, a state directory this user may not list said as such."""
    try:
        return store_paths(request.db, request.node)
    except PermissionError as exc:
        raise CommandError(denied(os.path.join(str(exc.filename), "*.db"), "history")) from None


def _order(value: object) -> float:
    """A sort key for a stored time: the records of a forged store may hold any type."""
    return float(value) if isinstance(value, (int, float)) else float("-inf")
