"""Clock checks from the kernel's clock discipline, adjtimex(2) (the `host` section's `clock`,
sources/host.py).

The kernel knows whether a time daemon (chronyd, ntpd, systemd-timesyncd) keeps the clock
synchronised: the daemon clears STA_UNSYNC and sets `maxerror`, the bound on the clock's error
it vouches for; without updates the kernel adds 500 ppm of it per second (kernel/time/ntp.c)
and, at 16 s (NTP_PHASE_LIMIT), sets STA_UNSYNC itself. adjtimex returns TIME_ERROR (5) while
the clock is unsynchronised. Skewed clocks break what a job spreads over nodes: Kerberos and
munge credentials (munge refuses a credential from more than its TTL, 5 minutes, away),
timestamps of shared files, and traces that are merged across nodes.

Nothing is judged by default: containers and CI runners often have no time daemon of their own
and read unsynchronised, and the host they run on is not theirs to fix. With `synchronised =
true` an unsynchronised clock warns (the daemon stopped: a job still runs); with `max_error_ms`
a maxerror beyond the bound fails (drain): the clock may be that far off, and an unsynchronised
clock reaches any bound within minutes (500 ppm: 100 ms in 200 s).
"""

from __future__ import annotations

from slurmhealth.core.result import DRAIN, Result, clean, fail, ok, skip, warn
from slurmhealth.node.checks.base import Context

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "time"
SOURCE = "host"

DEFAULTS: Schema = {
    "synchronised": (
        None,
        bool,
        "true: an unsynchronised clock (STA_UNSYNC) warns; unset: not judged (containers "
        "have no time daemon of their own)",
    ),
    "max_error_ms": (
        None,
        float,
        "the kernel's maxerror bound, ms: beyond it fails (drain); unset: not judged",
    ),
}

STA_UNSYNC = 0x0040  # include/uapi/linux/timex.h
TIME_ERROR = 5  # adjtimex's return value while the clock is not synchronised


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(raw: object) -> Facts:
    """The host section's clock -> {"synchronised", "maxerror_ms", "esterror_ms", "state",
    "status", "not_read"}: None where unknown; "not_read" says why the clock was not read."""
    raw = raw if isinstance(raw, dict) else {}
    clock = raw.get("clock")
    clock = clock if isinstance(clock, dict) else {}
    state, status = _int(clock.get("state")), _int(clock.get("status"))
    maxerror, esterror = _int(clock.get("maxerror")), _int(clock.get("esterror"))
    why = clock.get("skipped") or clock.get("error")
    known = state is not None and status is not None
    return {
        "synchronised": bool(known and state != TIME_ERROR and not (status or 0) & STA_UNSYNC),
        "maxerror_ms": maxerror / 1000 if maxerror is not None else None,
        "esterror_ms": esterror / 1000 if esterror is not None else None,
        "state": state,
        "status": status,
        "not_read": None if known else clean(why or "no clock reading", 120),
    }


def synchronised(facts: Facts, ctx: Context) -> Result:
    """The kernel says the clock is synchronised (no STA_UNSYNC), where synchronised = true."""
    if facts["not_read"]:
        return _not_read(facts, ctx)
    data = {"state": facts["state"], "status": facts["status"]}
    if facts["synchronised"]:
        return ok("clock synchronised", data)
    if ctx.expect.get("synchronised"):
        return warn("clock not synchronised (no time daemon keeps it)", data)
    return ok("clock not synchronised (not judged: [time] synchronised = true judges it)", data)


def max_error(facts: Facts, ctx: Context) -> Result:
    """The kernel's bound on the clock's error (maxerror) within max_error_ms, where set."""
    bound, have = ctx.expect.get("max_error_ms"), facts["maxerror_ms"]
    if facts["not_read"] or have is None:
        return _not_read(facts, ctx)
    data = {"maxerror_ms": have, "esterror_ms": facts["esterror_ms"], "bound_ms": bound}
    if bound is None:  # maxerror moves every second: said in the data only
        return ok("no maxerror bound set", data)
    if have > bound:
        return fail(f"clock maxerror {have:g} ms beyond {bound:g} ms", data, DRAIN)
    return ok(f"clock maxerror within {bound:g} ms", data)


def _not_read(facts: Facts, ctx: Context) -> Result:
    """A clock this run did not read: a skip where the config judges it; ok where nothing is
    judged (a skip is a row in the node's store on every job hook of a node without NVML)."""
    why = f"clock {facts['not_read'] or 'maxerror unknown'}"
    return skip(why) if expected(ctx.expect) else ok(why)


CHECKS = (synchronised, max_error)


def expectations(facts: Facts) -> dict[str, Any]:
    """A known-good node whose clock is synchronised expects it to stay so."""
    return {"synchronised": True} if facts["synchronised"] else {}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The clock is expected when the config judges it."""
    return bool(expect.get("synchronised")) or expect.get("max_error_ms") is not None
