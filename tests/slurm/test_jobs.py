"""Job summaries on a real Slurm with accounting and PrivateData=jobs, read by two real
unprivileged users: user A's job that meets an injected GPU fault and A's job that fails by
itself get the right conclusions; user B cannot read A's summaries; neither can forge or change
a record. The head node side (collect, publish) runs as root, as the timer would.

Users cannot run the venv's interpreter (it lives under /root, mode 0700): their side is
Debian's /usr/bin/python3 with PYTHONPATH on a 0755 copy of the slurmhealth package and click,
which is all `slurmhealth job` needs.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time

import click
import pytest
from conftest import require_real

from .lab import REPO, Lab, copy_store, missing, xid_message

SICK, FINE = "gpu01", "gpu02"
GPU3_BUS = "0000:5d:00"  # GPU 3 of the bundled snapshots
USER_PYTHON = "/usr/bin/python3"
NOT_YOURS = "not found, or not yours"


@pytest.fixture(scope="module")
def lab():
    reason = missing(accounting=True)
    if reason is None and not os.access(USER_PYTHON, os.X_OK):
        reason = f"{USER_PYTHON} missing: the users' side runs on the system Python"
    if reason:
        require_real(reason)
    # No health check: the job's epilog, not a health check, is the one to read the Xid.
    with Lab(nodes=2, accounting=True, private_data=True, health_check_interval=0) as running:
        yield running


@pytest.fixture(scope="module")
def users(lab):
    """Two real unprivileged accounts with Slurm associations (before they submit: with
    PrivateData=jobs a job submitted earlier stays invisible even to its owner)."""
    names = [f"shjob{who}-{os.urandom(2).hex()}" for who in ("a", "b")]
    try:
        for name in names:
            subprocess.run(
                ["/usr/sbin/useradd", "--no-create-home", "--shell", "/bin/sh", name],
                check=True,
                capture_output=True,
            )
            lab.add_user(name)
        yield [pwd.getpwnam(n).pw_name for n in names]
    finally:
        for name in names:
            subprocess.run(["/usr/sbin/userdel", name], check=False, capture_output=True)


@pytest.fixture(scope="module")
def userland():
    """A 0755 directory with the slurmhealth package and click, for the users' python3."""
    base = tempfile.mkdtemp(prefix="slurmhealth-userland-")
    os.chmod(base, 0o755)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(
        os.path.join(REPO, "slurmhealth"), os.path.join(base, "slurmhealth"), ignore=skip
    )
    shutil.copytree(os.path.dirname(click.__file__), os.path.join(base, "click"), ignore=skip)
    for root, dirs, files in os.walk(base):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def admin(lab: Lab, *args: str) -> subprocess.CompletedProcess:
    """slurmhealth on the head node, as root."""
    proc = subprocess.run(
        [lab.bin, *args], env=lab.client_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def as_user(lab: Lab, user: str, argv: list, fleet: str, userland: str = "") -> object:
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_CONF": lab.conf,
        "PYTHONPATH": userland,
        "PYTHONDONTWRITEBYTECODE": "1",
        "SLURMHEALTH_FLEET_DB": fleet,
    }
    return lab._run(argv, env=env, user=user, check=False, timeout=60)


def user_job(lab: Lab, user: str, userland: str, fleet: str, *args: str) -> object:
    argv = [USER_PYTHON, "-m", "slurmhealth", "job", *args]
    return as_user(lab, user, argv, fleet, userland)


def collect_and_publish(lab: Lab, head: str) -> subprocess.CompletedProcess:
    """What the head node's timer runs: copy the node stores, collect with accounting, publish."""
    spool, fleet = os.path.join(head, "spool"), os.path.join(head, "fleet.db")
    for node in lab.names:
        copy_store(lab.db_path(node), os.path.join(spool, f"{node}.db"))
    admin(lab, "collect", spool, "--db", fleet, "--sacct", "--since", "1h")
    return admin(lab, "publish", "--db", fleet, "--since", "1h")


def admin_comment(lab: Lab, job: str) -> str:
    out = lab._run(["/usr/bin/sacct", "-X", "-n", "-P", "-j", job, "-o", "AdminComment"]).stdout
    return out.rstrip("\n")


@pytest.fixture(scope="module")
def history(lab, users):
    """User A's two jobs (one meets Xid 79 on GPU 3 while it runs, one exits 3), collected and
    published twice by root. The fleet store sits in a 0755 directory: only the file's own
    mode keeps users out."""
    owner = users[0]
    lab.kmsg(SICK)  # a writable kernel log, in place before the job's prolog reads it
    release = os.path.join(lab.out, "release-fault")
    hold = f"while [ ! -e {release} ]; do sleep 0.1; done; exit 1"
    fault = lab.submit(hold, "-w", SICK, "--gres=gpu:8", "--no-requeue", user=owner)
    failed = lab.submit("exit 3", "-w", FINE, "--gres=gpu:8", user=owner)
    lab.wait_job(fault, states=("RUNNING",))
    lab.wait_runs(SICK, "prolog", job_id=fault)
    lab.append_kmsg(SICK, xid_message(79, bus=GPU3_BUS))
    open(release, "w").close()  # noqa: SIM115 - the job waits for this file to exist
    for job, node in ((fault, SICK), (failed, FINE)):
        lab.wait_job(job)
        lab.wait_runs(node, "epilog", job_id=job)
    lab.wait_sacct([fault, failed])

    head = tempfile.mkdtemp(prefix="slurmhealth-head-")
    os.chmod(head, 0o755)
    os.mkdir(os.path.join(head, "spool"), 0o700)
    t0 = time.time()
    first = collect_and_publish(lab, head)
    took = time.time() - t0
    comments = [admin_comment(lab, job) for job in (fault, failed)]
    # Nothing changed since (a later collect may still bring news: accounting's final state)
    again = admin(lab, "publish", "--db", os.path.join(head, "fleet.db"), "--since", "1h")
    yield {
        "fault": fault,
        "failed": failed,
        "head": head,
        "fleet": os.path.join(head, "fleet.db"),
        "first": first,
        "again": again,
        "seconds": took,
        "comments": comments,
    }
    shutil.rmtree(head, ignore_errors=True)


