"""Fleet stores and node stores as the hooks leave them, shared by the fleet store's tests."""

from __future__ import annotations

import io
import json
import os
import pathlib
import sqlite3

from conftest import FIXTURES, snapshot_path

from slurmhealth.core import files, store
from slurmhealth.fleet import records
from slurmhealth.node import config, runner

DAY = 86400.0
T0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
KEYS = {
    "runs": "id",
    "results": "run_id, check_name",
    "events": "id",
    "jobs": "node, job_id",
    "actions": "id",
    "counters": "node, device, counter, time",
}


def dump(conn: sqlite3.Connection) -> dict:
    """Every exported table, ordered by its record key."""
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY {k}").fetchall() for t, k in KEYS.items()}


def recorded_run(node: str, phase: str, snapshot: str, kmsg: str = "xid-forms.kmsg"):
    options = runner.Options(
        gpu_source=snapshot_path(snapshot), kmsg=os.path.join(FIXTURES, "kmsg", kmsg)
    )
    run = runner.run(node, config.defaults(), options, ["gpu", "xid"], phase)
    run.node = node
    return run


def moved_in(spool: pathlib.Path, name: str, node: str, live: bool = False) -> object:
    """A node store made in a private folder beside `spool` and moved into it (root never opens
    a store by name in a folder others may write: core/store.py). `live`: still open, with
    its -wal and -shm moved too and the connection on the moved files (returned)."""
    private = spool.parent / f".{name}.private"
    private.mkdir(mode=0o700, exist_ok=True)
    conn = node_store(str(private / name), node)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    if not live:
        conn.close()
    for suffix in ("", "-wal", "-shm"):
        if (private / (name + suffix)).exists():
            os.rename(private / (name + suffix), spool / (name + suffix))
    return conn if live else None


def node_store(path: str, node: str) -> sqlite3.Connection:
    """A node store as the hooks leave it: prolog/epilog of a job, a health check, a drain."""
    conn = store.connect(path)
    job = {"uid": 1000, "user": "alice", "start": T0, "state": "running", "num_nodes": 1}
    store.record_run(conn, recorded_run(node, "prolog", "healthy").records("41"), job)
    ended = {"end": T0 + 60, "state": "ended", "exit_code": 0, "signal": 0}
    store.record_run(conn, recorded_run(node, "epilog", "ecc-dbe").records("41"), ended)
    healthcheck = recorded_run(node, "healthcheck", "thermal", "hostile-names.kmsg")
    store.record_run(conn, healthcheck.records())
    store.record_action(conn, node, "drain", "slurmhealth: gpu.ecc", "slurmhealth epilog")
    return conn


def export_text(conn: sqlite3.Connection, since: float | None = None) -> str:
    out = io.StringIO()
    records.export(conn, out, since)
    return out.getvalue()


# --- incremental collection (a 10,000-node fleet): runs by id, export cycles ----------------------


def add_run(conn: sqlite3.Connection, run_id: str, started: float, verdict: str = "ok") -> None:
    row = (run_id, "gpu01", None, "healthcheck", started, 0.05, verdict, "v", "{}")
    conn.execute(store.insert_sql("runs"), row)


def run_ids(conn: sqlite3.Connection) -> set:
    return {run_id for (run_id,) in conn.execute("SELECT id FROM runs")}


def export_cycle(conn: sqlite3.Connection, path: str, now: float) -> dict:
    """One node's incremental export, as `export --incremental -o PATH` makes it."""
    since = records.incremental_since(conn, path, None)
    with files.open_private(path) as out:
        counts = records.export(conn, out, since)
    records.exported(conn, path, since, now)
    return counts


def spool_ids(path: str) -> set:
    with open(path) as handle:
        return {json.loads(line).get("id") for line in handle} - {None}


HOLD_LOCK = (
    "import sqlite3, sys, time\n"
    "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "conn.execute('BEGIN EXCLUSIVE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)
