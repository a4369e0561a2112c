"""`slurmhealth history` and `slurmhealth prune` over real node stores."""

from __future__ import annotations

import json
import time

from conftest import run_cli, snapshot_path

from slurmhealth.core import store, timespec
from slurmhealth.node import config, runner


def recorded(db: str, name: str, job: str, when: float, phase: str = "prolog") -> None:
    run = runner.run(
        "gpu01",
        config.defaults(),
        runner.Options(gpu_source=snapshot_path(name)),
        ["gpu"],
        phase=phase,
    )
    run.started = when
    store.record_run(
        store.connect(db), run.records(job), job={"uid": 0, "user": "root", "start": when}
    )


def test_history_lists_runs_problems_and_actions(db):
    now = time.time()
    recorded(db, "healthy", "1", now - 60)
    recorded(db, "ecc-dbe", "2", now - 30)
    store.record_action(
        store.connect(db), "gpu01", "drain", "slurmhealth: GPU 2 ...", "slurmhealth prolog"
    )
    proc = run_cli("history", "--db", db, "--since", "1h")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "gpu.ecc fail: GPU 2 (00000000:3A:00.0) 2 uncorrectable" in lines[1]
    assert lines[2].split()[2:5] == ["prolog", "1", "ok"]
    assert any("drain" in line and "slurmhealth prolog" in line for line in lines)
    doc = json.loads(run_cli("history", "--db", db, "--job", "2", "--json").stdout)
    assert [r["job"] for r in doc["runs"]] == ["2"] and doc["jobs"][0]["user"] == "root"


def test_history_since_and_now_replay(db):
    base = timespec.parse_instant("2026-01-10T00:00:00Z")
    recorded(db, "healthy", "1", base - 3 * 86400)
    recorded(db, "healthy", "2", base - 3600)
    doc = json.loads(
        run_cli(
            "history", "--db", db, "--since", "1d", "--now", "2026-01-10T00:00:00Z", "--json"
        ).stdout
    )
    assert [r["job"] for r in doc["runs"]] == ["2"]


def test_prune_deletes_old_records_only(db):
    now = time.time()
    recorded(db, "ecc-dbe", "old", now - 100 * 86400)
    recorded(db, "healthy", "new", now - 86400)
    conn = store.connect(db)
    for job, when in (("old", now - 100 * 86400), ("new", now - 86400)):
        conn.execute("INSERT INTO published VALUES (?, 'd', ?, 100)", (job, when))
    conn.close()
    proc = run_cli("prune", "--older-than", "90d", "--db", db)
    assert proc.returncode == 0 and "deleted" in proc.stdout
    conn = store.connect(db)
    assert [r[0] for r in conn.execute("SELECT job_id FROM runs")] == ["new"]
    assert (
        conn.execute(
            "SELECT count(*) FROM results WHERE run_id NOT IN (SELECT id FROM runs)"
        ).fetchone()[0]
        == 0
    )
    assert [r[0] for r in conn.execute("SELECT job_id FROM jobs")] == ["new"]
    assert [r[0] for r in conn.execute("SELECT job_id FROM published")] == ["new"]


def test_bad_durations_and_missing_stores_are_one_line_errors(db, tmp_path):
    proc = run_cli("history", "--db", db, "--since", "soon")
    assert proc.returncode == 2 and "not a duration" in proc.stderr
    proc = run_cli("history", "--db", str(tmp_path / "none.db"))
    assert proc.returncode == 1 and "no store at" in proc.stderr
    assert "Traceback" not in proc.stderr
