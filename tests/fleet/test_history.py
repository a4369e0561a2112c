"""`slurmhealth history` and `slurmhealth prune` over real node stores."""

from __future__ import annotations

import json
import os
import sqlite3
import time

from conftest import run_as_nobody, run_cli, snapshot_path

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
    assert "gpu.ecc fail: GPU 2 (0000:3a:00) 2 uncorrectable" in lines[1]
    assert lines[2].split()[2:5] == ["prolog", "1", "ok"]
    assert any("drain" in line and "slurmhealth prolog" in line for line in lines)
    doc = json.loads(run_cli("history", "--db", db, "--job", "2", "--json").stdout)
    assert [r["job"] for r in doc["runs"]] == ["2"] and doc["jobs"][0]["user"] == "root"


def test_history_shows_the_remediation_ladders_steps_with_their_details(db):
    """A reboot asked of Slurm, and one that failed: each step says what it came to."""
    conn = store.connect(db)
    why = "slurmhealth: reboot: GPU 0 (0000:18:00) Xid 79 GPU has fallen off the bus"
    said = "requested: 1 of 2 remediations in 7 d"
    hc = "slurmhealth healthcheck"
    store.record_action(conn, "gpu01", "reboot", why, hc, False, "failed: scontrol reboot: x")
    store.record_action(conn, "gpu01", "reboot", why, hc, True, said)
    lines = run_cli("history", "--db", db, "--since", "1h").stdout.splitlines()
    steps = [line for line in lines if " reboot " in line]
    assert len(steps) == 2
    assert steps[0].endswith(f"{hc}: {why} ({said})")  # newest first
    assert steps[1].endswith("(FAILED: failed: scontrol reboot: x)")


def test_history_shows_the_counters_a_run_saw_rise(db):
    """The node's second run reads 2 more uncorrectable errors on GPU 2: `history` says so."""
    now = time.time()
    conn = store.connect(db)
    for name, when in (("healthy", now - 60), ("ecc-dbe", now - 30)):
        run = runner.run(
            "gpu01",
            config.defaults(),
            runner.Options(gpu_source=snapshot_path(name)),
            ["gpu"],
            "check",
            store.load_baselines(conn, "gpu01"),
        )
        run.started = when
        store.record_run(conn, run.records())
    proc = run_cli("history", "--db", db, "--since", "1h")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()[1:3]
    assert "; counters: GPU 2 ecc_dbe_aggregate +2, GPU 2 ecc_dbe_volatile +2" in first
    assert "counters" not in second
    doc = json.loads(run_cli("history", "--db", db, "--since", "1h", "--json").stdout)
    assert {"device": "GPU 2", "counter": "ecc_dbe_volatile", "delta": 2, "value": 2} in doc[
        "runs"
    ][0]["counters"]


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


# --- durations need a unit; prune --dry-run ------------------------------------------------------


def aged_store(db: str, now: float) -> None:
    """A real store with records 100 days old and 1 day old in every table that prune trims."""
    recorded(db, "ecc-dbe", "old", now - 100 * 86400)
    recorded(db, "healthy", "new", now - 86400)
    conn = store.connect(db)
    store.record_action(conn, "gpu01", "drain", "old", "slurmhealth prolog", when=now - 100 * 86400)
    store.record_action(conn, "gpu01", "resume", "new", "slurmhealth", when=now - 86400)
    for job, when in (("old", now - 100 * 86400), ("new", now - 86400)):
        conn.execute("INSERT INTO published VALUES (?, 'd', ?, 100)", (job, when))
    conn.close()


def table_counts(db: str) -> dict:
    conn = store.connect(db)
    tables = [table for table, _ in store._PRUNE]
    counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}  # noqa: S608
    conn.close()
    return counts


def test_prune_refuses_a_bare_number_and_deletes_nothing(db):
    aged_store(db, time.time())
    before = table_counts(db)
    proc = run_cli("prune", "--older-than", "90", "--db", db)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert "'90' has no unit (write 90s, 90m, 90h, 90d or 90w)" in error
    assert table_counts(db) == before


