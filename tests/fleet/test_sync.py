"""The fleet store: export/import, collect, Slurm accounting, lemon signals (real SQLite files)."""

from __future__ import annotations

import io
import json
import os
import pathlib
import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import FIXTURES, REPO, require_real, run_cli, snapshot_path, tmpfs
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import simulate
from slurmhealth.core import files, store
from slurmhealth.core.result import clean
from slurmhealth.core.slurm import SlurmError
from slurmhealth.fleet import accounting, collect, policy, records, rollup, signals
from slurmhealth.node import config, runner

DAY = 86400.0
T0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
KEYS = {
    "runs": "id",
    "results": "run_id, check_name",
    "events": "id",
    "jobs": "node, job_id",
    "actions": "id",
    "counters": "node, device, counter, time",
}


def dump(conn: sqlite3.Connection) -> dict:
    """Every exported table, ordered by its record key."""
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY {k}").fetchall() for t, k in KEYS.items()}


def recorded_run(node: str, phase: str, snapshot: str, kmsg: str = "xid-forms.kmsg"):
    options = runner.Options(
        gpu_source=snapshot_path(snapshot), kmsg=os.path.join(FIXTURES, "kmsg", kmsg)
    )
    run = runner.run(node, config.defaults(), options, ["gpu", "xid"], phase)
    run.node = node
    return run


def moved_in(spool: pathlib.Path, name: str, node: str, live: bool = False) -> object:
    """A node store made in a private folder beside `spool` and moved into it (root never opens
    a store by name in a folder others may write: core/store.py). `live`: still open, with
    its -wal and -shm moved too and the connection on the moved files (returned)."""
    private = spool.parent / f".{name}.private"
    private.mkdir(mode=0o700, exist_ok=True)
    conn = node_store(str(private / name), node)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    if not live:
        conn.close()
    for suffix in ("", "-wal", "-shm"):
        if (private / (name + suffix)).exists():
            os.rename(private / (name + suffix), spool / (name + suffix))
    return conn if live else None


def node_store(path: str, node: str) -> sqlite3.Connection:
    """A node store as the hooks leave it: prolog/epilog of a job, a health check, a drain."""
    conn = store.connect(path)
    job = {"uid": 1000, "user": "alice", "start": T0, "state": "running", "num_nodes": 1}
    store.record_run(conn, recorded_run(node, "prolog", "healthy").records("41"), job)
    ended = {"end": T0 + 60, "state": "ended", "exit_code": 0, "signal": 0}
    store.record_run(conn, recorded_run(node, "epilog", "ecc-dbe").records("41"), ended)
    healthcheck = recorded_run(node, "healthcheck", "thermal", "hostile-names.kmsg")
    store.record_run(conn, healthcheck.records())
    store.record_action(conn, node, "drain", "slurmhealth: gpu.ecc", "slurmhealth epilog")
    return conn


def export_text(conn: sqlite3.Connection, since: float | None = None) -> str:
    out = io.StringIO()
    records.export(conn, out, since)
    return out.getvalue()


# --- export / import ------------------------------------------------------------------------


def test_export_import_round_trip_equals_the_source(tmp_path):
    source = node_store(str(tmp_path / "gpu01.db"), "gpu01")
    text = export_text(source)
    header = json.loads(text.splitlines()[0])
    assert header["type"] == "header" and header["format"] == records.FORMAT
    kinds = {json.loads(line)["type"] for line in text.splitlines()[1:]}
    assert kinds == set(records.KINDS)  # every kind is exercised
    target = store.connect(str(tmp_path / "fleet.db"))
    report = records.import_ndjson(target, io.StringIO(text))
    assert report["bad_count"] == 0 and report["truncated"] is None
    assert dump(target) == dump(source)
    assert target.execute("SELECT count(*) FROM baselines").fetchone()[0] == 0  # node-local
    assert report["records"] == sum(len(rows) for rows in dump(source).values())


def test_importing_twice_changes_nothing(tmp_path):
    text = export_text(node_store(str(tmp_path / "gpu01.db"), "gpu01"))
    spool = tmp_path / "gpu01.ndjson"
    spool.write_text(text)
    target = store.connect(str(tmp_path / "fleet.db"))
    first = records.import_ndjson(target, str(spool))
    before = dump(target)
    second = records.import_ndjson(target, str(spool))
    assert sum(first["added"].values()) == first["records"] > 0
    assert sum(second["added"].values()) == 0 and second["unchanged"] == second["records"]
    assert dump(target) == before


def test_small_chunks_give_the_same_store(tmp_path, monkeypatch):
    text = export_text(node_store(str(tmp_path / "gpu01.db"), "gpu01"))
    whole = store.connect(str(tmp_path / "a.db"))
    records.import_ndjson(whole, io.StringIO(text))
    monkeypatch.setattr(records, "CHUNK", 2)
    chunked = store.connect(str(tmp_path / "b.db"))
    records.import_ndjson(chunked, io.StringIO(text))
    assert dump(chunked) == dump(whole)


def test_a_truncated_last_line_is_reported_and_skipped(tmp_path):
    text = export_text(node_store(str(tmp_path / "gpu01.db"), "gpu01"))
    lines = text.splitlines(keepends=True)
    cut = "".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2]  # a writer still running
    spool = tmp_path / "cut.ndjson"
    spool.write_bytes(cut.encode())
    target = store.connect(str(tmp_path / "fleet.db"))
    report = records.import_ndjson(target, str(spool))
    assert report["truncated"] == len(lines) and report["bad_count"] == 0
    assert report["records"] == len(lines) - 2  # all but the header and the cut line
    last = json.loads(lines[-1])
    table = records.KINDS[last["type"]].table
    assert table == "counters"  # the last kind of an export (store.KINDS order)
    whole = sum(json.loads(line)["type"] == last["type"] for line in lines[1:])
    assert target.execute("SELECT count(*) FROM counters").fetchone()[0] == whole - 1


def test_malformed_lines_are_reported_and_the_rest_imported(tmp_path):
    good = {"type": "action", "id": "a1", "node": "gpu01", "time": T0, "action": "drain"}
    good.update(reason="slurmhealth: x", actor="test")
    lines = [
        json.dumps(good),
        "not json",
        json.dumps({"type": "run", "id": "r1"}),  # required columns missing
        json.dumps({"type": "gossip", "id": "x"}),
        json.dumps({**good, "id": "a2", "time": float("nan")}),  # NaN would be a NULL
        json.dumps({**good, "id": "a3", "detail": "\ud800"}),  # a lone surrogate
        json.dumps({**good, "id": "a4", "ok": 2**70}),
        "[1, 2]",
        json.dumps({**good, "id": "a5"}),
    ]
    target = store.connect(str(tmp_path / "fleet.db"))
    report = records.import_ndjson(target, [line + "\n" for line in lines])
    assert [n for n, _ in report["bad"]] == [2, 3, 4, 5, 6, 7, 8]
    assert report["truncated"] is None and report["records"] == 2
    assert "run without node" in report["bad"][1][1]
    ids = [r[0] for r in target.execute("SELECT id FROM actions ORDER BY id")]
    assert ids == ["a1", "a5"]


def test_a_newer_format_is_refused(tmp_path):
    target = store.connect(str(tmp_path / "fleet.db"))
    with pytest.raises(records.FleetError, match="newer"):
        records.import_ndjson(target, ['{"type": "header", "format": 99}\n'])


def test_export_since_keeps_only_newer_records(tmp_path):
    conn = store.connect(str(tmp_path / "gpu01.db"))
    conn.execute(
        "INSERT INTO runs VALUES ('old', 'gpu01', NULL, 'check', ?, 1, 'ok', 'v', '{}')",
        (T0 - 10 * DAY,),
    )
    conn.execute(
        "INSERT INTO runs VALUES ('new', 'gpu01', NULL, 'check', ?, 1, 'ok', 'v', '{}')", (T0,)
    )
    conn.execute("INSERT INTO jobs (node, job_id, start, end) VALUES ('gpu01', '1', ?, ?)", (0, T0))
    conn.execute("INSERT INTO jobs (node, job_id, start) VALUES ('gpu01', '2', ?)", (T0 - 9 * DAY,))
    records = [json.loads(x) for x in export_text(conn, since=T0 - DAY).splitlines()[1:]]
    assert [(r["type"], r.get("id") or r.get("job_id")) for r in records] == [
        ("run", "new"),
        ("job", "1"),  # ended within the window, though it started long before
    ]


def job_record(**columns) -> str:
    return json.dumps({"type": "job", "node": "gpu01", "job_id": "7", **columns}) + "\n"


