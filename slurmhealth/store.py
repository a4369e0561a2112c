"""The node store: one SQLite file per node, WAL, busy timeout, schema versioned here only.

Many prologs may start at once on a shared node: every write is one short IMMEDIATE
transaction under a generous busy timeout, so writers queue instead of failing. Record ids are
stable (random once written; an Xid event's id derives from the kernel-log record that carried
it), so exported records import idempotently and two runs reading the same record store it once.
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
        reason TEXT NOT NULL, actor TEXT NOT NULL, ok INTEGER NOT NULL DEFAULT 1,
        detail TEXT NOT NULL DEFAULT '');
    CREATE INDEX actions_node_time ON actions (node, time);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE baselines (
        node TEXT NOT NULL, area TEXT NOT NULL, job_id TEXT NOT NULL DEFAULT '',
        data TEXT NOT NULL, updated REAL NOT NULL, PRIMARY KEY (node, area, job_id));
    """,
    # 2: what Slurm accounting says of a job (sacct), and its size: multi-node failures are
    # lemon evidence (the node common to many failed multi-node jobs).
    """
    ALTER TABLE jobs ADD COLUMN num_nodes INTEGER;
    ALTER TABLE jobs ADD COLUMN slurm_state TEXT;
    CREATE INDEX jobs_start ON jobs (start);
    CREATE INDEX runs_started ON runs (started);
    """,
    # 3: the lemon signals (fleet.signals) read each node's runs and jobs in a window from
    # covering indexes, and a job's hardware Xids by job: 1M runs from 2,000 nodes in 0.5 s
    # instead of 3.7 s (docs/fleet.md). The (node, started) index is widened, not doubled, so a
    # prolog's write costs the same.
    """
    DROP INDEX runs_node_started;
    CREATE INDEX runs_node_started_verdict ON runs (node, started, verdict);
    CREATE INDEX jobs_node_start ON jobs (node, start, job_id, state, slurm_state, num_nodes);
    CREATE INDEX events_fail_job ON events (job_id, node) WHERE class = 'fail';
    """,
    # 4: job summaries published into Slurm's AdminComment (jobs.publish, docs/jobs.md): the
    # digest of what was written, so a rerun writes only changed summaries; jobs by their end,
    # so finding the recently finished ones reads an index range, not the whole table.
    """
    CREATE TABLE published (
        job_id TEXT PRIMARY KEY, digest TEXT NOT NULL, time REAL NOT NULL,
        bytes INTEGER NOT NULL);
    CREATE INDEX jobs_end ON jobs (end);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(Exception):
    """The store cannot be opened or written (read-only, full, corrupt): one line."""

    def __init__(self, message: str, corrupt: bool = False) -> None:
        super().__init__(message)
        self.corrupt = corrupt


def state_dir() -> str:
    """Where node stores live: $SLURMHEALTH_STATE_DIR or /var/lib/slurmhealth (node-local disk,
    never NFS: SQLite WAL needs local locking)."""
    return os.environ.get("SLURMHEALTH_STATE_DIR") or DEFAULT_DIR


def default_path(node: str) -> str:
    """$SLURMHEALTH_DB, else `<state dir>/<node>.db` (several slurmd on one host: one each)."""
    return os.environ.get("SLURMHEALTH_DB") or os.path.join(state_dir(), f"{node}.db")


def new_id() -> str:
    return os.urandom(12).hex()


class immediate:  # noqa: N801 - used like a function: `with immediate(conn):`
    """One write transaction: BEGIN IMMEDIATE (writers queue on the busy timeout), COMMIT, or
    ROLLBACK on any exception, a failed COMMIT (disk full) included."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        if kind is None:
            try:
                self.conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        else:
            self._rollback()
        return False

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"store schema {version} is newer than this slurmhealth ({SCHEMA_VERSION})"
        )
    if version == SCHEMA_VERSION:
        return
    with immediate(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process won?
        for number in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[number].split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def connect(path: str) -> sqlite3.Connection:
    """Open (creating if needed) a store in WAL mode; StoreError with a one-line reason.

    A new store is root-only writable (0640 in a 0755 directory): users read summaries through
    the admin path, never the file.
    """
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
        fresh = not os.path.exists(path)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        if fresh:
            os.chmod(path, 0o640)
        _migrate(conn)
    except sqlite3.DatabaseError as exc:
        # OperationalError (locked, read-only, cannot open) is a subclass: only the base class
        # and "malformed" mean the bytes are not a database.
        corrupt = type(exc) is sqlite3.DatabaseError or "malformed" in str(exc)
        raise StoreError(f"{path}: {exc}", corrupt) from None
    except OSError as exc:
        raise StoreError(f"{path}: {exc}") from None
    return conn


def move_aside(path: str) -> str:
    """Rename a corrupt store (and its WAL files) out of the way; returns the new name."""
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    return aside


def get_meta(conn: sqlite3.Connection, key: str) -> object:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return json.loads(row[0]) if row else None


def set_meta(conn: sqlite3.Connection, key: str, value: object) -> None:
    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))


def load_baselines(conn: sqlite3.Connection, node: str, job_id: str = "") -> dict:
    """{area: data} saved by the previous run on this node (or by this job's prolog)."""
    rows = conn.execute(
        "SELECT area, data FROM baselines WHERE node = ? AND job_id = ?", (node, job_id)
    ).fetchall()
    return {area: json.loads(data) for area, data in rows}