def test_prune_dry_run_counts_per_table_and_deletes_nothing(db):
    aged_store(db, time.time())
    before = table_counts(db)
    assert before["results"] > 0
    proc = run_cli("prune", "--older-than", "90d", "--dry-run", "--db", db)
    assert proc.returncode == 0, proc.stderr
    assert table_counts(db) == before
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"{db}: would delete ") and line.endswith("(dry run: nothing deleted)")
    listed = line.split("would delete ")[1].split(" (dry run")[0]
    said = {table: int(n) for n, table in (part.split() for part in listed.split(", "))}
    # a count of one in the singular (`1 run`), the table's name otherwise
    said = {t if t in before else f"{t}s": n for t, n in said.items()}
    assert set(said) == set(before)
    assert "1 run, 1 action, 1 job, 1 published" in listed and "0 events" in listed
    old = {"runs": 1, "actions": 1, "jobs": 1, "published": 1, "events": 0}
    assert {t: said[t] for t in old} == old
    assert said["results"] == before["results"] - table_counts_of_new_results(db) > 0
    proc = run_cli("prune", "--older-than", "90d", "--db", db)
    assert proc.returncode == 0 and "deleted" in proc.stdout
    after = table_counts(db)
    assert {t: before[t] - after[t] for t in said} == said
    conn = store.connect(db)
    assert [r[0] for r in conn.execute("SELECT job_id FROM runs")] == ["new"]
    assert [r[0] for r in conn.execute("SELECT reason FROM actions")] == ["new"]


def table_counts_of_new_results(db: str) -> int:
    conn = store.connect(db)
    sql = "SELECT count(*) FROM results JOIN runs ON runs.id = run_id WHERE job_id = 'new'"
    count = conn.execute(sql).fetchone()[0]
    conn.close()
    return count


def test_prune_help_names_the_units_and_acts_not(db):
    aged_store(db, time.time())
    before = table_counts(db)
    proc = run_cli("prune", "--older-than", "90", "--db", db, "--help")
    assert proc.returncode == 0 and "--dry-run" in proc.stdout
    assert "bare number" in proc.stdout and "90d" in proc.stdout
    assert table_counts(db) == before


# --- stored strings are untrusted; $SLURMHEALTH_DB ---------------------------------------------

HOSTILE = "gpu\x1b[2J\x1b]0;owned\x07\n\x00x\x9b1m"


