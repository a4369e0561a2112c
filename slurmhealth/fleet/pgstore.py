"""The fleet store on a PostgreSQL server (psycopg 3), chosen by a URL (`--db postgresql://...` or
$SLURMHEALTH_FLEET_DB): a connection that speaks what the fleet code speaks to SQLite.

The fleet code keeps one SQL text for both engines. Where the two dialects differ, the text is
translated here, and only here (`translate`, cached per statement), and what SQLite answers
with a PRAGMA is answered from PostgreSQL's own tables. The schema is the table spec's
(core/store.py TABLES and INDEXES, the same migrations), with SQLite's types as PostgreSQL's.
Errors come back as sqlite3's exception classes, so every caller's handling (a constraint is a
bad record, a lost server an operational error) holds on both. Node stores stay SQLite.

What is translated (docs/fleet.md "PostgreSQL"):
  ? and :name             $1, $2, ... (a name used twice is one number), sent as they are
                          (psycopg's RawCursor: no client-side parse of each statement; a
                          statement of 400 nodes' placeholders was parsed again at every
                          call, about 1.5 s of a 100,000-node report's CPU)
  INSERT OR IGNORE        INSERT ... ON CONFLICT DO NOTHING
  INSERT OR REPLACE       INSERT ... ON CONFLICT (the table's key) DO UPDATE SET every column
  a IS NOT b, a IS b      IS DISTINCT FROM, IS NOT DISTINCT FROM (b not NULL, TRUE or FALSE)
  max(a, b), min(a, b)    GREATEST, LEAST (two arguments: the scalar forms)
  group_concat(x)         string_agg(x::text, ',')
  instr(a, b)             (strpos(a, b) > 0) (every use is a truth)
  sum(a truth)            sum(CAST(truth AS INT)) (SQLite counts true as 1)
  CAST(x AS INTEGER)      CAST(trunc(x) AS BIGINT) (SQLite truncates, PostgreSQL rounds)
  INDEXED BY name         (removed: PostgreSQL's planner picks)
  total(x) [FILTER ...]   coalesce(sum(x) [FILTER ...], 0.0)
  LIMIT -1                LIMIT ALL
  FROM (SELECT ...)       FROM (SELECT ...) AS _q0 (a subquery needs a name)
  REAL, INTEGER (DDL)     DOUBLE PRECISION, BIGINT
  end, user (columns)     "end", "user" (reserved words in PostgreSQL)
  temp.name               pg_temp.name
  BEGIN IMMEDIATE         BEGIN, then the writers' advisory lock (one writer at a time)
  BEGIN DEFERRED          BEGIN ISOLATION LEVEL REPEATABLE READ (a read transaction: one
                          snapshot for all its statements, as SQLite's; queries.snapshot)
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import sqlite3
import urllib.parse
from typing import TYPE_CHECKING, Any, cast

from slurmhealth.core import store

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from types import TracebackType

CONNECT_TIMEOUT_S = 10
# The schema version lives in a one-row table, slurmhealth_schema: PostgreSQL has no
# user_version.


# The advisory lock a write transaction holds (store.immediate's BEGIN IMMEDIATE), and the
# one that creates the schema once.
WRITER_LOCK = 0x534C5257
SCHEMA_LOCK = 0x534C524D
_IMMEDIATE = re.compile(r"\s*BEGIN\s+IMMEDIATE\s*$", re.I)
_DEFERRED = re.compile(r"\s*BEGIN\s+DEFERRED\s*$", re.I)


def is_url(db: str | None) -> bool:
    """Whether a --db value names a PostgreSQL server rather than a SQLite file."""
    return bool(db) and str(db).startswith(store.SERVER_PREFIXES)


def shown(url: str) -> str:
    """The URL as it may be printed: the password (if any) replaced by ***."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


# --- the dialect ---------------------------------------------------------------------------

# A statement split into its string literals and quoted identifiers (kept as they are) and the
# text between them (translated).
_PIECES = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")")
_RESERVED = re.compile(r"(?<![\w.:\"])(end|user)\b(?!\s*\()")
_QUALIFIED = re.compile(r"(?<=\.)(end|user)\b")
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_IS = re.compile(r"\bIS\s+(NOT\s+)?(?!NOT\b|NULL\b|TRUE\b|FALSE\b|DISTINCT\b)", re.I)
_TYPES = (
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
)
_OR_VERB = re.compile(r"^\s*INSERT\s+OR\s+(IGNORE|REPLACE)\s+INTO\s+(\w+)", re.I)