def test_job_rows_fill_in_and_never_go_back(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    prolog = job_record(uid=1000, user="alice", start=T0, state="running", num_nodes=2)
    epilog = job_record(uid=1000, user="alice", start=T0, end=T0 + 5, exit_code=3, state="ended")
    accounting = job_record(slurm_state="FAILED", exit_code=0, start=T0 - 1)
    for lines in ([prolog], [epilog], [accounting], [prolog], [prolog, epilog, accounting]):
        records.import_ndjson(conn, lines)
    row = conn.execute(
        "SELECT uid, user, start, end, exit_code, state, num_nodes, slurm_state FROM jobs"
    ).fetchone()
    assert row == (1000, "alice", T0, T0 + 5, 3, "ended", 2, "FAILED")
    again = records.import_ndjson(conn, [prolog, epilog, accounting])
    assert again["unchanged"] == 3


def test_an_event_keeps_the_job_the_epilog_gave_it(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    base = {"type": "event", "id": "xid:gpu01:b:7:79", "run_id": "r", "node": "gpu01"}
    base.update(time=T0, kind="xid", code=79, **{"class": "fail"})
    seen_by_healthcheck = json.dumps({**base, "job_id": None}) + "\n"
    seen_by_epilog = json.dumps({**base, "job_id": "41"}) + "\n"
    records.import_ndjson(conn, [seen_by_healthcheck, seen_by_epilog, seen_by_healthcheck])
    assert conn.execute("SELECT job_id FROM events").fetchall() == [("41",)]


# --- collect --------------------------------------------------------------------------------


def test_a_merged_store_brings_no_row_an_import_would_refuse(tmp_path):
    """The same checks as an NDJSON line's for a node store merged whole: a node name no node
    can have (a node set would reach `scontrol` as 64 nodes; a terminal escape or a bidi
    override would reach the admin's screen), a string where a time belongs. The store's good
    rows come in."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node_store(str(spool / "gpu01.db"), "gpu01").close()
    with sqlite3.connect(spool / "gpu01.db") as raw:
        for i, name in enumerate(["gpu[01-64]", "gpu01\x1b[2J", "gpu\u202e10", "-gpu01"]):
            raw.execute(
                f"INSERT INTO actions SELECT 'x1{i}', ?, time, action, reason, actor, ok, "
                "detail FROM actions LIMIT 1",
                (name,),
            )
            raw.execute(
                f"INSERT INTO events SELECT 'e{i}' || id, run_id, ?, job_id, time, kind, code, "
                "gpu, bus_id, pid, process, class, action, text, repeats FROM events LIMIT 1",
                (name,),
            )
        raw.execute(
            "INSERT INTO runs (id, node, job_id, phase, started, duration, verdict, tool_version,"
            " sources) VALUES ('x2', 'gpu01', NULL, 'check', 'yesterday', 1, 'ok', '0', '{}')"
        )
    conn = store.connect(str(tmp_path / "fleet.db"))
    collect.collect(conn, str(spool))
    for table in ("actions", "events"):
        assert {r[0] for r in conn.execute(f"SELECT node FROM {table}")} == {"gpu01"}  # noqa: S608
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] > 0
    ids = {r[0] for r in conn.execute("SELECT id FROM runs")}
    assert ids and "x2" not in ids


def test_collect_merges_node_stores_and_spools_and_skips_garbage(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    a = node_store(str(spool / "gpu01.db"), "gpu01")
    b = node_store(str(spool / "gpu02.db"), "gpu02")
    c = node_store(str(tmp_path / "gpu03.db"), "gpu03")
    (spool / "gpu03.ndjson").write_text(export_text(c))
    (spool / "garbage.db").write_bytes(b"this is not an SQLite file, just bytes " * 200)
    (spool / "gpu04.ndjson.part").write_text("{")  # an export still being written: not read
    fleet_path = str(spool / "fleet.db")  # the fleet store in the same folder is not a source
    conn = store.connect(fleet_path)
    report = collect.collect(conn, str(spool))
    assert [os.path.basename(p) for p, _ in report["merged"]] == [
        "gpu01.db",
        "gpu02.db",
        "gpu03.ndjson",
    ]
    assert [(os.path.basename(p), why) for p, why in report["skipped"]] == [
        ("garbage.db", "file is not a database")
    ]
    expected = {t: sorted(dump(a)[t] + dump(b)[t] + dump(c)[t]) for t in KEYS}
    assert {t: sorted(rows) for t, rows in dump(conn).items()} == expected
    again = collect.collect(conn, str(spool))
    assert sum(again["added"].values()) == 0 and len(again["skipped"]) == 1


def test_a_store_still_being_copied_is_skipped(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    conn = node_store(str(tmp_path / "gpu01.db"), "gpu01")
    conn.executemany(
        "INSERT INTO runs VALUES (?, 'gpu01', NULL, 'check', 1.0, 1, 'ok', 'v', ?)",
        [(f"x{i}", "{}" * 200) for i in range(300)],
    )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = (tmp_path / "gpu01.db").read_bytes()
    for share in (0.3, 0.6, 0.99):  # an scp or rsync --inplace not finished yet
        (spool / f"copy{share}.db").write_bytes(data[: int(len(data) * share)])
    fleet_conn = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(fleet_conn, str(spool))
    assert report["merged"] == [] and len(report["skipped"]) == 3
    assert all("malformed" in why or "damaged" in why for _, why in report["skipped"])
    assert fleet_conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_collect_reads_an_older_schema_and_refuses_a_newer_one(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    old = sqlite3.connect(str(spool / "v1.db"), isolation_level=None)
    for statement in store.migration(1):
        old.execute(statement)
    old.execute("INSERT INTO jobs (node, job_id, uid, start) VALUES ('gpu09', '5', 0, ?)", (T0,))
    old.execute("PRAGMA user_version = 1")
    old.close()
    new = store.connect(str(spool / "v99.db"))
    new.execute("PRAGMA user_version = 99")
    new.close()
    conn = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(conn, str(spool))
    assert conn.execute("SELECT node, job_id, num_nodes FROM jobs").fetchall() == [
        ("gpu09", "5", None)
    ]
    assert len(report["skipped"]) == 1 and "newer" in report["skipped"][0][1]


WRITER = """
import sys, time
from slurmhealth.core import store
conn = store.connect(sys.argv[1])
print("ready", flush=True)
for i in range(int(sys.argv[2])):
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO runs VALUES (?, 'gpu01', ?, 'prolog', ?, 0.1, 'fail', 'v', '{}')",
                 (f"r{i}", str(i), 1000.0 + i))
    conn.execute("INSERT INTO results VALUES (?, 'gpu.ecc', 'fail', 'm', 'reset_gpu', '{}', 0)",
                 (f"r{i}",))
    conn.execute("INSERT INTO jobs (node, job_id, start, state) VALUES ('gpu01', ?, ?, 'running')",
                 (str(i), 1000.0 + i))
    conn.execute("COMMIT")
    time.sleep(0.001)
"""


def test_collect_while_a_node_store_is_written_is_consistent(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node_db = str(spool / "gpu01.db")
    store.connect(node_db).close()
    total = 1500
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, node_db, str(total)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "ready"
    conn = store.connect(str(tmp_path / "fleet.db"))
    during = []
    while writer.poll() is None:
        report = collect.collect(conn, str(spool))
        assert report["skipped"] == []
        counts = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in KEYS]
        runs, results, events, jobs, actions, _counters = counts
        assert runs == results == jobs and events == actions == 0  # whole transactions only
        during.append(runs)
    assert writer.wait() == 0
    collect.collect(conn, str(spool))
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == total
    assert dump(conn) == dump(store.connect(node_db))
    assert any(0 < n < total for n in during), during  # some collects ran mid-write


# --- Slurm accounting ---------------------------------------------------------------------------

SACCT = """\
8|FAILED|3:0|gpu02|2026-05-01T10:00:00|2026-05-01T10:05:00|root
9|COMPLETED|0:0|gpu[02-03]|2026-05-01T10:00:00|2026-05-01T11:00:00|alice
10|CANCELLED by 0|0:0|gpu03|2026-05-01T10:10:00|2026-05-01T10:20:00|bob
6|TIMEOUT|0:0|gpu01|2026-05-01T09:00:00|2026-05-01T10:00:00|alice
12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|2026-05-01T10:30:00|alice
13|NODE_FAIL|0:0|gpu04|2026-05-01T12:00:00|2026-05-01T12:01:00|alice
13|COMPLETED|0:0|gpu[01,04]|2026-05-01T12:05:00|2026-05-01T13:00:00|alice
14|PENDING|0:0|None assigned|Unknown|Unknown|carol
15|RUNNING|0:0|gpu01|2026-05-01T14:00:00|Unknown|carol
16|CANCELLED by 1000|0:0|None assigned|None|2026-05-01T14:00:00|carol
8.batch|FAILED|3:0|gpu02|2026-05-01T10:00:00|2026-05-01T10:05:00|
this line is not sacct output
17|COMPLETED|0:0|gpu[05-|2026-05-01T10:00:00|2026-05-01T10:05:00|alice
"""
MAY1_10 = 1_777_629_600.0  # 2026-05-01T10:00:00Z


def test_sacct_output_in_every_form_is_parsed():
    rows, bad = accounting.parse_sacct(SACCT, utc=True)
    got = {(r["node"], r["job_id"], r["slurm_state"]): r for r in rows}
    assert sorted(got) == [
        ("gpu01", "13", "COMPLETED"),
        ("gpu01", "15", "RUNNING"),
        ("gpu01", "6", "TIMEOUT"),
        ("gpu02", "8", "FAILED"),
        ("gpu02", "9", "COMPLETED"),
        ("gpu03", "10", "CANCELLED"),
        ("gpu03", "9", "COMPLETED"),
        ("gpu04", "12", "NODE_FAIL"),
        ("gpu04", "13", "COMPLETED"),
        ("gpu04", "13", "NODE_FAIL"),
    ]
    failed = got[("gpu02", "8", "FAILED")]
    assert failed == {
        "node": "gpu02",
        "job_id": "8",
        "user": "root",
        "start": MAY1_10,
        "end": MAY1_10 + 300,
        "exit_code": 3,
        "signal": 0,
        "num_nodes": 1,
        "slurm_state": "FAILED",
    }
    assert got[("gpu03", "9", "COMPLETED")]["num_nodes"] == 2
    assert got[("gpu04", "13", "COMPLETED")]["num_nodes"] == 2
    for key in (("gpu03", "10", "CANCELLED"), ("gpu04", "12", "NODE_FAIL")):
        assert got[key]["exit_code"] is None  # job-level 0:0 says nothing for these states
    assert got[("gpu01", "15", "RUNNING")]["end"] is None
    assert len(bad) == 2 and "gpu[05-" in bad[1]


def test_sacct_times_are_local_unless_utc():
    rows, _ = accounting.parse_sacct(SACCT.splitlines()[0])
    assert rows[0]["start"] == time.mktime(
        time.strptime("2026-05-01T10:00:00", "%Y-%m-%dT%H:%M:%S")
    )


def test_sacct_fills_what_the_hooks_could_not_know_and_never_erases(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    energy = '{"j": {"0": 180000.0}, "s": 301.0}'
    hook_rows = [
        # ran to its epilog: the hook's own start, end, exit status and GPU energy stay
        ("gpu02", "8", 1000, "root", MAY1_10 - 2, MAY1_10 + 299, 768, 0, "ended", 1, energy),
        # the node died before its epilog: only the prolog's row
        ("gpu04", "12", 1000, "alice", MAY1_10 - 1, None, None, None, "running", 1, None),
    ]
    conn.executemany(
        "INSERT INTO jobs (node, job_id, uid, user, start, end, exit_code, signal, state, "
        "num_nodes, gpu_energy) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        hook_rows,
    )
    result = accounting.ingest_sacct(conn, SACCT, utc=True)
    assert result["jobs"] == 10 and len(result["bad"]) == 2
    columns = "node, job_id, uid, user, start, end, exit_code, signal, state, num_nodes"
    row = conn.execute(f"SELECT {columns}, gpu_energy, slurm_state FROM jobs WHERE job_id = '8'")
    assert row.fetchone() == (*hook_rows[0], "FAILED")
    crashed = conn.execute(
        "SELECT start, end, state, slurm_state FROM jobs WHERE job_id = '12'"
    ).fetchone()
    assert crashed == (MAY1_10 - 1, MAY1_10 + 1800, "running", "NODE_FAIL")
    requeued = conn.execute("SELECT slurm_state FROM jobs WHERE node='gpu04' AND job_id='13'")
    assert requeued.fetchone() == ("NODE_FAIL",)  # it failed here once: that stays
    assert accounting.ingest_sacct(conn, SACCT, utc=True)["jobs"] == 0  # idempotent


def fake_sacct(tmp_path, script: str, tool: str = "sacct") -> str:
    """A stand-in for a Slurm accounting command in tmp_path/bin (the directory, for slurm_bin)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / tool
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


def no_topology(tmp_path) -> None:
    """scontrol and sinfo as Slurm 22.05 prints them without a topology plugin (measured in the
    tests/slurm lab): the topology an error line on stderr, exit 0; one partition."""
    fake_sacct(
        tmp_path, "echo 'scontrol: error: No topology information available' >&2\n", "scontrol"
    )
    fake_sacct(tmp_path, "echo 'gpu|gpu[01-04]'\n", "sinfo")


def test_fetch_sacct_runs_sacct_by_path_in_utc(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")  # an admin's: sacct would print 10:00:00
    args = tmp_path / "argv"
    bin_dir = fake_sacct(
        tmp_path,
        f'echo "$TZ $SLURM_TIME_FORMAT $*" > {args}\n'
        'echo "12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|x|u"\n',
    )
    text = accounting.fetch_sacct(MAY1_10, MAY1_10 + DAY, slurm_bin=bin_dir)
    assert text.startswith("12|NODE_FAIL")
    tz, time_format, *argv = args.read_text().split()
    assert (tz, time_format) == ("UTC", "standard")
    assert "-P" in argv and "-D" in argv and "-X" in argv
    assert argv[argv.index("-S") + 1] == "2026-05-01T10:00:00"
    assert argv[argv.index("-o") + 1] == accounting.SACCT_FIELDS


def test_collect_sacct_counts_a_job_whose_node_died_before_its_epilog(tmp_path):
    line = "12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|2026-05-01T10:30:00|alice"
    bin_dir = fake_sacct(tmp_path, f'echo "{line}"\n')
    event = "gpu04|2026-05-01T10:30:00|Unknown|DOWN*|Not responding"
    fake_sacct(tmp_path, f'echo "{event}"\n', tool="sacctmgr")
    no_topology(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    fleet_db = str(tmp_path / "fleet.db")
    args = ["collect", str(spool), "--db", fleet_db, "--sacct", "--slurm-bin", bin_dir]
    proc = run_cli(*args, "--now", "2026-05-02", "--since", "2d")
    assert proc.returncode == 0, proc.stderr
    assert "sacct: 1 job rows added or updated" in proc.stdout
    assert "sacctmgr: 1 node events added or updated" in proc.stdout
    assert "places: 4 node places (partition)" in proc.stdout
    conn = store.connect(fleet_db)
    got = signals.signals(conn, MAY1_10 - DAY, MAY1_10 + DAY)
    assert got["gpu04"]["jobs"] == got["gpu04"]["hw_job_failures"] == 1
    events = conn.execute("SELECT * FROM node_events").fetchall()
    assert events == [("gpu04", MAY1_10 + 1800, "DOWN*", None, "Not responding")]


def test_without_slurmdbd_sacct_fails_in_one_line(tmp_path):
    bin_dir = fake_sacct(
        tmp_path, 'echo "sacct: error: Slurm accounting storage is disabled" >&2\nexit 1\n'
    )
    with pytest.raises(SlurmError, match="^sacct: error: Slurm accounting storage is disabled$"):
        accounting.fetch_sacct(0, 1, slurm_bin=bin_dir)
    spool = tmp_path / "spool"
    spool.mkdir()
    proc = run_cli(
        "collect",
        str(spool),
        "--db",
        str(tmp_path / "fleet.db"),
        "--sacct",
        "--slurm-bin",
        bin_dir,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "Error: sacct: error: Slurm accounting storage is disabled "
        "(job outcomes from accounting not merged)"
    ]
    assert "0 files merged" in proc.stdout


# --- lemon signals (docs/signals.md) --------------------------------------------------------

ZERO = {**dict.fromkeys(policy.SIGNALS, 0), "gpu_class": ""}  # no run here records a model


def signal_store(path: str) -> sqlite3.Connection:
    """A hand-built fleet: every signal of docs/signals.md, counted by hand below."""
    conn = store.connect(path)
    start = T0

    def run(rid, node, verdict, when, job=None, phase="healthcheck"):
        conn.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, 0.1, ?, 'v', '{}')",
            (rid, node, job, phase, when, verdict),
        )

    def job(node, job_id, when, state="ended", slurm=None, num_nodes=1):
        conn.execute(
            "INSERT INTO jobs (node, job_id, start, state, slurm_state, num_nodes) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (node, job_id, when, state, slurm, num_nodes),
        )

    def xid(eid, node, code, klass, when, job_id=None):
        conn.execute(
            "INSERT INTO events (id, run_id, node, job_id, time, kind, code, class) "
            "VALUES (?, 'r', ?, ?, ?, 'xid', ?, ?)",
            (eid, node, job_id, when, code, klass),
        )

    def action(aid, node, what, when, ok=1):
        conn.execute(
            "INSERT INTO actions VALUES (?, ?, ?, ?, 'r', 'slurmhealth', ?, '')",
            (aid, node, when, what, ok),
        )

    # gpu01: runs on 3 UTC days (two runs on day 0), 1 fail, 2 warns; one run before the window
    run("a1", "gpu01", "ok", start + 10)
    run("a2", "gpu01", "fail", start + 20)
    run("a3", "gpu01", "warn", start + DAY)
    run("a4", "gpu01", "warn", start + 2 * DAY)
    run("a0", "gpu01", "fail", start - 1)  # outside
    # gpu01 jobs: 6 in the window
    job("gpu01", "1", start + 1)  # plain success
    job("gpu01", "2", start + 2, slurm="FAILED")  # ordinary single-node failure: no evidence
    job("gpu01", "3", start + 3, state="prolog_failed")  # hw failure
    job("gpu01", "4", start + 4, slurm="NODE_FAIL")  # hw failure
    job("gpu01", "5", start + 5)  # hw failure: a hardware Xid during the job
    job("gpu01", "6", start + 6, state="prolog_failed", slurm="NODE_FAIL")  # counted once
    job("gpu01", "7", start - 100, slurm="NODE_FAIL")  # outside the window
    job("gpu01", "8", start + 8)  # only an application Xid: no evidence
    xid("x1", "gpu01", 79, "fail", start + 5, "5")
    xid("x2", "gpu01", 48, "fail", start + 6, "6")  # job 6 again: still once
    xid("x3", "gpu01", 94, "fail", start + 7, "5")  # job 5 again: still once
    xid("x4", "gpu01", 13, "app", start + 8, "8")
    xid("x5", "gpu01", 31, "app", start + 9)
    xid("x6", "gpu01", 63, "warn", start + 10)
    xid("x7", "gpu01", 79, "fail", start + 20 * DAY)  # between jobs
    xid("x8", "gpu01", 79, "fail", start - 5)  # outside
    # gpu02: multi-node jobs only: 3 of them, 2 failed (FAILED, NODE_FAIL), 1 completed
    job("gpu02", "20", start + 1, slurm="FAILED", num_nodes=4)
    job("gpu02", "21", start + 2, slurm="NODE_FAIL", num_nodes=2)
    job("gpu02", "22", start + 3, slurm="COMPLETED", num_nodes=2)
    run("b1", "gpu02", "ok", start + 1, "20", "prolog")
    # gpu03: only actions: 2 drains that worked, 1 that failed, a resume
    action("c1", "gpu03", "drain", start + 1)
    action("c2", "gpu03", "drain", start + 2)
    action("c3", "gpu03", "drain", start + 3, ok=0)
    action("c4", "gpu03", "resume", start + 4)
    action("c5", "gpu03", "drain", start - 1)  # outside
    # gpu03: the lemon sweep's own drain is no evidence of a fault; its evidence starts afresh
    # there (the drains above come after it)
    conn.execute(
        "INSERT INTO actions VALUES ('c6', 'gpu03', ?, 'drain', 'slurmhealth: lemon: 4 faults', "
        "'slurmhealth lemons', 1, '')",
        (start + 0.5,),
    )
    # gpu04: a resume; a NODE_FAIL job shared with gpu03 that accounting's node event charges
    # to gpu04 (a node event with Slurm's own reason is a fault of its own too)
    action("d1", "gpu04", "resume", start + 1)
    job("gpu03", "30", start + 100, slurm="NODE_FAIL", num_nodes=2)
    job("gpu04", "30", start + 100, slurm="NODE_FAIL", num_nodes=2)
    conn.execute(
        "INSERT INTO node_events VALUES ('gpu04', ?, 'DOWN', NULL, 'Not responding')",
        (start + 150,),
    )
    # gpu05: only records outside the window: absent
    run("e1", "gpu05", "fail", start + 40 * DAY)
    job("gpu05", "50", start - DAY, slurm="NODE_FAIL")
    return conn


def test_signals_equal_the_hand_count(tmp_path):
    conn = signal_store(str(tmp_path / "fleet.db"))
    got = signals.signals(conn, T0, T0 + 28 * DAY)
    ok = T0 + 10  # gpu01's only passing run after its first items
    assert got == {
        "gpu01": {
            **ZERO,
            "jobs": 7,
            "hw_job_failures": 4,  # jobs 3, 4, 5, 6; not 2 (FAILED) nor 8 (app Xid)
            "hw_xids": 4,  # x1, x2, x3, x7; app Xids x4, x5 count nowhere
            "warn_xids": 1,
            "check_fails": 1,
            "check_warns": 2,
            "node_days": 3,
            "faults": [  # each with its scope: the job, the Xid, the checks that failed
                (T0 + 3, "prolog", 1.0, ok, ("job:3",)),
                (T0 + 4, "node_fail", 1.0, ok, ("job:4",)),  # a one-node job: its node
                (T0 + 5, "xid", 1.0, ok, ("xid:79",)),
                (T0 + 6, "node_fail", 1.0, ok, ("job:6",)),
                (T0 + 6, "prolog", 1.0, ok, ("job:6",)),
                (T0 + 6, "xid", 1.0, ok, ("xid:48",)),
                (T0 + 7, "xid", 1.0, ok, ("xid:94",)),
                (T0 + 20, "check", 1.0, None, ()),  # no passing run after it; no result row
                (T0 + 20 * DAY, "xid", 1.0, None, ("xid:79",)),
            ],
            "warnings": [
                (T0 + 10, "warn", 1.0, None),
                (T0 + DAY, "warn", 1.0, None),
                (T0 + 2 * DAY, "warn", 1.0, None),
            ],
        },
        "gpu02": {
            **ZERO,
            "jobs": 3,
            "hw_job_failures": 1,  # the NODE_FAIL
            "multi_node_jobs": 3,
            "multi_node_failures": 1,  # the FAILED one (NODE_FAIL is a fault, attributed)
            "node_days": 1,
            "faults": [(T0 + 2, "node_fail", 1.0, None, ("job:21",))],  # job 21's only row
            "warnings": [],
        },
        "gpu03": {
            **ZERO,
            "drains": 2,  # not the failed drain, not the lemon drain
            "jobs": 1,
            "hw_job_failures": 1,
            "multi_node_jobs": 1,
            "node_days": 1,  # no run, a job's start: a day all the same
            "faults": [
                (T0 + 1, "drain", 1.0, None, ("reason:r",)),
                (T0 + 2, "drain", 1.0, None, ("reason:r",)),
            ],
            "reset": {"time": T0 + 0.5, "why": "drained as a lemon"},
            "warnings": [],
        },
        "gpu04": {
            **ZERO,
            "jobs": 1,
            "hw_job_failures": 1,
            "multi_node_jobs": 1,
            "node_days": 1,
            "faults": [
                (T0 + 100, "node_fail", 1.0, None, ("job:30",)),
                (T0 + 150, "down", 1.0, None, ("reason:not responding",)),
            ],
            "warnings": [],
        },
    }
    assert list(got) == sorted(got)


def test_a_replaced_gpu_starts_the_evidence_afresh_and_failed_days_are_not_in_service(tmp_path):
    """gpu09 failed on days 0 and 1 (day 1 all day: no run passed), then a run on day 3 warned
    that GPU 2's serial changed (a board replaced), then it failed again on day 5: its evidence
    is that last fault alone, over its days in service from day 3 on."""
    conn = store.connect(str(tmp_path / "fleet.db"))

    def run(rid: str, verdict: str, when: float, check: str | None = None) -> None:
        conn.execute(
            "INSERT INTO runs VALUES (?, 'gpu09', NULL, 'healthcheck', ?, 0.1, ?, 'v', '{}')",
            (rid, when, verdict),
        )
        if check:
            status = "warn" if verdict == "warn" else "fail"
            conn.execute(
                "INSERT INTO results VALUES (?, ?, ?, 'm', 'none', '{}', 0.0)",
                (rid, check, status),
            )

    run("g0", "ok", T0 + 10)
    run("g1", "fail", T0 + 20, "gpu.count")
    run("g2", "fail", T0 + DAY + 10, "gpu.count")  # day 1: failing all day
    run("g3", "warn", T0 + 3 * DAY, "gpu.inventory")  # GPU 2 serial A -> B
    run("g4", "ok", T0 + 4 * DAY)
    run("g5", "fail", T0 + 5 * DAY, "ecc")
    conn.commit()
    got = signals.signals(conn, T0, T0 + 28 * DAY)["gpu09"]
    assert got["reset"] == {"time": T0 + 3 * DAY, "why": "GPU replaced"}
    assert got["faults"] == [(T0 + 5 * DAY, "check", 1.0, None, ("check:ecc",))]
    assert got["node_days"] == 2  # days 3 and 4; not 0 and 1 (before), nor 5 (failed)
    entry = {r["node"]: r for r in policy.score(signals.signals(conn, T0, T0 + 28 * DAY))}
    assert entry["gpu09"]["evidence"]["faults"]["reset"]["why"] == "GPU replaced"
    whole = signals.signals(conn, T0, T0 + 3 * DAY)["gpu09"]  # before the repair
    assert "reset" not in whole and len(whole["faults"]) == 2 and whole["node_days"] == 1


def test_signals_window_is_half_open(tmp_path):
    conn = signal_store(str(tmp_path / "fleet.db"))
    got = signals.signals(conn, T0 + 20, T0 + DAY)
    assert got["gpu01"]["check_fails"] == 1 and got["gpu01"]["check_warns"] == 0
    assert signals.signals(conn, T0 + 100 * DAY, T0 + 101 * DAY) == {}


def test_signals_use_the_covering_indexes(tmp_path):
    conn = signal_store(str(tmp_path / "fleet.db"))
    for _, _, sql in signals._PER_NODE:
        plan = " ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, ("n", 0, 1)))
        assert "COVERING INDEX" in plan and "SCAN" not in plan.replace("SCAN n", ""), plan


# --- the commands -----------------------------------------------------------------------------


def test_export_import_collect_commands(tmp_path):
    node_db = str(tmp_path / "gpu01.db")
    node_store(node_db, "gpu01").close()
    spool = tmp_path / "spool"
    spool.mkdir()
    out = spool / "gpu01.ndjson"
    exported = run_cli("export", "--db", node_db, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    assert f"{out}: " in exported.stdout and not (spool / "gpu01.ndjson.part").exists()
    env = {"SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db")}
    first = run_cli("import", str(out), env=env)
    assert first.returncode == 0 and "0 unchanged" in first.stdout, first.stderr
    again = run_cli("import", str(out), env=env)
    assert "nothing new added" in again.stdout
    with open(out, "a") as handle:
        handle.write('{"type": "run", "id": "cut')
    collected = run_cli("collect", str(spool), "--since", "3650d", env=env)
    assert collected.returncode == 0 and "1 file merged, 0 skipped" in collected.stdout
    assert "truncated last line" in collected.stderr
    stdout = run_cli("export", "--db", node_db, "--since", "7d", "--now", str(T0 + DAY))
    assert json.loads(stdout.stdout.splitlines()[0])["type"] == "header"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["import", "/nonexistent.ndjson"], "/nonexistent.ndjson: [Errno 2]"),
        (["collect", "/nonexistent"], "/nonexistent: not a directory"),
        (["export", "--db", "/nonexistent.db"], "no store at /nonexistent.db"),
        (["collect", ".", "--since", "forever"], "not a duration"),
    ],
)
def test_user_errors_are_one_line(tmp_path, args, message):
    proc = run_cli(*args, env={"SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db")})
    assert proc.returncode != 0 and message in proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "Error" in line]
    assert len(errors) == 1, proc.stderr