def forged_export(path, now: float) -> str:
    """An export whose strings carry terminal escapes, BEL, newlines and NUL (JSON allows all)."""
    records = [
        {"type": "header", "format": 1},
        {"type": "run", "id": "r1", "node": "gpu01", "job_id": "1\x1b[31m", "phase": "prolog",
         "started": now - 60, "duration": 0.1, "verdict": "fail\a", "tool_version": "0.1.0"},
        {"type": "result", "run_id": "r1", "check_name": "gpu\x1b[1m.ecc", "status": "fail",
         "message": f"lost\r\n{HOSTILE}\x00", "action": "drain"},
        {"type": "action", "id": "a1", "node": "gpu01", "time": now - 30, "action": "drain\x07",
         "reason": f"why\n{HOSTILE}", "actor": "me\x1b[0m", "ok": 0, "detail": "no\x00pe"},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_history_prints_no_control_characters_of_a_forged_store(tmp_path):
    db = str(tmp_path / "forged.db")
    imported = run_cli("import", "--db", db, forged_export(tmp_path / "forged.ndjson", time.time()))
    assert imported.returncode == 0, imported.stderr
    # A node name no node can have is refused at the import (below); one written into the
    # store by other means (an edit by hand) must still print as text.
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET node = ?", (HOSTILE,))
        conn.execute("UPDATE actions SET node = ?", (HOSTILE,))
    proc = run_cli("history", "--db", db, "--since", "1h")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout[:-1].split("\n")  # split on \n only: no line may hide another
    assert len(lines) == 5  # header, the run, a blank line, the actions' header, the action
    for line in lines:
        assert line.isprintable(), repr(line)  # no ESC, BEL, CR, NUL, no C1 (\x9b) either
    assert "lost gpu?[2J?]0;owned?" in lines[1] and "why gpu?[2J" in lines[4]
    doc = run_cli("history", "--db", db, "--since", "1h", "--json").stdout
    assert doc.isascii() and all(ch >= " " for ch in doc.replace("\n", ""))
    got = json.loads(doc)
    assert got["runs"][0]["node"] == HOSTILE and got["actions"][0]["reason"] == f"why\n{HOSTILE}"


def test_an_import_refuses_node_names_no_node_can_have_and_values_of_the_wrong_type(tmp_path):
    """A node name from an import reaches Slurm commands (a lemon drain) and every reader: a
    node set (`gpu[01-64]`: 64 nodes drained by one command, admins' drains resumed), an
    option or control characters are refused, one line each. So is a string where a time or
    a count belongs, which stopped every reader that met it."""
    now = time.time()
    good = {"type": "action", "id": "a0", "node": "gpu01", "time": now, "action": "drain",
            "reason": "r", "actor": "me", "ok": 1, "detail": ""}  # fmt: skip
    bad = [
        dict(good, id="a1", node="gpu[01-64]"),
        dict(good, id="a2", node="-v"),
        dict(good, id="a3", node=HOSTILE),
        dict(good, id="a4", node=""),
        dict(good, id="a5", time="yesterday"),
        dict(good, id="a6", ok=0.5),
        dict(good, id="a7", time=float("inf")),
        {"type": "run", "id": "r1", "node": "gpu01", "phase": "prolog", "started": now,
         "duration": "slow", "verdict": "ok", "tool_version": "0.1.0"},
    ]  # fmt: skip
    path = tmp_path / "in.ndjson"
    path.write_text(
        json.dumps({"type": "header", "format": 1}) + "\n"
        + "".join(json.dumps(r) + "\n" for r in [good, *bad])
    )
    db = str(tmp_path / "fleet.db")
    done = run_cli("import", "--db", db, str(path))
    assert done.returncode == 0, done.stderr
    assert ": 1 record:" in done.stdout, done.stdout
    assert len([line for line in done.stderr.splitlines() if ": skipped: " in line]) == len(bad)
    for line in done.stderr.splitlines():
        assert line.isprintable(), repr(line)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id FROM actions").fetchall() == [("a0",)]
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)


