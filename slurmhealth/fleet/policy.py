"""The lemon policy, pure: per-node signals (docs/signals.md) and time in, decisions out.

No I/O, no Slurm, no SQLite: `slurmhealth lemons` and the hooks feed it recorded history; the
simulator and the tests feed it planted fleets. The model and its assumptions: docs/lemons.md.

score() in short: each signal of each node is tested against the fleet's pooled rate times the
node's exposure (one-sided quasi-Poisson; for failed jobs out of jobs run, the Poisson tail is a
slightly conservative stand-in for the binomial's); the pool leaves out the node itself and any node
that is an outlier on its own, so lemons do not raise the bar they are measured against, and a
fault that the whole fleet shows (an incident) raises everyone's expectation alike. Signals of
one fault are dependent, so a group of them counts as its strongest signal, Bonferroni-corrected
for the group's size; the groups are combined with Fisher's method. A node is a lemon when the
combined p-value is below alpha / fleet size AND it has at least `min_hw_events` hardware events.
"""

from __future__ import annotations

import bisect
import math

# The lemon signals, in order (docs/signals.md is the contract: fleet.signals computes them
# in SQL, simulate.signals in memory).
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

# Which count each signal is measured against (docs/signals.md).
EXPOSURE = {
    "hw_job_failures": "jobs",
    "multi_node_failures": "multi_node_jobs",
    "hw_xids": "node_days",
    "check_fails": "node_days",
    "drains": "node_days",
    "warn_xids": "node_days",
    "check_warns": "node_days",
}

DEFAULT_PARAMS = {
    # False-positive budget: the expected number of healthy nodes flagged by one sweep of the
    # whole fleet. Each node is tested at alpha / fleet size (Bonferroni).
    "alpha": 0.01,
    # Never a lemon on less hardware evidence than this many hardware events in the window
    # (the sum of the signals below). One severe fault during a job can make 3 (the failed job,
    # its Xid, the drain): the statistics, not this floor, separate one bad day from a lemon.
    "min_hw_events": 3,
    "hw_events": ("hw_job_failures", "hw_xids", "drains"),
    # Signals of one fault are dependent (a GPU falling off the bus fails the job, logs an Xid,
    # fails checks, is drained): a group's p-value is its strongest signal's times the group's
    # size. Groups are independent on a healthy node (by assumption) and combined with Fisher.
    "groups": {
        "hardware": (
            "hw_job_failures",
            "hw_xids",
            "drains",
            "multi_node_failures",
            "check_fails",
        ),
        "warnings": ("warn_xids", "check_warns"),
    },
    # The lowest pooled rate assumed, per unit of exposure (per node-day; per job for the job
    # signals): a small or clean fleet's pool of 0 would make any single event infinitely
    # surprising. 0.001 per node-day is under the literature's 2.34-6.50 failures per 1,000.
    "rate_floor": {
        "hw_job_failures": 0.0005,
        "multi_node_failures": 0.01,
        "hw_xids": 0.001,
        "check_fails": 0.01,
        "drains": 0.001,
        "warn_xids": 0.01,
        "check_warns": 0.01,
    },
    # Scored by rank, not by rate: failed health checks count runs, that is how long faults
    # lasted rather than how many there were (one 10-hour repair fails as many 5-minute checks
    # as ten short ones), so no count model fits them. Empirical p-value: the share of the fleet
    # with at least this rate; never below 1 / fleet size, so never decisive alone.
    "rank_signals": ("check_fails",),
    # Robust pooling: nodes significant on a signal by themselves (p < alpha / fleet size) are
    # left out of that signal's pool and dispersion, at most this share of the fleet (at least
    # one node of three or more), strongest first, until the set settles.
    "max_outlier_share": 0.10,
    # Dispersion (quasi-Poisson): counts and expectations are divided by the pooled nodes'
    # Pearson dispersion (never below 1). Before any outlier is known, this top share of the
    # residuals is left out, so that lemons cannot inflate it and hide themselves.
    "dispersion_trim": 0.02,
}

REASON_MAX = 120

