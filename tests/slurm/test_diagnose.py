"""Validate and return on a real Slurm (docs/diagnose.md): a node drained by a planted fault is
diagnosed by a job in the maintenance reservation, with stand-in probe tools in their real
output formats (tests/fixtures/diag). It returns on pass, is marked for service on fail, stays
out when its job hangs past the time limit; an admin's drain is never touched."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import TESTS, open_fleet, run_cli

from slurmhealth.node.diag import cuda

from .lab import snapshot

DIAG = os.path.join(TESTS, "fixtures", "diag")
PASSING = os.path.join(DIAG, "dcgmi-4.x-r3-pass.json")
FAILING = os.path.join(DIAG, "dcgmi-3.3-r2-fail.json")
RESERVATION = "slurmhealth_diag"


@pytest.fixture
def diag(cluster, tmp_path):
    """The lab with diag tools in tmp_path/tools, our drains returned only by a diagnosis."""
    lab = cluster
    tools = tmp_path / "tools"
    tools.mkdir()
    lab.settings.update(diag_before_resume=True, diag_tools=str(tools))
    lab._write_config()
    lab.tools = tools
    yield lab
    lab.settings.pop("diag_before_resume")
    lab.settings.pop("diag_tools")
    lab._write_config()
    lab.scontrol("delete", f"ReservationName={RESERVATION}", check=False)


def stand_in(lab, body: str) -> None:
    """The node's `dcgmi`: a shell script (ours, fixed text) in the tools directory."""
    path = lab.tools / "dcgmi"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def drained_by_fault(lab, node: str) -> None:
    """Plant a lost GPU, let a job's prolog drain the node, then repair it (the fault gone, the
    drain stays: only a diagnosis returns it now)."""
    lab.set_weight(node, 1)
    lab.sync_health_check(node)
    lab.inject(node, gpu_source=snapshot("gpu-lost"))
    job_id = lab.submit("true", "--gres=gpu:8")
    lab.wait_node(node, lambda n: "DRAIN" in n["state"], what="to be drained")
    lab.wait_job(job_id, timeout=45)
    lab.clear(node)
    lab.set_weight(node, int(node[3:]) * 10)
    lab.sync_health_check(node)
    lab.sync_health_check(node)  # two passing health checks: no resume without a diagnosis
    assert lab.node(node)["reason"].startswith("slurmhealth: ")


def submit(lab, tmp_path, *args: str, fleet: str | None = None):
    """`diagnose --submit` as an admin runs it, on the fleet store `fleet` (a PostgreSQL URL or
    a SQLite file; default a file in tmp_path)."""
    env = lab.client_env(
        {
            "SLURMHEALTH_STATE_DIR": lab.path("state"),
            "SLURMHEALTH_CONFIG": lab.path("etc", "slurmhealth.toml"),
        }
    )
    fleet = fleet or str(tmp_path / "fleet.db")
    return run_cli(
        "diagnose", "--submit", "--level", "quick", "--db", fleet, "--json", *args, env=env
    )


def job_of(proc, node: str) -> str:
    assert proc.returncode == 0, proc.stderr
    steps = {d["node"]: d for d in json.loads(proc.stdout)}
    assert steps[node]["what"] == "diagnose", steps
    return steps[node]["detail"].split()[1]


def reserved(lab) -> str:
    return lab.scontrol("-o", "show", "reservation", RESERVATION, check=False).stdout


def diag_runs(lab, node: str) -> list:
    return lab.query(node, "SELECT * FROM runs WHERE phase = 'diag' ORDER BY started")


def results_of(lab, node: str, run_id: str) -> dict:
    rows = lab.query(node, "SELECT * FROM results WHERE run_id = ?", (run_id,))
    return {r["check_name"]: r for r in rows}


def test_a_repaired_node_returns_after_it_passes(diag, tmp_path):
    lab, node = diag, "gpu02"
    drained_by_fault(lab, node)
    stand_in(lab, f"cat {PASSING}")
    job_id = job_of(submit(lab, tmp_path), node)
    assert f"Nodes={node}" in reserved(lab) or node in reserved(lab)
    assert lab.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
    marked = lab.wait_node(node, lambda n: "DRAIN" in n["state"], what="to be marked passed")
    assert marked["reason"] == "diagnose passed (slurmhealth)"
    again = submit(lab, tmp_path)
    steps = {d["node"]: d for d in json.loads(again.stdout)}
    assert steps[node]["what"] == "returned"
    lab.wait_node(node, lambda n: "DRAIN" not in n["state"], what="to take jobs again")
    assert node not in reserved(lab)
    (run,) = diag_runs(lab, node)
    assert run["verdict"] == "ok"
    results = results_of(lab, node, run["id"])
    assert results["diag.checks"]["status"] == "ok"
    assert results["diag.dcgm"]["status"] == "ok"
    assert json.loads(results["diag.dcgm"]["data"])["level"] == "quick"
    resumes = lab.query(node, "SELECT reason FROM actions WHERE action = 'resume'")
    assert {"reason": "slurmhealth: diagnose quick passed"} in resumes  # probation counts it


