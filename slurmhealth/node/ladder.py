"""The remediation ladder (docs/remediation.md): a failing node whose fault a GPU reset or a
reboot may mend is mended through Slurm's own machinery, within limits, and returns to service
only once a diagnosis passes.

The rungs, lowest first: RESET (the fault's GPUs are reset once the node has no job left),
REBOOT (`scontrol reboot` after our drain: slurmctld runs RebootProgram once the node's jobs
end) and SERVICE (drained for an admin). How far a node may climb is settings.remediate; how
often, settings.remediate_max within settings.remediate_window. A remediation that did not mend
the fault climbs a rung.

Where a node stands is its Slurm reason, which outlives any store or side file, and which is
what an admin reads: `slurmhealth: reset: ...` or `slurmhealth: reboot: ...` while the
remediation is under way (Slurm appends ` : reboot issued` when it reboots the node),
`slurmhealth: awaiting diagnosis after a reboot: ...` once it is done, `slurmhealth: service:
...` at the top. Every step goes through the journal.

Failure path only: the hooks import this module when a failing run's fault asks for a
remediation, and when a health check finds the node's drain on the ladder.
"""

from __future__ import annotations

import time

from slurmhealth.core import safety, slurm, store
from slurmhealth.core.constants import (
    ACT_DRAIN,
    ACT_REBOOT,
    ACT_REMEDIATED,
    ACT_RESET_GPU,
    ACT_RESET_WAIT,
    ACT_RESUME,
    ACT_WOULD_REBOOT,
    ACT_WOULD_RESET,
    AWAITING,
    DAY,
    HEALTHCHECK,
    LEMON,
    PREFIX,
    PROBATION,
    REBOOT,
    REBOOT_ISSUED,
    REMEDIATE_OFF,
    REMEDIATE_REBOOT,
    RESET,
    SERVICE,
)
from slurmhealth.core.result import REBOOT as REBOOT_ACTION
from slurmhealth.core.result import RESET_GPU, counted

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, Callable

    from slurmhealth.core.slurm import NodeInfo
    from slurmhealth.node.journal import Journal

    Settings = dict[str, Any]
    # Reset these GPUs (nvidia-smi -r, within the hook's deadline): those whose reset failed.
    Reset = Callable[[list[int]], list[int]]

KEEP = "keep"  # the remediation under way goes on: nothing new
_RUNGS = (RESET, REBOOT, SERVICE)  # lowest first
_DONE = {RESET: "a GPU reset", REBOOT: "a reboot"}  # what the awaiting reason says was done
_FOR_ADMIN = (SERVICE, PROBATION, LEMON)


# --- the policy: pure ---------------------------------------------------------------------------


def rung_for(action: str, mode: str) -> str | None:
    """The rung a fault's action hint asks for, as far as settings.remediate goes: a reset_gpu
    fault RESET (mode reset or reboot), a reboot fault REBOOT (mode reboot); else None."""
    if mode == REMEDIATE_OFF:
        return None
    if action == RESET_GPU:
        return RESET
    if action == REBOOT_ACTION and mode == REMEDIATE_REBOOT:
        return REBOOT
    return None


def above(done: str, mode: str) -> str:
    """The rung after a remediation that did not mend the fault: a reset climbs to a reboot
    (where settings.remediate allows it), anything else to service."""
    return REBOOT if done == RESET and mode == REMEDIATE_REBOOT else SERVICE


def step_of(reason: str) -> tuple[str, str] | None:
    """Where a reason of ours puts the node on the ladder: (RESET or REBOOT, "under way"),
    (RESET or REBOOT, "done": awaiting a diagnosis), (SERVICE, "admin") for the drains only an
    admin lifts (service, probation, lemon); None for a plain drain of ours, or none at all."""
    if not reason.startswith(f"{PREFIX} "):
        return None
    text = reason[len(PREFIX) + 1 :]
    if text.startswith(_FOR_ADMIN):
        return SERVICE, "admin"
    for rung in (RESET, REBOOT):
        if text.startswith(f"{rung} "):
            return rung, "under way"
        if text.startswith(f"{AWAITING} after {_DONE[rung]}:"):
            return rung, "done"
    return None


