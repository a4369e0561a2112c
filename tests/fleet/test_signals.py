"""fleet/signals.py: lemon evidence from the fleet store, against hand counts and the simulator."""

from __future__ import annotations

import gc
import re
import sqlite3

import pytest
from stores import DAY, T0

from sim import simulate
from slurmhealth.core import store
from slurmhealth.fleet import lemons, policy, queries, signals, trends

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
    days = signals._RUN_DAYS.format("(?)")
    for sql, args in (
        (signals._JOBS[1].format("(?), (?)"), ("n", "m", 0, 1)),
        (days, (0.0, 1.0, "n", 0.0, 1.0)),
        (signals._RUN_VERDICTS[1], (0, 1)),
    ):
        plan = " ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
        tables = re.sub(r"SCAN (q|days|n|(\d+ )?CONSTANT ROWS?)\b", "", plan)  # the CTEs' own rows
        assert "COVERING INDEX" in plan and "SCAN" not in tables, plan


def test_signals_equal_the_simulators_on_its_fleet(tmp_path):
    """The contract has two sides (docs/signals.md): SQL over a store, and the simulator's."""
    fleet_model = simulate.Fleet(nodes=16, days=14, seed=3, lemons={"gpu0003": 30}, incident_day=5)
    history = simulate.events(fleet_model)
    conn = store.connect(str(tmp_path / "fleet.db"))
    simulate.write_store(history, conn)
    start, end = fleet_model.start, fleet_model.end
    for window in ((start, end), (start + 3 * DAY + 77, start + 6 * DAY + 5)):
        assert signals.signals(conn, *window) == simulate.signals(history, *window)


def test_days_and_next_passes_are_the_same_however_many_a_statement_asks(tmp_path, monkeypatch):
    """The days of each node's runs and the next passing run of every item are looked up
    queries.BATCH nodes or items at a time: a statement's edge changes nothing."""
    fleet_model = simulate.Fleet(nodes=16, days=14, seed=3, lemons={"gpu0003": 30}, incident_day=5)
    history = simulate.events(fleet_model)
    conn = store.connect(str(tmp_path / "fleet.db"))
    simulate.write_store(history, conn)
    window = (fleet_model.start, fleet_model.end)
    whole = signals.signals(conn, *window)
    assert sum(len(c["faults"]) + len(c["warnings"]) for c in whole.values()) > 2 * 3
    monkeypatch.setattr(queries, "BATCH", 3)
    assert signals.signals(conn, *window) == whole == simulate.signals(history, *window)


def test_windows_read_together_count_as_each_alone(tmp_path, monkeypatch):
    """service() reads the days of windows that overlap in one sweep of their span and a day
    an edge cuts inside it apart: each window's signals and counts are what it gives alone,
    and the simulator's. The report's pair (its whole days, the lemons' 28 days up to now), a
    young fleet's (the whole days start later), edges inside one day, an end inside the span."""
    fleet_model = simulate.Fleet(nodes=16, days=14, seed=3, lemons={"gpu0003": 30}, incident_day=5)
    history = simulate.events(fleet_model)
    conn = store.connect(str(tmp_path / "fleet.db"))
    simulate.write_store(history, conn)
    start, end = fleet_model.start, fleet_model.end
    now = end - DAY + 6 * 3600  # 06:00 of the last day
    pairs = [
        ((now - 6 * 3600 - 10 * DAY, now - 6 * 3600), (now - 10 * DAY, now)),
        ((start + 2 * DAY, now - 6 * 3600), (now - 13.5 * DAY, now)),
        ((start, end), (start + 3 * DAY + 77, start + 3 * DAY + 5000)),
        ((start + DAY + 100, start + 5 * DAY + 300), (start, end), (start + 4 * DAY, end)),
    ]
    spans: list = []
    real = signals._run_days
    monkeypatch.setattr(
        signals, "_run_days", lambda c, a, b, n: spans.append((a, b)) or real(c, a, b, n)
    )
    for windows in pairs:
        spans.clear()
        read = signals.service(conn, list(windows))
        assert sum(b - a > DAY for a, b in spans) == 1  # one sweep; the rest are cut days
        for window, days in zip(windows, read):
            alone = signals.signals(conn, *window)
            assert signals.signals(conn, *window, signals.Read(days=days)) == alone
            assert alone == simulate.signals(history, *window)
            assert signals.counts(conn, *window, days) == signals.counts(conn, *window)
    spans.clear()
    read = signals.service(conn, list(pairs[0]))  # the report's: the lemons' first day apart
    assert spans == [(now - 6 * 3600 - 10 * DAY, now), (now - 10 * DAY, now - 6 * 3600 - 9 * DAY)]
    assert any(c["node_days"] for c in signals.counts(conn, *pairs[0][0], read[0]).values())


def test_a_sweep_pauses_the_cycle_collector_and_restores_it(tmp_path, monkeypatch):
    """trends.no_gc: no cycle collection while a sweep builds its objects; as it was after,
    also when the sweep fails, and left off where the caller had turned it off."""
    conn = signal_store(str(tmp_path / "fleet.db"))
    seen = []
    real = signals.signals

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    assert gc.isenabled()
    monkeypatch.setattr(signals, "signals", watched)
    try:
        assert lemons.sweep(conn, T0 + 28 * DAY, 28 * DAY)
        assert seen == [False] and gc.isenabled()
        with pytest.raises(RuntimeError), trends.no_gc():
            raise RuntimeError
        assert gc.isenabled()
        gc.disable()
        with trends.no_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
