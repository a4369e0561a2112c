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
    BREAKER,
    DRAINED,
    FAILED,
    HEALTHCHECK,
    HELD,
    LEMON,
    PREFIX,
    PROBATION,
    SERVICE,
    SKIPPED,
)
from slurmhealth.core.result import FAIL, counted

# Health checks start on every node at once: hooks that counted the fleet's drains before the
# others drained all think they are first. After draining, wait for the burst to land,
# recount, and yield (undo our drain) unless we are among the first up to the cap.
SETTLE_S = 0.3


def note(
    conn: object,
    node: str,
    action: str,
    why: str,
    actor: str,
    ok: bool,
    detail: str,
    log: object,
    keep: object = None,
    once: bool = False,
) -> None:
    """Record an action in the store; if the store cannot take it, hand it to `keep` (the
    agent spools it beside the store, to be recorded by a later run): nothing is lost. `once`:
    not when the node's latest action is this very one (a sweep saying again, each hour, what
    it already said: the first says it, and anything that happens between makes it new)."""
    when = time.time()
    if once and conn is not None:
        try:
            if store.newest_action(conn, node) == (action, why, actor, ok, detail):  # type: ignore[arg-type]
                return
        except store.StoreError:
            pass  # unknown: record it
    if conn is not None:
        try:
            store.record_action(conn, node, action, why, actor, ok, detail, when)  # type: ignore[arg-type]
            return
        except store.StoreError as exc:
            log(f"could not record the {action}: {exc}")  # type: ignore[operator]
    if keep is not None:
        # its own id: a replay that is cut short and replayed again writes it once
        entry = {"action": [node, action, why, actor, ok, detail, when], "id": store.new_id()}
        keep(entry)  # type: ignore[operator]


def _history(conn: object, node: str, log: object) -> list:
    """Our drains and resumes of the node, for probation; [] when the store cannot say (the
    drain itself never depends on whether the store could be read)."""
    if conn is None:
        return []
    try:
        return store.drain_history(conn, node)  # type: ignore[arg-type]
    except Exception as exc:
        log(f"could not read the node's drain history, probation unknown: {exc}")  # type: ignore[operator]
        return []


def _reason(
    message: str, conn: object, node: str, settings: dict, now: float, log: object
) -> str:
    """Our reason; on probation it says an admin must resume (we never will)."""
    days = settings["probation_days"]
    if safety.on_probation([*_history(conn, node, log), (now, ACT_DRAIN)], now, days):
        return slurm.reason(
            f"{PROBATION} an admin must resume (failed within {days:g} d of our resume): {message}"
        )
    return slurm.reason(message)


def _skipped(
    conn: object,
    node: str,
    message: str,
    actor: str,
    out: dict,
    log: object,
    keep: object,
    once: bool,
) -> None:
    """Record that the node was already out (`out`: its Slurm record), so not drained."""
    detail = f"already out: {out['reason'] or out['state']}"
    note(conn, node, ACT_DRAIN_SKIPPED, slurm.reason(message), actor, True, detail, log, keep, once)


