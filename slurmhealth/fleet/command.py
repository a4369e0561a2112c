"""What a head-node command's orchestration (fleet/collect.py `run`, fleet/diagnose.py
`submit`, report/deliver.py) needs from the CLI and gives back to it, without click: where its
lines go and a progress bar (a Console), and one error that carries the exit status and, for a
bad value, the option at fault. cli.py turns a CommandError into click's own error of the same
words, so a command's orchestration is tested with a Console of lists and no click at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Optional

from slurmhealth.core import timespec

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
