"""Draining and resuming nodes, the one way every automatic path does it (prolog, epilog,
health check, lemon sweep): owned reasons, the circuit breaker, probation, and a record of it.

Failure path only: nothing here runs when a node is healthy.
"""

from __future__ import annotations

import time

from slurmhealth.core import safety, slurm, store
from slurmhealth.core.constants import (
    ACT_BREAKER,
    ACT_DRAIN,
    ACT_DRAIN_SKIPPED,
    ACT_RESUME,
    AWAITING,
    BREAKER,
    DRAINED,
    FAILED,
    HEALTHCHECK,
    HELD,
    LEMON,
    PREFIX,
    PROBATION,
    REBOOT,
    REBOOTING,
    RESET,
    SERVICE,
    SKIPPED,
)
from slurmhealth.core.result import counted
from slurmhealth.core.safety import resume_due

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, Callable

    from slurmhealth.core.slurm import NodeInfo
    from slurmhealth.node.journal import Journal, Say
    from slurmhealth.node.ladder import Ladder

# Health checks start on every node at once: hooks that counted the fleet's drains before the
# others drained all think they are first. After draining, wait for the burst to land,
# recount, and yield (undo our drain) unless we are among the first up to the cap.
SETTLE_S = 0.3


def _reason(
    message: str, journal: Journal, node: str, settings: dict[str, Any], now: float
) -> str:
    """Our reason; on probation it says an admin must resume (we never will). A drain for
    service says so already, and says more; one for a remediation (node/ladder.py) is held by
    the ladder's own limit (settings.remediate_max), which counts the relapses that probation
    would: neither is wrapped."""
    days = settings["probation_days"]
    if message.startswith((SERVICE, RESET, REBOOT)):
        return slurm.reason(message)
    if safety.on_probation([*journal.drains(node), (now, ACT_DRAIN)], now, days):
        return slurm.reason(
            f"{PROBATION} an admin must resume (failed within {days:g} d of our resume): {message}"
        )
    return slurm.reason(message)


def _skipped(journal: Journal, node: str, message: str, out: NodeInfo, once: bool) -> None:
    """Record that the node was already out (`out`: its Slurm record), so not drained."""
    detail = f"already out: {out['reason'] or out['state']}"
    journal.note(node, ACT_DRAIN_SKIPPED, slurm.reason(message), True, detail, once)