def message_of(reason: str) -> str:
    """The fault's words in a ladder reason: without our prefix, the step's words and what
    Slurm appended (` : reboot issued`)."""
    text = reason[len(PREFIX) + 1 :] if reason.startswith(f"{PREFIX} ") else reason
    text = text.split(REBOOT_ISSUED)[0]
    for rung in (RESET, REBOOT):
        for head in (f"{rung} ", f"{AWAITING} after {_DONE[rung]}: "):
            if text.startswith(head):
                return text[len(head) :]
    return text


def decide(
    wanted: str, reason: str, rebooting: bool, mode: str, used: int | None, most: int
) -> str:
    """What a failing run asks of the ladder, a pure function of the node as Slurm shows it.

    wanted: the rung the fault asks for (rung_for); reason: the node's reason when it is ours
    ("" when it is in service); rebooting: Slurm shows a reboot asked for and not over; used:
    the node's remediations within the window (None: unknown); most: settings.remediate_max.
    Returns RESET, REBOOT or SERVICE (that remediation now), or KEEP (the one under way goes
    on). A node already on the ladder climbs when its remediation is done and the fault is
    back; a new remediation past the limit, or with the count unknown (the store cannot say:
    no remediation that cannot be counted), is SERVICE or KEEP respectively."""
    step = step_of(reason)
    rung = wanted
    if step is not None:
        done, where = step
        if where == "admin":
            return KEEP  # an admin's to lift: never remediated by us
        if where == "done" or back_from_reboot(reason, rebooting):
            rung = _higher(rung, above(done, mode))  # it did not mend the fault: climb
        elif done == REBOOT and not rebooting:
            rung = REBOOT  # asked for and not taken (Slurm failed): asked again
        elif _RUNGS.index(rung) <= _RUNGS.index(done):
            return KEEP  # under way
    if rung == SERVICE:
        return SERVICE
    if used is None:
        return KEEP
    return SERVICE if used >= most else rung


def back_from_reboot(reason: str, rebooting: bool) -> bool:
    """Our reboot reason, the reboot issued (Slurm appended its words) and over."""
    return reason.startswith(f"{PREFIX} {REBOOT} ") and REBOOT_ISSUED in reason and not rebooting


def service_why(reason: str, rebooting: bool) -> str:
    """Why a node of ours on the ladder goes to service, beyond the count: the remediation
    done did not mend the fault; "" otherwise (the limit)."""
    step = step_of(reason)
    if step is not None and (step[1] == "done" or back_from_reboot(reason, rebooting)):
        return f"failing still after {_DONE[step[0]]}"
    return ""


def _higher(a: str, b: str) -> str:
    return a if _RUNGS.index(a) >= _RUNGS.index(b) else b


def span(seconds: float) -> str:
    """A window as the reasons say it: `7 d`, `12 h`, `30 min`."""
    for unit, name in ((DAY, "d"), (3600.0, "h")):
        if seconds >= unit:
            return f"{seconds / unit:.3g} {name}"
    return f"{seconds / 60:.3g} min"


def reason_for(rung: str, message: str, used: int | None, settings: Settings, why: str = "") -> str:
    """The drain reason of a rung (without our prefix: slurm.reason adds it): `reboot: MSG`,
    `reset: MSG`, `service: MSG (2 remediations in 7 d)`."""
    if rung == SERVICE:
        said = [why] if why else []
        if used is not None:
            said.append(f"{counted(used, 'remediation')} in {span(settings['remediate_window'])}")
        return f"{SERVICE} {message}" + (f" ({'; '.join(said)})" if said else "")
    return f"{rung} {message}"


def awaiting(done: str, message: str) -> str:
    """The reason of a node whose remediation is done: lifted by a passing diagnosis only."""
    return f"{AWAITING} after {_DONE[done]}: {message}"


# --- the steps: Slurm, the store, nvidia-smi ------------------------------------------------


