"""The prolog, epilog and health check hooks as slurmd runs them: real processes, real SQLite
files, real filesystems that fill up or go read-only. Slurm itself is the fake scontrol in
tests/fakeslurm here; tests/slurm/ runs the same hooks under a real Slurm."""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import (
    FIXTURES,
    TESTS,
    faults_module,
    planted_bug,
    require_real,
    run_as_nobody,
    run_cli,
    snapshot_path,
    tmpfs,
)

FAKE_SLURM = os.path.join(TESTS, "fakeslurm")
FIXTURES_KMSG = pathlib.Path(FIXTURES) / "kmsg"
REPO = os.path.dirname(TESTS)
IS_ROOT = os.geteuid() == 0


class Node:
    """One fake compute node: config, state dir and scontrol state under tmp_path."""

    def __init__(self, tmp_path, name="gpu01"):
        self.tmp = tmp_path
        self.name = name
        self.state_dir = tmp_path / "state"
        self.config = tmp_path / "slurmhealth.toml"
        self.slurm_state = tmp_path / "slurm.json"
        self.set_slurm("IDLE", "")
        self.configure()

    def configure(self, snapshot="healthy", **settings):
        values = {
            "gpu_source": snapshot_path(snapshot),
            "sysfs_root": os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
            "kmsg": os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
            "slurm_bin": FAKE_SLURM,
            **settings,
        }
        lines = ["[settings]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        self.config.write_text("\n".join(lines) + "\n")

    def set_slurm(self, state, reason, others=()):
        """This node's state, plus `others`: (name, state, reason, since) of other nodes."""
        nodes = {self.name: {"state": state, "reason": reason, "since": time.time()}}
        for name, other_state, other_reason, since in others:
            nodes[name] = {"state": other_state, "reason": other_reason, "since": since}
        self.slurm_state.write_text(json.dumps(nodes))

    def slurm(self):
        node = json.loads(self.slurm_state.read_text())[self.name]
        return {"state": node["state"], "reason": node["reason"]}

    def calls(self):
        path = f"{self.slurm_state}.calls"
        if not os.path.exists(path):
            return []
        with open(path) as handle:
            return [json.loads(line) for line in handle]

    def env(self, job="101", **extra):
        env = {
            "SLURMD_NODENAME": self.name,
            "SLURMHEALTH_CONFIG": str(self.config),
            "SLURMHEALTH_STATE_DIR": str(self.state_dir),
            "FAKE_SLURM_STATE": str(self.slurm_state),
            # only the project: the fake scontrol is another Python, which must not see ours
            "PYTHONPATH": REPO,
        }
        if job:
            env.update(
                SLURM_JOB_ID=job,
                SLURM_JOB_UID="1234",
                SLURM_JOB_USER="alice",
                SLURM_JOB_GPUS="0,1,2,3,4,5,6,7",
            )
        env.update(extra)
        return env

    def run(self, mode, job="101", timeout=60, **extra):
        return self.command(mode, job=job, timeout=timeout, **extra)

    def command(self, *args, job=None, timeout=60, **extra):
        """`slurmhealth ARGS` as slurmd runs it: almost no environment (no PATH, no HOME)."""
        return subprocess.run(
            [sys.executable, "-m", "slurmhealth", *args],
            env=self.env(job, **extra),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def db(self):
        return sqlite3.connect(str(self.state_dir / f"{self.name}.db"))


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_healthy_prolog_exits_0_records_the_job_and_calls_no_slurm_command(node):
    proc = node.run("prolog")
    assert proc.returncode == 0, proc.stderr
    assert node.calls() == []  # no Slurm call on the success path
    db = node.db()
    assert db.execute("SELECT node, job_id, phase, verdict FROM runs").fetchall() == [
        ("gpu01", "101", "prolog", "ok")
    ]
    assert db.execute("SELECT uid, user FROM jobs WHERE job_id = '101'").fetchone() == (
        1234,
        "alice",
    )
    assert db.execute("SELECT count(*) FROM baselines WHERE job_id = '101'").fetchone()[0] >= 3


def test_failing_prolog_drains_with_our_specific_reason_then_exits_1(node):
    node.configure("gpu-lost")
    proc = node.run("prolog")
    assert proc.returncode == 1
    update = [c for c in node.calls() if c[0] == "update"]
    assert update == [
        ["update", "NodeName=gpu01", "State=DRAIN", "Reason=slurmhealth: GPU 3 GpuIsLost"]
    ]
    assert node.slurm() == {"state": "IDLE+DRAIN", "reason": "slurmhealth: GPU 3 GpuIsLost"}
    action = node.db().execute("SELECT action, reason, actor, ok FROM actions").fetchone()
    assert action == ("drain", "slurmhealth: GPU 3 GpuIsLost", "slurmhealth prolog", 1)


def test_an_admins_drain_is_never_overwritten(node):
    node.set_slurm("IDLE+DRAIN", "admin: replace fan")
    node.configure("gpu-lost")
    assert node.run("prolog").returncode == 1
    assert node.slurm()["reason"] == "admin: replace fan"
    assert [c for c in node.calls() if c[0] == "update"] == []
    action = node.db().execute("SELECT action, detail FROM actions").fetchone()
    assert action == ("drain-skipped", "already out: admin: replace fan")


def side_state(node) -> dict:
    path = node.state_dir / f"{node.name}.state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_hung_slurmctld_cannot_hold_the_prolog_and_the_fault_stays_pending(node):
    """No answer from the controller: the breaker cannot count the fleet, so nothing is drained
    (a fleet-wide fault looks just like this), loudly; the fault stays pending in the side
    state, and the first run that can reach Slurm drains the node."""
    node.configure("gpu-lost", drain_timeout=0.5)
    started = time.monotonic()
    proc = node.run("prolog", FAKE_SLURM_HANG="1")
    assert time.monotonic() - started < 5
    assert proc.returncode == 0 and "SLURM UNREACHABLE, NOTHING DRAINED" in proc.stderr
    assert "timed out after 0.5" in proc.stderr  # each call bounded by drain_timeout
    assert node.db().execute("SELECT action, ok FROM actions").fetchone() == ("breaker", 0)
    assert side_state(node)["pending"]["message"] == "GPU 3 GpuIsLost"
    node.configure("healthy", drain_timeout=0.5)  # the GPU is back, the controller answers
    proc = node.run("prolog", job="102")
    assert proc.returncode == 1, proc.stderr  # the pending fault is acted on: refused, drained
    assert node.slurm()["reason"].startswith("slurmhealth: GPU 3 GpuIsLost (pending since")
    assert "pending" not in side_state(node)
    assert node.run("prolog", job="103").returncode == 0  # acted on: nothing pending any more


@pytest.mark.real
def test_real_scontrol_without_a_controller_gives_up_in_time(node, tmp_path):
    if not os.path.exists("/usr/bin/scontrol"):
        require_real("Slurm client not installed (apt-get install slurm-client)")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\n"
        "AuthType=auth/none\nNodeName=gpu01 CPUs=1\nPartitionName=p Nodes=gpu01\n"
    )
    node.configure("gpu-lost", slurm_bin="/usr/bin", drain_timeout=1.0)
    started = time.monotonic()
    proc = node.run("prolog", SLURM_CONF=str(conf))
    assert time.monotonic() - started < 6
    assert proc.returncode == 0 and "SLURM UNREACHABLE, NOTHING DRAINED" in proc.stderr
    assert node.db().execute("SELECT action, ok FROM actions").fetchone() == ("breaker", 0)
    assert side_state(node)["pending"]["message"] == "GPU 3 GpuIsLost"


def test_epilog_records_exit_code_and_signal(node):
    node.run("prolog", job="7")
    assert node.run("epilog", job="7", SLURM_JOB_EXIT_CODE="768").returncode == 0
    node.run("prolog", job="8")
    node.run("epilog", job="8", SLURM_JOB_EXIT_CODE="9")
    rows = node.db().execute(
        "SELECT job_id, exit_code, signal, start < end FROM jobs ORDER BY job_id"
    )
    assert rows.fetchall() == [("7", 3, 0, 1), ("8", 0, 9, 1)]
    assert node.db().execute("SELECT count(*) FROM baselines WHERE job_id != ''").fetchone()[0] == 0


def test_epilog_deltas_are_against_the_jobs_prolog(node, tmp_path):
    node.run("prolog", job="9")
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    doc["gpu"]["devices"][1]["nvlink"][7]["recovery"] = 25
    during = tmp_path / "during.json"
    during.write_text(json.dumps(doc))
    node.configure(gpu_source=str(during))
    proc = node.run("epilog", job="9", SLURM_JOB_EXIT_CODE="0")
    assert proc.returncode == 1
    assert node.slurm()["reason"] == "slurmhealth: GPU 1 (0000:2a:00) link 7 recovery +25"


def with_energy(tmp_path, name: str, joules: dict, below: dict | None = None, busy=None) -> str:
    """The healthy snapshot with NVML's energy counter (field 83, mJ) on some GPUs, their time
    below base clocks (field 81, s) and the SM clock and utilisation of busy ones."""
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    for index, value in joules.items():
        doc["gpu"]["devices"][index]["fields"]["energy_mj"] = int(value * 1000)
    for index, seconds in (below or {}).items():
        doc["gpu"]["devices"][index]["fields"]["below_base_ns"] = int(seconds * 1e9)
    for index, (clock, util) in (busy or {}).items():
        dev = doc["gpu"]["devices"][index]
        dev.update(processes=[{"pid": 4000 + index, "used_memory": 1 << 30}])
        dev.update(sm_clock=clock, util_gpu=util)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_epilog_records_the_energy_each_of_the_jobs_gpus_used_since_its_prolog(node, tmp_path):
    node.configure(gpu_source=with_energy(tmp_path, "start", {2: 5000, 3: 7000, 4: 1000}))
    node.run("prolog", job="31", SLURM_JOB_GPUS="2,3")
    # a health check between them moves the node's baseline, not the job's
    node.configure(gpu_source=with_energy(tmp_path, "mid", {2: 6000, 3: 8000, 4: 2000}))
    assert node.run("healthcheck", job="").returncode == 0
    # GPU 3's counter fell: the driver reloaded during the job, its energy is unknown
    node.configure(gpu_source=with_energy(tmp_path, "end", {2: 9500.5, 3: 10, 4: 9000}))
    assert (
        node.run("epilog", job="31", SLURM_JOB_GPUS="2,3", SLURM_JOB_EXIT_CODE="0").returncode == 0
    )
    (raw,) = node.db().execute("SELECT gpu_energy FROM jobs WHERE job_id = '31'").fetchone()
    energy = json.loads(raw)
    assert energy["j"] == {"2": 4500.5}  # GPU 4 is not the job's
    assert 0 < energy["s"] < 120
    assert set(energy) == {"s", "j"}  # no clock counter, no samples: no such figures
    node.configure()  # no energy counter (an older driver): no figure, nothing else changes
    node.run("prolog", job="32")
    assert node.run("epilog", job="32", SLURM_JOB_EXIT_CODE="0").returncode == 0
    assert node.db().execute("SELECT gpu_energy FROM jobs WHERE job_id = '32'").fetchone() == (
        None,
    )


def test_the_epilog_records_time_below_base_clocks_and_the_health_checks_samples(node, tmp_path):
    """The health checks during the job sample its busy GPUs' SM clock and utilisation; the
    epilog records their means and each GPU's time below base clocks since the prolog."""
    node.run("prolog", job="40", SLURM_JOB_GPUS="2")  # an earlier job on GPU 2, sampled once
    node.configure(gpu_source=with_energy(tmp_path, "before", {}, busy={2: (1000, 5)}))
    assert node.run("healthcheck", job="").returncode == 0
    node.configure()
    node.run("epilog", job="40", SLURM_JOB_GPUS="2", SLURM_JOB_EXIT_CODE="0")
    node.configure(gpu_source=with_energy(tmp_path, "start", {2: 100}, {2: 50, 3: 50}))
    node.run("prolog", job="41", SLURM_JOB_GPUS="2,3")
    for name, clocks in (("mid1", (1980, 98)), ("mid2", (1500, 60))):
        during = {2: clocks, 3: (1980, 99), 5: (1200, 20)}  # GPU 5: another job's
        node.configure(gpu_source=with_energy(tmp_path, name, {2: 200}, {2: 60}, during))
        assert node.run("healthcheck", job="").returncode == 0
    node.configure(gpu_source=with_energy(tmp_path, "end", {2: 400}, {2: 80, 3: 50}))
    proc = node.run("epilog", job="41", SLURM_JOB_GPUS="2,3", SLURM_JOB_EXIT_CODE="0")
    assert proc.returncode == 0, proc.stderr
    (raw,) = node.db().execute("SELECT gpu_energy FROM jobs WHERE job_id = '41'").fetchone()
    figures = json.loads(raw)
    assert figures["j"] == {"2": 300.0}
    assert figures["b"] == {"2": 30.0, "3": 0.0}
    assert figures["u"] == {"2": [2, 1740, 79.0], "3": [2, 1980, 99.0]}
    row = node.db().execute("SELECT below_base FROM jobs WHERE job_id = '41'").fetchone()
    assert row == (min(1.0, 30.0 / figures["s"]),)  # the worst GPU's share, for the sweep


def with_thermal(tmp_path, name: str, seconds: dict) -> str:
    """The healthy snapshot with NVML's thermal-policy counter (field 75, ns) on some GPUs."""
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    for index, value in seconds.items():
        doc["gpu"]["devices"][index]["fields"]["perf_thermal_ns"] = int(value * 1e9)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_epilog_warns_on_the_node_when_a_jobs_gpu_spent_a_large_share_thermally_slowed(
    node, tmp_path
):
    """The prolog keeps the thermal-policy counter of the job's GPUs; the epilog two hours
    later reads half an hour more on GPU 3: a warn on the node naming it, no drain."""
    node.configure(gpu_source=with_thermal(tmp_path, "start", {2: 100, 3: 100}))
    assert node.run("prolog", job="71", SLURM_JOB_GPUS="2,3").returncode == 0
    with node.db() as conn:  # the job began two hours ago
        conn.execute(
            "UPDATE baselines SET data = json_set(data, '$.taken_at', ?) "
            "WHERE job_id = '71' AND area = 'gpu'",
            (time.time() - 7200,),
        )
    node.configure(gpu_source=with_thermal(tmp_path, "end", {2: 160, 3: 1900}))
    proc = node.run("epilog", job="71", SLURM_JOB_GPUS="2,3", SLURM_JOB_EXIT_CODE="0")
    assert proc.returncode == 0, proc.stderr
    assert node.slurm()["state"] == "IDLE"
    (message,) = node.db().execute(
        "SELECT message FROM results WHERE check_name = 'gpu.thermal_share' AND status = 'warn'"
    ).fetchone()
    assert message.startswith("GPU 3 (0000:5d:00) thermally slowed 25% of the job (1800 s of 720")


def test_a_health_check_on_a_node_running_jobs_leaves_their_gpus_processes_alone(node, tmp_path):
    """slurmd runs the health check on busy nodes too (HealthCheckNodeState=ANY): a job's
    processes on its GPUs are not leftovers, and must never drain the node under it. Once no
    job runs, a process left on a GPU is one."""
    busy = with_energy(tmp_path, "busy", {}, busy={0: (1980, 99), 1: (1980, 99)})
    assert node.run("prolog", job="61", SLURM_JOB_GPUS="0,1").returncode == 0
    node.configure(gpu_source=busy)
    assert node.run("healthcheck", job="").returncode == 0
    assert node.slurm()["state"] == "IDLE"
    # a second job on the shared node: its prolog judges its own GPUs, not job 61's
    proc = node.run("prolog", job="62", SLURM_JOB_GPUS="2,3")
    assert proc.returncode == 0, proc.stderr
    node.configure()
    node.run("epilog", job="61", SLURM_JOB_GPUS="0,1", SLURM_JOB_EXIT_CODE="0")
    node.run("epilog", job="62", SLURM_JOB_GPUS="2,3", SLURM_JOB_EXIT_CODE="0")
    node.configure(gpu_source=busy)  # no job runs, yet GPUs 0 and 1 have processes
    assert node.run("healthcheck", job="").returncode == 1
    assert node.slurm()["reason"].startswith("slurmhealth: GPU 0 (0000:18:00) has 1 compute")


# --- a shared node: each job hook judges its own job's GPUs ----------------------------------

GPU0_REASON = "slurmhealth: GPU 0 (0000:18:00) 2 uncorrectable volatile ECC errors"


def patched(tmp_path, name: str, patches: list) -> str:
    """The healthy snapshot with `patches` (tests/fixtures/snapshots/faults.py), as a file."""
    faults = faults_module()
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(faults.apply(faults.build("healthy"), patches)))
    return str(path)