def drain(
    client: slurm.Slurm,
    node: str,
    message: str,
    settings: dict,
    conn: object,
    actor: str,
    log: object,
    record_skip: bool = True,
    keep: object = None,
    ignore: tuple = (),
    repeat_skip: bool = True,
) -> str:
    """Drain `node` unless someone else took it out, or the breaker is open. Returns the outcome.
    A node already out is recorded as a skip (`record_skip`), each time unless `repeat_skip` is
    false (note(once=True)).

    The breaker: slurmhealth never has more than settings.breaker_share of the fleet drained by
    itself within settings.breaker_window (any automatic path). Past it, it drains nothing more,
    says so loudly and records it: a fleet-wide fault is not a reason to empty the cluster.
    """
    now = time.time()
    try:
        info = client.node(node)
        if not slurm.may_drain(info, ignore):
            if record_skip:
                _skipped(conn, node, message, actor, info, log, keep, not repeat_skip)
            return SKIPPED
        fleet = client.nodes()
        if not fleet:  # an answer that lists no node counts nothing either
            raise slurm.SlurmError("sinfo listed no nodes")
        listed = next((n for n in fleet if n["name"] == node), None)
        if listed is not None and not slurm.may_drain(listed, ignore):
            # out since `show node` (another hook of this node drained it a moment ago): out,
            # not a drain of another node that could trip the breaker
            if record_skip:
                _skipped(conn, node, message, actor, listed, log, keep, not repeat_skip)
            return SKIPPED
    except slurm.SlurmError as exc:
        # Without a fresh count of the fleet the breaker cannot hold, and a fleet-wide fault
        # (a slow or restarting controller among its signs) is exactly when every node would
        # drain itself: drain nothing now. The agent keeps the fault pending and acts on it at
        # the next run that can count.
        why = _reason(message, conn, node, settings, now, log)
        detail = (
            f"Slurm did not answer ({exc}): the fleet's drains cannot be counted, so {node} is "
            "not drained now; the fault stays pending"
        )
        log(f"SLURM UNREACHABLE, NOTHING DRAINED: {detail}")  # type: ignore[operator]
        # recorded with the breaker's refusals (a drain not made), its detail naming the cause
        note(conn, node, ACT_BREAKER, why, actor, False, f"Slurm unreachable: {detail}", log, keep)
        return HELD
    why = _reason(message, conn, node, settings, now, log)
    recent = [n for n in slurm.drained_by_us(fleet, now - settings["breaker_window"]) if n != node]
    if not safety.may_drain_more(len(recent), len(fleet), settings["breaker_share"]):
        detail = (
            f"{len(recent)} of {counted(len(fleet), 'node')} drained by "
            f"slurmhealth in {settings['breaker_window'] / 60:g} min (max "
            f"{settings['breaker_share']:.0%}); not draining {node}"
        )
        log(f"CIRCUIT BREAKER OPEN: {detail}")  # type: ignore[operator]
        note(conn, node, ACT_BREAKER, why, actor, False, f"circuit breaker: {detail}", log, keep)
        return BREAKER
    try:
        client.drain(node, why)
    except slurm.SlurmError as exc:
        if not _landed(client, node, why):
            log(f"could not drain {node} ({why}): {exc}")  # type: ignore[operator]
            note(conn, node, ACT_DRAIN, why, actor, False, str(exc), log, keep)
            return FAILED
        # the update timed out but the controller applied it (it was stopped, then went on):
        # a drain like any other, counted against the burst below
    if _yield_to_earlier(client, node, settings, now, log, why):
        detail = f"others drained first in the same burst: {node} resumed"
        log(f"CIRCUIT BREAKER OPEN: {detail}")  # type: ignore[operator]
        note(conn, node, ACT_BREAKER, why, actor, False, f"circuit breaker: {detail}", log, keep)
        return BREAKER
    note(conn, node, ACT_DRAIN, why, actor, True, "", log, keep)
    return DRAINED


def _landed(client: slurm.Slurm, node: str, why: str) -> bool:
    """Whether the node shows our drain after an update that failed or timed out."""
    try:
        info = client.node(node)
    except slurm.SlurmError:
        return False
    return slurm.ours(info) and info["reason"] == why


def _yield_to_earlier(
    client: slurm.Slurm, node: str, settings: dict, now: float, log: object, why: str
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
        log(f"could not recount the fleet's drains, keeping {node} drained: {exc}")  # type: ignore[operator]
        return False
    return True


def may_resume(info: dict) -> bool:
    """Only our own drains, and never one on probation, for a lemon or for service: a lemon
    passes its health checks (that is what makes it a lemon), and hardware that needs service
    may pass them between failures, so only an admin lifts those."""
    if not slurm.ours(info):
        return False
    kept = (PROBATION, LEMON, SERVICE)
    return not info["reason"].startswith(tuple(f"{PREFIX} {k}" for k in kept))


def resume_due(verdicts: list, needed: int) -> bool:
    """`needed` (at least 1) health checks since our drain, newest first, and none failed."""
    needed = max(1, needed)
    return len(verdicts) >= needed and FAIL not in verdicts[:needed]


def resume_if_due(
    client: slurm.Slurm, node: str, settings: dict, conn: object, log: object, keep: object = None
) -> bool:
    """Resume our own drain of `node` once settings.resume_after consecutive health checks
    passed since it; never an admin's drain, a lemon's or one on probation (may_resume).
    Returns whether the node was resumed; a Slurm or store failure is one log line."""
    if settings.get("diag_before_resume"):
        return False  # only a passed diagnosis returns the node (docs/diagnose.md)
    try:
        info = client.node(node)
        if not may_resume(info) or conn is None:
            return False
        since = (store.last_action(conn, node, ACT_DRAIN) or (0.0,))[0]  # type: ignore[arg-type]
        needed = max(1, settings["resume_after"])
        verdicts = store.recent_verdicts(conn, node, HEALTHCHECK, since, needed)  # type: ignore[arg-type]
        if not resume_due(verdicts, needed):
            return False
        client.resume(node)
        why = f"{needed} passing health checks after: {info['reason']}"
        note(conn, node, ACT_RESUME, why, f"slurmhealth {HEALTHCHECK}", True, "", log, keep)
    except (slurm.SlurmError, store.StoreError) as exc:
        log(f"could not resume {node}: {exc}")  # type: ignore[operator]
        return False
    return True
