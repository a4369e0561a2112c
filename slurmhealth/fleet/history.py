"""Which node stores the admin commands read and prune (`slurmhealth history`, `slurmhealth
prune`): their reads are fleet/queries.py's, the pruning is store.prune."""

from __future__ import annotations

import glob
import os
import sqlite3

from slurmhealth.core import store
from slurmhealth.fleet import queries


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
    """(runs, actions, jobs, rolled) of one store as fleet/queries.py reads them (jobs only
    with a job; failures: only the runs that did not pass; rolled: the passing health checks a
    fleet store's rollup counts instead of keeping, none for a job); StoreError with one line
    when the store cannot be read (locked, damaged)."""
    try:
        runs = queries.run_history(conn, node, job, since, limit, failures)
        actions = queries.action_history(conn, node, since)
        jobs = queries.job_history(conn, job) if job else []
        rolled = 0 if job else queries.rolled_up(conn, node, since)
    except sqlite3.Error as exc:
        raise store.StoreError(str(exc)) from None
    return runs, actions, jobs, rolled
