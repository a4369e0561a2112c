"""Validate and return (docs/diagnose.md): drained nodes diagnosed as Slurm jobs in a maintenance
reservation; a node returns only after it passes.

`slurmhealth diagnose --submit` (head node, cron) plans from one sinfo, the reservation and one
squeue (`plan`, pure):
- a node slurmhealth drained (not for a failed diagnosis, nor one whose GPU reset or reboot of
  the remediation ladder is still to come) and idle goes into the reservation, is
  resumed there (the reservation keeps users' jobs off it) and gets one exclusive diagnose job
  with the level's time limit; a node an admin names gets the same if it is in service or
  drained by us; an admin's drain is never lifted: an admin-drained node is refused;
- a node in the reservation whose job is gone: marked PASSED by its job -> resumed and out of
  the reservation; drained (for service, or by someone else meanwhile) -> out of the
  reservation, still drained; in service (the time limit killed its job, or it crashed) ->
  drained for service and out of the reservation.
The job itself (`slurmhealth diagnose --apply`, on the node) records a `diag` run and acts:
pass -> PASSED; fail -> `slurmhealth: service: diagnose <level>: <evidence>`, through the
breaker like every drain.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import sys

from slurmhealth.core import slurm, store
from slurmhealth.core.command import CommandError, Console
from slurmhealth.core.constants import (
    ACT_DRAIN,
    ACT_RESUME,
    BREAKER,
    DRAINED,
    HELD,
    LEMON,
    PREFIX,
    PROBATION,
    REBOOT,
    RESET,
    SERVICE,
    WOULD_DRAIN,
)
from slurmhealth.core.hostlist import PatternError, expand, split_terms
from slurmhealth.core.result import clean
from slurmhealth.fleet import pairing, text
from slurmhealth.node import actions
from slurmhealth.node.journal import Journal

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3

    from slurmhealth.core.slurm import NodeInfo
    from slurmhealth.node.diag.run import Diagnosis, Finish
    from slurmhealth.node.journal import Say

JOB_NAME = "slurmhealth-diagnose"
ACT_DIAGNOSE = "diagnose"  # a node put in the reservation with its diagnose job (detail: job id)
ACTOR = "slurmhealth diagnose"
# Our drains that wait for an admin (hardware to service, a relapse on probation, a lemon):
# diagnosed only when an admin names the node, after the repair.
FOR_ADMIN = tuple(f"{PREFIX} {k}" for k in (SERVICE, PROBATION, LEMON))
# Our drains on the remediation ladder whose reset or reboot has not happened yet.
UNDER_WAY = tuple(f"{PREFIX} {k}" for k in (RESET, REBOOT))
LEVEL_MINUTES = {"quick": 10, "medium": 20, "long": 60, "pair": 30}
# What a diagnose job that passed leaves on its node: the node cannot leave the reservation while
# its own job runs in it, so it drains itself with this reason (no `slurmhealth:` prefix: not one
# of our fault drains, not counted by the breaker) and the next --submit pass returns it. Only a
# node in our reservation with exactly this reason is returned.
PASSED = "diagnose passed (slurmhealth)"
SUBMIT = "submit"
LOST = "lost"
REFUSED = "refused"
RETURN = "return"  # passed: resumed, out of the reservation
RELEASE = "release"  # drained (failed, or by someone else meanwhile): out of the reservation
HOLD = "diagnose-inconclusive"  # nothing ran that could pass it: kept out for an admin


def _drained(info: NodeInfo) -> bool:
    """Out of service with no job on it (DRAINED, not DRAINING or DOWN+DRAIN with jobs)."""
    state = info["state"].lower().rstrip("*~#!%$@^-")
    return state in ("drained", "down", "fail") or (
        slurm.is_out(info) and "drng" not in state and "draining" not in state
    )


def plan(nodes: list, reserved: set, queued: set, named: list) -> list:
    """[(node, what, why)] with what SUBMIT, RETURN, RELEASE, LOST or REFUSED; pure.

    nodes: sinfo rows (core/slurm.parse_sinfo); reserved: the reservation's nodes; queued:
    nodes with a diagnose job pending or running; named: nodes an admin asked for.
    """
    by_name = {n["name"]: n for n in nodes}
    out = []
    for name in sorted(set(by_name) | set(named) | set(reserved)):
        info = by_name.get(name)
        if info is None:
            if name in reserved:
                out.append((name, RELEASE, "no longer a node Slurm knows"))
            elif name in named:
                out.append((name, REFUSED, "not a node Slurm knows"))
            continue
        if name in queued:
            continue
        if name in reserved:
            out.append((name, *_reserved(info)))
        else:
            step = _outside(info, name in named)
            if step:
                out.append((name, *step))
    return out


def _held(info: NodeInfo) -> bool:
    """Drained, down or failed: in our MAINT reservation a node in service shows `maint`, which
    counts as out elsewhere (core/slurm.is_out), not here."""
    return any(f.startswith(("DRAIN", "DOWN", "FAIL")) for f in info["flags"])


def _reserved(info: NodeInfo) -> tuple:
    """What becomes of a node in the reservation whose job is gone."""
    if not _held(info):
        return LOST, "its diagnose job ended without an outcome"
    if info["reason"] == PASSED:
        return RETURN, "passed its diagnosis"
    return RELEASE, info["reason"] or "out of service"


def _outside(info: NodeInfo, named: bool) -> tuple | None:
    ours = slurm.ours(info)
    if ours and info["reason"].startswith(FOR_ADMIN) and not named:
        return None
    if ours and (slurm.rebooting(info) or info["reason"].startswith(UNDER_WAY)):
        # a GPU reset or a reboot of the remediation ladder still to come (node/ladder.py): a
        # diagnosis now would test the node before it; it is due once the reason says so
        return (REFUSED, "remediation under way: diagnosed once it is done") if named else None
    if ours and _drained(info):
        return SUBMIT, info["reason"]
    if not named:
        return None
    if not slurm.is_out(info):
        return SUBMIT, "named by an admin"
    if ours:
        return REFUSED, "still running jobs: diagnosed once they end"
    return REFUSED, f"taken out by someone else: {info['reason'] or info['state']}"


def reservation_nodes(client: slurm.Slurm, name: str) -> set:
    """The reservation's nodes; empty when it does not exist."""
    try:
        text = client.run("-o", "show", "reservation", name)
    except slurm.SlurmError as exc:
        if "not found" in str(exc).lower():
            return set()
        raise
    for token in text.split():
        if token.startswith("Nodes="):
            value = token.partition("=")[2]
            if value in ("", "(null)"):
                return set()
            hosts = client.run("show", "hostnames", value)
            return set(hosts.split())
    return set()


