"""The fleet simulator: determinism, the model's promises, signals in memory vs in a store."""

from __future__ import annotations

import json

import pytest

from sim import simulate
from slurmhealth.core import store
from slurmhealth.fleet import policy, signals

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
    window = simulate.signals(lemony, f.start + 2 * DAY, f.start + 6 * DAY)
    counts = {n: {k: v for k, v in s.items() if k in policy.SIGNALS} for n, s in window.items()}
    assert total == {n: c for n, c in counts.items() if n in total}
    assert all(
        not window[n]["faults"] and not window[n]["warnings"] for n in set(window) - set(total)
    )


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
    job_runs = sum(1 + (r[3] is not None and r[5] != "running") for r in lemony.jobs)
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


def test_write_store_day_by_day_writes_what_it_writes_at_once(lemony, stored, tmp_path):
    """bench/write_month.py writes a month as a fleet records it, a day at a time (then rolls
    up): the same rows, versions recorded by the same runs, whatever the windows' edges."""
    whole, _ = stored
    conn = store.connect(str(tmp_path / "daily.db"))
    f = lemony.fleet
    edges = [f.start - DAY, *range(f.start + 4321, f.end, DAY), f.end + DAY]
    for lo, hi in zip(edges, edges[1:]):
        simulate.write_store(lemony, conn, between=(lo, hi))
    for table in ("runs", "results", "events", "jobs", "actions", "node_events"):
        query = f"SELECT * FROM {table} ORDER BY 1, 2, 3"  # noqa: S608
        assert conn.execute(query).fetchall() == whole.execute(query).fetchall(), table


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


def test_a_fleet_of_two_generations_records_each_ones_gpu_model(tmp_path):
    """The runs of a fleet with generations name each generation's GPU model, which
    fleet.signals reads back as each node's gpu_class, the same as the in-memory signals (the
    lemon policy pools generations apart by it); the lemon sweep over the store uses it."""
    from slurmhealth.fleet import lemons

    f = small(nodes=12, days=3, incident_day=None)
    f.generations = ((0.5, 1.0), (0.5, 2.5))
    h = simulate.events(f)
    conn = store.connect(str(tmp_path / "gen.db"))
    simulate.write_store(h, conn)
    got = signals.signals(conn, f.start, f.end)
    assert got == simulate.signals(h, f.start, f.end)
    assert [got[n]["gpu_class"] for n in sorted(got)] == [simulate.GENERATION_MODELS[0]] * 6 + [
        simulate.GENERATION_MODELS[1]
    ] * 6
    pools = {r["evidence"]["faults"]["pool"] for r in lemons.sweep(conn, f.end, 3 * DAY)}
    assert pools <= {"fleet", *simulate.GENERATION_MODELS[:2]}


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


# --- other fleet models (each a Fleet field whose default is the model above) -------------------


def records(h: simulate.History) -> tuple:
    return h.jobs, h.runs, h.events, h.actions, h.faults


def test_defaults_leave_the_history_as_it_was():
    plain = simulate.events(small(base_rate=0.05))
    spelled = small(base_rate=0.05, node_event_share=1.0, drains=True, lemon_burst=1)
    same = simulate.events(spelled)
    assert records(plain) == records(same) and plain.node_events == same.node_events
    assert plain.generation == [0] * 48


def test_node_events_record_crashes_by_share_and_change_nothing_else():
    none, half, every = (
        simulate.events(small(base_rate=0.05, node_event_share=share)) for share in (0, 0.5, 1)
    )
    assert records(none) == records(half) == records(every)
    assert none.node_events == [] and every.node_events
    assert set(half.node_events) < set(every.node_events) and half.node_events
    node_fail = {r[0] for r in every.jobs if r[6] == "NODE_FAIL"}
    for node, start, end, state, reason in every.node_events:
        assert (state, reason) == ("DOWN", "Not responding") and node in node_fail
        assert start in every.faults[node]  # the crash is the fault
        assert end is None or start < end <= every.fleet.end


def test_node_events_go_into_the_store_once(tmp_path):
    h = simulate.events(small(base_rate=0.05))
    conn = store.connect(str(tmp_path / "events.db"))
    assert simulate.write_store(h, conn)["node_events"] == len(h.node_events) > 0
    simulate.write_store(h, conn)
    rows = conn.execute("SELECT node, start, end, state, reason FROM node_events").fetchall()
    assert sorted(rows) == sorted(h.node_events)


