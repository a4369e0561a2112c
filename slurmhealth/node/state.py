"""The node's small side state, kept outside the SQLite store: what must survive the store.

A store can be locked for minutes (an admin's sqlite3 shell, a long prune), moved aside as
corrupt, replaced or refused as too new. Two facts must never go with it:
- the kernel-log position (boot id, last sequence read): lost, every old Xid would be read again
  and a fault the admin already handled would drain the node again;
- a fault seen but not yet acted on (the drain failed, the controller did not answer, the breaker
  could not count the fleet): lost, the sick node would take the next job.

One JSON file per node, `<state dir>/<node>.state.json`, replaced atomically, mode 0600 from its
first byte, never written through a symlink. It is read and written once per run (its cost:
docs/benchmarks.md). Reading never raises: a missing or damaged file is an empty state (the
store's baseline is then the fallback for the kernel-log position).
"""

from __future__ import annotations

import json
import os

from slurmhealth.core import files

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, TypedDict

    class KmsgPosition(TypedDict):
        """Where the kernel log was read up to: its last sequence number, and the boot it
        belongs to as saved (not checked here: kmsg.read counts one of the wrong type as
        none)."""

        seq: int
        boot_id: object

    Doc = dict[str, Any]  # the state document, or one spooled entry (a run, an action)

FORMAT = 1
READ_MAX = 1 << 16  # our file is a few hundred bytes; anything bigger is not ours


def path_for(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, f"{node}.state.json")


