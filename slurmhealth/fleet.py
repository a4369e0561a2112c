"""The fleet store: every node's records in one SQLite file on the head node.

Node stores stay node-local (SQLite's WAL needs local locking, never NFS); what travels is an
NDJSON export or a copy of the file. `export` writes records with their stable ids, `import_ndjson`
and `collect` merge them idempotently, `ingest_sacct` adds what Slurm accounting knows (a job whose
node died before its epilog), and `signals` turns the fleet store into the lemon evidence of
docs/signals.md. The record format is docs/fleet.md.
"""

from __future__ import annotations

import calendar
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

from slurmhealth import __version__, policy, store
from slurmhealth.hostlist import PatternError, expand, split_terms
from slurmhealth.result import clean

FORMAT = 1  # the NDJSON record format (docs/fleet.md); a newer one is refused
CHUNK = 50_000  # records per import transaction (measured: docs/fleet.md)
BAD_SHOWN = 10  # bad lines reported one by one; the rest are counted
Progress = Optional[Callable[[int], None]]


class Kind:
    """One record type: its table, columns, the NOT NULL ones, defaults and JSON-text columns."""

    def __init__(self, table: str, columns: str, required: str, defaults: dict, json_cols=()):
        self.table = table
        self.columns = tuple(columns.split())
        index = {c: i for i, c in enumerate(self.columns)}
        self.required = tuple(index[c] for c in required.split())
        self.defaults = tuple((index[c], v) for c, v in defaults.items())
        self.json = tuple(index[c] for c in json_cols)


KINDS = {
    "run": Kind(
        "runs",
        "id node job_id phase started duration verdict tool_version sources",
        "id node phase started duration verdict tool_version",
        {"sources": "{}"},
        ("sources",),
    ),
    "result": Kind(
        "results",
        "run_id check_name status message action data duration",
        "run_id check_name status message action",
        {"data": "{}", "duration": 0.0},
        ("data",),
    ),
    "event": Kind(
        "events",
        "id run_id node job_id time kind code gpu bus_id pid process class action text repeats",
        "id run_id node time kind",
        {},
    ),
    "job": Kind(
        "jobs",
        "node job_id uid user start end exit_code signal state num_nodes slurm_state",
        "node job_id",
        {},
    ),
    "action": Kind(
        "actions",
        "id node time action reason actor ok detail",
        "id node time action reason actor",
        {"ok": 1, "detail": ""},
    ),
}

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


# ---------------------------------------------------------------------------------------------
# export


# What dates a record for `--since`; a job by its end, else its start (sacct may know neither).
_DATED = {
    "run": "started >= ?",
    "result": "run_id IN (SELECT id FROM runs WHERE started >= ?)",
    "event": "time >= ?",
    "job": "coalesce(end, start, ?) >= ?",
    "action": "time >= ?",
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


def merge_store(conn: sqlite3.Connection, path: str, since: float | None = None) -> dict:
    """Merge a node store file (records newer than `since`) in one transaction: {type: added}."""
    with tempfile.TemporaryDirectory(prefix="slurmhealth-collect-") as tmp:
        copy = os.path.join(tmp, "node.db")
        _checked_copy(path, copy)
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

    An export in progress is written as `NAME.ndjson.part` and renamed when complete.
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
) -> dict:
    """Merge every node store (`*.db`) and NDJSON spool (`*.ndjson`) in a directory.

    A file that cannot be read (not a database, damaged, still being copied, a newer schema) is
    reported and skipped; the rest are merged. Idempotent: collecting again adds nothing.
    Returns {"merged": [(path, {type: added})], "skipped": [(path, why)], "added": {type: n},
    "imports": [(path, import report)]}.
    """
    fleet = _main_file(conn)
    paths = collect_paths(directory)
    report: dict = {"merged": [], "skipped": [], "imports": [], "added": dict.fromkeys(KINDS, 0)}
    for path in paths:
        if not _same_file(path, fleet):
            _collect_one(conn, path, since, report)
        if progress:
            progress(1)
    return report


def _collect_one(conn: sqlite3.Connection, path: str, since: float | None, report: dict) -> None:
    try:
        if path.endswith(".db"):
            added = merge_store(conn, path, since)
        else:
            result = import_ndjson(conn, path)
            report["imports"].append((path, result))
            added = result["added"]
    except (FleetError, OSError) as exc:
        report["skipped"].append((path, clean(exc, 160)))
        return
    report["merged"].append((path, added))
    for kind, n in added.items():
        report["added"][kind] += n