def set_reservation(client: slurm.Slurm, name: str, before: set, nodes: set) -> None:
    """Make the reservation hold exactly `nodes` (created, updated or deleted)."""
    if nodes == before:
        return
    listed = ",".join(slurm.one_node(n) for n in sorted(nodes))  # each one node, never a set
    if not nodes:
        client.run("delete", f"ReservationName={name}")
    elif not before:
        client.run(
            "create",
            f"ReservationName={name}",
            f"Nodes={listed}",
            "Users=root",
            "StartTime=now",
            "Duration=infinite",
            # FLEX: a pair job of the reservation also runs on its peers outside it (pairing.py)
            "Flags=MAINT,IGNORE_JOBS,FLEX",
        )
    else:
        client.run("update", f"ReservationName={name}", f"Nodes={listed}")


def queued_nodes(client: slurm.Slurm) -> set:
    """Nodes with a diagnose job of ours pending or running: where it runs (%N) or the node it
    asked for (%n), hostlists expanded."""
    # --me: only the jobs this account submitted; another user's job of the same name must not
    # keep a node from its diagnosis.
    text = client.run("-h", "--me", "-n", JOB_NAME, "-o", "%N|%n", command="squeue")
    out: set = set()
    for line in text.splitlines():
        for field in line.split("|"):
            try:
                out.update(n for term in split_terms(field.strip()) for n in expand(term))
            except PatternError:
                continue
    return out


def submit(
    client: slurm.Slurm,
    node: str,
    minutes: int,
    reservation: str,
    command: str,
    peers: tuple = (),
) -> str:
    """sbatch one exclusive diagnose job on `node` in the reservation (with `peers`, on them
    too: the pair level, its command run on `node` by srun); the job id."""
    nodes = [slurm.one_node(n) for n in (node, *peers)]
    if peers:
        command = pairing.on_suspect(slurm.find_bin("srun", client.slurm_bin), node, command)
    out = client.run(
        "--parsable",
        f"--job-name={JOB_NAME}",
        f"--reservation={reservation}",
        f"--nodelist={','.join(nodes)}",
        f"--nodes={len(nodes)}",
        "--exclusive",
        f"--time={minutes}",
        "--output=/dev/null",
        f"--wrap={command}",
        command="sbatch",
    )
    return out.strip().split(";")[0]