def _outside(sql: str, fn: Any) -> str:
    """`fn` applied to `sql` with its literals and quoted names set aside (each a numbered
    token fn leaves alone), then put back."""
    parts = _PIECES.split(sql)
    kept = parts[1::2]
    text = "".join(p if i % 2 == 0 else f"\x01{i // 2}\x02" for i, p in enumerate(parts))
    return re.sub("\x01(\\d+)\x02", lambda m: kept[int(m.group(1))], fn(text))


def _closing(text: str, start: int) -> int:
    """The index of the parenthesis that closes the one opened just before `start`."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise sqlite3.ProgrammingError(f"unbalanced parentheses in {text[:80]!r}")


def _arguments(inner: str) -> list[str]:
    """A call's arguments split at its top-level commas."""
    out: list[str] = []
    depth = begin = 0
    for i, char in enumerate(inner):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            out.append(inner[begin:i])
            begin = i + 1
    return [*out, inner[begin:]]


def _rewritten(text: str, opening: re.Pattern[str], rewrite: Any) -> str:
    """Every match of `opening` (which ends inside an open parenthesis) replaced:
    rewrite(text, match, close) gives the new text and the index it covers up to, with close
    the index of the parenthesis that closes the match's."""
    out: list[str] = []
    at = 0
    while True:
        found = opening.search(text, at)
        if found is None:
            return "".join(out) + text[at:]
        new, end = rewrite(text, found, _closing(text, found.end()))
        out.append(f"{text[at : found.start()]}{new}")
        at = end + 1


def _calls(text: str, name: str, rewrite: Any) -> str:
    """Every call `name(...)` (any case) rewritten by rewrite(arguments) or left (None)."""

    def call(text: str, found: re.Match[str], end: int) -> tuple[str, int]:
        inner = _calls(text[found.end() : end], name, rewrite)
        new = rewrite(_arguments(inner))
        return (new if new is not None else f"{found.group()}{inner})"), end

    return _rewritten(text, re.compile(rf"\b{name}\s*\(", re.I), call)


def _scalar(word: str) -> Any:
    return lambda args: f"{word}({', '.join(a.strip() for a in args)})" if len(args) == 2 else None


def _group_concat(args: list[str]) -> str:
    first = args[0].strip()
    distinct = re.match(r"DISTINCT\s+", first, re.I)
    body = first[distinct.end() :] if distinct else first
    sep = args[1].strip() if len(args) > 1 else "','"
    return f"string_agg({'DISTINCT ' if distinct else ''}({body})::text, {sep})"


_TRUTH = re.compile(r"(=|<|>|\bIS\b|\bIN\b|\bEXISTS\b|\bAND\b|\bOR\b|\bNOT\b|\bLIKE\b)", re.I)


def _top(text: str) -> str:
    """`text` without what its parentheses hold."""
    out, depth = [], 0
    for char in text:
        depth += (char == "(") - (char == ")")
        out.append(char if depth == 0 and char not in "()" else " ")
    return "".join(out)


def _sum(args: list[str]) -> str | None:
    """sum(a truth) counts, in SQLite: PostgreSQL sums no booleans, so the truth is cast."""
    body = args[0].strip()
    if len(args) != 1 or re.match(r"(DISTINCT|CASE)\b", body, re.I):
        return None
    if not _TRUTH.search(_top(body)):
        return None
    return f"sum(CAST({body} AS INT))"


def _totals(text: str) -> str:
    """total(x) [FILTER (...)]: coalesce(sum(x) [FILTER (...)], 0.0), SQLite's sum that is 0.0
    over no rows."""

    def total(text: str, found: re.Match[str], end: int) -> tuple[str, int]:
        call = f"sum({text[found.end() : end]})"
        after = re.match(r"\s*FILTER\s*\(", text[end + 1 :], re.I)
        if after:
            close = _closing(text, end + 1 + after.end())
            call += text[end + 1 : close + 1]
            end = close
        return f"coalesce({call}, 0.0)", end

    return _rewritten(text, re.compile(r"\btotal\s*\(", re.I), total)


