"""Collect: a head node's cycle that merges every node's spool files and store copies.

`collect` claims each spool file (rename, so a writer still running is never read half-way),
merges it through fleet/records.py's import and removes it; a node store is copied safely
(owner and symlink checks, SQLite's own backup, an integrity check) and merged from the copy
by watermark. Slurm accounting windows are remembered here too. docs/fleet.md, "Incremental
collection".
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import stat
import tempfile
import time
from collections.abc import Collection
from urllib.parse import quote

from slurmhealth.core import command, files, store
from slurmhealth.core.command import CommandError, Console
from slurmhealth.core.hostlist import is_node_name
from slurmhealth.core.result import clean
from slurmhealth.fleet import records, text
from slurmhealth.fleet.records import FleetError, StoreFault

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


def _trusted_source(path: str, fd: int, tmp: str, owners: Collection[int]) -> str:
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
    owners: Collection[int] = (),
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
    if not isinstance(conn, sqlite3.Connection):  # a PostgreSQL fleet store (fleet/pgstore.py)
        return _merge_rows(conn, copy, since, source)
    conn.execute("ATTACH DATABASE ? AS node", (copy,))
    try:
        return _merge_attached(conn, since, source)
    except sqlite3.Error as exc:
        fault = StoreFault if records.store_fault(exc) else FleetError
        raise fault(clean(exc, 120)) from None
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
        for spec in records.KINDS.values()
        if spec.node is not None
    )
    names = [row[0] for row in conn.execute(selects)]
    return json.dumps([n for n in names if isinstance(n, str) and not is_node_name(n)])


def _merge_attached(conn: sqlite3.Connection, since: float | None, source: str | None) -> dict:
    added = {}
    with store.immediate(conn):
        bad = _bad_nodes(conn)
        for kind, spec in records.KINDS.items():
            where, args = records.dated(kind, since, prefix="node.")
            columns = ", ".join(spec.columns)  # names and conditions from the fixed tables above
            where = f"{where} AND {spec.valid_sql}"
            if spec.node is not None and bad != "[]":
                where += " AND node NOT IN (SELECT value FROM json_each(?))"
                args = (*args, bad)
            select = f"SELECT {columns} FROM node.{spec.table} WHERE {where}"  # noqa: S608
            added[kind] = records.changes(conn, records.merge_sql(kind, select), args)
        if source is not None:
            mark = conn.execute(_NEWEST).fetchone()[0]
            conn.execute(_MARK, (source, mark, "", time.time()))
    return added


def _merge_rows(
    conn: sqlite3.Connection, copy: str, since: float | None, source: str | None
) -> dict:
    """_merge_attached for a fleet store that cannot ATTACH a SQLite file (PostgreSQL): the
    same rows, chosen and checked by the same SQL on the node store's private copy, written
    in one transaction."""
    node = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    node.execute("ATTACH DATABASE ? AS node", (copy,))  # the names _merge_attached reads
    added = {}
    try:
        bad = set(json.loads(_bad_nodes(node)))
        rows = {}
        for kind, spec in records.KINDS.items():
            where, args = records.dated(kind, since, prefix="node.")
            columns = ", ".join(spec.columns)
            checked = f"{where} AND {spec.valid_sql}"
            select = f"SELECT {columns} FROM node.{spec.table} WHERE {checked}"  # noqa: S608
            picked = node.execute(select, args)
            rows[kind] = [r for r in picked if spec.node is None or r[spec.node] not in bad]
        mark = node.execute(_NEWEST).fetchone()[0] if source is not None else None
    except sqlite3.Error as exc:
        raise FleetError(clean(exc, 120)) from None
    finally:
        node.close()
    try:
        with store.immediate(conn):
            for kind, found in rows.items():
                added[kind] = records.changes(conn, records.VALUES[kind], found, many=True)
            if source is not None:
                conn.execute(_MARK, (source, mark, "", time.time()))
    except sqlite3.Error as exc:
        fault = StoreFault if records.store_fault(exc) else FleetError
        raise fault(clean(exc, 120)) from None
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
    progress: records.Progress = None,
    owners: Collection[int] = (),
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
    the last collect saw in it) less records.OVERLAP, never before `since`; a spool whose identity
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
    added = dict.fromkeys(records.KINDS, 0)
    report: dict = {"merged": [], "skipped": [], "imports": [], "added": added}
    report.update(unchanged=[], kept=[], cleaned=0)
    marks = {} if full else dict(conn.execute("SELECT source, mark FROM watermarks"))
    identities = {} if full else dict(conn.execute("SELECT source, identity FROM watermarks"))
    batch = _Batch(conn, report, owners)
    with records.bulk(conn):
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
    """The later of `since` and a watermark less records.OVERLAP."""
    if mark is None:
        return since
    return mark - records.OVERLAP if since is None else max(since, mark - records.OVERLAP)


def _merged(report: dict, path: str, added: dict) -> None:
    report["merged"].append((path, added))
    for kind, n in added.items():
        report["added"][kind] += n


def _collect_store(
    conn: sqlite3.Connection, path: str, since: float | None, report: dict, owners: Collection[int]
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


def _unclaim(batch: _Batch, claimed: str, original: str) -> None:
    """A file claimed this run and refused goes back under its own name where that is free (a
    hard link, never over a newer export), so the node's next incremental export, finding its
    file unread, starts where that one did and replaces it: refused files do not pile up as a
    new claimed copy each run. The report names it as it is left."""
    try:
        os.link(claimed, original, follow_symlinks=False)
        os.unlink(claimed)
    except OSError:
        return  # its name taken again (the node exported since): kept claimed, read next time
    said = batch.report["skipped"]
    if said and said[-1][0] == claimed:
        said[-1] = (original, said[-1][1])


def _collect_spool(batch: _Batch, path: str, consume: bool, identities: dict) -> None:
    claimed = path.endswith(CLAIMED)
    original = None  # the name of a file claimed by this run, given back if it is refused
    if consume and not claimed:
        target = _claim(path, batch.report)
        if target is None:
            return
        claimed = target != path
        original, path = (path if claimed else None), target
    try:
        fd = files.open_trusted(path, batch.owners)
    except (files.Unsafe, OSError) as exc:
        why = exc.strerror if isinstance(exc, files.Unsafe) else clean(exc, 160)
        batch.report["skipped"].append((path, why))
        if original:
            _unclaim(batch, path, original)
        return
    st = os.fstat(fd)
    identity = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    if not claimed and identities.get(_source(path)) == identity:
        os.close(fd)
        batch.report["unchanged"].append(path)
        return
    with os.fdopen(fd, "rb") as handle:
        taken = batch.read(path, handle, None if claimed else identity)
    if not taken and original:
        _unclaim(batch, path, original)


class _Batch:
    """Spools merged many per transaction (one commit per ~CHUNK records, not per file): each
    file's records, counted per file, its watermark in the same transaction, and a claimed
    file removed only once that transaction committed."""

    def __init__(self, conn: sqlite3.Connection, report: dict, owners: Collection[int]) -> None:
        self.conn, self.report, self.owners = conn, report, owners
        self.files: list = []  # (path, chunk, identity or None for a claimed file)
        self.size = 0

    def read(self, path: str, handle: object, identity: str | None) -> bool:
        """Read (and merge, or batch) one file; False when it was refused (skipped)."""
        chunks = records.chunks(records.lines_of(handle))
        try:
            first = next(chunks)
            second = next(chunks, None)
            if second is None:  # one chunk: batched with other files
                self.files.append((path, first, identity))
                self.size += first.size
                if self.size >= records.CHUNK:
                    self.flush()
                return True
            self.flush()  # a large file: its chunks are transactions of their own
            result = records.new_result()
            for chunk in (first, second, *chunks):
                records.write_chunk(self.conn, chunk, result)
        except StoreFault:
            raise
        except FleetError as exc:
            self.report["skipped"].append((path, clean(exc, 160)))
            return False
        self._done(path, result, identity)
        return True

    def flush(self) -> None:
        pending, self.files, self.size = self.files, [], 0
        if not pending:
            return
        results = []
        try:
            with store.immediate(self.conn):
                for path, chunk, identity in pending:
                    result = records.new_result()
                    records.apply_chunk(self.conn, chunk, result)
                    results.append(result)
                    if identity is not None:
                        self.conn.execute(_MARK, (_source(path), None, identity, time.time()))
        except sqlite3.Error as exc:
            # the files stay (claimed ones too): the next collect reads them
            if records.store_fault(exc):
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
    mark = store.mark_of(conn, f"accounting:{tool}")
    return since if mark is None else max(since, mark - ACCOUNTING_OVERLAP)


def accounted(conn: sqlite3.Connection, tool: str, end: float) -> None:
    """Remember that `tool`'s records up to `end` (head-node time) are merged."""
    try:
        conn.execute(_MARK, (f"accounting:{tool}", end, "", time.time()))
    except sqlite3.Error as exc:
        raise FleetError(clean(exc, 120)) from None


