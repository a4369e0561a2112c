"""The lemon policy on hand-made evidence: faults, warnings, the fleet's pool (no Slurm, no I/O).

The planted fleets of bench/validate_lemons.py test it at scale; these pin each rule."""

from __future__ import annotations

import math
import random

import pytest

from slurmhealth.fleet import policy

DAY = 86400.0
HOUR = 3600.0


def poisson(rng: random.Random, mu: float) -> int:
    """Knuth's method: enough for the small means of a healthy node."""
    limit, k, p = math.exp(-mu), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def fault(at: float, checks: int = 24, xid: bool = True, check: str = "gpu.count") -> list:
    """One fault's items: an Xid, a drain, then failed health checks every 5 minutes until
    it is repaired; the next passing run comes after the last of them. Each item names its
    cause (its scope), as fleet/signals.py reads them from a store."""
    back = at + (checks + 1) * 300.0
    cause = ("check:" + check,)
    out = [(at, "xid", 1.0, back, ("xid:79",))] if xid else []
    out.append((at + 1, "drain", 1.0, back, ("reason:" + check,)))
    out += [(at + 300.0 * (n + 1), "check", 1.0, back, cause) for n in range(checks)]
    return out


def warning(at: float) -> tuple:
    return (at, "warn", 1.0, at + 300.0)


def node(
    rng: random.Random,
    faults: int | None = None,
    days: int = 28,
    warns: float = 4.2,
    rate: float = 0.0045,
):
    """A node's 28 days: faults at `rate` per node-day (~4.5 per 1,000; or `faults` of them),
    background warnings, ~4 jobs a day."""
    count = poisson(rng, rate * days) if faults is None else faults
    items = sorted(i for _ in range(count) for i in fault(rng.random() * (days - 1) * DAY))
    jobs = poisson(rng, 4 * days)
    return {
        "jobs": jobs,
        "multi_node_jobs": jobs // 2,
        "multi_node_failures": poisson(rng, jobs * 0.05),
        "node_days": days,
        "faults": items,
        "warnings": sorted(warning(rng.random() * days * DAY) for _ in range(poisson(rng, warns))),
    }


def fleet(size: int = 300, seed: int = 1, warns: float = 4.2, rate: float = 0.0045) -> dict:
    rng = random.Random(seed)
    return {f"gpu{i:04d}": node(rng, warns=warns, rate=rate) for i in range(size)}


def spread(count: int, days: int = 28, phase: float = 0.0) -> list:
    """`count` separate faults, evenly over the days, `phase` hours later."""
    at = [(n + 0.5) * days * DAY / count + phase * HOUR for n in range(count)]
    return sorted(i for t in at for i in fault(t))


def by_node(scored: list) -> dict:
    return {r["node"]: r for r in scored}


def test_clear_lemon_is_flagged_with_its_evidence():
    signals = fleet()
    signals["gpu0007"]["faults"] = spread(6)
    scored = policy.score(signals)
    top = scored[0]
    assert top["node"] == "gpu0007" and top["lemon"]
    assert top["faults"] == 6
    assert top["reason"].startswith("6 faults in 28 days vs 0.")
    assert "(144 failed checks, 6 drains, 6 hardware Xids)" not in top["reason"]
    assert "6 drains" in top["reason"] and "6 hardware Xids" in top["reason"]
    assert top["evidence"]["faults"]["count"] == 6
    assert 0 < top["evidence"]["faults"]["expected"] < 1
    assert top["p_value"] < 0.01 / len(signals)
    assert [r["node"] for r in scored if r["lemon"]] == ["gpu0007"]


def test_a_healthy_fleet_flags_nobody():
    for seed in range(5):
        scored = policy.score(fleet(500, seed))
        assert not [r["node"] for r in scored if r["lemon"]], seed


def test_the_reason_is_one_short_line_for_every_node():
    signals = fleet()
    signals["gpu0003"]["warnings"] = sorted(warning(n * 2000.0) for n in range(900))
    signals["gpu0003"]["faults"] = spread(2)
    for r in policy.score(signals):
        assert len(r["reason"]) <= policy.REASON_MAX
        assert "\n" not in r["reason"] and '"' not in r["reason"] and "'" not in r["reason"]
    reason = by_node(policy.score(signals))["gpu0003"]["reason"]
    assert reason.startswith("2 faults in 28 days vs")
    assert "; 900 warning episodes in 28 days vs" in reason


