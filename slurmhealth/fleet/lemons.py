"""The lemon sweep (head node, cron): fleet history -> scores -> drains with evidence.

`slurmhealth lemons` lists; `--apply` drains through actions.drain, so the sweep obeys the same
etiquette, circuit breaker and probation as the hooks, and records every drain or refusal in
the fleet store.
"""

from __future__ import annotations

from slurmhealth.core import slurm
from slurmhealth.core.constants import BREAKER, FAILED, HELD, LEMON
from slurmhealth.fleet import policy, signals
from slurmhealth.node import actions


def sweep(conn: object, now: float, window: float, params: dict | None = None) -> list:
    """Every node with history in the window, scored against the fleet, lemons first."""
    counts = signals.signals(conn, now - window, now)  # type: ignore[arg-type]
    return policy.score(counts, params)


def apply(scored: list, client: slurm.Slurm, settings: dict, conn: object, log: object) -> list:
    """Drain each lemon, strongest first; stop at the first the breaker refuses, and at the
    first drain Slurm did not take (a controller that times out on one would make each lemon
    after it wait as long: the next sweep tries again)."""
    applied = []
    for entry in (e for e in scored if e["lemon"]):
        outcome = actions.drain(
            client,
            entry["node"],
            f"{LEMON} {entry['reason']}",
            settings,
            conn,
            "slurmhealth lemons",
            log,
        )
        applied.append({"node": entry["node"], "outcome": outcome})
        if outcome in (BREAKER, HELD, FAILED):  # past the cap, uncounted, not taken: stop
            break
    return applied
