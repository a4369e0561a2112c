"""The fleet's record format: what travels from a node to the head node, and how it is merged.

Node stores stay node-local (SQLite's WAL needs local locking, never NFS); what travels is an
NDJSON export or a copy of the file. `export` writes records with their stable ids (from a
watermark: only what is new), `import_ndjson` merges them idempotently, chunk by chunk; the
merges of Slurm's node events and places are here too, with the bulk-write settings the head
node's stages share. The format is docs/fleet.md; collecting spools and stores is
fleet/collect.py, rolling old passing runs up is fleet/rollup.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Optional

from slurmhealth import __version__
from slurmhealth.core import files, store
from slurmhealth.core.command import CommandError, Console
from slurmhealth.core.hostlist import is_node_name
from slurmhealth.core.result import clean, counted
from slurmhealth.fleet import text

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
    return (type(value) is int or type(value) is float) and math.isfinite(value)


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


def merge_sql(kind: str, source: str) -> str:
    """INSERT of one record type from `source` (VALUES or a SELECT ... WHERE), merged."""
    spec = KINDS[kind]
    verb = "INSERT" if kind in _CONFLICT else "INSERT OR IGNORE"
    return (
        f"{verb} INTO {spec.table} ({', '.join(spec.columns)}) {source} {_CONFLICT.get(kind, '')}"
    )


VALUES = {
    k: merge_sql(k, f"VALUES ({', '.join('?' * len(s.columns))})") for k, s in KINDS.items()
}


def changes(conn: sqlite3.Connection, sql: str, args: Iterable, many: bool = False) -> int:
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
    return changes(conn, _NODE_EVENTS, rows, many=True)


# A node seen in a place again keeps its first sighting and moves its last one on.
_PLACES = store.insert_sql(
    "places",
    tail="ON CONFLICT (node, kind, name) DO UPDATE SET last = max(places.last, excluded.last), "
    "first = min(places.first, excluded.first)",
)


def merge_places(conn: sqlite3.Connection, rows: Iterable) -> int:
    """Merge places rows (node, kind, name, first, last); how many. The caller holds the
    transaction."""
    return changes(conn, _PLACES, rows, many=True)


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


def dated(kind: str, since: float | None, prefix: str = "") -> tuple:
    """(WHERE condition, args) selecting records newer than `since` (everything for None)."""
    if since is None:
        return "1 = 1", ()
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
            where, args = dated(kind, since)
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


def export_to(
    conn: sqlite3.Connection, output: str, since: float | None, incremental: bool, console: Console
) -> None:
    """`slurmhealth export`: the records since `since` to standard output ("-") or to the file
    `output`, written private and whole (a temporary file renamed); incremental: from where
    the previous export to that file started, its start remembered. CommandError with one line
    when the file or the store refuses (a usage error for --incremental without a file)."""
    if incremental and output == "-":
        raise CommandError("--incremental needs -o FILE", usage=True)
    if output == "-":
        export(conn, sys.stdout, since)
        return
    mark = time.time()  # before the snapshot: what commits later is in the next export
    try:
        if incremental:
            since = incremental_since(conn, output, since)
        with files.open_private(output) as out:
            with console.progress(count_records(conn, since), "export") as tick:
                counts = export(conn, out, since, tick)
    except OSError as exc:
        raise CommandError(f"{output}: {exc.strerror or exc}") from None
    except store.StoreError as exc:
        raise CommandError(f"{output}: {exc}") from None
    done = f"{output}: {counted(sum(counts.values()), 'record', spec=',')} ({text.added(counts)})"
    if incremental:
        try:
            exported(conn, output, since, mark)
        except (store.StoreError, OSError) as exc:
            # the file is whole and in place; without its mark the next export starts where
            # this one did (records exported twice are merged once)
            raise CommandError(
                f"{done}, written; its start not remembered ({exc}): the next export overlaps"
            ) from None
    console.out(done)


def count_records(conn: sqlite3.Connection, since: float | None = None) -> int:
    """How many records `export` would write (for a progress bar)."""
    total = 0
    for kind, spec in KINDS.items():
        where, args = dated(kind, since)
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
    state = store.get_meta(conn, _export_key(path))
    if not isinstance(state, dict):  # none yet (exported() writes only dicts)
        state = {}
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
    "fleet store server unavailable",  # PostgreSQL's (fleet/pgstore.py UNAVAILABLE)
)


def store_fault(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(
        m in str(exc).lower() for m in _STORE_FAULTS
    )


def _row(record: dict) -> tuple:
    """(kind, row) of one parsed record; ValueError saying why it is not a record."""
    kind = record.get("type")
    spec = KINDS.get(kind) if isinstance(kind, str) else None  # a list or object: no type
    if spec is None:
        raise ValueError(f"unknown record type {clean(repr(kind), 80)}")
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
        value = row[i]
        if value is not None and not 0 <= value < TIME_MAX:
            raise ValueError(f"{kind} {spec.columns[i]} is no time: {value!r:.40}")
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


def chunks(lines: Iterable) -> Iterator:
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


def write_chunk(conn: sqlite3.Connection, chunk: _Chunk, report: dict) -> None:
    """One transaction: every row of the chunk lands, or none does."""
    try:
        with store.immediate(conn):
            apply_chunk(conn, chunk, report)
    except sqlite3.Error as exc:
        kind = StoreFault if store_fault(exc) else FleetError
        done = counted(report["records"], "record", spec=",")
        raise kind(f"after {done}: {clean(exc, 120)}") from None


def apply_chunk(conn: sqlite3.Connection, chunk: _Chunk, report: dict) -> None:
    """Insert a chunk's rows (the caller holds the transaction) and count them into `report`."""
    added = dict.fromkeys(KINDS, 0)
    for kind, rows in chunk.rows.items():
        if rows:
            added[kind] = changes(conn, VALUES[kind], rows, many=True)
    report["records"] += chunk.size
    report["unchanged"] += chunk.size - sum(added.values())
    for kind, n in added.items():
        report["added"][kind] += n
    report["bad_count"] += len(chunk.bad)
    report["bad"] += chunk.bad[: BAD_SHOWN - len(report["bad"])]
    report["truncated"] = chunk.truncated or report["truncated"]


def new_result() -> dict:
    """An import report with nothing in it yet (import_ndjson's)."""
    report: dict = {"records": 0, "added": dict.fromkeys(KINDS, 0), "unchanged": 0}
    report.update(bad=[], bad_count=0, truncated=None)
    return report


def lines_of(source) -> Iterator:
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
    report = new_result()
    with bulk(conn):
        for chunk in chunks(lines_of(source)):
            write_chunk(conn, chunk, report)
            if progress:
                progress(chunk.bytes)
    return report


# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def bulk(conn: sqlite3.Connection) -> Iterator:
    """The _BULK settings for the block, restored after."""
    saved = {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in _BULK}
    for name, value in _BULK.items():
        conn.execute(f"PRAGMA {name} = {value}")
    try:
        yield
    finally:
        for name, value in saved.items():
            conn.execute(f"PRAGMA {name} = {int(value)}")
