"""The fleet store: every node's records in one SQLite file on the head node.

Node stores stay node-local (SQLite's WAL needs local locking, never NFS); what travels is an
NDJSON export or a copy of the file. `export` writes records with their stable ids, `import_ndjson`
and `collect` merge them idempotently, `ingest_sacct` adds what Slurm accounting knows (a job whose
node died before its epilog; `ingest_events`, which nodes went down), and `signals` turns the
fleet store into the lemon evidence of docs/signals.md. At scale (docs/fleet.md, "Incremental
collection"), exports and collect read only what is new (watermarks), spool files are claimed
and removed once merged, and `rollup` counts old passing health checks per node-hour. The
record format is docs/fleet.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Optional
from urllib.parse import quote

from slurmhealth import __version__
from slurmhealth.core import files, store
from slurmhealth.core.hostlist import is_node_name
from slurmhealth.core.result import clean, counted

FORMAT = 1  # the NDJSON record format (docs/fleet.md); a newer one is refused
CHUNK = 50_000  # records per import transaction (measured: docs/fleet.md)
BAD_SHOWN = 10  # bad lines reported one by one; the rest are counted
Progress = Optional[Callable[[int], None]]


class Kind:
    """One record type as it travels: its table, columns, the ones a record must carry (keys
    and NOT NULL without a default), defaults and JSON-text columns: all from the store's
    table spec (core/store.py TABLES)."""

    def __init__(self, table: store.Table) -> None:
        self.table = table.name
        self.columns = table.names()
        self.required = tuple(
            i
            for i, c in enumerate(table.columns)
            if (c.required or c.name in table.key) and c.default is None
        )
        self.defaults = tuple(
            (i, c.default) for i, c in enumerate(table.columns) if c.default is not None
        )
        self.json = tuple(i for i, c in enumerate(table.columns) if c.json)
        self.types = tuple((i, c.type) for i, c in enumerate(table.columns))
        self.node = self.columns.index("node") if "node" in self.columns else None
        # The same checks in SQL, for a node store merged whole (ATTACH): a row that fails
        # them is left out, as a bad NDJSON line is.
        self.times = tuple(i for i, c in enumerate(table.columns) if c.name in _TIMES)
        terms = [_SQL_TYPES[c.type].format(c.name) for c in table.columns]
        terms += [_SQL_TIME.format(c.name) for c in table.columns if c.name in _TIMES]
        self.valid_sql = " AND ".join(terms)  # node names: _merge_attached's _bad_nodes


# What each SQL type of the table spec takes: an import of a string where a time or a count
# belongs, or of a float exit code, stopped every reader that met it (a traceback in `report`).
_SQL_TYPES = {
    "INTEGER": "({0} IS NULL OR typeof({0}) = 'integer')",
    "REAL": "({0} IS NULL OR typeof({0}) IN ('integer', 'real'))",
    "TEXT": "({0} IS NULL OR typeof({0}) = 'text')",
}


# Columns that hold a time (epoch seconds): from 1970 to the year 9999, as every reader's date
# formatting can show (a run "started" at -1e308 stopped the rollup with an OverflowError).
_TIMES = frozenset(("started", "time", "start", "end", "hour", "mark", "updated"))
TIME_MAX = 253402300800.0  # 10000-01-01T00:00:00Z
_SQL_TIME = "({0} IS NULL OR ({0} >= 0 AND {0} < " + repr(TIME_MAX) + "))"


def _typed(value: object, wanted: str) -> bool:
    if wanted == "TEXT":
        return type(value) is str
    if wanted == "INTEGER":
        return type(value) is int
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


KINDS = {kind: Kind(table) for kind, table in store.KINDS.items()}

# Merge rules. Id'd records never change once written, except an event's job: the epilog may
# attribute an Xid that a health check stored first. A job row fills in as its prolog, epilog
# and accounting report: a value is never replaced by a null, a known value is kept, and the
# state columns only move forward (running -> ended; RUNNING -> COMPLETED), NODE_FAIL and
# prolog_failed being final (a requeued job that failed here once did fail here).
_STATE_RANK = "CASE {0} WHEN 'running' THEN 1 WHEN 'prolog_failed' THEN 3 ELSE 2 END"
_SLURM_PENDING = (
    "'PENDING','RUNNING','REQUEUED','REQUEUE_HOLD','REQUEUE_FED','SUSPENDED','RESIZING',"
    "'CONFIGURING','COMPLETING','SIGNALING','STAGE_OUT','STOPPED'"
)
_SLURM_RANK = (
    "CASE WHEN {0} = 'NODE_FAIL' THEN 3 WHEN {0} IN (" + _SLURM_PENDING + ") THEN 1 ELSE 2 END"
)


def _forward(column: str, rank: str) -> str:
    new, old = f"excluded.{column}", f"jobs.{column}"
    return (
        f"CASE WHEN {new} IS NOT NULL AND ({old} IS NULL OR "
        f"{rank.format(new)} >= {rank.format(old)}) THEN {new} ELSE {old} END"
    )


def _job_merge() -> str:
    merged = {c: f"coalesce(jobs.{c}, excluded.{c})" for c in KINDS["job"].columns[2:]}
    merged["state"] = _forward("state", _STATE_RANK)
    merged["slurm_state"] = _forward("slurm_state", _SLURM_RANK)
    sets = ", ".join(f"{c} = {expr}" for c, expr in merged.items())
    changed = " OR ".join(f"({expr}) IS NOT jobs.{c}" for c, expr in merged.items())
    return f"ON CONFLICT (node, job_id) DO UPDATE SET {sets} WHERE {changed}"


_CONFLICT = {
    "event": "ON CONFLICT (id) DO UPDATE SET job_id = excluded.job_id "
    "WHERE events.job_id IS NULL AND excluded.job_id IS NOT NULL",
    "job": _job_merge(),
}


def _insert(kind: str, source: str) -> str:
    """INSERT of one record type from `source` (VALUES or a SELECT ... WHERE), merged."""
    spec = KINDS[kind]
    verb = "INSERT" if kind in _CONFLICT else "INSERT OR IGNORE"
    return (
        f"{verb} INTO {spec.table} ({', '.join(spec.columns)}) {source} {_CONFLICT.get(kind, '')}"
    )


_VALUES = {k: _insert(k, f"VALUES ({', '.join('?' * len(s.columns))})") for k, s in KINDS.items()}


def _changes(conn: sqlite3.Connection, sql: str, args: Iterable, many: bool = False) -> int:
    before = conn.total_changes
    if many:
        conn.executemany(sql, args)
    else:
        conn.execute(sql, tuple(args))
    return conn.total_changes - before


# Node events from Slurm accounting (fleet store only, never exported; accounting.ingest_events):
# keyed by (node, start, state). An event merged while open gets its end when it closes; a known
# end or reason is kept (so merging an older answer after a newer one undoes nothing), and a row
# merged again changes nothing.
_NODE_EVENTS = store.insert_sql(
    "node_events",
    tail="ON CONFLICT (node, start, state) DO UPDATE SET "
    "end = coalesce(node_events.end, excluded.end), "
    "reason = CASE node_events.reason WHEN '' THEN excluded.reason ELSE node_events.reason END "
    "WHERE (node_events.end IS NULL AND excluded.end IS NOT NULL) "
    "OR (node_events.reason = '' AND excluded.reason != '')",
)


def merge_node_events(conn: sqlite3.Connection, rows: Iterable) -> int:
    """Merge node_events rows (every column, in the spec's order); how many changed. The caller
    holds the transaction."""
    return _changes(conn, _NODE_EVENTS, rows, many=True)


# A node seen in a place again keeps its first sighting and moves its last one on.
_PLACES = store.insert_sql(
    "places",
    tail="ON CONFLICT (node, kind, name) DO UPDATE SET last = max(last, excluded.last), "
    "first = min(first, excluded.first)",
)


def merge_places(conn: sqlite3.Connection, rows: Iterable) -> int:
    """Merge places rows (node, kind, name, first, last); how many. The caller holds the
    transaction."""
    return _changes(conn, _PLACES, rows, many=True)


# ---------------------------------------------------------------------------------------------
# export


# What dates a record for `--since`; a job by its end, else its start (sacct may know neither).
# An event is also new when its job ended since: the epilog gives a job the Xids a health check
# recorded while it ran (store.attribute_events), which may be older than `since`.
_DATED = {
    "run": "started >= ?",
    "result": "run_id IN (SELECT id FROM runs WHERE started >= ?)",
    "event": "(time >= ? OR job_id IN (SELECT job_id FROM jobs WHERE end >= ?))",
    "job": "coalesce(end, start, ?) >= ?",
    "action": "time >= ?",
    "counter": "time >= ?",
}


def _dated(kind: str, since: float | None, prefix: str = "") -> tuple:
    """(WHERE condition, args) selecting records newer than `since` (everything for None)."""
    if since is None:
        return "1", ()
    condition = _DATED[kind].replace("FROM runs", f"FROM {prefix}runs")
    condition = condition.replace("FROM jobs", f"FROM {prefix}jobs")
    return condition, (since,) * condition.count("?")


def export(
    conn: sqlite3.Connection, out, since: float | None = None, progress: Progress = None
) -> dict:
    """Write every record (or those newer than `since`) to `out` as NDJSON; returns counts.

    One read transaction: the export is a consistent snapshot while prologs keep writing.
    Baselines and meta are node-local state and stay home.
    """
    counts = dict.fromkeys(KINDS, 0)
    header = {"type": "header", "format": FORMAT, "schema": store.SCHEMA_VERSION}
    header.update(tool_version=__version__, exported=time.time(), since=since)
    out.write(json.dumps(header, separators=(",", ":")) + "\n")
    conn.execute("BEGIN")
    try:
        for kind, spec in KINDS.items():
            where, args = _dated(kind, since)
            sql = f"SELECT {', '.join(spec.columns)} FROM {spec.table} WHERE {where}"  # noqa: S608
            for row in conn.execute(sql, args):
                record = {"type": kind}
                record.update(zip(spec.columns, row))
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
                counts[kind] += 1
                if progress and counts[kind] % 1000 == 0:
                    progress(1000)
            if progress:
                progress(counts[kind] % 1000)
    finally:
        conn.execute("COMMIT")
    return counts


def count_records(conn: sqlite3.Connection, since: float | None = None) -> int:
    """How many records `export` would write (for a progress bar)."""
    total = 0
    for kind, spec in KINDS.items():
        where, args = _dated(kind, since)
        sql = f"SELECT count(*) FROM {spec.table} WHERE {where}"  # noqa: S608
        total += conn.execute(sql, args).fetchone()[0]
    return total


# Incremental export (`export --incremental -o FILE`, docs/fleet.md): a node writes what is new
# since its previous export, by the node's own clock. A record is dated when its run starts but
# committed when the run ends (the hooks' deadline: 10 s by default), so each export starts
# OVERLAP seconds before the previous one's snapshot; overlapping records import idempotently.
# The previous file still in place, unread (collect --consume removes what it merged), the next
# one starts where that one started: a collect that did not come loses nothing.
OVERLAP = 120.0


def _export_key(path: str) -> str:
    return f"export:{os.path.abspath(path)}"


def _identity(path: str) -> str | None:
    """dev:inode of the regular file at `path` (not followed), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}" if stat.S_ISREG(st.st_mode) else None


