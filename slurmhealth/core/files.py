"""Files root writes and reads: private from their first byte, never through a planted symlink.

Writing: `open_private` / `write_private` create an exclusive temporary file beside the target
(O_CREAT | O_EXCL | O_NOFOLLOW, a random name, its final mode from the first byte whatever the
umask), write it and rename it over the target; a target that is a symlink, a device or a FIFO
is refused.
`create_private` makes an empty file exclusively (a new store), `private_dir` a directory 0700.

Every writer reaches the target's directory through `open_dir`: one component at a time from
`/`, never through a symlink that someone else made or could replace, and then creates and
renames inside that directory's descriptor, so no name on the way can be swapped meanwhile.

Reading: `open_trusted` opens without following a symlink and checks the opened descriptor
(fstat: a regular file, owned by root, the caller or a named owner, writable by no one else),
so nothing can be swapped between the check and the read; `trusted` says why a file that
decides what root does (a config, an env file) must not be read.

Import-light (stdlib os, stat, errno): the prolog imports it.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Collection
    from types import TracebackType
    from typing import IO, Any

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted where a file should be opens at once (and is refused) instead of
# blocking the reader forever.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TRIES = 16
_HOPS = 40  # symlinks followed on one path at most (Linux's own limit, path_resolution(7))


class Unsafe(OSError):
    """A path refused: a symlink, not a regular file, the wrong owner, writable by others."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EPERM, why, path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _owners(owners: Collection[int] | None = None) -> set[int]:
    """The uids whose files are trusted: root, this process's euid, and `owners` (uids)."""
    return {0, os.geteuid(), *(owners or ())}


def _owner_name(uid: int) -> str:
    try:
        import pwd  # noqa: PLC0415 - only when a file is refused

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def why_not(st: os.stat_result, owners: Collection[int] | None = None) -> str | None:
    """Why a file with this (l)stat must not be trusted, or None: a symlink, not a regular file,
    owned by someone else than root, the euid or `owners`, writable by group or others."""
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid not in _owners(owners):
        return f"owned by {_owner_name(st.st_uid)}, not root"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _why_dirs(directory: str, owners: Collection[int] | None, sticky_ok: bool) -> str | None:
    """Why someone else may replace names in `directory`: it or a directory above it is theirs,
    or writable by group or others. A sticky directory above (/tmp) is fine: others cannot
    rename or remove an entry they do not own; `sticky_ok` says so for `directory` too."""
    path = os.path.realpath(directory)
    while True:
        st = os.stat(path)
        if st.st_uid not in _owners(owners):
            return f"{path} is owned by {_owner_name(st.st_uid)}"
        if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
            return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path, sticky_ok = parent, True


def trusted(path: str, owners: Collection[int] | None = None) -> str | None:
    """Why root must not trust the file at `path` (None: it may, or it does not exist).

    Refused: a symlink, not a regular file, not owned by root or the current euid (or one of
    the uids `owners`), writable by group or others, or in a directory that someone else owns
    or may write (its own or one above it, unless sticky: /tmp is fine). A missing file is None:
    opening it then fails as it would have.
    """
    try:
        why = why_not(os.lstat(path), owners)
        if why:
            return why
        why = _why_dirs(os.path.dirname(os.path.realpath(path)), owners, sticky_ok=True)
        return f"in a directory others can change: {why}" if why else None
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked: {exc.strerror or exc}"


def others_may_write(directory: str, owners: Collection[int] | None = None) -> str | None:
    """Why someone else than root, the euid or `owners` (uids) may create or replace files in
    `directory` (None: no one else can): it is theirs or writable by group or others (sticky or
    not: anyone may add a name), or a directory above it is (unless sticky)."""
    return _why_dirs(directory, owners, sticky_ok=False)


