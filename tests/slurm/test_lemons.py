"""On a real Slurm with accounting (MariaDB + slurmdbd, see lab.py): sacct records every job; a node
with intermittent hardware faults across many short jobs becomes a lemon and `slurmhealth lemons
--apply` drains it, with its evidence, and nothing else; the circuit breaker caps how many nodes
slurmhealth drains, whichever path asks (health check, prolog, lemon sweep).

The hooks record the faults but do not drain for them: on the faulty node the config demotes
the Xid check to `warn` (`checks."xid.hardware".severity = "warn"`), so the epilog exits 0 and
records class-'fail' Xid events attributed to the job. Only the lemon sweep can take it out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import time

import pytest
from conftest import require_real

from slurmhealth.core import store
from slurmhealth.fleet import accounting, signals

from .lab import TERMINAL_JOB_STATES, Lab, copy_store, missing, snapshot, xid_message

FAULTY = "gpu02"  # intermittent hardware Xids during its jobs
NOISY = "gpu03"  # application Xids (the job's own fault): not hardware evidence
CRASHY = "gpu04"  # one node failure under a job (NODE_FAIL, known from accounting only)
JOBS_PER_NODE = 14
# On FAULTY, every other job: seven separate faults within the day. Against the rate the other
# three nodes give (CRASHY's one crash in 3 node-days), P(>= 7) = 6e-7, well inside a one-day
# window's budget (0.8 x 0.001 / 30.44 = 2.6e-5); five (2.6e-5) were at its very edge.
FAULT_XIDS = (48, 79, 48, 79, 48, 79, 48)
# Two leaf switches under a spine (topology/tree): the leaves are the nodes' places.
TOPOLOGY = {"leaf1": "Nodes=gpu[01-02]", "leaf2": "Nodes=gpu[03-04]", "spine": "Switches=leaf[1-2]"}
LEAVES = (("gpu01", "leaf1"), ("gpu02", "leaf1"), ("gpu03", "leaf2"), ("gpu04", "leaf2"))
LEMON_PREFIX = "slurmhealth: lemon: "
BREAKER_SHARE = 0.25  # 4 nodes: slurmhealth may drain 1 per window
EXIT_BREAKER = 3


@pytest.fixture(scope="module")
def lab():
    reason = missing(accounting=True)
    if reason:
        require_real(reason)
    with Lab(nodes=4, accounting=True, topology=TOPOLOGY) as running:
        yield running


def slurmhealth(lab: Lab, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The admin side on the head node: SLURM_CONF set, no SLURMHEALTH_* of the caller's."""
    return subprocess.run(
        [lab.bin, *args],
        env=lab.client_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"{proc.args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def rows(path: str, sql: str, args: tuple = ()) -> list:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def actions(lab: Lab, node: str, after: float = 0) -> list:
    """The node store's actions since `after` (drains, resumes, refusals by the hooks)."""
    sql = "SELECT * FROM actions WHERE node = ? AND time >= ? ORDER BY time"
    return lab.query(node, sql, (node, after))


# ---- accounting --------------------------------------------------------------------------------


def test_accounting_records_every_job_with_its_state_exit_and_nodes(cluster):
    lab = cluster
    done = lab.submit("true")
    exit3 = lab.submit("exit 3")
    killed = lab.submit("kill -9 $$")
    pair = lab.submit("true", "-N2")
    cancelled = lab.submit("sleep 60", "-w", "gpu03")
    crashed = lab.submit("sleep 60", "-w", CRASHY, "--no-requeue")
    lab.wait_job(cancelled, states=("RUNNING",))
    lab.scancel(cancelled)
    assert lab.fail_node(CRASHY, crashed)["JobState"] == "NODE_FAIL"
    jobs = [done, exit3, killed, pair, cancelled, crashed]
    for job in jobs:
        assert lab.wait_job(job)["JobState"] in TERMINAL_JOB_STATES

    acct = lab.wait_sacct(jobs)
    got = {job: (acct[job]["State"], acct[job]["ExitCode"]) for job in jobs}
    assert got == {
        done: ("COMPLETED", "0:0"),
        exit3: ("FAILED", "3:0"),
        killed: ("FAILED", "0:9"),
        pair: ("COMPLETED", "0:0"),
        cancelled: ("CANCELLED by 0", "0:0"),  # the signal is on the step line, not here
        crashed: ("NODE_FAIL", "0:0"),
    }
    assert acct[crashed]["NodeList"] == CRASHY
    assert acct[cancelled]["NodeList"] == "gpu03"
    # A job that ends before slurmdbd recorded its start (here: within a second) keeps only
    # its batch host in the job-level NodeList (22.05; 3 of 4 short 2-node jobs measured), so
    # the node count is asked of NNodes, and the batch host must be listed.
    nnodes = lab._run(["/usr/bin/sacct", "-P", "-n", "-X", "-j", pair, "-o", "NNodes"]).stdout
    assert nnodes.split() == ["2"]
    hosts = lab.scontrol("show", "hostnames", acct[pair]["NodeList"]).stdout.split()
    assert lab.job(pair)["BatchHost"] in hosts
    for job in jobs:
        row = acct[job]
        assert row["User"] == "root"
        assert row["Start"] <= row["End"], row  # ISO times compare as text

    # The crashed job's epilog still ran (slurmd lives on), but only accounting knows why it
    # ended: the node store's row has no failure in it.
    (epilog,) = lab.wait_runs(CRASHY, "epilog", job_id=crashed)
    assert epilog["verdict"] == "ok"


def test_a_drain_comes_back_from_accounting_as_a_node_event_and_closes(
    cluster, tmp_path, monkeypatch
):
    """fetch_events + ingest_events store the drain with its node, state, reason and start while
    it lasts; a collect --sacct after the resume gives it its end."""
    lab = cluster
    monkeypatch.setenv("SLURM_CONF", lab.conf)  # fetch_events runs sacctmgr in this process
    node, reason = "gpu01", f"lab: event {os.urandom(2).hex()} | a pipe in it"
    t0 = int(time.time())
    lab.drain(node, reason)

    def drain_events() -> list:
        text = accounting.fetch_events(t0 - 60, time.time() + 60, slurm_bin="/usr/bin")
        return [r for r in accounting.parse_events(text, utc=True)[0] if r["reason"] == reason]

    lab._poll(drain_events, 30, "sacctmgr to show the drain")
    t1 = time.time()
    conn = store.connect(str(tmp_path / "fleet.db"))
    text = accounting.fetch_events(t0 - 60, time.time() + 60, slurm_bin="/usr/bin")
    assert accounting.ingest_events(conn, text, utc=True)["bad"] == []
    sql = "SELECT node, start, state, end FROM node_events WHERE reason = ?"
    ((got_node, start, state, end),) = conn.execute(sql, (reason,)).fetchall()
    assert (got_node, state, end) == (node, "DRAIN", None)
    assert t0 <= start <= t1  # sacctmgr's times are whole seconds

    lab.resume(node)
    lab.wait_idle([node])
    lab._poll(lambda: drain_events()[0]["end"] is not None, 30, "sacctmgr to close the drain")
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    fleet = str(tmp_path / "fleet.db")
    collect = ok(slurmhealth(lab, "collect", str(spool), "--db", fleet, "--sacct", "--since", "1h"))
    assert re.search(r"^sacctmgr: [1-9][0-9]* node events added or updated$", collect.stdout, re.M)
    ((closed,),) = conn.execute("SELECT end FROM node_events WHERE reason = ?", (reason,))
    assert start <= closed <= time.time()  # resumed within a second, often
    again = ok(slurmhealth(lab, "collect", str(spool), "--db", fleet, "--sacct", "--since", "1h"))
    assert "sacctmgr: 0 node events added or updated" in again.stdout, again.stdout


# ---- lemons --------------------------------------------------------------------------------------


def _script(lab: Lab, node: str, i: int) -> tuple:
    """(kind, job script) of job i on a node: FAULTY meets a hardware Xid in every other job and
    the job dies of it; NOISY's jobs crash twice on their own bug (application Xid 13); CRASHY's
    fail twice with exit 3 (ordinary failures); the rest, and all other jobs, succeed."""
    if node == FAULTY and i % 2 == 1:
        xid = FAULT_XIDS[i // 2]
        return f"xid{xid}", f"{lab.kmsg_command(node, xid_message(xid))}; exit 1"
    if node == NOISY and i in (2, 7):
        return "xid13", f"{lab.kmsg_command(node, xid_message(13))}; exit 1"
    if node == CRASHY and i in (3, 8):
        return "exit3", "exit 3"
    return "ok", "true"


@pytest.fixture(scope="module")
def history(lab, tmp_path_factory):
    """Many short jobs over the four nodes, the node stores collected into a fleet store with
    accounting: {fleet (a pristine copy), start, end, jobs {id: (node, kind)}, crashed, collect
    (the command's output)}. Leaves the lab as found (no faults, every node idle)."""
    start = time.time()
    lab.node_config(FAULTY, 'checks."xid.hardware".severity = "warn"')
    lab.kmsg(NOISY)
    try:
        crashed = lab.submit("sleep 60", "-w", CRASHY, "--no-requeue")
        lab.fail_node(CRASHY, crashed)
        jobs = {}
        for i in range(JOBS_PER_NODE):
            for node in lab.names:
                kind, script = _script(lab, node, i)
                # All its GPUs: one job at a time per node, so each epilog reads only the
                # kernel-log records of its own job.
                job = lab.submit(script, "-w", node, "--gres=gpu:8", "--no-requeue")
                jobs[job] = (node, kind)
        for job in jobs:
            lab.wait_job(job, timeout=120)
        for job, (node, _) in jobs.items():
            lab.wait_runs(node, "epilog", job_id=job)
        lab.wait_sacct([*jobs, crashed])
        end = time.time()
        hooks_drained = {n: lab.node(n) for n in lab.names if "DRAIN" in lab.node(n)["state"]}
    finally:
        lab.clear(FAULTY)
        lab.clear(NOISY)
        lab.clear(CRASHY)

    base = tmp_path_factory.mktemp("fleet")
    spool = base / "spool"
    spool.mkdir()
    for node in lab.names:
        copy_store(lab.db_path(node), str(spool / f"{node}.db"))
    fleet = str(base / "fleet.db")
    collect = ok(slurmhealth(lab, "collect", str(spool), "--db", fleet, "--sacct"))
    pristine = str(base / "fleet-pristine.db")
    copy_store(fleet, pristine)
    return {
        "fleet": pristine,
        "start": start,
        "end": end,
        "jobs": jobs,
        "crashed": crashed,
        "collect": collect,
        "hooks_drained": hooks_drained,
        "spool": str(spool),
    }


def fleet_copy(history: dict, tmp_path) -> str:
    path = str(tmp_path / "fleet.db")
    shutil.copyfile(history["fleet"], path)
    return path


def lemons(
    lab: Lab, history: dict, fleet: str, *args: str, now: float | None = None
) -> subprocess.CompletedProcess:
    """`slurmhealth lemons` over the history's own period (earlier tests' jobs left out), as of
    its end or `now`."""
    now = history["end"] + 1 if now is None else now
    config = lab.path("etc", "slurmhealth.toml")
    return slurmhealth(
        lab,
        "lemons",
        "--db",
        fleet,
        "--now",
        f"{now:.3f}",
        "--window",
        f"{now - history['start'] - 0.001:.3f}s",
        "--config",
        config,
        *args,
    )


def test_the_hooks_record_the_faults_without_draining(cluster, history):
    lab = cluster
    assert history["hooks_drained"] == {}, "the hooks alone drained a node: the test proves nothing"
    faulty = [j for j, (n, kind) in history["jobs"].items() if n == FAULTY and kind != "ok"]
    assert len(faulty) == len(FAULT_XIDS)
    spool = os.path.join(history["spool"], f"{FAULTY}.db")
    events = rows(spool, "SELECT * FROM events WHERE code IN (48, 79) ORDER BY time")
    assert [e["code"] for e in events] == list(FAULT_XIDS)
    assert {e["class"] for e in events} == {"fail"}
    # Attributed to their job by its epilog, unless a health check read the record first
    # (between the job's write and its epilog: then job_id is NULL).
    assert {e["job_id"] for e in events} - {None} <= set(faulty)
    for job in faulty:
        (epilog,) = lab.runs(FAULTY, "epilog", job_id=job)
        assert epilog["verdict"] in ("warn", "ok"), epilog  # warn: the demoted Xid check
    acts = rows(spool, "SELECT * FROM actions WHERE time >= ?", (history["start"],))
    assert not [a for a in acts if a["action"] == "drain"], acts
    noisy = rows(os.path.join(history["spool"], f"{NOISY}.db"), "SELECT * FROM events")
    assert [e["code"] for e in noisy] == [13, 13]
    assert {e["class"] for e in noisy} == {"app"}


def test_collect_merges_the_node_failure_that_ended_a_job_node_fail(cluster, history):
    """The lemon model's clue: a DOWN event on the failed node, starting when its job ended."""
    lab = cluster
    assert re.search(
        r"^sacctmgr: [1-9][0-9]* node events added or updated$", history["collect"].stdout, re.M
    )
    env = lab.client_env({"TZ": "UTC", "SLURM_TIME_FORMAT": "standard"})
    argv = ["/usr/bin/sacct", "-P", "-n", "-X", "-j", history["crashed"], "-o"]
    text = lab._run([*argv, accounting.SACCT_FIELDS], env=env).stdout
    (job,) = accounting.parse_sacct(text, utc=True)[0]
    assert job["slurm_state"] == "NODE_FAIL"
    sql = "SELECT * FROM node_events WHERE node = ? AND reason = 'lab: node failure'"
    events = rows(history["fleet"], sql, (CRASHY,))
    down = min(events, key=lambda e: abs(e["start"] - job["end"]))
    assert abs(down["start"] - job["end"]) <= 2, (events, job)  # measured: the same second
    assert down["state"] == "DOWN", events
    assert down["end"] is not None and down["end"] >= down["start"]  # back (ReturnToService=2)
    assert not rows(history["fleet"], "SELECT * FROM node_events WHERE state LIKE 'UNK%'")


def test_collect_records_where_slurm_puts_each_node(cluster, history):
    """scontrol's topology (leaf switches, not the spine above them) and sinfo's partitions,
    as the lemon signals read them: the one partition holds every node, so it is no place."""
    assert re.search(
        r"^places: 8 node places \(partition, switch\)$", history["collect"].stdout, re.M
    ), history["collect"].stdout
    got = rows(history["fleet"], "SELECT node, kind, name FROM places ORDER BY node, kind")
    want = [
        {"node": n, "kind": k, "name": v}
        for n, leaf in LEAVES
        for k, v in (("partition", "gpu"), ("switch", leaf))
    ]
    assert got == want
    conn = store.connect(history["fleet"], existing=True)
    try:
        where = signals.places(conn, history["start"])
    finally:
        conn.close()
    assert where == {n: (f"switch:{leaf}",) for n, leaf in LEAVES}


def test_a_node_whose_records_never_arrive_is_named_from_its_jobs(cluster, history, tmp_path):
    """gpu01's exports never reach collect (its hooks could as well not be in slurm.conf):
    the fleet store has no run of it, but sacct's jobs put it on Slurm's nodes, and the sweep
    and the report name it with its jobs of the last day; the nodes that record are not."""
    lab, quiet = cluster, "gpu01"
    spool = tmp_path / "spool"
    spool.mkdir()
    for node in lab.names:
        if node != quiet:
            copy_store(lab.db_path(node), str(spool / f"{node}.db"))
    fleet = str(tmp_path / "fleet.db")
    ok(slurmhealth(lab, "collect", str(spool), "--db", fleet, "--sacct"))
    doc = json.loads(ok(lemons(lab, history, fleet, "--json")).stdout)
    (named,) = doc["freshness"]["unguarded"]
    assert named["node"] == quiet and named["jobs"] >= JOBS_PER_NODE, named
    text = ok(lemons(lab, history, fleet)).stdout
    said = "1 node ran jobs within 24 h with no run of slurmhealth's on record"
    assert said in text and text.rstrip().endswith(f": {quiet} ({named['jobs']} jobs)"), text
    now = f"{history['end'] + 1:.3f}"
    proc = ok(slurmhealth(lab, "report", "--db", fleet, "--now", now, "--format", "json"))
    fresh = json.loads(proc.stdout)["freshness"]
    assert fresh["unguarded"] == [named] and fresh["unguarded_count"] == 1


def test_a_node_with_intermittent_faults_is_drained_as_a_lemon_with_its_evidence(
    cluster, history, tmp_path
):
    lab = cluster
    fleet = fleet_copy(history, tmp_path)
    before = {n: lab.node(n) for n in lab.names}

    listed = ok(lemons(lab, history, fleet, "--json"))
    report = json.loads(listed.stdout)
    assert [entry["node"] for entry in report["lemons"]] == [FAULTY], report
    assert sorted(n["node"] for n in report["nodes"]) == lab.names
    assert report.get("applied", []) == []
    assert {n: lab.node(n) for n in lab.names} == before, "lemons without --apply changed a node"

    lemon = report["lemons"][0]
    evidence = lemon["evidence"]
    assert lemon["score"] > 0
    assert lemon["reason"] and "\n" not in lemon["reason"]
    attributed = rows(
        fleet,
        "SELECT count(DISTINCT job_id) AS n FROM events "
        "WHERE node = ? AND class = 'fail' AND job_id IS NOT NULL",
        (FAULTY,),
    )[0]["n"]
    assert evidence["hw_xids"]["count"] == len(FAULT_XIDS), evidence
    assert evidence["hw_job_failures"]["count"] == attributed >= 1, evidence
    by_node = {n["node"]: n for n in report["nodes"]}
    # Accounting: the node failure counts against CRASHY (its epilog could not know), once.
    assert by_node[CRASHY]["evidence"]["hw_job_failures"]["count"] == 1, by_node[CRASHY]
    # Application Xids and ordinary job failures are no hardware evidence.
    assert by_node[NOISY]["evidence"]["hw_xids"]["count"] == 0, by_node[NOISY]
    assert by_node[NOISY]["evidence"]["hw_job_failures"]["count"] == 0, by_node[NOISY]
    assert by_node["gpu01"]["evidence"]["hw_job_failures"]["count"] == 0

    t_apply = time.time()
    applied = ok(lemons(lab, history, fleet, "--apply", "--json"))
    drained = lab.node(FAULTY)
    # Once drained, its evidence starts afresh at the drain: the next sweep (as of now, after
    # the drain) finds no lemon, changes nothing and records nothing.
    again = ok(lemons(lab, history, fleet, "--apply", "--json", now=time.time()))
    assert json.loads(applied.stdout)["applied"] == [{"node": FAULTY, "outcome": "drained"}]
    resumed = [a for a in actions(lab, FAULTY, t_apply) if a["action"] == "resume"]
    assert json.loads(again.stdout)["applied"] == [], f"drained twice; resumed by {resumed}"
    entry = {n["node"]: n for n in json.loads(again.stdout)["nodes"]}[FAULTY]
    assert entry["evidence"]["faults"]["reset"]["why"] == "drained as a lemon", entry
    assert "DRAIN" in drained["state"], drained
    assert drained["reason"].startswith(LEMON_PREFIX), drained
    assert lemon["reason"][:60] in drained["reason"], (lemon["reason"], drained)
    for node in lab.names:
        if node != FAULTY:
            assert lab.node(node) == before[node], f"{node} was touched"
    acts = rows(fleet, "SELECT * FROM actions WHERE time >= ? ORDER BY time", (t_apply - 1,))
    got = [(a["node"], a["action"], a["ok"]) for a in acts]
    assert got == [(FAULTY, "drain", 1)], acts
    assert acts[0]["reason"] == drained["reason"]
    assert "lemons" in acts[0]["actor"]

    # A lemon stays out: the health checks that now pass on it must not resume it (only an
    # admin may: the node passes every check between its intermittent faults).
    lab.wait_runs(FAULTY, "healthcheck", count=lab.resume_after + 1, after=t_apply, verdict="ok")
    resumed = [a for a in actions(lab, FAULTY, t_apply) if a["action"] == "resume"]
    assert lab.node(FAULTY) == drained, f"a passing health check resumed the lemon: {resumed}"


def test_a_lemon_an_admin_resumed_stays_in_service_on_the_same_faults(cluster, history, tmp_path):
    """The sweep drains the lemon; an admin resumes it, having looked (or repaired it): its
    evidence starts afresh at the drain, so the next sweeps, over the same faults, leave it in
    service (no scontrol update, no action recorded) and say why."""
    lab = cluster
    fleet = fleet_copy(history, tmp_path)
    config = lab.path("etc", "slurmhealth.toml")

    def sweep(*more: str) -> str:
        now = time.time()
        span = f"{now - history['start']:.3f}s"
        args = ("lemons", "--db", fleet, "--now", f"{now:.3f}", "--window", span, *more)
        return ok(slurmhealth(lab, *args, "--config", config)).stdout

    assert json.loads(sweep("--apply", "--json"))["applied"] == [
        {"node": FAULTY, "outcome": "drained"}
    ]
    assert "DRAIN" in lab.node(FAULTY)["state"]
    lab.resume(FAULTY)
    t_resume = time.time()
    again = json.loads(sweep("--apply", "--json"))
    assert again["applied"] == [] and again["lemons"] == [], again
    assert "DRAIN" not in lab.node(FAULTY)["state"], lab.node(FAULTY)
    assert rows(fleet, "SELECT * FROM actions WHERE time >= ?", (t_resume,)) == []
    text = sweep()
    assert f"{FAULTY}" in text and "evidence starts afresh at" in text, text


# ---- circuit breaker -----------------------------------------------------------------------------


@pytest.fixture
def breaker(cluster):
    """The module's lab with [settings] breaker_share = BREAKER_SHARE, put back afterwards."""
    cluster.set_settings(breaker_share=BREAKER_SHARE)
    yield cluster
    cluster.settings.pop("breaker_share", None)
    cluster.set_settings()


def test_when_every_node_fails_slurmhealth_drains_at_most_the_breaker_cap(breaker):
    lab = breaker
    cap = max(1, int(BREAKER_SHARE * len(lab.names)))
    t0 = time.time()
    for node in lab.names:
        lab.inject(node, gpu_source=snapshot("gpu-lost"))
    # Every node's health check fails, twice, and each asks to drain its node.
    for node in lab.names:
        lab.wait_runs(node, "healthcheck", count=2, after=t0, verdict="fail", timeout=30)
    states = {n: lab.node(n) for n in lab.names}
    drained = sorted(n for n, s in states.items() if "DRAIN" in s["state"])
    assert 1 <= len(drained) <= cap, states
    refused = {n: [a for a in actions(lab, n, t0) if a["action"] == "breaker"] for n in lab.names}
    assert sorted(n for n, r in refused.items() if r) == sorted(set(lab.names) - set(drained))
    for node in set(lab.names) - set(drained):
        assert states[node]["state"] == "IDLE", states
        assert not refused[node][0]["ok"]
        assert "circuit breaker" in refused[node][0]["detail"], refused[node][0]


def test_the_lemon_sweep_stops_at_the_breaker_loudly(breaker, history, tmp_path):
    lab = breaker
    # Another automatic path already took one node out within the window: the cap (1) is used.
    lab.inject(CRASHY, gpu_source=snapshot("gpu-lost"))
    lab.wait_node(CRASHY, lambda n: "DRAIN" in n["state"], what="to be drained by its check")
    fleet = fleet_copy(history, tmp_path)
    t0 = time.time()
    proc = lemons(lab, history, fleet, "--apply", "--json")
    assert proc.returncode == EXIT_BREAKER, (proc.returncode, proc.stdout, proc.stderr)
    assert "breaker" in proc.stderr.lower(), proc.stderr
    assert json.loads(proc.stdout)["applied"] == [{"node": FAULTY, "outcome": "breaker"}]
    assert lab.node(FAULTY)["state"] == "IDLE"
    acts = rows(fleet, "SELECT * FROM actions WHERE time >= ?", (t0 - 1,))
    assert [(a["node"], a["action"], a["ok"]) for a in acts] == [(FAULTY, "breaker", 0)], acts
    assert "circuit breaker" in acts[0]["detail"]