def test_warnings_alone_never_make_a_lemon():
    """Below the minimum of faults nothing is a lemon, however strong the rest; with it, the
    warnings add to the faults (Fisher's path)."""
    signals = fleet()  # faults at 4.5 per 1,000 node-days: two alone are not enough
    signals["gpu0001"]["warnings"] = sorted(warning(n * 8000.0) for n in range(300))
    signals["gpu0001"]["faults"] = spread(1)
    assert not by_node(policy.score(signals))["gpu0001"]["lemon"]
    signals["gpu0001"]["faults"] = spread(2)
    assert by_node(policy.score(signals))["gpu0001"]["lemon"]
    signals["gpu0001"]["warnings"] = []
    assert not by_node(policy.score(signals))["gpu0001"]["lemon"]


def test_warning_noise_does_not_weaken_the_faults_test():
    """Lemons that warn no more than others: the faults decide as in a fleet without warnings
    at all (the old model halved its power with an empty group, issue 11)."""
    for seed in range(3):
        quiet, noisy = fleet(500, seed, warns=0), fleet(500, seed, warns=4.2)
        for signals in (quiet, noisy):
            signals["gpu0011"]["faults"] = spread(4)
        flags = [by_node(policy.score(s))["gpu0011"]["lemon"] for s in (quiet, noisy)]
        assert flags == [True, True], seed


def test_a_fleet_wide_incident_is_not_a_lemon():
    """An hour-long incident: every node failed its checks and was drained; nobody stands out,
    and the incident costs a real lemon nothing. The same fault on one node alone counts."""
    signals = fleet()
    at = 14 * DAY + 10 * HOUR
    for i, s in enumerate(signals.values()):
        s["faults"] = sorted(s["faults"] + fault(at + i % 300, 12, False, "ib.port_state"))
    signals["gpu0009"]["faults"] = sorted(spread(4) + fault(at + 9, 12, False, "ib.port_state"))
    scored = by_node(policy.score(signals))
    assert [n for n, r in scored.items() if r["lemon"]] == ["gpu0009"]
    assert scored["gpu0009"]["faults"] == 4
    assert scored["gpu0009"]["evidence"]["faults"]["shared"] == 1
    assert scored["gpu0001"]["evidence"]["faults"]["expected"] < 0.5


def test_lemons_do_not_raise_the_bar_they_are_measured_against():
    """Ten lemons in 500 nodes: the pool leaves them out, so a healthy node's expectation is
    the healthy rate and every lemon is found; pooling them in would hide some."""
    signals = fleet(500, seed=3)
    bad = {f"gpu{i:04d}" for i in range(0, 500, 50)}
    for n, name in enumerate(sorted(bad)):
        signals[name]["faults"] = spread(5, phase=n * 3)  # lemons do not fail in step
    healthy = sum(policy.faultlib.episodes(s["faults"], 6 * HOUR) != [] for s in signals.values())
    assert healthy < 100
    scored = by_node(policy.score(signals))
    assert {n for n, r in scored.items() if r["lemon"]} == bad
    pooled = scored["gpu0001"]["evidence"]["faults"]["expected"]
    naive = by_node(policy.score(signals, {"max_outlier_share": 0}))
    assert naive["gpu0001"]["evidence"]["faults"]["expected"] > 1.3 * pooled


def test_one_long_fault_is_one_fault():
    """A single fault that kept a node failing its checks for a day is one fault."""
    signals = fleet(300, seed=4)
    signals["gpu0002"]["faults"] = fault(3 * DAY, checks=288)
    result = by_node(policy.score(signals))["gpu0002"]
    assert not result["lemon"]
    assert result["faults"] == 1


def test_fail_pass_fail_counts_twice():
    signals = fleet(300, seed=4)
    signals["gpu0002"]["faults"] = fault(3 * DAY, checks=2) + fault(3 * DAY + 2 * HOUR, checks=2)
    assert by_node(policy.score(signals))["gpu0002"]["faults"] == 2


