"""fleet/records.py: the record format, export and import (real SQLite files)."""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from conftest import run_cli
from stores import (
    DAY,
    HOLD_LOCK,
    T0,
    add_run,
    dump,
    export_cycle,
    export_text,
    node_store,
    spool_ids,
)

from slurmhealth.core import store
from slurmhealth.fleet import records

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
        json.dumps({**good, "id": "a6", "type": ["action"]}),  # a type that is no string
        json.dumps({**good, "id": "a7", "type": {"action": 1}}),
    ]
    target = store.connect(str(tmp_path / "fleet.db"))
    report = records.import_ndjson(target, [line + "\n" for line in lines])
    assert [n for n, _ in report["bad"]] == [2, 3, 4, 5, 6, 7, 8, 10, 11]
    assert report["bad"][-2][1] == "unknown record type ['action']"
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