def used(journal: Journal, node: str, settings: Settings, now: float) -> int | None:
    """The node's remediations within settings.remediate_window; None when the store cannot
    say (a remediation is then not made: it could be past the limit)."""
    if journal.conn is None:
        return None
    try:
        return len(store.remediations(journal.conn, node, now - settings["remediate_window"]))
    except store.StoreError as exc:
        journal.say(f"could not count {node}'s remediations, none made: {exc}")
        return None


def first_reason(
    journal: Journal, node: str, message: str, wanted: str, settings: Settings
) -> tuple[str, int | None]:
    """The reason to drain a node in service with, for a fault that asks for `wanted`: that
    rung's (SERVICE past the limit; the plain message where the count is unknown), and the
    count."""
    count = used(journal, node, settings, time.time())
    rung = decide(wanted, "", False, settings["remediate"], count, settings["remediate_max"])
    if rung == KEEP:
        return message, count
    return reason_for(rung, message, count, settings), count


def would(journal: Journal, node: str, wanted: str, reason: str) -> None:
    """Monitor-only: record the remediation enforcing would have asked for."""
    kind = ACT_WOULD_REBOOT if wanted == REBOOT else ACT_WOULD_RESET
    why = slurm.reason(reason)
    journal.say(f"monitor-only: would {'reboot' if wanted == REBOOT else 'reset GPUs of'} {node}")
    journal.note(node, kind, why, True)