# --- `slurmhealth collect`: the files, then the rollup, then Slurm accounting -----------------


@dataclasses.dataclass(frozen=True)
class Request:
    """What one `slurmhealth collect` is asked: the folder, the span [start, end] (--since,
    --now), the spool owners trusted besides root (uids), --consume, --full, --rollup-after
    (as given: read once the files are merged) and --rollup-max (None: all due), --sacct and
    where Slurm's commands are."""

    directory: str
    start: float
    end: float
    owners: tuple = ()
    consume: bool = False
    full: bool = False
    rollup_after: str | None = None
    rollup_max: int | None = None
    sacct: bool = False
    slurm_bin: str = ""


def owner_ids(names: tuple) -> tuple:
    """--spool-owner USER...: each a uid, or a user name this host knows."""
    import pwd  # noqa: PLC0415

    owners = []
    for name in names:
        try:
            owners.append(int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise CommandError(f"no user {name}", option="--spool-owner") from None
    return tuple(owners)


def run(conn: sqlite3.Connection, path: str, request: Request, console: Console) -> None:
    """`slurmhealth collect` into the fleet store at `path`: merge the folder's files, then roll
    up, then merge Slurm accounting, each step's lines said as it ends; CommandError with one
    line for what stops it (what was merged before stays committed)."""
    try:
        store.check_writable(conn)
    except store.StoreError as exc:
        raise CommandError(f"{path}: cannot be written: {exc}") from None
    try:
        paths = collect_paths(request.directory)
        with console.progress(len(paths), "collect") as tick:
            owners = list(request.owners)
            report = collect(
                conn, request.directory, request.start, tick, owners, request.consume, request.full
            )
    except StoreFault as exc:
        raise CommandError(
            f"{path}: stopped taking writes ({exc}): collect stopped; what it had"
            " merged is committed, the files not merged stay for the next collect"
        ) from None
    except FleetError as exc:
        raise CommandError(str(exc)) from None
    for line in text.collect_skipped(report):
        console.err(line)
    console.out(text.collected(report))
    if request.rollup_after is not None:
        before = command.start(request.rollup_after, request.end, "--rollup-after")
        _rollup(conn, before, request.rollup_max, console)
    if request.sacct:
        _accounting(conn, request, console)


def _rollup(conn: sqlite3.Connection, before: float, limit: int | None, console: Console) -> None:
    from slurmhealth.fleet import rollup  # noqa: PLC0415

    try:
        done = rollup.rollup(conn, before, limit)
    except store.StoreError as exc:
        raise CommandError(f"rollup: {exc}") from None
    for line in text.rolled_up(done, rollup.ROLLUP_BEHIND):
        console.out(line)


def _accounting(conn: sqlite3.Connection, request: Request, console: Console) -> None:
    """Job outcomes (sacct), then node events (sacctmgr), then where Slurm puts each node."""
    span = (accounting_start(conn, "sacct", request.start, request.full), request.end)
    _merge_accounting(conn, "sacct", (*span, request.slurm_bin), console)
    # After the jobs are committed: a sacctmgr that fails then loses none of them.
    span = (accounting_start(conn, "sacctmgr", request.start, request.full), request.end)
    _merge_accounting(conn, "sacctmgr", (*span, request.slurm_bin), console)
    _merge_places(conn, request.end, request.slurm_bin, console)


# tool -> (what its records are, the count's key in the ingest result, what a count is of)
_ACCOUNTING = {
    "sacct": ("job outcomes", "jobs", "job rows"),
    "sacctmgr": ("node events", "events", "node events"),
}


def _merge_accounting(conn: sqlite3.Connection, tool: str, span: tuple, console: Console) -> None:
    """Fetch one kind of accounting records and merge them: one line for a Slurm error or a
    store that would not take them, the count, and the lines that could not be read."""
    from slurmhealth.core.slurm import SlurmError  # noqa: PLC0415
    from slurmhealth.fleet import accounting  # noqa: PLC0415

    fetch, ingest = {
        "sacct": (accounting.fetch_sacct, accounting.ingest_sacct),
        "sacctmgr": (accounting.fetch_events, accounting.ingest_events),
    }[tool]
    what, key, unit = _ACCOUNTING[tool]
    try:
        found = fetch(*span)
    except SlurmError as exc:
        raise CommandError(f"{exc} ({what} from accounting not merged)") from None
    try:
        result = ingest(conn, found, utc=True)
        accounted(conn, tool, span[1])
    except FleetError as exc:
        raise CommandError(str(exc)) from None
    console.out(f"{tool}: {result[key]:,} {unit} added or updated")
    for line in result["bad"][: records.BAD_SHOWN]:
        console.err(f"{tool}: skipped: {line}")


def _merge_places(conn: sqlite3.Connection, now: float, slurm_bin: str, console: Console) -> None:
    """Where Slurm puts each node now (topology, partitions): one line for a Slurm error."""
    from slurmhealth.core.slurm import SlurmError  # noqa: PLC0415
    from slurmhealth.fleet import accounting  # noqa: PLC0415

    try:
        rows, bad = accounting.fetch_places(slurm_bin)
    except SlurmError as exc:
        raise CommandError(f"{exc} (places of nodes not merged)") from None
    try:
        result = accounting.ingest_places(conn, rows, now)
    except FleetError as exc:
        raise CommandError(str(exc)) from None
    console.out(text.places(result, rows))
    for line in bad[: records.BAD_SHOWN]:
        console.err(f"places: skipped: {line}")