def test_small_cluster_with_one_faulty_node():
    """Four nodes (the CI cluster), two days: a node that failed three separate times is a
    lemon, one that failed once is not."""
    signals = {f"n{i}": {"jobs": 30, "node_days": 2, "faults": []} for i in range(1, 5)}
    signals["n2"]["faults"] = spread(3, days=2)
    scored = policy.score(signals)
    assert [r["node"] for r in scored if r["lemon"]] == ["n2"]
    assert scored[0]["reason"].startswith("3 faults in 2 days vs")
    signals["n3"]["faults"] = spread(1, days=2, phase=5)  # the fleet's rate is no longer 0
    assert not any(r["lemon"] for r in policy.score(signals))


def test_a_shared_node_fail_counts_for_less():
    signals = fleet(100, seed=2)
    signals["gpu0005"]["faults"] = [(DAY * n, "node_fail", 0.25, None) for n in range(1, 9)]
    result = by_node(policy.score(signals))["gpu0005"]
    assert result["faults"] == 2.0
    assert not result["lemon"]


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


def test_three_faults_in_28_days_make_a_lemon_whatever_the_fleet_size():
    """The budget is per node-month (1 per 1,000), not per sweep of the fleet: at 4.5 faults
    per 1,000 node-days (one node in eight has one fault in 28 days: 0.125 expected) three
    separate faults (p = 3.2e-4 < 0.8 x 9.2e-4) flag a node on 40 nodes and on 4,000 alike
    (Bonferroni over 4,000 nodes asked for p < 2.5e-6: five faults); two (7.2e-3) never do.
    Over 7 days the budget is a quarter, and so is the expectation: three still do."""
    for size, days in ((40, 28), (4000, 28), (640, 7)):
        step = 8 * 28 // days  # one node in `step` has a fault: 0.0045 per node-day
        faulty = range(step, size, step)
        at = {i: (n + 0.5) * days * DAY / len(faulty) for n, i in enumerate(faulty)}
        signals = {
            f"gpu{i:04d}": {"node_days": days, "faults": fault(at[i]) if i in at else []}
            for i in range(size)
        }
        signals["gpu0003"]["faults"] = spread(3, days=days)
        signals["gpu0005"]["faults"] = spread(2, days=days)
        scored = by_node(policy.score(signals))
        assert scored["gpu0003"]["lemon"], (size, days)
        assert not scored["gpu0005"]["lemon"], (size, days)
        assert [n for n, r in scored.items() if r["lemon"]] == ["gpu0003"]


def test_each_node_says_how_many_faults_would_make_it_a_lemon():
    """`needed` (spread over the window) and `needed_day` (within 24 h) are the verdict's own
    boundary: a node given `needed` separate faults is a lemon, one given one fewer is not; at
    4.5 per 1,000 node-days that is three, at 8 per 1,000 four, and three within a day in
    both. A node seen for fewer days expects less, so needs no more."""
    for rate, spread_bar in ((0.0045, 3), (0.008, 4)):
        signals = fleet(seed=11, warns=0.0, rate=rate)
        for s in signals.values():
            s["multi_node_failures"] = 0  # the faults test alone decides
        bar = by_node(policy.score(signals))["gpu0002"]["evidence"]["faults"]
        assert (bar["needed"], bar["needed_day"]) == (spread_bar, 3), rate
        signals["gpu0002"]["faults"] = spread(bar["needed"])
        signals["gpu0004"]["faults"] = spread(bar["needed"] - 1)
        burst = [9 * DAY + h * 4 * HOUR for h in range(bar["needed_day"])]
        signals["gpu0006"]["faults"] = sorted(i for t in burst for i in fault(t, checks=6))
        signals["gpu0008"] = dict(signals["gpu0008"], node_days=7, faults=[])
        scored = by_node(policy.score(signals))
        assert scored["gpu0002"]["lemon"] and not scored["gpu0004"]["lemon"], rate
        assert scored["gpu0006"]["lemon"], rate
        young = scored["gpu0008"]["evidence"]["faults"]
        assert 2 <= young["needed"] <= spread_bar and young["expected"] < bar["expected"]


