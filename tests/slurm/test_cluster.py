"""On a real Slurm (munge, slurmctld, gpu01-gpu04): the prolog/epilog gate every job, drains are
ours alone, and what happened is in each node's store. See lab.py for the cluster."""

from __future__ import annotations

import os
import pwd
import subprocess
import time

import pytest

from .lab import snapshot

GPU_LOST_REASON = "slurmhealth: GPU 3 GpuIsLost"


def job_row(lab, node: str, job_id: str) -> dict:
    rows = lab.query(node, "SELECT * FROM jobs WHERE node = ? AND job_id = ?", (node, job_id))
    return rows[0] if rows else {}


def wait_job_row(lab, node: str, job_id: str, field: str = "end", timeout: float = 20) -> dict:
    """The jobs row once the epilog has filled `field` (the epilog ends after the job does)."""
    lab.wait_runs(node, "epilog", job_id=str(job_id), timeout=timeout)
    row = job_row(lab, node, job_id)
    assert row.get(field) is not None, f"{node} job {job_id}: {field} not recorded: {row}"
    return row


def actions(lab, node: str, after: float = 0) -> list:
    sql = "SELECT * FROM actions WHERE node = ? AND time >= ? ORDER BY time"
    return lab.query(node, sql, (node, after))


def nodes_of(lab, job_id: str) -> list:
    """The nodes a finished job ran on (its last placement when it was requeued)."""
    text = lab.scontrol("show", "hostnames", lab.job(job_id)["NodeList"]).stdout
    return text.split()


def test_healthy_jobs_run_and_every_node_records_prolog_and_epilog(cluster):
    lab = cluster
    batch = [lab.submit("echo $CUDA_VISIBLE_DEVICES", "--gres=gpu:8") for _ in range(2)]
    step = lab.srun("-N2", "sh", "-c", 'echo "$SLURM_JOB_ID $SLURMD_NODENAME $(hostname)"')
    lines = [line.split() for line in step.stdout.splitlines()]
    srun_job = lines[0][0]
    assert {line[0] for line in lines} == {srun_job}
    assert len({line[1] for line in lines}) == 2, step.stdout  # two nodes, one hostname each
    for job_id in batch:
        assert lab.wait_job(job_id)["JobState"] == "COMPLETED"
        assert lab.output(job_id).strip() == "0,1,2,3,4,5,6,7"  # GRES reached the job
    # srun returns before the epilogs end; a completing job's NodeList shrinks as they do
    assert lab.wait_job(srun_job)["JobState"] == "COMPLETED"

    placed = {job_id: nodes_of(lab, job_id) for job_id in [*batch, srun_job]}
    assert len(placed[srun_job]) == 2
    for job_id, nodes in placed.items():
        for node in nodes:
            (prolog,) = lab.wait_runs(node, "prolog", job_id=job_id)
            (epilog,) = lab.wait_runs(node, "epilog", job_id=job_id)
            assert prolog["verdict"] == epilog["verdict"] == "ok"
            assert prolog["node"] == node
            row = wait_job_row(lab, node, job_id)
            assert (row["uid"], row["user"]) == (0, "root")
            assert row["start"] <= row["end"]
            assert row["exit_code"] == 0


