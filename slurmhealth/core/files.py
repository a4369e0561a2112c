"""Files root writes and reads: private from their first byte, never through a planted symlink.

Writing: `open_private` / `write_private` create an exclusive temporary file beside the target
(O_CREAT | O_EXCL | O_NOFOLLOW, a random name, its final mode from the first byte whatever the
umask), write it and rename it over the target; a target that is a symlink is refused.
`create_private` makes an empty file exclusively (a new store), `private_dir` a directory 0700.

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

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted where a file should be opens at once (and is refused) instead of
# blocking the reader forever.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TRIES = 16


class Unsafe(OSError):
    """A path refused: a symlink, not a regular file, the wrong owner, writable by others."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EPERM, why, path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _owners(owners: object = None) -> set:
    """The uids whose files are trusted: root, this process's euid, and `owners` (uids)."""
    return {0, os.geteuid(), *(owners or ())}  # type: ignore[misc]


def _owner_name(uid: int) -> str:
    try:
        import pwd  # noqa: PLC0415 - only when a file is refused

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def why_not(st: os.stat_result, owners: object = None) -> str | None:
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


def _why_dirs(directory: str, owners: object, sticky_ok: bool) -> str | None:
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


def trusted(path: str, owners: object = None) -> str | None:
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


def others_may_write(directory: str, owners: object = None) -> str | None:
    """Why someone else than root, the euid or `owners` (uids) may create or replace files in
    `directory` (None: no one else can): it is theirs or writable by group or others (sticky or
    not: anyone may add a name), or a directory above it is (unless sticky)."""
    return _why_dirs(directory, owners, sticky_ok=False)


def open_trusted(path: str, owners: object = None) -> int:
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


def _refuse_symlink(path: str) -> None:
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise Unsafe(path, "a symlink: not replaced")
    except FileNotFoundError:
        pass


def _suffix() -> str:
    return os.urandom(6).hex()


def _create_temp(path: str, mode: int) -> tuple:
    """(fd, name) of a new file beside `path`: `.NAME.RANDOM.tmp`, exclusive, mode `mode`."""
    directory, base = os.path.split(os.path.abspath(path))
    for _ in range(_TRIES):
        tmp = os.path.join(directory, f".{base}.{_suffix()}.tmp")
        try:
            fd = os.open(tmp, _CREATE, mode & 0o777)  # never wider than `mode`: the umask narrows
        except FileExistsError:  # a name someone took (planted): draw another
            continue
        try:
            os.fchmod(fd, mode & 0o777)  # exactly `mode` whatever the umask, before any byte
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", path)


def _kept_mode(path: str, mode: int, owners: object) -> int:
    """An existing target's permission bits (no group or other write) when it is a regular file
    of ours, else `mode`: rewriting a report an admin made world-readable keeps it so."""
    try:
        st = os.lstat(path)
    except OSError:
        return mode
    if stat.S_ISREG(st.st_mode) and st.st_uid in _owners(owners):
        return stat.S_IMODE(st.st_mode) & 0o755
    return mode


class open_private:  # noqa: N801 - used like open(): `with open_private(path) as out:`
    """Write `path` atomically and privately: a file object on an exclusive temporary file
    beside it (mode `mode` from the first byte), renamed over `path` when the block ends
    without an exception, removed when it raises. A `path` that is a symlink is refused
    (Unsafe), never followed or replaced. `binary` for bytes; `sync` fsyncs before the rename;
    `keep_mode` keeps an existing regular file's mode (less group/other write) instead."""

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
        self.file = None
        self.tmp = ""

    def __enter__(self) -> object:
        _refuse_symlink(self.path)
        mode = _kept_mode(self.path, self.mode, None) if self.keep_mode else self.mode
        fd, self.tmp = _create_temp(self.path, mode)
        try:
            if self.binary:
                self.file = os.fdopen(fd, "wb")
            else:
                self.file = os.fdopen(fd, "w", encoding=self.encoding)
        except BaseException:
            os.close(fd)
            self._discard()
            raise
        return self.file

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        handle = self.file
        if kind is not None:
            self._abandon()
            return False
        try:
            handle.flush()  # type: ignore[union-attr]
            if self.sync:
                os.fsync(handle.fileno())  # type: ignore[union-attr]
            handle.close()  # type: ignore[union-attr]
            _refuse_symlink(self.path)  # planted while we wrote: still not replaced
            os.replace(self.tmp, self.path)
        except BaseException:
            self._abandon()
            raise
        return False

    def _abandon(self) -> None:
        try:
            self.file.close()  # type: ignore[union-attr]
        except OSError:  # the flush of what was left (a full disk): the file goes anyway
            pass
        self._discard()

    def _discard(self) -> None:
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


def write_private(
    path: str, data: object, mode: int = 0o600, sync: bool = False, keep_mode: bool = False
) -> None:
    """Write `data` (bytes or str, UTF-8) to `path` with open_private: exclusive temporary file
    beside it, `mode` from the first byte, renamed over `path`; a symlink at `path` is refused."""
    binary = isinstance(data, (bytes, bytearray))
    with open_private(path, mode, binary=binary, sync=sync, keep_mode=keep_mode) as handle:
        handle.write(data)  # type: ignore[attr-defined]


def create_private(path: str, mode: int = 0o600) -> bool:
    """Create `path` empty, exclusively, with `mode` from the first byte (a new store, before
    SQLite opens it). True when made here; False when something is there already. A symlink
    there that someone else (not root, not us) made is refused (Unsafe)."""
    try:
        fd = os.open(path, _CREATE, mode & 0o777)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in _owners():
            raise Unsafe(path, f"a symlink made by {_owner_name(st.st_uid)}") from None
        return False
    try:
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)
    return True


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