def _event_rows(run: Run, run_id: str, job_id: str | None) -> list:
    """Xid events as the xid checks classified them (config overrides and GPU index applied).

    Only the epilog attributes events to the job, and only those on the job's GPUs: what a
    prolog reads happened before the job.
    """
    boot = (run.facts.get("xid") or {}).get("boot_id") or ""
    rows = []
    for result in run.results:
        if result.check not in ("xid.hardware", "xid.application"):
            continue
        for ev in result.data.get("events", []):
            owner = job_id if run.phase == "epilog" and ev.get("job", True) else None
            event_id = f"xid:{run.node}:{boot}:{ev.get('seq')}:{ev.get('xid')}"
            rows.append(
                (
                    event_id,
                    run_id,
                    run.node,
                    owner,
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


_INSERT_EVENT = """
    INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
    ON CONFLICT (id) DO UPDATE SET job_id = coalesce(excluded.job_id, events.job_id)"""


def _write_job(conn: sqlite3.Connection, node: str, job_id: str, job: dict) -> None:
    conn.execute("INSERT OR IGNORE INTO jobs (node, job_id) VALUES (?, ?)", (node, job_id))
    known = ("uid", "user", "start", "end", "exit_code", "signal", "state", "num_nodes")
    columns = [c for c in (*known, "slurm_state") if c in job]
    if columns:
        sets = ", ".join(f"{c} = ?" for c in columns)  # column names from the fixed list above
        values = [job[c] for c in columns]
        conn.execute(
            f"UPDATE jobs SET {sets} WHERE node = ? AND job_id = ?",  # noqa: S608
            (*values, node, job_id),
        )


def record_run(
    conn: sqlite3.Connection,
    r: Run,
    job_id: str | None = None,
    job: dict | None = None,
    job_baselines: bool = False,
) -> str:
    """Write one run, its results, events, baselines and job row in one transaction.

    job: columns of the jobs row to set (prolog: uid, user, start; epilog: end, exit code).
    job_baselines: also keep this run's baselines under the job id (the prolog's, for the
    epilog's deltas).
    """
    from slurmhealth import __version__  # noqa: PLC0415

    run_id = new_id()
    now = time.time()
    sources = json.dumps({k: v.to_dict(r.record_versions) for k, v in r.sources.items()})
    # Only what is not ok is kept per check (an ok check says nothing the verdict doesn't): a
    # node's history stays small with a health check every few minutes.
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
        if x.status != "ok"
    ]
    keys = [""] + ([job_id] if job_baselines and job_id else [])
    baselines = [
        (r.node, area, key, json.dumps(data), now)
        for area, data in r.baselines.items()
        for key in keys
    ]
    try:
        with immediate(conn):
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
            conn.executemany(_INSERT_EVENT, _event_rows(r, run_id, job_id))
            conn.executemany("INSERT OR REPLACE INTO baselines VALUES (?, ?, ?, ?, ?)", baselines)
            if job_id and job is not None:
                _write_job(conn, r.node, job_id, job)
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None
    return run_id


def attribute_events(conn: sqlite3.Connection, node: str, job_id: str, gpus: list | None) -> int:
    """Give the job the Xids other runs (health checks) read while it ran on its GPUs.

    A health check during a job reads the kernel log first and records the Xids without a job;
    the epilog then claims those read after the job's prolog, on the job's GPUs (or on an
    unknown GPU when the job's GPUs are unknown)."""
    row = conn.execute(
        "SELECT start FROM jobs WHERE node = ? AND job_id = ?", (node, job_id)
    ).fetchone()
    if not row or row[0] is None:
        return 0
    sql = "UPDATE events SET job_id = ? WHERE node = ? AND job_id IS NULL AND time > ?"
    args: list = [job_id, node, row[0]]
    if gpus:
        sql += f" AND gpu IN ({', '.join('?' for _ in gpus)})"  # placeholders only
        args += list(gpus)
    return conn.execute(sql, args).rowcount


def forget_job_baselines(conn: sqlite3.Connection, node: str, job_id: str) -> None:
    conn.execute("DELETE FROM baselines WHERE node = ? AND job_id = ?", (node, job_id))


def record_action(
    conn: sqlite3.Connection,
    node: str,
    action: str,
    why: str,
    actor: str,
    ok: bool = True,
    detail: str = "",
    when: float | None = None,
) -> str:
    """A drain, resume, reset or refusal, with who did it and whether it worked."""
    action_id = new_id()
    try:
        conn.execute(
            "INSERT INTO actions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                action_id,
                node,
                time.time() if when is None else when,
                action,
                why,
                actor,
                int(ok),
                detail,
            ),
        )
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None
    return action_id


def last_action(conn: sqlite3.Connection, node: str, action: str) -> tuple | None:
    """(time, reason) of the node's latest successful action of this kind."""
    return conn.execute(
        "SELECT time, reason FROM actions WHERE node = ? AND action = ? AND ok = 1 "
        "ORDER BY time DESC LIMIT 1",
        (node, action),
    ).fetchone()


def recent_verdicts(
    conn: sqlite3.Connection, node: str, phase: str, since: float, limit: int
) -> list:
    """Verdicts of the node's latest runs of a phase since a time, newest first."""
    rows = conn.execute(
        "SELECT verdict FROM runs WHERE node = ? AND phase = ? AND started >= ? "
        "ORDER BY started DESC LIMIT ?",
        (node, phase, since, limit),
    ).fetchall()
    return [row[0] for row in rows]
