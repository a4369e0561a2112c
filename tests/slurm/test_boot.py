"""After a reboot, on a real Slurm (lab.py): slurmd runs the health check at its start, before it
registers with slurmctld (slurm.conf(5), HealthCheckProgram), and Slurm returns the node to
service at that registration. A node that comes back sick is drained then, before any job can
reach it; one whose reboot lifts drains (`scontrol reboot ASAP`) keeps its fault pending for the
next run; with slurmctld not up yet, the health check ends within its deadline and its drain
waits, pending, for the controller.

A "reboot" here: the node's slurmd stops (the machine goes down), slurmctld marks the node as a
real reboot or a silent slurmd leaves it, and slurmd starts again with -b (slurmd(8): it reports
a reboot), as it does when the machine is back up."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest

from slurmhealth.node import config

from .lab import snapshot, xid_message

GPU_LOST_REASON = "slurmhealth: GPU 3 GpuIsLost"
XID_79 = "GPU 0 (0000:18:00) Xid 79 GPU has fallen off the bus"
DEADLINE_S = config.SETTINGS["deadline"][0]


@pytest.fixture
def booting(cluster):
    """The module's lab; every daemon a test stopped runs again afterwards (before the cluster
    fixture puts the nodes back in service)."""
    yield cluster
    cluster.start_stopped()


def actions(lab, node: str, after: float, *kinds: str, count: int = 1) -> list:
    """The node's recorded actions of these kinds since `after`, oldest first, once there are
    `count` (the store is written a moment after Slurm took the drain)."""
    sql = "SELECT * FROM actions WHERE node = ? AND time >= ? ORDER BY time"
    found: list = []

    def enough() -> bool:
        found[:] = [a for a in lab.query(node, sql, (node, after)) if a["action"] in kinds]
        return len(found) >= count

    lab._poll(enough, 20, lambda: f"{count} {'/'.join(kinds)} action(s) on {node} ({found})")
    return found


def go_down(lab, node: str, how: str, *options: str) -> float:
    """The machine goes down: its slurmd stops. "reboot": an admin's `scontrol reboot OPTIONS`,
    which slurmctld marks DOWN+REBOOT_ISSUED (it cannot reach the slurmd to run RebootProgram,
    as once the machine is down); "silent": slurmctld gives up on the slurmd and marks the node
    DOWN "Not responding", as it does after SlurmdTimeout (set here at once: the wait is ~30 s).
    Returns when the machine may be back (boot)."""
    lab.stop_daemon(f"slurmd-{node}")
    if how == "silent":
        lab.scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=Not responding")
        return time.monotonic()
    lab.scontrol("reboot", *options, node)
    lab.wait_node(node, lambda n: "REBOOT_ISSUED" in n["state"], 10, "to be rebooting")
    # slurmctld ends the reboot when the node's boot time (its registration time less its
    # uptime, both in whole seconds) is not before the reboot's: a slurmd started within the
    # same second or so looks booted before it and leaves the node rebooting (ResumeTimeout).
    return time.monotonic() + 2


def boot(lab, node: str, ready: float) -> float:
    """The machine is back (from `ready` on): slurmd starts, reporting a reboot; when."""
    time.sleep(max(0.0, ready - time.monotonic()))
    started = time.time()
    lab.start_slurmd(node, "-b")
    return started


def drained_by_us(node: dict) -> bool:
    return "DRAIN" in node["state"] and node["reason"].startswith("slurmhealth:")


def ctld_log_since(lab, mark: int, line: str) -> str:
    """slurmctld's log from `mark` on, once it has logged `line`."""
    lab._poll(lambda: line in lab.log("slurmctld")[mark:], 20, f"slurmctld to log {line!r}")
    return lab.log("slurmctld")[mark:]


@pytest.mark.parametrize(("how", "sick", "healthy"), [("reboot", "gpu03", "gpu04"),
                                                      ("silent", "gpu02", "gpu04")])  # fmt: skip
def test_a_node_that_boots_sick_is_drained_before_any_job_reaches_it(booting, how, sick, healthy):
    """The health check at slurmd's start drains the sick node (our reason) before slurmd
    registers, so the job waiting for it stays pending; the healthy node returns to service at
    its registration and runs the job waiting for it."""
    lab = booting
    ready = max(go_down(lab, node, how) for node in (sick, healthy))
    lab.inject(sick, gpu_source=snapshot("gpu-lost"))
    waiting = {node: lab.submit("echo $SLURMD_NODENAME", "-w", node) for node in (sick, healthy)}
    mark = len(lab.log("slurmctld"))
    t0 = boot(lab, sick, ready)
    boot(lab, healthy, ready)

    first = lab.wait_runs(sick, "healthcheck", after=t0)[0]  # the one at slurmd's start
    assert first["verdict"] == "fail"
    drained = lab.wait_node(sick, drained_by_us, what="to be drained by us")
    assert drained["reason"] == GPU_LOST_REASON
    (drain,) = actions(lab, sick, t0, "drain")
    assert drain["ok"] and drain["actor"] == "slurmhealth healthcheck"
    # slurmctld took our drain, then the registration: the node never was in service
    log = ctld_log_since(lab, mark, f"node {sick} returned to service")
    ours = log.index(f"update_node: node {sick} reason set to: {GPU_LOST_REASON}")
    assert ours < log.index(f"node {sick} returned to service")

    done = lab.wait_job(waiting[healthy])
    assert done["JobState"] == "COMPLETED"
    assert lab.output(waiting[healthy]).strip() == healthy
    (prolog,) = lab.wait_runs(healthy, "prolog", job_id=waiting[healthy])
    assert prolog["verdict"] == "ok"
    # the scheduler has run since: the sick node's job is still waiting, never started there
    pending = lab.job(waiting[sick])
    assert (pending["JobState"], pending["Restarts"]) == ("PENDING", "0"), pending
    assert lab.runs(sick, "prolog", job_id=waiting[sick]) == []
    assert lab.node(sick)["state"] == "IDLE+DRAIN"