def load(path: str) -> Doc:
    """The saved state, or {} when there is none or it cannot be trusted (a symlink, a FIFO,
    a file someone else made or may write: files.open_trusted)."""
    try:
        fd = files.open_trusted(path)
    except OSError:
        return {}
    try:
        data = os.read(fd, READ_MAX + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    try:
        doc = json.loads(data) if len(data) <= READ_MAX else None
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return {}
    return doc


def kmsg_position(doc: Doc) -> KmsgPosition | None:
    """{"seq", "boot_id"} of the last kernel-log record read, if the state has a sane one."""
    pos = doc.get("kmsg")
    if isinstance(pos, dict) and isinstance(pos.get("seq"), int) and not isinstance(
        pos.get("seq"), bool
    ):
        return {"seq": pos["seq"], "boot_id": pos.get("boot_id")}
    return None


def pending(doc: Doc) -> Doc | None:
    """The fault seen and not yet acted on: {"message", "since", "phase"}, with "service" (an
    admin lifts its drain) and "gpus" (a fault on those GPUs only: a job hook whose job holds
    none of them drains without refusing the job) where so; or None."""
    item = doc.get("pending")
    if isinstance(item, dict) and isinstance(item.get("message"), str) and item["message"]:
        return item
    return None


def save(path: str, doc: Doc) -> None:
    """Replace the state file: a private temp file created exclusively beside it, then renamed
    (files.write_private; its directory made 0700 where missing). Raises OSError (the caller
    logs it: the verdict never depends on this file)."""
    files.private_dir(os.path.dirname(os.path.abspath(path)))
    body = json.dumps(dict(doc, format=FORMAT), separators=(",", ":")).encode()
    files.write_private(path, body, 0o600)


LOCK_WAIT_S = 1.0  # a holder takes one small save; one stuck longer (stopped) is not waited on


def update(path: str, known: Doc, wanted: Doc) -> Doc:
    """Save `wanted`, this run's state, merged under a lock with what is on disk now: another
    hook of the node may have saved since this one loaded `known` (a slow health check beside a
    prolog), and its fault or its later kernel-log position must not be undone. Returns what was
    saved. Raises OSError as save() does.

    - the kernel-log position: the later of the two on the same boot, else this run's (it read
      the boot that is running);
    - the pending fault: this run's when it has one; cleared only when the file still holds the
      one this run knew (`known`): a fault another run saved meanwhile stays pending;
    - the remediation under way (the GPUs a reset is for, node/ladder.py): this run's when it
      changed it, else the file's.
    """
    files.private_dir(os.path.dirname(os.path.abspath(path)))
    lock = _lock(path)
    try:
        current = load(path)
        doc = dict(wanted)
        mine, theirs = kmsg_position(wanted), kmsg_position(current)
        if mine and theirs and theirs["boot_id"] == mine["boot_id"] and theirs["seq"] > mine["seq"]:
            doc["kmsg"] = theirs
        if "pending" not in wanted and current.get("pending") not in (None, known.get("pending")):
            doc["pending"] = current["pending"]
        if wanted.get("remediation") == known.get("remediation"):
            # not this run's to change: what is on disk stands (set or cleared since)
            doc.pop("remediation", None)
            if "remediation" in current:
                doc["remediation"] = current["remediation"]
        if doc != current:
            save(path, doc)
            _sweep_temps(path)
        return doc
    finally:
        if lock is not None:
            os.close(lock)


STALE_TEMP_S = 60.0  # a save is short; a temporary file older than this lost its writer


def _sweep_temps(path: str) -> None:
    """Remove the temporary files (`.NAME.RANDOM.tmp`, files.write_private) a save killed
    before its rename left beside the state file."""
    import time  # noqa: PLC0415

    directory, base = os.path.split(os.path.abspath(path))
    try:
        folder = files.open_dir(directory)
    except OSError:
        return
    try:
        for name in os.listdir(folder):
            if not (name.startswith(f".{base}.") and name.endswith(".tmp")):
                continue
            try:
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                if time.time() - st.st_mtime > STALE_TEMP_S and not files.why_not(st):
                    os.unlink(name, dir_fd=folder)
            except OSError:
                pass
    finally:
        os.close(folder)


def _lock(path: str) -> int | None:
    """An exclusive flock on `<path>.lock` (ours, 0600, never through a symlink), or None after
    LOCK_WAIT_S or when it cannot be had: the save then goes ahead unlocked, still whole."""
    try:
        return files.lock(f"{path}.lock", LOCK_WAIT_S)
    except OSError:
        return None


# --- runs the store could not take --------------------------------------------------------------
#
# The spool is appended to under an flock, and taken by renaming it to
# `<spool>.<time ns>.<random>.taking`, whose flock its taker holds until the entries are recorded
# (the file removed) or given back (`release`: the rest written back in place). Whoever holds a
# taken file's lock is its owner: a file nobody holds (its taker was killed, or gave it back) is
# taken by the next run, oldest first (the names sort by the time they were taken), so the runs
# are replayed in the order they ran, and a pid reused never strands or overwrites one. A writer
# that opened the spool just as it was taken finds its file renamed once it has the lock and
# appends to the new spool instead; a taker waits for a writer still appending before it reads.

SPOOL_MAX = 16 << 20  # a store locked for days at a run a minute is ~10 MiB of spooled runs
WRITE_WAIT_S = 0.2  # writers hold the spool's lock for one append
TAKE_WAIT_S = 0.5  # ...so a taker waits this long at most for one to finish
_READ_TAKEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_HELD: dict[str, int] = {}  # taken path -> the descriptor whose lock makes this process its owner


def spool(path: str, entry: Doc) -> None:
    """Append one run the store could not take (locked, full for a moment) to `path`, a private
    file beside the store; the next run that can write the store replays it. Raises OSError."""
    line = (json.dumps(entry, separators=(",", ":"), default=str) + "\n").encode()
    for _ in range(5):  # a spool taken between our open and our lock: append to the new one
        folder = files.open_dir(os.path.dirname(os.path.abspath(path)))
        try:
            if _append(folder, os.path.basename(path), path, line):
                return
        finally:
            os.close(folder)
    raise OSError(f"{path}: taken again and again while appending")


def _append(folder: int, base: str, path: str, line: bytes) -> bool:
    """Append `line` to the spool `base` in `folder` if its file is still the spool once
    locked; False when it was taken meanwhile."""
    # O_NONBLOCK: a FIFO planted there fails at once instead of blocking the run
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(base, flags, 0o600, dir_fd=folder)
    try:
        st = os.fstat(fd)
        why = files.why_not(st)
        if why:  # someone else's file where the spool should be: never appended to
            raise files.Unsafe(path, why)
        _flock(fd, WRITE_WAIT_S)  # not had: another writer is stuck mid-append; O_APPEND holds
        if not _is_named(fd, base, folder):
            return False
        st = os.fstat(fd)
        if st.st_size + len(line) > SPOOL_MAX:
            raise OSError(f"{path} holds {SPOOL_MAX >> 20} MiB of unrecorded runs already")
        os.write(fd, line)
        return True
    finally:
        os.close(fd)


def _flock(fd: int, wait: float, block: bool = True) -> bool:
    """An exclusive flock on `fd` within `wait` seconds (at once without `block`)."""
    return files.flock(fd, wait if block else 0.0)


def _is_named(fd: int, base: str, folder: int) -> bool:
    """Whether `base` in `folder` is still the file open as `fd` (not renamed or removed)."""
    try:
        named = os.stat(base, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return False
    st = os.fstat(fd)
    return st.st_nlink > 0 and (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino)


def take_spool(path: str) -> tuple[list[Doc], list[str]]:
    """(entries, taken paths) of the spooled runs, oldest first: the spools earlier runs took
    and left (killed at their deadline mid-replay, or given back), then the spool itself, moved
    aside first so that a concurrent run spools anew; ([], []) when there are none. This process
    owns the taken files until finish() (recorded: removed) or release() (the rest given back).
    Spooled runs and actions carry their ids, so an entry replayed twice is written once."""
    import time  # noqa: PLC0415

    directory, base = os.path.split(os.path.abspath(path))
    try:  # every hook asks; nearly always there is nothing (a look, no write: docs/benchmarks.md)
        if not any(n == base or n.startswith(base + ".") for n in os.listdir(directory)):
            return [], []
    except OSError:
        return [], []
    entries: list[Doc] = []
    taken: list[str] = []
    try:
        folder = files.open_dir(directory)
    except OSError:
        return [], []
    try:
        for name in _left(folder, base):
            got = _own(folder, name, directory, block=False)
            if got is not None:
                entries += got
                taken.append(os.path.join(directory, name))
        mine = f"{base}.{time.time_ns():020d}.{os.urandom(4).hex()}.taking"
        try:
            os.rename(base, mine, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError:
            return entries, taken  # none there, or a concurrent run took it first
        got = _own(folder, mine, directory, block=True)
        if got is not None:
            entries += got
            taken.append(os.path.join(directory, mine))
    finally:
        os.close(folder)
    return entries, taken


def _left(folder: int, base: str) -> list[str]:
    """The names of taken spools (`<spool>.<time ns>.<random>.taking`, or an older release's
    `<spool>.<pid>.<n>.taking`), oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [n for n in names if n.startswith(base + ".") and n.endswith(".taking")]
    # an older release's names (a pid, not 20 digits of time) were left before any of these
    return sorted(found, key=lambda n: (len(n[len(base) + 1 :].split(".", 1)[0]) == 20, n))


def _own(folder: int, name: str, directory: str, block: bool) -> list[Doc] | None:
    """The entries of the taken spool `name` once this process holds its lock (kept in
    _HELD); None when another process holds it, it is gone, or it cannot be trusted (someone
    else's file is never replayed into the store). `block`: wait for a writer's append."""
    path = os.path.join(directory, name)
    try:
        fd = os.open(name, _READ_TAKEN, dir_fd=folder)
    except OSError:
        return None
    try:
        if files.why_not(os.fstat(fd)):
            raise OSError("not ours")
        if not _flock(fd, TAKE_WAIT_S, block) or not _is_named(fd, name, folder):
            raise OSError("held, or replaced")  # its owner lives, or it was finished meanwhile
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as handle:
            got = [entry for entry in map(_entry, handle) if entry is not None]
    except OSError:
        os.close(fd)
        return None
    _HELD[path] = fd
    return got


def finish(taken: list[str]) -> None:
    """The taken spools' entries are recorded: remove them (and let go of their locks)."""
    for path in taken:
        try:
            os.unlink(path)
        except OSError:
            pass
        _let_go(path)


def release(taken: list[str], rest: list[Doc]) -> None:
    """The store stopped taking the replay: the taken spools become one file of the entries
    not yet recorded (`rest`, in order), under the oldest one's name, so the next run replays
    them first; then let go of them. Raises nothing: a file that cannot be rewritten stays as
    it was (its recorded entries carry ids: written once all the same)."""
    if not taken:
        return
    if not rest:
        finish(taken)
        return
    try:
        body = b"".join(
            (json.dumps(e, separators=(",", ":"), default=str) + "\n").encode() for e in rest
        )
        files.write_private(taken[0], body, 0o600)
        for path in taken[1:]:
            os.unlink(path)
    except OSError:
        pass
    for path in taken:
        _let_go(path)


def _let_go(path: str) -> None:
    fd = _HELD.pop(path, None)
    if fd is not None:
        os.close(fd)


def _entry(line: bytes) -> Doc | None:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if isinstance(entry, dict) and (
        isinstance(entry.get("records"), dict) or isinstance(entry.get("action"), list)
    ):
        return entry
    return None
