"""The lemon policy, pure: per-node evidence (docs/signals.md) in, decisions out.

No I/O, no Slurm, no SQLite: `slurmhealth lemons` and the nightly report feed it recorded
history; the simulator and the tests feed it planted fleets. The model and its assumptions:
docs/lemons.md.

score() in short: each node's hardware evidence is counted as distinct faults (fleet/faults.py:
NODE_FAIL charged to the node that failed, records of one fault merged, a fault many nodes
share left out), and the count is tested against the fleet's pooled fault rate times the node's
days (one-sided quasi-Poisson, the pool robust to the lemons themselves). That one test alone
decides at `primary_share` of the false-positive budget: nothing else can dilute it. The rest
of the budget goes to Fisher's combination of the faults with the groups of softer evidence
that this fleet has at all (warning episodes; failed multi-node jobs): more evidence, where it
exists, finds lemons sooner. A node is a lemon when its p-value is below the false-positive
budget for the window (fp_per_node_month x window days / 30.44) AND it has at least
`min_faults` faults.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from slurmhealth.core import timespec
from slurmhealth.core.result import counted
from slurmhealth.fleet import faults as faultlib

# The counts per node (docs/signals.md is the contract: fleet.signals computes them in SQL, the
# source tree's simulator, sim/simulate.py, in memory), shown as evidence; the faults and
# warnings items come beside.
SIGNALS = (
    "jobs",
    "hw_job_failures",
    "multi_node_jobs",
    "multi_node_failures",
    "hw_xids",
    "warn_xids",
    "check_fails",
    "check_warns",
    "drains",
    "node_days",
)

DAY = 86400.0
NODE_MONTH_DAYS = 365.25 / 12

# What each tested quantity is measured against.
EXPOSURE = {
    "faults": "node_days",
    "warnings": "node_days",
    "multi_node_failures": "multi_node_jobs",
    "hw_job_failures": "jobs",
    "hw_xids": "node_days",
    "warn_xids": "node_days",
    "check_fails": "node_days",
    "check_warns": "node_days",
    "drains": "node_days",
}
TESTED = ("faults", "warnings", "multi_node_failures")
SHOWN = ("hw_job_failures", "hw_xids", "drains", "check_fails", "warn_xids", "check_warns")

DEFAULT_PARAMS = {
    # False-positive budget: healthy nodes flagged per node-month (1 per 1,000). A node's
    # p-value over a window of D days is held to this x D / 30.44 (9.2e-4 over 28 days),
    # whatever the fleet's size: at the literature's 4.5 faults per 1,000 node-days (0.126 in
    # 28 days) three separate faults suffice (p = 3.2e-4), two do not (7.3e-3). (Until
    # 2026-12-02 it was 0.01 per sweep of the fleet, Bonferroni over its nodes: 2e-5 a node on
    # 512 nodes, so a lemon needed four faults, and was weaker than a plain per-node test at
    # the budget admins accept. docs/lemons.md: what a sliding window does to the rate.)
    "fp_per_node_month": 0.001,
    # The share of the budget that the fault count alone may use: on a fleet where only faults
    # tell lemons apart, the test is the plain per-node Poisson test at 0.8 of the budget
    # (0.9 where the fleet has no softer evidence at all).
    "primary_share": 0.8,
    # The share of the budget for the node's worst day: the most faults starting within
    # scan_window_s of each other, against the fleet's rate (a scan statistic). Three faults in
    # one day are rarer than four in a month, and a lemon that fails in bursts shows them.
    # Fisher's combination gets what the two leave (0.1).
    "scan_share": 0.1,
    "scan_window_s": 86400.0,
    # Never a lemon with fewer distinct faults than this (a NODE_FAIL share counts 1 / nodes).
    "min_faults": 2,
    # What a pool's rate is assumed to be before it has data, per unit of exposure, and how
    # many events that assumption weighs: a small or clean fleet's pool of 0 would make any
    # single event infinitely surprising. The rate used is the pool's own, or, where that is
    # lower, the pool's shrunk toward the prior: (events + prior_events) / (exposure +
    # prior_events / prior). 0.002 faults per node-day is under the literature's 2.34-6.50 per
    # 1,000 for GPU clusters. A prior, not a floor: a fleet with data that fails less (older
    # or CPU fleets do) is judged at its own rate (docs/lemons.md, item 8).
    "rate_prior": {"faults": 0.002, "warnings": 0.01, "multi_node_failures": 0.01},
    "prior_events": 3.0,
    # Items with no passing run known between them are one fault unless this far apart.
    "fault_gap_s": 6 * 3600.0,
    # A fault starting on many nodes within this of each other (either side) is shared (an
    # incident): as many as the fleet's own fault rate reaches by chance with probability below
    # shared_p, and at least shared_min_nodes.
    "shared_window_s": 3600.0,
    "shared_p": 1e-4,
    "shared_min_nodes": 3,
    # ...for faults that share only a cause (the same check, Xid or Slurm reason; not a place
    # nor one job: fleet/faults.py PLACES), at least this many nodes.
    "shared_cause_nodes": 10,
    # Robust pooling: nodes significant on a test by themselves (p below the budget) are
    # left out of that test's pool and dispersion, at most this share of the fleet (at least
    # one node of three or more), strongest first, until the set settles.
    "max_outlier_share": 0.10,
    # Hardware classes (the GPU model each node's runs record): a class is pooled on its own
    # when its rate differs from the rest of the fleet's beyond chance (two-sided Poisson test
    # of its total at class_p / classes) and the fleet's rate gives it at least
    # class_min_expected events: a generation that fails 2.5x as often must neither make its
    # healthy nodes look like lemons nor hide the other generation's lemons. Otherwise (one
    # class, classes alike, or too little data) the whole fleet is one pool.
    "class_p": 1e-3,
    "class_min_expected": 10.0,
}

REASON_MAX = 120

_NAMES = {
    "hw_job_failures": "hardware-failed jobs",
    "hw_xids": "hardware Xids",
    "warn_xids": "warning Xids",
    "check_fails": "failed checks",
    "check_warns": "check warnings",
    "drains": "drains",
    "warnings": "warning episodes",
}


# --- tail probabilities, in log space (no scipy) ---------------------------------------------


def ln_poisson_sf(k: float, mu: float) -> float:
    """ln P(X >= k) for X ~ Poisson(mu), continuous in k: the regularized lower incomplete gamma
    P(k, mu), exact for integer k. Series below the mode, Lentz's continued fraction above."""
    if k <= 0:
        return 0.0
    if mu <= 0:
        return -math.inf
    log_front = k * math.log(mu) - mu
    if mu < k + 1:
        term = total = 1.0
        n = 0
        while term > total * 1e-16:
            n += 1
            term *= mu / (k + n)
            total += term
        return min(0.0, log_front - math.lgamma(k + 1) + math.log(total))
    return math.log1p(-min(1.0, math.exp(log_front - math.lgamma(k)) * _gamma_cf(k, mu)))


