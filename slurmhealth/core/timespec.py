"""Durations (`90d`, `24h`) and instants (`2026-11-29T12:00:00Z`, epoch seconds) from the CLI."""

from __future__ import annotations

import calendar
import time

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """`90d` -> seconds; units s, m, h, d, w; a bare number is seconds."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:], 0)
    number = value[:-1] if unit else value
    try:
        seconds = float(number) * (unit or 1)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90d, 24h, 30m)") from None
    if seconds < 0:
        raise ValueError(f"not a duration: {text!r} (negative)")
    return seconds


def parse_instant(text: str | None) -> float:
    """`2026-11-29T12:00:00Z`, `2026-11-29` (UTC) or epoch seconds; None is now."""
    if text is None:
        return time.time()
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    for form in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return float(calendar.timegm(time.strptime(value, form)))
        except ValueError:
            continue
    raise ValueError(f"not a time: {text!r} (use 2026-11-29T12:00:00Z or epoch seconds)")


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