_CLAUSE = re.compile(
    r"\s*($|\)|,|WHERE\b|GROUP\b|ORDER\b|LIMIT\b|UNION\b|JOIN\b|CROSS\b|LEFT\b|INNER\b"
    r"|ON\b|HAVING\b|WINDOW\b)",
    re.I,
)


_SUBQUERY = re.compile(r"\b(FROM|JOIN)\s*\(\s*(?=SELECT\b|WITH\b)", re.I)


def _aliased(text: str) -> str:
    """A subquery in FROM or JOIN without a name given one: PostgreSQL requires it."""
    names = itertools.count()

    def subquery(text: str, found: re.Match[str], end: int) -> tuple[str, int]:
        start = text.index("(", found.start())
        inner = _aliased(text[start + 1 : end])
        named = "" if not _CLAUSE.match(text[end + 1 :]) else f" AS _q{next(names)}"
        return f"{text[found.start() : start]}({inner}){named}", end

    return _rewritten(text, _SUBQUERY, subquery)


def _cast(text: str) -> str:
    """CAST(x AS INTEGER) truncates in both: SQLite's cast of a real drops the fraction,
    PostgreSQL's rounds, so the value is truncated first."""

    def truncated(text: str, found: re.Match[str], end: int) -> tuple[str, int]:
        inner = _cast(text[found.end() : end])
        typed = re.match(r"(?s)(.*)\s+AS\s+INTEGER\s*$", inner, re.I)
        if typed:
            return f"CAST(trunc({typed.group(1)}) AS BIGINT)", end
        return f"{found.group()}{inner})", end

    return _rewritten(text, re.compile(r"\bCAST\s*\(", re.I), truncated)


def _plain(text: str) -> str:
    """The translation of SQL text outside literals and quoted names."""
    text = _QUALIFIED.sub(r'"\1"', text)
    text = _RESERVED.sub(r'"\1"', text)
    text = _IS.sub(lambda m: "IS DISTINCT FROM " if m.group(1) else "IS NOT DISTINCT FROM ", text)
    text = re.sub(r"\btemp\.", "pg_temp.", text)
    text = _calls(text, "max", _scalar("GREATEST"))
    text = _calls(text, "min", _scalar("LEAST"))
    text = _calls(text, "group_concat", _group_concat)
    text = _calls(text, "instr", lambda args: f"(strpos({','.join(args)}) > 0)")
    text = re.sub(r"\s+INDEXED\s+BY\s+\w+", "", text, flags=re.I)
    text = _cast(text)
    text = _calls(text, "sum", _sum)
    text = _totals(text)
    text = _aliased(text)
    text = re.sub(r"\bLIMIT\s+-1\b", "LIMIT ALL", text, flags=re.I)
    if re.match(r"\s*(CREATE|ALTER)\s+TABLE\b", text, re.I):
        for pattern, word in _TYPES:
            text = pattern.sub(word, text)
    return text


def _numbered(text: str) -> tuple[str, tuple[str, ...]]:
    """`?` and `:name` outside literals as $1, $2, ... in the order they come (a name used
    twice is one number); the names in their numbers' order."""
    names: list[str] = []
    count = itertools.count(1)

    def named(found: re.Match[str]) -> str:
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    def numbered(part: str) -> str:
        part = re.sub(r"\?", lambda _m: f"${next(count)}", part)
        return _NAMED.sub(named, part)

    text = _outside(text, numbered)
    if names and next(count) > 1:
        raise ValueError("a statement takes ? or :name, not both")
    return text, tuple(names)


def translate(sql: str) -> str:
    """SQLite's statement as PostgreSQL takes it (the module's docstring lists what changes)."""
    return _translated(sql)[0]


