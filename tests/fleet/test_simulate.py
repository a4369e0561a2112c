"""The fleet simulator: determinism, the model's promises, signals in memory vs in a store."""

from __future__ import annotations

import json

import pytest

from slurmhealth.core import store
from slurmhealth.fleet import policy, signals, simulate

DAY = simulate.DAY


def small(**kw) -> simulate.Fleet:
    """48 nodes, 10 days, hourly health checks: quick, and still every kind of record."""
    args = dict(nodes=48, days=10, seed=11, healthcheck_interval=3600, incident_day=4)
    args.update(kw)
    return simulate.Fleet(**args)


@pytest.fixture(scope="module")
def lemony() -> simulate.History:
    """A fleet with two lemons at k=100: faults of every kind, warnings, the incident."""
    f = small(lemons={"gpu0003": 100, "gpu0040": 100}, base_rate=0.01)
    return simulate.events(f)


def test_same_seed_same_history_other_seed_another():
    one, two = simulate.events(small()), simulate.events(small())
    assert (one.jobs, one.runs, one.events, one.actions) == (
        two.jobs,
        two.runs,
        two.events,
        two.actions,
    )
    assert one.faults == two.faults
    other = simulate.events(small(seed=12))
    assert other.jobs != one.jobs


def test_base_rate_is_drawn_from_the_literature():
    rates = {simulate.events(small(nodes=4, days=2, seed=s)).base_rate for s in range(10)}
    lo, hi = simulate.LITERATURE_RATES
    assert len(rates) == 10 and all(lo <= r <= hi for r in rates)
    assert simulate.events(small(nodes=4, days=2, base_rate=0.01)).base_rate == 0.01


def test_names_and_lemon_picking():
    f = simulate.Fleet(nodes=12000)
    assert f.names()[0] == "gpu00001" and simulate.Fleet(nodes=3).names() == [
        "gpu0001",
        "gpu0002",
        "gpu0003",
    ]
    picked = simulate.pick_lemons(simulate.Fleet(seed=3), 5, 30)
    assert len(picked) == 5 and set(picked.values()) == {30}
    assert picked == simulate.pick_lemons(simulate.Fleet(seed=3), 5, 30)
    with pytest.raises(ValueError):
        simulate.events(small(lemons={"nope": 5}))


def test_every_node_runs_every_day(lemony):
    sig = simulate.signals(lemony, lemony.fleet.start, lemony.fleet.end)
    assert sorted(sig) == lemony.names
    assert {s["node_days"] for s in sig.values()} == {10}


def test_lemons_fail_more_and_show_more_warnings(lemony):
    sig = simulate.signals(lemony, lemony.fleet.start, lemony.fleet.end)
    healthy = [s for n, s in sig.items() if n not in lemony.fleet.lemons]
    mean = {k: sum(s[k] for s in healthy) / len(healthy) for k in policy.SIGNALS}
    for node in lemony.fleet.lemons:
        assert len(lemony.faults[node]) >= 3
        assert sig[node]["warn_xids"] > 10 * max(mean["warn_xids"], 0.1)
        assert sig[node]["check_warns"] > 10 * max(mean["check_warns"], 0.1)
        hardware = sum(sig[node][k] for k in ("hw_job_failures", "hw_xids", "drains"))
        assert hardware >= 3


def test_faults_show_in_every_way(lemony):
    """Prolog failures, NODE_FAIL jobs, hardware Xids during jobs, failed checks, drains."""
    states = {(r[5], r[6]) for r in lemony.jobs}
    assert any(state == "prolog_failed" for state, _ in states)
    assert any(slurm == "NODE_FAIL" for _, slurm in states)
    classes = {(e[6], e[3] is not None) for e in lemony.events}
    assert {("fail", True), ("warn", False), ("app", True)} <= classes
    phases = {(r[3], r[5]) for r in lemony.runs}
    assert {("prolog", "fail"), ("epilog", "fail"), ("healthcheck", "fail")} <= phases
    assert ("healthcheck", "warn") in phases
    assert {a[3] for a in lemony.actions} >= {"drain", "resume", "breaker"}


def test_application_faults_are_no_hardware_evidence():
    """Users' faults everywhere, no hardware fault at all: the hardware signals stay at 0."""
    h = simulate.events(small(base_rate=1e-12, app_xid_share=0.5, incident_day=None))
    assert sum(e[6] == "app" for e in h.events) > 100
    sig = simulate.signals(h, h.fleet.start, h.fleet.end)
    for s in sig.values():
        assert s["hw_job_failures"] == s["hw_xids"] == s["drains"] == 0
    assert sum(s["multi_node_failures"] for s in sig.values()) > 0  # users' FAILED jobs


def test_incident_drains_stop_at_the_breaker():
    h = simulate.events(small(nodes=100, base_rate=1e-12))
    stats = h.breaker
    assert stats["cap"] == 10
    assert stats["drained"] == 10 and stats["stopped"] == 90
    assert stats["max_in_window"] <= stats["cap"]
    begin, end = stats["incident_start"], stats["incident_end"]
    drains = [a for a in h.actions if a[3] == "drain"]
    assert len(drains) == 10 and all(begin <= a[2] < end for a in drains)
    refused = [a for a in h.actions if a[3] == "breaker"]
    assert len(refused) == 90 and all(a[6] == 0 for a in refused)
    assert refused[0][7].startswith("circuit breaker: 10 of 100 nodes drained by slurmhealth")
    assert not any(
        r["lemon"] for r in policy.score(simulate.signals(h, h.fleet.start, h.fleet.end))
    )