def job_command(level: str, config_path: str | None) -> str:
    """What the diagnose job runs (sbatch --wrap hands it to /bin/sh): this interpreter and
    fixed words, each quoted; nothing from a node, a job or a user."""
    argv = [sys.executable, "-m", "slurmhealth", "diagnose", "--level", level, "--apply"]
    if config_path:
        argv += ["--config", config_path]
    return " ".join(shlex.quote(a) for a in argv)


def sweep(
    client: slurm.Slurm,
    level: str,
    settings: dict,
    conn: sqlite3.Connection | None,
    named: list,
    command: str,
    minutes: int,
    log: Say,
) -> list:
    """One cron pass: plan, then put nodes in the reservation with their jobs, and drain for
    service those that lost theirs. [{node, what, detail}]. One pass at a time (Busy): a
    second pass planning from the first's half-made reservation released a node it had just
    put there, and the first then resumed it outside any reservation, undiagnosed."""
    lock = _one_pass()
    try:
        name = settings["diag_reservation"]
        nodes = client.nodes()
        reserved = reservation_nodes(client, name)
        queued = queued_nodes(client)
        steps = plan(nodes, reserved, queued, named)
        done: list = []
        released = set()  # out of the reservation this pass
        for node in (n for n, what, _ in steps if what == LOST):
            # Out of service already (the reservation holds it): the drain keeps it out once it
            # leaves, and takes no capacity from users, so it is not the breaker's to refuse.
            message = slurm.reason(f"{SERVICE} diagnose {level}: the job ended without an outcome")
            try:
                if _held(client.node(node)):  # taken out since the plan's sinfo (an admin)
                    done.append({"node": node, "what": "left", "detail": "taken out meanwhile"})
                    released.add(node)
                    continue
                client.drain(node, message)
            except slurm.SlurmError as exc:
                done.append({"node": node, "what": "failed", "detail": f"not drained: {exc}"})
                continue
            _note(conn, node, ACT_DRAIN, message, "lost its diagnose job (time limit or crash)")
            done.append({"node": node, "what": DRAINED, "detail": message})
            released.add(node)
        for node, what, why in steps:
            if what == RETURN:
                # read again just before: since the plan's sinfo (calls of up to 30 s each), an
                # admin may have drained it, and an admin's drain is never lifted
                info = client.node(node)
                if not (_held(info) and info["reason"] == PASSED):
                    got = info["reason"] or info["state"]
                    done.append({"node": node, "what": "left", "detail": f"not returned: {got}"})
                    released.add(node)
                    continue
                client.resume(node)
                _note(conn, node, ACT_RESUME, slurm.reason(f"diagnose {level} passed"), why)
                done.append({"node": node, "what": "returned", "detail": why})
                released.add(node)
            elif what == RELEASE:
                done.append({"node": node, "what": "released", "detail": why})
                released.add(node)
        keep = reserved - released
        todo = [(n, why) for n, what, why in steps if what == SUBMIT]
        todo, peers = _with_peers(client, (level, name), conn, todo, reserved | queued, done)
        wanted = keep | {n for n, _ in todo}
        set_reservation(client, name, reserved, wanted)
        for node, why in todo:
            job = (level, minutes, tuple(peers.get(node, ())))
            done.append(_start(client, node, job, name, command, why, conn, log))
        started = {d["node"] for d in done if d["what"] == ACT_DIAGNOSE}
        set_reservation(client, name, wanted, keep | started)
        done.extend({"node": n, "what": w, "detail": why} for n, w, why in steps if w == REFUSED)
        return done
    finally:
        os.close(lock)


class Busy(Exception):
    """Another `diagnose --submit` pass is running on this host."""


def _one_pass() -> int:
    """An exclusive flock on `<state dir>/diagnose-submit.lock` (root's, never through a
    symlink), or Busy at once."""
    from slurmhealth.core import files  # noqa: PLC0415

    files.private_dir(store.state_dir())
    fd = files.lock(os.path.join(store.state_dir(), "diagnose-submit.lock"), 0.0)
    if fd is None:
        raise Busy("another diagnose --submit pass is running: this one did nothing")
    return fd


