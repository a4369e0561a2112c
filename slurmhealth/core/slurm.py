"""The Slurm adapter: scontrol by absolute path, argv lists (never a shell), bounded in time.

Drain etiquette (as LBNL NHC taught admins): our reasons start with `slurmhealth:`; a node drained
or down for any other reason is never changed; only our own drains are resumed.
"""

from __future__ import annotations

import os
import time

from slurmhealth.core.constants import PREFIX
from slurmhealth.core.hostlist import is_node_name
from slurmhealth.core.result import clean

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TypedDict

    class _Node(TypedDict):
        name: str
        state: str
        flags: list[str]
        reason: str

    class NodeInfo(_Node, total=False):
        """A node as Slurm shows it (parse_node, parse_sinfo): its state, the state's flags
        upper-cased, the reason; `since`, when the reason was set (sinfo only, None: unknown);
        `next_state`, the state a reboot Slurm issued ends in (scontrol only, where one was
        asked for: `scontrol reboot ASAP` or `nextstate=`)."""

        since: float | None
        next_state: str

REASON_MAX = 160
SEARCH = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/local/slurm/bin")
# Node state flags that mean "someone took this node out of service" (scontrol spells them
# DRAIN, DOWN...; sinfo's long names drained, draining, down... upper-cased start the same).
_OUT = ("DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT", "POWER_DOWN", "POWERED_DOWN")
# The reason slurmctld gives a node whose slurmd stopped answering (it sets the node DOWN after
# SlurmdTimeout); ReturnToService=1 or 2 returns it to service when its slurmd registers again.
NOT_RESPONDING = "Not responding"


class SlurmError(Exception):
    """A Slurm command that failed, timed out or could not be found: one line."""


class UnknownNode(SlurmError):
    """slurmctld answered that it knows no such node (removed from slurm.conf, renamed): the
    controller is up, and there is nothing there to drain."""


def find_bin(name: str, slurm_bin: str = "") -> str:
    """Absolute path of a Slurm command: settings, $SLURMHEALTH_SLURM_BIN, $PATH, usual places.

    slurmd gives prolog, epilog and health check no PATH, so the usual places matter.
    """
    if slurm_bin:  # named by the admin: that one, never another cluster's from PATH
        path = os.path.join(slurm_bin, name)
        if os.path.isabs(path) and os.access(path, os.X_OK):
            return path
        raise SlurmError(f"{name} not found in {clean(slurm_bin, 80)} (settings.slurm_bin)")
    dirs = [os.environ.get("SLURMHEALTH_SLURM_BIN", "")]
    dirs += os.environ.get("PATH", "").split(os.pathsep) + list(SEARCH)
    for directory in dirs:
        path = os.path.join(directory, name) if directory else ""
        if path and os.path.isabs(path) and os.access(path, os.X_OK):
            return path
    raise SlurmError(f"{name} not found (set settings.slurm_bin or SLURMHEALTH_SLURM_BIN)")


def reason(message: str, ours: bool = True) -> str:
    """`slurmhealth: <message>`: one printable line, bounded, no quotes (scontrol parses them).
    ours=False: the message alone, as safe (a hold that is none of our fault drains)."""
    text = clean(message, REASON_MAX).replace('"', "").replace("'", "")
    return f"{PREFIX} {text}" if ours else text


def parse_node(line: str) -> NodeInfo:
    """`scontrol -o show node` -> {name, state, flags, reason}. Reason is the last field and
    may hold spaces; Slurm appends `[user@time]`, which is dropped."""
    info: NodeInfo = {"name": "", "state": "", "flags": [], "reason": ""}
    head, _, why = line.partition(" Reason=")
    for token in head.split():
        key, _, value = token.partition("=")
        if key == "NodeName":
            info["name"] = value
        elif key == "State":
            info["state"] = value
            info["flags"] = value.replace("*", "").split("+")
        elif key == "NextState":
            info["next_state"] = value.upper()
    why = why.strip()
    if why.endswith("]") and " [" in why:
        why = why[: why.rindex(" [")]
    info["reason"] = "" if why == "(null)" else why
    return info