def test_a_fatal_fault_drains_the_node_with_our_reason_and_the_job_runs_elsewhere(cluster):
    lab = cluster
    sick = "gpu03"
    lab.set_weight(sick, 1)  # the scheduler picks the lowest weight first
    # Right after a health check the next one is an interval away: the job's prolog, not the
    # health check, is the first to meet the fault.
    lab.sync_health_check(sick)
    t0 = time.time()
    lab.inject(sick, gpu_source=snapshot("gpu-lost"))
    job_id = lab.submit("echo $SLURMD_NODENAME", "--gres=gpu:8")

    drained = lab.wait_node(sick, lambda n: "DRAIN" in n["state"], what="to be drained")
    assert drained["reason"] == GPU_LOST_REASON

    done = lab.wait_job(job_id, timeout=45)
    assert done["JobState"] == "COMPLETED"
    assert done["Restarts"] == "1"  # requeued once, not held, not cancelled
    healthy = lab.output(job_id).strip()
    assert healthy in lab.names and healthy != sick
    assert nodes_of(lab, job_id) == [healthy]

    (prolog,) = lab.wait_runs(sick, "prolog", job_id=job_id)
    assert prolog["verdict"] == "fail"
    failing = lab.query(
        sick,
        "SELECT check_name, message FROM results WHERE run_id = ? AND status = 'fail'",
        (prolog["id"],),
    )
    assert {"check_name": "gpu.count", "message": "GPU 3 GpuIsLost"} in failing
    drains = [a for a in actions(lab, sick, after=t0) if a["action"] == "drain"]
    assert drains, "no drain recorded in the node store"
    assert "GPU 3 GpuIsLost" in drains[0]["reason"]
    # The job's prolog met the fault (its failed run above, the requeue, the exit below); on a
    # loaded machine the health check may have met it within the same second and drained first.
    assert any(hook in drains[0]["actor"] for hook in ("prolog", "healthcheck")), drains[0]
    assert f"[job {job_id}] prolog failed status=1:0" in lab.log(sick)  # exit 1, not fail-open
    # slurmd reported the failed prolog long ago (the job ran elsewhere since): Slurm's own
    # "Prolog error" did not replace the reason we set first.
    assert lab.node(sick)["reason"] == GPU_LOST_REASON
    assert "Prolog error" not in lab.log("slurmctld")


def test_admin_drains_are_never_touched_and_only_ours_are_resumed(cluster):
    lab = cluster
    admin, ours = "gpu04", "gpu02"
    lab.drain(admin, "admin: fan")
    t0 = time.time()
    for node in (admin, ours):
        lab.inject(node, gpu_source=snapshot("gpu-lost"))
    # A job cannot land on the admin's node, but the health check runs there (NodeState=ANY).
    job_id = lab.submit("true")
    drained = lab.wait_node(ours, lambda n: "DRAIN" in n["state"], what="to be drained")
    assert drained["reason"] == GPU_LOST_REASON
    failing = lab.wait_runs(admin, "healthcheck", count=2, after=t0, verdict="fail")
    assert len(failing) >= 2
    assert lab.node(admin) == {"state": "IDLE+DRAIN", "reason": "admin: fan", "reason_by": "root"}
    assert lab.wait_job(job_id)["JobState"] == "COMPLETED"
    assert admin not in nodes_of(lab, job_id)

    t1 = time.time()
    for node in (admin, ours):
        lab.clear(node)
    lab.wait_node(ours, lambda n: n["state"] == "IDLE", what="to be resumed")
    resumes = [a for a in actions(lab, ours, after=t1) if a["action"] == "resume"]
    assert resumes, "the resume was not recorded"
    passing = lab.wait_runs(
        ours, "healthcheck", count=lab.resume_after, after=t1, verdict="ok", timeout=1
    )
    assert resumes[0]["time"] >= passing[lab.resume_after - 1]["started"]  # not before
    # The admin's node passed as many health checks as ours did, and is still theirs.
    lab.wait_runs(admin, "healthcheck", count=lab.resume_after, after=t1, verdict="ok")
    assert lab.node(admin) == {"state": "IDLE+DRAIN", "reason": "admin: fan", "reason_by": "root"}
    touched = [a for a in actions(lab, admin, after=t0) if a["ok"]]
    assert not [a for a in touched if a["action"] in ("drain", "resume")], touched


def test_a_node_slurm_does_not_know_is_said_so_by_the_real_scontrol(cluster, monkeypatch):
    """A node removed from slurm.conf (a lemon the store still scores): slurmctld answers that
    it has no such node, which is not a controller that did not answer."""
    from slurmhealth.core import slurm

    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    client = slurm.Slurm(timeout=10.0)
    assert client.node("gpu01")["state"]
    with pytest.raises(slurm.UnknownNode, match="gpu77 not found"):
        client.node("gpu77")