def drain(
    client: slurm.Slurm,
    node: str,
    message: str,
    settings: dict[str, Any],
    journal: Journal,
    record_skip: bool = True,
    ignore: tuple[str, ...] = (),
    repeat_skip: bool = True,
    rejoining: bool = False,
) -> str:
    """Drain `node` unless someone else took it out, or the breaker is open. Returns the outcome.
    A node already out is recorded as a skip (`record_skip`), each time unless `repeat_skip` is
    false (note(once=True)).

    `rejoining` (the node's own hooks): a node out only until its slurmd registers
    (slurm.rejoins: a reboot, slurmd not answering) is not out by anyone's choice, and the
    health check at slurmd's start is the last run before Slurm returns it to service: it is
    drained like a node in service (the DRAIN holds through the registration), or, where the
    registration would lift a drain (a reboot with a next state), REBOOTING: the fault stays
    pending for the first run after it.

    The breaker: slurmhealth never has more than settings.breaker_share of the fleet drained by
    itself within settings.breaker_window (any automatic path). Past it, it drains nothing more,
    says so loudly and records it: a fleet-wide fault is not a reason to empty the cluster.
    """
    now = time.time()
    try:
        info = client.node(node)
        rejoins = rejoining and slurm.rejoins(info)
        if rejoins and slurm.lifts_drain(info):
            return _held_for_reboot(journal, node, message, info)
        if not rejoins and not slurm.may_drain(info, ignore):
            if record_skip:
                _skipped(journal, node, message, info, not repeat_skip)
            return SKIPPED
        fleet = client.nodes()
        if not fleet:  # an answer that lists no node counts nothing either
            raise slurm.SlurmError("sinfo listed no nodes")
        listed = next((n for n in fleet if n["name"] == node), None)
        if listed is not None and not rejoins and not slurm.may_drain(listed, ignore):
            # out since `show node` (another hook of this node drained it a moment ago): out,
            # not a drain of another node that could trip the breaker
            if record_skip:
                _skipped(journal, node, message, listed, not repeat_skip)
            return SKIPPED
    except slurm.UnknownNode as exc:
        # slurmctld answered, and has no such node (removed from slurm.conf, renamed): nothing
        # takes jobs there and the controller is up, so a sweep's other drains go on
        detail = f"Slurm has no such node ({exc})"
        journal.say(f"{node} not drained: {detail}")
        if record_skip:
            once = not repeat_skip
            journal.note(node, ACT_DRAIN_SKIPPED, slurm.reason(message), True, detail, once)
        return SKIPPED
    except slurm.SlurmError as exc:
        # Without a fresh count of the fleet the breaker cannot hold, and a fleet-wide fault
        # (a slow or restarting controller among its signs) is exactly when every node would
        # drain itself: drain nothing now. The agent keeps the fault pending and acts on it at
        # the next run that can count.
        why = _reason(message, journal, node, settings, now)
        detail = (
            f"Slurm did not answer ({exc}): the fleet's drains cannot be counted, so {node} is "
            "not drained now; the fault stays pending"
        )
        journal.say(f"SLURM UNREACHABLE, NOTHING DRAINED: {detail}")
        # recorded with the breaker's refusals (a drain not made), its detail naming the cause
        journal.note(node, ACT_BREAKER, why, False, f"Slurm unreachable: {detail}")
        return HELD
    why = _reason(message, journal, node, settings, now)
    recent = [n for n in slurm.drained_by_us(fleet, now - settings["breaker_window"]) if n != node]
    if not safety.may_drain_more(len(recent), len(fleet), settings["breaker_share"]):
        detail = (
            f"{len(recent)} of {counted(len(fleet), 'node')} drained by "
            f"slurmhealth in {settings['breaker_window'] / 60:g} min (max "
            f"{settings['breaker_share']:.0%}); not draining {node}"
        )
        journal.say(f"CIRCUIT BREAKER OPEN: {detail}")
        journal.note(node, ACT_BREAKER, why, False, f"circuit breaker: {detail}")
        return BREAKER
    try:
        client.drain(node, why)
    except slurm.SlurmError as exc:
        if not _landed(client, node, why):
            journal.say(f"could not drain {node} ({why}): {exc}")
            journal.note(node, ACT_DRAIN, why, False, str(exc))
            return FAILED
        # the update timed out but the controller applied it (it was stopped, then went on):
        # a drain like any other, counted against the burst below
    if _yield_to_earlier(client, node, settings, now, journal.say, why):
        detail = f"others drained first in the same burst: {node} resumed"
        journal.say(f"CIRCUIT BREAKER OPEN: {detail}")
        journal.note(node, ACT_BREAKER, why, False, f"circuit breaker: {detail}")
        return BREAKER
    journal.note(node, ACT_DRAIN, why, True)
    return DRAINED


def _held_for_reboot(journal: Journal, node: str, message: str, info: NodeInfo) -> str:
    """A fault met while the node reboots towards a next state: Slurm lifts any drain when the
    node registers, so none is made now; said, recorded, and REBOOTING (the fault stays pending,
    drained by the first run after the registration; not HELD, which alerts)."""
    detail = (
        f"rebooting, NextState={info.get('next_state')}: Slurm lifts a drain when {node} "
        "registers, so it is not drained now; the fault stays pending for the next run"
    )
    journal.say(f"not drained now: {detail}")
    journal.note(node, ACT_DRAIN_SKIPPED, slurm.reason(message), True, detail)
    return REBOOTING


def _landed(client: slurm.Slurm, node: str, why: str) -> bool:
    """Whether the node shows our drain after an update that failed or timed out."""
    try:
        info = client.node(node)
    except slurm.SlurmError:
        return False
    return slurm.ours(info) and info["reason"] == why


