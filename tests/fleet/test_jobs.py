"""Job summaries: built from real stores written by the real store API, their conclusions, the
AdminComment form (hostile strings included), and `publish` against a stand-in sacct/sacctmgr
(unit level; tests/slurm/test_jobs.py runs it all on a real Slurm with two real users)."""

from __future__ import annotations

import base64
import io
import json
import os
import stat
import sys
import time
import zlib

import pytest
from conftest import FIXTURES, open_fleet, run_as_nobody, run_cli, snapshot_path
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.core import slurm, store
from slurmhealth.fleet import accounting, jobs, records
from slurmhealth.fleet.text import job as job_text
from slurmhealth.node import config, runner

HEALTHY_KMSG = os.path.join(FIXTURES, "kmsg", "healthy.kmsg")
HOSTILE_KMSG = os.path.join(FIXTURES, "kmsg", "hostile-names.kmsg")
ALL_GPUS = list(range(8))
# GPU 3 of the bundled H100 snapshots sits at 0000:5d:00. kmsg files escape bytes as \xNN.
XID79 = r"4,900,90000000000,-;NVRM: Xid (PCI:0000:5d:00): 79, pid=31337, name=py|th\x0aon, GPU has fallen off the bus."  # noqa: E501


def kmsg_with(tmp_path, name: str, *records: str) -> str:
    path = tmp_path / name
    with open(HEALTHY_KMSG) as f:
        path.write_text(f.read() + "".join(r + "\n" for r in records))
    return str(path)


def a_run(node: str, phase: str, snapshot: str = "healthy", kmsg: str = HEALTHY_KMSG):
    options = runner.Options(gpu_source=snapshot_path(snapshot), kmsg=kmsg)
    run = runner.run(node, config.defaults(), options, ["gpu", "xid"], phase, job_gpus=ALL_GPUS)
    run.node = node
    return run


def job_on(
    conn,
    node: str,
    job: str,
    *,
    prolog: str = "healthy",
    epilog: str | None = "healthy",
    kmsg: str = HEALTHY_KMSG,
    exit_code: int = 0,
    signal: int = 0,
    nodes: int = 1,
) -> None:
    """A job's prolog and epilog on a node, recorded as the hooks record them."""
    run = a_run(node, "prolog", prolog)
    refused = run.verdict == "fail"
    state = "prolog_failed" if refused else "running"
    opened = {"uid": 1000, "user": "alice", "start": run.started, "state": state}
    store.record_run(conn, run.records(job), dict(opened, num_nodes=nodes), job_baselines=True)
    if epilog is None:
        return
    run = a_run(node, "epilog", epilog, kmsg)
    closed: dict = {"uid": 1000, "user": "alice", "end": run.started}
    if not refused:
        closed.update(state="ended", exit_code=exit_code, signal=signal)
    store.record_run(conn, run.records(job), closed)
    store.attribute_events(conn, node, job, ALL_GPUS)


@pytest.fixture
def conn(fleet_store):
    """The fleet store, on each backend (a SQLite file, a database on a PostgreSQL server)."""
    return open_fleet(fleet_store)


def xid79_job(conn, tmp_path, job: str = "41", node: str = "gpu07") -> dict:
    job_on(conn, node, job, kmsg=kmsg_with(tmp_path, f"{node}.kmsg", XID79), signal=9)
    return jobs.summary(conn, job)


# --- summaries and conclusions ----------------------------------------------------------------


def test_a_gpu_lost_during_the_job_on_a_drained_node_is_a_hardware_fault_and_safe_to_resubmit(
    conn, tmp_path
):
    job_on(conn, "gpu07", "41", kmsg=kmsg_with(tmp_path, "k", XID79), signal=9)
    store.record_action(
        conn, "gpu07", "drain", "slurmhealth: GPU 3 off the bus", "slurmhealth epilog"
    )
    got = jobs.summary(conn, "41")
    (node,) = got["nodes"]
    assert (node["prolog"], node["epilog"]) == ("ok", "fail")
    (xid,) = node["xids"]
    assert (xid["gpu"], xid["code"], xid["class"]) == (3, 79, "fail")
    assert node["drain"]["still"] is True
    assert any(p["check"] == "xid.hardware" and p["phase"] == "epilog" for p in node["problems"])
    assert got["verdict"] == "hardware" and got["exclude"] == []
    when = jobs.local_time(xid["time"])
    assert got["conclusion"] == (
        f"node gpu07 lost GPU 3 (0000:5d:00) (Xid 79) at {when} during your job: a hardware "
        "fault, not your code; the node is drained; resubmitting is safe"
    )
    assert (got["user"], got["uid"], got["signal"]) == ("alice", 1000, 9)


def test_a_fault_on_a_node_that_was_not_drained_says_to_exclude_it(conn, tmp_path):
    got = xid79_job(conn, tmp_path)
    assert got["verdict"] == "hardware"
    assert got["exclude"] == ["gpu07"]
    assert got["conclusion"].endswith(
        "the node was not drained; resubmit excluding it with --exclude=gpu07"
    )


