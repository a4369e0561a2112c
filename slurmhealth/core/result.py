"""Result, statuses and actions: the one contract every check returns.

Import-light on purpose (no typing, no dataclasses, no enum): this module sits on the
prolog/epilog hot path, where every millisecond of import time counts.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

OK = "ok"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"
ERROR = "error"
STATUSES = (OK, WARN, FAIL, SKIP, ERROR)

NONE = "none"
DRAIN = "drain"
RESET_GPU = "reset_gpu"
REBOOT = "reboot"
SERVICE = "service"
ACTIONS = (NONE, DRAIN, RESET_GPU, REBOOT, SERVICE)

# Worse actions win when several results ask for different ones.
_ACTION_RANK = {NONE: 0, DRAIN: 1, RESET_GPU: 2, SERVICE: 3, REBOOT: 4}

MESSAGE_MAX = 200


def printable(text: str) -> str:
    """`text` with every character printable: CR, LF and tab become a space, any other control,
    format or bidi-override character a `?`; spaces are kept as they are (a page's cells, which
    templates space). Most text is printable already: one C call."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else " " if ch in "\r\n\t" else "?" for ch in text)


def clean(text: object, limit: int = MESSAGE_MAX, words: bool = False) -> str:
    """One line, printable, bounded: safe for a table, a log line or a Slurm Reason.

    Kernel-log process names and job names are untrusted; every message goes through here.
    words: a cut line ends at a whole word where one ends in its last third (an error a
    command printed, read by an admin).
    """
    line = " ".join(printable(str(text)).split())
    if len(line) > limit:
        cut = line[: limit - 3]
        space = cut.rfind(" ")
        if words and space > (limit - 3) * 2 // 3:
            cut = cut[:space]
        line = cut.rstrip() + "..."
    return line


def counted(n: float, noun: str, nouns: str = "", spec: str = "") -> str:
    """A count and its noun, singular only for exactly one: `1 GPU`, `8 GPUs`, `1.5 days`.
    `nouns`: the plural where an added `s` is wrong (`summaries`, or a verb that agrees:
    `GPU answers` / `GPUs answer`). `spec` formats the number (`,`: `1,024 records`); a float
    prints as `:g` does (`7.0` is `7`)."""
    word = noun if n == 1 else nouns or f"{noun}s"
    return f"{format(n, spec or ('g' if isinstance(n, float) else ''))} {word}"


class Result:
    """The verdict of one check: status, one-line message, structured data, action hint."""

    __slots__ = ("action", "check", "data", "duration", "message", "status")

    def __init__(
        self,
        status: str,
        message: str,
        data: Mapping[str, object] | None = None,
        action: str = NONE,
        check: str = "",
    ) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        self.status = status
        self.message = clean(message)
        self.data: Mapping[str, object] = data if data is not None else {}
        self.action = action
        self.check = check
        self.duration = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "check": self.check,
            "status": self.status,
            "message": self.message,
            "action": self.action,
            "data": self.data,
        }

    def __repr__(self) -> str:
        return f"Result({self.check!r}, {self.status!r}, {self.message!r}, action={self.action!r})"


def ok(message: str, data: Mapping[str, object] | None = None) -> Result:
    return Result(OK, message, data)


def warn(message: str, data: Mapping[str, object] | None = None, action: str = NONE) -> Result:
    return Result(WARN, message, data, action)


def fail(message: str, data: Mapping[str, object] | None = None, action: str = DRAIN) -> Result:
    return Result(FAIL, message, data, action)


def skip(message: str, data: Mapping[str, object] | None = None) -> Result:
    return Result(SKIP, message, data)


def worst_action(actions: Iterable[str]) -> str:
    return max(actions, key=_ACTION_RANK.__getitem__, default=NONE)


def verdict(results: Iterable[Result], error_fails: bool = False) -> str:
    """ok, warn or fail for a whole run. skip counts as ok; error as warn unless configured.

    Our own bug is not the node's fault: by default an `error` never makes the verdict fail.
    """
    statuses = {r.status for r in results}
    if FAIL in statuses or (error_fails and ERROR in statuses):
        return FAIL
    if WARN in statuses or ERROR in statuses:
        return WARN
    return OK
