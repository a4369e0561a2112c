"""The node store: one SQLite file per node, WAL, busy timeout, schema versioned here only.

Many prologs may start at once on a shared node: every write is one short IMMEDIATE
transaction under a generous busy timeout, so writers queue instead of failing. Record ids are
stable (time-ordered and random once written, new_id; an Xid event's id derives from the
kernel-log record that carried it), so exported records import idempotently and two runs
reading the same record store it once. Plain sqlite3 on purpose: this module is on the
prolog/epilog hot path.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import TracebackType
    from typing import ParamSpec, TypedDict, TypeVar

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

    class _RunRow(TypedDict):
        node: str
        job_id: str | None
        phase: str
        started: float
        duration: float
        verdict: str
        tool_version: str
        sources: str  # JSON

    class RunRow(_RunRow, total=False):
        """A run as record_run takes it: the runs columns; `id` only when it was given one
        already (a spooled run, replayed)."""

        id: str

    class _RunRecords(TypedDict):
        run: RunRow
        results: list[dict[str, object]]
        events: list[dict[str, object]]
        baselines: dict[str, object]

    class RunRecords(_RunRecords, total=False):
        """One run and what it found, as record_run writes it: results and events by their
        columns (but run_id), baselines {area: data}, counter readings by their columns."""

        counters: list[dict[str, object]]

DEFAULT_DIR = "/var/lib/slurmhealth"
BUSY_TIMEOUT_S = 30.0


class Column:
    """One column: SQL type, NOT NULL, default, JSON text, the schema version that added it."""

    __slots__ = ("default", "json", "name", "required", "since", "type")

    def __init__(
        self,
        name: str,
        type_: str,
        required: bool = False,
        default: object = None,
        json_text: bool = False,
        since: int = 1,
    ) -> None:
        self.name, self.type, self.required = name, type_, required
        self.default, self.json, self.since = default, json_text, since

    def ddl(self) -> str:
        out = f"{self.name} {self.type}"
        out += " NOT NULL" if self.required else ""
        return out + (f" DEFAULT {_literal(self.default)}" if self.default is not None else "")


class Table:
    """A table: its columns in order, its key, the record kind it travels as (export/import,
    docs/fleet.md; None: node-local state that stays home), and what one row is."""

    __slots__ = ("columns", "key", "kind", "name", "row", "since")

    def __init__(
        self,
        name: str,
        key: tuple[str, ...],
        columns: tuple[Column, ...],
        kind: str | None,
        row: str,
        since: int = 1,
    ) -> None:
        self.name, self.key, self.columns = name, key, columns
        self.kind, self.row, self.since = kind, row, since

    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def create(self, version: int) -> str:
        cols = [c.ddl() for c in self.columns if c.since <= version]
        return f"CREATE TABLE {self.name} ({', '.join(cols)}, PRIMARY KEY ({', '.join(self.key)}))"


def _literal(value: object) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)


C = Column
# The one table spec: migrations, named inserts, export/import (fleet/records.py) and the table in
# docs/store.md (tests/core/test_store.py compares it) all come from here. Adding a column is one
# line here, with `since` the next version, plus that version's entry in INDEXES (even if empty).
TABLES = (
    Table(
        "runs",
        ("id",),
        (
            C("id", "TEXT"),
            C("node", "TEXT", True),
            C("job_id", "TEXT"),
            C("phase", "TEXT", True),
            C("started", "REAL", True),
            C("duration", "REAL", True),
            C("verdict", "TEXT", True),
            C("tool_version", "TEXT", True),
            C("sources", "TEXT", True, "{}", json_text=True),
        ),
        "run",
        "run of check, prolog, epilog or healthcheck",
    ),
    Table(
        "results",
        ("run_id", "check_name"),
        (
            C("run_id", "TEXT", True),
            C("check_name", "TEXT", True),
            C("status", "TEXT", True),
            C("message", "TEXT", True),
            C("action", "TEXT", True),
            C("data", "TEXT", True, "{}", json_text=True),
            C("duration", "REAL", True, 0.0),
        ),
        "result",
        "check of a run that was not ok",
    ),
    Table(
        "events",
        ("id",),
        (
            C("id", "TEXT"),
            C("run_id", "TEXT", True),
            C("node", "TEXT", True),
            C("job_id", "TEXT"),
            C("time", "REAL", True),
            C("kind", "TEXT", True),
            C("code", "INTEGER"),
            C("gpu", "INTEGER"),
            C("bus_id", "TEXT"),
            C("pid", "INTEGER"),
            C("process", "TEXT"),
            C("class", "TEXT"),
            C("action", "TEXT"),
            C("text", "TEXT"),
            C("repeats", "INTEGER"),
        ),
        "event",
        "Xid seen in the kernel log",
    ),
    Table(
        "jobs",
        ("node", "job_id"),
        (
            C("node", "TEXT", True),
            C("job_id", "TEXT", True),
            C("uid", "INTEGER"),
            C("user", "TEXT"),
            C("start", "REAL"),
            C("end", "REAL"),
            C("exit_code", "INTEGER"),
            C("signal", "INTEGER"),
            C("state", "TEXT"),
            C("num_nodes", "INTEGER", since=2),
            C("slurm_state", "TEXT", since=2),
            C("gpu_energy", "TEXT", json_text=True, since=9),
            C("below_base", "REAL", since=11),
        ),
        "job",
        "job on a node",
    ),
    Table(
        "actions",
        ("id",),
        (
            C("id", "TEXT"),
            C("node", "TEXT", True),
            C("time", "REAL", True),
            C("action", "TEXT", True),
            C("reason", "TEXT", True),
            C("actor", "TEXT", True),
            C("ok", "INTEGER", True, 1),
            C("detail", "TEXT", True, ""),
        ),
        "action",
        "drain, drain-skipped, breaker, resume, reset_gpu, reboot, remediated "
        "(docs/remediation.md)",
    ),
    Table(
        "meta",
        ("key",),
        (C("key", "TEXT"), C("value", "TEXT", True)),
        None,
        "key (the parsed-config cache)",
    ),
    Table(
        "baselines",
        ("node", "area", "job_id"),
        (
            C("node", "TEXT", True),
            C("area", "TEXT", True),
            C("job_id", "TEXT", True, ""),
            C("data", "TEXT", True, json_text=True),
            C("updated", "REAL", True),
        ),
        None,
        "area per node (job_id '') and per running job",
    ),
    Table(
        "published",
        ("job_id",),
        (
            C("job_id", "TEXT"),
            C("digest", "TEXT", True),
            C("time", "REAL", True),
            C("bytes", "INTEGER", True),
        ),
        None,
        "job whose summary `publish` wrote into its AdminComment (fleet store)",
        since=4,
    ),
    Table(
        "node_events",
        ("node", "start", "state"),
        (
            C("node", "TEXT", True),
            C("start", "REAL", True),
            C("state", "TEXT", True),
            C("end", "REAL"),
            C("reason", "TEXT", True, ""),
        ),
        None,
        "node down/drain/fail event from Slurm accounting (`sacctmgr show event`, fleet store)",
        since=5,
    ),
    Table(
        "counters",
        ("node", "device", "counter", "time"),
        (
            C("node", "TEXT", True),
            C("device", "TEXT", True),
            C("counter", "TEXT", True),
            C("time", "REAL", True),
            C("run_id", "TEXT"),
            C("value", "REAL", True),
            C("delta", "REAL"),
            C("label", "TEXT", True, ""),
        ),
        "counter",
        "error counter or gauge reading that changed since the node's previous reading",
        since=6,
    ),
    Table(
        "watermarks",
        ("source",),
        (
            C("source", "TEXT"),
            C("mark", "REAL"),
            C("identity", "TEXT", True, ""),
            C("updated", "REAL", True),
        ),
        None,
        "file `collect` read: its newest record time, or an NDJSON file's identity (fleet store)",
        since=7,
    ),
    Table(
        "run_hours",
        ("node", "hour", "phase"),
        (
            C("node", "TEXT", True),
            C("hour", "REAL", True),
            C("phase", "TEXT", True),
            C("runs", "INTEGER", True),
            C("duration", "REAL", True, 0.0),
        ),
        None,
        "node-hour of rolled-up passing runs: how many, their total wall time (fleet store)",
        since=7,
    ),
    Table(
        "places",
        ("node", "kind", "name"),
        (
            C("node", "TEXT", True),
            C("kind", "TEXT", True),
            C("name", "TEXT", True),
            C("first", "REAL", True),
            C("last", "REAL", True),
        ),
        None,
        "leaf switch, block or partition Slurm puts a node in, first and last seen (fleet store)",
        since=12,
    ),
)
del C
TABLE = {t.name: t for t in TABLES}
KINDS = {t.kind: t for t in TABLES if t.kind}  # record kinds that travel, in export order

# Indexes (and their changes) by the version that made them: what a table spec cannot say.
INDEXES = {
    1: (
        "CREATE INDEX runs_node_started ON runs (node, started)",
        "CREATE INDEX runs_job ON runs (job_id)",
        "CREATE INDEX events_node_time ON events (node, time)",
        "CREATE INDEX actions_node_time ON actions (node, time)",
    ),
    # 2: what Slurm accounting says of a job (sacct), and its size: multi-node failures are
    # lemon evidence.
    2: ("CREATE INDEX jobs_start ON jobs (start)", "CREATE INDEX runs_started ON runs (started)"),
    # 3: the lemon signals (fleet/signals.py) read each node's runs and jobs in a window from
    # covering indexes, and a job's hardware Xids by job (figures: docs/benchmarks.md). The
    # (node, started) index is widened, not doubled, so a prolog's write costs the same.
    3: (
        "DROP INDEX runs_node_started",
        "CREATE INDEX runs_node_started_verdict ON runs (node, started, verdict)",
        "CREATE INDEX jobs_node_start ON jobs (node, start, job_id, state, slurm_state, num_nodes)",
        "CREATE INDEX events_fail_job ON events (job_id, node) WHERE class = 'fail'",
    ),
    # 4: job summaries published into Slurm's AdminComment (fleet/jobs.py publish): jobs by
    # their end, so finding the recently finished ones reads an index range.
    4: ("CREATE INDEX jobs_end ON jobs (end)",),
    # 5: node events from Slurm accounting (fleet/accounting.py): which node of a NODE_FAIL job
    # failed (the lemon evidence, docs/lemons.md), read by time.
    5: ("CREATE INDEX node_events_start ON node_events (start)",),
    # 6: cumulative error counters over time (node/counters.py, fleet/trends.py): a reading is
    # stored only when it changed, so a healthy node adds no rows; the trends read by time.
    6: ("CREATE INDEX counters_time ON counters (time)",),
    # 7: a 10,000-node month (fleet/collect.py, fleet/rollup.py): what each collected file held
    # last time, so a cycle reads only what is new; passing runs older than a set age counted
    # per node-hour (the hour's first passing run stays a row), read by time.
    7: ("CREATE INDEX run_hours_hour ON run_hours (hour)",),
    # 8: the nightly report over a 10,000-node month (docs/benchmarks.md): runs by time with
    # their phase and duration, so slurmhealth's own cost and the diagnoses in a window read
    # the index alone. Widened, not doubled: a prolog's write costs the same. And the runs that
    # did not pass, by time: the few that have results (a partial index; a passing run's
    # write never touches it).
    8: (
        "DROP INDEX runs_started",
        "CREATE INDEX runs_started_phase ON runs (started, phase, duration)",
        "CREATE INDEX runs_not_ok ON runs (started, node, id) WHERE verdict != 'ok'",
    ),
    # 9: the energy each GPU of a job used, prolog to epilog (jobs.gpu_energy, node/counters.py
    # job_energy): no index, it is read with its job's row.
    9: (),
    # 10: the report and the lemon sweep over a 10,000-node month read indexes alone, where
    # they read a table row per record in time order: 10x the nodes had cost 14-20x the time
    # (each index's effect: CHANGELOG.md). The rolled-up hours with their count (6.8M
    # node-hours); the runs that did not pass with their verdict; the jobs that ended
    # NODE_FAIL, and those whose prolog failed, by start (few); the jobs by end with what the
    # held-back finding reads of them (the week's 375k node-jobs). A passing run's write never
    # touches the partial indexes. And runs by job only for the runs of a job: a health check
    # (most runs) no longer writes that index, nor does the hourly rollup's delete of 10,000
    # nodes' checks.
    10: (
        "DROP INDEX runs_job",
        "CREATE INDEX runs_job ON runs (job_id) WHERE job_id IS NOT NULL",
        "DROP INDEX jobs_end",
        "CREATE INDEX jobs_end ON jobs (end, num_nodes, start, state, node, job_id)",
        "DROP INDEX run_hours_hour",
        "CREATE INDEX run_hours_hour_runs ON run_hours (hour, runs)",
        "DROP INDEX runs_not_ok",
        "CREATE INDEX runs_not_ok ON runs (started, node, verdict, id) WHERE verdict != 'ok'",
        "CREATE INDEX jobs_node_fail ON jobs (start) WHERE slurm_state = 'NODE_FAIL'",
        "CREATE INDEX jobs_prolog_failed ON jobs (start) WHERE state = 'prolog_failed'",
    ),
    # 11: each job's worst GPU's share of the job below base clocks on the node (jobs.below_base,
    # node/counters.py below_share; the figures themselves are in gpu_energy), so the held-back
    # sweep reads the jobs by end from the index alone again: parsing each job row's figures
    # cost seconds over the 377k node-jobs of a 10,000-node week (CHANGELOG.md).
    11: (
        "DROP INDEX jobs_end",
        "CREATE INDEX jobs_end ON jobs (end, num_nodes, start, state, node, job_id, below_base)",
    ),
    # 12: where Slurm puts each node (fleet/accounting.py places: a leaf switch or block of its
    # topology, a partition), so faults that start together in one place are one incident
    # (fleet/faults.py shared). Read whole: a row per node and place.
    12: (),
    # 13: the health checks that recorded the node's versions (every 6 h or on a change), by
    # node and time: the GPU model each sweep pools nodes by, and the report's drift, read
    # these few rows where they read every run of the node's last two days to find them. And
    # the diagnoses by time, where the report read the whole window's time index to find
    # them. Partial indexes: a run that is neither never writes them (docs/benchmarks.md).
    13: (
        "CREATE INDEX runs_versions ON runs (node, started) "
        "WHERE instr(sources, '\"versions\"')",
        "CREATE INDEX runs_diag ON runs (started) WHERE phase = 'diag'",
    ),
}
SCHEMA_VERSION = max(INDEXES)


def migration(version: int) -> tuple[str, ...]:
    """The statements that take a store from version-1 to `version`."""
    out = [t.create(version) for t in TABLES if t.since == version]
    for table in TABLES:
        for col in table.columns:
            if table.since < col.since == version:
                out.append(f"ALTER TABLE {table.name} ADD COLUMN {col.ddl()}")
    return (*out, *INDEXES[version])


def insert_sql(
    table: str, columns: Sequence[str] | None = None, verb: str = "INSERT", tail: str = ""
) -> str:
    """A named insert: `VERB INTO table (columns) VALUES (?, ...) tail`; every column by
    default. Column names come from the spec, never from data."""
    names = columns or TABLE[table].names()
    marks = ", ".join("?" * len(names))
    return f"{verb} INTO {table} ({', '.join(names)}) VALUES ({marks}) {tail}".rstrip()


def row(table: str, record: Mapping[str, object]) -> tuple[object, ...]:
    """A record dict as a row of every column of `table`, in order (spec defaults for missing)."""
    return tuple(
        record[c.name] if record.get(c.name) is not None else c.default
        for c in TABLE[table].columns
    )


def markdown_tables() -> str:
    """The store's tables as docs/store.md shows them (kept equal by a test)."""
    lines = ["| table | one row per | columns |", "|---|---|---|"]
    for t in TABLES:
        cols = ", ".join(f"`{c.name}`" + (" (JSON)" if c.json else "") for c in t.columns)
        lines.append(f"| `{t.name}` | {t.row} | {cols} |")
    return "\n".join(lines)


