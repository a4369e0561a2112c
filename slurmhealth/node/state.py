"""The node's small side state, kept outside the SQLite store: what must survive the store.

A store can be locked for minutes (an admin's sqlite3 shell, a long prune), moved aside as
corrupt, replaced or refused as too new. Two facts must never go with it:
- the kernel-log position (boot id, last sequence read): lost, every old Xid would be read again
  and a fault the admin already handled would drain the node again;
- a fault seen but not yet acted on (the drain failed, the controller did not answer, the breaker
  could not count the fleet): lost, the sick node would take the next job.

One JSON file per node, `<state dir>/<node>.state.json`, replaced atomically, mode 0600 from its
first byte, never written through a symlink. It is read and written once per run (~0.1 ms).
Reading never raises: a missing or damaged file is an empty state (the store's baseline is then
the fallback for the kernel-log position).
"""

from __future__ import annotations

import json
import os

from slurmhealth.core import files

FORMAT = 1
READ_MAX = 1 << 16  # our file is a few hundred bytes; anything bigger is not ours


def path_for(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, f"{node}.state.json")


def load(path: str) -> dict:
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


def kmsg_position(doc: dict) -> dict | None:
    """{"seq", "boot_id"} of the last kernel-log record read, if the state has a sane one."""
    pos = doc.get("kmsg")
    if isinstance(pos, dict) and isinstance(pos.get("seq"), int) and not isinstance(
        pos.get("seq"), bool
    ):
        return {"seq": pos["seq"], "boot_id": pos.get("boot_id")}
    return None


def pending(doc: dict) -> dict | None:
    """The fault seen and not yet acted on: {"message", "since", "phase"}, or None."""
    item = doc.get("pending")
    if isinstance(item, dict) and isinstance(item.get("message"), str) and item["message"]:
        return item
    return None


def save(path: str, doc: dict) -> None:
    """Replace the state file: a private temp file created exclusively beside it, then renamed
    (files.write_private; its directory made 0700 where missing). Raises OSError (the caller
    logs it: the verdict never depends on this file)."""
    files.private_dir(os.path.dirname(os.path.abspath(path)))
    body = json.dumps(dict(doc, format=FORMAT), separators=(",", ":")).encode()
    files.write_private(path, body, 0o600)


# --- runs the store could not take --------------------------------------------------------------

SPOOL_MAX = 16 << 20  # a store locked for days at a run a minute is ~10 MiB of spooled runs


def spool(path: str, entry: dict) -> None:
    """Append one run the store could not take (locked, full for a moment) to `path`, a private
    file beside the store; the next run that can write the store replays it. Raises OSError."""
    line = (json.dumps(entry, separators=(",", ":"), default=str) + "\n").encode()
    # O_NONBLOCK: a FIFO planted there fails at once instead of blocking the run
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    folder = files.open_dir(os.path.dirname(os.path.abspath(path)))
    try:
        fd = os.open(os.path.basename(path), flags, 0o600, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        st = os.fstat(fd)
        why = files.why_not(st)
        if why:  # someone else's file where the spool should be: never appended to
            raise files.Unsafe(path, why)
        if st.st_size + len(line) > SPOOL_MAX:
            raise OSError(f"{path} holds {SPOOL_MAX >> 20} MiB of unrecorded runs already")
        os.write(fd, line)
    finally:
        os.close(fd)


def take_spool(path: str) -> tuple:
    """(entries, taken paths) of the spooled runs, oldest first: any spool an earlier run took
    and never finished with (its process is gone: ended at its deadline in the middle of a
    replay), then the spool itself, each moved aside first so that a concurrent run spools anew;
    ([], []) when there are none. The caller removes the taken files once the entries are
    recorded (or puts them back by spooling them again). Spooled runs and actions carry their
    ids, so an entry replayed twice is written once."""
    entries: list = []
    taken = []
    for n, source in enumerate([*_abandoned(path), path]):
        mine = f"{path}.{os.getpid()}.{n}.taking"
        try:
            os.rename(source, mine)
        except OSError:
            continue  # none there, or a concurrent run took it first
        got = _read_spool(mine)
        if got is not None:  # an unreadable one stays, for a later run to take
            entries += got
            taken.append(mine)
    return entries, taken


def _read_spool(path: str) -> list | None:
    """The entries of a taken spool; None when it cannot be read or trusted (someone else's
    file is never replayed into the store)."""
    try:
        fd = files.open_trusted(path)
        with os.fdopen(fd, "rb") as handle:
            return [entry for entry in map(_entry, handle) if entry is not None]
    except OSError:
        return None


def _entry(line: bytes) -> dict | None:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if isinstance(entry, dict) and (
        isinstance(entry.get("records"), dict) or isinstance(entry.get("action"), list)
    ):
        return entry
    return None


def _abandoned(path: str) -> list:
    """The spools other runs took (`<spool>.<pid>.<n>.taking`) whose process is gone."""
    directory, base = os.path.split(os.path.abspath(path))
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        if not (name.startswith(base + ".") and name.endswith(".taking")):
            continue
        pid = name[len(base) + 1 :].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            out.append(os.path.join(directory, name))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists (not ours to signal)
    return True
