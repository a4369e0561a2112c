"""Durations (`90d`, `24h`) and instants (`2026-11-29T12:00:00Z`, epoch seconds) from the CLI."""

from __future__ import annotations

import calendar
import math
import time

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Beyond these a time no longer prints (time_t, strftime): the longest duration and the
# latest instant the CLI takes.
DURATION_MAX = 1000 * 365 * 86400
INSTANT_MAX = 253402300800.0  # 10000-01-01T00:00:00Z


def parse_duration(text: str) -> float:
    """`90d` -> seconds; units s, m, h, d, w. A bare number is refused with the units named:
    admins read `prune --older-than 90` as days, seconds would delete every record."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:], 0)
    try:
        number = float(value[:-1] if unit else value)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90d, 24h, 30m)") from None
    if not math.isfinite(number):
        raise ValueError(f"not a duration: {text!r} (use e.g. 90d, 24h, 30m)")
    if not unit:
        raise ValueError(
            f"not a duration: {text!r} has no unit (s, m, h, d or w: e.g. {value}d for days)"
        )
    seconds = number * unit
    if seconds < 0:
        raise ValueError(f"not a duration: {text!r} (negative)")
    if seconds > DURATION_MAX:
        raise ValueError(f"not a duration: {text!r} (more than 1000 years)")
    return seconds


def parse_instant(text: str | None) -> float:
    """`2026-11-29T12:00:00Z`, `2026-11-29` (UTC) or epoch seconds; None is now."""
    if text is None:
        return time.time()
    value = text.strip()
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
    raise ValueError(f"not a time: {text!r} (use 2026-11-29T12:00:00Z or epoch seconds)")


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