def incremental_since(conn: sqlite3.Connection, path: str, floor: float | None) -> float | None:
    """Where an incremental export to `path` starts: where the previous export to it started
    while that file is still there unread, else OVERLAP before its snapshot; never before
    `floor` (`--since`); everything (None) the first time without a floor."""
    state = store.get_meta(conn, _export_key(path)) or {}
    if state.get("file") and state["file"] == _identity(path):
        since = state.get("since")
    else:
        since = state["mark"] - OVERLAP if state.get("mark") is not None else None
    if floor is not None:
        since = floor if since is None else max(since, floor)
    return since


def exported(conn: sqlite3.Connection, path: str, since: float | None, mark: float) -> None:
    """Remember an incremental export to `path` (renamed into place): where it started and its
    snapshot time `mark`, taken before it read the store (node-local meta, never exported)."""
    state = {"since": since, "mark": mark, "file": _identity(path)}
    store.set_meta(conn, _export_key(path), state)


# ---------------------------------------------------------------------------------------------
# import


class FleetError(Exception):
    """An input that cannot be merged at all (a newer format, an unreadable file): one line."""


class StoreFault(FleetError):
    """The fleet store (or the temporary space a merge copies into) stopped taking writes:
    locked past the busy timeout, full, read-only, failing I/O. Not one file's fault: collect
    stops at once, one line, instead of skipping, and waiting for, every file after it."""