# ---------------------------------------------------------------------------------------------
# Slurm accounting

SACCT_FIELDS = "JobIDRaw,State,ExitCode,NodeList,Start,End,User"
# The job-level ExitCode is 0:0 whatever happened for these (the signal is on the step line):
# it says nothing of the job's exit (shared/reference/slurm-local-cluster.md).
_NO_EXIT = {"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
_NO_NODES = {"", "None assigned", "(null)", "None"}


def _sacct_time(text: str, utc: bool) -> float | None:
    """sacct's `2026-05-01T10:00:00` (local time, or UTC when sacct ran with TZ=UTC)."""
    if text in ("", "Unknown", "None"):
        return None
    parsed = time.strptime(text, "%Y-%m-%dT%H:%M:%S")
    return float(calendar.timegm(parsed)) if utc else time.mktime(parsed)


def _exit(state: str, text: str) -> tuple:
    code, _, signal = text.partition(":")
    if state in _NO_EXIT or not code.isdigit():
        return None, None
    return int(code), int(signal) if signal.isdigit() else None


def parse_sacct(text: str, utc: bool = False) -> tuple:
    """`sacct -P -n -X -o JobID,State,ExitCode,NodeList,Start,End,User` -> (job rows, bad lines).

    One row per node of each job: {node, job_id, user, start, end, exit_code, signal,
    num_nodes, slurm_state}. State keeps its first word (`CANCELLED by 0` -> CANCELLED); a job
    with no node (pending, cancelled before start) has no row; step lines (`8.batch`) are
    ignored.
    """
    rows, bad = [], []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if fields == [""]:
            continue
        if len(fields) != 7:
            bad.append(clean(line, 120))
            continue
        job_id, state, exit_text, nodelist, start, end, user = (f.strip() for f in fields)
        if "." in job_id or nodelist in _NO_NODES:
            continue
        try:
            nodes = [n for term in split_terms(nodelist) for n in expand(term)]
            times = _sacct_time(start, utc), _sacct_time(end, utc)
        except (PatternError, ValueError):
            bad.append(clean(line, 120))
            continue
        word = state.split()[0] if state.split() else ""
        exit_code, signal = _exit(word, exit_text)
        for node in nodes:
            rows.append(
                {
                    "node": node,
                    "job_id": job_id,
                    "user": user or None,
                    "start": times[0],
                    "end": times[1],
                    "exit_code": exit_code,
                    "signal": signal,
                    "num_nodes": len(nodes),
                    "slurm_state": word or None,
                }
            )
    return rows, bad


def ingest_sacct(conn: sqlite3.Connection, text: str, utc: bool = False) -> dict:
    """Merge sacct's job records into the jobs table: {"jobs": rows changed, "bad": [lines]}.

    Accounting fills what the hooks could not know (the final state, a job whose node crashed
    before its epilog: NODE_FAIL); it never replaces a hook's value with a null.
    """
    rows, bad = parse_sacct(text, utc)
    columns = KINDS["job"].columns
    values = [tuple(row.get(c) for c in columns) for row in rows]
    try:
        with store.immediate(conn):
            changed = _changes(conn, _VALUES["job"], values, many=True)
    except sqlite3.Error as exc:
        raise FleetError(f"accounting records not merged: {clean(exc, 120)}") from None
    return {"jobs": changed, "bad": bad}


def fetch_sacct(start: float, end: float, slurm_bin: str = "", timeout: float = 120.0) -> str:
    """sacct's records of jobs running in [start, end), every user, requeued runs too (-D).

    Runs with TZ=UTC, so its times are UTC: ingest them with `utc=True`. Raises SlurmError with
    one line (e.g. "accounting storage is disabled" without slurmdbd).
    """
    import subprocess  # noqa: PLC0415 - admin side only

    from slurmhealth.slurm import SlurmError, find_bin  # noqa: PLC0415

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))

    argv = [find_bin("sacct", slurm_bin), "-P", "-n", "-X", "-D", "-a", "-o", SACCT_FIELDS]
    argv += ["-S", stamp(start), "-E", stamp(end)]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=dict(os.environ, TZ="UTC"),
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"sacct timed out after {timeout:g} s") from None
    except OSError as exc:
        raise SlurmError(f"sacct: {exc}") from None
    if proc.returncode != 0:
        why = clean(proc.stderr or proc.stdout or f"exit {proc.returncode}", 200)
        raise SlurmError(f"sacct: {why[7:] if why.startswith('sacct: ') else why}")
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# lemon signals (docs/signals.md is the contract)


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