def test_a_node_that_fails_its_diagnosis_is_marked_for_service(diag, tmp_path):
    lab, node = diag, "gpu03"
    drained_by_fault(lab, node)
    stand_in(lab, f"cat {FAILING}")
    job_id = job_of(submit(lab, tmp_path), node)
    lab.wait_job(job_id, timeout=60)
    state = lab.wait_node(node, lambda n: "service" in n["reason"], 60, what="to be marked")
    assert state["reason"].startswith("slurmhealth: service: diagnose quick: dcgm:")
    assert "DRAIN" in state["state"]
    (run,) = diag_runs(lab, node)
    assert run["verdict"] == "fail"
    # the next pass takes it out of the reservation, still drained; it is not diagnosed again
    # unless an admin names it (after the repair)
    again = {d["node"]: d for d in json.loads(submit(lab, tmp_path).stdout)}
    assert again[node]["what"] == "released"
    assert node not in reserved(lab) and "DRAIN" in lab.node(node)["state"]
    assert node not in {d["node"] for d in json.loads(submit(lab, tmp_path).stdout)}


def test_a_diagnosis_that_could_run_nothing_never_returns_the_node(diag, tmp_path):
    """No dcgmi in the tools and no CUDA library: the job ends, nothing passed the node, so it
    stays out with a reason that says why, no fault of its own (no `slurmhealth:` prefix: not
    lemon evidence, not counted by the breaker), and is not diagnosed again on its own."""
    lab, node = diag, "gpu01"  # never diagnosed before here: no probation from a return
    drained_by_fault(lab, node)
    job_id = job_of(submit(lab, tmp_path), node)
    done = lab.wait_job(job_id, timeout=60)
    assert (done["JobState"], done["ExitCode"]) == ("FAILED", "4:0")  # diagnose's exit 4
    state = lab.wait_node(node, lambda n: "inconclusive" in n["reason"], 60, what="to be held")
    assert state["reason"].startswith("diagnose quick inconclusive (slurmhealth): dcgm: dcgmi")
    # and what to install for the built-in GPU tests, whole (the reason fits both skips)
    assert state["reason"].endswith(f"; cuda: {cuda.NO_LIBRARY}")
    assert "DRAIN" in state["state"]
    (run,) = diag_runs(lab, node)
    assert run["verdict"] == "warn"
    held = lab.query(node, "SELECT action FROM actions WHERE action = 'diagnose-inconclusive'")
    assert held == [{"action": "diagnose-inconclusive"}]
    again = {d["node"]: d for d in json.loads(submit(lab, tmp_path).stdout)}
    assert again[node]["what"] == "released"
    assert node not in reserved(lab) and "DRAIN" in lab.node(node)["state"]
    assert node not in {d["node"] for d in json.loads(submit(lab, tmp_path).stdout)}
    lab.resume(node)


def test_a_hung_diagnosis_is_killed_at_its_limit_and_the_node_stays_out(diag, tmp_path):
    lab, node = diag, "gpu04"
    drained_by_fault(lab, node)
    stand_in(lab, "sleep 600")
    job_id = job_of(submit(lab, tmp_path, "--time-limit", "1"), node)
    lab.wait_job(job_id, states=("RUNNING",), timeout=30)
    while_running = {d["node"] for d in json.loads(submit(lab, tmp_path).stdout)}
    assert node not in while_running  # its job is queued or running: left alone
    done = lab.wait_job(job_id, timeout=150)
    assert done["JobState"] == "TIMEOUT"
    assert node in reserved(lab)  # out of service all along: the reservation holds it
    proc = submit(lab, tmp_path)
    steps = {d["node"]: d for d in json.loads(proc.stdout)}
    assert steps[node]["what"] == "drained"
    state = lab.node(node)
    assert "DRAIN" in state["state"] and "without an outcome" in state["reason"]
    assert node not in reserved(lab)
    assert diag_runs(lab, node) == []


def test_an_admins_drain_is_never_touched(diag, tmp_path):
    lab, node = diag, "gpu01"
    lab.drain(node, "disk swap ticket 42")
    started = time.time()
    proc = submit(lab, tmp_path, "--nodes", node)
    steps = {d["node"]: d for d in json.loads(proc.stdout)}
    assert steps[node]["what"] == "refused" and "disk swap ticket 42" in steps[node]["detail"]
    state = lab.node(node)
    assert "DRAIN" in state["state"] and state["reason"] == "disk swap ticket 42"
    assert node not in reserved(lab)
    assert [r for r in diag_runs(lab, node) if r["started"] >= started] == []


@pytest.mark.twin
def test_on_a_postgresql_fleet_store_the_diagnosis_is_recorded_there(diag, tmp_path, pg_server):
    """`diagnose --submit` with the fleet store on a PostgreSQL server: the node goes to its
    diagnosis and back, and both steps are in the server's actions table. Last in the module
    on gpu04, whose earlier test ended in a drain for service, not a return: no probation."""
    lab, node, fleet = diag, "gpu04", pg_server.new_database()
    drained_by_fault(lab, node)
    stand_in(lab, f"cat {PASSING}")
    job_id = job_of(submit(lab, tmp_path, fleet=fleet), node)
    assert lab.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
    lab.wait_node(node, lambda n: n["reason"] == "diagnose passed (slurmhealth)",
                  what="to be marked passed")
    steps = {d["node"]: d for d in json.loads(submit(lab, tmp_path, fleet=fleet).stdout)}
    assert steps[node]["what"] == "returned"
    lab.wait_node(node, lambda n: "DRAIN" not in n["state"], what="to take jobs again")
    conn = open_fleet(fleet)
    try:
        rows = conn.execute(
            "SELECT action, reason, actor FROM actions WHERE node = ? ORDER BY time", (node,)
        ).fetchall()
    finally:
        conn.close()
    assert [tuple(r) for r in rows] == [
        ("diagnose", "slurmhealth: diagnose quick", "slurmhealth diagnose"),
        ("resume", "slurmhealth: diagnose quick passed", "slurmhealth diagnose"),
    ]