def open_trusted(path: str, owners: Collection[int] | None = None) -> int:
    """A read-only descriptor of `path`, opened without following a symlink, after checking the
    opened file itself (fstat): a regular file, owned by root, the euid or one of `owners`
    (uids), not writable by group or others. Unsafe (an OSError) says why not."""
    try:
        fd = os.open(path, _READ)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unsafe(path, "a symlink") from None
        raise
    try:
        why = why_not(os.fstat(fd), owners)
        if why:
            raise Unsafe(path, why)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir(directory: str, owners: Collection[int] | None = None) -> int:
    """A descriptor of `directory`, reached one component at a time from `/` with O_NOFOLLOW.
    A symlink on the way is followed only when root, the euid or `owners` (uids) made it and
    no one else can replace it: the directory holding it is theirs too, and not writable by
    group or others unless sticky (/tmp). Unsafe says why not; a missing directory raises as
    open() would."""
    parts = os.path.abspath(directory).split("/")[::-1]  # a stack: the next component last
    fd = os.open("/", _DIR)
    hops = 0
    try:
        while parts:
            name = parts.pop()
            if name in ("", "."):
                continue
            try:
                inner = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                target = _followed(fd, name, owners, directory, exc)
                hops += 1
                if hops > _HOPS:
                    raise OSError(errno.ELOOP, "too many symlinks", directory) from None
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR)
                parts.extend(target.split("/")[::-1])
                continue
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _followed(fd: int, name: str, owners: Collection[int] | None, path: str, exc: OSError) -> str:
    """The target of symlink `name` in directory `fd`, when it may be followed (open_dir)."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        raise exc  # a file where a directory should be
    if st.st_uid not in _owners(owners):
        raise Unsafe(path, f"{name} is a symlink made by {_owner_name(st.st_uid)}")
    holder = os.fstat(fd)
    open_to_others = holder.st_mode & 0o022 and not holder.st_mode & stat.S_ISVTX
    if holder.st_uid not in _owners(owners) or open_to_others:
        raise Unsafe(path, f"{name} is a symlink in a directory others can change")
    return os.readlink(name, dir_fd=fd)


def _split(path: str) -> tuple[int, str]:
    """(descriptor of the directory of `path`, opened by open_dir; the name in it)."""
    directory, base = os.path.split(os.path.abspath(path))
    return open_dir(directory), base


def _lstat(base: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _refuse_non_regular(path: str, base: str, dir_fd: int) -> None:
    """Unsafe when the target is there and is not a regular file: a symlink, or a device or
    FIFO (`-o /dev/null` as root would otherwise replace the system's /dev/null)."""
    st = _lstat(base, dir_fd)
    if st is None or stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        raise Unsafe(path, "a symlink: not replaced")
    raise Unsafe(path, "not a regular file: not replaced")


def _suffix() -> str:
    return os.urandom(6).hex()


def _create_temp(path: str, base: str, dir_fd: int, mode: int) -> tuple[int, str]:
    """(fd, name) of a new file beside `path` in `dir_fd`: `.NAME.RANDOM.tmp`, exclusive,
    mode `mode`."""
    for _ in range(_TRIES):
        tmp = f".{base}.{_suffix()}.tmp"
        try:
            # never wider than `mode`: the umask narrows it
            fd = os.open(tmp, _CREATE, mode & 0o777, dir_fd=dir_fd)
        except FileExistsError:  # a name someone took (planted): draw another
            continue
        try:
            os.fchmod(fd, mode & 0o777)  # exactly `mode` whatever the umask, before any byte
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dir_fd)
            raise
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", path)


def _kept_mode(base: str, dir_fd: int, mode: int, owners: Collection[int] | None) -> int:
    """An existing target's permission bits (no group or other write) when it is a regular file
    of ours, else `mode`: rewriting a report an admin made world-readable keeps it so."""
    try:
        st = _lstat(base, dir_fd)
    except OSError:
        return mode
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_uid in _owners(owners):
        return stat.S_IMODE(st.st_mode) & 0o755
    return mode


