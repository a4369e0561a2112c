"""fleet/rollup.py: old passing health checks counted per node-hour (real SQLite files)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from conftest import open_fleet, run_cli
from stores import DAY, T0, add_run, export_text, run_ids

from sim import simulate
from slurmhealth.core import store
from slurmhealth.fleet import records, rollup, signals

# The rollup: a small simulated fleet, passing health checks older than a day rolled up.


# On PostgreSQL too (the fleet_store fixture), but for the two slowest there (many small steps,
# each with its temporary tables: 14-17 s a test, against 5-7 s on SQLite); bounded steps and
# two rollups at once run on the server in tests/fleet/test_pgstore.py's two collectors.
def rolled_fleet(db: str) -> tuple:
    """A simulated fleet written into the fleet store `db` (a file or a PostgreSQL URL)."""
    history = simulate.events(simulate.Fleet(nodes=24, days=4, seed=3, jobs_per_node_day=10))
    conn = open_fleet(db)
    simulate.write_store(history, conn)
    return history, conn


def test_a_rollup_keeps_every_failure_job_run_and_count_and_the_lemon_signals(
    fleet_store, tmp_path
):
    from slurmhealth.report import reads

    history, conn = rolled_fleet(fleet_store)
    start, end = history.fleet.start, history.fleet.end
    kept = "SELECT id FROM runs WHERE verdict != 'ok' OR phase != 'healthcheck' ORDER BY id"
    before = {
        "signals": signals.signals(conn, start, end),
        "kept": conn.execute(kept).fetchall(),
        "days": [dict(reads.verdict_counts(conn, t, t + DAY)) for t in range(start, end, 86400)],
    }
    done = rollup.rollup(conn, end - DAY)
    assert done["runs"] > 0.8 * 3 * 24 * 288  # most of three days' passing health checks
    assert conn.execute(kept).fetchall() == before["kept"]
    assert signals.signals(conn, start, end) == before["signals"]
    days = [dict(reads.verdict_counts(conn, t, t + DAY)) for t in range(start, end, 86400)]
    assert days == before["days"]
    not_ok = conn.execute(
        "SELECT count(*) FROM runs u JOIN run_hours h ON h.node = u.node "
        "AND h.hour = CAST(u.started / 3600 AS INTEGER) * 3600 WHERE u.verdict != 'ok'"
    ).fetchone()[0]
    assert not_ok == 0  # an hour with anything but passes is never rolled up
    assert rollup.rollup(conn, end - DAY) == {"runs": 0, "hours": 0, "late": 0, "behind": 0}


def test_runs_imported_again_into_rolled_up_hours_are_not_counted_twice(fleet_store, tmp_path):
    from slurmhealth.report import reads

    history, conn = rolled_fleet(fleet_store)
    start, end = history.fleet.start, history.fleet.end
    old = export_text(conn)
    totals = dict(reads.verdict_counts(conn, start, end))
    rollup.rollup(conn, end - DAY)
    records.import_ndjson(conn, old.splitlines(keepends=True))  # an old export, merged again
    assert dict(reads.verdict_counts(conn, start, end))["ok"] > totals["ok"]
    assert rollup.rollup(conn, end - DAY)["late"] > 0
    assert dict(reads.verdict_counts(conn, start, end)) == totals


def test_runs_merged_between_two_steps_of_one_rollup_are_not_counted_twice(
    fleet_store, monkeypatch
):
    """Another collect's merge that lands between two steps of a rollup (a day each), bringing
    back runs the first step folded: the next step folds them before its mark moves past them.
    Two collectors with overlapping spools met it on PostgreSQL; one collect beside the
    timer's meets it on SQLite."""
    from slurmhealth.report import reads

    history, conn = rolled_fleet(fleet_store)
    start, end = history.fleet.start, history.fleet.end
    columns = ", ".join(store.TABLE["runs"].names())
    every_run = conn.execute(f"SELECT {columns} FROM runs").fetchall()  # noqa: S608
    totals = dict(reads.verdict_counts(conn, start, end))
    real, calls = rollup._rolled, []

    def rolled(inner, until):
        calls.append(until)
        if len(calls) == 3:  # the second step's transaction: the merge came just before it
            inner.executemany(store.insert_sql("runs", verb="INSERT OR IGNORE"), every_run)
        return real(inner, until)

    monkeypatch.setattr(rollup, "_rolled", rolled)
    done = rollup.rollup(conn, end - DAY)
    assert done["late"] > 0 and len(calls) >= 4
    assert dict(reads.verdict_counts(conn, start, end)) == totals


def rolled_state(conn: sqlite3.Connection) -> tuple:
    """What a rollup leaves: the runs kept, the node-hours' counts, the results kept."""
    return (
        conn.execute("SELECT id FROM runs ORDER BY id").fetchall(),
        [  # durations summed in another order (PostgreSQL) differ in their last bits
            (*row[:4], round(row[4], 6))
            for row in conn.execute("SELECT * FROM run_hours ORDER BY node, hour, phase")
        ],
        conn.execute("SELECT run_id, check_name FROM results ORDER BY 1, 2").fetchall(),
    )


