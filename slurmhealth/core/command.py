"""What a command's orchestration (fleet/ on the head node, node/ for the node's own commands,
report/deliver.py) needs from the CLI and gives back to it, without click: where its lines go
and a progress bar (a Console), one error that carries the exit status and, for a bad value,
the option at fault, and the opening of a store a command reads. cli.py turns a CommandError
into click's own error of the same words, so a command's orchestration is tested with a Console
of lists and no click at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Optional

from slurmhealth.core import timespec

TYPE_CHECKING = False  # sqlite3 only where a store is opened; mypy reads the block below
if TYPE_CHECKING:
    import sqlite3

Tick = Optional[Callable[[int], None]]


@contextlib.contextmanager
def no_progress(_length: int, _label: str) -> Iterator[Tick]:
    """No progress bar (not on a terminal, or in a test)."""
    yield None


@dataclasses.dataclass(frozen=True)
class Console:
    """out: a line for standard output; err: one for standard error; write: text for standard
    output as it is (no newline added); progress(length, label): a context giving a tick
    function (None when nothing is shown)."""

    out: Callable[[str], None]
    err: Callable[[str], None]
    write: Callable[[str], None]
    progress: Callable[[int, str], contextlib.AbstractContextManager[Tick]] = no_progress


class CommandError(Exception):
    """A command that cannot go on, in one line: exit `status` (1 unless told), or a bad
    value of `option` (a usage error, exit 2, `Invalid value for OPTION: ...`), or a usage
    error with no option (`usage`, exit 2)."""

    def __init__(
        self, message: str, status: int = 1, option: str | None = None, usage: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.option, self.usage = status, option, usage


def instant(text: str | None, option: str = "--now") -> float:
    """--now: a time, or the clock's when None (timespec.parse_instant)."""
    try:
        return timespec.parse_instant(text)
    except ValueError as exc:
        raise CommandError(str(exc), option=option) from None


def start(text: str, end: float, option: str = "--since") -> float:
    """--since, --older-than: a duration back from `end` (7d) or a time (timespec.parse_start)."""
    try:
        return timespec.parse_start(text, end)
    except ValueError as exc:
        raise CommandError(str(exc), option=option) from None


def emit(text: str, output: str, console: Console, mode: int = 0o600) -> None:
    """A command's document to standard output ("-") or to the file `output`, with `mode` and
    never through a planted symlink (files.write_private); CommandError with one line when the
    file cannot be written."""
    if output == "-":
        console.write(text)
        return
    from slurmhealth.core import files  # noqa: PLC0415

    try:
        files.write_private(output, text, mode)
    except OSError as exc:
        raise CommandError(f"{output}: {exc.strerror or exc}") from None


def open_store(path: str, command: str) -> sqlite3.Connection:
    """A store `command` reads: one line, exit 1, when it is missing or this user may not read
    it (a node store is root's, in a root-only directory)."""
    from slurmhealth.core import store  # noqa: PLC0415 - sqlite3 only where a store is opened

    try:
        os.stat(path)
    except PermissionError:
        raise CommandError(denied(path, command)) from None
    except OSError:
        raise CommandError(f"no store at {path}") from None
    if not os.access(path, os.R_OK):
        raise CommandError(denied(path, command))
    try:
        return store.connect(path, existing=True)
    except store.StoreError as exc:
        why = store.kept_out(path)  # readable, but SQLite writes beside what it reads
        if why is None:
            raise CommandError(str(exc)) from None
        raise CommandError(f"cannot open {path}: {why}: {_need(command)}") from None


def denied(path: str, command: str) -> str:
    """`cannot read DIR (permission denied): history needs root, or --db a copy you own`:
    the first directory on the way to `path` this user may not enter, else the file."""
    blocked, parts = path, os.path.abspath(path).split(os.sep)
    for n in range(2, len(parts)):
        folder = os.sep.join(parts[:n])
        if not os.access(folder, os.X_OK):
            blocked = folder
            break
    return f"cannot read {blocked} (permission denied): {_need(command)}"


def _need(command: str) -> str:
    """What a user who may not open a store can do: a copy of their own opens (SQLite writes
    its -shm beside the file it reads)."""
    return f"{command} needs root, or --db a copy you own"