def _gamma_cf(a: float, x: float) -> float:
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 300):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _ln_sf_floor(k: float, mu: float) -> float:
    """A lower bound on ln P(X >= k), k > 0, mu > 0: the first term of ln_poisson_sf's series
    (every term is positive). Cheap, to skip the exact tails of nodes that cannot be
    significant: a tail whose floor is above the cut is above it too."""
    return k * math.log(mu) - mu - math.lgamma(k + 1)


def ln_chi2_sf_even(x: float, df: int) -> float:
    """ln P(chi2_df >= x) for even df (Fisher's method: df = 2 x number of p-values)."""
    half = x / 2
    term = total = 1.0
    for i in range(1, df // 2):
        term *= half / i
        total += term
    return min(0.0, -half + math.log(total))


# --- one signal against the fleet --------------------------------------------------------------


def _expected(
    counts: list, exposure: list, keep: list, prior: tuple, strata: list | None = None
) -> list:
    """Each node's expectation: the pooled rate of the kept nodes other than itself, of its
    stratum (_strata) when given; where that rate is below the prior (rate, events), it is
    shrunk toward it (DEFAULT_PARAMS rate_prior)."""
    strata = strata or [""] * len(counts)
    totals: dict = {}
    for c, e, k, g in zip(counts, exposure, keep, strata):
        if k:
            got = totals.setdefault(g, [0.0, 0.0])
            got[0] += c
            got[1] += e
    out = []
    for c, e, k, g in zip(counts, exposure, keep, strata):
        total, units = totals.get(g, (0.0, 0.0))
        rest, rest_units = (total - c, units - e) if k else (total, units)
        out.append(_rate(rest, rest_units, prior) * e)
    return out


def _rate(events: float, units: float, prior: tuple) -> float:
    """The pool's rate, or where it is lower, the pool shrunk toward the prior rate with the
    weight of `prior[1]` events."""
    rate, weight = prior
    own = events / units if units > 0 else 0.0
    if rate <= 0 or own >= rate:
        return own
    return (events + weight) / (max(units, 0.0) + weight / rate)  # between own and rate


def _ln_two_sided(count: float, mu: float) -> float:
    """ln of the two-sided Poisson p-value of `count` against mean `mu` (twice the nearer tail)."""
    if count >= mu:
        tail = ln_poisson_sf(count, mu)
    elif count <= 0:
        tail = -mu
    else:  # P(X <= count) = 1 - P(X >= count + 1); the smallest double for a tail of ~0
        tail = math.log(max(1.0 - math.exp(ln_poisson_sf(count + 1, mu)), 5e-324))
    return min(0.0, math.log(2) + tail)


def _strata(counts: list, exposure: list, keep: list, classes: list | None, p: dict) -> list:
    """Each node's pool: its hardware class where that class's kept nodes fail at a rate the
    rest of the kept fleet's does not explain (DEFAULT_PARAMS class_p, class_min_expected),
    else "" (the fleet's pool, with every class that is not its own)."""
    if not classes:
        return [""] * len(counts)
    totals: dict = {}
    for c, e, k, g in zip(counts, exposure, keep, classes):
        if k and g:
            got = totals.setdefault(g, [0.0, 0.0])
            got[0] += c
            got[1] += e
    count = sum(c for c, k in zip(counts, keep) if k)
    units = sum(e for e, k in zip(exposure, keep) if k)
    if len(totals) < 2 or units <= 0:
        return [""] * len(counts)
    ln_cut = math.log(p["class_p"] / len(totals))
    own = set()
    for g, (c, e) in totals.items():
        rest, rest_units = count - c, units - e
        if rest_units <= 0 or count / units * e < p["class_min_expected"]:
            continue
        if _ln_two_sided(c, max(rest / rest_units, 1e-12) * e) < ln_cut:
            own.add(g)
    return [g if g in own else "" for g in classes]


def _pooled(counts: list, exposure: list) -> list:
    """Each node's expectation at the fleet's pooled rate (shown as evidence, not tested)."""
    rate = sum(counts) / sum(exposure) if sum(exposure) else 0.0
    return [rate * e for e in exposure]


def dispersion(counts: list, expected: list, keep: list) -> float:
    """The kept nodes' dispersion: sum (count - expected)^2 / sum expected, 1 unless the data
    show overdispersion beyond three standard errors.

    Weighted by each node's expectation (Pearson's statistic divides each residual by it
    instead): at fault rates of 0.1 a node-month, a node seen for a day with one fault has a
    Pearson residual of ~200, so a few nodes that were out of service for most of the window
    made a whole fleet look overdispersed. Here such a node adds about 1 / sum expected. Under
    Poisson the statistic has mean 1 and variance sum (m + 2 m^2) / (sum m)^2."""
    kept = [(c, m) for c, m, k in zip(counts, expected, keep) if k and m > 0]
    total = sum(m for _, m in kept)
    if len(kept) < 2 or total <= 0:
        return 1.0
    phi = sum((c - m) ** 2 for c, m in kept) / total
    noise = 3 * math.sqrt(sum(m + 2 * m * m for _, m in kept)) / total
    return phi if phi > 1 + noise else 1.0


def _outliers(counts: list, expected: list, ln_cut: float, most: int) -> list:
    """Kept-mask: False for the (at most `most`) nodes significant on this signal alone, as
    Poisson counts."""
    found = []
    for i, (c, m) in enumerate(zip(counts, expected)):
        # (an upper bound here, Chernoff's, skipped the very tails that decide: a lemon with 5
        # faults vs 0.23 expected, p = 5e-6, stayed in the pool and inflated it)
        if c > m and (m <= 0 or _ln_sf_floor(c, m) < ln_cut):
            lnp = ln_poisson_sf(c, m)
            if lnp < ln_cut:
                found.append((lnp, i))
    keep = [True] * len(counts)
    for _, i in sorted(found)[:most]:
        keep[i] = False
    return keep


def fit_signal(
    counts: list,
    exposure: list,
    prior: tuple,
    ln_cut: float,
    p: dict,
    classes: list | None = None,
    scaled: bool = True,
) -> tuple:
    """(expected per node, dispersion, ln p per node, pool per node) for one signal over the
    fleet; `classes`: each node's hardware class ("" unknown), pooled apart where they differ.

    The outliers are the nodes significant by themselves as Poisson counts against the pool of
    the others, found until the set settles; they never enter the pool nor the dispersion that
    judges them. The dispersion is measured on the rest (`dispersion`), once: it never readmits
    an outlier (dividing by it made outliers ordinary, they rejoined the pool, the estimate
    climbed, and a fleet with several bad nodes ended with none flagged). With `scaled` False
    (the faults, counted to be Poisson: fleet/faults.py) it is shown, never divided by: a node
    whose faults the fleet's rate does not explain is what a lemon is, however much the
    fleet's nodes differ."""
    n = len(counts)
    share = p["max_outlier_share"]
    most = max(1, int(share * n)) if share > 0 and n >= 3 else 0
    keep, strata = _settle(counts, exposure, prior, ln_cut, p, most, None)
    if classes and len(set(classes) - {""}) > 1:
        # Then the classes, judged on the nodes that are no outliers of the fleet's pool (a
        # class's lemons must not set it apart), and the outliers again within each pool.
        keep, strata = _settle(counts, exposure, prior, ln_cut, p, most, classes, keep)
    expected = _expected(counts, exposure, keep, prior, strata)
    phi = dispersion(counts, expected, keep)
    by = phi if scaled else 1.0
    lnps = [ln_poisson_sf(c / by, m / by) if c > 0 else 0.0 for c, m in zip(counts, expected)]
    return expected, phi, lnps, strata


def _settle(
    counts: list,
    exposure: list,
    prior: tuple,
    ln_cut: float,
    p: dict,
    most: int,
    classes: list | None,
    keep: list | None = None,
) -> tuple:
    """(kept-mask, pools) once the outliers and (with `classes`) the pools stop changing
    (fit_signal)."""
    n = len(counts)
    keep = keep or [True] * n
    strata = _strata(counts, exposure, keep, classes, p)
    for _ in range(8):
        expected = _expected(counts, exposure, keep, prior, strata)
        new = _outliers(counts, expected, ln_cut, most) if most else [True] * n
        new_strata = _strata(counts, exposure, new, classes, p)
        if new == keep and new_strata == strata:
            break
        keep, strata = new, new_strata
    return keep, strata


# --- the score ---------------------------------------------------------------------------------


def _params(params: dict | None) -> dict:
    out = dict(DEFAULT_PARAMS)
    for key, value in (params or {}).items():
        if key not in out:
            raise ValueError(f"unknown lemon parameter {key!r}")
        default = out[key]
        out[key] = dict(default, **value) if isinstance(default, dict) else value
    return out


def _exposure(sig: dict, unit: str, count: float) -> float:
    """At least 1 node-day, and never fewer jobs than failed jobs (a store that lost some rows
    must not make a node's events impossible)."""
    if unit == "node_days":
        return max(sig.get(unit, 0), 1)
    return max(sig.get(unit, 0), count)


def _counted(signals: dict, nodes: list, key: str, p: dict, starts: dict | None = None) -> dict:
    """{node: (count, kinds, shared, latest start)} of the node's fault or warning episodes;
    `starts` receives each node's whole faults' starts (faults.count)."""
    by_node = {n: faultlib.episodes(signals[n].get(key, ()), p["fault_gap_s"]) for n in nodes}
    return faultlib.count(by_node, _window_days(signals, nodes) * DAY, p, starts)


def ln_scan(most: int, expected: float, days: float, window_days: float) -> float:
    """ln of a bound on P(some `window_days` span of the node's `days` holds `most` or more
    faults) at the node's expected faults: each fault starts such a span with the next
    most - 1 after it with probability P(Poisson(rate x window) >= most - 1) (the rest of a
    Poisson process seen from one of its points is a Poisson process), so the expected number
    of such starts, rate x days x that, bounds the probability (Markov). 0 (p = 1) below 3
    faults."""
    if most < 3 or expected <= 0 or days <= 0:
        return 0.0
    rate = expected / days
    return min(0.0, math.log(rate * days) + ln_poisson_sf(most - 1, rate * window_days))


def _fit(
    counts: list, exposure: list, name: str, ln_cut: float, p: dict, classes: list
) -> tuple:
    prior = (p["rate_prior"].get(name, 0.0), p["prior_events"])
    return fit_signal(counts, exposure, prior, ln_cut, p, classes, scaled=name != "faults")


def _phrase(name: str, test: dict, kinds: bool) -> str:
    count, expected, exposure = test["count"], test["expected"], test["exposure"]
    if name == "faults":
        seen = ", ".join(_many(n, faultlib.KINDS[k]) for k, n in sorted(test["kinds"].items()))
        line = f"{counted(count, 'fault')} in {counted(exposure, 'day')} vs {expected:.2g} expected"
        return line + (f" ({seen})" if seen and kinds else "")
    if name == "multi_node_failures":
        rate = expected / exposure if exposure else 0.0
        jobs = counted(exposure, "multi-node job")
        return f"{count:g} of {jobs} failed vs fleet {100 * rate:.2g}%"
    seen = _many(count, _NAMES[name])
    return f"{seen} in {counted(exposure, 'day')} vs {expected:.2g} expected"


def _many(n: float, plural: str) -> str:
    """`1 drain`, `3 drains`: the names of signals and fault kinds here are plurals."""
    return counted(n, plural[:-1], plural) if plural.endswith("s") else counted(n, plural, plural)


def _reason(tests: dict, ln_tests: dict, day: tuple) -> str:
    """The faults first (with the kinds of evidence they showed, room permitting), then the
    worst day or the strongest other evidence when it is stronger still; one line. day: (most
    faults within the scan window, its ln p, the window in hours)."""
    weak = math.log(0.5)
    parts = ["faults"] if tests["faults"]["count"] and ln_tests["faults"] < weak else []
    others = sorted((n for n in ln_tests if n != "faults"), key=lambda n: ln_tests[n])
    if day[1] < min(weak, ln_tests["faults"]) and (not others or day[1] <= ln_tests[others[0]]):
        parts.append("day")
    elif others and ln_tests[others[0]] < min(weak, ln_tests["faults"]):
        parts.append(others[0])
    if not parts:
        return "no excess over the fleet"
    said = {
        "day": f"{day[0]} {'of them' if parts[0] == 'faults' else 'faults'} within {day[2]:g} h"
    }
    line = "; ".join(said.get(n) or _phrase(n, tests[n], kinds=True) for n in parts)
    if len(line) > REASON_MAX:
        line = "; ".join(said.get(n) or _phrase(n, tests[n], kinds=False) for n in parts)
    return line[:REASON_MAX]


def _faults_share(used: list, p: dict) -> float:
    """The share of the budget the faults test decides at alone (_combined)."""
    if len(used) < 2 or 1 - p["primary_share"] - p["scan_share"] <= 0:
        return max(1 - p["scan_share"], 1e-12)
    return p["primary_share"]


def fewest(ln_p: Callable[[int], float], ln_cut: float, least: float, most: int = 1000) -> int:
    """The fewest faults n >= `least` with ln_p(n) below ln_cut; `most` + 1 past `most`. With
    the faults test or the worst day as ln_p: what makes a node of a given expectation a lemon,
    the figure an admin checks a verdict against."""
    n = max(1, math.ceil(least - 1e-9))
    while n <= most and ln_p(n) >= ln_cut:
        n += 1
    return n


def _combined(ln_tests: dict, used: list, p: dict, ln_day: float) -> tuple:
    """(ln p of the node, the test that gave it: "faults", "worst day", "combined" or "" for
    none): the faults test at primary_share of the budget, the worst day at scan_share, or
    Fisher's combination of every test with data in this fleet at the rest (without such
    tests, the faults test takes the rest too)."""
    scan = p["scan_share"]
    fisher = 1 - p["primary_share"] - scan
    options = [(0.0, ""), (ln_tests["faults"] - math.log(_faults_share(used, p)), "faults")]
    if len(used) >= 2 and fisher > 0:
        statistic = -2 * sum(ln_tests[name] for name in used)
        options.append((ln_chi2_sf_even(statistic, 2 * len(used)) - math.log(fisher), "combined"))
    if scan > 0:
        options.append((ln_day - math.log(scan), "worst day"))
    return min(options)


def _since(starts: list, needed: int, needed_day: int, p: dict) -> float | None:
    """When the node's whole faults (time order) first sufficed on the faults test alone or
    on its worst day: the start of its needed-th fault, or of the fault that completed its
    first day of needed_day faults; None if they never did (softer evidence may still make a
    lemon: its latest fault is then the flag's age)."""
    found = [starts[needed - 1]] if 0 < needed <= len(starts) else []
    if needed_day:
        lo = 0
        for hi, t in enumerate(starts):
            while t - starts[lo] > p["scan_window_s"]:
                lo += 1
            if hi - lo + 1 >= needed_day:
                found.append(t)
                break
    return min(found) if found else None


def _needed(memo: dict, expected: float, days: float, ln_cut: float, used: list, p: dict) -> tuple:
    """(faults spread over the window, faults within scan_window_s; 0: that test is off) that
    would make a node of this expectation over `days` a lemon; memo: most nodes share one."""
    key = (expected, days)
    if key not in memo:
        spread = ln_cut + math.log(_faults_share(used, p))
        memo[key] = (
            fewest(lambda n: ln_poisson_sf(n, expected), spread, p["min_faults"]),
            fewest(
                lambda n: ln_scan(n, expected, days, p["scan_window_s"] / DAY),
                ln_cut + math.log(p["scan_share"]),
                max(3, p["min_faults"]),
            )
            if p["scan_share"] > 0
            else 0,
        )
    return memo[key]


def _window_days(signals: dict, nodes: list) -> float:
    """The scored window's length in days: the most days any node was seen (at least 1)."""
    return max([1.0] + [signals[n].get("node_days", 0) for n in nodes])


def score(signals: dict, params: dict | None = None) -> list:
    """Score every node against the fleet; one dict per node, highest score first.

    signals: {node: {signal: count, "faults": items, "warnings": items}} per docs/signals.md.
    Each result: {"node", "lemon", "score" (-log10 p), "p_value", "faults" (distinct faults,
    shared ones left out), "evidence": {name: {"count", "expected"}}, "reason" (one line,
    <= 120 chars, no quotes)}.
    """
    p = _params(params)
    nodes = sorted(signals)
    if not nodes:
        return []
    ln_cut = math.log(p["fp_per_node_month"] * _window_days(signals, nodes) / NODE_MONTH_DAYS)
    classes = [str(signals[n].get("gpu_class") or "") for n in nodes]
    starts: dict = {}
    episodes = {
        "faults": _counted(signals, nodes, "faults", p, starts),
        "warnings": _counted(signals, nodes, "warnings", p),
    }
    fits, used = {}, []
    for name in TESTED:
        if name in episodes:
            counts = [episodes[name][n][0] for n in nodes]
        else:
            counts = [signals[n].get(name, 0) for n in nodes]
        unit = EXPOSURE[name]
        exposure = [_exposure(signals[n], unit, c) for n, c in zip(nodes, counts)]
        fits[name] = (counts, exposure, *_fit(counts, exposure, name, ln_cut, p, classes))
        if name == "faults" or sum(counts) > 0:
            used.append(name)
    shown = {}
    for name in SHOWN:
        counts = [signals[n].get(name, 0) for n in nodes]
        exposure = [_exposure(signals[n], EXPOSURE[name], c) for n, c in zip(nodes, counts)]
        shown[name] = (counts, _pooled(counts, exposure))
    needs: dict = {}  # by expectation: most nodes of a fleet share one
    out = []
    for i, node in enumerate(nodes):
        tests = {
            name: {"count": f[0][i], "exposure": f[1][i], "expected": f[2][i]}
            for name, f in fits.items()
        }
        tests["faults"]["kinds"] = episodes["faults"][node][1]
        ln_tests = {name: fits[name][4][i] for name in used}
        day = faultlib.most_within(starts[node], p["scan_window_s"])
        faults_fit = fits["faults"]
        mu, days = faults_fit[2][i], faults_fit[1][i]
        ln_day = ln_scan(day, mu, days, p["scan_window_s"] / DAY)
        ln_p, decided = _combined(ln_tests, used, p, ln_day)
        count = episodes["faults"][node][0]
        evidence = {
            name: {"count": round(t["count"], 3), "expected": round(t["expected"], 4)}
            for name, t in tests.items()
        }
        mine = evidence["faults"]
        mine["discounted"] = episodes["faults"][node][2]
        mine["shared"] = len(mine["discounted"])
        mine["pool"] = faults_fit[5][i] or "fleet"
        mine["dispersion"] = round(faults_fit[3], 3)
        mine["days"] = round(days, 2)
        mine["worst_day"] = day
        mine["last"] = episodes["faults"][node][3]
        mine["needed"], mine["needed_day"] = _needed(needs, mu, days, ln_cut, used, p)
        mine["decided"] = decided
        mine["since"] = _since(starts[node], mine["needed"], mine["needed_day"], p)
        if signals[node].get("reset"):
            mine["reset"] = signals[node]["reset"]
        for name, (counts, expected) in shown.items():
            evidence[name] = {"count": counts[i], "expected": round(expected[i], 4)}
        out.append(
            {
                "node": node,
                "lemon": ln_p < ln_cut and count >= p["min_faults"] - 1e-9,
                "score": round(-ln_p / math.log(10), 3),
                "p_value": math.exp(ln_p),
                "faults": round(count, 3),
                "evidence": evidence,
                "reason": _reason(tests, ln_tests, (day, ln_day, p["scan_window_s"] / 3600)),
            }
        )
    out.sort(key=lambda r: (-r["score"], r["node"]))
    return out


def bars(scored: list, params: dict | None = None) -> list:
    """What makes a lemon in each pool of a score(): the boundary of the pool's node seen
    longest, [{"pool", "expected", "needed", "needed_day", "hours", "dispersion"}] by pool
    (hours: the worst-day span; dispersion: of the fleet's faults, shown, fit_signal)."""
    best: dict = {}
    spread: dict = {}
    for entry in scored:
        faults = entry["evidence"]["faults"]
        mine = (faults["expected"], faults["needed"], faults["needed_day"])
        best[faults["pool"]] = max(best.get(faults["pool"], mine), mine)
        spread[faults["pool"]] = faults.get("dispersion", 1.0)
    span = _params(params)["scan_window_s"] / 3600
    hours = int(span) if span == int(span) else round(span, 2)
    return [
        {
            "pool": pool,
            "expected": e,
            "needed": n,
            "needed_day": d,
            "hours": hours,
            "dispersion": spread[pool],
        }
        for pool, (e, n, d) in sorted(best.items())
    ]


_DECIDED = {
    "faults": "the faults test",
    "worst day": "the worst-day test",
    "combined": "the faults with the softer evidence (Fisher)",
}


def explain(entry: dict, now: float) -> list:
    """A node's verdict as lines an admin can check by hand: the test that decided, what would
    have sufficed (`needed`), the flag's age, what was left out as shared and why, and where
    its evidence started afresh. Plain text, not yet cleaned (scopes and pools come from the
    store): the CLI cleans each line, the report escapes them."""
    f = entry["evidence"]["faults"]
    lines = []
    if entry["lemon"]:
        test = _DECIDED.get(f.get("decided", ""), "no single test")
        day = f" or {f['needed_day']} within a day" if f.get("needed_day") else ""
        p = entry["p_value"]
        chance = f"p = {p:.2g}" if p > 0 else "p < 1e-300"
        lines.append(
            f"decided by {test} ({chance}): {counted(f['count'], 'separate fault')} "
            f"in {counted(f.get('days', 0), 'day')} in service vs {f['expected']:.2g} expected, "
            f"worst day {f['worst_day']}; a lemon from {f['needed']}{day}"
        )
    since = f.get("since") if f.get("since") is not None else f.get("last")
    if entry["lemon"] and since is not None:
        line = f"a lemon since {timespec.iso(since)} ({(now - since) / DAY:.1f} days)"
        last = f.get("last")
        if last is not None and last != since:
            # a flag ages (docs/lemons.md): its newest fault says how fresh the evidence is
            line += f"; latest fault {timespec.iso(last)} ({(now - last) / DAY:.1f} days ago)"
        lines.append(line)
    for gone in f.get("discounted", ()):
        lines.append(
            f"left out as shared: the fault of {timespec.iso(gone['start'])} "
            f"({gone['scope']} on {counted(gone['nodes'], 'node')} within the hour)"
        )
    if f.get("reset"):
        lines.append(
            f"evidence starts afresh at {timespec.iso(f['reset']['time'])}: "
            f"{f['reset']['why']} (earlier faults stay in its history)"
        )
    return lines