# SQLite's messages for a store that cannot take writes, whatever the file being merged.
_STORE_FAULTS = (
    "database is locked",
    "database or disk is full",
    "disk i/o error",
    "readonly database",
    "unable to open database file",
)


def _store_fault(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(
        m in str(exc).lower() for m in _STORE_FAULTS
    )


def _row(record: dict) -> tuple:
    """(kind, row) of one parsed record; ValueError saying why it is not a record."""
    kind = record.get("type")
    spec = KINDS.get(kind)  # type: ignore[arg-type]
    if spec is None:
        raise ValueError(f"unknown record type {kind!r}")
    row = [record.get(c) for c in spec.columns]
    for i, default in spec.defaults:
        if row[i] is None:
            row[i] = default
    for i in spec.json:  # JSON columns may come as text (as exported) or as objects
        if isinstance(row[i], (dict, list)):
            row[i] = json.dumps(row[i])
    missing = [spec.columns[i] for i in spec.required if row[i] is None]
    if missing:
        raise ValueError(f"{kind} without {', '.join(missing)}")
    for i, wanted in spec.types:
        if row[i] is not None and not _typed(row[i], wanted):
            raise ValueError(f"{kind} {spec.columns[i]} is not {wanted.lower()}: {row[i]!r:.40}")
    for i in spec.times:
        if row[i] is not None and not 0 <= row[i] < TIME_MAX:
            raise ValueError(f"{kind} {spec.columns[i]} is no time: {row[i]!r:.40}")
    if spec.node is not None and not is_node_name(row[spec.node]):
        raise ValueError(f"{kind} node is not a node name: {row[spec.node]!r:.40}")
    for value in row:
        if value is None or (type(value) is str and value.isascii()) or not _unstorable(value):
            continue
        raise ValueError(f"{kind} with a value SQLite cannot store: {value!r:.40}")
    return kind, tuple(row)


def _unstorable(value: object) -> bool:
    """What would fail a whole chunk's insert: not text or a number, NaN (stored as NULL), an
    integer beyond 64 bits, a lone surrogate (JSON allows \\ud800; UTF-8 does not)."""
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, int):
        return not -(2**63) <= value < 2**63
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    return True


def _header(record: dict) -> None:
    if not isinstance(record.get("format"), int) or record["format"] > FORMAT:
        raise FleetError(
            f"record format {record.get('format')!r} is newer than this slurmhealth ({FORMAT})"
        )


class _Chunk:
    """Up to CHUNK parsed lines: rows per record type, and the lines that were not records."""

    def __init__(self) -> None:
        self.rows: dict = {k: [] for k in KINDS}
        self.size = 0
        self.bytes = 0
        self.bad: list = []  # (line number, why)
        self.truncated = None  # the line number of a cut last line


def _chunks(lines: Iterable) -> Iterator:
    """Parse NDJSON lines into _Chunks. A bad last line without a newline is `truncated`."""
    chunk, last_bad, lineno = _Chunk(), None, 0
    for lineno, line in enumerate(lines, 1):  # noqa: B007 - lineno is used after the loop
        chunk.bytes += len(line)
        last_bad = None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            if record.get("type") == "header":
                _header(record)
                continue
            kind, row = _row(record)
        except (ValueError, RecursionError) as exc:
            last_bad = line
            chunk.bad.append((lineno, clean(exc, 120)))
            continue
        chunk.rows[kind].append(row)
        chunk.size += 1
        if chunk.size >= CHUNK:
            yield chunk
            chunk = _Chunk()
    if last_bad is not None and last_bad[-1:] not in ("\n", b"\n"):
        chunk.truncated = chunk.bad.pop()[0]
    yield chunk


def _write(conn: sqlite3.Connection, chunk: _Chunk, report: dict) -> None:
    """One transaction: every row of the chunk lands, or none does."""
    try:
        with store.immediate(conn):
            _apply(conn, chunk, report)
    except sqlite3.Error as exc:
        kind = StoreFault if _store_fault(exc) else FleetError
        done = counted(report["records"], "record", spec=",")
        raise kind(f"after {done}: {clean(exc, 120)}") from None


def _apply(conn: sqlite3.Connection, chunk: _Chunk, report: dict) -> None:
    """Insert a chunk's rows (the caller holds the transaction) and count them into `report`."""
    added = dict.fromkeys(KINDS, 0)
    for kind, rows in chunk.rows.items():
        if rows:
            added[kind] = _changes(conn, _VALUES[kind], rows, many=True)
    report["records"] += chunk.size
    report["unchanged"] += chunk.size - sum(added.values())
    for kind, n in added.items():
        report["added"][kind] += n
    report["bad_count"] += len(chunk.bad)
    report["bad"] += chunk.bad[: BAD_SHOWN - len(report["bad"])]
    report["truncated"] = chunk.truncated or report["truncated"]


def _new_result() -> dict:
    """An import report with nothing in it yet (import_ndjson's)."""
    report: dict = {"records": 0, "added": dict.fromkeys(KINDS, 0), "unchanged": 0}
    report.update(bad=[], bad_count=0, truncated=None)
    return report


def _lines(source) -> Iterator:
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            yield from handle
    else:
        yield from source


# Bulk settings while importing (measured, docs/fleet.md): a larger page cache and rarer WAL
# checkpoints; 1M random-id records touch every index page, and each checkpoint rewrites them.
_BULK = {"cache_size": -131072, "wal_autocheckpoint": 50000}


def import_ndjson(conn: sqlite3.Connection, source, progress: Progress = None) -> dict:
    """Merge NDJSON records (a path, a binary/text file or an iterable of lines); idempotent.

    Returns {records, added: {type: n}, unchanged, bad: [(line, why)], bad_count, truncated}.
    A line that is not a record is reported (`bad`) and skipped; a last line cut short (no
    newline and no complete JSON object, as left by a writer still running) is skipped too, its
    number in `truncated` (else None). Each CHUNK records are one transaction: an interrupted
    import keeps whole chunks, never half a record; SQLite errors (disk full) are FleetError.
    """
    report = _new_result()
    with _bulk(conn):
        for chunk in _chunks(_lines(source)):
            _write(conn, chunk, report)
            if progress:
                progress(chunk.bytes)
    return report