def dbe(*gpus: int) -> list:
    return [("set", f"gpu.devices.{g}.fields.ecc_dbe_volatile", 2) for g in gpus]


def test_a_fault_on_a_gpu_the_job_does_not_hold_drains_the_node_and_the_job_runs(node, tmp_path):
    """Job 71 holds GPUs 4-7; GPU 0 (another job's, or idle) has uncorrectable ECC errors. The
    job runs (exit 0); the node is drained with a reason naming GPU 0, so no further job lands
    on it; the run records the fault as a warning saying whose GPU it is."""
    node.configure(gpu_source=patched(tmp_path, "dbe-gpu0", dbe(0)))
    proc = node.run("prolog", job="71", SLURM_JOB_GPUS="4,5,6,7")
    assert proc.returncode == 0, proc.stderr
    assert node.slurm() == {"state": "IDLE+DRAIN", "reason": GPU0_REASON}
    assert "GPU 0 not the job's: the job runs, the fault drains the node" in proc.stderr
    db = node.db()
    assert db.execute("SELECT phase, verdict FROM runs").fetchall() == [("prolog", "warn")]
    status, data = db.execute(
        "SELECT status, data FROM results WHERE check_name = 'gpu.ecc'"
    ).fetchone()
    scope = {"job_gpus": [4, 5, 6, 7], "other_gpus": [0], "node_verdict": "fail"}
    assert status == "warn" and json.loads(data)["scope"] == scope
    assert db.execute("SELECT state FROM jobs WHERE job_id = '71'").fetchone() == ("running",)
    assert "pending" not in side_state(node)
    ended = node.run("epilog", job="71", SLURM_JOB_GPUS="4,5,6,7", SLURM_JOB_EXIT_CODE="0")
    assert ended.returncode == 0, ended.stderr  # the epilog judges alike: the node is out
    assert db.execute("SELECT state FROM jobs WHERE job_id = '71'").fetchone() == ("ended",)
    # The health check (no job) judges every GPU: the node stays out, for our reason.
    assert node.run("healthcheck", job="").returncode == 1
    assert node.slurm()["reason"] == GPU0_REASON


def test_a_fault_on_the_jobs_own_gpu_refuses_it_naming_that_gpu(node, tmp_path):
    node.configure(gpu_source=patched(tmp_path, "dbe-gpu0", dbe(0)))
    proc = node.run("prolog", job="72", SLURM_JOB_GPUS="0,1,2,3")
    assert proc.returncode == 1
    assert node.slurm()["reason"] == GPU0_REASON
    state = node.db().execute("SELECT state FROM jobs WHERE job_id = '72'").fetchone()
    assert state == ("prolog_failed",)


