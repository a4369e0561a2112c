"""Faults, not records (fleet/faults.py): attribution of NODE_FAIL, episodes, shared faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.fleet import faults, policy

HOUR = 3600.0
PARAMS = policy.DEFAULT_PARAMS


def items(*specs):
    """(time, kind[, weight], next_ok) tuples, next_ok None for 'none known'."""
    out = []
    for spec in specs:
        if len(spec) == 3:
            t, kind, ok = spec
            out.append((t, kind, 1.0, ok))
        else:
            out.append(spec)
    return out


def test_fail_pass_fail_is_two_faults():
    eps = faults.episodes(items((0, "check", 300), (600, "check", 900)), gap=6 * HOUR)
    assert [e[0] for e in eps] == [0, 600]


def test_a_hundred_failing_runs_in_one_repair_are_one_fault():
    run = [(i * 300.0, "check", 100 * 300.0) for i in range(100)]
    eps = faults.episodes(
        items((0, "xid", 100 * 300.0), (30, "drain", 100 * 300.0), *run), 6 * HOUR
    )
    assert len(eps) == 1
    assert eps[0][2] == {"xid": 1, "drain": 1, "check": 100}


def test_without_any_passing_run_known_a_long_silence_separates():
    eps = faults.episodes(items((0, "node_fail", None), (HOUR, "down", None)), gap=6 * HOUR)
    assert len(eps) == 1
    eps = faults.episodes(items((0, "node_fail", None), (7 * HOUR, "node_fail", None)), 6 * HOUR)
    assert len(eps) == 2


def test_a_passing_run_at_the_same_second_does_not_separate():
    eps = faults.episodes(items((0, "xid", 60), (60, "check", 400)), gap=6 * HOUR)
    assert len(eps) == 1


def test_an_episode_weighs_its_strongest_item():
    eps = faults.episodes([(0, "node_fail", 0.25, None), (10, "check", 1.0, None)], 6 * HOUR)
    assert eps == [(0, 1.0, {"node_fail": 1, "check": 1}, set())]
    assert faults.episodes([(0, "node_fail", 0.0, None)], 6 * HOUR) == []


ROWS = [("a", 0.0, 100.0, "ended"), ("b", 0.0, 100.0, "running"), ("c", 0.0, 100.0, "ended")]


def test_node_fail_goes_to_the_node_with_a_node_event():
    assert faults.attribute(ROWS, {"c": [150.0]}, {"b": [90.0]}) == {"a": 0, "b": 0, "c": 1}


def test_node_fail_goes_to_the_node_slurmhealth_drained():
    assert faults.attribute(ROWS, {}, {"a": [90.0]}) == {"a": 1, "b": 0, "c": 0}


def test_node_fail_goes_to_the_node_without_an_epilog():
    assert faults.attribute(ROWS, {}, {}) == {"a": 0, "b": 1, "c": 0}


def test_events_outside_the_job_name_nobody():
    late = 100.0 + faults.ATTRIBUTION_SLACK_S + 1
    rows = [(n, 0.0, 100.0, "ended") for n in "abcd"]
    weights = faults.attribute(rows, {"a": [late], "b": [-5.0]}, {})
    assert weights == dict.fromkeys("abcd", 0.25)


def test_a_single_node_job_is_its_node():
    assert faults.attribute([("a", 0.0, None, None)], {}, {}) == {"a": 1.0}


@pytest.mark.parametrize(
    ("reason", "fault"),
    [
        ("Not responding", True),
        ("Kill task failed", True),
        ("slurmhealth: gpu.count: 7 GPUs visible", True),
        ("slurmhealth: lemon: 4 faults in 28 days", False),
        ("maintenance window", False),
        ("Node unexpectedly rebooted boot_time=1", True),
    ],
)
def test_which_node_event_reasons_are_faults(reason, fault):
    assert faults.is_fault_reason(reason, "slurmhealth: lemon:") is fault


@pytest.mark.parametrize(
    ("state", "reason", "names"),
    [
        ("DOWN*", "Not responding", True),
        ("DOWN", "lab: node failure", True),
        ("FAIL", "fail it", True),
        ("DRAIN", "maintenance", False),
        ("DRAIN", "slurmhealth: xid.hardware: Xid 79", True),
        ("DRAIN", "slurmhealth: lemon: 4 faults", False),
    ],
)
def test_which_node_events_can_name_the_node_of_a_node_fail(state, reason, names):
    assert faults.names_node(state, reason, "slurmhealth: lemon:") is names


def test_a_long_silence_separates_even_before_a_known_passing_run():
    # down for two days, back and failing again before any check passed: two faults
    two_days = 48 * HOUR
    eps = faults.episodes(
        items((0, "down", two_days + 7200), (two_days, "check", two_days + 7200)), 6 * HOUR
    )
    assert [e[0] for e in eps] == [0, two_days]


def test_an_episode_keeps_the_scopes_of_its_items():
    eps = faults.episodes(
        [(0, "xid", 1.0, 600, ("xid:79",)), (60, "check", 1.0, 600, ("check:gpu.count",))],
        6 * HOUR,
    )
    assert eps[0][3] == {"xid:79", "check:gpu.count"}


@pytest.mark.parametrize(
    ("kind", "value", "key"),
    [
        ("reason", "GPU 3 fell off the bus", "reason:gpu # fell off the bus"),
        ("reason", "  Not   responding ", "reason:not responding"),
        ("xid", 79, "xid:79"),
        ("check", "ib.port_state", "check:ib.port_state"),
        ("job", "1234", "job:1234"),
    ],
)
def test_scope_keys(kind, value, key):
    assert faults.scope_key(kind, value) == key


CAUSES = ("check:gpu.count", "xid:79", "xid:48", "reason:not responding", "check:ib.port_state")


def fleet_episodes(nodes: int, burst_nodes: int, at: float, scope: str | None = "check:x") -> dict:
    """Each node one fault of its own at a different day, of one of several causes;
    burst_nodes also fail at `at`, all of cause `scope` (None: each of a cause of its own)."""
    out = {}
    for i in range(nodes):
        eps = [(i * 86400.0 / 7, 1.0, {"check": 1}, {CAUSES[i % len(CAUSES)]})]
        if i < burst_nodes:
            eps.append((at + i * 30.0, 1.0, {"check": 1}, {scope or f"check:own{i}"}))
        out[f"n{i:03d}"] = sorted(eps)
    return out


def test_a_fault_on_many_nodes_at_once_with_one_cause_is_shared():
    at = 10.5 * 86400.0
    by_node = fleet_episodes(200, 40, at=at)
    counted = faults.count(by_node, 28 * 86400.0, PARAMS)
    # the node's own fault counts, and is its latest; the shared one is left out, and says why
    for i in range(40):
        total, kinds, discounted, last = counted[f"n{i:03d}"]
        assert (total, kinds, last) == (1.0, {"check": 1}, i * 86400.0 / 7)
        assert discounted == [{"start": at + i * 30.0, "scope": "check:x", "nodes": 40}]
    assert all(counted[f"n{i:03d}"][2] == [] for i in range(40, 200))


# Two causes on every node of one burst: which the discount names must not follow the order a
# set of strings gives, which changes with each process's hash seed.
_TIED_SCOPES = """
import json
from slurmhealth.fleet import faults, policy
eps = {f"n{i:02d}": [(1000.0 + 30 * i, 1.0, {"check": 1},
                      {"reason:port down", "check:ib.port_state", "xid:79", "job:7"})]
       for i in range(12)}