def test_a_drain_resumed_after_passing_checks_is_said_so(conn, tmp_path):
    job_on(conn, "gpu07", "41", kmsg=kmsg_with(tmp_path, "k", XID79))
    store.record_action(conn, "gpu07", "drain", "slurmhealth: x", "slurmhealth epilog")
    later = time.time() + 5
    store.record_action(conn, "gpu07", "resume", "2 ok", "slurmhealth healthcheck", when=later)
    got = jobs.summary(conn, "41")
    assert got["nodes"][0]["drain"]["still"] is False
    assert "returned to service; resubmitting is safe" in got["conclusion"]


def test_a_job_that_failed_by_itself_gets_look_at_your_output(conn):
    job_on(conn, "gpu02", "42", exit_code=3)
    got = jobs.summary(conn, "42")
    assert got["verdict"] == "failed"
    assert got["conclusion"] == (
        "no hardware fault seen: look at your application's output (exit code 3)"
    )
    job_on(conn, "gpu02", "43")
    assert jobs.summary(conn, "43")["verdict"] == "ok"


def test_application_xids_are_the_jobs_own_and_hostile_names_stay_text(conn):
    job_on(conn, "gpu02", "44", kmsg=HOSTILE_KMSG, exit_code=1)
    got = jobs.summary(conn, "44")
    assert got["verdict"] == "failed"
    assert {x["class"] for x in got["nodes"][0]["xids"]} == {"app"}
    assert "which is usually the application's own error" in got["conclusion"]
    text = job_text(got)
    assert "\x1b" not in text and "\x0a NVRM" not in text
    assert all(line.isprintable() for line in text.splitlines())
    assert "$(rm -rf /)" in text and "<script>alert(1)</script>" in text  # as plain text


def test_a_node_refused_by_the_prolog_and_the_requeue_that_ran_elsewhere(conn):
    job_on(conn, "gpu03", "45", prolog="gpu-lost")
    store.record_action(
        conn, "gpu03", "drain", "slurmhealth: GPU 3 GpuIsLost", "slurmhealth prolog"
    )
    job_on(conn, "gpu01", "45")
    got = jobs.summary(conn, "45")
    refused = {n["node"]: n for n in got["nodes"]}["gpu03"]
    assert (refused["state"], refused["prolog"]) == ("prolog_failed", "fail")
    assert got["verdict"] == "ok"
    assert got["conclusion"].startswith(
        "the prolog on gpu03 found GPU 3 GpuIsLost before your job started: the node was "
        "refused and Slurm requeued your job and it ran on gpu01. no hardware fault seen"
    )


def test_a_missing_epilog_makes_the_summary_incomplete(conn):
    job_on(conn, "gpu01", "46", nodes=2)
    job_on(conn, "gpu02", "46", nodes=2, epilog=None)
    got = jobs.summary(conn, "46")
    assert got["verdict"] == "incomplete"
    assert "no epilog recorded on gpu02" in got["conclusion"]


def node_fail(conn, job: str, nodes: str, start: float, end: float) -> None:
    """What `collect --sacct` merges for a job Slurm ended with NODE_FAIL: every node of it."""
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))  # noqa: E731
    line = f"{job}|NODE_FAIL|0:0|{nodes}|{stamp(start)}|{stamp(end)}|alice"
    assert accounting.ingest_sacct(conn, line, utc=True)["bad"] == []


def test_node_fail_blames_the_node_whose_epilog_never_ran_not_every_node(conn, tmp_path):
    job_on(conn, "gpu01", "47", nodes=2)  # killed with the job: its epilog ran
    job_on(conn, "gpu02", "47", nodes=2, epilog=None)  # crashed
    end = time.time() + 60
    node_fail(conn, "47", "gpu[01-02]", time.time() - 3600, end)
    # the crashed node's health checks after the job are not the job's
    later = a_run("gpu02", "healthcheck", "gpu-lost")
    later.started = end + 120
    store.record_run(conn, later.records())
    got = jobs.summary(conn, "47")
    assert got["verdict"] == "hardware" and got["exclude"] == ["gpu02"]
    assert got["conclusion"].startswith("node gpu02 stopped responding (Slurm: NODE_FAIL) at ")
    assert "gpu01" not in got["conclusion"]
    crashed = next(n for n in got["nodes"] if n["node"] == "gpu02")
    assert abs(crashed["end"] - end) < 1 and crashed["problems"] == []


def test_node_fail_with_every_epilog_run_is_not_blamed_on_a_node(conn):
    job_on(conn, "gpu01", "48", nodes=2)
    job_on(conn, "gpu02", "48", nodes=2)
    node_fail(conn, "48", "gpu[01-02]", time.time() - 3600, time.time() + 60)
    got = jobs.summary(conn, "48")
    assert got["verdict"] == "node_fail" and got["exclude"] == []
    assert "every node ran its epilog" in got["conclusion"]


def test_an_unknown_job_is_an_error(conn):
    with pytest.raises(jobs.JobError, match="not in the fleet store"):
        jobs.summary(conn, "999")


# --- the AdminComment form ----------------------------------------------------------------------


def packed(body: bytes) -> str:
    return jobs.PREFIX + base64.b32encode(zlib.compress(body)).decode().lower()


def assert_safe_comment(comment: str) -> None:
    """What survives sacctmgr (lower-cases, mangles quotes) and `sacct -P` (no escaping)."""
    assert comment.startswith(jobs.PREFIX)
    assert comment.isascii() and comment.isprintable() and comment == comment.lower()
    for char in "|\n\r\"'` =":
        assert char not in comment, char
    assert len(comment.encode()) <= jobs.COMMENT_MAX