def test_with_faults_on_its_gpu_and_anothers_the_job_is_refused_for_its_own(node, tmp_path):
    """GPUs 0 and 5 fail: job 73 on GPUs 4-7 is refused, and the reason names GPU 5, its own
    (the run's data keeps what the node as a whole showed)."""
    node.configure(gpu_source=patched(tmp_path, "dbe-gpu0-gpu5", dbe(0, 5)))
    proc = node.run("prolog", job="73", SLURM_JOB_GPUS="4,5,6,7")
    assert proc.returncode == 1
    assert node.slurm()["reason"] == (
        "slurmhealth: GPU 5 (0000:ab:00) 2 uncorrectable volatile ECC errors"
    )
    data = node.db().execute("SELECT data FROM results WHERE check_name = 'gpu.ecc'").fetchone()
    assert json.loads(data[0])["scope"]["node"].endswith("(+1 more)")


def test_an_epilog_resets_or_drains_for_its_own_gpus_only(node, tmp_path):
    """GPU 6 has a row remap pending (a reset applies it). The epilog of a job on GPUs 0-3
    leaves it to the epilog of GPU 6's job: no reset of another job's GPU, no drain."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/smi.log\n')
    smi.chmod(0o755)
    node.configure("remap-pending", reset_gpus=True, nvidia_smi=str(smi))
    other = node.run("epilog", job="5", SLURM_JOB_GPUS="0,1,2,3", SLURM_JOB_EXIT_CODE="0")
    assert other.returncode == 0 and node.slurm()["state"] == "IDLE"
    assert not (tmp_path / "smi.log").exists()
    own = node.run("epilog", job="6", SLURM_JOB_GPUS="6,7", SLURM_JOB_EXIT_CODE="0")
    assert own.returncode == 0 and (tmp_path / "smi.log").read_text() == "-r -i 6\n"


def test_a_fault_that_waits_on_another_jobs_gpu_still_lets_the_next_job_run(node, tmp_path):
    """An Xid is read once. Its drain fails (the controller restarting): the fault stays
    pending with its GPU, and the next prolog of a job on other GPUs carries it as that same
    warning: it drains the node and the job runs. A job on that GPU would be refused."""
    log = tmp_path / "xid.kmsg"
    lines = (FIXTURES_KMSG / "healthy.kmsg").read_text().splitlines()
    last = int(lines[-1].split(",")[1])
    xid = "NVRM: Xid (PCI:0000:18:00): 48, pid=77, name=python3, An uncorrectable double bit error"
    log.write_text("\n".join([*lines, f"3,{last + 1},90000000000,-;{xid}"]) + "\n")
    node.configure("healthy", kmsg=str(log), drain_timeout=2.0)
    first = node.run("prolog", job="81", SLURM_JOB_GPUS="4,5,6,7", FAKE_SLURM_UPDATE_FAILS="1")
    assert first.returncode == 0 and "could not drain gpu01" in first.stderr
    pending = side_state(node)["pending"]
    assert pending["gpus"] == [0] and pending["message"].startswith("GPU 0 (0000:18:00) Xid 48")
    second = node.run("prolog", job="82", SLURM_JOB_GPUS="4,5,6,7")
    assert second.returncode == 0, second.stderr
    assert node.slurm()["reason"].startswith("slurmhealth: GPU 0 (0000:18:00) Xid 48")
    assert "pending since" in node.slurm()["reason"] and "pending" not in side_state(node)
    runs = node.db().execute("SELECT job_id, verdict FROM runs ORDER BY started").fetchall()
    assert runs == [("81", "warn"), ("82", "warn")]


MIG_JOB_GPU = "MIG-5f0c2a71-0000-4000-8000-00000000c101"  # GPU 1's first MIG device (below)


def mig_node(tmp_path, fault: list) -> str:
    """Every GPU in MIG mode with two MIG devices each (GPU instances 1 and 2): GPU g's are
    MIG-5f0c2a71-0000-4000-8000-00000000c<g>0<k>, as the sweep's `mig_devices` records them."""
    faults = faults_module()
    doc = faults.build("healthy")
    for g, dev in enumerate(doc["gpu"]["devices"]):
        dev["mig_current"] = dev["mig_pending"] = 1
        dev["mig_devices"] = [
            {"index": k, "uuid": f"MIG-5f0c2a71-0000-4000-8000-00000000c{g}0{k + 1}",
             "gi": k + 1, "ci": 0}
            for k in range(2)
        ]
    path = tmp_path / "mig.json"
    path.write_text(json.dumps(faults.apply(doc, fault)))
    return str(path)


def test_on_a_mig_node_the_jobs_mig_devices_name_its_gpus(node, tmp_path):
    """With MIG, Slurm's GPU indexes count MIG devices (SLURM_JOB_GPUS=2 is the third MIG
    device, not GPU 2); the MIG device ids slurmd gives the prolog in CUDA_VISIBLE_DEVICES name
    the GPU. A MIG device of GPU 1: the job runs past GPU 0's fault, the node drains."""
    node.configure(gpu_source=mig_node(tmp_path, dbe(0)))
    proc = node.run("prolog", job="91", SLURM_JOB_GPUS="2", CUDA_VISIBLE_DEVICES=MIG_JOB_GPU)
    assert proc.returncode == 0, proc.stderr
    assert node.slurm()["reason"] == GPU0_REASON
    node.set_slurm("IDLE", "")
    # Slurm before driver 470.42.01's MIG UUIDs: MIG-<GPU UUID>/<GPU instance>/<compute instance>
    on_gpu0 = "MIG-GPU-4f1a93c2-5b1e-07a4-9c3d-2f0e81b0c6d4a/2/0"
    proc = node.run("prolog", job="92", SLURM_JOB_GPUS="1", CUDA_VISIBLE_DEVICES=on_gpu0)
    assert proc.returncode == 1
    assert node.slurm()["reason"] == GPU0_REASON


def test_on_a_mig_node_without_mig_device_ids_every_gpu_is_judged_and_the_result_says_why(
    node, tmp_path
):
    node.configure(gpu_source=mig_node(tmp_path, dbe(0)))
    proc = node.run("prolog", job="93", SLURM_JOB_GPUS="2", CUDA_VISIBLE_DEVICES="2")
    assert proc.returncode == 1  # the safe side: GPU 2 may not be the job's GPU
    data = node.db().execute("SELECT data FROM results WHERE check_name = 'gpu.ecc'").fetchone()
    scope = json.loads(data[0])["scope"]
    assert scope["job_gpus"] is None and scope["why"].startswith("MIG mode on")


def test_epilog_drains_a_gpu_needing_reset_unless_resets_are_allowed(node, tmp_path):
    node.configure("remap-pending")
    assert node.run("prolog", job="1").returncode == 0  # a pending remap only warns before a job
    assert node.run("epilog", job="1", SLURM_JOB_EXIT_CODE="0").returncode == 0
    assert (
        node.slurm()["reason"] == "slurmhealth: GPU 6 (0000:ba:00) row remap pending, reset needed"
    )

    node.set_slurm("IDLE", "")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/smi.log\nexit ${{SMI_EXIT:-0}}\n')
    smi.chmod(0o755)
    node.configure("remap-pending", reset_gpus=True, nvidia_smi=str(smi))
    assert node.run("epilog", job="2", SLURM_JOB_EXIT_CODE="0").returncode == 0
    assert (tmp_path / "smi.log").read_text() == "-r -i 6\n"
    assert node.slurm()["reason"] == ""
    node.run("epilog", job="3", SLURM_JOB_EXIT_CODE="0", SMI_EXIT="1")
    assert node.slurm()["reason"].endswith("row remap pending, reset needed")
    resets = node.db().execute("SELECT ok FROM actions WHERE action = 'reset_gpu' ORDER BY time")
    assert [r[0] for r in resets] == [1, 0]


def test_healthcheck_drains_on_fail_and_resumes_only_its_own_drain_after_n_passes(node):
    node.configure("ecc-dbe", resume_after=2)
    assert node.run("healthcheck", job=None).returncode == 1
    assert node.slurm()["reason"].startswith("slurmhealth: GPU 2")
    node.configure("healthy", resume_after=2)
    node.run("healthcheck", job=None)
    assert node.slurm()["state"] == "IDLE+DRAIN"  # one pass is not enough
    node.run("healthcheck", job=None)
    assert node.slurm() == {"state": "IDLE", "reason": ""}
    actions = node.db().execute("SELECT action FROM actions ORDER BY time").fetchall()
    assert [a[0] for a in actions] == ["drain", "resume"]

    node.set_slurm("IDLE+DRAIN", "admin: firmware update")
    for _ in range(3):
        node.run("healthcheck", job=None)
    assert node.slurm()["reason"] == "admin: firmware update"


def test_a_broken_config_with_none_known_to_work_enforces_nothing(node):
    """A new node whose config cannot be read: the built-in defaults, but monitor-only. The
    admin's expectations are unknown, and defaults they never chose (here: live NVML, on a node
    without it) must not drain a cluster's worth of nodes."""
    node.config.write_text("[settings\ngpu_source = ")
    proc = node.run("prolog")
    assert proc.returncode == 0
    assert "config broken and none known to work: built-in defaults, monitor-only" in proc.stderr
    assert [c for c in node.calls() if c[0] == "update"] == []
    assert node.db().execute("SELECT COUNT(*) FROM runs").fetchone() == (1,)  # still recorded


def test_a_broken_config_runs_the_last_one_that_worked(node):
    """Item: an admin's typo (an unknown key) in a config that kept this node monitor-only.
    Built-in defaults would enforce, on expectations nobody wrote; the hook runs the config it
    last read from the same file, loudly, and keeps its promise: nothing enforced."""
    node.configure("gpu-lost", monitor_only=True)
    assert node.run("prolog", job="1").returncode == 0  # read and cached
    node.config.write_text(node.config.read_text() + "monitor_onyl = true\n")
    proc = node.run("prolog", job="2")
    assert proc.returncode == 0
    assert "config broken, running with the last one that worked" in proc.stderr
    assert "unknown key settings.monitor_onyl" in proc.stderr
    assert [c for c in node.calls() if c[0] == "update"] == []
    would = node.db().execute("SELECT COUNT(*) FROM actions WHERE action = 'would-drain'")
    assert would.fetchone() == (2,)  # the GPU snapshot of the last good config, both times


