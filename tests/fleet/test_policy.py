"""The lemon policy on hand-made signals: scoring, circuit breaker, probation (no Slurm, no I/O)."""

from __future__ import annotations

import math
import random
import time

import pytest

from slurmhealth.fleet import policy

DAY = 86400.0


def poisson(rng: random.Random, mu: float) -> int:
    """Knuth's method: enough for the small means of a healthy node."""
    limit, k, p = math.exp(-mu), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def healthy(rng: random.Random, days: int = 28) -> dict:
    """A healthy node's 28 days: ~4 jobs a day, faults at ~4.4 per 1,000 node-days; a fault
    fails the job it strikes (80%), logs a hardware Xid (50%), is drained (70%) and fails ~24
    consecutive health checks. Background warnings and users' multi-node failures."""
    jobs = poisson(rng, 4 * days)
    multi = poisson(rng, jobs * 0.5)
    faults = poisson(rng, 0.0044 * days)

    def some(share: float) -> int:
        return sum(rng.random() < share for _ in range(faults))

    return {
        "jobs": jobs,
        "hw_job_failures": min(jobs, some(0.8)),
        "multi_node_jobs": multi,
        "multi_node_failures": poisson(rng, multi * 0.11),
        "hw_xids": some(0.5),
        "warn_xids": poisson(rng, 0.05 * days),
        "check_fails": sum(1 + poisson(rng, 23) for _ in range(faults)),
        "check_warns": poisson(rng, 0.1 * days),
        "drains": some(0.7),
        "node_days": days,
    }


def fleet(size: int = 300, seed: int = 1) -> dict:
    rng = random.Random(seed)
    return {f"gpu{i:04d}": healthy(rng) for i in range(size)}


def by_node(scored: list) -> dict:
    return {r["node"]: r for r in scored}


def test_clear_lemon_is_flagged_with_its_evidence():
    signals = fleet()
    signals["gpu0007"].update(jobs=41, hw_job_failures=9, hw_xids=3, drains=3)
    scored = policy.score(signals)
    top = scored[0]
    assert top["node"] == "gpu0007" and top["lemon"]
    assert top["reason"].startswith("9 of 41 jobs failed on node vs fleet 0.")
    assert top["evidence"]["hw_job_failures"]["count"] == 9
    assert 0 < top["evidence"]["hw_job_failures"]["expected"] < 1
    assert top["hw_events"] == 15
    assert top["p_value"] < 0.01 / len(signals)
    assert [r["node"] for r in scored if r["lemon"]] == ["gpu0007"]


def test_a_healthy_fleet_flags_nobody():
    for seed in range(5):
        scored = policy.score(fleet(500, seed))
        assert not [r["node"] for r in scored if r["lemon"]], seed


def test_the_reason_is_one_short_line_for_every_node():
    signals = fleet()
    signals["gpu0003"].update(warn_xids=400, check_warns=900, hw_job_failures=4, drains=4)
    for r in policy.score(signals):
        assert len(r["reason"]) <= policy.REASON_MAX
        assert "\n" not in r["reason"] and '"' not in r["reason"] and "'" not in r["reason"]
    assert by_node(policy.score(signals))["gpu0003"]["reason"].startswith("900 check warnings")


def test_warnings_alone_never_make_a_lemon():
    """Below the minimum of hardware evidence nothing is a lemon, however strong the rest."""
    signals = fleet()
    for s in signals.values():
        s.update(hw_job_failures=0, hw_xids=0, drains=0)
    signals["gpu0001"].update(warn_xids=300, check_warns=300, hw_job_failures=1, drains=1)
    assert not by_node(policy.score(signals))["gpu0001"]["lemon"]
    signals["gpu0001"]["hw_xids"] = 1  # the third hardware event
    assert by_node(policy.score(signals))["gpu0001"]["lemon"]


def test_too_little_evidence_flags_nobody_in_a_small_window():
    """One day of history: a node with 2 failed jobs out of 2 is not enough."""
    signals = {f"gpu{i:02d}": {"jobs": 4, "node_days": 1} for i in range(64)}
    signals["gpu05"].update(jobs=2, hw_job_failures=2)
    assert not any(r["lemon"] for r in policy.score(signals))


def test_a_fleet_wide_incident_is_not_a_lemon():
    """A day-long incident: every node failed its checks, its prologs and was drained twice;
    nobody stands out. The same counts on one node of a quiet fleet do (the test can fail)."""
    signals = fleet()
    for s in signals.values():
        s["check_fails"] += 100
        s["hw_job_failures"] = min(s["jobs"], s["hw_job_failures"] + 5)
        s["drains"] += 2
    assert not any(r["lemon"] for r in policy.score(signals))
    quiet = fleet()
    quiet["gpu0009"] = dict(signals["gpu0009"])
    assert by_node(policy.score(quiet))["gpu0009"]["lemon"]