def raw_event(conn, node: str, job: str, process: str) -> None:
    """An Xid whose process name holds raw control characters, merged as a fleet record."""
    record = {"type": "event", "id": f"xid:{node}:raw", "run_id": "r", "node": node,
              "job_id": job, "time": time.time(), "kind": "xid", "code": 13, "gpu": 1,
              "process": process, "class": "app"}  # fmt: skip
    report = records.import_ndjson(conn, io.StringIO(json.dumps(record) + "\n"))
    assert report["added"]["event"] == 1


def test_encode_decode_round_trips_hostile_strings(conn, tmp_path):
    # kmsg keeps bytes escaped (\x22): such names stay that text
    hostile = r"4,901,90100000000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=a|b`c'd\x22<script>, Graphics Exception"  # noqa: E501
    job_on(conn, "gpu07", "47", kmsg=kmsg_with(tmp_path, "k", XID79, hostile), nodes=2)
    job_on(conn, "gpu08", "47", nodes=2)
    raw_event(conn, "gpu07", "47", "bad\x1b[31m\nname|x\x00\"q'")
    original = jobs.summary(conn, "47")
    comment = jobs.encode(original)
    assert_safe_comment(comment)
    back = jobs.decode(comment)
    assert back["conclusion"] == original["conclusion"]
    assert back["verdict"] == "hardware" and back["exclude"] == ["gpu07"]
    assert back["ok_nodes"] == ["gpu08"]  # a quiet node travels as its name
    (node,) = back["nodes"]
    names = sorted(x["process"] for x in node["xids"])
    assert names == [r"a|b`c'd\x22<script>", "bad?[31m name|x?\"q'", r"py|th\x0aon"]
    text = job_text(back)
    assert "<script>" in text and "name|x" in text
    assert all(line.isprintable() for line in text.splitlines())
    assert jobs.digest(comment) == jobs.digest(jobs.encode(jobs.decode(comment)))


def test_what_sacct_shows_back_is_read_whatever_the_case(conn):
    job_on(conn, "gpu02", "48", exit_code=3)
    comment = jobs.encode(jobs.summary(conn, "48"))
    assert len(comment) < 600
    prefix, body = comment[: len(jobs.PREFIX)], comment[len(jobs.PREFIX) :]
    assert jobs.decode(prefix + body.upper())["verdict"] == "failed"
    assert jobs.decode(comment + "\n")["verdict"] == "failed"


def test_a_huge_job_is_bounded_and_keeps_the_faulty_nodes(conn, tmp_path):
    one = xid79_job(conn, tmp_path)
    busy = one["nodes"][0]
    quiet = dict(busy, prolog="ok", epilog="ok", problems=[], xids=[], drain=None)
    # Random names and times: what compresses badly, as a real large job's records would.
    nodes = [dict(quiet, node=os.urandom(6).hex()) for i in range(4000)]
    for i in range(300):
        xids = [dict(busy["xids"][0], time=int.from_bytes(os.urandom(4), "big")) for _ in range(20)]
        nodes.append(dict(busy, node=f"sick{i:03d}", xids=xids))
    comment = jobs.encode(dict(one, nodes=nodes))
    assert_safe_comment(comment)
    back = jobs.decode(comment)
    assert back["ok_count"] == 4000 and back["ok_nodes"] == []
    assert back["omitted"] > 0 and len(back["nodes"]) + back["omitted"] == 300
    assert all(len(n["xids"]) == jobs.ITEMS_MAX and n["more_xids"] == 12 for n in back["nodes"])
    assert back["verdict"] == "hardware" and back["exclude"][0] == "sick000"
    assert "(and 19 more hardware Xids)" in back["conclusion"]


def test_one_more_hardware_xid_is_said_in_the_singular(conn, tmp_path):
    one = xid79_job(conn, tmp_path)
    busy = one["nodes"][0]
    twice = [busy["xids"][0], dict(busy["xids"][0], time=busy["xids"][0]["time"] + 1)]
    back = jobs.decode(jobs.encode(dict(one, nodes=[dict(busy, xids=twice)], omitted=1)))
    assert "(and 1 more hardware Xid) during" in back["conclusion"], back["conclusion"]
    assert "  (1 node left out of the published summary)" in job_text(back)