class StoreError(Exception):
    """The store cannot be opened or written (read-only, full, corrupt): one line."""

    def __init__(self, message: str, corrupt: bool = False, bad_record: bool = False) -> None:
        super().__init__(message)
        self.corrupt = corrupt
        self.bad_record = bad_record  # the record cannot be stored (a constraint, a type), ever


def state_dir() -> str:
    """Where node stores live: $SLURMHEALTH_STATE_DIR or /var/lib/slurmhealth (node-local disk,
    never NFS: SQLite WAL needs local locking)."""
    return os.environ.get("SLURMHEALTH_STATE_DIR") or DEFAULT_DIR


def default_path(node: str) -> str:
    """$SLURMHEALTH_DB, else `<state dir>/<node>.db` (several slurmd on one host: one each)."""
    return os.environ.get("SLURMHEALTH_DB") or os.path.join(state_dir(), f"{node}.db")


# A fleet store on a PostgreSQL server is named by its URL (fleet/pgstore.py); node stores are
# always SQLite files.
SERVER_PREFIXES = ("postgresql://", "postgres://")


def fleet_path(db: str | None = None) -> str:
    """The fleet store: `db` (--db), else $SLURMHEALTH_FLEET_DB, else <DEFAULT_DIR>/fleet.db."""
    return db or os.environ.get("SLURMHEALTH_FLEET_DB") or os.path.join(DEFAULT_DIR, "fleet.db")


