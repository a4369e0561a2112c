"""fleet/accounting.py: Slurm accounting (sacct jobs, sacctmgr node events, topology and
partitions) merged into the fleet store."""

from __future__ import annotations

import sqlite3
import stat
import time

import pytest
from conftest import open_fleet, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from stores import DAY

from slurmhealth.core import store
from slurmhealth.core.result import clean
from slurmhealth.core.slurm import SlurmError
from slurmhealth.fleet import accounting, records, signals

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


def test_sacct_fills_what_the_hooks_could_not_know_and_never_erases(fleet_store, tmp_path):
    conn = open_fleet(fleet_store)
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


def test_collect_sacct_counts_a_job_whose_node_died_before_its_epilog(fleet_store, tmp_path):
    line = "12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|2026-05-01T10:30:00|alice"
    bin_dir = fake_sacct(tmp_path, f'echo "{line}"\n')
    event = "gpu04|2026-05-01T10:30:00|Unknown|DOWN*|Not responding"
    fake_sacct(tmp_path, f'echo "{event}"\n', tool="sacctmgr")
    no_topology(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    fleet_db = fleet_store
    args = ["collect", str(spool), "--db", fleet_db, "--sacct", "--slurm-bin", bin_dir]
    proc = run_cli(*args, "--now", "2026-05-02", "--since", "2d")
    assert proc.returncode == 0, proc.stderr
    assert "sacct: 1 job rows added or updated" in proc.stdout
    assert "sacctmgr: 1 node events added or updated" in proc.stdout
    assert "places: 4 node places (partition)" in proc.stdout
    conn = open_fleet(fleet_db)
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


def test_node_events_merge_idempotently_and_an_open_event_gets_its_end(fleet_store, tmp_path):
    conn = open_fleet(fleet_store)
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


def test_places_merge_with_first_and_last_seen_and_a_moved_node_keeps_its_old_place(
    fleet_store, tmp_path
):
    conn = open_fleet(fleet_store)
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


def test_a_partition_is_a_place_only_where_it_holds_a_quarter_of_the_nodes_or_less(
    fleet_store, tmp_path
):
    conn = open_fleet(fleet_store)
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


def _collect_sacct(tmp_path, bin_dir: str, fleet_db: str) -> tuple:
    """`collect --sacct` of an empty spool with the stand-ins in `bin_dir`, which fails (exit
    1, one line, no traceback): (process, the fleet store's path)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    args = ["collect", str(spool), "--db", fleet_db, "--sacct", "--slurm-bin", bin_dir]
    proc = run_cli(*args, "--now", "2026-05-02", "--since", "2d")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    return proc, fleet_db


def test_collect_keeps_the_jobs_it_merged_when_sacctmgr_fails(fleet_store, tmp_path):
    line = "12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|2026-05-01T10:30:00|alice"
    bin_dir = fake_sacct(tmp_path, f'echo "{line}"\n')
    fake_sacct(tmp_path, f"printf '%s' '{SLURMDBD_DOWN}' >&2\nexit 1\n", "sacctmgr")
    proc, fleet_db = _collect_sacct(tmp_path, bin_dir, fleet_store)
    assert "sacct: 1 job rows added or updated" in proc.stdout
    (error,) = proc.stderr.strip().splitlines()
    assert error.startswith("Error: sacctmgr: error: slurm_persist_conn_open_without_init: ")
    assert error.endswith("Connection refused (node events from accounting not merged)")
    conn = open_fleet(fleet_db)
    assert conn.execute("SELECT job_id, slurm_state FROM jobs").fetchall() == [("12", "NODE_FAIL")]


def test_collect_keeps_what_it_merged_when_the_places_cannot_be_read(fleet_store, tmp_path):
    line = "12|NODE_FAIL|0:0|gpu04|2026-05-01T10:00:00|2026-05-01T10:30:00|alice"
    bin_dir = fake_sacct(tmp_path, f'echo "{line}"\n')
    fake_sacct(tmp_path, "echo 'gpu04|2026-05-01T10:30:00|Unknown|DOWN*|x'\n", "sacctmgr")
    down = "slurm_load_topo error: Unable to contact slurm controller (connect failure)"
    fake_sacct(tmp_path, f"echo '{down}' >&2\nexit 1\n", "scontrol")
    proc, fleet_db = _collect_sacct(tmp_path, bin_dir, fleet_store)
    assert proc.stderr.strip().splitlines() == [
        f"Error: scontrol: {down} (places of nodes not merged)"
    ]
    conn = open_fleet(fleet_db)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM node_events").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM places").fetchone()[0] == 0