class open_private:  # noqa: N801 - used like open(): `with open_private(path) as out:`
    """Write `path` atomically and privately: a file object on an exclusive temporary file
    beside it (mode `mode` from the first byte), renamed over `path` when the block ends
    without an exception, removed when it raises. A `path` that is a symlink (or a device, a
    FIFO) is refused (Unsafe), never followed or replaced. `binary` for bytes; `sync` fsyncs
    before the rename; `keep_mode` keeps an existing regular file's mode (less group/other
    write) instead."""

    def __init__(
        self,
        path: str,
        mode: int = 0o600,
        binary: bool = False,
        sync: bool = False,
        keep_mode: bool = False,
        encoding: str = "utf-8",
    ) -> None:
        self.path, self.mode, self.binary, self.sync = path, mode, binary, sync
        self.keep_mode, self.encoding = keep_mode, encoding
        self.file: IO[Any] | None = None  # text or bytes (`binary`)
        self.tmp = ""
        self.dir_fd = -1

    def __enter__(self) -> IO[Any]:
        self.dir_fd, self.base = _split(self.path)
        try:
            _refuse_non_regular(self.path, self.base, self.dir_fd)
            mode = self.mode
            if self.keep_mode:
                mode = _kept_mode(self.base, self.dir_fd, self.mode, None)
            fd, self.tmp = _create_temp(self.path, self.base, self.dir_fd, mode)
        except BaseException:
            os.close(self.dir_fd)
            raise
        try:
            handle: IO[Any]
            if self.binary:
                handle = os.fdopen(fd, "wb")
            else:
                handle = os.fdopen(fd, "w", encoding=self.encoding)
        except BaseException:
            os.close(fd)
            self._discard()
            raise
        self.file = handle
        return handle

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        handle = self.file
        if kind is not None or handle is None:  # None: __enter__ never returned a file
            self._abandon()
            return
        try:
            handle.flush()
            if self.sync:
                os.fsync(handle.fileno())
            handle.close()
            # planted while we wrote: still not replaced
            _refuse_non_regular(self.path, self.base, self.dir_fd)
            os.replace(self.tmp, self.base, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            self._abandon()
            raise
        os.close(self.dir_fd)

    def _abandon(self) -> None:
        try:
            if self.file is not None:
                self.file.close()
        except OSError:  # the flush of what was left (a full disk): the file goes anyway
            pass
        self._discard()

    def _discard(self) -> None:
        try:
            os.unlink(self.tmp, dir_fd=self.dir_fd)
        except OSError:
            pass
        os.close(self.dir_fd)


def write_private(
    path: str, data: str | bytes, mode: int = 0o600, sync: bool = False, keep_mode: bool = False
) -> None:
    """Write `data` (bytes or str, UTF-8) to `path` with open_private: exclusive temporary file
    beside it, `mode` from the first byte, renamed over `path`; a symlink at `path` is refused."""
    binary = isinstance(data, (bytes, bytearray))
    with open_private(path, mode, binary=binary, sync=sync, keep_mode=keep_mode) as handle:
        handle.write(data)


_LOCK = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def flock(fd: int, wait: float) -> bool:
    """An exclusive flock on `fd` within `wait` seconds (0: at once); whether it was had."""
    import fcntl  # noqa: PLC0415 - a C module, only where something is locked
    import time  # noqa: PLC0415

    give_up = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.002)


def lock(path: str, wait: float, mode: int = 0o600, theirs: bool = False) -> int | None:
    """A descriptor of the lock file `path` holding an exclusive flock, or None when the lock is
    not had within `wait` seconds (0: at once). The file is created with `mode` (the umask
    narrows it) in its folder reached by open_dir, never through a symlink; one someone else
    made is refused (Unsafe; None with `theirs`: their lock is theirs to hold, never waited
    on), as are the failures to open it (OSError)."""
    dir_fd, base = _split(path)
    try:
        fd = os.open(base, _LOCK, mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        why = why_not(os.fstat(fd))
        if why and not theirs:
            raise Unsafe(path, why)
        if not why and flock(fd, wait):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def create_private(path: str, mode: int = 0o600) -> bool:
    """Create `path` empty, exclusively, with `mode` from the first byte (a new store, before
    SQLite opens it), in its directory reached by open_dir. True when made here; False when a
    file of ours is there already. What someone else made there (a symlink, a file), or a file
    others may write, is refused (Unsafe)."""
    dir_fd, base = _split(path)
    try:
        try:
            fd = os.open(base, _CREATE, mode & 0o777, dir_fd=dir_fd)
        except FileExistsError:
            st = os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in _owners():
                    raise Unsafe(path, f"a symlink made by {_owner_name(st.st_uid)}") from None
                st = os.stat(base, dir_fd=dir_fd)  # ours: what it points to must be ours too
            why = why_not(st)
            if why:
                raise Unsafe(path, why) from None
            return False
        try:
            os.fchmod(fd, mode & 0o777)
        finally:
            os.close(fd)
        return True
    finally:
        os.close(dir_fd)


def refuse_foreign(path: str) -> None:
    """Unsafe when something is at `path` that someone else made or may write (a symlink, a
    FIFO, another user's file): a store's -wal or -shm, which SQLite opens by name."""
    try:
        why = why_not(os.lstat(path))
    except FileNotFoundError:
        return
    if why:
        raise Unsafe(path, why)


def private_dir(path: str, mode: int = 0o700) -> None:
    """Make directory `path` and its missing parents with exactly `mode` (not widened by the
    umask at any point); an existing directory is left as it is (an admin's choice)."""
    path = os.path.abspath(path)
    try:
        os.mkdir(path, mode & 0o777)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if parent == path:
            raise
        private_dir(parent, mode)
        try:
            os.mkdir(path, mode & 0o777)
        except FileExistsError:  # another process made it meanwhile
            return
    except OSError:  # there already (EEXIST; EROFS on a read-only mount), or a real error
        if not os.path.isdir(path):
            raise
        return
    # Exactly `mode` (the umask may have narrowed it), on the directory made above, not on
    # whatever a name in a shared parent may have become since.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)
