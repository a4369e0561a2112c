"""Reading and pruning node stores (admin side: `slurmhealth history`, `slurmhealth prune`)."""

from __future__ import annotations

import glob
import os
import sqlite3

from slurmhealth.core import store


def store_paths(db: str | None, node: str | None) -> list:
    """--db, else the node's store, else every store in the state directory."""
    if db:
        return [db]
    if node:
        return [store.default_path(node)]
    return sorted(glob.glob(os.path.join(store.state_dir(), "*.db")))


def runs(
    conn: sqlite3.Connection, node: str | None, job: str | None, since: float, limit: int
) -> list:
    """Runs newest first, each with its non-ok results."""
    where, args = ["started >= ?"], [since]
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
        )
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
            }
        )
    return out


def actions(conn: sqlite3.Connection, node: str | None, since: float) -> list:
    sql = "SELECT node, time, action, reason, actor, ok, detail FROM actions WHERE time >= ?"
    args: list = [since]
    if node:
        sql += " AND node = ?"
        args.append(node)
    keys = ("node", "time", "action", "reason", "actor", "ok", "detail")
    return [dict(zip(keys, row)) for row in conn.execute(sql + " ORDER BY time DESC", args)]


def jobs(conn: sqlite3.Connection, job: str) -> list:
    keys = ("node", "job", "uid", "user", "start", "end", "exit_code", "signal")
    rows = conn.execute(
        "SELECT node, job_id, uid, user, start, end, exit_code, signal FROM jobs WHERE job_id = ?",
        (job,),
    )
    return [dict(zip(keys, row)) for row in rows]


# Children before parents; each table with the column that dates its rows.
_PRUNE = (
    ("results", "run_id IN (SELECT id FROM runs WHERE started < ?)"),
    ("events", "time < ?"),
    ("runs", "started < ?"),
    ("actions", "time < ?"),
    ("jobs", "coalesce(end, start) < ?"),
    ("published", "time < ?"),  # what `publish` wrote long ago: no job that old is published
)


def prune(conn: sqlite3.Connection, before: float) -> dict:
    """Delete records older than `before` in one transaction, then VACUUM (never in a hook)."""
    counts = {}
    with store.immediate(conn):
        for table, condition in _PRUNE:
            cursor = conn.execute(f"DELETE FROM {table} WHERE {condition}", (before,))  # noqa: S608
            counts[table] = cursor.rowcount
    conn.execute("VACUUM")
    return counts