def test_fewest_counts_up_to_the_cut_and_stops():
    assert policy.fewest(lambda n: -float(n), -2.5, 2) == 3
    assert policy.fewest(lambda n: -float(n), -2.5, 5) == 5  # never below the minimum
    assert policy.fewest(lambda n: 0.0, -1.0, 2, most=9) == 10  # never reached: most + 1


def test_params_stricter_budget_flags_less_and_unknown_keys_fail():
    signals = fleet()
    signals["gpu0004"]["faults"] = spread(3)
    loose = by_node(policy.score(signals, {"fp_per_node_month": 0.5}))["gpu0004"]
    strict = by_node(policy.score(signals, {"fp_per_node_month": 1e-12}))["gpu0004"]
    assert loose["lemon"] and not strict["lemon"]
    with pytest.raises(ValueError):
        policy.score(signals, {"alpha": 0.1})  # the old name: a budget per sweep


def test_rate_prior_override_merges():
    signals = {f"n{i}": {"jobs": 10, "node_days": 1, "faults": []} for i in range(10)}
    signals["n1"]["faults"] = spread(3, days=1)
    low = by_node(policy.score(signals, {"rate_prior": {"faults": 1e-6}}))["n1"]
    high = by_node(policy.score(signals, {"rate_prior": {"faults": 1.0}}))["n1"]
    assert low["score"] > high["score"]
    # nine clean node-days shrunk toward 1 a day with the weight of 3 events: 3 / 12
    assert high["evidence"]["faults"]["expected"] == 0.25


def test_a_pool_below_the_prior_is_its_own_given_enough_data():
    """A fleet failing at 1.6 per 1,000 node-days, under the prior of 2 (as LANL's systems
    do): its own data decide a node's expectation (about 0.045 in 28 days, not the prior's
    0.056); a clean fleet's rate is the prior's shrunk by its clean node-days, never 0."""
    signals = fleet(1000, seed=5, rate=0.0016)
    expected = by_node(policy.score(signals))["gpu0001"]["evidence"]["faults"]["expected"]
    assert 0.03 < expected < 0.056
    clean = {f"n{i}": {"node_days": 28, "faults": []} for i in range(100)}
    got = by_node(policy.score(clean))["n1"]["evidence"]["faults"]["expected"]
    assert got == pytest.approx(28 * 3 / (99 * 28 + 3 / 0.002), rel=1e-2)


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


def test_three_faults_in_one_day_make_a_lemon_that_three_in_a_month_do_not():
    """The worst day (a scan statistic): on a fleet failing at 8 per 1,000 node-days (more than
    the literature's), three faults in a month (0.22 expected, p = 1.7e-3) are not enough,
    three within 24 h are far rarer (a bound of 7e-6)."""
    signals = fleet(seed=5, rate=0.008)
    burst = [10 * DAY, 10 * DAY + 6 * HOUR, 10 * DAY + 15 * HOUR]
    signals["gpu0007"] = dict(
        signals["gpu0007"], faults=sorted(i for t in burst for i in fault(t, checks=6))
    )
    spread = [3 * DAY, 12 * DAY, 21 * DAY]
    signals["gpu0008"] = dict(
        signals["gpu0008"], faults=sorted(i for t in spread for i in fault(t, checks=6))
    )
    results = {r["node"]: r for r in policy.score(signals)}
    hit, miss = results["gpu0007"], results["gpu0008"]
    assert hit["lemon"] and hit["evidence"]["faults"]["worst_day"] == 3
    assert (
        hit["reason"].startswith("3 faults in 28 days") and "3 of them within 24 h" in hit["reason"]
    )
    assert not miss["lemon"] and miss["evidence"]["faults"]["worst_day"] == 1
    # without the worst-day test's share, the same three faults are no lemon
    alone = {r["node"]: r for r in policy.score(signals, {"scan_share": 0.0})}
    assert not alone["gpu0007"]["lemon"]


