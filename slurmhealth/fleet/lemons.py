"""The lemon sweep (head node, cron): fleet history -> scores -> drains with evidence.

`slurmhealth lemons` lists; `--apply` drains through actions.drain, so the sweep obeys the same
etiquette, circuit breaker and probation as the hooks, and records every drain or refusal in
the fleet store. A lemon already out is recorded as skipped once, not by every hourly sweep
(actions.note(once=True)): the nightly report lists what happened, not the sweep's heartbeat.

A lemon the sweep drained is judged: while every fault it is scored on started before that
drain, the sweep never drains it again. An admin who returned it (or a passing diagnosis that
did) has decided on exactly that evidence; an hourly sweep that took it out again an hour
later, for as long as the faults stay in the window, would overrule them. A fault that starts
after the drain makes it a lemon to drain again.
"""

from __future__ import annotations

import sqlite3

from slurmhealth.core import slurm, timespec
from slurmhealth.core.constants import ACT_DRAIN_SKIPPED, BREAKER, FAILED, HELD, LEMON, SKIPPED
from slurmhealth.fleet import policy, queries, signals
from slurmhealth.node import actions

ACTOR = "slurmhealth lemons"


def sweep(conn: sqlite3.Connection, now: float, window: float, params: dict | None = None) -> list:
    """Every node with history in the window, scored against the fleet, lemons first; a lemon
    the sweep drained after its latest fault carries `judged`: the time of that drain."""
    counts = signals.signals(conn, now - window, now)
    scored = policy.score(counts, params)
    drained = queries.drains_by(conn, ACTOR, now)
    for entry in scored:
        at, last = drained.get(entry["node"]), entry["evidence"]["faults"]["last"]
        if entry["lemon"] and at is not None and (last is None or last < at):
            entry["judged"] = at
    return scored


def apply(scored: list, client: slurm.Slurm, settings: dict, conn: object, log: object) -> list:
    """Drain each lemon, strongest first; stop at the first the breaker refuses, and at the
    first drain Slurm did not take (a controller that times out on one would make each lemon
    after it wait as long: the next sweep tries again)."""
    applied = []
    for entry in (e for e in scored if e["lemon"]):
        why = f"{LEMON} {entry['reason']}"
        if "judged" in entry:  # no fault since our drain: left as it is, never asked of Slurm
            at = timespec.iso(entry["judged"])
            detail = f"judged: drained as a lemon at {at}, no fault since"
            reason = slurm.reason(why)
            actions.note(
                conn, entry["node"], ACT_DRAIN_SKIPPED, reason, ACTOR, True, detail, log, once=True
            )
            applied.append({"node": entry["node"], "outcome": SKIPPED, "judged": entry["judged"]})
            continue
        outcome = actions.drain(
            client, entry["node"], why, settings, conn, ACTOR, log, repeat_skip=False
        )
        applied.append({"node": entry["node"], "outcome": outcome})
        if outcome in (BREAKER, HELD, FAILED):  # past the cap, uncounted, not taken: stop
            break
    return applied
