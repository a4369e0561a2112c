"""The fleet store: every node's records in one SQLite file on the head node.

Node stores stay node-local (SQLite's WAL needs local locking, never NFS); what travels is an
NDJSON export or a copy of the file. `export` writes records with their stable ids, `import_ndjson`
and `collect` merge them idempotently, `ingest_sacct` adds what Slurm accounting knows (a job whose
node died before its epilog; `ingest_events`, which nodes went down), and `signals` turns the
fleet store into the lemon evidence of docs/signals.md. The record format is docs/fleet.md.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Optional
from urllib.parse import quote

from slurmhealth import __version__
from slurmhealth.core import files, store
from slurmhealth.core.result import clean

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


# ---------------------------------------------------------------------------------------------
# export


# What dates a record for `--since`; a job by its end, else its start (sacct may know neither).
_DATED = {
    "run": "started >= ?",
    "result": "run_id IN (SELECT id FROM runs WHERE started >= ?)",
    "event": "time >= ?",
    "job": "coalesce(end, start, ?) >= ?",
    "action": "time >= ?",
    "counter": "time >= ?",
}


def _dated(kind: str, since: float | None, prefix: str = "") -> tuple:
    """(WHERE condition, args) selecting records newer than `since` (everything for None)."""
    if since is None:
        return "1", ()
    condition = _DATED[kind].replace("FROM runs", f"FROM {prefix}runs")
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


# ---------------------------------------------------------------------------------------------
# import


class FleetError(Exception):
    """An input that cannot be merged at all (a newer format, an unreadable file): one line."""


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
    added = dict.fromkeys(KINDS, 0)
    try:
        with store.immediate(conn):
            for kind, rows in chunk.rows.items():
                if rows:
                    added[kind] = _changes(conn, _VALUES[kind], rows, many=True)
    except sqlite3.Error as exc:
        raise FleetError(f"after {report['records']:,} records: {clean(exc, 120)}") from None
    report["records"] += chunk.size
    report["unchanged"] += chunk.size - sum(added.values())
    for kind, n in added.items():
        report["added"][kind] += n
    report["bad_count"] += len(chunk.bad)
    report["bad"] += chunk.bad[: BAD_SHOWN - len(report["bad"])]
    report["truncated"] = chunk.truncated or report["truncated"]


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
    report: dict = {"records": 0, "added": dict.fromkeys(KINDS, 0), "unchanged": 0}
    report.update(bad=[], bad_count=0, truncated=None)
    saved = {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in _BULK}
    for name, value in _BULK.items():
        conn.execute(f"PRAGMA {name} = {value}")
    try:
        for chunk in _chunks(_lines(source)):
            _write(conn, chunk, report)
            if progress:
                progress(chunk.bytes)
    finally:
        for name, value in saved.items():
            conn.execute(f"PRAGMA {name} = {int(value)}")
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
    conn: sqlite3.Connection, path: str, since: float | None = None, owners: Iterable[int] = ()
) -> dict:
    """Merge a node store file (records newer than `since`) in one transaction: {type: added}.

    The file must pass files.open_trusted (owned by root, this user or `owners`, writable by no
    one else; files.Unsafe if not), checked on the opened descriptor.
    """
    fd = files.open_trusted(path, owners)
    try:
        with tempfile.TemporaryDirectory(prefix="slurmhealth-collect-") as tmp:
            copy = os.path.join(tmp, "node.db")
            source = _trusted_source(path, fd, tmp, owners)
            _checked_copy(source, copy)
            if source == path:  # SQLite opened the name: the file we checked, still?
                checked, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
                if (checked.st_dev, checked.st_ino) != (now.st_dev, now.st_ino):
                    raise FleetError("replaced while it was read")
            return _merge_copy(conn, copy, since)
    finally:
        os.close(fd)


def _merge_copy(conn: sqlite3.Connection, copy: str, since: float | None) -> dict:
    conn.execute("ATTACH DATABASE ? AS node", (copy,))
    try:
        return _merge_attached(conn, since)
    except sqlite3.Error as exc:
        raise FleetError(clean(exc, 120)) from None
    finally:
        conn.execute("DETACH DATABASE node")


def _merge_attached(conn: sqlite3.Connection, since: float | None) -> dict:
    added = {}
    with store.immediate(conn):
        for kind, spec in KINDS.items():
            where, args = _dated(kind, since, prefix="node.")
            columns = ", ".join(spec.columns)  # names and conditions from the fixed tables above
            select = f"SELECT {columns} FROM node.{spec.table} WHERE {where}"  # noqa: S608
            added[kind] = _changes(conn, _insert(kind, select), args)
    return added


def _same_file(a: str, b: str) -> bool:
    try:
        return bool(b) and os.path.samefile(a, b)
    except OSError:
        return False


def collect_paths(directory: str) -> list:
    """The files `collect` reads: node stores (`*.db`), then NDJSON spools (`*.ndjson`).

    An export in progress is a hidden temporary file (`.NAME.ndjson.RANDOM.tmp`), renamed over
    NAME.ndjson when complete.
    """
    if not os.path.isdir(directory):
        raise FleetError(f"{directory}: not a directory")
    paths = sorted(glob.glob(os.path.join(directory, "*.db")))
    return paths + sorted(glob.glob(os.path.join(directory, "*.ndjson")))


def collect(
    conn: sqlite3.Connection,
    directory: str,
    since: float | None = None,
    progress: Progress = None,
    owners: Iterable[int] = (),
) -> dict:
    """Merge every node store (`*.db`) and NDJSON spool (`*.ndjson`) in a directory.

    A file that cannot be read (not a database, damaged, still being copied, a newer schema) is
    reported and skipped; the rest are merged. So is a file anyone could have forged (the trust
    model: docs/fleet.md): a symlink, not a regular file, owned by someone else than root, this
    user or the uids `owners`, or writable by group or others; checked on the opened file.
    Idempotent: collecting again adds nothing.
    Returns {"merged": [(path, {type: added})], "skipped": [(path, why)], "added": {type: n},
    "imports": [(path, import report)]}.
    """
    fleet = _main_file(conn)
    paths = collect_paths(directory)
    report: dict = {"merged": [], "skipped": [], "imports": [], "added": dict.fromkeys(KINDS, 0)}
    for path in paths:
        if not _same_file(path, fleet):
            _collect_one(conn, path, since, report, owners)
        if progress:
            progress(1)
    return report


def _collect_one(
    conn: sqlite3.Connection, path: str, since: float | None, report: dict, owners: Iterable[int]
) -> None:
    try:
        if path.endswith(".db"):
            added = merge_store(conn, path, since, owners)
        else:
            with os.fdopen(files.open_trusted(path, owners), "rb") as handle:
                result = import_ndjson(conn, handle)
            report["imports"].append((path, result))
            added = result["added"]
    except files.Unsafe as exc:
        report["skipped"].append((path, exc.strerror))
        return
    except (FleetError, OSError) as exc:
        report["skipped"].append((path, clean(exc, 160)))
        return
    report["merged"].append((path, added))
    for kind, n in added.items():
        report["added"][kind] += n