def test_worst_day_bound_against_a_simulated_healthy_fleet():
    """The bound ln_scan gives is at least the chance a healthy node has such a day: 20,000
    Poisson months at 0.1 faults a day, the share with 3 or more within a day against it."""
    rng = random.Random(3)
    rate, days, hits = 0.1, 28.0, 0
    for _ in range(20_000):
        t, starts = 0.0, []
        while True:
            t += rng.expovariate(rate)
            if t > days:
                break
            starts.append(t * DAY)
        hits += policy.faultlib.most_within(starts, DAY) >= 3
    bound = math.exp(policy.ln_scan(3, rate * days, days, 1.0))
    assert hits / 20_000 <= bound
    assert policy.ln_scan(2, rate * days, days, 1.0) == 0.0  # two are never tested


def test_most_within_counts_a_sliding_window():
    assert policy.faultlib.most_within([], DAY) == 0
    assert policy.faultlib.most_within([0.0, 10.0, DAY, DAY + 11.0, 3 * DAY], DAY) == 3


# --- hardware classes ------------------------------------------------------------------------


def two_classes(factor: float = 10.0, seed: int = 4) -> dict:
    """600 nodes over 28 days: 300 of class A at ~4.5 faults per 1,000 node-days, 300 of class
    B failing `factor` times as often, each fault at a random time."""
    rng = random.Random(seed)
    signals = {}
    for i in range(600):
        cls = "A" if i < 300 else "B"
        count = poisson(rng, 0.0045 * 28 * (1 if cls == "A" else factor))
        at = [rng.random() * 27 * DAY for _ in range(count)]
        signals[f"gpu{i:04d}"] = {
            "node_days": 28,
            "faults": sorted(i for t in at for i in fault(t)),
            "gpu_class": cls,
        }
    return signals


def faults_at(rng: random.Random, count: int) -> list:
    return sorted(i for _ in range(count) for i in fault(rng.random() * 27 * DAY))


def test_a_generation_that_fails_more_is_pooled_apart_so_the_other_ones_lemon_shows():
    """Pooled with a generation failing 10x as often, a node with 5 faults among nodes that
    have 0 or 1 is held to ~0.7 expected (5 faults needed, not 3); against its own class
    (~0.12) it is a lemon by a wide margin. The other class's nodes are judged against their
    own rate: pooled with the first, its healthy nodes with 5 faults became lemons."""
    signals = two_classes()
    signals["gpu0005"]["faults"] = spread(5, phase=2.5)
    scored = by_node(policy.score(signals))
    flagged = {n for n, r in scored.items() if r["lemon"]}
    # 600 nodes over 28 days may flag about 0.55 healthy ones (the budget, 1 per 1,000
    # node-months); this fleet's are a class-A node with 3 faults and a class-B node with 4
    # within 24 h, each at chance against its own pool
    assert "gpu0005" in flagged and len(flagged) <= 3
    assert all(scored[n]["evidence"]["faults"]["count"] >= 3 for n in flagged)
    assert scored["gpu0005"]["evidence"]["faults"]["pool"] == "A"
    assert scored["gpu0005"]["evidence"]["faults"]["expected"] < 0.2
    assert scored["gpu0400"]["evidence"]["faults"]["pool"] == "B"
    assert scored["gpu0400"]["evidence"]["faults"]["expected"] > 1.0
    for s in signals.values():
        s["gpu_class"] = ""  # classes unknown: one pool, and the lemon is hidden
    blind = by_node(policy.score(signals))
    mine, theirs = scored["gpu0005"]["evidence"]["faults"], blind["gpu0005"]["evidence"]["faults"]
    assert theirs["pool"] == "fleet" and theirs["expected"] > 3 * mine["expected"]
    assert (mine["needed"], theirs["needed"]) == (3, 5)
    flagged_blind = {n for n, r in blind.items() if r["lemon"]}
    assert len(flagged_blind - {"gpu0005"}) > len(flagged - {"gpu0005"} - {"gpu0253"})


def test_classes_that_fail_alike_stay_one_pool_even_with_lemons_in_one():
    """Two classes at the same rate are one pool; ten lemons in one class do not set it apart
    (the classes are judged on the nodes that are no outliers), so all ten are found."""
    signals = two_classes(factor=1.0)
    bad = {f"gpu{i:04d}" for i in range(1, 300, 30)}
    for n, name in enumerate(sorted(bad)):
        signals[name]["faults"] = spread(5, phase=n * 3)  # lemons do not fail in step
    scored = by_node(policy.score(signals))
    flagged = {n for n, r in scored.items() if r["lemon"]}
    assert bad <= flagged and len(flagged - bad) <= 1  # one healthy node at chance (3 faults)
    assert all(scored[n]["evidence"]["faults"]["count"] >= 3 for n in flagged)
    assert {r["evidence"]["faults"]["pool"] for r in scored.values()} == {"fleet"}