class Ladder:
    """One hook's steps on its own node: the Slurm client (each call bounded, all of them by
    the hook's deadline), the journal, the settings, and how to reset GPUs (`reset`, with
    `gpus`: the fault's GPUs, else every GPU of the node)."""

    def __init__(
        self,
        client: slurm.Slurm,
        node: str,
        settings: Settings,
        journal: Journal,
        reset: Reset | None = None,
        gpus: list[int] | None = None,
    ) -> None:
        self.client, self.node, self.settings, self.journal = client, node, settings, journal
        self.reset, self.gpus = reset, gpus or []
        self.mode = settings["remediate"]

    def after_drain(self, message: str, wanted: str) -> None:
        """A failing run's fault asks for `wanted`, and the node is out (our drain landed, or
        it was out already): take the ladder's next step, if it is ours to take."""
        info = self.client.node(self.node)
        if not slurm.ours(info) or _down(info):
            return  # someone else's to keep out, or Slurm's (a reboot that timed out)
        count = used(self.journal, self.node, self.settings, time.time())
        reason, rebooting = info["reason"], slurm.rebooting(info)
        rung = decide(wanted, reason, rebooting, self.mode, count, self.settings["remediate_max"])
        if rung == KEEP:
            if step_of(reason) == (RESET, "under way"):
                self._reset_when_empty(info, count)
        elif rung == SERVICE:
            self._service(message, reason, count, service_why(reason, rebooting))
        elif rung == REBOOT:
            self._reboot(reason_for(REBOOT, message, count, self.settings), count)
        else:
            self._start_reset(info, message, count)

    def progress(self, info: NodeInfo) -> bool:
        """A passing health check on a node of ours on the ladder: take the step due (reset
        GPUs on an empty node, note a reboot done, ask again for a reboot Slurm did not take),
        and return the node once a diagnosis passed after its remediation. Whether it was
        returned."""
        step = step_of(info["reason"])
        if step is None or step[1] == "admin" or _down(info):
            return False
        rung, where = step
        count = used(self.journal, self.node, self.settings, time.time())
        if where == "done":
            return self._return_if_diagnosed(info, rung)
        if rung == RESET:
            self._reset_when_empty(info, count)
        elif not slurm.rebooting(info):
            self._after_reboot(info, count)
        return False

    # --- reboot ----------------------------------------------------------------------------

    def _reboot(self, why: str, count: int | None) -> bool:
        """Ask Slurm for a reboot of our drained node, behind the circuit breaker (a node it
        reboots is out, its reason ours and fresh: it counts as a drain of ours)."""
        node, settings, journal = self.node, self.settings, self.journal
        reason = slurm.reason(why)
        now = time.time()
        try:
            fleet = self.client.nodes()
            if not fleet:
                raise slurm.SlurmError("sinfo listed no nodes")
        except slurm.SlurmError as exc:
            detail = f"failed: the fleet could not be counted ({exc}); asked again next run"
            journal.say(f"could not ask for a reboot of {node}: {detail}")
            journal.note(node, ACT_REBOOT, reason, False, detail, once=True)
            return False
        since = now - settings["breaker_window"]
        recent = [n for n in slurm.drained_by_us(fleet, since) if n != node]
        if not safety.may_drain_more(len(recent), len(fleet), settings["breaker_share"]):
            detail = (
                f"refused: circuit breaker: {len(recent)} of {counted(len(fleet), 'node')} "
                f"drained by slurmhealth in {settings['breaker_window'] / 60:g} min (max "
                f"{settings['breaker_share']:.0%}); not rebooting {node}"
            )
            journal.say(f"CIRCUIT BREAKER OPEN: {detail}")
            journal.note(node, ACT_REBOOT, reason, False, detail, once=True)
            return False
        try:
            self.client.reboot(node, reason)
        except slurm.SlurmError as exc:
            if not self._reboot_landed():
                journal.say(f"could not ask for a reboot of {node} ({reason}): {exc}")
                journal.note(node, ACT_REBOOT, reason, False, f"failed: {exc}", once=True)
                return False
        total = (count or 0) + 1
        most, window = settings["remediate_max"], span(settings["remediate_window"])
        detail = f"requested: {total} of {most} remediations in {window}"
        journal.say(f"reboot of {node} asked of Slurm ({reason}): {detail}")
        journal.note(node, ACT_REBOOT, reason, True, detail)
        return True

    def _reboot_landed(self) -> bool:
        """Whether Slurm shows the reboot after a request that failed or timed out."""
        try:
            return slurm.rebooting(self.client.node(self.node))
        except slurm.SlurmError:
            return False

    def _after_reboot(self, info: NodeInfo, count: int | None) -> None:
        """Our reboot reason and no reboot under way: back from it (Slurm appended ` : reboot
        issued`: the remediation is done, the node awaits a diagnosis), or never taken (asked
        again, unless Slurm took our request and an admin cancelled it since: theirs)."""
        message = message_of(info["reason"])
        if REBOOT_ISSUED in info["reason"]:
            self._done(REBOOT, message, "rebooted")
            return
        conn = self.journal.conn
        if conn is None:
            return  # not known whether Slurm took it: the node stays out
        try:
            latest = store.latest_action(conn, self.node, ACT_REBOOT)
            drained = store.last_action(conn, self.node, ACT_DRAIN)
        except store.StoreError:
            return
        if latest is not None and latest[1] and (drained is None or latest[0] >= drained[0]):
            return  # taken, then cancelled (scontrol cancel_reboot): an admin's call
        if self.mode != REMEDIATE_REBOOT:
            return  # reboots switched off since: the node stays drained for an admin
        rung = decide(
            REBOOT, "", False, self.mode, count, self.settings["remediate_max"]
        )
        if rung == REBOOT:
            self._reboot(reason_for(REBOOT, message, count, self.settings), count)
        elif rung == SERVICE:
            self._service(message, info["reason"], count)

    # --- reset -----------------------------------------------------------------------------

    def _start_reset(self, info: NodeInfo, message: str, count: int | None) -> None:
        """Our drain now says a GPU reset is due; done here on an empty node, else recorded as
        waiting for the node's jobs to end (the first health check that finds it empty)."""
        reason = slurm.reason(reason_for(RESET, message, count, self.settings))
        if info["reason"] != reason:
            self.client.drain(self.node, reason)
            info["reason"] = reason
        self._reset_when_empty(info, count)

    def _reset_when_empty(self, info: NodeInfo, count: int | None) -> None:
        """Reset the GPUs of a node of ours whose reset is due, once Slurm shows no job on it
        (in a health check: only slurmd's health check runs on an empty node)."""
        node, journal = self.node, self.journal
        if self.mode == REMEDIATE_OFF:
            return  # switched off since: the node stays drained for an admin
        if slurm.busy(info) or self.reset is None:
            detail = "waiting for the node's jobs to end: the first health check after resets"
            journal.note(node, ACT_RESET_WAIT, info["reason"], True, detail, once=True)
            return
        message = message_of(info["reason"])
        gpus = list(self.gpus)
        failed = self.reset(gpus) if gpus else [-1]
        total = (count or 0) + 1
        names = ", ".join(str(g) for g in gpus) or "none known"
        if not failed:
            most, window = self.settings["remediate_max"], span(self.settings["remediate_window"])
            detail = f"GPU {names} reset: {total} of {most} remediations in {window}"
            journal.note(node, ACT_RESET_GPU, info["reason"], True, detail)
            self._done(RESET, message, f"GPU {names} reset")
            return
        bad = ", ".join(str(g) for g in failed if g >= 0) or "none known to reset"
        journal.say(f"GPU reset of {node} failed (GPU {bad}): climbing the ladder")
        journal.note(node, ACT_RESET_GPU, info["reason"], False, f"failed: GPU {bad}")
        rung = above(RESET, self.mode)
        if rung == REBOOT and count is not None and count < self.settings["remediate_max"]:
            why = reason_for(REBOOT, f"{message} (GPU reset failed)", count, self.settings)
            self._reboot(why, count)
        else:
            self._service(message, info["reason"], count, "GPU reset failed")

    # --- done, service, return -------------------------------------------------------------

    def _done(self, rung: str, message: str, what: str) -> None:
        """The remediation is done: the reason says the node awaits a diagnosis."""
        reason = slurm.reason(awaiting(rung, message))
        self.client.drain(self.node, reason)
        self.journal.say(f"{self.node}: {what}; it returns once a diagnosis passes")
        self.journal.note(self.node, ACT_REMEDIATED, reason, True, what)

    def _service(self, message: str, was: str, count: int | None, why: str = "") -> None:
        """The top of the ladder: our drain now says the node needs service (an admin lifts
        it). A node out already is not the breaker's: it takes no capacity."""
        reason = slurm.reason(reason_for(SERVICE, message, count, self.settings, why))
        if was == reason:
            return
        self.client.drain(self.node, reason)
        self.journal.say(f"{self.node} needs service: {reason}")
        self.journal.note(self.node, ACT_DRAIN, reason, True, f"was: {was}")

    def _return_if_diagnosed(self, info: NodeInfo, rung: str) -> bool:
        """Resume a node awaiting a diagnosis once one passed after its remediation and the
        health checks since settings.resume_after in a row passed (never when the store
        cannot say)."""
        conn = self.journal.conn
        if conn is None or self.settings.get("diag_before_resume"):
            return False
        try:
            done = store.last_action(conn, self.node, ACT_REMEDIATED)
            since = done[0] if done else None
            passed = None if since is None else store.passed_diagnosis(conn, self.node, since)
            if passed is None:
                return False
            needed = max(1, self.settings["resume_after"])
            verdicts = store.recent_verdicts(conn, self.node, HEALTHCHECK, passed, needed)
        except store.StoreError as exc:
            self.journal.say(f"could not read {self.node}'s diagnoses: {exc}")
            return False
        if not safety.resume_due(verdicts, needed):
            return False
        self.client.resume(self.node)
        why = f"a diagnosis passed after {_DONE[rung]}: {info['reason']}"
        self.journal.note(self.node, ACT_RESUME, slurm.reason(why, ours=False), True)
        return True


def _down(info: NodeInfo) -> bool:
    """DOWN: Slurm's or an admin's to lift (a reboot that timed out, ReturnToService=0)."""
    return any(f.startswith("DOWN") for f in info["flags"]) and not slurm.rebooting(info)


def gpus_of(data: list[dict[str, Any]]) -> list[int]:
    """The GPU indexes the failing results name in their data (the Xid events' `gpu`, a
    scope's `other_gpus`); [] when none does (every GPU of the node is reset then)."""
    out: set[int] = set()
    for item in data:
        events = item.get("events")
        for event in events if isinstance(events, list) else ():
            gpu = event.get("gpu") if isinstance(event, dict) else None
            if isinstance(gpu, int) and not isinstance(gpu, bool):
                out.add(gpu)
        scope = item.get("scope")
        others = scope.get("other_gpus") if isinstance(scope, dict) else None
        out.update(g for g in others or () if isinstance(g, int))
    return sorted(out)
