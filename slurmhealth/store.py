"""The node store: one SQLite file per node, WAL, busy timeout, schema versioned here only.

Many prologs may start at once on a shared node: every write is one short IMMEDIATE
transaction under a generous busy timeout, so writers queue instead of failing. Record ids are
random and stable, so exported records import idempotently into a fleet store.
Plain sqlite3 on purpose: this module is on the prolog/epilog hot path.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time

from slurmhealth.runner import Run

DEFAULT_DIR = "/var/lib/slurmhealth"
BUSY_TIMEOUT_S = 30.0

# Schema versions, in order; the store's PRAGMA user_version says how many are applied.
MIGRATIONS = (
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY, node TEXT NOT NULL, job_id TEXT, phase TEXT NOT NULL,
        started REAL NOT NULL, duration REAL NOT NULL, verdict TEXT NOT NULL,
        tool_version TEXT NOT NULL, sources TEXT NOT NULL DEFAULT '{}');
    CREATE INDEX runs_node_started ON runs (node, started);
    CREATE INDEX runs_job ON runs (job_id);
    CREATE TABLE results (
        run_id TEXT NOT NULL REFERENCES runs(id), check_name TEXT NOT NULL,
        status TEXT NOT NULL, message TEXT NOT NULL, action TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}', duration REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, check_name));
    CREATE TABLE events (
        id TEXT PRIMARY KEY, run_id TEXT NOT NULL, node TEXT NOT NULL, job_id TEXT,
        time REAL NOT NULL, kind TEXT NOT NULL, code INTEGER, gpu INTEGER, bus_id TEXT,
        pid INTEGER, process TEXT, class TEXT, action TEXT, text TEXT, repeats INTEGER);
    CREATE INDEX events_node_time ON events (node, time);
    CREATE TABLE jobs (
        node TEXT NOT NULL, job_id TEXT NOT NULL, uid INTEGER, user TEXT,
        start REAL, end REAL, exit_code INTEGER, signal INTEGER, state TEXT,
        PRIMARY KEY (node, job_id));
    CREATE TABLE actions (
        id TEXT PRIMARY KEY, node TEXT NOT NULL, time REAL NOT NULL, action TEXT NOT NULL,
        reason TEXT NOT NULL, actor TEXT NOT NULL, ok INTEGER NOT NULL DEFAULT 1);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE baselines (
        node TEXT NOT NULL, area TEXT NOT NULL, job_id TEXT NOT NULL DEFAULT '',
        data TEXT NOT NULL, updated REAL NOT NULL, PRIMARY KEY (node, area, job_id));
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(Exception):
    """The store cannot be opened or written (read-only, full, corrupt)."""


def default_path(node: str) -> str:
    return os.environ.get("SLURMHEALTH_DB") or os.path.join(DEFAULT_DIR, f"{node}.db")


def new_id() -> str:
    return os.urandom(12).hex()


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"store schema {version} is newer than this slurmhealth ({SCHEMA_VERSION})"
        )
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
    for number in range(version, SCHEMA_VERSION):
        for statement in MIGRATIONS[number].split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("COMMIT")


def connect(path: str) -> sqlite3.Connection:
    """Open (creating if needed) a store in WAL mode; StoreError with a one-line reason."""
    try:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o755, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        _migrate(conn)
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(f"{path}: {exc}") from None
    return conn


def get_meta(conn: sqlite3.Connection, key: str) -> object:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return json.loads(row[0]) if row else None


def set_meta(conn: sqlite3.Connection, key: str, value: object) -> None:
    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))


def load_baselines(conn: sqlite3.Connection, node: str, job_id: str = "") -> dict:
    """{area: data} saved by the previous run on this node (or for this job)."""
    rows = conn.execute(
        "SELECT area, data FROM baselines WHERE node = ? AND job_id = ?", (node, job_id)
    ).fetchall()
    return {area: json.loads(data) for area, data in rows}


def _events(run: Run, run_id: str, job_id: str | None) -> list:
    """XID events as the xid checks classified them (config overrides and GPU index applied)."""
    rows = []
    for result in run.results:
        if result.check not in ("xid.hardware", "xid.application"):
            continue
        for ev in result.data.get("events", []):
            rows.append(
                (
                    new_id(),
                    run_id,
                    run.node,
                    job_id,
                    run.started,
                    "xid",
                    ev.get("xid"),
                    ev.get("gpu"),
                    ev.get("bus_id"),
                    ev.get("pid"),
                    ev.get("name"),
                    ev.get("class"),
                    ev.get("action"),
                    ev.get("text"),
                    ev.get("repeats", 1),
                )
            )
    return rows


def record_run(conn: sqlite3.Connection, r: Run, job_id: str | None = None) -> str:
    """Write one run, its results, its events and the new baselines in one transaction."""
    from slurmhealth import __version__  # noqa: PLC0415

    run_id = new_id()
    sources = json.dumps({k: v.to_dict() for k, v in r.sources.items()})
    results = [
        (
            run_id,
            x.check,
            x.status,
            x.message,
            x.action,
            json.dumps(x.data, default=str),
            x.duration,
        )
        for x in r.results
    ]
    baselines = [
        (r.node, area, json.dumps(data), time.time()) for area, data in r.baselines.items()
    ]
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                r.node,
                job_id,
                r.phase,
                r.started,
                r.duration,
                r.verdict,
                __version__,
                sources,
            ),
        )
        conn.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?)", results)
        conn.executemany(
            "INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", _events(r, run_id, job_id)
        )
        conn.executemany("INSERT OR REPLACE INTO baselines VALUES (?, ?, '', ?, ?)", baselines)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise StoreError(str(exc)) from None
    return run_id