def test_epilog_records_exit_codes_and_signals(cluster):
    lab = cluster
    exit3 = lab.submit("exit 3")
    killed = lab.submit("kill -9 $$")
    assert lab.wait_job(exit3)["ExitCode"] == "3:0"
    assert lab.wait_job(killed)["ExitCode"] == "0:9"

    (node,) = nodes_of(lab, exit3)
    row = wait_job_row(lab, node, exit3)
    assert row["exit_code"] == 3
    assert not row["signal"]
    (node,) = nodes_of(lab, killed)
    row = wait_job_row(lab, node, killed, field="signal")
    assert row["signal"] == 9


@pytest.fixture
def user():
    """A real unprivileged account, gone again after the test."""
    name = f"shtest-{os.urandom(3).hex()}"
    subprocess.run(
        ["/usr/sbin/useradd", "--no-create-home", "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["/usr/sbin/userdel", name], check=False, capture_output=True)


def test_a_users_job_is_recorded_with_their_uid_and_name(cluster, user):
    lab = cluster
    job_id = lab.submit("id -u; id -un", user=user.pw_name)
    assert lab.wait_job(job_id)["JobState"] == "COMPLETED"
    assert lab.output(job_id).split() == [str(user.pw_uid), user.pw_name]

    (node,) = nodes_of(lab, job_id)
    (prolog,) = lab.wait_runs(node, "prolog", job_id=job_id)
    assert prolog["verdict"] == "ok"
    row = wait_job_row(lab, node, job_id)
    assert (row["uid"], row["user"]) == (user.pw_uid, user.pw_name)
    assert row["exit_code"] == 0


def test_a_health_check_during_a_gpu_job_leaves_the_node_to_it(cluster):
    """slurmd runs the health check on busy nodes (HealthCheckNodeState=ANY): the job's
    processes on its GPUs must not drain the node under it, and the health checks sample those
    GPUs for the job's figures. Processes still there after the job ended are leftovers: the
    epilog drains the node, and the drain is ours to resume once they are gone."""
    import json

    lab = cluster
    node = "gpu03"
    with open(snapshot("healthy")) as handle:
        doc = json.load(handle)
    for gpu in doc["gpu"]["devices"]:
        pid = 4000 + gpu["index"]
        gpu.update(processes=[{"pid": pid, "used_memory": 1 << 30}], sm_clock=1980, util_gpu=97)
    busy = os.path.join(lab.dir, "busy.json")
    with open(busy, "w") as handle:
        json.dump(doc, handle)
    os.chmod(busy, 0o644)

    job_id = lab.submit("sleep 30", "-w", node)
    lab.wait_job(job_id, ("RUNNING",))
    lab.wait_runs(node, "prolog", job_id=job_id)
    t0 = time.time()
    lab.inject(node, gpu_source=busy)  # the job's processes appear on every GPU
    checks = lab.wait_runs(node, "healthcheck", count=3, after=t0)
    assert all(r["verdict"] == "ok" for r in checks), checks
    assert "DRAIN" not in lab.node(node)["state"]
    lab.scancel(job_id)
    lab.wait_runs(node, "epilog", job_id=job_id, verdict="fail")
    drained = lab.wait_node(node, lambda n: "DRAIN" in n["state"], what="to be drained")
    assert "compute process" in drained["reason"]
    figures = json.loads(job_row(lab, node, job_id)["gpu_energy"])
    counts = {gpu: sampled[0] for gpu, sampled in figures["u"].items()}
    assert len(counts) == 8 and min(counts.values()) >= 3
    assert all(sampled[1:] == [1980, 97.0] for sampled in figures["u"].values())

    lab.clear(node)  # the leftovers gone: our drain is resumed
    lab.wait_node(node, lambda n: n["state"] == "IDLE", timeout=60, what="to be resumed")