# ---------------------------------------------------------------------------------------------
# collect


def _main_file(conn: sqlite3.Connection) -> str:
    for _, name, path in conn.execute("PRAGMA database_list"):
        if name == "main":
            return path or ""
    return ""


def _snapshot(path: str, copy: str) -> None:
    """Copy a store that may still be written with the backup API: a consistent snapshot.

    Read-only: a copied file on shared storage is never written, and a live node store is read
    under its own locking (WAL readers never block its writers).
    """
    source = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, timeout=30)
    try:
        target = sqlite3.connect(copy)
        try:
            source.backup(target)
        finally:
            target.close()
    finally:
        source.close()


def _checked_copy(path: str, copy: str) -> None:
    """Snapshot `path` to `copy`, prove it sound and bring it to this schema; FleetError if not."""
    try:
        _snapshot(path, copy)
        check = sqlite3.connect(copy)
        try:
            verdict = check.execute("PRAGMA quick_check(1)").fetchone()[0]
        finally:
            check.close()
        if verdict != "ok":
            raise FleetError(f"damaged ({clean(verdict, 80)})")
        store.connect(copy).close()  # migrates an older store; refuses a newer one
    except sqlite3.Error as exc:
        raise FleetError(clean(exc, 120)) from None
    except store.StoreError as exc:
        raise FleetError(clean(str(exc).replace(copy, "copy"), 120)) from None


def _copy_fd(fd: int, target: str) -> None:
    with open(target, "xb") as out:
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                return
            out.write(block)


def _trusted_source(path: str, fd: int, tmp: str, owners: Iterable[int]) -> str:
    """What SQLite may read of the store `path`, whose checked descriptor is `fd`.

    Its -wal (frames SQLite applies on read) and -shm pass the same checks. In a directory only
    trusted owners write, that is `path` itself: no one else can replace it or plant a -wal
    beside it. Elsewhere (a shared spool) a private copy of the file and its -wal, read through
    checked descriptors: SQLite never opens a name there (copy quiet stores into such a spool:
    the copy is taken without SQLite's locking; a torn one fails the check and is skipped).
    """
    sidecars: dict = {}
    try:
        for suffix in ("-wal", "-shm"):
            try:
                sidecars[suffix] = files.open_trusted(path + suffix, owners)
            except FileNotFoundError:
                pass
            except files.Unsafe as exc:
                name = os.path.basename(path + suffix)
                raise files.Unsafe(path, f"its {name} is {exc.strerror}") from None
        if not files.others_may_write(os.path.dirname(os.path.abspath(path)), owners):
            return path
        source = os.path.join(tmp, "source.db")
        _copy_fd(fd, source)
        if "-wal" in sidecars:
            _copy_fd(sidecars["-wal"], source + "-wal")
        return source
    finally:
        for sidecar in sidecars.values():
            os.close(sidecar)


def merge_store(
    conn: sqlite3.Connection,
    path: str,
    since: float | None = None,
    owners: Iterable[int] = (),
    source: str | None = None,
) -> dict:
    """Merge a node store file (records newer than `since`) in one transaction: {type: added}.

    The file must pass files.open_trusted (owned by root, this user or `owners`, writable by no
    one else; files.Unsafe if not), checked on the opened descriptor. With `source`, that
    source's watermark (its newest record time) is set in the same transaction.
    """
    fd = files.open_trusted(path, owners)
    try:
        _clean_copies()
        with tempfile.TemporaryDirectory(prefix=COPY_PREFIX) as tmp:
            copy = os.path.join(tmp, "node.db")
            trusted = _trusted_source(path, fd, tmp, owners)
            _checked_copy(trusted, copy)
            if trusted == path:  # SQLite opened the name: the file we checked, still?
                checked, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
                if (checked.st_dev, checked.st_ino) != (now.st_dev, now.st_ino):
                    raise FleetError("replaced while it was read")
            return _merge_copy(conn, copy, since, source)
    finally:
        os.close(fd)


COPY_PREFIX = "slurmhealth-collect-"
STALE_COPY_S = 6 * 3600.0  # a merge of the largest store takes minutes