def _yield_to_earlier(
    client: slurm.Slurm, node: str, settings: dict[str, Any], now: float, log: Say, why: str
) -> bool:
    """Recount after a burst; undo our own drain unless among the first up to the cap.

    Every hook sorts the same list the same way (reason time, then name), so exactly the
    first `cap` keep their drains. Best effort: a hook that cannot recount keeps its drain.
    """
    time.sleep(SETTLE_S)
    try:
        fleet = client.nodes()
        if not fleet:
            return False
        ours = [
            n
            for n in fleet
            if n["name"] in slurm.drained_by_us(fleet, now - settings["breaker_window"])
        ]
        ours.sort(key=lambda n: (n["since"] or 0, n["name"]))
        cap = safety.allowed_drains(0, len(fleet), settings["breaker_share"])
        names = [n["name"] for n in ours]
        if node not in names[cap:]:
            return False  # among the first (kept), or not drained by us now: not ours to undo
        info = client.node(node)
        if not (slurm.ours(info) and info["reason"] == why):
            return False  # someone drained it since (an admin, in the settle): never lifted
        client.resume(node)
    except slurm.SlurmError as exc:
        log(f"could not recount the fleet's drains, keeping {node} drained: {exc}")
        return False
    return True


def may_resume(info: NodeInfo) -> bool:
    """Only our own drains, and never one on probation, for a lemon or for service: a lemon
    passes its health checks (that is what makes it a lemon), and hardware that needs service
    may pass them between failures, so only an admin lifts those; nor one on the remediation
    ladder, which a passing diagnosis lifts (node/ladder.py). Never a node that is DOWN
    too (our drain made while it rebooted, where ReturnToService keeps it DOWN): a resume
    would lift the DOWN as well, which is Slurm's or an admin's to lift."""
    if not slurm.ours(info) or any(f.startswith("DOWN") for f in info["flags"]):
        return False
    kept = (PROBATION, LEMON, SERVICE, RESET, REBOOT, AWAITING)
    return not info["reason"].startswith(tuple(f"{PREFIX} {k}" for k in kept))


def on_ladder(reason: str) -> bool:
    """Our reason says a remediation is under way or done (node/ladder.py): such a drain is
    the ladder's to lift, after a diagnosis, never passing health checks'."""
    steps = (RESET, REBOOT, AWAITING)
    return reason.startswith(tuple(f"{PREFIX} {step}" for step in steps))


def resume_if_due(
    client: slurm.Slurm,
    node: str,
    settings: dict[str, Any],
    journal: Journal,
    ladder: Callable[[], Ladder] | None = None,
) -> bool:
    """Resume our own drain of `node` once settings.resume_after consecutive health checks
    passed since it; never an admin's drain, a lemon's or one on probation (may_resume).
    A drain on the remediation ladder takes the ladder's step instead (`ladder` makes it, the
    health check's: node/ladder.py). Returns whether the node was resumed; a Slurm or store
    failure is one log line."""
    if settings.get("diag_before_resume") and ladder is None:
        return False  # only a passed diagnosis returns the node (docs/diagnose.md)
    try:
        info = client.node(node)
        if ladder is not None and slurm.ours(info) and on_ladder(info["reason"]):
            return ladder().progress(info)
        if settings.get("diag_before_resume"):
            return False
        conn = journal.conn
        if not may_resume(info) or conn is None:
            return False
        since = (store.last_action(conn, node, ACT_DRAIN) or (0.0,))[0]
        needed = max(1, settings["resume_after"])
        verdicts = store.recent_verdicts(conn, node, HEALTHCHECK, since, needed)
        if not resume_due(verdicts, needed):
            return False
        client.resume(node)
        why = f"{needed} passing health checks after: {info['reason']}"
        journal.note(node, ACT_RESUME, why, True)
    except (slurm.SlurmError, store.StoreError) as exc:
        journal.say(f"could not resume {node}: {exc}")
        return False
    return True