def test_a_fault_met_while_a_reboot_lifts_drains_stays_pending_and_the_next_run_drains(booting):
    """`scontrol reboot ASAP` (or nextstate=RESUME) has Slurm lift the node's DRAIN when it
    registers (scontrol(1)): the health check at slurmd's start does not drain, it keeps the
    fault pending, and the first run after the registration drains. The fault here is a
    kernel-log Xid, read once: kept nowhere else, it would be lost with the node in service."""
    lab = booting
    node = "gpu04"
    lab.kmsg(node)  # a kernel log of its own, read by the runs before the reboot
    lab.sync_health_check(node)
    ready = go_down(lab, node, "reboot", "ASAP")
    lab.append_kmsg(node, xid_message(79))  # logged as the node boots
    mark = len(lab.log("slurmctld"))
    t0 = boot(lab, node, ready)

    first = lab.wait_runs(node, "healthcheck", after=t0)[0]
    assert first["verdict"] == "fail"
    drained = lab.wait_node(node, drained_by_us, what="to be drained by us")
    assert drained["reason"].startswith(f"slurmhealth: {XID_79} (pending since ")
    held, drain = actions(lab, node, t0, "drain-skipped", "drain", count=2)
    assert held["action"] == "drain-skipped" and "NextState=RESUME" in held["detail"]
    assert held["time"] < first["started"] + DEADLINE_S
    assert drain["ok"] and drain["reason"] == drained["reason"]
    ctld_log_since(lab, mark, f"node {node} returned to service")  # in service in between
    later = lab.runs(node, "healthcheck")
    assert len([r for r in later if r["started"] >= t0]) >= 2  # the drain came from a later run


def boot_hold_seconds(slurmd_log: str) -> float:
    """How long slurmd's last start waited for its health check: from `slurmd started` to the
    registration it sends after it (its `CPUs=...` line), both in slurmd's own log."""
    stamps = re.findall(r"^\[([0-9T:.-]+)\] (slurmd started on|CPUs=)", slurmd_log, re.M)
    started = [s for s, what in stamps if what.startswith("slurmd")][-1]
    registering = next(s for s, what in stamps if what == "CPUs=" and s >= started)
    parse = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%f")  # noqa: E731
    return (parse(registering) - parse(started)).total_seconds()


def test_with_slurmctld_not_up_the_boot_health_check_ends_in_time_and_its_drain_waits(booting):
    """The controller is down when the node boots: each Slurm call of the health check gives up
    at settings.drain_timeout (scontrol itself retries for MessageTimeout, 10 s), the fault and
    the drain not made are recorded and kept pending, and slurmd goes on to register. Once
    slurmctld is back, the next run drains."""
    lab = booting
    node = "gpu01"
    lab.kmsg(node)
    lab.sync_health_check(node)
    lab.stop_daemon("slurmctld")
    lab.stop_daemon(f"slurmd-{node}")
    lab.append_kmsg(node, xid_message(79))
    mark = len(lab.log(node))
    t0 = boot(lab, node, time.monotonic())

    (first,) = lab.wait_runs(node, "healthcheck", after=t0, timeout=20)
    assert first["verdict"] == "fail"
    lab._poll(lambda: "CPUs=" in lab.log(node)[mark:], 20, "slurmd to go on after its health check")
    held = boot_hold_seconds(lab.log(node)[mark:])
    print(f"slurmd waited {held:.2f} s for its health check with slurmctld down")
    assert held < DEADLINE_S  # well inside slurmd's 60 s
    (note,) = actions(lab, node, t0, "breaker")
    assert not note["ok"] and note["detail"].startswith("Slurm unreachable")
    with open(lab.path("state", f"{node}.state.json")) as f:
        assert json.load(f)["pending"]["message"] == XID_79

    lab.start_slurmctld()
    drained = lab.wait_node(node, drained_by_us, what="to be drained by us")
    assert drained["reason"].startswith(f"slurmhealth: {XID_79} (pending since ")
    (drain,) = actions(lab, node, t0, "drain")
    assert drain["ok"] and drain["time"] > note["time"]
    with open(lab.path("state", f"{node}.state.json")) as f:
        assert json.load(f).get("pending") is None