def _has(conn: sqlite3.Connection, table: str, record_id: str) -> bool:
    """Whether `table` (runs or actions: names from this module, never from input) holds the
    record with this id."""
    sql = f"SELECT 1 FROM {table} WHERE id = ?"  # noqa: S608 - the table is one of ours
    return conn.execute(sql, (record_id,)).fetchone() is not None


def new_id(at: float | None = None) -> str:
    """A run's or action's id: 24 hex digits, the time in microseconds (13, in order until the
    year 2112) then 44 random bits. `at`: the time, default now (bench/bench_ids.py gives
    simulated ones). Ids written together sit together in the id index, as rows do in the
    table: an import appends, and the hourly rollup deletes one range, where random ids touched
    a page per record (a 10,000-node day written and an hour of it deleted, both ways:
    bench/bench_ids.py, docs/benchmarks.md). Unique: 2^44 draws per
    microsecond."""
    micros = time.time_ns() // 1000 if at is None else int(at * 1e6)
    return f"{micros:013x}{int.from_bytes(os.urandom(6), 'big') >> 4:011x}"


class immediate:  # noqa: N801 - used like a function: `with immediate(conn):`
    """One write transaction: BEGIN IMMEDIATE (writers queue on the busy timeout), COMMIT, or
    ROLLBACK on any exception, a failed COMMIT (disk full) included."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            try:
                self.conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        else:
            self._rollback()

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
        for number in range(version + 1, SCHEMA_VERSION + 1):
            for statement in migration(number):
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def connect(
    path: str, busy_timeout: float = BUSY_TIMEOUT_S, existing: bool = False
) -> sqlite3.Connection:
    """Open (creating if needed) a store in WAL mode; StoreError with a one-line reason.

    A new store is root-only (0640 in a 0700 directory, both from their first byte, whatever the
    umask; SQLite gives -wal and -shm the file's mode): users read summaries through the admin
    path, never the file. A store whose directory someone else may change (SQLite opens it by
    name), or whose file, -wal or -shm someone else made or may write, is refused.
    `existing`: a command that reads a store names one (an empty file or another program's
    SQLite file is refused, never given our tables).
    """
    from slurmhealth.core import files  # noqa: PLC0415

    try:
        directory = os.path.dirname(os.path.abspath(path))
        files.private_dir(directory)
        why = files.others_may_write(directory)
        if why:
            raise files.Unsafe(path, f"refused: {why}")
        files.create_private(path, 0o640)
        for sidecar in (path + "-wal", path + "-shm"):
            files.refuse_foreign(sidecar)
        conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        if existing:  # before anything writes to it (journal_mode = WAL rewrites its header)
            _refuse_foreign(conn, path)
        _to_wal(conn, busy_timeout)
        conn.execute("PRAGMA synchronous = NORMAL")
        _migrate(conn)
    except sqlite3.DatabaseError as exc:
        # OperationalError (locked, read-only, cannot open) is a subclass: only the base class
        # and "malformed" mean the bytes are not a database.
        corrupt = type(exc) is sqlite3.DatabaseError or "malformed" in str(exc)
        raise StoreError(f"{path}: {exc}", corrupt) from None
    except files.Unsafe as exc:
        raise StoreError(str(exc)) from None  # it names the path already
    except OSError as exc:
        raise StoreError(f"{path}: {exc}") from None
    return conn


def kept_out(path: str) -> str | None:
    """Why this user (not root) cannot open the store at `path` it may read: SQLite writes its
    -shm and -wal beside a store it reads, and one of them, or the directory to make them in,
    or the store itself, is not theirs to write. None for root or with nothing in the way.
    Asked after connect failed, to say why in one line."""
    if os.geteuid() == 0:
        return None
    sidecars = [path + "-shm", path + "-wal"]
    present = [name for name in sidecars if os.path.exists(name)]
    blocked = [name for name in present if not os.access(name, os.R_OK | os.W_OK)]
    directory = os.path.dirname(os.path.abspath(path))
    if len(present) < len(sidecars) and not os.access(directory, os.W_OK | os.X_OK):
        blocked.append(directory)
    if not os.access(path, os.R_OK | os.W_OK):
        blocked.append(path)
    if not blocked:
        return None
    return f"SQLite writes beside a store it reads, and {blocked[0]} is not this user's to write"


def _to_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """WAL mode, once per store. Switching needs the file to itself, and SQLite answers a
    connection that waits for it while holding a read lock "database is locked" at once, busy
    timeout or not (deadlock avoidance): 16 processes opening a new store together lost one.
    Tried again, within the busy timeout, until this or another connection has switched it."""
    give_up = time.monotonic() + busy_timeout
    while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > give_up:
                raise
            time.sleep(0.005)


def _refuse_foreign(conn: sqlite3.Connection, path: str) -> None:
    """StoreError unless the database is one of ours (a schema version set by _migrate)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] > 0:
        return
    tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
    conn.close()
    what = "another program's SQLite database" if tables else "empty"
    raise StoreError(f"{path}: not a slurmhealth store ({what}): nothing written to it")


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file