def test_monitor_mode_records_no_drain_and_changes_nothing_else():
    drained, watched = (simulate.events(small(base_rate=0.05, drains=d)) for d in (True, False))
    assert {a[3] for a in drained.actions} == {"drain", "resume", "breaker"}
    assert watched.actions == [] and watched.breaker["drained"] == 0
    assert records(drained)[:3] == records(watched)[:3] and drained.faults == watched.faults
    assert drained.node_events == watched.node_events


def lemon_faults(burst: int) -> tuple:
    """Over 12 seeds, two lemons at k=50: (fault counts, gaps between a lemon's faults)."""
    counts, gaps = [], []
    for seed in range(12):
        f = small(nodes=16, days=28, seed=seed, base_rate=0.004, incident_day=None)
        f.lemons, f.lemon_burst = {"gpu0003": 50, "gpu0010": 50}, burst
        h = simulate.events(f)
        for node in f.lemons:
            times = h.faults.get(node, [])
            counts.append(len(times))
            gaps += [b - a for a, b in zip(times, times[1:])]
    return counts, gaps


def test_lemon_faults_come_in_bursts_at_the_same_mean_rate():
    one, four = lemon_faults(1), lemon_faults(4)
    mean = [sum(counts) / len(counts) for counts, _ in (one, four)]
    assert 0.75 < mean[1] / mean[0] < 1.33  # ~5.6 faults in 28 days either way
    within_a_day = [sum(g < DAY for g in gaps) / len(gaps) for _, gaps in (one, four)]
    assert within_a_day[0] < 0.35 < 0.7 < within_a_day[1]
    assert all(g >= 2 * 3600 for g in four[1])  # the next fault of a burst: 2-12 h after repair


def test_generations_split_the_fleet_in_blocks_with_their_own_rates():
    per_block, lemon = [0, 0], [0, 0]
    for seed in range(8):
        f = small(nodes=40, days=20, seed=seed, base_rate=0.05, incident_day=None)
        f.generations = ((0.5, 1.0), (0.5, 2.5))
        f.lemons = {"gpu0001": 20, "gpu0040": 20}  # one lemon in each block
        h = simulate.events(f)
        assert h.generation == [0] * 20 + [1] * 20
        for node, times in h.faults.items():
            gen = h.generation[h.names.index(node)]
            (lemon if node in f.lemons else per_block)[gen] += len(times)
    assert 2.0 < per_block[1] / per_block[0] < 3.1  # ~380 and ~950 faults
    assert 1.8 < lemon[1] / lemon[0] < 3.1  # k times its own block's rate
    with pytest.raises(ValueError):
        simulate.events(small(generations=((0.5, 1.0), (0.4, 2.0))))


def test_a_transient_fault_fails_exactly_one_health_check():
    f = small(base_rate=0.1, repair_hours=0, repair_min_s=60, incident_day=None)
    f.warn_xid_rate = f.check_warn_rate = 1e-9  # no warnings to tell apart
    h = simulate.events(f)
    failed: dict = {}
    for _id, node, _job, phase, t, verdict, *_ in h.runs:
        if phase == "healthcheck" and verdict == "fail":
            failed.setdefault(node, []).append(t)
    for node, times in h.faults.items():
        for at, following in zip(times, [*times[1:], f.end]):
            assert sum(at <= t < following for t in failed[node]) == 1
    assert sum(map(len, failed.values())) == sum(map(len, h.faults.values())) > 30
    by_check = [a for a in h.actions if a[5] == "slurmhealth healthcheck"]  # idle-node faults
    for drain, resume in zip(by_check[::2], by_check[1::2]):
        assert (drain[3], resume[3]) == ("drain", "resume")
        assert resume[2] == drain[2] + f.healthcheck_interval  # resumed at the next check
    steady = simulate.events(small(base_rate=0.1, incident_day=None))
    assert sum(r[5] == "fail" for r in steady.runs) > 2 * len(h.faults)
    with pytest.raises(ValueError):
        simulate.events(small(repair_hours=-1))