def _clean_copies() -> None:
    """Remove the private copies of node stores that a collect killed mid-merge (SIGKILL, a
    power cut: no `finally` ran) left in $TMPDIR: ours, untouched for STALE_COPY_S."""
    import shutil  # noqa: PLC0415

    base = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(COPY_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        try:
            st = os.stat(path, follow_symlinks=False)
            if (
                stat.S_ISDIR(st.st_mode)
                and st.st_uid == os.geteuid()
                and time.time() - st.st_mtime > STALE_COPY_S
            ):
                shutil.rmtree(path)
        except OSError:
            continue


def _merge_copy(
    conn: sqlite3.Connection, copy: str, since: float | None, source: str | None
) -> dict:
    conn.execute("ATTACH DATABASE ? AS node", (copy,))
    try:
        return _merge_attached(conn, since, source)
    except sqlite3.Error as exc:
        raise (StoreFault if _store_fault(exc) else FleetError)(clean(exc, 120)) from None
    finally:
        conn.execute("DETACH DATABASE node")


# A store's newest record time, each term one index seek (or a scan of a small table).
_NEWEST = (
    "SELECT max(t) FROM (SELECT max(started) AS t FROM node.runs "
    "UNION ALL SELECT max(time) FROM node.events UNION ALL SELECT max(start) FROM node.jobs "
    "UNION ALL SELECT max(end) FROM node.jobs UNION ALL SELECT max(time) FROM node.actions "
    "UNION ALL SELECT max(time) FROM node.counters)"
)
_MARK = store.insert_sql("watermarks", verb="INSERT OR REPLACE")


def _bad_nodes(conn: sqlite3.Connection) -> str:
    """The attached store's node names that is_node_name refuses, as a JSON list (the rule is
    Python's: `isprintable` has no SQL form). One pass over each table's names, not a
    callback per row; "[]" in every store the hooks wrote."""
    selects = " UNION ".join(
        f"SELECT node FROM node.{spec.table}"  # noqa: S608 - our fixed table names
        for spec in KINDS.values()
        if spec.node is not None
    )
    names = [row[0] for row in conn.execute(selects)]
    return json.dumps([n for n in names if isinstance(n, str) and not is_node_name(n)])


def _merge_attached(conn: sqlite3.Connection, since: float | None, source: str | None) -> dict:
    added = {}
    with store.immediate(conn):
        bad = _bad_nodes(conn)
        for kind, spec in KINDS.items():
            where, args = _dated(kind, since, prefix="node.")
            columns = ", ".join(spec.columns)  # names and conditions from the fixed tables above
            where = f"{where} AND {spec.valid_sql}"
            if spec.node is not None and bad != "[]":
                where += " AND node NOT IN (SELECT value FROM json_each(?))"
                args = (*args, bad)
            select = f"SELECT {columns} FROM node.{spec.table} WHERE {where}"  # noqa: S608
            added[kind] = _changes(conn, _insert(kind, select), args)
        if source is not None:
            mark = conn.execute(_NEWEST).fetchone()[0]
            conn.execute(_MARK, (source, mark, "", time.time()))
    return added


def _same_file(a: str, b: str) -> bool:
    try:
        return bool(b) and os.path.samefile(a, b)
    except OSError:
        return False


# Spool files (docs/fleet.md "The spool"): a node's export is written as `.NAME.RANDOM.tmp` and
# renamed to NAME.ndjson; `collect --consume` renames it to NAME.ndjson.RANDOM.collecting before
# it reads it and removes it once its records are committed. A claimed file left by a collect
# that stopped is read by the next one. A writer's temporary file older than STALE_TEMP_S died
# with its writer.
CLAIMED = ".collecting"
STALE_TEMP_S = 3600.0


def collect_paths(directory: str) -> list:
    """The files `collect` reads: node stores (`*.db`), spools a collect claimed and did not
    finish (`*.ndjson.*.collecting`), then NDJSON spools (`*.ndjson`); hidden names never.

    An export in progress is a hidden temporary file (`.NAME.ndjson.RANDOM.tmp`), renamed over
    NAME.ndjson when complete.
    """
    if not os.path.isdir(directory):
        raise FleetError(f"{directory}: not a directory")
    try:
        names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    except OSError as exc:
        raise FleetError(f"{directory}: {exc.strerror or exc}") from None
    groups: tuple = ([], [], [])
    for name in names:
        if name.endswith(".db"):
            groups[0].append(name)
        elif name.endswith(CLAIMED) and ".ndjson." in name:
            groups[1].append(name)
        elif name.endswith(".ndjson"):
            groups[2].append(name)
    return [os.path.join(directory, n) for group in groups for n in group]


def collect(
    conn: sqlite3.Connection,
    directory: str,
    since: float | None = None,
    progress: Progress = None,
    owners: Iterable[int] = (),
    consume: bool = False,
    full: bool = False,
) -> dict:
    """Merge every node store (`*.db`) and NDJSON spool (`*.ndjson`) in a directory.

    A file that cannot be read (not a database, damaged, still being copied, a newer schema) is
    reported and skipped; the rest are merged. So is a file anyone could have forged (the trust
    model: docs/fleet.md): a symlink, not a regular file, owned by someone else than root, this
    user or the uids `owners`, or writable by group or others; checked on the opened file.
    Idempotent: collecting again adds nothing.

    Incremental (docs/fleet.md): a store is read from its watermark (the newest record time
    the last collect saw in it) less OVERLAP, never before `since`; a spool whose identity
    (device, inode, size, mtime) is unchanged is not read again. `full` ignores watermarks.
    `consume`: each spool is claimed (renamed) before it is read and removed once merged, and
    writers' temporary files older than STALE_TEMP_S are removed. Small spools are merged many
    per transaction.
    Returns {"merged": [(path, {type: added})], "skipped": [(path, why)], "added": {type: n},
    "imports": [(path, import report)], "unchanged": [path], "kept": [(path, why not
    consumed)], "cleaned": n}.
    """
    fleet = _main_file(conn)
    paths = [
        p for p in collect_paths(directory) if not (p.endswith(".db") and _same_file(p, fleet))
    ]
    report: dict = {"merged": [], "skipped": [], "imports": [], "added": dict.fromkeys(KINDS, 0)}
    report.update(unchanged=[], kept=[], cleaned=0)
    marks = {} if full else dict(conn.execute("SELECT source, mark FROM watermarks"))
    identities = {} if full else dict(conn.execute("SELECT source, identity FROM watermarks"))
    batch = _Batch(conn, report, owners)
    with _bulk(conn):
        for path in paths:
            if path.endswith(".db"):
                _collect_store(conn, path, _later(since, marks.get(_source(path))), report, owners)
            else:
                _collect_spool(batch, path, consume, identities)
            if progress:
                progress(1)
        batch.flush()
    if consume:
        report["cleaned"] = _clean_temps(directory)
    return report


def _source(path: str) -> str:
    return os.path.abspath(path)


def _later(since: float | None, mark: float | None) -> float | None:
    """The later of `since` and a watermark less OVERLAP."""
    if mark is None:
        return since
    return mark - OVERLAP if since is None else max(since, mark - OVERLAP)


def _merged(report: dict, path: str, added: dict) -> None:
    report["merged"].append((path, added))
    for kind, n in added.items():
        report["added"][kind] += n


def _collect_store(
    conn: sqlite3.Connection, path: str, since: float | None, report: dict, owners: Iterable[int]
) -> None:
    try:
        added = merge_store(conn, path, since, owners, source=_source(path))
    except StoreFault:
        raise
    except files.Unsafe as exc:
        report["skipped"].append((path, exc.strerror))
        return
    except (FleetError, OSError) as exc:
        report["skipped"].append((path, clean(exc, 160)))
        return
    _merged(report, path, added)


@contextlib.contextmanager
def _bulk(conn: sqlite3.Connection) -> Iterator:
    """The _BULK settings for the block, restored after."""
    saved = {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in _BULK}
    for name, value in _BULK.items():
        conn.execute(f"PRAGMA {name} = {value}")
    try:
        yield
    finally:
        for name, value in saved.items():
            conn.execute(f"PRAGMA {name} = {int(value)}")


def _claim(path: str, report: dict) -> str | None:
    """Rename a spool to a claimed name before reading it (None: it is gone); where it cannot
    be renamed (a read-only spool), read it in place and say why it stays."""
    claimed = f"{path}.{os.urandom(4).hex()}{CLAIMED}"
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    except OSError as exc:
        report["kept"].append((path, exc.strerror or str(exc)))
        return path
    return claimed


def _collect_spool(batch: _Batch, path: str, consume: bool, identities: dict) -> None:
    claimed = path.endswith(CLAIMED)
    if consume and not claimed:
        target = _claim(path, batch.report)
        if target is None:
            return
        claimed, path = target != path, target
    try:
        fd = files.open_trusted(path, batch.owners)
    except files.Unsafe as exc:
        batch.report["skipped"].append((path, exc.strerror))
        return
    except OSError as exc:
        batch.report["skipped"].append((path, clean(exc, 160)))
        return
    st = os.fstat(fd)
    identity = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    if not claimed and identities.get(_source(path)) == identity:
        os.close(fd)
        batch.report["unchanged"].append(path)
        return
    with os.fdopen(fd, "rb") as handle:
        batch.read(path, handle, None if claimed else identity)


class _Batch:
    """Spools merged many per transaction (one commit per ~CHUNK records, not per file): each
    file's records, counted per file, its watermark in the same transaction, and a claimed
    file removed only once that transaction committed."""

    def __init__(self, conn: sqlite3.Connection, report: dict, owners: Iterable[int]) -> None:
        self.conn, self.report, self.owners = conn, report, owners
        self.files: list = []  # (path, chunk, identity or None for a claimed file)
        self.size = 0

    def read(self, path: str, handle: object, identity: str | None) -> None:
        chunks = _chunks(_lines(handle))
        try:
            first = next(chunks)
            second = next(chunks, None)
            if second is None:  # one chunk: batched with other files
                self.files.append((path, first, identity))
                self.size += first.size
                if self.size >= CHUNK:
                    self.flush()
                return
            self.flush()  # a large file: its chunks are transactions of their own
            result = _new_result()
            for chunk in (first, second, *chunks):
                _write(self.conn, chunk, result)
        except StoreFault:
            raise
        except FleetError as exc:
            self.report["skipped"].append((path, clean(exc, 160)))
            return
        self._done(path, result, identity)

    def flush(self) -> None:
        pending, self.files, self.size = self.files, [], 0
        if not pending:
            return
        results = []
        try:
            with store.immediate(self.conn):
                for path, chunk, identity in pending:
                    result = _new_result()
                    _apply(self.conn, chunk, result)
                    results.append(result)
                    if identity is not None:
                        self.conn.execute(_MARK, (_source(path), None, identity, time.time()))
        except sqlite3.Error as exc:
            if _store_fault(exc):  # the files stay (claimed ones too): the next collect reads them
                raise StoreFault(clean(exc, 160)) from None
            for path, _chunk, _identity in pending:
                self.report["skipped"].append((path, clean(exc, 160)))
            return
        for (path, _chunk, _identity), result in zip(pending, results):
            self._finish(path, result)

    def _done(self, path: str, result: dict, identity: str | None) -> None:
        if identity is not None:
            with store.immediate(self.conn):
                self.conn.execute(_MARK, (_source(path), None, identity, time.time()))
        self._finish(path, result)

    def _finish(self, path: str, result: dict) -> None:
        if path.endswith(CLAIMED) and result.get("truncated") and not _stale(path):
            # a writer copying it in place (scp, cp) is still appending to it: removed now,
            # the rest of its records would go with it; the next collect reads it again
            self.report["kept"].append((path, "last line cut: read again by the next collect"))
        elif path.endswith(CLAIMED):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # a concurrent collect merged and removed it too (idempotent)
            except OSError as exc:  # merged; the next collect reads it again (idempotent)
                self.report["kept"].append((path, exc.strerror or str(exc)))
        self.report["imports"].append((path, result))
        _merged(self.report, path, result["added"])


def _stale(path: str) -> bool:
    """Untouched for STALE_TEMP_S (or gone): no writer is appending to it any more."""
    try:
        return time.time() - os.stat(path).st_mtime > STALE_TEMP_S
    except OSError:
        return True


def _clean_temps(directory: str) -> int:
    """Remove writers' temporary files (`.NAME.RANDOM.tmp`) untouched for STALE_TEMP_S: their
    writer died (a live export renames its file within seconds). How many went."""
    cleaned, now = 0, time.time()
    for name in os.listdir(directory):
        if not (name.startswith(".") and name.endswith(".tmp")):
            continue
        path = os.path.join(directory, name)
        try:
            if now - os.lstat(path).st_mtime > STALE_TEMP_S:
                os.unlink(path)
                cleaned += 1
        except OSError:
            continue
    return cleaned


# Slurm accounting is asked again from its last window's end less ACCOUNTING_OVERLAP: a job's
# end reaches slurmdbd late when slurmdbd was down (slurmctld queues the record and sends it
# with its own time), and the window selects jobs and events that overlap it, so one still
# running or open is asked again each cycle until it ends.
ACCOUNTING_OVERLAP = 3600.0


def accounting_start(conn: sqlite3.Connection, tool: str, since: float, full: bool) -> float:
    """Where the window asked of sacct or sacctmgr starts: the last window's end less
    ACCOUNTING_OVERLAP, never before `since`; `since` when `full` or the first time."""
    if full:
        return since
    row = conn.execute("SELECT mark FROM watermarks WHERE source = ?", (f"accounting:{tool}",))
    mark = (row.fetchone() or (None,))[0]
    return since if mark is None else max(since, mark - ACCOUNTING_OVERLAP)


def accounted(conn: sqlite3.Connection, tool: str, end: float) -> None:
    """Remember that `tool`'s records up to `end` (head-node time) are merged."""
    try:
        conn.execute(_MARK, (f"accounting:{tool}", end, "", time.time()))
    except sqlite3.Error as exc:
        raise FleetError(clean(exc, 120)) from None


# ---------------------------------------------------------------------------------------------
# rollup

# Passing health checks rolled up into per-node hourly counts after a set age (docs/fleet.md).
#
# A 10,000-node fleet with a health check every 5 minutes records 2.9M runs a day, nearly all of
# them passing: kept as rows, a month is ~30 GB. After `before` (collect --rollup-after 2d), each
# node-hour in which every run of the node passed, none with a result, an Xid or a counter
# reading, keeps its first passing health check as a row and counts the others in `run_hours`
# (how many, their total wall time). Every failure, warning and job run (prolog, epilog) stays a
# row, and so does every health check that recorded the node's versions (its sources hold
# "versions": node/runner.py records them every 6 h or on a change, by whichever run is due):
# they are the node's driver and firmware history that the report's configuration drift reads
# (queries.version_sources), never counted, never removed. What the readers need stays exact:
# a node's days with a run, its first passing run after any time (the hour's first passing run
# is kept, and an hour with anything but passes is not rolled up), and its version records;
# run counts add `run_hours` by the hour (each run is kept or counted, once).
HOUR = 3600
DAY = 86400
# Node-hours one collect rolls up (`collect --rollup-max`): a 10,000-node fleet adds 834 per
# 5-minute cycle, so this keeps up with 30,000 nodes; a cycle of 2,500 costs a fraction of a
# whole 10,000-node hour's rollup in one cycle (docs/benchmarks.md).
ROLLUP_MAX = 2500
# Whole hours a bounded rollup may be behind before collect says so: one hour is due each
# hour, and a large fleet's takes a few cycles.
ROLLUP_BEHIND = 2
# An Xid is recorded by the run that read it from the kernel log, at most this long after it
# happened (the first health check after a boot reads the boot's backlog).
EVENT_LAG_S = DAY

# Per node-hour: how many of its passing health checks may be folded (`runs`: none that recorded
# versions) and their total wall time, how many recorded versions, when its first one started.
# Whether a run recorded versions is read once per run: the subquery's LIMIT -1 (no limit)
# keeps SQLite from flattening it into the aggregate, which would test each run twice.
_ROLL_HOURS = """CREATE TEMP TABLE roll AS
SELECT node, hour, sum(plain) AS runs, sum(plain * duration) AS duration,
       count(*) - sum(plain) AS versions, min(started) AS first
FROM (SELECT u.node, CAST(u.started / 3600 AS INTEGER) * 3600 AS hour, u.started, u.duration,
             NOT instr(u.sources, '"versions"') AS plain
      FROM temp.batch b CROSS JOIN runs u INDEXED BY runs_node_started_verdict
      WHERE u.node = b.node AND u.started >= :lo AND u.started < :hi
      AND u.phase = 'healthcheck' LIMIT -1)
GROUP BY node, hour"""
# Node-hours with a run that must stay whole: not passing, or with a result that is not a skip,
# an Xid or a counter. A skip ("no NVLink on this GPU", "fabric state not reported") is stored
# with nearly every run of a real node, the same each time: it says nothing the hour's first
# run (kept, with its own) does not, and when skips kept hours whole nothing was ever rolled up
# (the simulator's passing runs have no results, so its fleets did not show it). The runs
# folded take their skips with them (_FOLDED, _fold).
_KEEP = """DELETE FROM temp.roll WHERE (node, hour) IN (
    SELECT u.node, CAST(u.started / 3600 AS INTEGER) * 3600
    FROM temp.batch b CROSS JOIN runs u INDEXED BY runs_node_started_verdict
    WHERE u.node = b.node AND u.started >= :lo AND u.started < :hi AND (u.verdict != 'ok'
        OR EXISTS (SELECT 1 FROM results WHERE run_id = u.id AND status != 'skip')
        OR u.id IN (SELECT run_id FROM events WHERE time >= :lo - :lag AND time < :hi)
        OR u.id IN (SELECT run_id FROM counters WHERE time >= :lo - :lag AND time < :hi + 3600)))"""
_KEPT_RUN = """ALTER TABLE temp.roll ADD COLUMN keep TEXT"""
# The hour's first health check stays a row; `runs` and `duration` become what the hour's
# run_hours gains: the runs that may be folded less that one (unless it recorded versions, so
# was never among them). By (node, started), named: the planner took (started, phase), which
# reads every node's health check of that second where a fleet's checks start together (for
# 10,000 nodes' hour: CHANGELOG.md).
_PICK = """UPDATE temp.roll SET (keep, runs, duration) = (
    SELECT runs.id, roll.runs - (NOT instr(runs.sources, '"versions"')), roll.duration
           - (CASE WHEN instr(runs.sources, '"versions"') THEN 0 ELSE runs.duration END)
    FROM runs INDEXED BY runs_node_started_verdict
    WHERE runs.node = roll.node AND runs.started = roll.first
    AND runs.phase = 'healthcheck' ORDER BY runs.id LIMIT 1)"""
_COUNT = """INSERT INTO run_hours (node, hour, phase, runs, duration)
SELECT node, hour, 'healthcheck', runs, duration FROM temp.roll WHERE runs > 0
ON CONFLICT (node, hour, phase) DO UPDATE SET runs = runs + excluded.runs,
    duration = duration + excluded.duration"""
# The runs that recorded versions in the hours to fold (few hours have one: a node's every 6 h).
# Found here, not by the DELETE: any function in a DELETE of many rows has SQLite keep a
# statement journal inside the transaction (a function may fail midway), and the DELETE took
# ~1.4x as long.
_VERSIONED = """CREATE TEMP TABLE versioned AS
SELECT u.rowid AS id FROM temp.roll r JOIN runs u ON u.node = r.node
    AND u.started >= r.hour AND u.started < r.hour + 3600
WHERE r.versions > 0 AND r.runs > 0 AND u.phase = 'healthcheck'
    AND instr(u.sources, '"versions"')"""
# The runs to fold: rowid and id, so their skip results go too, then the runs.
_FOLDED = """CREATE TEMP TABLE folded AS
SELECT u.rowid AS rid, u.id AS id FROM temp.roll r JOIN runs u ON u.node = r.node
    AND u.started >= r.hour AND u.started < r.hour + 3600
    WHERE r.runs > 0 AND u.phase = 'healthcheck' AND u.id != r.keep
    AND u.rowid NOT IN (SELECT id FROM temp.versioned)"""
_FOLD_RESULTS = "DELETE FROM results WHERE run_id IN (SELECT id FROM temp.folded)"
_FOLD_RUNS = "DELETE FROM runs WHERE rowid IN (SELECT rid FROM temp.folded)"
# A passing health check imported into an hour already rolled up (an old export imported
# again, `collect --full`) is one of the runs that hour counts: it goes, unless it is the
# hour's first (the one kept) or recorded versions (never counted: it stays).
_LATE = """CREATE TEMP TABLE folded AS SELECT rowid AS rid, id FROM runs
    WHERE rowid > :rowid AND started < :until AND verdict = 'ok'
    AND phase = 'healthcheck' AND NOT instr(sources, '"versions"')
    AND EXISTS (SELECT 1 FROM run_hours h WHERE h.node = runs.node AND h.phase = 'healthcheck'
                AND h.hour = CAST(runs.started / 3600 AS INTEGER) * 3600)
    AND NOT EXISTS (SELECT 1 FROM results WHERE run_id = runs.id AND status != 'skip')
    AND EXISTS (SELECT 1 FROM runs f WHERE f.node = runs.node AND f.phase = 'healthcheck'
                AND f.started >= CAST(runs.started / 3600 AS INTEGER) * 3600
                AND (f.started < runs.started OR (f.started = runs.started AND f.id < runs.id)))"""


# The next nodes after :after, in name order, :n of them (-1: all): one seek each into the
# (node, started, verdict) index. A node with no run in the hour costs its seek and no more.
# The walk is a co-routine: it stops when the outer LIMIT has its rows.
_BATCH = """CREATE TEMP TABLE batch AS WITH RECURSIVE walk(node) AS (
    SELECT (SELECT min(node) FROM runs WHERE node > :after)
    UNION ALL SELECT (SELECT min(node) FROM runs WHERE node > walk.node)
    FROM walk WHERE walk.node IS NOT NULL)
SELECT node FROM walk WHERE node IS NOT NULL LIMIT :n"""


def rollup(conn: sqlite3.Connection, before: float, limit: int | None = None) -> dict:
    """Roll up the passing health checks of the whole hours before `before` not rolled up yet:
    all of them (a day per transaction), or at most `limit` node-hours, oldest hour first, its
    nodes in name order (an hour per transaction; the next call goes on where this one stopped).
    {"runs": runs folded, "hours": node-hours they went into, "late": runs imported again into
    hours already rolled up and removed, "behind": whole hours before `before` still to do}.
    StoreError (one line) when the store cannot be written."""
    try:
        with _bulk(conn):  # a 10,000-node hour dirties more pages than the default cache holds
            return _rollup(conn, before, limit)
    except sqlite3.Error as exc:
        raise store.StoreError(str(exc)) from None


def _rollup(conn: sqlite3.Connection, before: float, limit: int | None) -> dict:
    until = int(before // HOUR) * HOUR
    out = {"runs": 0, "hours": 0, "late": 0}
    with store.immediate(conn), _temp_tables(conn, "folded"):
        lo, after, rowid = _rolled(conn, until)
        if rowid:  # runs merged since the last rollup, into rolled hours
            conn.execute(_LATE, {"rowid": rowid, "until": lo + HOUR if after else lo})
            out["late"] = _fold(conn)
    budget = limit
    while budget is None or budget > 0:
        # Where the last step stopped, read in this step's transaction: a second collect
        # rolling up at the same time goes on from there (a node-hour rolled up twice is
        # left as it was: its kept run is all there is to fold).
        with store.immediate(conn), _temp_tables(conn, "batch"):
            lo, after, _ = _rolled(conn, until)
            if lo >= until:
                break
            # Unbounded and at an hour's start: up to a day of every node at once. Else one
            # hour, as many nodes as the budget allows.
            hi = min(until, (lo // DAY + 1) * DAY) if budget is None and not after else lo + HOUR
            want = -1 if budget is None else budget
            conn.execute(_BATCH, {"after": after, "n": want})
            nodes, last = conn.execute("SELECT count(*), max(node) FROM temp.batch").fetchone()
            folded, hours = _rollup_range(conn, lo, hi) if nodes else (0, 0)
            if budget is not None:
                budget -= max(1, nodes)
            if want < 0 or nodes < want:  # the hours' last nodes done
                lo, after = hi, ""
            else:
                after = last
            top = conn.execute("SELECT max(rowid) FROM runs").fetchone()[0] or 0
            store.set_meta(conn, "rollup", {"until": lo, "after": after, "rowid": top})
        out["runs"] += folded
        out["hours"] += hours
    out["behind"] = max(0, int(until - _rolled(conn, until)[0]) // HOUR)
    return out


def _rolled(conn: sqlite3.Connection, until: float) -> tuple:
    """Where the rollup stopped: (the first hour not wholly rolled up, the last node done in it
    or "", the highest run rowid then: 0 before any rollup)."""
    done = store.get_meta(conn, "rollup") or {}
    lo = done.get("until")
    if lo is None:
        first = conn.execute("SELECT min(started) FROM runs").fetchone()[0]
        lo = int(first // HOUR) * HOUR if first is not None else until
    return lo, str(done.get("after") or ""), done.get("rowid", 0) if done.get("until") else 0


def _rollup_range(conn: sqlite3.Connection, lo: float, hi: float) -> tuple:
    """Roll up [lo, hi) of the nodes in temp.batch inside the caller's transaction: (runs
    folded, node-hours)."""
    args = {"lo": lo, "hi": hi, "lag": EVENT_LAG_S}
    with _temp_tables(conn, "roll", "versioned", "folded"):
        conn.execute(_ROLL_HOURS, args)
        conn.execute(_KEEP, args)
        conn.execute(_KEPT_RUN)
        conn.execute(_PICK)
        hours = conn.execute(_COUNT).rowcount
        conn.execute(_VERSIONED)
        conn.execute(_FOLDED)
        folded = _fold(conn)
    return folded, hours


@contextlib.contextmanager
def _temp_tables(conn: sqlite3.Connection, *names: str) -> Iterator:
    """The rollup's temp tables, dropped before (a run that died left them) and after."""
    for name in names:
        conn.execute(f"DROP TABLE IF EXISTS temp.{name}")  # names from this module only
    try:
        yield
    finally:
        for name in names:
            conn.execute(f"DROP TABLE IF EXISTS temp.{name}")


def _fold(conn: sqlite3.Connection) -> int:
    """Delete the runs in temp.folded and their (skip) results; the runs deleted."""
    conn.execute(_FOLD_RESULTS)
    return conn.execute(_FOLD_RUNS).rowcount