def test_a_class_too_small_to_judge_is_pooled_with_the_fleet():
    """Three nodes of a class, each with 2 faults: the fleet's rate gives them well under
    class_min_expected, so they are not pooled apart (three nodes' own rate would hide
    anything) and are judged against the fleet."""
    signals = two_classes(factor=1.0)
    for i in range(3):
        signals[f"gpu{i + 10:04d}"].update(gpu_class="C", faults=faults_at(random.Random(i), 2))
    scored = by_node(policy.score(signals))
    assert scored["gpu0010"]["evidence"]["faults"]["pool"] == "fleet"


def test_many_bad_nodes_do_not_switch_the_detector_off():
    """Forty lemons in 500 nodes (8%), and nodes seen for a day with a fault: the outliers
    never feed the dispersion that would judge them, the faults are never divided by it, and
    every lemon is found (dividing by a re-estimated dispersion let them rejoin the pool, the
    estimate climbed, and a fleet with several bad nodes ended with none flagged)."""
    signals = fleet(500, seed=7)
    bad = {f"gpu{i:04d}" for i in range(0, 500, 12)}
    for n, name in enumerate(sorted(bad)):
        signals[name]["faults"] = spread(5, phase=n * 3)
    for name in ("gpu0001", "gpu0002", "gpu0003"):  # a day in service, one fault each
        signals[name].update(node_days=1, faults=fault(3 * HOUR))
    scored = by_node(policy.score(signals))
    flagged = {n for n, r in scored.items() if r["lemon"]}
    assert bad <= flagged and len(flagged - bad) <= 1  # the budget's chance flag at most
    seen_throughout = [r["evidence"]["faults"] for r in scored.values()]
    assert {f["needed"] for f in seen_throughout if f["days"] == 28} == {3}


def test_the_dispersion_is_weighted_by_expectation_and_gated():
    """One fault in a day against 0.0045 expected is a Pearson residual of ~220; weighted by
    the expectation it adds about 1 / sum(expected): a Poisson fleet stays at 1."""
    counts = [0] * 497 + [1, 1, 1]
    expected = [0.126] * 497 + [0.0045] * 3
    assert policy.dispersion(counts, expected, [True] * 500) == 1.0
    # a fleet whose every node has 0 or 2 faults at 0.5 expected is overdispersed
    counts = [0, 2] * 250  # sum (c - m)^2 = 250 x 0.25 + 250 x 2.25 over sum m = 250
    assert policy.dispersion(counts, [0.5] * 500, [True] * 500) == pytest.approx(2.5)


def test_explain_says_which_test_decided_since_when_and_what_was_left_out():
    signals = fleet()
    at = 14 * DAY + 10 * HOUR
    for i, s in enumerate(signals.values()):
        s["faults"] = sorted(s["faults"] + fault(at + i % 300, 12, False, "ib.port_state"))
    signals["gpu0009"]["faults"] = sorted(spread(4) + fault(at + 9, 12, False, "ib.port_state"))
    entry = by_node(policy.score(signals))["gpu0009"]
    faults = entry["evidence"]["faults"]
    assert faults["decided"] == "faults" and faults["since"] == pytest.approx(17.5 * DAY)
    lines = policy.explain(entry, 28 * DAY)
    assert lines[0].startswith("decided by the faults test (p = ")
    assert "a lemon from 3" in lines[0]
    assert lines[1] == (
        "a lemon since 1970-01-18T12:00:00Z (10.5 days); "
        "latest fault 1970-01-25T12:00:00Z (3.5 days ago)"
    )
    assert lines[2].startswith("left out as shared: the fault of 1970-01-15T10:00:10Z (")
    assert "ib.port_state on 300 nodes within the hour)" in lines[2]