eps.update({f"q{i:03d}": [(86400.0 * (i % 20), 1.0, {"check": 1}, {f"check:own{i}"})]
            for i in range(150)})
print(json.dumps(faults.count(eps, 28 * 86400.0, policy.DEFAULT_PARAMS)["n03"][2]))
"""


def test_the_scope_a_shared_fault_is_discounted_for_is_the_same_in_every_process():
    said = set()
    for seed in ("0", "1", "2", "3", "4", "5"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "-c", _TIED_SCOPES], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        said.add(proc.stdout)
    assert len(said) == 1
    (discounted,) = json.loads(said.pop())
    assert discounted["scope"] == "check:ib.port_state" and discounted["nodes"] == 12


def test_unrelated_faults_close_in_time_stay_each_nodes_own():
    by_node = fleet_episodes(200, 40, at=10.5 * 86400.0, scope=None)
    counted = faults.count(by_node, 28 * 86400.0, PARAMS)
    assert all(counted[f"n{i:03d}"][0] == 2.0 for i in range(40))
    assert all(c[2] == [] for c in counted.values())


def test_faults_without_a_known_scope_are_never_shared():
    by_node = {f"n{i}": [(100.0 + i, 1.0, {"check": 1})] for i in range(50)}
    counted = faults.count(by_node, 28 * 86400.0, PARAMS)
    assert all(c[0] == 1.0 and c[2] == [] for c in counted.values())


def test_a_handful_of_bad_nodes_failing_together_with_one_cause_keep_their_faults():
    """Eight nodes of one bad batch fail with the same Xid when a job starts on all of them: a
    cause alone is an incident only on shared_cause_nodes (10); a rack they share makes one
    (on 200 nodes with a fault each in 28 days, 6 nodes within the hour suffice)."""
    by_node = fleet_episodes(200, 8, at=10.5 * 86400.0, scope="xid:79")
    counted = faults.count(by_node, 28 * 86400.0, PARAMS)
    assert all(counted[f"n{i:03d}"][0] == 2.0 for i in range(8))
    by_node = fleet_episodes(200, 8, at=10.5 * 86400.0, scope="rack:r07")
    counted = faults.count(by_node, 28 * 86400.0, PARAMS)
    assert all(counted[f"n{i:03d}"][0] == 1.0 for i in range(8))
    assert counted["n000"][2][0]["scope"] == "rack:r07"


def test_two_nodes_failing_in_the_same_hour_are_not_an_incident():
    by_node = fleet_episodes(200, 2, at=10 * 86400.0 + 0.5)
    counted = faults.count(by_node, 28 * 86400.0, PARAMS)
    assert counted["n000"][0] == 2.0 and counted["n000"][2] == []


def test_shares_of_one_job_do_not_make_a_burst():
    by_node = {f"n{i}": [(100.0, 0.125, {"node_fail": 1}, {"job:7"})] for i in range(8)}
    counted = faults.count(by_node, 28 * 86400.0, PARAMS)
    assert all(c == (0.125, {"node_fail": 1}, [], 100.0) for c in counted.values())


def test_burst_size_grows_with_the_fleets_rate():
    quiet = faults.burst_size(10, 28 * 86400.0, HOUR, 1e-4, 3)
    busy = faults.burst_size(6000, 28 * 86400.0, HOUR, 1e-4, 3)
    assert quiet == 3 < busy


def _shared_by_definition(by_node: dict, span: float, params: dict) -> set:
    """The definition, quadratic: each whole fault with a scope whose window holds starts of
    `need` distinct nodes with that scope (need from the rate of all whole faults, and at
    least shared_cause_nodes for a scope that is no place)."""
    window = params["shared_window_s"]
    starts = [(e[0], n, e[3]) for n, eps in by_node.items() for e in eps if e[1] >= 1.0]
    if not starts:
        return set()
    need = faults.burst_size(
        len(starts), span, window, params["shared_p"], params["shared_min_nodes"]
    )
    out = set()
    for t, node, scopes in starts:
        for scope in scopes:
            least = need if scope.startswith("job:") else max(need, params["shared_cause_nodes"])
            near = {m for u, m, sc in starts if t - window <= u <= t + window and scope in sc}
            if len(near) >= least:
                out.add((node, t))
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 30),
            st.integers(0, 20).map(lambda h: h * 900.0),
            st.sampled_from([1.0, 0.5]),
            st.sets(st.sampled_from(["check:a", "xid:79", "job:1"]), max_size=2),
        ),
        max_size=80,
    )
)
def test_the_sliding_window_finds_exactly_the_shared_faults_of_the_definition(items):
    by_node: dict = {}
    for node, start, weight, scopes in items:
        by_node.setdefault(f"n{node}", []).append((start, weight, {"check": 1}, scopes))
    params = dict(PARAMS, shared_p=0.5, shared_cause_nodes=4)
    assert set(faults.shared(by_node, 86400.0, params)) == _shared_by_definition(
        by_node, 86400.0, params
    )