@functools.lru_cache(maxsize=1024)
def _translated(sql: str) -> tuple[str, tuple[str, ...]]:
    """translate's text, and the :names in the order of its $ numbers."""
    if _IMMEDIATE.match(sql):
        return "BEGIN", ()  # Connection.execute takes the writers' lock with it
    if _DEFERRED.match(sql):
        # PostgreSQL's default, READ COMMITTED, takes a snapshot per statement: the report's
        # total and its failures could come from two moments of a collect's writes
        return "BEGIN ISOLATION LEVEL REPEATABLE READ", ()
    verb = _OR_VERB.match(sql)
    tail = ""
    if verb:
        table = verb.group(2)
        sql = f"INSERT INTO {table}{sql[verb.end() :]}"
        if verb.group(1).upper() == "IGNORE":
            tail = " ON CONFLICT DO NOTHING"
        else:
            spec = store.TABLE[table]
            cols = re.search(r"\(([^)]*)\)", sql[: sql.upper().find("VALUES")] or sql)
            names = [c.strip() for c in cols.group(1).split(",")] if cols else spec.names()
            sets = ", ".join(f"{c} = excluded.{c}" for c in names if c not in spec.key)
            action = f"DO UPDATE SET {sets}" if sets else "DO NOTHING"
            tail = f" ON CONFLICT ({', '.join(spec.key)}) {action}"
    return _numbered(_outside(sql.rstrip().rstrip(";"), _plain) + _outside(tail, _plain))


# --- errors ---------------------------------------------------------------------------------

# SQLSTATE classes of a server that cannot serve now: connection exception, insufficient
# resources (disk full), operator intervention (shut down), system error (I/O); and 25006, a
# read-only transaction (a replica).
_DOWN = ("08", "53", "57", "58")
UNAVAILABLE = "fleet store server unavailable"


def _as_sqlite(exc: Exception) -> sqlite3.Error:
    """A psycopg error as the sqlite3 class the callers already handle, one line."""
    import psycopg  # noqa: PLC0415

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    state = getattr(exc, "sqlstate", None) or ""
    if isinstance(exc, psycopg.OperationalError) or state[:2] in _DOWN or state == "25006":
        # The server cannot take writes now, whatever is being merged: a store fault
        # (fleet/records.py store_fault), so collect stops at once and keeps every file.
        return sqlite3.OperationalError(f"{UNAVAILABLE}: {text}")
    kinds: tuple[tuple[type, type[sqlite3.Error]], ...] = (
        (psycopg.errors.IntegrityError, sqlite3.IntegrityError),
        (psycopg.errors.DataError, sqlite3.IntegrityError),
        (psycopg.errors.ProgrammingError, sqlite3.OperationalError),
        (psycopg.errors.OperationalError, sqlite3.OperationalError),
        (psycopg.errors.InterfaceError, sqlite3.OperationalError),
    )
    for theirs, ours in kinds:
        if isinstance(exc, theirs):
            return ours(text)
    return sqlite3.DatabaseError(text)


# --- the connection -------------------------------------------------------------------------


def _text(value: Any) -> Any:
    """A string as PostgreSQL's text can hold it: a NUL (which a kernel log line or a job name
    may carry, and SQLite stores) becomes SUB, ASCII's substitute character, which every reader
    shows as `?` as it showed the NUL."""
    return value.replace("\x00", "\x1a") if type(value) is str and "\x00" in value else value


class Cursor:
    """The part of sqlite3.Cursor the fleet code uses."""

    def __init__(self, cursor: Any, rows: list[tuple[Any, ...]] | None = None) -> None:
        self._cursor = cursor
        self._rows = rows

    @property
    def description(self) -> Any:
        return self._cursor.description if self._cursor is not None else None

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount if self._cursor is not None else -1

    def fetchone(self) -> Any:
        if self._rows is not None:
            return self._rows.pop(0) if self._rows else None
        return self._call(self._cursor.fetchone) if self._cursor.description else None

    def fetchall(self) -> list[Any]:
        if self._rows is not None:
            rows, self._rows = self._rows, []
            return rows
        return self._call(self._cursor.fetchall) if self._cursor.description else []

    def fetchmany(self, size: int = 1) -> list[Any]:
        if self._rows is not None:
            rows, self._rows = self._rows[:size], self._rows[size:]
            return rows
        return self._call(self._cursor.fetchmany, size) if self._cursor.description else []

    def __iter__(self) -> Iterator[Any]:
        while True:
            rows = self.fetchmany(1000)
            if not rows:
                return
            yield from rows

    @staticmethod
    def _call(fn: Any, *args: Any) -> Any:
        import psycopg  # noqa: PLC0415

        try:
            return fn(*args)
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from None