def test_history_without_db_reads_slurmhealth_db(tmp_path):
    db = str(tmp_path / "elsewhere.db")
    recorded(db, "ecc-dbe", "7", time.time() - 60)
    empty_state = tmp_path / "state"
    empty_state.mkdir()
    env = {"SLURMHEALTH_DB": db, "SLURMHEALTH_STATE_DIR": str(empty_state)}
    proc = run_cli("history", "--since", "1h", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert [r["job"] for r in json.loads(proc.stdout)["runs"]] == ["7"]
    proc = run_cli(
        "history",
        "--since",
        "1h",
        "--json",
        env={"SLURMHEALTH_STATE_DIR": str(empty_state), "SLURMHEALTH_DB": ""},
    )
    assert json.loads(proc.stdout)["runs"] == []  # without it: the (empty) state directory


def test_history_of_a_rolled_up_fleet_store_says_how_many_runs_it_counts(tmp_path):
    """A fleet store whose old passing health checks a rollup folded into hourly counts: the
    hour's first run is listed, the others are counted, and history says so."""
    from slurmhealth.fleet import rollup

    db = str(tmp_path / "fleet.db")
    conn = store.connect(db)
    hour = 1_700_000_000 // 3600 * 3600
    for i in range(12):  # a health check every 5 minutes for an hour, all passing
        conn.execute(
            store.insert_sql("runs"),
            (f"r{i}", "gpu01", None, "healthcheck", hour + 300 * i, 0.05, "ok", "t", "{}"),
        )
    conn.commit()
    assert rollup.rollup(conn, hour + 7200)["runs"] == 11
    now = str(hour + 7200)
    proc = run_cli("history", "--db", db, "--since", "1d", "--now", now)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len([x for x in lines if "healthcheck" in x]) == 1
    assert lines[-1] == (
        "11 more passing health checks are counted per hour, not listed (collect --rollup-after)"
    )
    doc = json.loads(run_cli("history", "--db", db, "--since", "1d", "--now", now, "--json").stdout)
    assert doc["rolled_up"] == 11 and len(doc["runs"]) == 1


# --- a user who is not root: the state directory is root's -----------------------------------


def test_history_as_a_user_says_it_cannot_read_the_state_dir_never_an_empty_table(public_dir):
    state = public_dir / "state"
    state.mkdir(mode=0o700)
    recorded(str(state / "gpu01.db"), "healthy", "1", time.time() - 60)
    env = {"SLURMHEALTH_STATE_DIR": str(state)}
    denied = f"Error: cannot read {state} (permission denied): "
    for args in (("history",), ("history", "--node", "gpu01"), ("prune", "--older-than", "1d")):
        proc = run_as_nobody(*args, env=env)
        assert proc.returncode == 1, (args, proc.stdout)
        assert proc.stderr == f"{denied}{args[0]} needs root, or --db a copy you own\n"
        assert proc.stdout == ""
    named = run_as_nobody("history", "--db", str(state / "gpu01.db"))
    assert named.returncode == 1 and named.stderr.startswith(denied)
    # root reads it; a user with a state dir holding no store has no records: exit 0
    assert "gpu01" in run_cli("history", env=env).stdout
    empty = run_as_nobody("history", env={"SLURMHEALTH_STATE_DIR": str(public_dir / "none")})
    assert empty.returncode == 0 and empty.stdout.split() == (
        "TIME NODE PHASE JOB VERDICT PROBLEMS".split()
    )


def test_a_store_a_user_may_read_but_not_write_beside_is_said_and_a_copy_of_theirs_reads(
    public_dir,
):
    """A store readable through its group (0640 in a 0750 directory, neither the user's to
    write): SQLite must make its -shm beside it to read it, so the hint is a copy the user owns,
    and such a copy reads."""
    NOBODY = 65534
    made = public_dir / "made.db"
    recorded(str(made), "healthy", "1", time.time() - 60)
    shared = public_dir / "shared"
    shared.mkdir(mode=0o750)
    db = shared / "gpu01.db"
    done = sqlite3.connect(made)
    done.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file alone holds every record
    done.close()
    db.write_bytes(made.read_bytes())
    for path, mode in ((shared, 0o750), (db, 0o640)):
        os.chown(path, 0, NOBODY)
        path.chmod(mode)
    for args in (("history", "--db", str(db)), ("lemons", "--db", str(db))):
        proc = run_as_nobody(*args)
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
        assert proc.stderr == (
            f"Error: cannot open {db}: SQLite writes beside a store it reads, and {shared} is"
            f" not this user's to write: {args[0]} needs root, or --db a copy you own\n"
        )
        assert sorted(os.listdir(shared)) == ["gpu01.db"]
    own = public_dir / "own"
    own.mkdir()
    os.chown(own, NOBODY, NOBODY)
    copy = own / "gpu01.db"
    copy.write_bytes(db.read_bytes())
    os.chown(copy, NOBODY, NOBODY)
    mine = run_as_nobody("history", "--db", str(copy))
    assert mine.returncode == 0, mine.stderr
    assert "gpu01" in mine.stdout.splitlines()[-1]


def test_history_and_prune_name_one_node():
    for args in (
        ("history", "--node", "gpu01\nx"),
        ("prune", "--older-than", "1d", "--node", "/x"),
    ):
        proc = run_cli(*args)
        assert proc.returncode == 2
        (line,) = proc.stderr.splitlines()
        assert "Invalid value for '--node': not a node name" in line