def parse_sinfo(line: str) -> NodeInfo:
    """`gpu03|drained|2026-11-29T23:59:01|slurmhealth: GPU 3 GpuIsLost` (sinfo -N -o
    %N|%T|%H|%E) -> {name, state, flags, reason, since}; Slurm prints local time."""
    name, state, when, why = (line.split("|", 3) + ["", "", ""])[:4]
    flags = [state.rstrip("*~#!%$@^-").upper()]
    since: float | None = None
    if when and when not in ("Unknown", "None"):
        try:
            since = time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            since = None
    reason = "" if why in ("none", "(null)") else why
    return {"name": name, "state": state, "flags": flags, "reason": reason, "since": since}


def drained_by_us(nodes: Iterable[NodeInfo], since: float) -> list[str]:
    """Names of nodes out of service with our reason, set at or after `since`."""
    return [
        n["name"]
        for n in nodes
        if is_out(n) and n["reason"].startswith(PREFIX) and (n["since"] or 0) >= since
    ]


def is_out(info: NodeInfo, ignore: tuple[str, ...] = ()) -> bool:
    """Drained, down or otherwise out of service, by anyone (`ignore`: flags not counted)."""
    return any(f.startswith(_OUT) and not f.startswith(ignore) for f in info["flags"])


def ours(info: NodeInfo) -> bool:
    """Out of service with a reason slurmhealth wrote."""
    return is_out(info) and info["reason"].startswith(PREFIX)


def rejoins(info: NodeInfo) -> bool:
    """Out of service only until its slurmd registers, when Slurm returns it to service by
    itself: a reboot slurmctld issued that is not to end DOWN (its DRAIN, if any, lifted then
    too: lifts_drain), or DOWN with slurmctld's own "Not responding" and no drain
    (ReturnToService). slurmd runs the health check at its start, before it registers
    (slurm.conf(5), HealthCheckProgram): no one chose to keep such a node out, so a fault found
    then is acted on as on a node in service. A drained node stays drained across a plain
    reboot: it is out, as before."""
    flags = info["flags"]
    drained = any(f.startswith("DRAIN") for f in flags)
    if "REBOOT_ISSUED" in flags:
        return info.get("next_state") != "DOWN" and (not drained or lifts_drain(info))
    return "DOWN" in flags and not drained and info["reason"] == NOT_RESPONDING


def lifts_drain(info: NodeInfo) -> bool:
    """A reboot with a next state (`scontrol reboot ASAP` or `nextstate=`): when the node
    registers, Slurm clears its DRAIN flag (scontrol(1), reboot), so a drain made before then
    does not hold."""
    return "REBOOT_ISSUED" in info["flags"] and bool(info.get("next_state"))


def rebooting(info: NodeInfo) -> bool:
    """A reboot asked for and not yet over: REBOOT_REQUESTED (waiting for the node's jobs to
    end) or REBOOT_ISSUED (rebooting) in scontrol's flags; sinfo marks them `@` and `^` after
    the state (sinfo(1), NODE STATE CODES), which parse_sinfo strips from the flags."""
    marked = info["state"].rstrip("*~#!%$-").endswith(("@", "^"))
    return marked or any(f.startswith("REBOOT") for f in info["flags"])


def busy(info: NodeInfo) -> bool:
    """Jobs on the node: allocated (wholly or in part) or still completing (scontrol's state
    and flags; a drained node with jobs shows MIXED+DRAIN or ALLOCATED+DRAIN)."""
    return any(f.startswith(("ALLOC", "MIX", "COMPLETING")) for f in info["flags"])


def may_drain(info: NodeInfo, ignore: tuple[str, ...] = ()) -> bool:
    """Drain only a node in service; never touch one someone else took out. `ignore`: flags
    that do not count as out here (our own maintenance reservation, for the diagnose job)."""
    return not is_out(info, ignore)