def test_our_own_bug_fails_open(node, tmp_path):
    boom = planted_bug(tmp_path, "slurmhealth.node.runner", "run")
    proc = node.run("prolog", PYTHONPATH=os.pathsep.join([boom, REPO]))
    assert proc.returncode == 0
    assert "internal error, job not gated" in proc.stderr and "RuntimeError: bug" in proc.stderr


def test_our_own_bug_in_the_drain_path_fails_open_and_the_fault_stays_pending(node, tmp_path):
    """A bug in the drain path after a failing verdict: the prolog exits 0, not 1 (slurmd would
    drain the node itself, past the circuit breaker: with a bug every node has, on a fleet-wide
    fault, the whole cluster), and the fault stays pending: the next run drains and refuses."""
    boom = planted_bug(tmp_path, "slurmhealth.node.actions", "drain")
    node.configure("gpu-lost")
    proc = node.run("prolog", PYTHONPATH=os.pathsep.join([boom, REPO]))
    assert proc.returncode == 0
    assert "internal error, job not gated" in proc.stderr and "RuntimeError: bug" in proc.stderr
    assert side_state(node)["pending"]["message"] == "GPU 3 GpuIsLost"
    assert node.slurm()["reason"] == ""
    proc = node.run("prolog", job="2")
    assert proc.returncode == 1 and node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"


def test_a_corrupt_store_is_moved_aside_and_a_new_one_started(node):
    node.state_dir.mkdir()
    path = node.state_dir / "gpu01.db"
    path.write_bytes(b"\x00garbage, not SQLite\xff" * 400)
    node.configure("gpu-lost")
    proc = node.run("prolog")
    assert proc.returncode == 1  # the verdict stands
    assert "store corrupt, moved to" in proc.stderr
    aside = [p for p in os.listdir(node.state_dir) if ".corrupt-" in p]
    assert len(aside) == 1
    assert node.db().execute("SELECT verdict FROM runs").fetchall() == [("fail",)]


@pytest.fixture
def small_fs(tmp_path):
    """A 512 KiB tmpfs: filled up, or remounted read-only, by the test."""
    with tmpfs(tmp_path / "fs", "size=512k") as mount:
        yield mount


def test_a_full_filesystem_keeps_the_verdict_and_logs(node, small_fs):
    node.state_dir = small_fs
    assert node.run("prolog", job="1").returncode == 0  # the store exists
    with open(small_fs / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError:
            pass
    node.configure("gpu-lost")
    proc = node.run("prolog", job="2")
    assert proc.returncode == 1
    assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"
    assert "verdict stands" in proc.stderr and "full" in proc.stderr


def test_a_read_only_store_keeps_the_verdict_and_logs(node, small_fs):
    node.state_dir = small_fs
    assert node.run("prolog", job="1").returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    node.configure("gpu-lost")
    proc = node.run("prolog", job="2")
    assert proc.returncode == 1
    assert "verdict stands" in proc.stderr  # sqlite words it "readonly" or "unable to open"
    assert "unrecorded run on gpu01: fail gpu.count: GPU 3 GpuIsLost" in proc.stderr


def test_64_prologs_at_once_lose_nothing(node):
    node.configure("thermal")  # a warn: every prolog passes and records one result
    env = node.env(job=None)
    procs = []
    for n in range(64):
        job_env = dict(
            env, SLURM_JOB_ID=str(1000 + n), SLURM_JOB_UID="1234", SLURM_JOB_USER="alice"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "slurmhealth", "prolog"],
                env=job_env,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    assert not any("Traceback" in e for e in errors), errors
    # A prolog that waited past its busy timeout (a loaded machine) spooled its run; the next
    # run replays the spool. Either way every one of the 64 lands in the store.
    assert node.run("prolog", job="2000").returncode == 0
    db = node.db()
    burst = "SELECT count(DISTINCT job_id) FROM runs WHERE phase='prolog' AND job_id != '2000'"
    assert db.execute(burst).fetchone()[0] == 64
    # gpu.thermal warns in each; the host areas skip or say their sources are not in the
    # snapshot (it has no host sections): not counted here
    judged = (
        "SELECT count(*) FROM results WHERE status != 'skip'"
        " AND message NOT LIKE '%not in the snapshot%' GROUP BY run_id"
    )
    per_run = db.execute(judged).fetchall()
    assert len(per_run) == 65 and {n for (n,) in per_run} == {1}
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 65


def test_a_job_whose_prolog_failed_here_has_no_exit_status_here(node):
    node.configure("gpu-lost")
    assert node.run("prolog", job="5").returncode == 1
    node.run("epilog", job="5", SLURM_JOB_EXIT_CODE="0")
    row = node.db().execute("SELECT state, exit_code, signal, end IS NOT NULL FROM jobs").fetchone()
    assert row == ("prolog_failed", None, None, 1)


def test_health_checks_on_a_node_out_of_service_record_no_repeated_skips(node):
    node.set_slurm("IDLE+DRAIN", "admin: replace fan")
    node.configure("gpu-lost")
    for _ in range(3):
        node.run("healthcheck", job=None)
    assert node.db().execute("SELECT count(*) FROM actions").fetchone()[0] == 0
    assert node.slurm()["reason"] == "admin: replace fan"


def test_xids_during_the_job_are_attributed_to_the_job_and_gpu(node, tmp_path):
    healthy = os.path.join(FIXTURES, "kmsg", "healthy.kmsg")
    log = tmp_path / "kmsg"
    with open(healthy) as handle:
        log.write_text(handle.read())
    node.configure(kmsg=str(log))
    assert node.run("prolog", job="11", SLURM_JOB_GPUS="2,3").returncode == 0
    with open(log, "a") as handle:  # during the job: an Xid on one of its GPUs, one elsewhere
        handle.write(
            "3,500,99000000,-;NVRM: Xid (PCI:0000:3a:00): 48, pid=77, name=python3, "
            "An uncorrectable double bit error\n"
        )
        handle.write(
            "4,501,99100000,-;NVRM: Xid (PCI:0000:db:00): 13, pid=78, name=other, "
            "Graphics Exception\n"
        )
    proc = node.run("epilog", job="11", SLURM_JOB_GPUS="2,3", SLURM_JOB_EXIT_CODE="35072")
    assert proc.returncode == 1
    assert node.slurm()["reason"].startswith("slurmhealth: GPU 2 (0000:3a:00) Xid 48")
    events = node.db().execute("SELECT code, gpu, job_id, process FROM events ORDER BY code")
    assert events.fetchall() == [(13, 7, None, "other"), (48, 2, "11", "python3")]
    assert node.db().execute("SELECT exit_code FROM jobs").fetchone() == (137,)


def test_the_circuit_breaker_stops_draining_past_its_share_of_the_fleet(node):
    now = time.time()
    fleet = [(f"gpu{n:02d}", "IDLE", "", 0) for n in range(2, 21)]  # 20 nodes in all
    ours = [
        ("gpu02", "IDLE+DRAIN", "slurmhealth: GPU 1 GpuIsLost", now - 600),
        ("gpu03", "IDLE+DRAIN", "slurmhealth: Xid 79", now - 60),
    ]
    node.set_slurm("IDLE", "", others=ours + fleet[2:])
    node.configure("gpu-lost")
    proc = node.run("prolog")
    assert proc.returncode == 0  # open breaker: the job is not blocked, loudly
    assert "CIRCUIT BREAKER OPEN: 2 of 20 nodes drained by slurmhealth" in proc.stderr
    assert node.slurm() == {"state": "IDLE", "reason": ""}
    action = node.db().execute("SELECT action, ok FROM actions").fetchone()
    assert action == ("breaker", 0)
    # The breaker judged it (a fleet-wide fault): recorded, not kept pending, so the node is
    # never drained later for it once the incident is over.
    assert "pending" not in side_state(node)
    # drains older than the window, or an admin's, do not count
    old = [
        ("gpu02", "IDLE+DRAIN", "slurmhealth: GPU 1 GpuIsLost", now - 7200),
        ("gpu03", "IDLE+DRAIN", "admin: fan", now - 60),
    ]
    node.set_slurm("IDLE", "", others=old + fleet[2:])
    assert node.run("prolog").returncode == 1
    assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"


def test_a_node_failing_again_soon_after_our_resume_stays_out_for_an_admin(node):
    node.configure("ecc-dbe", resume_after=1)
    node.run("healthcheck", job=None)  # drained
    node.configure("healthy", resume_after=1)
    node.run("healthcheck", job=None)  # resumed
    assert node.slurm()["state"] == "IDLE"
    node.configure("ecc-dbe", resume_after=1)
    node.run("healthcheck", job=None)  # fails again within the probation period
    reason = node.slurm()["reason"]
    assert reason.startswith("slurmhealth: probation: an admin must resume")
    assert "GPU 2 (0000:3a:00) 2 uncorrectable" in reason
    node.configure("healthy", resume_after=1)
    for _ in range(3):
        node.run("healthcheck", job=None)
    assert node.slurm()["reason"] == reason  # never resumed by us


def test_xids_a_health_check_read_during_the_job_still_go_to_the_job(node, tmp_path):
    log = tmp_path / "kmsg"
    log.write_text((FIXTURES_KMSG / "healthy.kmsg").read_text())
    node.configure(kmsg=str(log))
    node.run("prolog", job="21", SLURM_JOB_GPUS="4")
    with open(log, "a") as handle:
        handle.write(
            "3,600,99000000,-;NVRM: Xid (PCI:0000:9a:00): 63, pid=1, name=x, Row remapping event\n"
        )
    node.run("healthcheck", job=None)  # reads the Xid first, with no job
    node.run("epilog", job="21", SLURM_JOB_GPUS="4", SLURM_JOB_EXIT_CODE="0")
    assert node.db().execute("SELECT code, gpu, job_id FROM events").fetchall() == [(63, 4, "21")]


@pytest.mark.parametrize("mode", ["prolog", "epilog", "healthcheck"])
def test_hook_help_never_acts(node, mode):
    node.configure("gpu-lost")  # a failing node: acting would drain it
    for flag in ("--help", "-h"):
        proc = node.command(mode, flag, job="101")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"Usage: slurmhealth {mode}")
    assert node.calls() == [] and node.slurm()["state"] == "IDLE"
    assert not node.state_dir.exists()  # no store opened, nothing recorded