def _start(
    client: slurm.Slurm, node: str, job: tuple, name: str, command: str, why: str, conn, log
) -> dict:
    """Resume the node inside the reservation and submit its job (level, minutes, peers); if
    the job cannot be submitted, put our drain back at once."""
    level, minutes, peers = job
    info = client.node(node)
    ours = slurm.ours(info)
    try:
        if ours:
            client.resume(node)
        job_id = submit(client, node, minutes, name, command, peers)
    except slurm.SlurmError as exc:
        if ours:
            try:
                client.drain(node, info["reason"])
            except slurm.SlurmError as again:
                log(f"{node}: could not put its drain back: {again}")
        return {"node": node, "what": "failed", "detail": f"not submitted: {exc}"}
    with_peers = f", with {' and '.join(peers)}" if peers else ""
    detail = f"job {job_id} ({level}, {minutes} min{with_peers}; was: {why})"
    _note(conn, node, ACT_DIAGNOSE, slurm.reason(f"diagnose {level}"), detail)
    return {"node": node, "what": ACT_DIAGNOSE, "detail": detail}


def _with_peers(
    client: slurm.Slurm, asked: tuple, conn: sqlite3.Connection | None, todo: list, busy: set,
    done: list,
) -> tuple:  # fmt: skip
    """(the nodes to submit, {node: its two peers}); asked: (level, reservation). At the pair
    level, each node due with two known-good peers (pairing.plan); one without is left drained
    and out of the reservation, and said in `done` (the next pass tries again); the
    reservation gets the FLEX flag if it lacks it. At other levels, all of them, no peers."""
    level, reservation = asked
    if level != pairing.PAIR or not todo:
        return todo, {}
    peers = pairing.plan(client, conn, [n for n, _ in todo], busy)
    if any(not isinstance(p, str) for p in peers.values()):
        pairing.ensure_flex(client, reservation)
    for node, why in todo:
        if isinstance(peers[node], str):
            detail = f"{peers[node]}; stays out (was: {why})"
            done.append({"node": node, "what": pairing.NO_PEERS, "detail": detail})
    return [(n, why) for n, why in todo if not isinstance(peers[n], str)], peers


def _note(
    conn: sqlite3.Connection | None, node: str, action: str, reason: str, detail: str
) -> None:
    if conn is None:
        return
    try:
        store.record_action(conn, node, action, reason, ACTOR, True, detail)
    except store.StoreError:
        pass


def refuse_mixed(apply: bool, submit: bool, named: str, limit: str | None) -> None:
    """The options of `diagnose` that go with one side only: --apply inside the job on the
    node, --submit, --nodes and --time-limit on the head node. CommandError, a usage error."""
    if apply and submit:
        raise CommandError(
            "--apply runs inside a diagnose job, --submit on the head node", usage=True
        )
    if named and not submit:
        raise CommandError("--nodes goes with --submit", usage=True)
    if limit is not None and not submit:
        raise CommandError("--time-limit goes with --submit", usage=True)


def finisher(console: Console) -> Finish:
    """`diagnose --apply` inside the job: finish with the Slurm the settings name, its lines
    on standard error (node/diag/run.py local calls it)."""

    def finish_run(diagnosis: Diagnosis, settings: dict, conn: sqlite3.Connection | None) -> str:
        client = slurm.Slurm(settings["slurm_bin"], settings["drain_timeout"] * 5)
        say = lambda line: console.err(clean(line, 500))  # noqa: E731
        return finish(client, diagnosis, settings, conn, say)

    return finish_run


