"""Durations (`90d`, `24h`, `1d12h`) and instants (`2026-11-29T12:00:00Z`, `2024-01-01`, `now-7d`,
epoch seconds) from the CLI; `--since` and `--older-than` take either (parse_start)."""

from __future__ import annotations

import calendar
import math
import re
import time

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Beyond these a time no longer prints (time_t, strftime): the longest duration and the
# latest instant the CLI takes.
DURATION_MAX = 1000 * 365 * 86400
INSTANT_MAX = 253402300800.0  # 10000-01-01T00:00:00Z


# `1d12h`, `2h30m`: two or more terms, each a whole number and a unit.
_COMPOUND = re.compile(r"(?:[0-9]+[smhdw]){2,}")
_TERM = re.compile(r"([0-9]+)([smhdw])")
_RELATIVE = re.compile(r"now\s*(?:-\s*(\S.*))?")


def parse_duration(text: str) -> float:
    """`90d`, `1.5h` or `1d12h` -> seconds; units s, m, h, d, w. The one grammar of times the
    command line, the environment and the config (node/config.py DURATIONS) take. A bare
    number is refused with the units named: admins read `prune --older-than 90` as days,
    seconds would delete every record (a config's bare number is in the unit its key names)."""
    value = text.strip().lower()
    if _COMPOUND.fullmatch(value):
        whole = sum(int(n) * _UNITS[u] for n, u in _TERM.findall(value))
        if whole > DURATION_MAX:
            raise ValueError(f"not a duration: {text!r} (more than 1000 years)")
        return float(whole)
    unit = _UNITS.get(value[-1:], 0)
    try:
        number = float(value[:-1] if unit else value)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90d, 24h, 1d12h)") from None
    if not math.isfinite(number):
        raise ValueError(f"not a duration: {text!r} (use e.g. 90d, 24h, 1d12h)")
    if not unit:
        raise ValueError(
            f"not a duration: {text!r} has no unit (write {value}s, {value}m, {value}h, "
            f"{value}d or {value}w)"
        )
    seconds = number * unit
    if seconds < 0:
        raise ValueError(f"not a duration: {text!r} (negative)")
    if seconds > DURATION_MAX:
        raise ValueError(f"not a duration: {text!r} (more than 1000 years)")
    return seconds


def parse_instant(text: str | None, now: float | None = None) -> float:
    """`2026-11-29T12:00:00Z`, `2026-11-29` (UTC), epoch seconds, `now` or `now-7d` (a
    duration before `now`, default the clock); None is now."""
    current = time.time() if now is None else now
    if text is None:
        return current
    value = text.strip()
    relative = _RELATIVE.fullmatch(value.lower())
    if relative:
        back = parse_duration(relative.group(1)) if relative.group(1) else 0.0
        if back > current:
            raise ValueError(f"not a time: {text!r} (before 1970)")
        return current - back
    try:
        epoch = float(value)
    except ValueError:
        pass
    else:
        if not 0 <= epoch < INSTANT_MAX:  # NaN too
            raise ValueError(f"not a time: {text!r} (out of range)")
        return epoch
    for form in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return float(calendar.timegm(time.strptime(value, form)))
        except ValueError:
            continue
    raise ValueError(
        f"not a time: {text!r} (use 2026-11-29T12:00:00Z, 2026-11-29, now-7d or epoch seconds)"
    )


def _is_instant(text: str) -> bool:
    """A date (`2024-01-01...`) or `now...`: what parse_start reads as a time, not a length."""
    value = text.strip().lower()
    return value.startswith("now") or re.match(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value) is not None


def parse_start(text: str, now: float) -> float:
    """The start of a span that ends at `now`: a duration back from it (`7d`, `1d12h`), or an
    instant (`2024-01-01`, `now-7d`), which must not be after `now`. Epoch seconds are not read
    here: a bare number is refused as a duration without a unit (see parse_duration)."""
    if not _is_instant(text):
        return now - parse_duration(text)
    start = parse_instant(text, now)
    if start > now:
        raise ValueError(f"{text!r} is after the end of the span ({iso(now)})")
    return start


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