def move_aside(path: str) -> str:
    """Rename a corrupt store (and its WAL files) out of the way; returns the new name."""
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    return aside


# SQLITE_CORRUPT and SQLITE_NOTADB reach Python as the base DatabaseError class; the messages
# say it too ("malformed" alone is not enough: SQL's JSON functions say "malformed JSON").
_CORRUPT = ("database disk image is malformed", "file is not a database")


def _translate(exc: sqlite3.Error) -> StoreError:
    """A sqlite3 error met after connect() as a one-line StoreError. A store whose header is
    fine but whose pages are damaged opens fine and fails here, at a read or a write:
    corrupt=True then, so the caller can move_aside() the file as connect() failures are."""
    text = str(exc)
    corrupt = type(exc) is sqlite3.DatabaseError or any(m in text for m in _CORRUPT)
    refused = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError)
    bad = isinstance(exc, refused)
    return StoreError(text, corrupt, bad)


def _translated(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """The store function with its sqlite3 errors as StoreError (see _translate)."""

    @functools.wraps(func)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except sqlite3.Error as exc:
            raise _translate(exc) from None

    return call


@_translated
def check_writable(conn: sqlite3.Connection) -> None:
    """StoreError when the store cannot take a write now (read-only, locked past the busy
    timeout): a command that only writes says so once, not once per file it was to merge."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("ROLLBACK")


@_translated
def get_meta(conn: sqlite3.Connection, key: str) -> object:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return json.loads(row[0]) if row else None


@_translated
def set_meta(conn: sqlite3.Connection, key: str, value: object) -> None:
    conn.execute(insert_sql("meta", verb="INSERT OR REPLACE"), (key, json.dumps(value)))


@_translated
def load_baselines(conn: sqlite3.Connection, node: str, job_id: str = "") -> dict[str, object]:
    """{area: data} saved by the previous run on this node (or by this job's prolog)."""
    rows = conn.execute(
        "SELECT area, data FROM baselines WHERE node = ? AND job_id = ?", (node, job_id)
    ).fetchall()
    return {area: json.loads(data) for area, data in rows}


_INSERT_EVENT = insert_sql(
    "events",
    tail="ON CONFLICT (id) DO UPDATE SET job_id = coalesce(excluded.job_id, events.job_id)",
)
_JOB_COLUMNS = TABLE["jobs"].names()[2:]


def _write_job(
    conn: sqlite3.Connection, node: str, job_id: str, job: Mapping[str, object]
) -> None:
    conn.execute("INSERT OR IGNORE INTO jobs (node, job_id) VALUES (?, ?)", (node, job_id))
    columns = [c for c in _JOB_COLUMNS if c in job]
    if columns:
        sets = ", ".join(f"{c} = ?" for c in columns)  # column names from the spec
        values = [job[c] for c in columns]
        since: tuple[object, ...]
        ended, since = "", ()
        if job.get("state") == "running" and isinstance(job.get("start"), (int, float)):
            # a prolog recorded after its job's epilog (a replay): the job has ended
            ended, since = " AND (end IS NULL OR end < ?)", (job["start"],)
        conn.execute(
            f"UPDATE jobs SET {sets} WHERE node = ? AND job_id = ?{ended}",  # noqa: S608
            (*values, node, job_id, *since),
        )


def record_run(
    conn: sqlite3.Connection,
    records: RunRecords,
    job: Mapping[str, object] | None = None,
    job_baselines: bool = False,
) -> str:
    """Write one run, its results, events, baselines and job row in one transaction.

    records: {"run": runs columns but id, "results": [results columns but run_id], "events":
    [events columns but run_id], "baselines": {area: data}} (the node agent's Run.records()).
    job: columns of the jobs row to set (prolog: uid, user, start; epilog: end, exit code).
    job_baselines: also keep this run's baselines under the job id (the prolog's, for the
    epilog's deltas).
    """
    run_id = records["run"].get("id") or new_id()
    now = time.time()
    run = dict(records["run"], id=run_id)
    node, job_id = records["run"]["node"], records["run"].get("job_id")
    results = [row("results", dict(r, run_id=run_id)) for r in records["results"]]
    events = [row("events", dict(e, run_id=run_id)) for e in records["events"]]
    counters = [
        row("counters", dict(c, node=node, run_id=run_id)) for c in records.get("counters") or ()
    ]
    keys = [""] + ([job_id] if job_baselines and job_id else [])
    baselines = [
        (node, area, key, json.dumps(data), now)
        for area, data in records["baselines"].items()
        for key in keys
    ]
    try:
        with immediate(conn):
            if records["run"].get("id") and _has(conn, "runs", run_id):
                return run_id  # a spooled copy of a run that was written after all
            conn.execute(insert_sql("runs"), row("runs", run))
            conn.executemany(insert_sql("results"), results)
            conn.executemany(_INSERT_EVENT, events)
            if counters:
                conn.executemany(insert_sql("counters", verb="INSERT OR IGNORE"), counters)
            conn.executemany(insert_sql("baselines", verb="INSERT OR REPLACE"), baselines)
            if job_id and job is not None:
                _write_job(conn, node, job_id, job)
    except sqlite3.Error as exc:
        raise _translate(exc) from None
    return run_id


@_translated
def attribute_events(
    conn: sqlite3.Connection, node: str, job_id: str, gpus: Sequence[int] | None
) -> int:
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
    args: list[object] = [job_id, node, row[0]]
    if gpus:
        sql += f" AND gpu IN ({', '.join('?' for _ in gpus)})"  # placeholders only
        args += list(gpus)
    return conn.execute(sql, args).rowcount


@_translated
def job_state(conn: sqlite3.Connection, node: str, job_id: str) -> str | None:
    """The hooks' state of a job on a node (running, ended, prolog_failed), or None."""
    row = conn.execute(
        "SELECT state FROM jobs WHERE node = ? AND job_id = ?", (node, job_id)
    ).fetchone()
    return row[0] if row else None


@_translated
def open_jobs(conn: sqlite3.Connection, node: str, since: float) -> list[str]:
    """[job_id] of the jobs whose prolog ran on the node at or after `since` and whose epilog
    has not (state 'running'): one range of the (node, start, ...) index."""
    rows = conn.execute(
        "SELECT job_id FROM jobs WHERE node = ? AND start >= ? AND state = 'running' "
        "ORDER BY start",
        (node, since),
    )
    return [r[0] for r in rows]


@_translated
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
    action_id: str | None = None,
) -> str:
    """A drain, resume, reset or refusal, with who did it and whether it worked. An
    `action_id` given (a spooled action, replayed) is written once: a second replay of the same
    one writes nothing."""
    try:
        if action_id and _has(conn, "actions", action_id):
            return action_id
        action_id = action_id or new_id()
        conn.execute(
            insert_sql("actions"),
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
        raise _translate(exc) from None
    return action_id


@_translated
def last_action(conn: sqlite3.Connection, node: str, action: str) -> tuple[float, str] | None:
    """(time, reason) of the node's latest successful action of this kind."""
    found: tuple[float, str] | None = conn.execute(
        "SELECT time, reason FROM actions WHERE node = ? AND action = ? AND ok = 1 "
        "ORDER BY time DESC LIMIT 1",
        (node, action),
    ).fetchone()
    return found


@_translated
def newest_action(
    conn: sqlite3.Connection, node: str
) -> tuple[str, str, str, bool, str] | None:
    """(action, reason, actor, ok, detail) of the node's latest action by anyone, or None."""
    row = conn.execute(
        "SELECT action, reason, actor, ok, detail FROM actions WHERE node = ? "
        "ORDER BY time DESC LIMIT 1",
        (node,),
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2], bool(row[3]), row[4])


@_translated
def recent_verdicts(
    conn: sqlite3.Connection, node: str, phase: str, since: float, limit: int
) -> list[str]:
    """Verdicts of the node's latest runs of a phase since a time, newest first."""
    rows = conn.execute(
        "SELECT verdict FROM runs WHERE node = ? AND phase = ? AND started >= ? "
        "ORDER BY started DESC LIMIT ?",
        (node, phase, since, limit),
    ).fetchall()
    return [row[0] for row in rows]


@_translated
def remediations(conn: sqlite3.Connection, node: str, since: float) -> list[float]:
    """Times of the node's remediations from `since` on, oldest first (node/ladder.py: the
    attempt limit): reboots Slurm took, and GPU resets the ladder made (their reason is ours;
    an epilog's routine reset of an idle GPU names the GPU alone and is not counted)."""
    rows = conn.execute(
        "SELECT time FROM actions WHERE node = ? AND time >= ? AND ok = 1 AND (action = "
        "'reboot' OR (action = 'reset_gpu' AND reason LIKE 'slurmhealth:%')) ORDER BY time",
        (node, since),
    )
    return [row[0] for row in rows]


@_translated
def latest_action(conn: sqlite3.Connection, node: str, action: str) -> tuple[float, bool] | None:
    """(time, ok) of the node's latest action of this kind, whether it worked or not."""
    row = conn.execute(
        "SELECT time, ok FROM actions WHERE node = ? AND action = ? ORDER BY time DESC LIMIT 1",
        (node, action),
    ).fetchone()
    return None if row is None else (row[0], bool(row[1]))


@_translated
def passed_diagnosis(conn: sqlite3.Connection, node: str, since: float) -> float | None:
    """When the node's latest diagnosis that passed (a `diag` run, verdict ok) started, if it
    started at or after `since`; else None."""
    row = conn.execute(
        "SELECT max(started) FROM runs WHERE node = ? AND phase = 'diag' AND verdict = 'ok' "
        "AND started >= ?",
        (node, since),
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


@_translated
def record_published(conn: sqlite3.Connection, job_id: str, digest: str, size: int) -> None:
    """Remember that `publish` wrote the job's summary (its digest and size in bytes) into
    its AdminComment, in one transaction (fleet/jobs.py)."""
    with immediate(conn):
        conn.execute(
            insert_sql("published", verb="INSERT OR REPLACE"),
            (job_id, digest, time.time(), size),
        )


def mark_of(conn: sqlite3.Connection, source: str) -> float | None:
    """How far `source` got (its watermarks row's mark), None when it never said."""
    row = conn.execute("SELECT mark FROM watermarks WHERE source = ?", (source,)).fetchone()
    return None if row is None else row[0]


@_translated
def record_mark(conn: sqlite3.Connection, source: str, mark: float) -> None:
    """Remember how far `source` got (a watermarks row; fleet/jobs.py: publish)."""
    with immediate(conn):
        conn.execute(
            insert_sql("watermarks", verb="INSERT OR REPLACE"), (source, mark, "", time.time())
        )


@_translated
def drain_history(conn: sqlite3.Connection, node: str) -> list[tuple[float, str]]:
    """[(time, action)] of slurmhealth's successful drains and resumes of the node, oldest
    first (node/actions.py: probation)."""
    rows = conn.execute(
        "SELECT time, action FROM actions WHERE node = ? AND ok = 1 AND action IN "
        "('drain', 'resume') ORDER BY time",
        (node,),
    )
    return [(when, action) for when, action in rows]


# Children before parents; each table with the column that dates its rows.
_PRUNE = (
    ("results", "run_id IN (SELECT id FROM runs WHERE started < ?)"),
    ("events", "time < ?"),
    ("runs", "started < ?"),
    ("actions", "time < ?"),
    ("jobs", "coalesce(end, start) < ?"),
    ("published", "time < ?"),  # what `publish` wrote long ago: no job that old is published
    ("counters", "time < ?"),
)


@_translated
def prune(conn: sqlite3.Connection, before: float, dry_run: bool = False) -> dict[str, int]:
    """Delete records older than `before` in one transaction, then VACUUM (admin side: never
    in a hook); {table: rows deleted}. dry_run: {table: rows that would go}, read in one
    statement (one snapshot), nothing deleted."""
    if dry_run:
        # table names and conditions from _PRUNE, never from data
        selects = ", ".join(f"(SELECT count(*) FROM {t} WHERE {c})" for t, c in _PRUNE)  # noqa: S608
        found = conn.execute(f"SELECT {selects}", (before,) * len(_PRUNE)).fetchone()
        return {table: n for (table, _), n in zip(_PRUNE, found)}
    counts: dict[str, int] = {}
    with immediate(conn):
        for table, condition in _PRUNE:
            cursor = conn.execute(f"DELETE FROM {table} WHERE {condition}", (before,))  # noqa: S608
            counts[table] = cursor.rowcount
    conn.execute("VACUUM")
    return counts


# Rows recent_events returns at most: a flood of events costs a run no more (a cost per row).
RECENT_EVENTS_MAX = 200


@_translated
def recent_events(
    conn: sqlite3.Connection,
    node: str,
    since: float,
    kind: str = "xid",
    classes: Sequence[str] | None = None,
    codes: Sequence[int] = (),
    limit: int = RECENT_EVENTS_MAX,
) -> list[dict[str, object]]:
    """The node's events of a kind recorded since a time, newest first, as plain dicts (id,
    time, code, gpu, bus_id, class, action, text, job_id, pid): what the node's checks
    remember (node/checks/xid.py). With `classes`, only rows of those classes or of one of
    `codes` (the agent: fatal Xids and Xid 13), so that a flood of other application Xids
    neither costs the read nor crowds out the rows that matter. One range read of the
    events_node_time index, at most `limit` rows."""
    sql = (
        "SELECT id, time, code, gpu, bus_id, class, action, text, job_id, pid FROM events "
        "WHERE node = ? AND time >= ? AND kind = ?"
    )
    args: list[object] = [node, since, kind]
    if classes is not None:
        marks = ", ".join("?" for _ in classes)
        code_marks = ", ".join("?" for _ in codes) or "NULL"
        sql += f" AND (class IN ({marks}) OR code IN ({code_marks}))"  # placeholders only
        args += [*classes, *codes]
    cursor = conn.execute(sql + " ORDER BY time DESC LIMIT ?", (*args, limit))
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor]