class Slurm:
    """Slurm commands with a deadline each and, optionally, one budget for all of them (the
    hooks' failure path: however many calls, slurmd is never held past the budget).
    SLURM_CONF passes through the environment."""

    def __init__(
        self, slurm_bin: str = "", timeout: float = 2.0, budget: float | None = None
    ) -> None:
        self.slurm_bin = slurm_bin
        self.timeout = timeout
        self.ends = None if budget is None else time.monotonic() + budget

    def _limit(self, timeout: float | None) -> float:
        limit = self.timeout if timeout is None else timeout
        if self.ends is not None:
            limit = min(limit, self.ends - time.monotonic())
            if limit <= 0.05:
                raise SlurmError("no time left for Slurm calls")
        return limit

    def run(self, *args: str, timeout: float | None = None, command: str = "scontrol") -> str:
        import subprocess  # noqa: PLC0415 - failure path and admin side only

        argv = [find_bin(command, self.slurm_bin), *args]
        limit = self._limit(timeout)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{command} {args[0]} timed out after {limit:.3g} s") from None
        except OSError as exc:
            raise SlurmError(f"{command}: {exc}") from None
        if proc.returncode != 0:
            error = clean(proc.stderr or proc.stdout or f"exit {proc.returncode}", words=True)
            raise SlurmError(f"{command} {args[0]}: {error}")
        return proc.stdout

    def sinfo(self, *args: str, timeout: float | None = None) -> str:
        return self.run(*args, timeout=timeout, command="sinfo")

    def nodes(self, timeout: float | None = None) -> list[NodeInfo]:
        """Every node once: {name, state, flags, reason, since} from one sinfo call (`sinfo -N`
        prints a node once per partition it is in: counted as listed, a cluster whose nodes
        are in two partitions had twice its nodes, in the report and under the breaker)."""
        out = self.sinfo("-h", "-N", "-o", "%N|%T|%H|%E", timeout=timeout)
        seen: dict[str, NodeInfo] = {}
        for line in out.splitlines():
            if line.strip():
                info = parse_sinfo(line)
                seen.setdefault(info["name"], info)
        return list(seen.values())

    def node(self, name: str, timeout: float | None = None) -> NodeInfo:
        """The node's record (`scontrol -o show node`); UnknownNode where slurmctld answered
        that it has no such node ("Node NAME not found")."""
        try:
            out = self.run("-o", "show", "node", one_node(name), timeout=timeout)
        except SlurmError as exc:
            said = str(exc)
            if said.startswith("scontrol -o: ") and f"{name} not found" in said:
                raise UnknownNode(said) from None
            raise
        return parse_node(out.strip().splitlines()[0] if out.strip() else "")

    def drain(self, name: str, why: str, timeout: float | None = None) -> None:
        node = one_node(name)
        self.run("update", f"NodeName={node}", "State=DRAIN", f"Reason={why}", timeout=timeout)

    def resume(self, name: str, timeout: float | None = None) -> None:
        self.run("update", f"NodeName={one_node(name)}", "State=RESUME", timeout=timeout)

    def reboot(self, name: str, why: str, timeout: float | None = None) -> None:
        """`scontrol reboot reason=WHY NODE`: slurmctld runs RebootProgram on the node once its
        jobs have ended. Neither ASAP nor nextstate: both have Slurm clear the node's DRAIN when
        it registers (scontrol(1), reboot), and nextstate=DOWN is lifted at once where
        ReturnToService=2; a plain reboot keeps the drain the caller made, so the node comes
        back out of service (docs/remediation.md)."""
        self.run("reboot", f"reason={why}", one_node(name), timeout=timeout)


def one_node(name: str) -> str:
    """`name`, when it is one node's name; else SlurmError. A name read from a store or an
    import could be a node set (`gpu[01-64]` would drain 64 nodes, and resume ones an admin
    drained, past every per-node check) or an option: it never reaches a Slurm command."""
    if not is_node_name(name):
        raise SlurmError(f"not a node name: {clean(repr(name), 80)}")
    return name