def finish(
    client: slurm.Slurm,
    diagnosis: Diagnosis,
    settings: dict,
    conn: sqlite3.Connection | None,
    log: Say,
):
    """Inside the diagnose job, after the `diag` run is recorded: pass -> the node drains itself
    with PASSED (the next --submit pass resumes it and takes it out of the reservation; it
    cannot leave while its own job runs there); fail -> drained for service (breaker and all).
    The outcome, one line."""
    node, level = diagnosis.node, diagnosis.level
    if diagnosis.verdict == "fail":
        message = f"{SERVICE} diagnose {level}: {diagnosis.evidence()}"
        # The node is in our maintenance reservation while its job runs (Slurm shows MAINT once
        # the reservation is active): that does not make it someone else's to keep out.
        journal = Journal(conn, ACTOR, log)
        outcome = actions.drain(client, node, message, settings, journal, ignore=("MAINT",))
        if outcome in (DRAINED, WOULD_DRAIN):
            return f"{outcome} for service"
        return f"{outcome}: stays in the reservation, drained for service by the next pass"
    if diagnosis.inconclusive:
        return _hold(client, node, level, diagnosis.evidence(), conn, log)
    try:
        info = client.node(node)
        if not slurm.may_drain(info, ignore=("MAINT",)):
            # taken out while its job ran (an admin's drain): marking it passed would replace
            # that reason, and the next pass would return the node
            return f"passed; taken out meanwhile ({clean(info['reason'] or info['state'], 80)})"
        client.drain(node, PASSED)
    except slurm.SlurmError as exc:
        log(f"{node}: could not mark its diagnosis passed: {exc}")
        return "passed; not marked (the next pass drains it for service: run it again)"
    # Recorded as a resume in the node's own store: a fault within probation_days of it keeps
    # the node out for an admin (probation), as after any resume of ours.
    _note(conn, node, ACT_RESUME, slurm.reason(f"diagnose {level} passed"), PASSED)
    return "passed: returned by the next diagnose --submit"


def _hold(
    client: slurm.Slurm, node: str, level: str, why: str, conn: sqlite3.Connection | None, log: Say
) -> str:
    """An inconclusive diagnosis (no probe of the level could run): the node stays out for an
    admin with a reason that says so. Not one of our fault drains (no `slurmhealth:` prefix: no
    lemon evidence, not counted by the breaker, never diagnosed again on its own); the next
    --submit pass takes it out of the reservation and never returns it."""
    reason = slurm.reason(f"diagnose {level} inconclusive (slurmhealth): {why}", ours=False)
    try:
        info = client.node(node)
        if not slurm.may_drain(info, ignore=("MAINT",)):
            was = clean(info["reason"] or info["state"], 80)
            return f"inconclusive; taken out meanwhile ({was})"
        client.drain(node, reason)
    except slurm.SlurmError as exc:
        log(f"{node}: could not mark its diagnosis inconclusive: {exc}")
        return "inconclusive; not marked (the next pass drains it for service: run it again)"
    _note(conn, node, HOLD, reason, why)
    return "inconclusive: stays out for an admin (no probe of the level could run)"


# --- `slurmhealth diagnose --submit` (head node, cron) ------------------------------------------


def wanted_nodes(named: str) -> list:
    """--nodes HOSTLIST: the node names it spells, [] when none."""
    try:
        return [n for term in split_terms(named) for n in expand(term)] if named else []
    except PatternError as exc:
        raise CommandError(str(exc), option="--nodes") from None


def job_minutes(level: str, limit: str | None) -> int:
    """--time-limit in minutes (a week at most), else the level's (LEVEL_MINUTES)."""
    if limit is None:
        return LEVEL_MINUTES[level]
    if not limit.isdigit() or not 0 < int(limit) <= 10080:
        raise CommandError("minutes from 1 to 10080", option="--time-limit")
    return int(limit)


def submit_all(
    conn: sqlite3.Connection,
    settings: dict,
    asked: tuple,
    console: Console,
    as_json: bool = False,
) -> int:
    """Diagnose the nodes due as Slurm jobs (sweep); asked: (level, --nodes named, the job's
    minutes, the config file the job reads). The exit status: 3 when the breaker or a hold
    stopped a node, else 0; CommandError with one line when Slurm or the store refuses."""
    import json  # noqa: PLC0415

    level, wanted, minutes, config_path = asked
    client = slurm.Slurm(settings["slurm_bin"], 30.0)
    command = job_command(level, config_path)
    say = lambda line: console.err(clean(line, 500))  # noqa: E731
    try:
        done = sweep(client, level, settings, conn, wanted, command, minutes, say)
    except (slurm.SlurmError, Busy, OSError) as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        console.out(json.dumps(done, indent=1))
    else:
        for line in text.diagnose_submitted(done):
            console.out(line)
    return 3 if any(item["what"] in (BREAKER, HELD) for item in done) else 0