class Connection:
    """A PostgreSQL connection that takes the fleet code's SQLite statements (autocommit, with
    explicit BEGIN/COMMIT as the SQLite store runs with isolation_level=None)."""

    def __init__(self, raw: Any, url: str) -> None:
        self._raw = raw
        self.url = url
        self.total_changes = 0

    @property
    def in_transaction(self) -> bool:
        import psycopg  # noqa: PLC0415

        status = psycopg.pq.TransactionStatus
        now = self._raw.info.transaction_status  # UNKNOWN: the connection is gone
        return bool(now in (status.INTRANS, status.INERROR, status.ACTIVE))

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Cursor:
        pragma = re.match(r"\s*PRAGMA\s+(\w+)\s*(?:=\s*(\S+))?", sql, re.I)
        if pragma:
            return self._pragma(pragma.group(1).lower(), pragma.group(2))
        if _IMMEDIATE.match(sql):
            # SQLite's one writer at a time, which the merges and the rollup count on (a
            # node-hour rolled up by two collectors at once would be counted twice): every
            # write transaction of every collector takes one lock, held to its end.
            self._run("BEGIN", ())
            return self._run("SELECT pg_advisory_xact_lock($1)", (WRITER_LOCK,))
        text, names = _translated(sql)
        if isinstance(params, dict):
            return self._run(text, tuple(_text(params[name]) for name in names))
        return self._run(text, tuple(_text(v) for v in params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor:
        import psycopg  # noqa: PLC0415

        try:
            cursor = self._raw.cursor()
            cursor.executemany(translate(sql), [tuple(_text(v) for v in row) for row in rows])
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from None
        self._count(cursor, sql)
        return Cursor(cursor)

    def _run(self, sql: str, params: Any) -> Cursor:
        import psycopg  # noqa: PLC0415

        try:
            cursor = self._raw.cursor()
            cursor.execute(sql, params)
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from None
        self._count(cursor, sql)
        return Cursor(cursor)

    def _count(self, cursor: Any, sql: str) -> None:
        """SQLite's total_changes: the rows INSERT, UPDATE and DELETE changed (read from the
        statement, not the status line, which psycopg 3.2 leaves unset after executemany)."""
        verb = sql.lstrip()[:6].upper()
        if cursor.rowcount > 0 and verb in ("INSERT", "UPDATE", "DELETE"):
            self.total_changes += cursor.rowcount

    def _pragma(self, name: str, value: str | None) -> Cursor:
        if name == "user_version":
            if value is not None:
                self._run("UPDATE slurmhealth_schema SET version = $1", (int(value),))
                return Cursor(None, [])
            return Cursor(None, [(self.schema_version(),)])
        if name == "quick_check":
            return Cursor(None, [("ok",)])
        if name == "database_list":
            return Cursor(None, [(0, "main", self.url)])
        # journal_mode, synchronous, cache_size, busy_timeout: SQLite's own; read as 0
        return Cursor(None, [] if value is not None else [(0,)])

    def schema_version(self) -> int:
        row = self._run("SELECT version FROM slurmhealth_schema", ()).fetchone()
        return int(row[0]) if row else 0

    def commit(self) -> None:
        if self.in_transaction:
            self._run("COMMIT", ())

    def rollback(self) -> None:
        if self.in_transaction:
            self._run("ROLLBACK", ())

    def close(self) -> None:
        self._raw.close()

    def cancel(self) -> None:
        """Ask the server to stop the statement running now (from another thread)."""
        self._raw.cancel()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.rollback()


def _numbers(raw: Any) -> None:
    """numeric (what sum() and avg() of integers give) as int or float, as SQLite answers, not
    Decimal, which no caller can add to a float."""
    from psycopg.adapt import Loader  # noqa: PLC0415

    class _Number(Loader):
        def load(self, data: Any) -> int | float:
            text = bytes(data).decode()
            try:
                return int(text)
            except ValueError:
                return float(text)

    raw.adapters.register_loader("numeric", _Number)


_QUIET = logging.NullHandler()


def connect(url: str, existing: bool = False) -> sqlite3.Connection:
    """Open the fleet store at `url`, creating or migrating its tables; StoreError with a
    one-line reason (psycopg missing, the server unreachable, a newer schema). `existing`: a
    command that reads a store names one; a database without our tables is refused, never
    given them."""
    try:
        import psycopg  # noqa: PLC0415
    except ImportError:
        raise store.StoreError(
            "PostgreSQL fleet stores need psycopg 3: pip install 'slurmhealth[postgresql]'"
        ) from None
    # psycopg logs what it ignores while closing a pipeline on a lost connection ("error
    # ignored terminating <psycopg.Pipeline ...>"); with no handler Python prints it as a
    # second line beside the store fault this module reports: kept out of the terminal.
    logging.getLogger("psycopg").addHandler(_QUIET)
    if urllib.parse.urlsplit(url).password is not None:
        raise store.StoreError(
            f"{shown(url)}: a password in the URL would show in ps and in every message: "
            "put it in ~/.pgpass or $PGPASSWORD"
        )
    try:
        raw = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            cursor_factory=psycopg.RawCursor,
        )
    except psycopg.Error as exc:
        raise store.StoreError(f"{shown(url)}: {_as_sqlite(exc)}") from None
    _numbers(raw)
    conn = Connection(raw, url)
    try:
        if existing and not _ours(conn):
            raise sqlite3.OperationalError("not a slurmhealth fleet store: nothing written to it")
        if conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
            _read_only(conn)  # a replica: it reads what its primary wrote, as it is
        else:
            _migrate(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise store.StoreError(f"{shown(url)}: {exc}") from None
    return cast("sqlite3.Connection", conn)  # the interface the fleet code uses of it


# A snapshot's name as pg_export_snapshot gives it (e.g. 00000003-0000001B-1): set inline, as
# SET TRANSACTION takes no parameter.
_SNAPSHOT = re.compile(r"[0-9A-Fa-f-]{1,64}")


def twin(conn: sqlite3.Connection) -> sqlite3.Connection | None:
    """A second connection to `conn`'s server whose read transaction sees exactly what `conn`'s
    does (pg_export_snapshot, SET TRANSACTION SNAPSHOT: conn in a repeatable-read transaction,
    queries.snapshot), for reads that go on beside the caller's on another server process;
    None where there is none: a SQLite store, conn in no such transaction, or a second
    connection the server refuses (the caller then reads on conn)."""
    if not isinstance(conn, Connection) or not conn.in_transaction:
        return None
    if conn.execute("SHOW transaction_isolation").fetchone()[0] != "repeatable read":
        return None
    name = str(conn.execute("SELECT pg_export_snapshot()").fetchone()[0])
    if not _SNAPSHOT.fullmatch(name):
        return None
    import psycopg  # noqa: PLC0415

    try:
        raw = psycopg.connect(
            conn.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            cursor_factory=psycopg.RawCursor,
        )
    except psycopg.Error:
        return None
    _numbers(raw)
    other = Connection(raw, conn.url)
    try:
        other._run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", ())
        other._run(f"SET TRANSACTION SNAPSHOT '{name}'", ())  # checked above: hex and dashes
    except sqlite3.Error:
        other.close()
        return None
    return cast("sqlite3.Connection", other)


# SQLite's rowid of a run, which the rollup and the report read (runs merged since the last
# rollup, the store's size): the order rows came in, as an identity column. Never exported:
# every reader names its columns.
_ROWID = (
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS rowid BIGINT GENERATED BY DEFAULT AS IDENTITY",
    "CREATE INDEX IF NOT EXISTS runs_rowid ON runs (rowid)",
)


def _read_only(conn: Connection) -> None:
    """A replica (hot standby) serves `report` and `lemons` at the primary's schema; any
    other schema is one line, as no migration can run there."""
    version = conn.schema_version() if _ours(conn) else 0
    if version != store.SCHEMA_VERSION:
        raise sqlite3.OperationalError(
            f"a read-only replica at store schema {version}, and this slurmhealth reads "
            f"{store.SCHEMA_VERSION}: open the primary with it first"
        )


def _ours(conn: Connection) -> bool:
    found = conn.execute("SELECT to_regclass(?)", ("slurmhealth_schema",)).fetchone()[0]
    return found is not None and conn.schema_version() > 0


def _migrate(conn: Connection) -> None:
    """The table spec's migrations, once, under an advisory lock (two collectors starting
    together on an empty database create it once)."""
    conn.execute("CREATE TABLE IF NOT EXISTS slurmhealth_schema (version INTEGER NOT NULL)")
    if conn.schema_version() == store.SCHEMA_VERSION:
        return
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
        if conn.execute("SELECT count(*) FROM slurmhealth_schema").fetchone()[0] == 0:
            conn.execute("INSERT INTO slurmhealth_schema (version) VALUES (0)")
        version = conn.schema_version()
        if version > store.SCHEMA_VERSION:
            raise sqlite3.OperationalError(
                f"store schema {version} is newer than this slurmhealth ({store.SCHEMA_VERSION})"
            )
        for number in range(version + 1, store.SCHEMA_VERSION + 1):
            for statement in store.migration(number):
                conn.execute(statement)
        for statement in _ROWID:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {store.SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise


# --- moving a SQLite fleet store onto the server ---------------------------------------------

CHUNK = 10_000


def copy_from(path: str, conn: sqlite3.Connection, progress: Any = None) -> dict[str, int]:
    """Copy every table of the SQLite fleet store at `path` (opened read-only, at this
    version's schema) into the empty PostgreSQL store `conn`, in one transaction: {table:
    rows}. The runs keep their order (the rollup's mark counts in it). StoreError with one
    line when the file is no store of ours, an older schema, or the database is not empty."""
    try:
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        version = source.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        raise store.StoreError(f"{path}: {exc}") from None
    try:
        if version != store.SCHEMA_VERSION:
            what = "not a slurmhealth store" if version == 0 else f"store schema {version}"
            hint = (
                ""
                if version == 0
                else f": open it once with this slurmhealth (schema {store.SCHEMA_VERSION}) "
                "first, e.g. slurmhealth report --db FILE"
            )
            raise store.StoreError(f"{path}: {what}{hint}")
        held = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        if held:
            raise store.StoreError(
                f"{shown(getattr(conn, 'url', ''))}: holds {held} runs already: "
                "migrate into an empty database"
            )
        return _copy(source, conn, progress)
    except sqlite3.Error as exc:
        raise store.StoreError(str(exc)) from None
    finally:
        source.close()


def _copy(
    source: sqlite3.Connection, conn: sqlite3.Connection, progress: Any
) -> dict[str, int]:
    counts = {}
    with store.immediate(conn):
        for table in store.TABLES:
            names = table.names()
            extra = ("rowid",) if table.name == "runs" else ()
            order = " ORDER BY rowid" if table.name == "runs" else ""
            rows = source.execute(f"SELECT {', '.join((*names, *extra))} FROM {table.name}{order}")  # noqa: S608 - the spec's names
            insert = store.insert_sql(table.name, (*names, *extra))
            counts[table.name] = 0
            while True:
                chunk = rows.fetchmany(CHUNK)
                if not chunk:
                    break
                conn.executemany(insert, chunk)
                counts[table.name] += len(chunk)
                if progress:
                    progress(len(chunk))
        conn.execute(  # the next run merged comes after every copied one
            "SELECT setval(pg_get_serial_sequence('runs', 'rowid'), "
            "coalesce(max(rowid), 0) + 1, false) FROM runs"
        )
    conn.execute("ANALYZE")  # the planner's figures for what was just loaded
    return counts


def open_store(path: str, command_name: str) -> sqlite3.Connection:
    """core/command.py open_store, a PostgreSQL URL too: the store a fleet command reads (for a
    URL: one that exists, of ours; CommandError with one line otherwise)."""
    from slurmhealth.core import command  # noqa: PLC0415

    if not is_url(path):
        return command.open_store(path, command_name)
    try:
        return connect(path, existing=True)
    except store.StoreError as exc:
        raise command.CommandError(str(exc)) from None