def test_a_hook_given_arguments_is_a_usage_error_that_acts_not(node):
    node.configure("gpu-lost")
    proc = node.command("prolog", "--bogus", job="101")
    assert proc.returncode == 2 and "takes no arguments" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert node.calls() == [] and not node.state_dir.exists()


def _kmsg_with_xid79(tmp_path) -> str:
    """A kernel log whose last record is Xid 79 on GPU 3 (bus 0000:5d:00 in the snapshots)."""
    path = tmp_path / "xid.kmsg"
    lines = (FIXTURES_KMSG / "healthy.kmsg").read_text().splitlines()
    last = int(lines[-1].split(",")[1])
    xid = "NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus."
    lines.append(f"4,{last + 1},90000000000,-;{xid}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_health_check_drain_that_fails_is_retried_until_it_lands(node, tmp_path):
    """Item: the Xid is read once; the drain fails (controller restarting); the kernel-log
    position moves on, so the fault must live on as pending: the next health check (with no new
    Xid to read) drains the node, and the run after that has nothing pending."""
    node.configure("healthy", kmsg=_kmsg_with_xid79(tmp_path), drain_timeout=2.0)
    first = node.run("healthcheck", job=None, FAKE_SLURM_UPDATE_FAILS="1")
    # not drained: exit 0 (in a prolog, 1 would make slurmd drain the node past the breaker)
    assert first.returncode == 0 and "could not drain gpu01" in first.stderr
    assert "Xid 79" in side_state(node)["pending"]["message"]
    assert node.slurm()["state"] == "IDLE"
    second = node.run("healthcheck", job=None)
    assert second.returncode == 1, second.stderr
    assert "Xid 79" in node.slurm()["reason"] and "pending since" in node.slurm()["reason"]
    assert "pending" not in side_state(node)
    xids = node.db().execute("SELECT count(*) FROM events WHERE code = 79").fetchone()[0]
    assert xids == 1  # read once, recorded once


def test_a_lost_store_does_not_read_the_kernel_log_again(node, tmp_path):
    """Item: the kernel-log position lives in the side state too: a store moved aside (or
    replaced) does not bring back an Xid the admin already handled."""
    node.configure("healthy", kmsg=_kmsg_with_xid79(tmp_path))
    assert node.run("healthcheck", job=None).returncode == 1  # Xid 79 read and drained
    node.set_slurm("IDLE", "")  # the admin replaced the GPU and resumed the node
    for suffix in ("", "-wal", "-shm"):
        db = node.state_dir / f"{node.name}.db{suffix}"
        if db.exists():
            db.rename(str(db) + ".lost")
    proc = node.run("healthcheck", job=None)
    assert proc.returncode == 0, proc.stderr
    assert node.slurm() == {"state": "IDLE", "reason": ""}


def test_a_store_locked_by_another_process_costs_the_prolog_seconds_not_minutes(node):
    """Item: an admin's sqlite3 shell holds the store's write lock. The prolog gives up each
    wait after HOOK_BUSY_S, keeps its verdict (a failing node still drains and exits 1) and
    ends well inside its deadline; the fault is in the side state, not lost."""
    node.configure("gpu-lost")
    node.run("healthcheck", job=None)  # create the store
    node.set_slurm("IDLE", "")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(60)\n",
            str(node.state_dir / f"{node.name}.db"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        proc = node.run("prolog", job="55")
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1, proc.stderr
    assert took < 10  # the default deadline; the busy timeout used to be 30 s per wait
    assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"
    assert "unrecorded run" in proc.stderr or "store unusable" in proc.stderr
    # Nothing recorded is lost: the run waited in the spool, and the next run replays it.
    node.configure("healthy")
    assert node.run("prolog", job="56").returncode == 0
    jobs = [r[0] for r in node.db().execute("SELECT job_id FROM runs WHERE job_id IS NOT NULL")]
    assert sorted(jobs) == ["55", "56"]
    drains = node.db().execute("SELECT reason FROM actions WHERE action = 'drain'").fetchall()
    assert drains[-1] == ("slurmhealth: GPU 3 GpuIsLost",)  # the drain made while locked
    assert not list(node.state_dir.glob("*.unrecorded.ndjson*"))


def test_the_whole_hook_ends_by_its_deadline_whatever_blocks(node, tmp_path):
    """Item: a watchdog ends the hook at settings.deadline, even when something we did not
    bound blocks (here: a planted hang in the store write, before the drain): exit 0, since the
    node is not drained yet (an exit 1 would have slurmd drain it, past the breaker), and the
    fault pending for the next run, which drains and refuses its job."""
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(
        "import time\nimport slurmhealth.core.store as s\n"
        "def slow(*a, **k):\n    time.sleep(60)\n"
        "s.record_run = slow\n"
    )
    node.configure("gpu-lost", deadline=2.0)
    started = time.monotonic()
    proc = node.run("prolog", PYTHONPATH=os.pathsep.join([str(hang), REPO]))
    assert time.monotonic() - started < 8
    assert proc.returncode == 0 and "deadline of 2 s reached" in proc.stderr
    assert side_state(node)["pending"]["message"] == "GPU 3 GpuIsLost"
    # Nothing recorded is lost: the watchdog spooled the run the hung write held, and the next
    # run records it.
    assert "the cut-short run is spooled" in proc.stderr
    node.configure("gpu-lost")
    assert node.run("prolog", job="102").returncode == 1
    runs = node.db().execute("SELECT job_id, verdict FROM runs ORDER BY started").fetchall()
    assert runs == [("101", "fail"), ("102", "fail")]
    assert not list(node.state_dir.glob("*.unrecorded.ndjson*"))


def test_a_replay_cut_short_is_finished_by_a_later_run_and_written_once(node, tmp_path):
    """Item: a run dies in the middle of replaying the spool (its deadline, a kill). The spool
    it took is not lost: a later run takes it once that process is gone, and what the first one
    had already written is not written twice (spooled runs and actions carry their ids)."""
    node.configure("gpu-lost", deadline=2.0)
    node.run("healthcheck", job=None)  # the store exists
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(
        "import time\nimport slurmhealth.core.store as s\nreal = s.record_run\n"
        "def slow(*a, **k):\n    real(*a, **k)\n    time.sleep(60)\n"
        "s.record_run = slow\n"
    )
    # A prolog whose store write lands, then hangs past the deadline: the run is in the store
    # and in the spool.
    proc = node.run("prolog", job="201", PYTHONPATH=os.pathsep.join([str(hang), REPO]))
    assert "the cut-short run is spooled" in proc.stderr
    spool = node.state_dir / f"{node.name}.db.unrecorded.ndjson"
    assert spool.exists()
    # A second run takes the spool and hangs replaying it, before any verdict (exit 0: fail
    # open): the spool it took is left behind, taken, when the watchdog ends it.
    proc = node.run("prolog", job="202", PYTHONPATH=os.pathsep.join([str(hang), REPO]))
    assert proc.returncode == 0 and "no verdict yet" in proc.stderr
    assert not spool.exists() and len(list(node.state_dir.glob("*.taking"))) == 1
    # A spool taken by a process that is still alive (it holds the taken file's lock) is not
    # touched.
    alive = node.state_dir / f"{node.name}.db.unrecorded.ndjson.{'9' * 20}.cccccccc.taking"
    alive.write_text("")
    hold = (
        "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(alive)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        node.configure("healthy")
        # exit 1: the fault 201 saw was never acted on (its drain came after the hang), so it
        # is still pending and this run drains for it
        assert node.run("prolog", job="203").returncode == 1
        assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"
        assert alive.exists()
    finally:
        holder.kill()
        holder.wait()
    alive.unlink()
    jobs = node.db().execute(
        "SELECT job_id, COUNT(*) FROM runs WHERE job_id IS NOT NULL GROUP BY job_id"
    ).fetchall()
    assert jobs == [("201", 1), ("203", 1)]  # 202 never got as far as a verdict
    assert not list(node.state_dir.glob("*.unrecorded.ndjson*"))


def test_monitor_only_records_what_it_would_do_and_enforces_nothing(node, tmp_path):
    prom = tmp_path / "slurmhealth.prom"
    node.configure("gpu-lost", monitor_only=True, metrics_file=str(prom))
    proc = node.run("prolog")
    assert proc.returncode == 0
    assert "monitor-only: would drain gpu01: slurmhealth: GPU 3 GpuIsLost" in proc.stderr
    assert node.slurm() == {"state": "IDLE", "reason": ""} and node.calls() == []
    acts = node.db().execute("SELECT action, reason FROM actions").fetchall()
    assert acts == [("would-drain", "slurmhealth: GPU 3 GpuIsLost")]
    verdict = node.db().execute("SELECT verdict FROM runs").fetchone()[0]
    assert verdict == "fail"  # the verdict is recorded as it is
    assert "pending" not in side_state(node)  # nothing to act on later either
    metrics = prom.read_text()  # node_exporter shows what would have happened
    assert 'slurmhealth_drains_total{node="gpu01",outcome="would_drain"} 1' in metrics
    assert 'slurmhealth_drains_total{node="gpu01",outcome="drained"} 0' in metrics


def test_a_store_read_failing_in_the_drain_path_never_costs_the_drain(node, tmp_path):
    """Item: the drain path reads the node's drain history (probation). A store that cannot be
    read there must not escape into the catch-all (it used to: exit 0, no drain)."""
    boom = planted_bug(tmp_path, "slurmhealth.core.store", "drain_history")
    node.configure("gpu-lost")
    proc = node.run("prolog", PYTHONPATH=os.pathsep.join([boom, REPO]))
    assert proc.returncode == 1, proc.stderr
    assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"
    assert "could not read the node's drain history" in proc.stderr


def test_a_slow_controller_still_gets_the_health_check_drain(node, tmp_path):
    """Item: 0.7 s per Slurm call. Each call is bounded by drain_timeout (2 s), not one 2 s
    budget for the whole sequence (show node, sinfo, update, recount): the drain lands."""
    node.configure("healthy", kmsg=_kmsg_with_xid79(tmp_path))
    proc = node.run("healthcheck", job=None, FAKE_SLURM_DELAY="0.7")
    assert proc.returncode == 1, proc.stderr
    assert "Xid 79" in node.slurm()["reason"]
    assert "pending" not in side_state(node)


def test_without_a_fleet_count_the_breaker_holds_for_every_node(node, tmp_path):
    """Item: 6 of 20 nodes fail at once and sinfo times out (a fleet-wide fault looks like
    this), while scontrol update still works. Nothing may be drained past the breaker's cap:
    with no count, nothing is drained at all; each node keeps its fault pending."""
    failing = [f"gpu{i:02d}" for i in range(1, 7)]
    others = [(f"gpu{i:02d}", "IDLE", "", 0.0) for i in range(2, 21)]
    node.set_slurm("IDLE", "", others=others)
    node.configure("gpu-lost")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "slurmhealth", "healthcheck"],
            env=node.env(
                None,
                SLURMD_NODENAME=name,
                SLURMHEALTH_STATE_DIR=str(tmp_path / name),
                FAKE_SLURM_SINFO_FAILS="1",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in failing
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    states = json.loads(node.slurm_state.read_text())
    assert [n for n, s in states.items() if "DRAIN" in s["state"]] == []
    assert all("SLURM UNREACHABLE, NOTHING DRAINED" in e for e in errors), errors
    for name in failing:
        side = json.loads((tmp_path / name / f"{name}.state.json").read_text())
        assert side["pending"]["message"] == "GPU 3 GpuIsLost"


def test_an_out_of_range_value_never_drains_and_is_logged_once(node):
    """Item: `deadline = 0` passed validation and then cut every run short. Now the hook runs
    with the key's default, says so once on stderr (slurmd's log), gates nothing and records."""
    node.configure(deadline=0)
    proc = node.run("prolog")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("settings.deadline: must be > 0") == 1, proc.stderr
    assert [c for c in node.calls() if c[0] == "update"] == []
    runs = node.db().execute("SELECT node, job_id, phase, verdict FROM runs").fetchall()
    assert runs == [("gpu01", "101", "prolog", "ok")]


def test_check_with_an_out_of_range_value_is_a_config_error_on_one_line(node):
    node.configure(breaker_share=1.5, resume_after=-1)
    proc = node.command("check", "--no-db", "--config", str(node.config))
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "settings.breaker_share: must be a share" in lines[0]
    assert "(+1 more problem)" in lines[0]


@pytest.mark.parametrize("mode", [0o666, 0o664])
def test_a_config_others_could_write_is_refused_loudly_and_never_drains(node, mode):
    """Item: a group- or world-writable config (root-owned) could point the hook at a snapshot
    that fails every node, or at another nvidia-smi: it is refused, the hook runs with built-in
    defaults, loudly."""
    node.configure("gpu-lost")
    os.chmod(node.config, mode)
    proc = node.run("prolog")
    assert proc.returncode == 0
    assert "not trusted" in proc.stderr and "writable" in proc.stderr
    assert node.calls() == []
    check = node.command("check", "--no-db", "--config", str(node.config))
    assert check.returncode == 2 and "not trusted" in check.stderr


def test_the_same_fatal_xid_on_the_same_gpu_again_calls_for_service_from_the_store(node, tmp_path):
    """Class 3, remember: the store holds the Xid 79 an earlier health check read (and
    drained for); the node came back (resumed) and the GPU fell off the bus again. The run
    reads that history from the store (one indexed read) and escalates the reboot to service.
    `check --no-db` has no history: the same log is a plain Xid 79."""
    log = _kmsg_with_xid79(tmp_path)
    node.configure("healthy", kmsg=log)
    assert node.run("healthcheck", job=None).returncode == 1
    assert node.slurm()["reason"].startswith("slurmhealth: GPU 3 (0000:5d:00) Xid 79")
    node.set_slurm("IDLE", "")  # rebooted and resumed by the admin
    last = int(pathlib.Path(log).read_text().splitlines()[-1].split(",")[1])
    with open(log, "a") as handle:
        handle.write(
            f"4,{last + 1},95000000000,-;NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off "
            "the bus.\n"
        )
    proc = node.run("healthcheck", job=None)
    assert proc.returncode == 1, proc.stderr
    assert node.slurm()["reason"].startswith(
        "slurmhealth: service: again: Xid 79 on GPU 3 (0000:5d:00), 2nd time in 7 days"
    )
    actions = node.db().execute(
        "SELECT action FROM results WHERE check_name = 'xid.hardware' ORDER BY rowid"
    )
    assert [a for (a,) in actions] == ["reboot", "service"]
    events = node.db().execute("SELECT code, gpu, class, action FROM events ORDER BY time")
    assert events.fetchall() == [(79, 3, "fail", "reboot"), (79, 3, "fail", "service")]

    args = ["check", "--json", "--only", "xid", "--gpu-source", snapshot_path("healthy")]
    no_db = json.loads(node.command(*args, "--kmsg", log, "--no-db").stdout)
    hardware = [r for r in no_db["results"] if r["check"] == "xid.hardware"][0]
    assert "again" not in hardware["message"] and hardware["action"] == "reboot"
    with open(log, "a") as handle:  # and a third time, read by `check` with the store
        handle.write(
            f"4,{last + 2},96000000000,-;NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off "
            "the bus.\n"
        )
    db = str(node.state_dir / f"{node.name}.db")
    with_db = json.loads(node.command(*args, "--kmsg", log, "--db", db, "--record").stdout)
    hardware = [r for r in with_db["results"] if r["check"] == "xid.hardware"][0]
    assert hardware["action"] == "service" and "3rd time in 7 days" in hardware["message"]


def test_xid_13_on_one_unit_in_three_jobs_warns_for_service_from_the_store(node, tmp_path):
    """The driver's Xid 13 as nodes print it (tests/fixtures/kmsg/xid13-unit.dmesg-T, modelled
    on a published capture): no pid, three lines an incident, two of them naming GPC 7 TPC 7.
    Three jobs in a row each meet one such incident on GPU 3, read by their epilogs: the first
    two are the application's; at the third the store's memory of the others (their runs, their
    jobs) makes it a hardware suspicion: a warn with service as the hint, never a drain."""
    lines = (FIXTURES_KMSG / "xid13-unit.dmesg-T").read_text().splitlines()
    incident = [line.split("] ", 1)[1] for line in lines if "): 13, " in line]
    log = tmp_path / "xid13.kmsg"
    records = (FIXTURES_KMSG / "healthy.kmsg").read_text().splitlines()
    log.write_text("\n".join(records) + "\n")
    seq = int(records[-1].split(",")[1])
    node.configure("healthy", kmsg=str(log))
    verdicts = []
    for job in ("81", "82", "83"):
        assert node.run("prolog", job=job).returncode == 0
        with open(log, "a") as handle:
            for message in incident:
                seq += 1
                handle.write(f"4,{seq},{90_000_000_000 + seq * 1_000_000},-;{message}\n")
        proc = node.run("epilog", job=job, SLURM_JOB_EXIT_CODE="0")
        assert proc.returncode == 0, proc.stderr
        verdicts.append(node.db().execute(
            "SELECT verdict FROM runs WHERE job_id = ? AND phase = 'epilog'", (job,)
        ).fetchone()[0])
    assert verdicts == ["ok", "ok", "warn"]
    (status, action, message), = node.db().execute(
        "SELECT status, action, message FROM results WHERE check_name = 'xid.hardware'"
    ).fetchall()
    assert (status, action) == ("warn", "service")
    assert message.startswith(
        "again: Xid 13 on GPU 3 (0000:5d:00) GPC 7 TPC 7, 3 jobs in 7 days: suspect the GPU"
    )
    assert node.slurm() == {"state": "IDLE", "reason": ""}
    jobs = node.db().execute("SELECT DISTINCT job_id FROM events WHERE code = 13 ORDER BY 1")
    assert [j for (j,) in jobs] == ["81", "82", "83"]


def test_a_drain_for_service_is_never_lifted_by_passing_health_checks(node):
    """A check that says the hardware needs service (here: a missing HCA) drains with
    `slurmhealth: service: ...`; the health checks that pass afterwards (the HCA is back after
    a reboot) never resume it: an admin does, after the service."""
    node.configure("healthy", sysfs_root=os.path.join(FIXTURES, "sysfs", "missing-hca"))
    hcas = ", ".join(f'"mlx5_{i}"' for i in range(8))
    node.config.write_text(node.config.read_text() + f"\n[ib]\ndevices = [{hcas}]\n")
    proc = node.run("healthcheck", job=None)
    assert proc.returncode == 1, proc.stderr
    assert node.slurm()["reason"].startswith("slurmhealth: service: ")
    node.configure("healthy")
    for _ in range(4):
        assert node.run("healthcheck", job=None).returncode == 0
    assert node.slurm()["reason"].startswith("slurmhealth: service: ")  # still out


def test_a_damaged_spool_entry_is_dropped_and_never_stops_the_gating(node):
    """Item: a spool line that is JSON but not a run of ours (a bad disk, a hand edit) used to
    make every hook after it an internal error: the job not gated, on every run, for good."""
    node.configure("gpu-lost")
    node.run("healthcheck", job=None)  # the store exists
    node.set_slurm("IDLE", "")
    spool = node.state_dir / f"{node.name}.db.unrecorded.ndjson"
    spool.write_text('{"records": {"run": "x"}}\n{"records": {"run": 5}}\n{"action": [1]}\n')
    spool.chmod(0o600)
    proc = node.run("prolog", job="7")
    assert proc.returncode == 1, proc.stderr  # gated: the sick node refuses the job
    assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"
    assert proc.stderr.count("dropped a damaged spooled entry") == 3, proc.stderr
    assert "internal error" not in proc.stderr
    assert not spool.exists()


def test_a_snapshot_the_config_names_that_cannot_be_read_errors_its_sources_only(node, tmp_path):
    """Item: settings.gpu_source names a file that is gone. The hook used to stop with a
    traceback (the job not gated, the kernel log unread); now the GPU source is an error (our
    config, not the node's fault) and the kernel log it was given still gates the job."""
    kmsg = tmp_path / "xid79.kmsg"
    kmsg.write_text("3,1,100,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")
    node.configure("healthy", gpu_source=str(tmp_path / "gone.json"), kmsg=str(kmsg))
    proc = node.run("prolog")
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == 1 and "Xid 79" in node.slurm()["reason"]
    rows = node.db().execute("SELECT check_name, status FROM results").fetchall()
    assert ("gpu.count", "error") in rows


def test_numbers_past_what_a_store_holds_from_slurmd_are_unknown_not_a_crash(node):
    proc = node.run("prolog", SLURM_JOB_UID="9" * 30, SLURM_JOB_NUM_NODES="²")
    assert proc.returncode == 0 and "internal error" not in proc.stderr, proc.stderr
    assert node.db().execute("SELECT uid, num_nodes FROM jobs").fetchall() == [(None, None)]


def test_a_run_spooled_without_any_store_carries_its_id(tmp_path):
    """A run spooled because no store could be opened at all carries its id like one the store
    refused, so a replay cut short and taken again records it once."""
    from slurmhealth.core import store
    from slurmhealth.node import agent, config, runner, state

    run = runner.run(
        "gpu01", config.defaults(), runner.Options(gpu_source=snapshot_path("healthy")), ["gpu"]
    )
    path = str(tmp_path / "gpu01.db")
    agent.record(None, run, "check", path=path)
    entries, taken = state.take_spool(agent.spool_for(path))
    ids = [e["records"]["run"]["id"] for e in entries]
    assert len(ids) == 1 and len(ids[0]) == 24
    conn = store.connect(path)
    for _ in range(2):  # replayed twice: one run
        store.record_run(conn, entries[0]["records"])
    assert conn.execute("SELECT id FROM runs").fetchall() == [(ids[0],)]
    state.finish(taken)


def test_a_prolog_whose_drain_fails_exits_0_and_the_next_one_drains(node):
    """`scontrol update` failing (a controller restarting): exit 1 would make slurmd drain the
    node itself with "Prolog error", on every node at once, past the circuit breaker, and the
    fault would then be "already out" and forgotten. So the prolog exits 0 with the fault
    pending, and the next run drains with our reason and refuses its job."""
    node.configure("gpu-lost", drain_timeout=2.0)
    first = node.run("prolog", job="1", FAKE_SLURM_UPDATE_FAILS="1")
    assert first.returncode == 0 and "could not drain gpu01" in first.stderr
    assert side_state(node)["pending"]["message"] == "GPU 3 GpuIsLost"
    assert node.slurm()["state"] == "IDLE"
    second = node.run("prolog", job="2")
    assert second.returncode == 1
    assert node.slurm()["reason"].startswith("slurmhealth: GPU 3 GpuIsLost")
    assert "pending" not in side_state(node)


# --- `check` run by a user who is not root, and what it is told --------------------------------


def _user_check(public_dir, *args):
    """`check` replaying the healthy snapshot, as nobody, with a root-only (0600) kernel log
    and a root-only (0700) state directory holding nothing yet: (process, state dir)."""
    kmsg = public_dir / "kmsg"
    kmsg.write_text((FIXTURES_KMSG / "healthy.kmsg").read_text())
    kmsg.chmod(0o600)
    state = public_dir / "state"
    state.mkdir(mode=0o700)
    snapshot = ("--gpu-source", snapshot_path("healthy"), "--kmsg", str(kmsg))
    env = {"SLURMHEALTH_STATE_DIR": str(state), "SLURMD_NODENAME": "gpu01"}
    return run_as_nobody("check", *snapshot, *args, env=env), state


def test_a_user_check_names_the_kernel_log_it_could_not_read_and_exits_4(public_dir):
    """Not root: the verdict is no plain `ok` and the exit status no 0; the store, root's, is
    said once and left untouched."""
    proc, state = _user_check(public_dir, "--record", "-q")
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("node gpu01: ok, incomplete: kmsg not read (")
    said = proc.stderr.splitlines()
    reads = [line for line in said if line.startswith("slurmhealth check: kmsg: ")]
    assert reads == [
        f"slurmhealth check: kmsg: cannot read the kernel log (Permission denied): "
        f"{public_dir}/kmsg: the xid, mce, aer checks did not run, the answer is incomplete"
    ]
    stored = [line for line in said if "not recorded" in line]
    assert stored == [
        f"slurmhealth check: cannot write {state} (permission denied): this run is not recorded "
        "(the node's store is root's; --no-db keeps none)"
    ]
    assert len(said) == 2 and "Traceback" not in proc.stderr
    assert os.listdir(state) == []


def test_a_user_check_says_incomplete_in_json_and_a_failure_still_exits_1(public_dir):
    proc, _ = _user_check(public_dir, "--no-db", "--json")
    assert proc.returncode == 4, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "ok"
    assert doc["incomplete"] == [
        {
            "source": "kmsg",
            "message": f"cannot read the kernel log (Permission denied): {public_dir}/kmsg",
            "areas": ["xid", "mce", "aer"],
        }
    ]
    xid = [r for r in doc["results"] if r["check"].startswith("xid.")]
    assert {r["status"] for r in xid} == {"skip"}
    kmsg = ("--kmsg", str(public_dir / "kmsg"))
    lost = run_as_nobody("check", "--no-db", "--gpu-source", snapshot_path("gpu-lost"), *kmsg)
    assert lost.returncode == 1  # a failing check is the answer, read or not
    root = run_cli("check", "--no-db", "--json", "--gpu-source", snapshot_path("healthy"), *kmsg)
    assert root.returncode == 0 and json.loads(root.stdout)["incomplete"] == []  # root reads it


def test_a_user_snapshot_says_what_it_could_not_read_and_exits_4(public_dir):
    """A snapshot taken by a user lacks the kernel log: it is still written, but said on stderr
    and exit 4, never a quiet 0 (replayed, it would judge no Xid at all)."""
    kmsg = public_dir / "kmsg"
    kmsg.write_text((FIXTURES_KMSG / "healthy.kmsg").read_text())
    kmsg.chmod(0o600)
    sysfs = public_dir / "sys"
    sysfs.mkdir()
    out = public_dir / "out"
    out.mkdir()
    out.chmod(0o777)
    args = ("--gpu-source", snapshot_path("healthy"), "--sysfs-root", str(sysfs))
    args = (*args, "--kmsg", str(kmsg))
    proc = run_as_nobody("snapshot", *args, "-o", str(out / "snap.json"))
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr == (
        f"slurmhealth snapshot: kmsg: cannot read the kernel log (Permission denied): {kmsg}: "
        "the snapshot lacks it (the xid, mce, aer checks), the answer is incomplete\n"
    )
    doc = json.loads((out / "snap.json").read_text())
    assert doc["sources"]["kmsg"]["status"] == "unavailable" and doc["gpu"] is not None
    root = run_cli("snapshot", *args, "-o", "-")
    assert root.returncode == 0 and root.stderr == "", root.stderr  # root reads it
    assert json.loads(root.stdout)["sources"]["kmsg"]["status"] == "ok"


def test_a_user_check_of_the_live_kernel_log_names_dmesg_restrict_where_it_is_the_cause(
    public_dir,
):
    """The live /dev/kmsg, as nobody: where the kernel restricts it (kernel.dmesg_restrict=1)
    the line says so, the cause an admin can act on; where it does not, nobody reads it."""
    env = {"SLURMD_NODENAME": "gpu01"}
    proc = run_as_nobody("check", "--no-db", "--only", "xid", "-q", env=env)
    with open("/proc/sys/kernel/dmesg_restrict") as handle:
        restricted = handle.read().strip() == "1"
    if restricted and os.path.exists("/dev/kmsg"):
        assert proc.returncode == 4, proc.stderr
        assert proc.stderr == (
            "slurmhealth check: kmsg: cannot read the kernel log (Operation not permitted): "
            "/dev/kmsg (kernel.dmesg_restrict=1: only root may read it): the xid, mce, aer checks "
            "did not run, the answer is incomplete\n"
        )
    else:  # readable, or no kernel log here at all (a container): nothing is incomplete
        assert "incomplete" not in proc.stdout + proc.stderr, proc.stderr
        assert proc.returncode in (0, 1), proc.stderr


def test_a_prolog_that_cannot_read_its_kernel_log_skips_the_xid_checks_and_gates_nothing(node):
    """The hooks keep their semantics: root cannot be refused the file, so the kernel log here
    is a directory (EISDIR on read): the xid checks skip and the job runs, undrained."""
    unreadable = node.tmp / "kmsg-dir"
    unreadable.mkdir()
    node.configure(kmsg=str(unreadable))
    proc = node.run("prolog")
    assert proc.returncode == 0, proc.stderr
    xid = "SELECT DISTINCT status FROM results WHERE check_name LIKE 'xid.%'"
    assert node.db().execute(xid).fetchall() == [("skip",)]
    assert node.calls() == [] and node.slurm()["state"] == "IDLE"


def test_check_db_in_a_missing_directory_is_a_usage_error_that_creates_nothing(tmp_path):
    missing = tmp_path / "missing" / "dir"
    healthy = snapshot_path("healthy")
    proc = run_cli("check", "--gpu-source", healthy, "--record", "--db", str(missing / "x.db"))
    assert proc.returncode == 2
    assert proc.stderr == (
        f"slurmhealth: error: --db {missing}/x.db: no such directory: {missing}\n"
    )
    assert not (tmp_path / "missing").exists()


def test_check_db_from_the_environment_in_a_missing_directory_creates_nothing(tmp_path):
    """$SLURMHEALTH_DB is --db's other spelling: a typo in it is the same usage error."""
    missing = tmp_path / "missing" / "dir"
    healthy = snapshot_path("healthy")
    env = {"SLURMHEALTH_DB": str(missing / "x.db")}
    proc = run_cli("check", "--gpu-source", healthy, "--record", env=env)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"slurmhealth: error: $SLURMHEALTH_DB {missing}/x.db: no such directory: {missing}\n"
    )
    assert not (tmp_path / "missing").exists()
    proc = run_cli("check", "--gpu-source", healthy, "--no-db", env=env)  # no store: no error
    assert proc.returncode == 0, proc.stderr


def test_check_suggests_the_option_meant():
    for typo, said in (
        ("--jsn", "no such option: --jsn (did you mean --json?)"),
        ("--kmgs", "no such option: --kmgs (did you mean --kmsg?)"),
        ("--bogus", "no such option: --bogus"),
    ):
        proc = run_cli("check", typo)
        assert proc.returncode == 2
        assert proc.stderr == f"slurmhealth: error: {said}\n"


def test_a_node_name_with_a_quote_and_a_newline_is_one_line_and_exit_2(node):
    """slurmd's SLURMD_NODENAME names the store's file: one that is no node's name is said on
    one line, exit 2 (the packaged hook logs that status and lets the job run), nothing made."""
    bad = 'gpu"01\nrm'
    for args in (("check", "--gpu-source", snapshot_path("healthy")), ("prolog",)):
        proc = node.command(*args, job="7", SLURMD_NODENAME=bad)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert "not a node name: 'gpu\"01\\nrm'" in line and "Traceback" not in line
    assert not node.state_dir.exists()


# --- the remediation ladder (node/ladder.py; each step in-process: test_ladder.py) -------------

GPU_LOST_REBOOT = "slurmhealth: reboot: GPU 3 GpuIsLost"


def ladder_calls(node) -> list:
    return [c for c in node.calls() if c[0] in ("update", "reboot")]


def test_a_reboot_fault_drains_then_asks_slurm_to_reboot_where_the_site_lets_it(node):
    node.configure("gpu-lost")  # remediate = "off", the default: drained as ever
    assert node.run("prolog").returncode == 1
    assert [c[0] for c in ladder_calls(node)] == ["update"]
    node.set_slurm("IDLE", "")
    os.remove(f"{node.slurm_state}.calls")
    node.configure("gpu-lost", remediate="reboot")
    assert node.run("prolog", job="102").returncode == 1
    assert ladder_calls(node) == [
        ["update", "NodeName=gpu01", "State=DRAIN", f"Reason={GPU_LOST_REBOOT}"],
        ["reboot", f"reason={GPU_LOST_REBOOT}", "gpu01"],
    ]
    assert node.slurm() == {"state": "IDLE+DRAIN+REBOOT_REQUESTED", "reason": GPU_LOST_REBOOT}
    rows = node.db().execute(
        "SELECT action, reason, ok, detail FROM actions WHERE time > (SELECT max(time) FROM "
        "actions WHERE action = 'drain' AND reason NOT LIKE '%reboot%') ORDER BY time"
    )
    assert rows.fetchall() == [
        ("drain", GPU_LOST_REBOOT, 1, ""),
        ("reboot", GPU_LOST_REBOOT, 1, "requested: 1 of 2 remediations in 7 d"),
    ]
    # the runs while Slurm waits for the node's jobs to end ask for nothing more
    assert node.run("healthcheck", job=None).returncode == 1
    assert [c[0] for c in ladder_calls(node)] == ["update", "reboot"]


def test_a_reboot_slurm_refuses_leaves_the_node_drained_for_the_next_run_to_ask_again(node):
    node.configure("gpu-lost", remediate="reboot")
    proc = node.run("healthcheck", job=None, FAKE_SLURM_REBOOT_FAILS="1")
    assert proc.returncode == 1 and "could not ask for a reboot of gpu01" in proc.stderr
    assert node.slurm() == {"state": "IDLE+DRAIN", "reason": GPU_LOST_REBOOT}
    failed = node.db().execute("SELECT ok, detail FROM actions WHERE action = 'reboot'")
    assert failed.fetchall() == [(0, "failed: scontrol reboot: scontrol: error: RebootProgram "
                                     "isn't defined")]
    node.configure("healthy", remediate="reboot", resume_after=1)  # the fault is not seen again
    assert node.run("healthcheck", job=None).returncode == 0
    assert ladder_calls(node)[-1] == ["reboot", f"reason={GPU_LOST_REBOOT}", "gpu01"]
    assert node.slurm()["state"] == "IDLE+DRAIN+REBOOT_REQUESTED"  # never resumed meanwhile


def test_monitor_only_records_the_reboot_it_would_ask_for_and_asks_nothing(node):
    node.configure("gpu-lost", remediate="reboot", monitor_only=True)
    assert node.run("healthcheck", job=None).returncode == 0
    assert node.calls() == [] and node.slurm()["state"] == "IDLE"
    rows = node.db().execute("SELECT action, reason FROM actions ORDER BY time").fetchall()
    assert rows == [("would-drain", GPU_LOST_REBOOT), ("would-reboot", GPU_LOST_REBOOT)]


def xid_log(tmp_path, xid: str) -> str:
    """The healthy kernel log with one Xid line after it."""
    log = tmp_path / "xid.kmsg"
    lines = (FIXTURES_KMSG / "healthy.kmsg").read_text().splitlines()
    last = int(lines[-1].split(",")[1])
    log.write_text("\n".join([*lines, f"3,{last + 1},90000000000,-;NVRM: Xid {xid}"]) + "\n")
    return str(log)


def test_a_reset_fault_waits_for_the_jobs_and_the_next_health_check_resets_its_gpu(node, tmp_path):
    """Xid 48 on GPU 0 asks for a GPU reset. The node runs a job: drained (the job ends), the
    reset waits, said once; the health check that finds the node empty resets GPU 0 alone
    (nvidia-smi -r -i 0) and the node awaits a diagnosis."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/smi.log\n')
    smi.chmod(0o755)
    xid = "(PCI:0000:18:00): 48, pid=77, name=python3, An uncorrectable double bit error"
    node.configure(kmsg=xid_log(tmp_path, xid), remediate="reset", nvidia_smi=str(smi))
    node.set_slurm("MIXED", "")
    assert node.run("healthcheck", job=None).returncode == 1
    assert node.slurm()["state"] == "MIXED+DRAIN"
    reason = node.slurm()["reason"]
    assert reason.startswith("slurmhealth: reset: GPU 0 (0000:18:00) Xid 48 "), reason
    assert side_state(node)["remediation"] == {"gpus": [0]}
    node.run("healthcheck", job=None)
    assert not (tmp_path / "smi.log").exists()
    node.set_slurm("IDLE+DRAIN", reason)  # the job ended
    assert node.run("healthcheck", job=None).returncode == 0
    assert (tmp_path / "smi.log").read_text() == "-r -i 0\n"
    awaiting = reason.replace("reset: ", "awaiting diagnosis after a GPU reset: ")
    assert node.slurm() == {"state": "IDLE+DRAIN", "reason": awaiting}
    rows = node.db().execute("SELECT action, ok, detail FROM actions ORDER BY time").fetchall()
    assert [r[0] for r in rows] == ["drain", "reset-wait", "reset_gpu", "remediated"]
    assert rows[2][1:] == (1, "GPU 0 reset: 1 of 2 remediations in 7 d")


def test_with_remediation_on_the_epilog_resets_an_idle_gpu_as_reset_gpus_does(node, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/smi.log\n')
    smi.chmod(0o755)
    node.configure("remap-pending", remediate="reset", nvidia_smi=str(smi))
    proc = node.run("epilog", job="6", SLURM_JOB_GPUS="6,7", SLURM_JOB_EXIT_CODE="0")
    assert proc.returncode == 0
    assert (tmp_path / "smi.log").read_text() == "-r -i 6\n" and node.slurm()["state"] == "IDLE"


def test_a_slow_controller_never_holds_the_remediation_past_the_hooks_deadline(node):
    """1 s per Slurm call and a 6 s deadline: the drain (show node, sinfo, update, the recount)
    takes 4 s of it, with room for a loaded machine's process starts; the reboot's three calls
    (show node, sinfo, reboot) get what is left, and the reboot does not fit, so it is not
    made. The node stays drained (its reason says a reboot is due), the reboot not asked is
    recorded as failed, and the next health check asks again. (At 0.7 s a call and a 3 s
    deadline, a loaded CI machine could not fit the drain itself.) Whether the hook ends just
    before its deadline or the watchdog ends it there (a loaded machine's recording and exit
    can outlast the 0.3 s kept back, seen once with four suites on two cores), it exits with
    the verdict's status, and what it recorded is the same."""
    node.configure("gpu-lost", remediate="reboot", deadline=6.0)
    started = time.monotonic()
    proc = node.run("healthcheck", job=None, FAKE_SLURM_DELAY="1.0")
    took = time.monotonic() - started
    assert took < 6.0 + 1.5, took  # the deadline, and the interpreter's start and exit
    assert proc.returncode == 1, proc.stderr  # the verdict (fail), however it ended
    assert node.slurm()["reason"] == GPU_LOST_REBOOT
    assert not any(c[0] == "reboot" for c in node.calls())
    (failed,) = node.db().execute("SELECT ok, detail FROM actions WHERE action = 'reboot'")
    assert failed[0] == 0, failed
    # cut where the time ran out: a call refused for want of time, or one cut at the budget
    assert "no time left for Slurm calls" in failed[1] or "timed out after" in failed[1], failed