def test_publish_writes_each_finished_job_once(lab, history):
    assert history["first"].stdout.startswith("2 summaries published, 0 unchanged"), history
    comments = [admin_comment(lab, job) for job in (history["fault"], history["failed"])]
    assert comments == history["comments"], "\n".join(comments + history["comments"])
    assert history["again"].stdout.startswith("0 summaries published, 2 unchanged"), history
    for job in (history["fault"], history["failed"]):
        comment = admin_comment(lab, job)
        assert comment.startswith("slurmhealth:v1:") and "|" not in comment, comment
    print(f"collect + publish of 2 jobs: {history['seconds']:.2f} s")


def test_the_owner_learns_their_job_met_a_hardware_fault(lab, users, userland, history):
    proc = user_job(lab, users[0], userland, history["fleet"], history["fault"])
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    lost = f"conclusion: node {SICK} lost GPU 3 ({GPU3_BUS}) (Xid 79) at "
    assert last.startswith(lost), proc.stdout
    assert last.endswith(
        "during your job: a hardware fault, not your code; the node is drained; "
        "resubmitting is safe"
    ), proc.stdout
    as_json = user_job(lab, users[0], userland, history["fleet"], history["fault"], "--json")
    got = json.loads(as_json.stdout)
    assert (got["source"], got["verdict"], got["user"]) == ("accounting", "hardware", users[0])
    (node,) = got["nodes"]
    assert [(x["gpu"], x["code"], x["class"]) for x in node["xids"]] == [(3, 79, "fail")]
    assert (node["prolog"], node["epilog"], node["drain"]["still"]) == ("ok", "fail", True)
    assert "DRAIN" in lab.node(SICK)["state"]  # what the summary says is so


def test_the_owner_learns_their_job_failed_by_itself(lab, users, userland, history):
    proc = user_job(lab, users[0], userland, history["fleet"], history["failed"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "conclusion: no hardware fault seen: look at your application's output (exit code 3)"
    ), proc.stdout


def test_another_user_cannot_read_the_summary(lab, users, userland, history):
    for job in (history["fault"], history["failed"]):
        proc = user_job(lab, users[1], userland, history["fleet"], job)
        assert proc.returncode != 0
        expected = f"Error: job {job} {NOT_YOURS} (Slurm shows you only your own jobs)"
        assert proc.stderr.strip() == expected, proc.stderr
        sacct = ["/usr/bin/sacct", "-X", "-n", "-P", "-j", job, "-o", "AdminComment"]
        raw = as_user(lab, users[1], sacct, history["fleet"])
        assert raw.stdout == "", "sacct showed user B another user's job"


def test_neither_user_can_forge_or_change_a_record(lab, users, userland, history):
    fleet, job = history["fleet"], history["fault"]
    before = admin_comment(lab, job)
    st = os.stat(fleet)
    assert st.st_uid == 0 and not st.st_mode & 0o007, oct(st.st_mode)
    for user in users:
        forged = "AdminComment=slurmhealth:v1:{`format`:1,`nodes`:[]}"
        modify = ["/usr/bin/sacctmgr", "-i", "modify", "job", "where", f"jobid={job}", "set"]
        proc = as_user(lab, user, [*modify, forged], fleet)
        assert proc.returncode != 0 and "privilege" in proc.stderr, proc
        for mode in ("rb", "r+b"):
            probe = f"open({fleet!r}, {mode!r})"
            proc = as_user(lab, user, [USER_PYTHON, "-c", probe], fleet)
            assert proc.returncode != 0 and "PermissionError" in proc.stderr, (mode, proc)
        argv = [USER_PYTHON, "-m", "slurmhealth", "publish", "--db", fleet]
        proc = as_user(lab, user, argv, fleet, userland)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert admin_comment(lab, job) == before


def test_a_comment_another_tool_wrote_is_left_alone(lab, history):
    job = lab.submit("true", "-w", FINE)
    lab.wait_job(job)
    lab.wait_runs(FINE, "epilog", job_id=job)
    lab.wait_sacct([job])
    lab.sacctmgr("-i", "modify", "job", "where", f"jobid={job}", "set", "AdminComment=site: x")
    proc = collect_and_publish(lab, history["head"])
    assert f"job {job}: AdminComment set by another tool, left alone: site: x" in proc.stdout
    assert admin_comment(lab, job) == "site: x"


def test_a_summary_not_yet_published_says_when_it_is_due(lab, users, userland, history):
    job = lab.submit("true", "-w", FINE, user=users[0])
    lab.wait_job(job)
    lab.wait_sacct([job])
    proc = user_job(lab, users[0], userland, history["fleet"], job)
    assert proc.returncode != 0
    assert f"no health summary for job {job} yet" in proc.stderr, proc.stderr
    assert "expect it by" in proc.stderr