def test_lemons_do_not_raise_the_bar_they_are_measured_against():
    """Ten lemons in 500 nodes: the pool leaves them out, so a healthy node's expectation is
    the healthy rate and every lemon is found; pooling them in would hide some."""
    signals = fleet(500, seed=3)
    bad = {f"gpu{i:04d}" for i in range(0, 500, 50)}
    for node in bad:
        signals[node].update(hw_job_failures=3, hw_xids=5, drains=3)
    healthy_rate = sum(s["hw_xids"] for n, s in signals.items() if n not in bad) / 490
    scored = by_node(policy.score(signals))
    assert {n for n, r in scored.items() if r["lemon"]} == bad
    shown = scored["gpu0001"]["evidence"]["hw_xids"]["expected"]
    assert shown == pytest.approx(healthy_rate, rel=0.05)
    naive = by_node(policy.score(signals, {"max_outlier_share": 0}))
    assert naive["gpu0001"]["evidence"]["hw_xids"]["expected"] > 1.5 * healthy_rate
    assert {n for n, r in naive.items() if r["lemon"]} < bad


def test_one_long_fault_is_not_a_lemon():
    """A single fault that kept a node failing its checks for a day: many failed checks, still
    one fault (failed checks are ranked, not counted as independent events)."""
    signals = fleet(300, seed=4)
    signals["gpu0002"].update(check_fails=288, hw_job_failures=1, hw_xids=1, drains=1)
    result = by_node(policy.score(signals))["gpu0002"]
    assert not result["lemon"]
    assert result["hw_events"] == 3


def test_small_cluster_with_one_faulty_node():
    """Four nodes (the CI cluster): a node failing job after job is a lemon, the others not."""
    signals = {f"n{i}": {"jobs": 30, "node_days": 2} for i in range(1, 5)}
    signals["n2"].update(hw_job_failures=8, check_fails=8, drains=2)
    scored = policy.score(signals)
    assert [r["node"] for r in scored if r["lemon"]] == ["n2"]
    assert scored[0]["reason"].startswith("8 of 30 jobs failed on node vs fleet")


def test_scores_every_node_sorted_and_empty_fleet():
    signals = fleet(50)
    scored = policy.score(signals)
    assert sorted(r["node"] for r in scored) == sorted(signals)
    assert [r["score"] for r in scored] == sorted((r["score"] for r in scored), reverse=True)
    assert policy.score({}) == []


def test_missing_signals_count_as_zero():
    scored = policy.score({"a": {"node_days": 3}, "b": {}})
    assert {r["node"] for r in scored} == {"a", "b"}
    assert not any(r["lemon"] for r in scored)


def test_params_stricter_alpha_flags_less_and_unknown_keys_fail():
    signals = fleet()
    signals["gpu0004"].update(hw_job_failures=3, hw_xids=1, warn_xids=12)
    loose = by_node(policy.score(signals, {"alpha": 0.5}))["gpu0004"]
    strict = by_node(policy.score(signals, {"alpha": 1e-12}))["gpu0004"]
    assert loose["lemon"] and not strict["lemon"]
    with pytest.raises(ValueError):
        policy.score(signals, {"alpah": 0.1})


def test_rate_floor_override_merges():
    signals = {f"n{i}": {"jobs": 10, "node_days": 1} for i in range(10)}
    signals["n1"].update(hw_xids=3, drains=1)
    low = by_node(policy.score(signals, {"rate_floor": {"hw_xids": 1e-6}}))["n1"]
    high = by_node(policy.score(signals, {"rate_floor": {"hw_xids": 1.0}}))["n1"]
    assert low["score"] > high["score"]
    assert high["evidence"]["hw_xids"]["expected"] == 1.0


def test_scoring_2000_nodes_is_fast():
    signals = fleet(2000, seed=9)
    started = time.perf_counter()
    policy.score(signals)
    assert time.perf_counter() - started < 2.0


# --- the tail math ------------------------------------------------------------------------------


def exact_ln_sf(k: int, mu: float) -> float:
    """The upper tail summed term by term (no cancellation)."""
    terms = (math.exp(-mu + i * math.log(mu) - math.lgamma(i + 1)) for i in range(k, k + 400))
    return math.log(sum(terms))


@pytest.mark.parametrize(
    "k,mu", [(1, 0.1), (3, 0.12), (10, 1.4), (5, 5.0), (2, 10.0), (12, 12.0), (20, 3.0)]
)
def test_poisson_tail_matches_the_sum(k, mu):
    assert policy.ln_poisson_sf(k, mu) == pytest.approx(exact_ln_sf(k, mu), rel=1e-9, abs=1e-12)


def test_poisson_tail_far_out_and_edges():
    # P(X >= 300 | 0.001) is the first term, exp(-3487.23...): far below double precision.
    first = 300 * math.log(1e-3) - 1e-3 - math.lgamma(301)
    assert policy.ln_poisson_sf(300, 1e-3) == pytest.approx(first, rel=1e-6)
    assert policy.ln_poisson_sf(0, 3.0) == 0.0
    assert policy.ln_poisson_sf(1, 0.0) == -math.inf
    values = [policy.ln_poisson_sf(k / 2, 2.0) for k in range(1, 30)]
    assert values == sorted(values, reverse=True)


def test_fisher_tail():
    assert math.exp(policy.ln_chi2_sf_even(-2 * math.log(0.05), 2)) == pytest.approx(0.05)
    # Two p-values of 0.1: P(chi2_4 >= 9.21) = 0.0561
    assert math.exp(policy.ln_chi2_sf_even(-4 * math.log(0.1), 4)) == pytest.approx(0.0561, 1e-3)