_NAMES = {
    "hw_xids": "hardware Xids",
    "warn_xids": "warning Xids",
    "check_fails": "failed checks",
    "check_warns": "check warnings",
    "drains": "drains",
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


def _chernoff(k: float, mu: float) -> float:
    """An upper bound on ln P(X >= k), k > mu: cheap, to skip exact tails that cannot matter."""
    return k - mu - k * math.log(k / mu)


def ln_chi2_sf_even(x: float, df: int) -> float:
    """ln P(chi2_df >= x) for even df (Fisher's method: df = 2 x number of p-values)."""
    half = x / 2
    term = total = 1.0
    for i in range(1, df // 2):
        term *= half / i
        total += term
    return min(0.0, -half + math.log(total))


# --- one signal against the fleet --------------------------------------------------------------


def _expected(counts: list, exposure: list, keep: list, floor: float) -> list:
    """Each node's expectation: the pooled rate of the kept nodes other than itself."""
    total = sum(c for c, k in zip(counts, keep) if k)
    units = sum(e for e, k in zip(exposure, keep) if k)
    out = []
    for c, e, k in zip(counts, exposure, keep):
        rest, rest_units = (total - c, units - e) if k else (total, units)
        rate = rest / rest_units if rest_units > 0 else 0.0
        out.append(max(rate, floor) * e)
    return out


def _pooled(counts: list, exposure: list) -> list:
    """Each node's expectation at the fleet's pooled rate (shown as evidence, not tested)."""
    rate = sum(counts) / sum(exposure) if sum(exposure) else 0.0
    return [rate * e for e in exposure]


def _dispersion(counts: list, expected: list, keep: list, trim: float) -> float:
    """Pearson dispersion of the pooled nodes, the largest `trim` share of residuals (at least
    one, when trimming) left out; at least 1."""
    residuals = sorted((c - m) ** 2 / m for c, m, k in zip(counts, expected, keep) if k and m > 0)
    cut = max(1, math.ceil(trim * len(residuals))) if trim > 0 and len(residuals) > 2 else 0
    kept = residuals[: len(residuals) - cut]
    if len(kept) < 2:
        return 1.0
    return max(1.0, sum(kept) / (len(kept) - 1))


def _outliers(counts: list, expected: list, phi: float, ln_cut: float, most: int) -> list:
    """Kept-mask: False for the (at most `most`) nodes significant on this signal alone."""
    found = []
    for i, (c, m) in enumerate(zip(counts, expected)):
        if c > m and _chernoff(c / phi, m / phi) < ln_cut:
            lnp = ln_poisson_sf(c / phi, m / phi)
            if lnp < ln_cut:
                found.append((lnp, i))
    keep = [True] * len(counts)
    for _, i in sorted(found)[:most]:
        keep[i] = False
    return keep


def fit_signal(counts: list, exposure: list, floor: float, ln_cut: float, p: dict) -> tuple:
    """(expected per node, dispersion, ln p per node) for one signal over the fleet."""
    n = len(counts)
    share = p["max_outlier_share"]
    most = max(1, int(share * n)) if share > 0 and n >= 3 else 0
    # First pass: nothing is known to be an outlier, so the dispersion leaves out the top
    # residuals; then the pool and the dispersion are those of the nodes that are no outliers
    # under the previous pass, untrimmed (trimming a healthy tail would understate it).
    keep, trim = [True] * n, p["dispersion_trim"]
    for _ in range(8):
        expected = _expected(counts, exposure, keep, floor)
        phi = _dispersion(counts, expected, keep, trim)
        new = _outliers(counts, expected, phi, ln_cut, most) if most else [True] * n
        if new == keep and not trim:
            break
        keep, trim = new, 0.0
    lnps = [ln_poisson_sf(c / phi, m / phi) if c > 0 else 0.0 for c, m in zip(counts, expected)]
    return expected, phi, lnps


def rank_signal(counts: list, exposure: list) -> list:
    """ln of the empirical p-value: the share of nodes whose rate is at least this node's."""
    rates = sorted(c / e for c, e in zip(counts, exposure))
    n = len(rates)
    return [
        math.log((n - bisect.bisect_left(rates, c / e)) / n) if c > 0 else 0.0
        for c, e in zip(counts, exposure)
    ]


# --- the score ---------------------------------------------------------------------------------


def _params(params: dict | None) -> dict:
    out = dict(DEFAULT_PARAMS)
    for key, value in (params or {}).items():
        if key not in out:
            raise ValueError(f"unknown lemon parameter {key!r}")
        out[key] = dict(out[key], **value) if isinstance(out[key], dict) else value
    return out


def _exposures(signals: dict, nodes: list, signal: str) -> list:
    """Exposure per node: at least 1 node-day, and never fewer jobs than failed jobs (a store
    that lost some rows must not make a node's events impossible)."""
    unit = EXPOSURE[signal]
    if unit == "node_days":
        return [max(signals[n].get(unit, 0), 1) for n in nodes]
    return [max(signals[n].get(unit, 0), signals[n].get(signal, 0)) for n in nodes]


def _phrase(signal: str, count: int, expected: float, exposure: float) -> str:
    if signal in ("hw_job_failures", "multi_node_failures"):
        what = "jobs failed on node" if signal == "hw_job_failures" else "multi-node jobs failed"
        rate = expected / exposure if exposure else 0.0
        return f"{count} of {exposure:g} {what} vs fleet {100 * rate:.2g}%"
    return f"{count} {_NAMES[signal]} in {exposure:g} days vs {expected:.2g} expected"


def _reason(evidence: dict, groups: dict) -> str:
    """The strongest evidence in one line; the strongest hardware evidence too, if another."""
    ranked = sorted(evidence, key=lambda s: evidence[s]["ln_p"])
    if not ranked or evidence[ranked[0]]["ln_p"] >= math.log(0.5):
        return "no excess over the fleet"
    parts = [ranked[0]]
    hardware = [s for s in ranked if s in groups.get("hardware", ())]
    if hardware and hardware[0] != ranked[0] and evidence[hardware[0]]["ln_p"] < math.log(0.5):
        parts.append(hardware[0])
    line = "; ".join(
        _phrase(s, evidence[s]["count"], evidence[s]["expected"], evidence[s]["exposure"])
        for s in parts
    )
    return line[:REASON_MAX]


def _node_result(node: str, evidence: dict, hw_events: int, ln_cut: float, p: dict) -> dict:
    groups = p["groups"]
    ln_group = []
    for members in groups.values():
        best = min(evidence[s]["ln_p"] for s in members)
        ln_group.append(min(0.0, best + math.log(len(members))))
    statistic = -2 * sum(ln_group)
    ln_p = ln_chi2_sf_even(statistic, 2 * len(ln_group))
    return {
        "node": node,
        "lemon": ln_p < ln_cut and hw_events >= p["min_hw_events"],
        "score": round(-ln_p / math.log(10), 3),
        "p_value": math.exp(ln_p),
        "hw_events": hw_events,
        "evidence": {
            s: {"count": e["count"], "expected": round(e["expected"], 4)}
            for s, e in evidence.items()
        },
        "reason": _reason(evidence, groups),
    }


def _fit(signals: dict, nodes: list, signal: str, ln_cut: float, p: dict) -> tuple:
    """(counts, exposures, expected, dispersion, ln p) of one signal, node by node."""
    counts = [signals[n].get(signal, 0) for n in nodes]
    exposure = _exposures(signals, nodes, signal)
    if signal in p["rank_signals"]:
        return counts, exposure, _pooled(counts, exposure), 1.0, rank_signal(counts, exposure)
    floor = p["rate_floor"].get(signal, 0.0)
    return (counts, exposure, *fit_signal(counts, exposure, floor, ln_cut, p))


def score(signals: dict, params: dict | None = None) -> list:
    """Score every node against the fleet; one dict per node, highest score first.

    signals: {node: {signal: count}} per docs/signals.md. Each result:
    {"node", "lemon", "score" (-log10 p), "p_value", "hw_events",
     "evidence": {signal: {"count", "expected"}}, "reason" (one line, <= 120 chars, no quotes)}.
    """
    p = _params(params)
    nodes = sorted(signals)
    if not nodes:
        return []
    ln_cut = math.log(p["alpha"] / len(nodes))
    tested = sorted({s for members in p["groups"].values() for s in members})
    fits = {s: _fit(signals, nodes, s, ln_cut, p) for s in tested}
    out = []
    for i, node in enumerate(nodes):
        evidence = {
            s: {"count": f[0][i], "exposure": f[1][i], "expected": f[2][i], "ln_p": f[4][i]}
            for s, f in fits.items()
        }
        hw_events = sum(signals[node].get(s, 0) for s in p["hw_events"])
        out.append(_node_result(node, evidence, hw_events, ln_cut, p))
    out.sort(key=lambda r: (-r["score"], r["node"]))
    return out
