"""Lemon signals: the fleet store turned into per-node evidence counts (docs/signals.md)."""

from __future__ import annotations

import sqlite3

from slurmhealth.fleet import policy

# A loose index scan: each distinct node of a table in ~2,000 index seeks, not a full scan.
_NODES = """WITH RECURSIVE n(node) AS (
    SELECT min(node) FROM {0}
    UNION ALL
    SELECT (SELECT min(node) FROM {0} WHERE node > n.node) FROM n WHERE n.node IS NOT NULL)
    SELECT node FROM n WHERE node IS NOT NULL"""

# Per node over [start, end), each a range of a covering index (store migration 3): the cost
# follows the records in the window, not the size of the store.
_PER_NODE = (
    (
        "runs",
        ("", "check_fails", "check_warns", "node_days"),
        """SELECT count(*), sum(verdict = 'fail'), sum(verdict = 'warn'),
                  count(DISTINCT CAST(started / 86400 AS INTEGER))
           FROM runs WHERE node = ? AND started >= ? AND started < ?""",
    ),
    (
        "jobs",
        ("jobs", "hw_job_failures", "multi_node_jobs", "multi_node_failures"),
        """SELECT count(*),
                  sum(j.state = 'prolog_failed' OR j.slurm_state = 'NODE_FAIL'
                      OR EXISTS (SELECT 1 FROM events e WHERE e.job_id = j.job_id
                                 AND e.node = j.node AND e.class = 'fail')),
                  sum(j.num_nodes > 1),
                  sum(j.num_nodes > 1 AND j.slurm_state IN ('FAILED', 'NODE_FAIL'))
           FROM jobs j WHERE j.node = ? AND j.start >= ? AND j.start < ?""",
    ),
)
# Events and actions are few: one grouped query each.
_GROUPED = (
    (
        ("hw_xids", "warn_xids"),
        """SELECT node, sum(class = 'fail'), sum(class = 'warn')
           FROM events WHERE time >= ? AND time < ? GROUP BY node""",
    ),
    (
        ("drains",),
        """SELECT node, sum(action = 'drain' AND ok = 1)
           FROM actions WHERE time >= ? AND time < ? GROUP BY node""",
    ),
)


def _per_node(conn: sqlite3.Connection, table: str, sql: str, start: float, end: float):
    for (node,) in conn.execute(_NODES.format(table)).fetchall():
        row = conn.execute(sql, (node, start, end)).fetchone()
        if row[0]:
            yield node, row


def signals(conn: sqlite3.Connection, start: float, end: float) -> dict:
    """{node: {signal: count}} for every node with any record in [start, end), per
    docs/signals.md; application Xids and ordinary job failures count nowhere.

    One read transaction: a consistent snapshot while collect writes.
    """
    out: dict = {}

    def add(node: str, names: tuple, values: tuple) -> None:
        counts = out.get(node)
        if counts is None:
            counts = out[node] = dict.fromkeys(policy.SIGNALS, 0)
        for name, value in zip(names, values):
            if name:
                counts[name] = value or 0

    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        for table, names, sql in _PER_NODE:
            for node, row in _per_node(conn, table, sql, start, end):
                add(node, names, row)
        for names, sql in _GROUPED:
            for node, *values in conn.execute(sql, (start, end)):
                add(node, names, values)
    finally:
        if own:
            conn.execute("COMMIT")
    return {node: out[node] for node in sorted(out)}
