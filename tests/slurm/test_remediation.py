"""The remediation ladder on a real Slurm (lab.py; docs/remediation.md): a fault whose verdict asks
for a reboot drains the node and has slurmctld reboot it (`scontrol reboot`, the lab's
RebootProgram); the node comes back out of service, passing health checks alone do not return
it, a passing diagnosis does; a fault past the attempt limit leaves it drained for service."""

from __future__ import annotations

import os
import time

import pytest
from conftest import TESTS, run_cli

from .lab import HEALTHY, kmsg_record, xid_message

PASSING = os.path.join(TESTS, "fixtures", "diag", "dcgmi-4.x-r3-pass.json")
NODE = "gpu03"
XID_79 = "GPU 0 (0000:18:00) Xid 79 GPU has fallen off the bus"
XID_79_GPU1 = "GPU 1 (0000:2a:00) Xid 79 GPU has fallen off the bus"


@pytest.fixture
def ladder(cluster, tmp_path):
    """The lab with the ladder up to reboots, one remediation per node and window, and a
    passing `dcgmi` for the diagnosis (a stand-in that prints DCGM's real output)."""
    lab = cluster
    tools = tmp_path / "tools"
    tools.mkdir()
    dcgmi = tools / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\ncat {PASSING}\n")
    dcgmi.chmod(0o755)
    tools.chmod(0o755)
    lab.set_settings(remediate="reboot", remediate_max=1, diag_tools=str(tools))
    yield lab
    for key in ("remediate", "remediate_max", "diag_tools"):
        lab.settings.pop(key, None)
    lab._write_config()


def actions(lab, node: str, after: float, *kinds: str, count: int = 1) -> list:
    """The node's recorded actions of these kinds since `after`, oldest first, once there are
    `count` of them."""
    sql = "SELECT * FROM actions WHERE node = ? AND time >= ? ORDER BY time"
    found: list = []

    def enough() -> bool:
        found[:] = [a for a in lab.query(node, sql, (node, after)) if a["action"] in kinds]
        return len(found) >= count

    said = lambda: f"{count} {'/'.join(kinds)} action(s) on {node} ({found}; {lab.node(node)})"  # noqa: E731
    lab._poll(enough, 30, said)
    return found


def passing_health_checks(lab, node: str, count: int) -> None:
    """Wait for `count` more passing health checks of the node."""
    runs = lab.wait_runs(node, "healthcheck", count=count, after=time.time(), timeout=30)
    assert {r["verdict"] for r in runs} == {"ok"}, runs


def boot_log(lab, node: str) -> None:
    """The node's kernel log after its reboot: the new boot's records alone (the lab's kernel
    logs are files, which a reboot does not empty as it does the kernel's ring; numbered on
    from the old ones, as a file has no boot id to tell the boots apart)."""
    path = lab.kmsg(node)
    with open(path) as old:
        last = max(int(line.split(",")[1]) for line in old if line[:1].isdigit())
    with open(HEALTHY["kmsg"]) as healthy:
        records = [line.rstrip("\n").split(";", 1) for line in healthy if ";" in line]
    with open(path, "w") as log:
        for n, (head, text) in enumerate(records, 1):
            log.write(kmsg_record(last + n, text, int(head.split(",")[0])))


def diagnose(lab, node: str):
    env = lab.client_env(
        {
            "SLURMHEALTH_STATE_DIR": lab.path("state"),
            "SLURMHEALTH_CONFIG": lab.path("etc", "slurmhealth.toml"),
        }
    )
    return run_cli("diagnose", "--level", "quick", "--node", node, env=env)


def test_a_reboot_fault_is_rebooted_by_slurm_and_returns_only_after_a_diagnosis(ladder):
    lab, node = ladder, NODE
    lab.kmsg(node)
    lab.sync_health_check(node)
    starts = lab.log(node).count("slurmd started on")
    t0 = time.time()
    lab.append_kmsg(node, xid_message(79))  # the GPU fell off the bus: a reboot's fault

    # drained with the rung in its reason, then the reboot asked of Slurm
    (drain,) = actions(lab, node, t0, "drain")
    assert drain["reason"] == f"slurmhealth: reboot: {XID_79}"
    (asked,) = actions(lab, node, t0, "reboot")
    assert asked["ok"] and asked["reason"] == drain["reason"]
    assert asked["detail"] == "requested: 1 of 1 remediations in 7 d"
    waiting = lab.submit("echo $SLURMD_NODENAME", "-w", node)  # must not run before the return
    # slurmctld reboots it (RebootProgram: slurmd restarts, reporting a reboot); it comes back
    # drained, and the next health check says it awaits a diagnosis
    (done,) = actions(lab, node, t0, "remediated")
    back = lab.node(node)
    assert back["state"] == "IDLE+DRAIN", back
    assert back["reason"] == f"slurmhealth: awaiting diagnosis after a reboot: {XID_79}"
    assert lab.log("slurmctld").count(f"reboot request queued for nodes {node}") == 1
    assert lab.log(node).count("slurmd started on") == starts + 1  # RebootProgram's restart

    passing_health_checks(lab, node, 3)  # resume_after is 2: health checks alone never return it
    assert lab.node(node)["state"] == "IDLE+DRAIN"
    assert lab.job(waiting)["JobState"] == "PENDING"

    boot_log(lab, node)
    proc = diagnose(lab, node)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (resumed,) = actions(lab, node, done["time"], "resume")
    assert resumed["reason"] == f"a diagnosis passed after a reboot: {back['reason']}"
    diag = lab.query(node, "SELECT started, verdict FROM runs WHERE phase = 'diag'")
    assert [d["verdict"] for d in diag] == ["ok"] and diag[0]["started"] < resumed["time"]
    assert lab.wait_job(waiting)["JobState"] == "COMPLETED"
    assert lab.output(waiting).strip() == node
    (prolog,) = lab.wait_runs(node, "prolog", job_id=waiting)
    assert prolog["started"] > resumed["time"]  # no job reached the node before its return

    # a second fault, past the limit of 1 remediation in the window: drained for service
    t1 = time.time()
    lab.append_kmsg(node, xid_message(79, bus="0000:2a:00"))
    (service,) = actions(lab, node, t1, "drain")
    assert service["reason"] == f"slurmhealth: service: {XID_79_GPU1} (1 remediation in 7 d)"
    passing_health_checks(lab, node, 3)
    after = lab.node(node)
    assert (after["state"], after["reason"]) == ("IDLE+DRAIN", service["reason"])
    assert actions(lab, node, t1, "reboot", count=0) == []
    assert lab.log("slurmctld").count(f"reboot request queued for nodes {node}") == 1