def test_signals_equal_the_simulators_on_its_fleet(tmp_path):
    """The contract has two sides (docs/signals.md): SQL over a store, and the simulator's."""
    fleet_model = simulate.Fleet(nodes=16, days=14, seed=3, lemons={"gpu0003": 30}, incident_day=5)
    history = simulate.events(fleet_model)
    conn = store.connect(str(tmp_path / "fleet.db"))
    simulate.write_store(history, conn)
    start, end = fleet_model.start, fleet_model.end
    for window in ((start, end), (start + 3 * DAY + 77, start + 6 * DAY + 5)):
        assert signals.signals(conn, *window) == simulate.signals(history, *window)


# --- the spool's trust model (docs/fleet.md): a real unprivileged user plants and forges --------


@pytest.fixture
def user():
    """A real unprivileged account (useradd), gone again after the test; root only."""
    if os.geteuid() != 0:
        require_real("needs root to create a user and to act as root against it")
    tools = [shutil.which(t) for t in ("useradd", "userdel", "runuser")]
    if None in tools:
        require_real("useradd, userdel and runuser are needed (passwd, util-linux)")
    name = f"shtest-{os.urandom(3).hex()}"
    subprocess.run(
        [tools[0], "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run([tools[1], name], check=False, capture_output=True)


def as_user(user, *argv: str, stdin: str | None = None) -> None:
    """Run argv as `user` (runuser: a real setuid to the account, nothing of root's kept)."""
    done = subprocess.run(
        ["runuser", "-u", user.pw_name, "--", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def shared():
    """A directory every user can reach (tmp_path's parents are root's alone), removed after."""
    base = tempfile.mkdtemp(prefix="slurmhealth-shared-")
    os.chmod(base, 0o755)
    yield pathlib.Path(base)
    shutil.rmtree(base, ignore_errors=True)


def a_spool(shared, mode: int = 0o1777) -> pathlib.Path:
    spool = shared / "spool"
    spool.mkdir()
    spool.chmod(mode)  # the shared spool every node's root writes (sticky, like /tmp)
    return spool


@pytest.mark.parametrize("spool_mode", [0o1777, 0o777], ids=["sticky", "world-writable"])
def test_export_never_follows_a_users_symlink_and_is_private(shared, user, spool_mode):
    victim = shared / "victim"  # a root-owned file the user cannot write
    victim.write_text("precious\n")
    spool = a_spool(shared, spool_mode)
    node_db = str(shared / "gpu07.db")
    node_store(node_db, "gpu07").close()
    out = spool / "gpu07.ndjson"
    as_user(user, "ln", "-s", str(victim), f"{out}.part")  # where the export used to write first
    old = os.umask(0)  # not cron's 022: the mode is the export's own, whatever the umask
    try:
        done = run_cli("export", "--db", node_db, "-o", str(out))
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert '"node":"gpu07"' in out.read_text()
    # A symlink at the target itself: refused in one line, nothing written through it or over it.
    other = spool / "gpu08.ndjson"
    as_user(user, "ln", "-s", str(victim), str(other))
    done = run_cli("export", "--db", node_db, "-o", str(other))
    assert done.returncode == 1 and f"{other}: a symlink" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert victim.read_text() == "precious\n" and os.readlink(other) == str(victim)
    assert not [n for n in os.listdir(spool) if n.endswith(".tmp")], "no temporary left"


def test_collect_refuses_what_a_user_could_have_forged_and_says_which(shared, user):
    spool = a_spool(shared)
    node_store(str(shared / "gpu01.db"), "gpu01").close()
    exported = run_cli(
        "export", "--db", str(shared / "gpu01.db"), "-o", str(spool / "gpu01.ndjson")
    )
    assert exported.returncode == 0, exported.stderr
    moved_in(spool, "gpu03.db", "gpu03")  # root's store in the shared spool
    moved_in(spool, "gpu02.db", "gpu02")
    forged = export_text(node_store(str(shared / "forge.db"), "gpu66"))  # drains, failed runs
    (shared / "forge.db").chmod(0o644)
    # What the user can do in a sticky spool: write files, link, make FIFOs, add a -wal beside
    # root's store (SQLite would replay its frames).
    as_user(user, "sh", "-c", f"cat > {spool}/gpu66.ndjson", stdin=forged)
    as_user(user, "ln", "-s", str(spool / "gpu01.ndjson"), str(spool / "gpu67.ndjson"))
    as_user(user, "mkfifo", str(spool / "gpu68.ndjson"))
    as_user(user, "cp", str(shared / "forge.db"), str(spool / "gpu69.db"))
    as_user(user, "sh", "-c", f"echo junk > {spool}/gpu02.db-wal")
    (spool / "gpu70.ndjson").write_text(forged.replace("gpu66", "gpu70"))
    (spool / "gpu70.ndjson").chmod(0o666)  # root's, but anyone may have rewritten it
    fleet = str(shared / "fleet.db")
    done = run_cli("collect", str(spool), "--db", fleet, "--since", "3650d", timeout=60)
    assert done.returncode == 0, done.stderr
    skipped = dict(
        line.split(": skipped: ") for line in done.stderr.splitlines() if ": skipped: " in line
    )
    who = f"uid {user.pw_uid} ({user.pw_name})"
    assert skipped == {
        f"{spool}/gpu02.db": f"its gpu02.db-wal is owned by {who}, not root",
        f"{spool}/gpu69.db": f"owned by {who}, not root",
        f"{spool}/gpu66.ndjson": f"owned by {who}, not root",
        f"{spool}/gpu67.ndjson": "a symlink",
        f"{spool}/gpu68.ndjson": "not a regular file",
        f"{spool}/gpu70.ndjson": "writable by group or others (mode 0666)",
    }, done.stderr
    assert "2 files merged, 6 skipped" in done.stdout
    conn = sqlite3.connect(fleet)
    assert {r[0] for r in conn.execute("SELECT DISTINCT node FROM runs")} == {"gpu01", "gpu03"}
    assert {r[0] for r in conn.execute("SELECT DISTINCT node FROM actions")} == {"gpu01", "gpu03"}


def test_a_store_in_a_shared_spool_is_read_from_a_private_copy(shared, monkeypatch):
    """SQLite never opens a name in a directory others can write (a -wal could appear there
    between the check and the open): it reads a copy made through the checked descriptors."""
    spool = a_spool(shared)
    moved_in(spool, "gpu03.db", "gpu03")
    live = moved_in(spool, "gpu04.db", "gpu04", live=True)  # open: its records are in its -wal
    store.record_action(live, "gpu04", "drain", "only in the wal", "test")
    assert os.path.getsize(spool / "gpu04.db-wal") > 0
    opened = []
    real = collect._checked_copy
    monkeypatch.setattr(
        collect, "_checked_copy", lambda src, copy: (opened.append(src), real(src, copy))
    )
    conn = store.connect(str(shared / "fleet.db"))
    report = collect.collect(conn, str(spool))
    assert [os.path.basename(p) for p, _ in report["merged"]] == ["gpu03.db", "gpu04.db"]
    assert len(opened) == 2 and not [p for p in opened if p.startswith(str(spool))], opened
    reasons = conn.execute("SELECT reason FROM actions WHERE node = 'gpu04'").fetchall()
    assert ("only in the wal",) in reasons, "the -wal was copied too"
    spool.chmod(0o755)  # root's alone: the store is read in place, under SQLite's locking
    opened.clear()
    collect.collect(conn, str(spool))
    assert opened == [str(spool / "gpu03.db"), str(spool / "gpu04.db")]
    live.close()


def test_spool_owner_trusts_the_files_of_a_named_user(shared, user):
    spool = a_spool(shared)
    forged = export_text(node_store(str(shared / "n.db"), "gpu66"))
    as_user(user, "sh", "-c", f"umask 022; cat > {spool}/gpu66.ndjson", stdin=forged)
    fleet = str(shared / "fleet.db")
    args = ("collect", str(spool), "--db", fleet, "--since", "3650d")
    refused = run_cli(*args)
    assert "0 files merged, 1 skipped" in refused.stdout, refused.stderr
    named = run_cli(*args, "--spool-owner", user.pw_name)
    assert "1 file merged, 0 skipped" in named.stdout, named.stderr
    by_env = run_cli(*args, "--full", env={"SLURMHEALTH_SPOOL_OWNER": str(user.pw_uid)})
    assert "1 file merged, 0 skipped" in by_env.stdout, by_env.stderr
    unknown = run_cli(*args, "--spool-owner", "no-such-user-here")
    assert unknown.returncode == 2 and "no user no-such-user-here" in unknown.stderr


# --- node events from Slurm accounting (sacctmgr show event) ---------------------------------

# sacctmgr's real answer, verbatim, from the tests/slurm lab (Slurm 22.05.8, slurmdbd on MariaDB
# 10.11, 2026-11-30) to
#   TZ=UTC sacctmgr -P -n show event Event=Node States=DOWN,DRAIN,FAIL \
#       Start=2026-11-30T16:00:00 End=2026-11-30T16:10:00 Format=NodeName,Start,End,State,Reason
# after, in turn: gpu01 drained with a `|` in its reason, gpu02 set DOWN, gpu01 drained under a
# running job (the event starts when the job ends, not at the scontrol), gpu02 set FAIL, gpu02's
# slurmd killed (DOWN*: Not responding), gpu02 drained while down (DRAIN*: a new event, the DOWN*
# one closes), gpu02's slurmd killed under a 2-node job (ended NODE_FAIL at 16:04:23, the start
# of the last event).
EVENTS = """\
gpu01|2026-11-30T16:01:58|2026-11-30T16:02:03|DRAIN|lab: drained | with pipe
gpu01|2026-11-30T16:02:49|2026-11-30T16:02:59|DRAIN|drain while busy
gpu02|2026-11-30T16:02:00|2026-11-30T16:02:04|DOWN|lab: node failure
gpu02|2026-11-30T16:02:21|2026-11-30T16:02:59|FAIL|fail it
gpu02|2026-11-30T16:03:29|2026-11-30T16:03:44|DOWN*|Not responding
gpu02|2026-11-30T16:03:44|2026-11-30T16:03:50|DRAIN*|drained while down
gpu02|2026-11-30T16:04:23|2026-11-30T16:05:00|DOWN*|Not responding
"""
# The same lab at 16:04:37, the last node still down: an open event's End is `Unknown`.
EVENTS_OPEN = EVENTS.replace("16:04:23|2026-11-30T16:05:00|", "16:04:23|Unknown|")
NOV30_16 = 1_796_054_400.0  # 2026-11-30T16:00:00Z


def test_sacctmgr_node_events_are_parsed():
    rows, bad = accounting.parse_events(EVENTS, utc=True)
    assert bad == []
    got = [(r["node"], r["start"] - NOV30_16, r["end"] - NOV30_16, r["state"]) for r in rows]
    assert got == [
        ("gpu01", 118, 123, "DRAIN"),
        ("gpu01", 169, 179, "DRAIN"),
        ("gpu02", 120, 124, "DOWN"),
        ("gpu02", 141, 179, "FAIL"),
        ("gpu02", 209, 224, "DOWN*"),
        ("gpu02", 224, 230, "DRAIN*"),
        ("gpu02", 263, 300, "DOWN*"),
    ]
    assert rows[0]["reason"] == "lab: drained | with pipe"  # the last field keeps its `|`
    assert rows[-1]["reason"] == "Not responding"
    (open_row,) = [r for r in accounting.parse_events(EVENTS_OPEN, utc=True)[0] if not r["end"]]
    assert open_row["start"] == NOV30_16 + 263 and open_row["end"] is None


def test_node_event_lines_that_cannot_be_read_are_reported():
    text = "\n".join(
        [
            # the cluster's own event (what a query without Event=Node shows): no node
            "|2026-11-30T16:01:55|Unknown||Cluster Registered TRES",
            "gpu[01-02]|2026-11-30T16:02:00|Unknown|DOWN|two nodes in one event",
            "gpu0[1-|2026-11-30T16:02:00|Unknown|DOWN|unreadable name",
            "gpu\x1b[31m03|2026-11-30T16:02:00|Unknown|DOWN|terminal escape in the name",
            "gpu 03|2026-11-30T16:02:00|Unknown|DOWN|space in the name",
            "gpu03|16:02:00|Unknown|DOWN|SLURM_TIME_FORMAT=relative",
            "gpu03|Unknown|Unknown|DOWN|no start",
            "gpu03|2026-11-30T16:02:00|2026-13-30T16:02:00|DOWN|month 13",
            "gpu03|2026-11-30T16:02:00|Unknown||no state",
            "gpu03|2026-11-30T16:02:00|Unknown|DOWN",
            "not sacctmgr output",
            "gpu04|2026-11-30T16:02:00|Unknown|DOWN|bad\x07 reason\tcleaned",
        ]
    )
    rows, bad = accounting.parse_events(text, utc=True)
    assert [(r["node"], r["reason"]) for r in rows] == [("gpu04", "bad? reason cleaned")]
    assert len(bad) == 11
    assert all("\x1b" not in line and "\n" not in line for line in bad)


_FIELD = st.one_of(
    st.sampled_from(
        ["gpu01", "gpu[01-02]", "gpu0[1-", "2026-11-30T16:02:00", "0001-01-01T00:00:00"]
        + ["9999-12-31T23:59:59", "Unknown", "", "DOWN*", "a | b", "x\x00\x1b\n"]
    ),
    st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.lists(_FIELD, min_size=1, max_size=6).map("|".join), max_size=5))
def test_any_sacctmgr_text_is_parsed_or_reported_never_raised(lines):
    text = "\n".join(lines)
    for utc in (True, False):
        rows, bad = accounting.parse_events(text, utc=utc)
        assert len(rows) + len(bad) <= len(text.splitlines())
        for row in rows:
            assert isinstance(row["start"], float) and row["node"] and row["state"]
            assert row["node"] == clean(row["node"]) and " " not in row["node"]


def test_node_events_merge_idempotently_and_an_open_event_gets_its_end(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    assert accounting.ingest_events(conn, EVENTS_OPEN, utc=True) == {"events": 7, "bad": []}
    assert accounting.ingest_events(conn, EVENTS_OPEN, utc=True)["events"] == 0
    last = "SELECT end FROM node_events WHERE node = 'gpu02' AND state = 'DOWN*' ORDER BY start"
    assert conn.execute(last).fetchall() == [(NOV30_16 + 224,), (None,)]
    assert accounting.ingest_events(conn, EVENTS, utc=True)["events"] == 1  # it closed
    assert conn.execute(last).fetchall() == [(NOV30_16 + 224,), (NOV30_16 + 300,)]
    before = conn.execute("SELECT * FROM node_events ORDER BY node, start").fetchall()
    for text in (EVENTS, EVENTS_OPEN):  # an older answer merged again reopens nothing
        assert accounting.ingest_events(conn, text, utc=True)["events"] == 0
    assert conn.execute("SELECT * FROM node_events ORDER BY node, start").fetchall() == before
    assert len(before) == 7 and before[0][4] == "lab: drained | with pipe"
    # A reason that was empty is filled in; a known one stays.
    quiet = "gpu03|2026-11-30T16:06:00|Unknown|DOWN|"
    assert accounting.ingest_events(conn, quiet, utc=True)["events"] == 1
    assert accounting.ingest_events(conn, quiet + "Not responding", utc=True)["events"] == 1
    assert accounting.ingest_events(conn, quiet + "something else", utc=True)["events"] == 0
    reason = "SELECT reason FROM node_events WHERE node = 'gpu03'"
    assert conn.execute(reason).fetchall() == [("Not responding",)]


def test_a_node_event_that_cannot_be_stored_is_one_line(tmp_path):
    path = str(tmp_path / "fleet.db")
    store.connect(path).close()
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    with pytest.raises(records.FleetError, match="^node events not merged: .*readonly"):
        accounting.ingest_events(readonly, EVENTS, utc=True)


# `scontrol show topology` of Slurm 22.05 with topology/tree (tests/slurm/test_lemons.py's lab
# prints these lines), and a topology/block line as that plugin's printer writes it
# (src/plugins/topology/block: "BlockName=%s BlockIndex=%u", then " Nodes=%s").
TOPOLOGY = """SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[01-02]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=gpu[03-04]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu[01-04] Switches=leaf[1-2]
BlockName=b1 BlockIndex=0 Nodes=dgx[1-2]
SwitchName=empty Level=0 LinkSpeed=1
SwitchName=bad Level=0 LinkSpeed=1 Nodes=gpu[02-01]
SwitchName=w\x1b[2Jeird Level=0 Nodes=gpu09
"""


def test_the_topology_names_each_nodes_leaf_switch_or_block_and_never_the_spine():
    rows, bad = accounting.parse_topology(TOPOLOGY)
    assert rows == [
        ("gpu01", "switch", "leaf1"),
        ("gpu02", "switch", "leaf1"),
        ("gpu03", "switch", "leaf2"),
        ("gpu04", "switch", "leaf2"),
        ("dgx1", "block", "b1"),
        ("dgx2", "block", "b1"),
    ]
    assert len(bad) == 2 and "gpu[02-01]" in bad[0] and "\x1b" not in bad[1]
    # no topology plugin: scontrol says so on stderr and prints nothing
    assert accounting.parse_topology("") == ([], [])


def test_partitions_come_from_sinfo_one_line_per_partition_and_state():
    text = "gpu|gpu[01-02]\ngpu|gpu03\ndebug|gpu01\nempty|\nbroken line\n"
    rows, bad = accounting.parse_partitions(text)
    assert rows == [
        ("gpu01", "partition", "gpu"),
        ("gpu02", "partition", "gpu"),
        ("gpu03", "partition", "gpu"),
        ("gpu01", "partition", "debug"),
    ]
    assert bad == ["broken line"]


def test_places_merge_with_first_and_last_seen_and_a_moved_node_keeps_its_old_place(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    rows = [("gpu01", "switch", "leaf1"), ("gpu02", "switch", "leaf1")]
    assert accounting.ingest_places(conn, rows, 100.0) == {"places": 2}
    accounting.ingest_places(conn, [("gpu01", "switch", "leaf2"), rows[1]], 200.0)
    got = conn.execute("SELECT node, name, first, last FROM places ORDER BY node, name")
    assert got.fetchall() == [
        ("gpu01", "leaf1", 100.0, 100.0),
        ("gpu01", "leaf2", 200.0, 200.0),
        ("gpu02", "leaf1", 100.0, 200.0),
    ]
    # the signals: where each node was from the window's start, or its last known place
    assert signals.places(conn, 150.0) == {"gpu01": ("switch:leaf2",), "gpu02": ("switch:leaf1",)}
    assert signals.places(conn, 50.0)["gpu01"] == ("switch:leaf1", "switch:leaf2")
    assert signals.places(conn, 500.0)["gpu02"] == ("switch:leaf1",)


def test_a_partition_is_a_place_only_where_it_holds_a_quarter_of_the_nodes_or_less(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    nodes = [f"n{i:02d}" for i in range(12)]
    rows = [(n, "partition", "all") for n in nodes] + [(n, "partition", "a100") for n in nodes[:3]]
    rows += [(n, "partition", "big") for n in nodes[:4]]
    accounting.ingest_places(conn, rows, 100.0)
    where = signals.places(conn, 0.0)
    assert where["n00"] == ("partition:a100",)  # 3 of 12; "big" holds 4 > 3, "all" 12
    assert "n05" not in where


def test_fetch_events_asks_sacctmgr_for_node_events_in_utc(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_TIME_FORMAT", "%s")  # an admin's: sacctmgr would print epochs
    args = tmp_path / "argv"
    bin_dir = fake_sacct(
        tmp_path, f'echo "$TZ $SLURM_TIME_FORMAT $*" > {args}\nprintf "%s" "$EVENTS"\n', "sacctmgr"
    )
    monkeypatch.setenv("EVENTS", EVENTS)
    text = accounting.fetch_events(NOV30_16, NOV30_16 + 600, slurm_bin=bin_dir)
    assert text == EVENTS
    assert args.read_text().split() == [
        "UTC",
        "standard",
        "-P",
        "-n",
        "show",
        "event",
        "Event=Node",
        "States=DOWN,DRAIN,FAIL",
        "Start=2026-11-30T16:00:00",
        "End=2026-11-30T16:10:00",
        "Format=NodeName,Start,End,State,Reason",
    ]


def test_a_sacctmgr_that_hangs_or_fails_is_one_line(tmp_path):
    bin_dir = fake_sacct(tmp_path, "exec sleep 30\n", "sacctmgr")
    with pytest.raises(SlurmError, match="^sacctmgr timed out after 0.5 s$"):
        accounting.fetch_events(0, 1, slurm_bin=bin_dir, timeout=0.5)
    fake_sacct(tmp_path, f"printf '%s' '{SLURMDBD_DOWN}' >&2\nexit 1\n", "sacctmgr")
    with pytest.raises(SlurmError) as caught:
        accounting.fetch_events(0, 1, slurm_bin=bin_dir)
    message = str(caught.value)
    assert message.startswith("sacctmgr: error: slurm_persist_conn_open_without_init: ")
    assert "\n" not in message and message.endswith("Connection refused")


# sacctmgr's stderr, exit 1, with slurmdbd stopped (the tests/slurm lab, Slurm 22.05.8)
SLURMDBD_DOWN = (
    "sacctmgr: error: slurm_persist_conn_open_without_init: failed to open persistent "
    "connection to host:127.0.0.1:35771: Connection refused\n"
    "sacctmgr: error: Sending PersistInit msg: Connection refused\n"
)


def test_collect_keeps_the_jobs_it_merged_when_sacctmgr_fails(tmp_path):
    line = "12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|2026-05-01T10:30:00|alice"
    bin_dir = fake_sacct(tmp_path, f'echo "{line}"\n')
    fake_sacct(tmp_path, f"printf '%s' '{SLURMDBD_DOWN}' >&2\nexit 1\n", "sacctmgr")
    spool = tmp_path / "spool"
    spool.mkdir()
    fleet_db = str(tmp_path / "fleet.db")
    args = ["collect", str(spool), "--db", fleet_db, "--sacct", "--slurm-bin", bin_dir]
    proc = run_cli(*args, "--now", "2026-05-02", "--since", "2d")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "sacct: 1 job rows added or updated" in proc.stdout
    (error,) = proc.stderr.strip().splitlines()
    assert error.startswith("Error: sacctmgr: error: slurm_persist_conn_open_without_init: ")
    assert error.endswith("Connection refused (node events from accounting not merged)")
    conn = store.connect(fleet_db)
    assert conn.execute("SELECT job_id, slurm_state FROM jobs").fetchall() == [("12", "NODE_FAIL")]


def test_collect_keeps_what_it_merged_when_the_places_cannot_be_read(tmp_path):
    line = "12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|2026-05-01T10:30:00|alice"
    bin_dir = fake_sacct(tmp_path, f'echo "{line}"\n')
    fake_sacct(tmp_path, "echo 'gpu04|2026-05-01T10:30:00|Unknown|DOWN*|x'\n", "sacctmgr")
    down = "slurm_load_topo error: Unable to contact slurm controller (connect failure)"
    fake_sacct(tmp_path, f"echo '{down}' >&2\nexit 1\n", "scontrol")
    spool = tmp_path / "spool"
    spool.mkdir()
    fleet_db = str(tmp_path / "fleet.db")
    args = ["collect", str(spool), "--db", fleet_db, "--sacct", "--slurm-bin", bin_dir]
    proc = run_cli(*args, "--now", "2026-05-02", "--since", "2d")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"Error: scontrol: {down} (places of nodes not merged)"
    ]
    conn = store.connect(fleet_db)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM node_events").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM places").fetchone()[0] == 0


# --- incremental collection, the spool and the rollup (a 10,000-node fleet) ---------------------


def add_run(conn: sqlite3.Connection, run_id: str, started: float, verdict: str = "ok") -> None:
    row = (run_id, "gpu01", None, "healthcheck", started, 0.05, verdict, "v", "{}")
    conn.execute(store.insert_sql("runs"), row)


def run_ids(conn: sqlite3.Connection) -> set:
    return {run_id for (run_id,) in conn.execute("SELECT id FROM runs")}


def test_collect_reads_a_store_from_its_watermark_less_the_overlap(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(spool / "gpu01.db"))
    add_run(node, "first", T0)
    add_run(node, "newest", T0 + 300)
    fleet = store.connect(str(tmp_path / "fleet.db"))
    collect.collect(fleet, str(spool))
    assert fleet.execute("SELECT source, mark FROM watermarks").fetchall() == [
        (str(spool / "gpu01.db"), T0 + 300)
    ]
    # Committed after that collect: one dated within the overlap (a run still running then),
    # one older than it (the watermark says it was read), one new.
    add_run(node, "late", T0 + 300 - records.OVERLAP + 1)
    add_run(node, "before-the-overlap", T0 + 300 - records.OVERLAP - 1)
    add_run(node, "new", T0 + 600)
    report = collect.collect(fleet, str(spool))
    assert report["added"]["run"] == 2
    assert run_ids(fleet) == {"first", "newest", "late", "new"}
    collect.collect(fleet, str(spool), full=True)  # --full: all of --since again
    assert run_ids(fleet) == run_ids(node)


def test_an_xid_the_epilog_attributes_after_the_watermark_still_travels(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(spool / "gpu01.db"))
    add_run(node, "hc", T0)
    event = {"id": "xid:gpu01:b:1:79", "run_id": "hc", "node": "gpu01", "time": T0}
    node.execute(store.insert_sql("events"), store.row("events", {**event, "kind": "xid"}))
    node.execute("INSERT INTO jobs (node, job_id, start) VALUES ('gpu01', '41', ?)", (T0 - 60,))
    fleet = store.connect(str(tmp_path / "fleet.db"))
    collect.collect(fleet, str(spool))
    add_run(node, "epilog", T0 + DAY)  # the job ends a day later: its epilog claims the Xid
    node.execute("UPDATE jobs SET end = ? WHERE job_id = '41'", (T0 + DAY,))
    assert store.attribute_events(node, "gpu01", "41", None) == 1
    collect.collect(fleet, str(spool))
    assert fleet.execute("SELECT job_id FROM events").fetchall() == [("41",)]


def export_cycle(conn: sqlite3.Connection, path: str, now: float) -> dict:
    """One node's incremental export, as `export --incremental -o PATH` makes it."""
    since = records.incremental_since(conn, path, None)
    with files.open_private(path) as out:
        counts = records.export(conn, out, since)
    records.exported(conn, path, since, now)
    return counts


def spool_ids(path: str) -> set:
    with open(path) as handle:
        return {json.loads(line).get("id") for line in handle} - {None}


def test_an_export_carries_what_is_new_and_a_lost_collect_loses_nothing(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(tmp_path / "gpu01.db"))
    target = str(spool / "gpu01.ndjson")
    fleet = store.connect(str(tmp_path / "fleet.db"))
    add_run(node, "a", T0 - 1000)
    assert export_cycle(node, target, T0)["run"] == 1
    collect.collect(fleet, str(spool), consume=True)
    assert os.listdir(spool) == []  # merged, then removed
    add_run(node, "b", T0 + 1000)
    export_cycle(node, target, T0 + 1001)
    assert spool_ids(target) == {"b"}  # only what is new (the overlap reaches back 120 s)
    # The collect of this cycle never comes; the next export replaces the file unread...
    add_run(node, "c", T0 + 1500)
    export_cycle(node, target, T0 + 2001)
    assert spool_ids(target) == {"b", "c"}  # ...so it starts where the unread one did
    report = collect.collect(fleet, str(spool), consume=True)
    assert report["added"]["run"] == 2 and report["skipped"] == []
    assert run_ids(fleet) == {"a", "b", "c"} and os.listdir(spool) == []
    add_run(node, "d", T0 + 3000)
    export_cycle(node, target, T0 + 3001)
    assert spool_ids(target) == {"d"}


def test_a_spool_still_being_copied_in_place_is_kept_until_it_is_whole(tmp_path):
    """A spool copied in place (scp, cp) and claimed halfway: its cut last line says it is
    still being written, so it is merged and kept, not removed with the rest of its records
    still to come; the next collect reads it whole and removes it."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(tmp_path / "gpu01.db"))
    for n in range(6):
        add_run(node, f"r{n}", T0 + n)
    text = export_text(node)
    cut = text.index("\n", len(text) // 2) + 10  # mid-line
    target = spool / "gpu01.ndjson"
    with open(target, "w") as writer:
        writer.write(text[:cut])
        writer.flush()
        fleet = store.connect(str(tmp_path / "fleet.db"))
        report = collect.collect(fleet, str(spool), consume=True)
        assert report["imports"][0][1]["truncated"] and len(report["kept"]) == 1
        writer.write(text[cut:])  # the copy goes on into the claimed file
    assert run_ids(fleet) < {f"r{n}" for n in range(6)}
    report = collect.collect(fleet, str(spool), consume=True)
    assert run_ids(fleet) == {f"r{n}" for n in range(6)} and os.listdir(spool) == []


def test_a_fleet_store_that_stops_taking_writes_stops_collect_and_loses_nothing(tmp_path):
    """The fleet store locked by another process (or full) is not one file's fault: collect
    stops at the first write with StoreFault, instead of skipping every file after a busy
    timeout each; the claimed files stay and the next collect merges them all."""
    spool = tmp_path / "spool"
    spool.mkdir()
    for n in range(3):
        node = store.connect(str(tmp_path / f"gpu0{n}.db"))
        add_run(node, f"r{n}", T0 + n)
        (spool / f"gpu0{n}.ndjson").write_text(export_text(node))
    path = str(tmp_path / "fleet.db")
    store.connect(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, path], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        fleet = store.connect(path, busy_timeout=0.2)
        with pytest.raises(records.StoreFault, match="database is locked"):
            collect.collect(fleet, str(spool), consume=True)
    finally:
        holder.kill()
        holder.wait()
    assert len(os.listdir(spool)) == 3
    report = collect.collect(fleet, str(spool), consume=True)
    assert run_ids(fleet) == {"r0", "r1", "r2"} and os.listdir(spool) == []
    assert report["skipped"] == []


HOLD_LOCK = (
    "import sqlite3, sys, time\n"
    "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "conn.execute('BEGIN EXCLUSIVE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_record_committed_late_is_in_the_next_export(tmp_path):
    node = store.connect(str(tmp_path / "gpu01.db"))
    target = str(tmp_path / "gpu01.ndjson")
    add_run(node, "a", T0 - 1000)
    export_cycle(node, target, T0)
    os.unlink(target)  # collected
    add_run(node, "prolog-that-started-first", T0 - records.OVERLAP / 2)
    export_cycle(node, target, T0 + 300)
    assert spool_ids(target) == {"prolog-that-started-first"}


def test_the_export_cli_refuses_incremental_to_stdout_and_writes_a_spool_file(tmp_path):
    node_store(str(tmp_path / "gpu01.db"), "gpu01").close()
    refused = run_cli("export", "--incremental", "--db", str(tmp_path / "gpu01.db"))
    assert refused.returncode == 2 and "--incremental needs -o FILE" in refused.stderr
    target = str(tmp_path / "gpu01.ndjson")
    args = ("export", "--incremental", "--db", str(tmp_path / "gpu01.db"), "-o", target)
    first = run_cli(*args)
    assert first.returncode == 0 and "3 runs" in first.stdout, first.stderr
    again = run_cli(*args)  # not collected: the same records again
    assert again.returncode == 0 and "3 runs" in again.stdout, again.stderr
    assert json.loads(pathlib.Path(target).read_text().splitlines()[0])["since"] is None
    os.unlink(target)  # collected: the next starts OVERLAP before the last one's snapshot
    begun = time.time()
    assert run_cli(*args).returncode == 0
    since = json.loads(pathlib.Path(target).read_text().splitlines()[0])["since"]
    assert begun - records.OVERLAP - 60 < since < begun - records.OVERLAP


def test_an_unchanged_spool_is_not_read_again_and_collecting_again_adds_nothing(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "gpu03.ndjson").write_text(export_text(node_store(str(tmp_path / "n.db"), "gpu03")))
    fleet = store.connect(str(tmp_path / "fleet.db"))
    first = collect.collect(fleet, str(spool))
    before = dump(fleet)
    assert first["added"]["run"] == 3
    second = collect.collect(fleet, str(spool))
    assert second["unchanged"] == [str(spool / "gpu03.ndjson")] and second["merged"] == []
    third = collect.collect(fleet, str(spool), full=True)  # read again: idempotent
    assert sum(third["added"].values()) == 0 and dump(fleet) == before


def test_partial_files_are_never_read_and_stale_ones_are_cleaned(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    text = export_text(node_store(str(tmp_path / "n.db"), "gpu05"))
    partial = spool / ".gpu05.ndjson.0123456789ab.tmp"  # an export being written
    partial.write_text(text[: len(text) // 2])
    stale = spool / ".gpu06.ndjson.ba9876543210.tmp"  # its writer died two hours ago
    stale.write_text(text[:100])
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    leftover = spool / "gpu05.ndjson.dead.collecting"  # claimed by a collect that stopped
    leftover.write_text(text)
    fleet = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(fleet, str(spool), consume=True)
    assert [os.path.basename(p) for p, _ in report["merged"]] == [leftover.name]
    assert report["skipped"] == [] and report["cleaned"] == 1
    assert sorted(os.listdir(spool)) == [partial.name]
    assert fleet.execute("SELECT count(*) FROM runs").fetchone()[0] == 3


def test_a_spool_collect_cannot_remove_is_read_in_place_and_said(tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "gpu07.ndjson").write_text(export_text(node_store(str(tmp_path / "n.db"), "gpu07")))

    def read_only(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(collect.os, "rename", read_only)
    fleet = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(fleet, str(spool), consume=True)
    assert report["kept"] == [(str(spool / "gpu07.ndjson"), "Permission denied")]
    assert report["added"]["run"] == 3 and os.path.exists(spool / "gpu07.ndjson")


SPOOL_WRITER = """
import os, random, sys, time
from slurmhealth.core import files, store
from slurmhealth.fleet import collect, records, rollup
spool, node, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = store.connect(os.path.join(sys.argv[4], node + ".db"))
target = os.path.join(spool, node + ".ndjson")
rng = random.Random(node)
for cycle in range(cycles):
    for n in range(rng.randrange(1, 4)):
        conn.execute(store.insert_sql("runs"), (f"{node}-{cycle}-{n}", node, None,
                     "healthcheck", time.time(), 0.05, "ok", "v", '{"pad": "' + "x" * 3000 + '"}'))
    time.sleep(rng.random() * 0.02)  # the splay: each node at its own moment of the cycle
    mark = time.time()
    since = records.incremental_since(conn, target, None)
    with files.open_private(target) as out:
        records.export(conn, out, since)
    records.exported(conn, target, since, mark)
"""


def test_many_nodes_exporting_while_collect_consumes_lose_and_tear_nothing(tmp_path):
    spool, stores = tmp_path / "spool", tmp_path / "nodes"
    spool.mkdir()
    stores.mkdir()
    nodes, cycles = [f"gpu{i:02d}" for i in range(12)], 25
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", SPOOL_WRITER, str(spool), n, str(cycles), str(stores)]
        )
        for n in nodes
    ]
    fleet = store.connect(str(tmp_path / "fleet.db"))
    collects = 0
    while any(w.poll() is None for w in writers) or collects == 0:
        report = collect.collect(fleet, str(spool), consume=True)
        assert report["skipped"] == [] and report["kept"] == []
        for _path, result in report["imports"]:
            assert result["bad_count"] == 0 and result["truncated"] is None
        collects += 1
    assert [w.wait() for w in writers] == [0] * len(nodes)
    collect.collect(fleet, str(spool), consume=True)
    expected = set()
    for n in nodes:
        expected |= run_ids(store.connect(str(stores / f"{n}.db")))
    assert run_ids(fleet) == expected and len(expected) >= len(nodes) * cycles
    assert [n for n in os.listdir(spool) if not n.startswith(".")] == []
    assert collects > 1


# The rollup: a small simulated fleet, passing health checks older than a day rolled up.


def rolled_fleet(tmp_path) -> tuple:
    history = simulate.events(simulate.Fleet(nodes=24, days=4, seed=3, jobs_per_node_day=10))
    conn = store.connect(str(tmp_path / "fleet.db"))
    simulate.write_store(history, conn)
    return history, conn


def test_a_rollup_keeps_every_failure_job_run_and_count_and_the_lemon_signals(tmp_path):
    from slurmhealth.fleet import queries

    history, conn = rolled_fleet(tmp_path)
    start, end = history.fleet.start, history.fleet.end
    kept = "SELECT id FROM runs WHERE verdict != 'ok' OR phase != 'healthcheck' ORDER BY id"
    before = {
        "signals": signals.signals(conn, start, end),
        "kept": conn.execute(kept).fetchall(),
        "days": [dict(queries.verdict_counts(conn, t, t + DAY)) for t in range(start, end, 86400)],
    }
    done = rollup.rollup(conn, end - DAY)
    assert done["runs"] > 0.8 * 3 * 24 * 288  # most of three days' passing health checks
    assert conn.execute(kept).fetchall() == before["kept"]
    assert signals.signals(conn, start, end) == before["signals"]
    days = [dict(queries.verdict_counts(conn, t, t + DAY)) for t in range(start, end, 86400)]
    assert days == before["days"]
    not_ok = conn.execute(
        "SELECT count(*) FROM runs u JOIN run_hours h ON h.node = u.node "
        "AND h.hour = CAST(u.started / 3600 AS INTEGER) * 3600 WHERE u.verdict != 'ok'"
    ).fetchone()[0]
    assert not_ok == 0  # an hour with anything but passes is never rolled up
    assert rollup.rollup(conn, end - DAY) == {"runs": 0, "hours": 0, "late": 0, "behind": 0}


def test_runs_imported_again_into_rolled_up_hours_are_not_counted_twice(tmp_path):
    from slurmhealth.fleet import queries

    history, conn = rolled_fleet(tmp_path)
    start, end = history.fleet.start, history.fleet.end
    old = export_text(conn)
    totals = dict(queries.verdict_counts(conn, start, end))
    rollup.rollup(conn, end - DAY)
    records.import_ndjson(conn, old.splitlines(keepends=True))  # an old export, merged again
    assert dict(queries.verdict_counts(conn, start, end))["ok"] > totals["ok"]
    assert rollup.rollup(conn, end - DAY)["late"] > 0
    assert dict(queries.verdict_counts(conn, start, end)) == totals


def rolled_state(conn: sqlite3.Connection) -> tuple:
    """What a rollup leaves: the runs kept, the node-hours' counts, the results kept."""
    return (
        conn.execute("SELECT id FROM runs ORDER BY id").fetchall(),
        conn.execute("SELECT * FROM run_hours ORDER BY node, hour, phase").fetchall(),
        conn.execute("SELECT run_id, check_name FROM results ORDER BY 1, 2").fetchall(),
    )


def test_a_bounded_rollup_does_the_same_in_steps_of_at_most_its_node_hours(tmp_path):
    """collect --rollup-max: each call rolls up at most `limit` node-hours, oldest hour first
    and its nodes in name order, and goes on where the last one stopped; in the end the store
    is what one unbounded rollup leaves, whatever was merged again in between."""
    from slurmhealth.fleet import queries

    history, conn = rolled_fleet(tmp_path)
    start, end = history.fleet.start, history.fleet.end
    whole = store.connect(str(tmp_path / "whole.db"))
    simulate.write_store(history, whole)
    with_skips(conn)
    with_skips(whole)
    old = export_text(conn)
    totals = dict(queries.verdict_counts(conn, start, end))
    due = (int((end - DAY) // 3600) - int(start // 3600)) * 24  # node-hours: 24 nodes
    rollup.rollup(whole, end - DAY)

    limit, calls, seen = 10, 0, set()
    while True:
        before_hours = set(conn.execute("SELECT node, hour FROM run_hours").fetchall())
        done = rollup.rollup(conn, end - DAY, limit)
        calls += 1
        hours = set(conn.execute("SELECT node, hour FROM run_hours").fetchall()) - before_hours
        assert done["hours"] == len(hours) <= limit
        seen |= hours
        assert dict(queries.verdict_counts(conn, start, end)) == totals  # exact at every step
        if calls == 7:  # mid-hour: an old export merged again, folded late or in its turn
            mark = store.get_meta(conn, "rollup")
            assert mark["after"]  # stopped inside an hour
            records.import_ndjson(conn, old.splitlines(keepends=True))
            with_skips(conn)
        if not done["behind"]:
            break
        assert done["behind"] >= 1
    assert calls >= due // limit
    assert seen == set(whole.execute("SELECT node, hour FROM run_hours").fetchall())
    assert rolled_state(conn) == rolled_state(whole)
    assert dict(queries.verdict_counts(conn, start, end)) == totals
    assert rollup.rollup(conn, end - DAY, limit) == {"runs": 0, "hours": 0, "late": 0, "behind": 0}


ROLLER = """
import sys
from slurmhealth.core import store
from slurmhealth.fleet import collect, records, rollup
conn = store.connect(sys.argv[1])
before, steps = float(sys.argv[2]), 0
while rollup.rollup(conn, before, 5)["behind"]:
    steps += 1
print(steps)
"""


def test_two_collects_rolling_up_at_once_leave_what_one_leaves(tmp_path):
    """Two processes rolling up the same store in small steps at the same time (a manual
    collect beside the timer's): each step reads where the last one stopped in its own
    transaction, and a node-hour rolled up twice is left as it was."""
    history, conn = rolled_fleet(tmp_path)
    end = history.fleet.end
    whole = store.connect(str(tmp_path / "whole.db"))
    simulate.write_store(history, whole)
    with_skips(conn)
    with_skips(whole)
    rollup.rollup(whole, end - DAY)
    conn.close()
    args = [sys.executable, "-c", ROLLER, str(tmp_path / "fleet.db"), str(end - DAY)]
    rollers = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    steps = [int(r.communicate(timeout=300)[0]) for r in rollers]
    assert [r.returncode for r in rollers] == [0, 0]
    assert sum(steps) >= 3 * 24 * 24 // 5  # node-hours due, five a step
    conn = store.connect(str(tmp_path / "fleet.db"))
    assert rolled_state(conn) == rolled_state(whole)


def with_skips(conn: sqlite3.Connection) -> None:
    """Every passing health check with the skip results a real node's runs carry (no NVLink, no
    fabric state): stored with each run (Run.records keeps every result that is not ok). Runs
    that have them already keep theirs."""
    skips = [
        (run_id, check, "skip", "not reported", "", "{}", 0.0)
        for (run_id,) in conn.execute(
            "SELECT id FROM runs WHERE phase = 'healthcheck' AND verdict = 'ok'"
        ).fetchall()
        for check in ("gpu.fabric", "nvlink.link_state")
    ]
    conn.executemany(store.insert_sql("results", verb="INSERT OR IGNORE"), skips)
    conn.commit()


def test_skip_results_do_not_keep_an_hour_whole_and_go_with_the_runs_folded(tmp_path):
    """A real node's passing runs carry skips: they must not stop the rollup (they kept every
    hour whole), and a folded run's results go with it; any other result still keeps its hour
    whole, and an old export merged again is folded, skips and all."""
    from slurmhealth.fleet import queries

    history, conn = rolled_fleet(tmp_path)
    start, end = history.fleet.start, history.fleet.end
    old = export_text(conn)
    with_skips(conn)
    # one passing run with an error result (a check that could not run): its hour stays whole
    errored, node, when = conn.execute(
        "SELECT id, node, started FROM runs WHERE phase = 'healthcheck' AND verdict = 'ok' "
        "ORDER BY started LIMIT 1 OFFSET 500"
    ).fetchone()
    conn.execute(
        store.insert_sql("results"), (errored, "ib.rate", "error", "unreadable", "", "{}", 0.0)
    )
    conn.commit()
    hour = int(when // 3600) * 3600
    in_hour = "SELECT count(*) FROM runs WHERE node = ? AND started >= ? AND started < ?"
    whole = conn.execute(in_hour, (node, hour, hour + 3600)).fetchone()[0]
    totals = dict(queries.verdict_counts(conn, start, end))
    done = rollup.rollup(conn, end - DAY)
    assert done["runs"] > 0.8 * 3 * 24 * 288  # as many as without the skips
    assert dict(queries.verdict_counts(conn, start, end)) == totals
    orphans = "SELECT count(*) FROM results WHERE run_id NOT IN (SELECT id FROM runs)"
    assert conn.execute(orphans).fetchone()[0] == 0
    assert whole >= 12 and conn.execute(in_hour, (node, hour, hour + 3600)).fetchone()[0] == whole
    assert conn.execute(
        "SELECT count(*) FROM run_hours WHERE node = ? AND hour = ?", (node, hour)
    ).fetchone() == (0,)
    # the rolled hours keep their first run, and its skips
    kept = conn.execute(
        "SELECT count(*) FROM results r JOIN runs u ON u.id = r.run_id "
        "JOIN run_hours h ON h.node = u.node AND h.hour = CAST(u.started / 3600 AS INTEGER) * 3600"
    ).fetchone()[0]
    assert kept == 2 * conn.execute("SELECT count(*) FROM run_hours").fetchone()[0]
    # an old export merged again, then its runs' skips: folded late, results and all
    records.import_ndjson(conn, old.splitlines(keepends=True))
    assert dict(queries.verdict_counts(conn, start, end))["ok"] > totals["ok"]
    # the export held no results (the simulator's runs have none): the skips, as a node's have
    with_skips(conn)
    assert rollup.rollup(conn, end - DAY)["late"] > 0
    assert dict(queries.verdict_counts(conn, start, end)) == totals
    assert conn.execute(orphans).fetchone()[0] == 0


def versions_text(driver: str) -> str:
    """A run's sources as runner.Gathered.to_dict writes them when the run recorded versions."""
    gpu = {"status": "ok", "message": "", "seconds": 0.01, "versions": {"driver": driver}}
    return json.dumps({"gpu": gpu, "kmsg": {"status": "ok", "message": "", "seconds": 0.001}})


def add_sourced_run(conn: sqlite3.Connection, run_id: str, started: float, sources: str) -> None:
    duration = round(0.05 + (started % 3600) / 1e5, 4)  # each run its own wall time
    row = (run_id, "gpu01", None, "healthcheck", started, duration, "ok", "v", sources)
    conn.execute(store.insert_sql("runs"), row)


def test_a_rollup_keeps_every_run_that_recorded_versions_and_counts_the_others_once(tmp_path):
    from slurmhealth.fleet import queries

    conn = store.connect(str(tmp_path / "fleet.db"))
    hour = (T0 - 3 * DAY) // 3600 * 3600
    # Two hours of passing health checks every 5 minutes. Versions are recorded by whichever
    # run is due (node/runner.py): mid-hour in the first (a driver change, then a second
    # change), by the hour's first run in the second.
    versioned = {"hc4": "550.90.07", "hc9": "550.127.05", "hc12": "550.127.05"}
    sources = {f"hc{slot}": "{}" for slot in range(24)}
    sources.update({run_id: versions_text(driver) for run_id, driver in versioned.items()})
    for slot in range(24):
        add_sourced_run(conn, f"hc{slot}", hour + slot * 300, sources[f"hc{slot}"])
    old = export_text(conn)
    durations = dict(conn.execute("SELECT id, duration FROM runs"))

    done = rollup.rollup(conn, T0 - 2 * DAY)
    # The first hour keeps its first run and its two version records; the second's first run
    # is its version record: all eleven others are folded.
    assert done == {"runs": 9 + 11, "hours": 2, "late": 0, "behind": 0}
    kept = {"hc0", *versioned}
    assert run_ids(conn) == kept
    for run_id in versioned:
        row = conn.execute("SELECT sources FROM runs WHERE id = ?", (run_id,)).fetchone()
        assert row == (sources[run_id],)
    found = queries.version_sources(conn, "gpu01", hour, hour + 2 * 3600).fetchall()
    assert found == [(sources["hc12"],), (sources["hc9"],), (sources["hc4"],)]
    rolled = conn.execute("SELECT sum(runs), sum(duration) FROM run_hours").fetchone()
    assert rolled[0] + len(run_ids(conn)) == 24  # every run kept whole or counted, once
    assert rolled[1] == pytest.approx(sum(d for i, d in durations.items() if i not in kept))
    assert dict(queries.verdict_counts(conn, hour, hour + 2 * 3600)) == {"ok": 24}

    # Late: the old export merged again (its folded runs come back) and a version record that
    # reached the fleet store only now (its node's file was late), mid-hour in a rolled hour.
    records.import_ndjson(conn, old.splitlines(keepends=True))
    late = versions_text("550.127.08")
    add_sourced_run(conn, "hc7-late", hour + 7 * 300 + 30, late)
    assert rollup.rollup(conn, T0 - 2 * DAY) == {"runs": 0, "hours": 0, "late": 20, "behind": 0}
    assert run_ids(conn) == {*kept, "hc7-late"}
    row = conn.execute("SELECT sources FROM runs WHERE id = 'hc7-late'").fetchone()
    assert row == (late,)
    rolled = conn.execute("SELECT sum(runs) FROM run_hours").fetchone()[0]
    assert rolled + len(run_ids(conn)) == 24 + 1
    assert dict(queries.verdict_counts(conn, hour, hour + 2 * 3600)) == {"ok": 25}


def test_the_collect_cli_consumes_the_spool_and_rolls_up(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(tmp_path / "gpu01.db"))
    hour = (T0 - 3 * DAY) // 3600 * 3600
    for slot in range(24):  # two whole hours of passing health checks, three days ago
        add_run(node, f"hc{slot}", hour + slot * 300)
    (spool / "gpu01.ndjson").write_text(export_text(node))
    fleet = str(tmp_path / "fleet.db")
    args = ("collect", str(spool), "--db", fleet, "--since", "28d", "--now", str(T0))
    done = run_cli(*args, "--consume", "--rollup-after", "2d")
    assert done.returncode == 0, done.stderr
    assert "1 file merged, 0 skipped: 24 runs added" in done.stdout
    assert "rollup: 22 passing runs counted in 2 node-hours" in done.stdout
    assert os.listdir(spool) == []
    again = run_cli(*args, "--rollup-after", "2d")
    assert again.returncode == 0 and "0 files merged, 0 skipped: nothing new added" in again.stdout
    bad = run_cli(*args, "--rollup-after", "soon")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    bad = run_cli(*args, "--rollup-after", "2d", "--rollup-max", "-1")
    assert bad.returncode == 2 and "--rollup-max" in bad.stderr and "Traceback" not in bad.stderr


def test_the_collect_cli_rolls_up_at_most_its_node_hours_and_says_when_behind(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    hour = (T0 - 2 * DAY) // 3600 * 3600 - 6 * 3600  # the six hours before --rollup-after
    for name in ("gpu01", "gpu02"):
        node = store.connect(str(tmp_path / f"{name}.db"))
        for slot in range(12 * 6):  # six whole hours of passing health checks
            add_run(node, f"{name}-hc{slot}", hour + slot * 300)
        node.execute("UPDATE runs SET node = ?", (name,))
        node.commit()
        (spool / f"{name}.ndjson").write_text(export_text(node))
    fleet = str(tmp_path / "fleet.db")
    args = ("collect", str(spool), "--db", fleet, "--since", "28d", "--now", str(T0))
    done = run_cli(*args, "--consume", "--rollup-after", "2d", "--rollup-max", "3")
    assert done.returncode == 0, done.stderr
    assert "rollup: 33 passing runs counted in 3 node-hours" in done.stdout
    assert "rollup: 5 hours behind --rollup-after" in done.stdout
    rest = run_cli(*args, "--rollup-after", "2d", "--rollup-max", "0")
    assert rest.returncode == 0, rest.stderr
    assert "rollup: 99 passing runs counted in 9 node-hours" in rest.stdout
    assert "behind" not in rest.stdout


@pytest.mark.real
def test_collect_into_a_store_it_cannot_write_fails_once_not_per_file(tmp_path):
    """The fleet store on a filesystem gone read-only: every file used to be `skipped: attempt
    to write a readonly database`, and collect exited 0 as if the spool were bad."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node_store(str(spool / "gpu01.db"), "gpu01").close()
    with tmpfs(tmp_path / "head", "size=4m,mode=0700") as head:
        fleet = head / "fleet.db"
        store.connect(str(fleet)).close()
        subprocess.run(["mount", "-o", "remount,ro", str(head)], check=True)
        done = run_cli("collect", str(spool), "--db", str(fleet))
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "skipped" not in done.stderr
    assert str(fleet) in done.stderr


def test_a_collect_stopped_with_sigterm_leaves_no_copy_of_a_node_store(tmp_path):
    """systemd stops a collect with SIGTERM (stop, TimeoutStartSec): it ends as an exit, so its
    private copy of the node store it was merging is removed (exit 143)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node_store(str(spool / "gpu01.db"), "gpu01").close()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal, time\nimport slurmhealth.fleet.collect as s\nreal = s._checked_copy\n"
        "def copy(*a, **k):\n    real(*a, **k)\n    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "s._checked_copy = copy\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join([str(hook), REPO]),
        "TMPDIR": str(tmp),
        "SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db"),
    }
    proc = run_cli("collect", str(spool), env=env)
    assert proc.returncode == 143, proc.stderr
    assert os.listdir(tmp) == []


def test_copies_a_killed_collect_left_are_removed_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old, fresh = tmp_path / f"{collect.COPY_PREFIX}old", tmp_path / f"{collect.COPY_PREFIX}now"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "node.db").write_bytes(b"x" * 100)
    os.utime(old, (1, 1))
    collect._clean_copies()
    assert not old.exists() and fresh.exists()


@pytest.mark.slow  # the meta write waits out the store's 30 s busy timeout
def test_an_export_whose_start_cannot_be_remembered_says_the_file_is_written(tmp_path):
    """The node store locked by another process after the export read it: the file is whole
    and in place, and the one line says so (it read as if the export had failed)."""
    db = str(tmp_path / "gpu01.db")
    node = store.connect(db)
    add_run(node, "a", T0)
    node.close()
    out = tmp_path / "spool" / "gpu01.ndjson"
    out.parent.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, db], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        proc = run_cli("export", "--db", db, "--incremental", "-o", str(out), "--since", "3000d")
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "written; its start not remembered" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert spool_ids(str(out)) == {"a"}
