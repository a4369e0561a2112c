"""Safety limits on every automatic drain: the circuit breaker and probation.

Pure functions of counts, times and recorded actions, shared by the node agent (prolog, epilog,
health check), the lemon sweep and the simulator. A fleet-wide fault (a switch, a shared
filesystem, a bad driver push) fails many nodes at once: it is not a lemon, and draining every
node it touches would empty the cluster. The breaker caps slurmhealth's own drains to a share of
the fleet within a window; probation keeps out a node that failed again soon after we let it back.
"""

from __future__ import annotations

import math

from slurmhealth.core.constants import DAY
from slurmhealth.core.result import FAIL

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


def allowed_drains(recent: int, fleet_size: int, max_share: float = 0.10) -> int:
    """How many more nodes slurmhealth may drain now, given `recent` drains of its own in the
    breaker window: the cap is max_share of the fleet, rounded down, but at least 1, so a small
    cluster can still take one broken node out (a fleet-wide fault costs it one node)."""
    if fleet_size < 1:
        raise ValueError("fleet_size must be at least 1")
    if not 0 <= max_share <= 1:
        raise ValueError("max_share must be between 0 and 1")
    cap = max(1, math.floor(max_share * fleet_size + 1e-9))
    return max(0, cap - max(0, recent))


def may_drain_more(recent_drains: int, fleet_size: int, max_share: float = 0.10) -> bool:
    """True: one more drain is allowed (after it, our drains in the window stay within the
    cap of allowed_drains); False: the breaker is open, drain nothing more."""
    return allowed_drains(recent_drains, fleet_size, max_share) > 0


def on_probation(actions: Iterable[tuple[Any, ...]], now: float, days: float = 7) -> bool:
    """True when the node's latest drain (at or before `now`) came within `days` of a resume by
    slurmhealth: the node failed again soon after we let it back, so it stays drained until an
    admin resumes it. actions: (time, action, ...) rows of the node's actions table; only
    "drain" and "resume" count."""
    last_resume: float | None = None
    state: float | None = None
    for when, action, *_ in sorted(
        (a for a in actions if a[1] in ("drain", "resume") and a[0] <= now),
        key=lambda a: a[0],
    ):
        if action == "resume":
            last_resume, state = when, None
        else:
            state = when
    if state is None or last_resume is None:
        return False
    return state - last_resume <= days * DAY


def resume_due(verdicts: list[str], needed: int) -> bool:
    """`needed` (at least 1) health checks since our drain, newest first, and none failed."""
    needed = max(1, needed)
    return len(verdicts) >= needed and FAIL not in verdicts[:needed]