@pytest.mark.parametrize(
    "comment",
    [
        "other-tool: hello",
        "CUT",
        "not base32 !",
        "[1, 2]",
        '{"format": 99, "nodes": []}',
        '{"format": 1, "nodes": [{"node": "x", "xids": "abc"}]}',
        "BOMB",
    ],
)
def test_a_damaged_or_foreign_comment_is_a_one_line_error(comment):
    if comment == "CUT":
        comment = jobs.encode({"format": 1, "job": "1", "nodes": []})[:-9]
    elif comment == "BOMB":
        comment = packed(b"[" + b"0," * (jobs.UNPACKED_MAX // 2) + b"0]")
    elif comment != "other-tool: hello" and not comment.startswith("not"):
        comment = packed(comment.encode())
    elif comment.startswith("not"):
        comment = jobs.PREFIX + comment
    with pytest.raises(jobs.JobError) as caught:
        jobs.decode(comment)
    assert "\n" not in str(caught.value)


# --- publish, and reading back, against a stand-in sacct/sacctmgr --------------------------------

FAKE = r'''#!{python}
"""sacct/sacctmgr stand-in: jobs in $FAKE_ACCT (JSON), calls appended to $FAKE_ACCT.calls."""
import fcntl, json, os, sys, time
if os.path.basename(sys.argv[0]) == "sacctmgr" and "-i" in sys.argv:
    time.sleep(float(os.environ.get("FAKE_ACCT_WRITE_SLEEP") or 0))  # a slow or hung slurmdbd
path = os.environ["FAKE_ACCT"]
lock = open(path + ".lock", "a")
fcntl.flock(lock, fcntl.LOCK_EX)  # one call at a time, as slurmdbd serialises its writes
with open(path + ".calls", "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\n")
with open(path) as f:
    acct = json.load(f)
args = sys.argv[1:]
if os.path.basename(sys.argv[0]) == "sacctmgr":
    if args[:2] == ["-n", "show"]:
        print("Configuration data as of now\nPrivateData = none\n\nSlurmDBD configuration:")
        print("PrivateData            = " + acct["private"])
        sys.exit(0)
    job = args[4].split("=", 1)[1]
    if acct["jobs"][job].get("refuse"):
        print(" Error: slurmdbd: refused", file=sys.stderr)
        sys.exit(1)
    value = args[6].split("=", 1)[1].replace('"', "`").replace("'", "`")
    acct["jobs"][job]["comment"] = value
    with open(path, "w") as f:
        json.dump(acct, f)
    print(" Modified jobs...")
    sys.exit(0)
fields = args[args.index("-o") + 1].split(",")
for job in args[args.index("-j") + 1].split(","):
    row = acct["jobs"].get(job)
    if row is None or acct["caller"] not in ("*", row["user"]):
        continue
    values = {{"JobID": job, "JobIDRaw": job, "User": row["user"], "State": row["state"],
              "End": row["end"], "AdminComment": row["comment"]}}
    print("|".join(values[f] for f in fields))
'''


@pytest.fixture
def acct(tmp_path, monkeypatch):
    """A stand-in accounting: {'path', 'bin', 'jobs', 'write(...)', 'calls()'}."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("sacct", "sacctmgr"):
        script = bindir / name
        script.write_text(FAKE.format(python=sys.executable))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    path = tmp_path / "acct.json"

    class Acct:
        bin = str(bindir)
        env = {"FAKE_ACCT": str(path), "SLURMHEALTH_SLURM_BIN": str(bindir)}

        def write(self, jobs_: dict, private: str = "jobs", caller: str = "*") -> None:
            path.write_text(json.dumps({"jobs": jobs_, "private": private, "caller": caller}))

        def read(self) -> dict:
            return json.loads(path.read_text())["jobs"]

        def calls(self, tool: str) -> list:
            if not os.path.exists(f"{path}.calls"):
                return []
            lines = open(f"{path}.calls").read().splitlines()
            return [c for c in map(json.loads, lines) if c[0] == tool]

    monkeypatch.setenv("FAKE_ACCT", str(path))  # for the library calls made in-process
    return Acct()


def ended(user: str = "alice", comment: str = "") -> dict:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    return {"user": user, "state": "FAILED", "end": stamp, "comment": comment}


def test_publish_writes_each_summary_once_and_again_only_when_it_changed(conn, tmp_path, acct):
    xid79_job(conn, tmp_path, "41")
    job_on(conn, "gpu02", "42", exit_code=3)
    job_on(conn, "gpu03", "43")
    acct.write({"41": ended(), "42": ended(), "43": ended(comment="other-tool: keep")})
    client = slurm.Slurm(acct.bin)
    now = time.time()

    first = jobs.publish(conn, client, now - 3600, now + 60)
    assert first["published"] == ["41", "42"]
    assert first["foreign"] == [("43", "other-tool: keep")]
    stored = acct.read()
    assert stored["43"]["comment"] == "other-tool: keep"
    assert jobs.decode(stored["41"]["comment"])["verdict"] == "hardware"
    assert jobs.decode(stored["42"]["comment"])["verdict"] == "failed"
    writes = len(acct.calls("sacctmgr"))

    again = jobs.publish(conn, client, now - 3600, now + 60)
    assert again["published"] == [] and again["unchanged"] == 2
    assert len(acct.calls("sacctmgr")) == writes + 1  # the privacy check only: nothing written

    # The node is drained after the first publish: job 41's summary changed, only it is written.
    store.record_action(conn, "gpu07", "drain", "slurmhealth: GPU 3", "slurmhealth healthcheck")
    third = jobs.publish(conn, client, now - 3600, now + 60)
    assert third["published"] == ["41"] and third["unchanged"] == 1
    assert "the node is drained" in jobs.decode(acct.read()["41"]["comment"])["conclusion"]
    published = conn.execute("SELECT job_id, bytes FROM published ORDER BY job_id").fetchall()
    assert [j for j, _ in published] == ["41", "42"]
    assert all(0 < size <= jobs.COMMENT_MAX for _, size in published)


def test_publish_writes_many_at_once_and_a_refused_write_costs_only_its_job(conn, acct):
    """sacctmgr calls run a few at once (each waits on slurmdbd): every summary lands, in the
    order of the jobs; a write slurmdbd refuses is reported and not remembered, so the next
    publish tries it again, and the others are remembered."""
    ids = [str(100 + i) for i in range(3 * jobs.PUBLISH_AT_ONCE)]
    for job_id in ids:
        job_on(conn, "gpu02", job_id, exit_code=3)
    rows = {job_id: ended() for job_id in ids}
    rows["105"]["refuse"] = True
    acct.write(rows)
    client = slurm.Slurm(acct.bin)
    now = time.time()
    first = jobs.publish(conn, client, now - 3600, now + 60)
    assert first["published"] == [j for j in ids if j != "105"]
    assert first["failed"] == [("105", "sacctmgr -i: Error: slurmdbd: refused")]
    stored = acct.read()
    assert all(jobs.decode(stored[j]["comment"])["verdict"] == "failed" for j in ids if j != "105")
    assert stored["105"]["comment"] == ""
    remembered = {j for (j,) in conn.execute("SELECT job_id FROM published")}
    assert remembered == set(ids) - {"105"}
    del rows["105"]["refuse"]
    acct.write({**rows, **{j: stored[j] for j in ids if j != "105"}})
    again = jobs.publish(conn, client, now - 3600, now + 60)
    assert again["published"] == ["105"] and again["unchanged"] == len(ids) - 1


def test_publish_looks_back_to_the_last_publish_that_wrote_everything(conn, acct):
    """The head node down for hours: the next `publish --since 2h` still writes the summaries
    of the jobs that ended since the last publish that wrote all it had to. A failed write
    leaves that mark where it was, so the job is tried again; never more than
    PUBLISH_CATCH_UP_S back."""
    job_on(conn, "gpu02", "51", exit_code=3)
    job_on(conn, "gpu03", "52", exit_code=3)
    rows = {"51": ended(), "52": ended()}
    rows["52"]["refuse"] = True
    acct.write(rows)
    client = slurm.Slurm(acct.bin)
    ended_at = time.time()
    span = 2 * 3600.0

    def publish_at(end: float) -> dict:
        return jobs.publish(conn, client, jobs.publish_start(conn, end - span, end), end)

    assert jobs.publish_start(conn, ended_at - span, ended_at) == ended_at - span  # first run
    before = publish_at(ended_at - 3 * 3600)  # the last publish before the head node went down
    assert before["published"] == [] and before["failed"] == []
    back = ended_at + 5 * 3600  # 5 hours later: the jobs ended outside --since 2h
    assert jobs.finished_jobs(conn, back - span, back) == []
    caught_up = publish_at(back)
    assert caught_up["published"] == ["51"]
    assert [job for job, _ in caught_up["failed"]] == ["52"]
    del rows["52"]["refuse"]
    acct.write({**rows, "51": acct.read()["51"]})
    later = ended_at + 10 * 3600  # the failed write kept the mark: 52 is tried again
    assert publish_at(later)["published"] == ["52"]
    assert jobs.publish_start(conn, later + 600 - span, later + 600) == later - span
    far = later + 40 * 86400
    assert jobs.publish_start(conn, far - span, far) == far - jobs.PUBLISH_CATCH_UP_S
    assert jobs.publish_start(conn, far - 60 * 86400, far) == far - 60 * 86400  # --since 60d


def test_publish_stops_writing_once_its_budget_is_spent(conn, acct, monkeypatch):
    """A slurmdbd that takes its time over every write (reads answering) must not stretch one
    publish past its cycle: writes not begun within the budget are reported, not remembered,
    and left for the next publish."""
    ids = [str(200 + i) for i in range(3 * jobs.PUBLISH_AT_ONCE)]
    for job_id in ids:
        job_on(conn, "gpu02", job_id, exit_code=3)
    acct.write({job_id: ended() for job_id in ids})
    monkeypatch.setenv("FAKE_ACCT_WRITE_SLEEP", "0.5")
    monkeypatch.setattr(jobs, "PUBLISH_BUDGET_S", 0.9)  # each worker's third write is late
    now = time.time()
    report = jobs.publish(conn, slurm.Slurm(acct.bin), now - 3600, now + 60)
    late = [j for j, why in report["failed"] if "spent" in why]
    assert len(late) >= jobs.PUBLISH_AT_ONCE
    assert sorted(late + report["published"]) == ids
    remembered = {j for (j,) in conn.execute("SELECT job_id FROM published")}
    assert remembered == set(report["published"])


def test_publish_refuses_without_private_data_and_the_cli_says_why(
    conn, fleet_store, tmp_path, acct
):
    job_on(conn, "gpu02", "42", exit_code=3)
    conn.close()
    acct.write({"42": ended()}, private="none")
    db = fleet_store
    proc = run_cli("publish", "--db", db, "--slurm-bin", acct.bin, env=acct.env)
    assert proc.returncode == 1
    assert "PrivateData=jobs" in proc.stderr and "Traceback" not in proc.stderr
    assert "SLURMHEALTH_PUBLISH=no" in proc.stderr  # the periodic job's way out, said
    assert acct.read()["42"]["comment"] == ""
    proc = run_cli("publish", "--db", db, "--slurm-bin", acct.bin, "--public", env=acct.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1 summary published")


def test_job_reads_the_published_summary_through_accounting(conn, tmp_path, acct):
    summary = xid79_job(conn, tmp_path, "41")
    acct.write({"41": ended(comment=jobs.encode(summary))}, caller="alice")
    nowhere = str(tmp_path / "no-sync.db")
    proc = run_cli("job", "41", "--db", nowhere, "--json", env=acct.env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["source"] == "accounting"
    assert got["conclusion"] == summary["conclusion"] and got["exclude"] == ["gpu07"]
    text = run_cli("job", "41", "--db", nowhere, env=acct.env).stdout
    assert text.splitlines()[-1] == f"conclusion: {summary['conclusion']}"
    assert not os.path.exists(nowhere)  # a reader never creates a store


def test_job_from_the_fleet_store_for_whoever_can_read_it(conn, fleet_store, tmp_path):
    job_on(conn, "gpu02", "42", exit_code=3)
    proc = run_cli("job", "42", "--db", fleet_store, "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert (got["source"], got["verdict"], got["exit_code"]) == ("fleet store", "failed", 3)


def test_a_job_missing_from_a_readable_fleet_store_says_so_without_asking_sacct(
    conn, fleet_store, tmp_path
):
    """An admin's store that lacks the job is the answer: sacct (which publish feeds from this
    same store) could add nothing, and on a head node without slurm.conf it only fails with a
    DNS lookup error."""
    job_on(conn, "gpu02", "42", exit_code=3)
    env = {"SLURMHEALTH_SLURM_BIN": str(tmp_path / "no-slurm-here")}
    proc = run_cli("job", "43", "--db", fleet_store, env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"Error: job 43 is not in the fleet store {fleet_store} "
        "(not collected yet, or no job of these nodes)"
    )


def test_a_readable_fleet_store_that_is_refused_says_why_not_that_the_job_is_missing(tmp_path):
    """A store in a folder anyone may change is refused (as `report` says): `job` said the job
    was not collected yet, hiding why."""
    folder = tmp_path / "open"
    folder.mkdir()
    store.connect(str(folder / "fleet.db")).close()
    os.chmod(folder, 0o1777)
    proc = run_cli("job", "42", "--db", str(folder / "fleet.db"))
    assert proc.returncode == 1
    assert "fleet store cannot be used" in proc.stderr and "writable by" in proc.stderr
    assert "not collected yet" not in proc.stderr


def test_a_fleet_store_an_admin_reads_through_its_group_says_what_sqlite_may_not_write(
    public_dir,
):
    """Read through its group (0640 in a 0750 directory), SQLite still must make the store's
    -shm beside it: said, not `attempt to write a readonly database`."""
    made = public_dir / "made.db"
    store.connect(str(made)).close()
    shared = public_dir / "shared"
    shared.mkdir(mode=0o750)
    db = shared / "fleet.db"
    db.write_bytes(made.read_bytes())
    for path, mode in ((shared, 0o750), (db, 0o640)):
        os.chown(path, 0, 65534)
        path.chmod(mode)
    proc = run_as_nobody("job", "42", "--db", str(db))
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
    assert proc.stderr == (
        f"Error: fleet store {db} cannot be used: SQLite writes beside a store it reads, and "
        f"{shared} is not this user's to write: run as root, or --db a copy you own\n"
    )


@pytest.mark.parametrize(
    ("job", "row", "message"),
    [
        ("77", None, "job 77 not found, or not yours"),
        ("78", ended(user="bob"), "job 78 not found, or not yours"),
        ("79", ended(), "no health summary for job 79 yet"),
        ("80", {**ended(), "state": "RUNNING", "end": "Unknown"}, "job 80 is running"),
        ("81", ended(comment="other-tool: x"), "has no slurmhealth summary"),
        ("82", ended(comment=jobs.PREFIX + "abcdefgh"), "damaged"),
        ("8;rm -rf /", None, "not a job id"),
    ],
)
def test_job_errors_are_one_line_and_non_zero(tmp_path, acct, job, row, message):
    acct.write({job: row} if row else {}, caller="alice")
    proc = run_cli("job", job, "--db", str(tmp_path / "none.db"), env=acct.env)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_missing_summary_says_when_it_is_due():
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 60))
    due = jobs.local_time(time.mktime(time.localtime(now - 60)) + jobs.PUBLISH_LATENCY_S)
    assert f"expect it by {due}" in jobs._not_published("5", "COMPLETED", stamp, now)
    old = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 86400))
    assert "ask your admins" in jobs._not_published("5", "COMPLETED", old, now)


def test_a_job_refused_everywhere_never_ran(conn):
    job_on(conn, "gpu03", "49", prolog="gpu-lost")
    got = jobs.summary(conn, "49")
    assert got["verdict"] == "refused"
    assert got["conclusion"] == (
        "the prolog on gpu03 found GPU 3 GpuIsLost before your job started: the node was "
        "refused, so your job never ran there; Slurm requeues such a job (unless it was "
        "submitted with --no-requeue) and resubmitting is safe"
    )


# --- damaged AdminComments: a one-line JobError, never a traceback ------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)


@pytest.fixture(scope="module")
def published_facts(tmp_path_factory) -> dict:
    """What `publish` writes for a real job: a GPU lost on a drained node, an Xid of the
    application's, a node the prolog refused, a quiet node (from a real store)."""
    tmp_path = tmp_path_factory.mktemp("published")
    conn = store.connect(str(tmp_path / "fleet.db"))
    app = r"4,901,90100000000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=python, Graphics Exception"  # noqa: E501
    job_on(conn, "gpu07", "41", kmsg=kmsg_with(tmp_path, "k", XID79, app), signal=9, nodes=3)
    job_on(conn, "gpu08", "41", nodes=3)
    job_on(conn, "gpu09", "41", prolog="gpu-lost", nodes=3)
    store.record_action(conn, "gpu07", "drain", "slurmhealth: GPU 3", "slurmhealth epilog")
    return jobs.compact(jobs.summary(conn, "41"))


def _paths(doc: object, here: tuple = ()) -> list:
    out = [here]
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in items:
        out += _paths(value, (*here, key))
    return out


def _replaced(doc: dict, path: tuple, value: object) -> object:
    if not path:
        return value
    out = json.loads(json.dumps(doc))
    at = out
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return out


def assert_decodes_or_refuses(comment: str) -> None:
    """decode() gives a summary that renders as printable lines, or a one-line JobError."""
    try:
        got = jobs.decode(comment)
    except jobs.JobError as exc:
        assert "\n" not in str(exc)
        return
    assert all(line.isprintable() for line in job_text(got).splitlines())
    json.dumps(got)


def test_the_published_facts_decode(published_facts):
    back = jobs.decode(jobs.encode(published_facts))
    assert back["verdict"] == "hardware" and back["ok_nodes"] == ["gpu08"]
    assert {n["node"] for n in back["nodes"]} == {"gpu07", "gpu09"}
    assert {x["code"] for x in back["nodes"][0]["xids"]} == {13, 79}


@settings(max_examples=400, deadline=None)
@given(data=st.data(), value=_JSON)
def test_a_wrong_type_anywhere_in_a_summary_is_refused_or_rendered(published_facts, data, value):
    path = data.draw(st.sampled_from(_paths(published_facts)))
    assert_decodes_or_refuses(packed(json.dumps(_replaced(published_facts, path, value)).encode()))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_field_missing_anywhere_in_a_summary_is_refused_or_rendered(published_facts, data):
    path = data.draw(st.sampled_from(_paths(published_facts)[1:]))
    doc = json.loads(json.dumps(published_facts))
    at = doc
    for key in path[:-1]:
        at = at[key]
    del at[path[-1]]
    assert_decodes_or_refuses(packed(json.dumps(doc).encode()))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), char=st.sampled_from("abcdefghijklmnopqrstuvwxyz234567=!é\x00"))