def test_a_bounded_rollup_does_the_same_in_steps_of_at_most_its_node_hours(tmp_path):
    """collect --rollup-max: each call rolls up at most `limit` node-hours, oldest hour first
    and its nodes in name order, and goes on where the last one stopped; in the end the store
    is what one unbounded rollup leaves, whatever was merged again in between."""
    from slurmhealth.report import reads

    history, conn = rolled_fleet(str(tmp_path / "fleet.db"))
    start, end = history.fleet.start, history.fleet.end
    whole = store.connect(str(tmp_path / "whole.db"))
    simulate.write_store(history, whole)
    with_skips(conn)
    with_skips(whole)
    old = export_text(conn)
    totals = dict(reads.verdict_counts(conn, start, end))
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
        assert dict(reads.verdict_counts(conn, start, end)) == totals  # exact at every step
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
    assert dict(reads.verdict_counts(conn, start, end)) == totals
    assert rollup.rollup(conn, end - DAY, limit) == {"runs": 0, "hours": 0, "late": 0, "behind": 0}


ROLLER = """
import sys
from slurmhealth.core import store
from slurmhealth.fleet import collect, pgstore, records, rollup
conn = (pgstore.connect if pgstore.is_url(sys.argv[1]) else store.connect)(sys.argv[1])
before, steps = float(sys.argv[2]), 0
while rollup.rollup(conn, before, 5)["behind"]:
    steps += 1
print(steps)
"""


def test_two_collects_rolling_up_at_once_leave_what_one_leaves(tmp_path):
    """Two processes rolling up the same store in small steps at the same time (a manual
    collect beside the timer's): each step reads where the last one stopped in its own
    transaction, and a node-hour rolled up twice is left as it was."""
    history, conn = rolled_fleet(str(tmp_path / "fleet.db"))
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


def test_skip_results_do_not_keep_an_hour_whole_and_go_with_the_runs_folded(
    fleet_store, tmp_path
):
    """A real node's passing runs carry skips: they must not stop the rollup (they kept every
    hour whole), and a folded run's results go with it; any other result still keeps its hour
    whole, and an old export merged again is folded, skips and all."""
    from slurmhealth.report import reads

    history, conn = rolled_fleet(fleet_store)
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
    totals = dict(reads.verdict_counts(conn, start, end))
    done = rollup.rollup(conn, end - DAY)
    assert done["runs"] > 0.8 * 3 * 24 * 288  # as many as without the skips
    assert dict(reads.verdict_counts(conn, start, end)) == totals
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
    assert dict(reads.verdict_counts(conn, start, end))["ok"] > totals["ok"]
    # the export held no results (the simulator's runs have none): the skips, as a node's have
    with_skips(conn)
    assert rollup.rollup(conn, end - DAY)["late"] > 0
    assert dict(reads.verdict_counts(conn, start, end)) == totals
    assert conn.execute(orphans).fetchone()[0] == 0


def versions_text(driver: str) -> str:
    """A run's sources as runner.Gathered.to_dict writes them when the run recorded versions."""
    gpu = {"status": "ok", "message": "", "seconds": 0.01, "versions": {"driver": driver}}
    return json.dumps({"gpu": gpu, "kmsg": {"status": "ok", "message": "", "seconds": 0.001}})


def add_sourced_run(conn: sqlite3.Connection, run_id: str, started: float, sources: str) -> None:
    duration = round(0.05 + (started % 3600) / 1e5, 4)  # each run its own wall time
    row = (run_id, "gpu01", None, "healthcheck", started, duration, "ok", "v", sources)
    conn.execute(store.insert_sql("runs"), row)


def test_a_rollup_keeps_every_run_that_recorded_versions_and_counts_the_others_once(
    fleet_store, tmp_path
):
    from slurmhealth.fleet import queries
    from slurmhealth.report import reads

    conn = open_fleet(fleet_store)
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
    found = queries.version_sources(conn, "gpu01", hour, hour + 2 * 3600, False, 9).fetchall()
    assert found == [(sources["hc12"],), (sources["hc9"],), (sources["hc4"],)]
    rolled = conn.execute("SELECT sum(runs), sum(duration) FROM run_hours").fetchone()
    assert rolled[0] + len(run_ids(conn)) == 24  # every run kept whole or counted, once
    assert rolled[1] == pytest.approx(sum(d for i, d in durations.items() if i not in kept))
    assert dict(reads.verdict_counts(conn, hour, hour + 2 * 3600)) == {"ok": 24}

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
    assert dict(reads.verdict_counts(conn, hour, hour + 2 * 3600)) == {"ok": 25}


def test_the_collect_cli_consumes_the_spool_and_rolls_up(fleet_store, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(tmp_path / "gpu01.db"))
    hour = (T0 - 3 * DAY) // 3600 * 3600
    for slot in range(24):  # two whole hours of passing health checks, three days ago
        add_run(node, f"hc{slot}", hour + slot * 300)
    (spool / "gpu01.ndjson").write_text(export_text(node))
    fleet = fleet_store
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


def test_the_collect_cli_rolls_up_at_most_its_node_hours_and_says_when_behind(
    fleet_store, tmp_path
):
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
    fleet = fleet_store
    args = ("collect", str(spool), "--db", fleet, "--since", "28d", "--now", str(T0))
    done = run_cli(*args, "--consume", "--rollup-after", "2d", "--rollup-max", "3")
    assert done.returncode == 0, done.stderr
    assert "rollup: 33 passing runs counted in 3 node-hours" in done.stdout
    assert "rollup: 5 hours behind --rollup-after" in done.stdout
    rest = run_cli(*args, "--rollup-after", "2d", "--rollup-max", "0")
    assert rest.returncode == 0, rest.stderr
    assert "rollup: 99 passing runs counted in 9 node-hours" in rest.stdout
    assert "behind" not in rest.stdout