def test_planted_lemons_at_k100_are_found():
    for seed in range(3):
        f = simulate.Fleet(nodes=128, days=28, seed=seed, healthcheck_interval=1800)
        f.lemons = simulate.pick_lemons(f, 3, 100)
        h = simulate.events(f)
        scored = policy.score(simulate.signals(h, f.start, f.end))
        assert {r["node"] for r in scored if r["lemon"]} == set(f.lemons), seed


def test_daily_signals_add_up_to_the_window(lemony):
    f = lemony.fleet
    daily = simulate.daily_signals(lemony)
    assert sorted(daily) == list(range(f.start // DAY, f.start // DAY + f.days))
    total: dict = {}
    for day in sorted(daily)[2:6]:
        simulate.add_signals(total, daily[day])
    assert total == simulate.signals(lemony, f.start + 2 * DAY, f.start + 6 * DAY)


def test_windows_outside_the_history_are_empty(lemony):
    f = lemony.fleet
    assert simulate.signals(lemony, f.start - 5 * DAY, f.start) == {}
    assert simulate.signals(lemony, f.end, f.end + DAY) == {}


# --- the store ----------------------------------------------------------------------------------

WINDOWS = ((0, 10), (1.5, 4.25), (4, 5), (0.3, 0.7), (9.99, 12))


@pytest.fixture(scope="module")
def stored(lemony, tmp_path_factory):
    conn = store.connect(str(tmp_path_factory.mktemp("sim") / "fleet.db"))
    counts = simulate.write_store(lemony, conn)
    yield conn, counts
    conn.close()


def test_write_store_writes_every_run(lemony, stored):
    conn, counts = stored
    f = lemony.fleet
    slots = sum(lemony.slots(i) for i in range(f.nodes))
    job_runs = sum(1 + (r[3] is not None) for r in lemony.jobs)
    assert counts["runs"] == slots + job_runs
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == slots + job_runs
    assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == len(lemony.runs)
    not_ok = conn.execute("SELECT count(*) FROM runs WHERE verdict != 'ok'").fetchone()[0]
    assert not_ok == len(lemony.runs)
    orphans = conn.execute(
        "SELECT count(*) FROM events WHERE run_id NOT IN (SELECT id FROM runs)"
    ).fetchone()[0]
    assert orphans == 0


def test_write_store_twice_changes_nothing(lemony, tmp_path):
    conn = store.connect(str(tmp_path / "twice.db"))
    simulate.write_store(lemony, conn)
    tables = ("runs", "results", "events", "jobs", "actions")
    first = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}  # noqa: S608
    simulate.write_store(lemony, conn)
    again = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}  # noqa: S608
    assert first == again


def test_write_store_simulates_a_fleet_itself(tmp_path):
    conn = store.connect(str(tmp_path / "f.db"))
    counts = simulate.write_store(small(nodes=4, days=2), conn)
    assert counts["runs"] == conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 4 * 2 * 24


@pytest.mark.parametrize("window", WINDOWS)
def test_store_signals_equal_in_memory_signals(lemony, stored, window):
    conn, _ = stored
    start = lemony.fleet.start + window[0] * DAY
    end = lemony.fleet.start + window[1] * DAY
    in_memory = simulate.signals(lemony, start, end)
    assert in_memory, "the window must hold records"
    assert signals.signals(conn, start, end) == in_memory


# --- versions and run durations ------------------------------------------------------------------


def test_drifted_nodes_are_chosen_by_the_seed_and_leave_the_history_alone():
    f = small(drifted=3)
    chosen = simulate.drifted_nodes(f)
    assert chosen == simulate.drifted_nodes(small(drifted=3))
    assert sorted(chosen.values()) == sorted(simulate.DRIFTS)
    assert set(chosen) <= set(f.names())
    assert simulate.drifted_nodes(small(drifted=0)) == {}
    one, other = simulate.events(small(drifted=0)), simulate.events(small(drifted=5))
    assert (one.jobs, one.runs, one.events, one.actions) == (
        other.jobs,
        other.runs,
        other.events,
        other.actions,
    )


def test_stored_runs_carry_each_nodes_versions_every_six_hours(lemony, stored):
    conn, _ = stored
    drift = simulate.drifted_nodes(lemony.fleet)
    rows = conn.execute(
        "SELECT node, phase, started, sources FROM runs WHERE instr(sources, 'versions')"
    ).fetchall()
    assert sorted({r[0] for r in rows}) == lemony.names
    assert {r[1] for r in rows} == {"healthcheck"}
    for node, _, _, text in rows:
        sources = json.loads(text)
        want = simulate.node_versions(drift.get(node))
        assert {s: sources[s]["versions"] for s in ("gpu", "ib")} == want
        assert all(sources[s]["status"] == "ok" for s in ("gpu", "ib", "kmsg"))
    for node in lemony.names:
        times = sorted(r[2] for r in rows if r[0] == node)
        periods = [t // simulate.VERSIONS_EVERY for t in times]
        assert len(set(periods)) == len(periods)  # once per 6-hour period...
        assert len(periods) >= lemony.fleet.days * 4 - 1  # ...and in every one of them
    drivers = {n: json.loads(text)["gpu"]["versions"]["driver"] for n, _, _, text in rows}
    odd = {n for n, driver in drivers.items() if driver != simulate.DRIVER}
    assert odd == {n for n, kind in drift.items() if kind == "driver"}


def test_run_durations_spread_with_a_slow_tail(stored):
    conn, _ = stored
    for phase, base in simulate.DURATIONS.items():
        values = sorted(
            r[0] for r in conn.execute("SELECT duration FROM runs WHERE phase = ?", (phase,))
        )
        assert base <= values[0] and values[-1] <= 4.5 * base
        assert values[len(values) // 2] < 1.6 * base < values[int(0.995 * len(values))]