def test_a_mutated_comment_is_refused_or_rendered(published_facts, data, char):
    comment = jobs.encode(published_facts)
    body = comment[len(jobs.PREFIX) :]
    where = data.draw(st.integers(0, len(body) - 1))
    how = data.draw(st.sampled_from(["replace", "insert", "delete", "cut"]))
    if how == "replace":
        body = body[:where] + char + body[where + 1 :]
    elif how == "insert":
        body = body[:where] + char + body[where:]
    elif how == "delete":
        body = body[:where] + body[where + 1 :]
    else:
        body = body[:where]
    assert_decodes_or_refuses(jobs.PREFIX + body)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300))
def test_any_text_is_refused_or_rendered(text):
    assert_decodes_or_refuses(text)
    assert_decodes_or_refuses(jobs.PREFIX + text)
    jobs.parse_comments(text)  # never raises either


DEEP = 100_000


def damaged_comments(facts: dict) -> dict:
    """One real published summary, damaged in each way a comment can be."""
    good = jobs.encode(facts)
    node = facts["nodes"][0]

    def with_node(**changes: object) -> str:
        return packed(json.dumps(dict(facts, nodes=[dict(node, **changes)])).encode())

    return {
        "bad base32": good[:-12] + "!!!!" + good[-8:],
        "cut": good[:-9],
        "bad zlib": jobs.PREFIX + base64.b32encode(b"\x78\x9c" + os.urandom(64)).decode().lower(),
        "zip bomb": packed(b"[" + b"0," * (jobs.UNPACKED_MAX // 2) + b"0]"),
        "deep nesting": packed(b"[" * DEEP + b"]" * DEEP),
        "deep nesting in a node": packed(
            b'{"format": 1, "nodes": [' + b"[" * DEEP + b"]" * DEEP + b"]}"
        ),
        "not an object": packed(b'"summary"'),
        "format true": packed(json.dumps(dict(facts, format=True)).encode()),
        "nodes an object": packed(json.dumps(dict(facts, nodes={"gpu07": node})).encode()),
        "exit code a list": packed(json.dumps(dict(facts, exit_code=[1])).encode()),
        "ok nodes of numbers": packed(json.dumps(dict(facts, ok_nodes=[1, "gpu08"])).encode()),
        "ok count null": packed(json.dumps(dict(facts, ok_count=None)).encode()),
        "end NaN": packed(json.dumps(dict(facts, end=float("nan"))).encode()),
        "node name a number": with_node(node=7),
        "prolog a list": with_node(prolog=["ok"]),
        "xid code a list": with_node(xids=[dict(node["xids"][0], code=[79])]),
        "xid time a string": with_node(xids=[dict(node["xids"][0], time="yesterday")]),
        "problems a string": with_node(problems="gpu lost"),
        "drain a number": with_node(drain=1),
        "more xids a string": with_node(more_xids="many"),
    }


def test_every_damaged_comment_is_a_one_line_job_error(published_facts):
    for why, comment in damaged_comments(published_facts).items():
        with pytest.raises(jobs.JobError) as caught:
            jobs.decode(comment)
        assert "\n" not in str(caught.value), why


def test_slurmhealth_job_says_a_damaged_summary_in_one_line(published_facts, tmp_path, acct):
    """The real command, reading each damaged comment back through (stand-in) sacct."""
    comments = damaged_comments(published_facts)
    ids = {why: str(100 + i) for i, why in enumerate(comments)}
    acct.write({ids[why]: ended(comment=c) for why, c in comments.items()}, caller="alice")
    for why, job in ids.items():
        proc = run_cli("job", job, "--db", str(tmp_path / "none.db"), env=acct.env)
        assert proc.returncode == 1, (why, proc.stderr)
        assert "Traceback" not in proc.stderr, (why, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, (why, proc.stderr)
        assert "published summary" in proc.stderr, (why, proc.stderr)


def test_a_hostile_summary_that_decodes_prints_no_control_characters(
    published_facts, acct, tmp_path
):
    """Well-typed but hostile strings everywhere a published summary carries text."""
    bad = "\x1b[2J\x1b]0;owned\x07\r\nfake\x00line\x9b31m"
    node = dict(published_facts["nodes"][0], node=bad, state=bad, prolog=bad, epilog=bad)
    node["xids"] = [dict(x, process=bad, **{"class": bad}) for x in node["xids"]]
    node["problems"] = [
        dict(p, check=bad, status=bad, message=bad, phase=bad) for p in node["problems"]
    ]
    node["drain"] = dict(node["drain"], reason=bad, still=bad)
    facts = dict(
        published_facts, job=bad, user=bad, state=bad, uid=bad, nodes=[node], ok_nodes=[bad]
    )
    acct.write({"41": ended(comment=packed(json.dumps(facts).encode()))}, caller="alice")
    proc = run_cli("job", "41", "--db", str(tmp_path / "none.db"), env=acct.env)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        assert line.isprintable(), repr(line)
    as_json = run_cli("job", "41", "--db", str(tmp_path / "none.db"), "--json", env=acct.env)
    assert as_json.returncode == 0 and as_json.stdout.isascii()
    assert all(ch >= " " for ch in as_json.stdout.replace("\n", ""))
    assert json.loads(as_json.stdout)["nodes"][0]["node"] == bad


# --- JOB_ID as Slurm writes it -----------------------------------------------------------------


@pytest.mark.parametrize("text", ["abc", "12_", "12+x", "12_3+1", "１２", "8;rm -rf /"])
def test_a_job_id_that_is_none_is_a_usage_error(tmp_path, text):
    proc = run_cli("job", text, "--db", str(tmp_path / "none.db"))
    assert proc.returncode == 2
    assert proc.stderr == (
        f"Error: Invalid value for 'JOB_ID': not a job id: {text!r} (e.g. 12345, 12345_7, "
        "12345+1) (see 'slurmhealth job --help')\n"
    )


@pytest.mark.parametrize("text", ["123", "123_4", "123+1"])
def test_array_tasks_and_het_job_components_are_job_ids(tmp_path, text):
    fleet = str(tmp_path / "fleet.db")
    store.connect(fleet).close()
    proc = run_cli("job", text, "--db", fleet)
    assert proc.returncode == 1  # looked up: not collected
    assert f"job {text} is not in the fleet store" in proc.stderr


@pytest.mark.parametrize(
    ("bus", "gpu"), [("0000:5d:00", "GPU 3 (0000:5d:00)"), ("0000:ff:00", "GPU 0000:ff:00")]
)
def test_a_job_names_its_gpu_as_the_nodes_checks_do(tmp_path, bus, gpu):
    """The real prolog and epilog of a job, then `slurmhealth job`: the Xid line and the
    conclusion name the GPU as the failed check (and the node's Reason) do, by index and bus
    id, or by bus id alone for a GPU NVML does not list (off the bus), never `GPU None`."""
    log = tmp_path / "kmsg"
    log.write_text("")
    (tmp_path / "slurmhealth.toml").write_text(
        f'[settings]\ngpu_source = "{snapshot_path("healthy")}"\nkmsg = "{log}"\n'
        f'sysfs_root = "{tmp_path}"\nmonitor_only = true\n'
    )
    env = {
        "SLURMD_NODENAME": "gpu07", "SLURM_JOB_ID": "5", "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000", "SLURMHEALTH_CONFIG": str(tmp_path / "slurmhealth.toml"),
        "SLURMHEALTH_STATE_DIR": str(tmp_path),
    }  # fmt: skip
    assert run_cli("prolog", env=env).returncode == 0
    log.write_text(f"3,9,9,-;NVRM: Xid (PCI:{bus}): 79, pid=7, name=python, GPU has fallen off\n")
    assert run_cli("epilog", env=env).returncode == 0
    done = run_cli("job", "5", "--db", str(tmp_path / "gpu07.db"))
    assert done.returncode == 0, done.stderr
    check, xid = [line for line in done.stdout.splitlines() if "Xid 79" in line][:2]
    assert f"xid.hardware fail: {gpu} Xid 79" in check
    assert f"  {gpu}  Xid 79 (fail)" in xid
    assert f"lost {gpu} (Xid 79)" in done.stdout
    said = json.loads(run_cli("job", "5", "--db", str(tmp_path / "gpu07.db"), "--json").stdout)
    assert said["nodes"][0]["xids"][0]["bus_id"] == bus
