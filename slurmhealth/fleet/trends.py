"""Rising error counters: the devices whose error rate rose against their own past and their
peers' (docs/trends.md). Pure: the rows queries.counter_rows reads go in, findings come out.

A series is one counter of one device (GPU, NVLink, HCA, port) of one node. The node records a
reading only when the counter grew (node/counters.py), each with its increase, so each row is an
*episode*: one or more errors between two runs a few minutes apart. Episodes, not error counts,
are what the test counts: errors come in bursts (one marginal lane retrains and replays 50
times), and a Poisson test of raw counts would call every burst a trend.

For each series and each recent window (6 h and 24 h by default), with k its episodes in the
window and n_b those in the 7 days before the longest window:
- against its own past: under a steady rate, k of the k + n_b episodes fall in the window
  with probability window / (window + 7 days) each: an exact binomial test of the two Poisson
  counts, which carries the uncertainty of a past of few episodes (a Poisson test against the
  past's rate, taken as exact, calls every noisy week a trend);
- against its peers: the median rate over every device of the same kind on the nodes of the
  same GPU model (devices without a row count 0; at least half an episode a week), a Poisson
  test of k against window x that rate.
The series is rising when k >= `min_episodes`, its rate in the window is at least `factor`
times both its own past rate and its peers' (a rate that doubled, by default), and both tests
give P <= `alpha`.
Published limits are judged on error counts besides: DCGM's health watches warn at 8 PCIe
replays per minute (DCGM_LIMIT_MAX_PCIREPLAY_RATE) and at 100 NVLink CRC errors per second
(DCGM_LIMIT_MAX_NVLINK_CRC_ERROR), over the shortest window here.
"""

from __future__ import annotations

import math
import statistics

from slurmhealth.core.result import clean
from slurmhealth.fleet.policy import ln_poisson_sf

HOUR = 3600.0
DAY = 86400.0
WINDOWS = (6 * HOUR, DAY)  # recent windows tested (seconds)
BASELINE = 7 * DAY  # the series' own past, before the longest window
FACTOR = 2.0  # "a rate that doubled"
MIN_EPISODES = 4  # fewer episodes in a window are never a trend
ALPHA = 1e-9  # per series, window and sweep: ~3,000 active series x 2 windows x 24 sweeps a day
MIN_SPREAD = 14  # a week's episodes that measure a device's day-to-day variation
PRIOR = 0.5  # episodes a week: the least rate a device's peers are taken to have
# Published limits on error counts per second: (limit, source).
PUBLISHED = {
    "pcie_replay": (8 / 60.0, "DCGM's PCIe health watch: 8 replays per minute"),
    "nvlink_crc": (100.0, "DCGM's NVLink health watch: 100 CRC errors per second"),
}
PUBLISHED_LNP = -1000.0  # a published limit reached: stronger than any test (finite for JSON)
# Recorded, judged elsewhere: gauges (node/counters.py GAUGES) and counters that move with
# normal use (the time a power or thermal policy held clocks back is a workload's, not a fault).
NOT_TRENDS = ("thermal_margin", "pcie_gen", "pcie_width", "perf_power_ns", "perf_thermal_ns")
LABELS = {
    "pcie_replay": "PCIe replays",
    "aer_correctable": "PCIe AER corrected errors",
    "aer_nonfatal": "PCIe AER non-fatal errors",
    "aer_fatal": "PCIe AER fatal errors",
    "ecc_sbe_volatile": "corrected ECC errors",
    "ecc_sbe_aggregate": "corrected ECC errors (lifetime)",
    "ecc_dbe_volatile": "uncorrected ECC errors",
    "ecc_dbe_aggregate": "uncorrected ECC errors (lifetime)",
    "remap_correctable": "rows remapped for corrected errors",
    "remap_uncorrectable": "rows remapped for uncorrected errors",
    "retired_sbe": "pages retired (single-bit)",
    "retired_dbe": "pages retired (double-bit)",
    "nvlink_replay": "NVLink replays",
    "nvlink_recovery": "NVLink recoveries",
    "nvlink_crc": "NVLink CRC errors",
    "symbol_error": "IB symbol errors",
    "link_error_recovery": "IB link recoveries",
    "port_rcv_errors": "IB receive errors",
    "link_downed": "IB link downs",
    "local_link_integrity_errors": "IB link integrity errors",
    "excessive_buffer_overrun_errors": "IB buffer overruns",
}


def kind_of(device: str) -> str:
    """ "gpu:0000:18:00.0" -> "gpu": the kind of device peers are compared by."""
    return device.partition(":")[0]


def rising(
    rows: list,
    models: dict,
    now: float,
    windows: tuple = WINDOWS,
    factor: float = FACTOR,
    min_episodes: int = MIN_EPISODES,
    alpha: float = ALPHA,
    baseline: float = BASELINE,
) -> list:
    """[{node, device, label, counter, window_h, episodes, errors, rate_per_h, own_per_h,
    fleet_per_h, expected, ratio, p, basis, evidence}] of every rising series, strongest first;
    one finding per series (its most significant window).

    rows: (node, device, counter, time, delta, label) with time in (now - longest window -
    baseline, now]; a row whose delta is None (a first reading) counts nowhere. models: {node:
    GPU model} of every node of the fleet, those without a row included (the fleet's median
    counts them as 0)."""
    longest = max(windows)
    start = now - longest - baseline
    series: dict = {}
    for node, device, counter, t, delta, label in rows:
        if counter in NOT_TRENDS or delta is None or delta <= 0 or not start < t <= now:
            continue
        series.setdefault((node, device, counter), []).append((t, float(delta), label))
    past = {key: _past(items, now - longest, baseline) for key, items in series.items()}
    fleet = _fleet_rates(past, models, baseline)
    spread = _spread(past, models)
    ln_alpha = math.log(alpha)
    found = []
    for key, items in series.items():
        node, device, counter = key
        group = (models.get(node, ""), kind_of(device), counter)
        peers = fleet.get(group, (0.0, 0.0))
        limits = (factor, min_episodes, ln_alpha, spread.get(group, 0.0))
        best = None
        for window in windows:
            got = _window(items, now - window)
            best = _better(best, _judge(got, window, past[key][0], baseline, peers[0], limits))
            best = _better(best, _published(counter, got, window))
        if best is not None:
            found.append(_finding(key, items, best, peers, past[key][1] / baseline))
    return sorted(found, key=lambda f: (f["lnp"], f["node"], f["device"], f["counter"]))


def _past(items: list, before: float, baseline: float) -> tuple:
    """(episodes, errors, episodes per day) of a series in the baseline before `before`."""
    old = [(t, d) for t, d, _ in items if t <= before]
    days = [0] * max(1, round(baseline / DAY))
    for t, _ in old:
        days[min(len(days) - 1, int((before - t) // DAY))] += 1
    return len(old), sum(d for _, d in old), days


def _spread(past: dict, models: dict) -> dict:
    """{(model, kind, counter): c}, the day-to-day variation of the group's rates beyond
    Poisson's: the variance of a device's daily episodes is m + c m^2 (m their mean), c pooled
    by moments over the group's devices with a week of at least MIN_SPREAD episodes
    (sum(variance - m) / sum(m^2): the busiest devices, where it matters, weigh most). Error
    rates follow the work a node runs, so a busy day is no trend: the tests scale counts by
    1 + c x the expected episodes (a quasi-likelihood)."""
    sums: dict = {}
    for (node, device, counter), (episodes, _, days) in past.items():
        if episodes >= MIN_SPREAD and len(days) > 1:
            m = episodes / len(days)
            variance = sum((d - m) ** 2 for d in days) / (len(days) - 1)
            key = (models.get(node, ""), kind_of(device), counter)
            extra, weight = sums.get(key, (0.0, 0.0))
            sums[key] = (extra + variance - m, weight + m * m)
    return {k: max(0.0, extra / weight) for k, (extra, weight) in sums.items() if weight > 0}


def _window(items: list, after: float) -> tuple:
    """(episodes, errors) of a series after `after`."""
    new = [d for t, d, _ in items if t > after]
    return len(new), sum(new)


def _fleet_rates(past: dict, models: dict, baseline: float) -> dict:
    """{(model, kind, counter): (median episodes per s, median errors per s)} over every device
    of that kind on the model's nodes; devices that recorded nothing count 0. A node's device
    count is the most that recorded that counter on any node of the model (8 GPUs, 8 ports)."""
    nodes_of: dict = {}
    for node, model in models.items():
        nodes_of.setdefault(model, set()).add(node)
    groups: dict = {}
    width: dict = {}
    for (node, device, counter), (episodes, errors, _) in past.items():
        key = (models.get(node, ""), kind_of(device), counter)
        groups.setdefault(key, {}).setdefault(node, []).append((episodes, errors))
    for key, per_node in groups.items():
        width[key] = max(len(v) for v in per_node.values())
    out = {}
    for key, per_node in groups.items():
        total = max(len(nodes_of.get(key[0], ())), len(per_node)) * width[key]
        values = [v for items in per_node.values() for v in items]
        zeros = [(0, 0.0)] * max(0, total - len(values))
        episodes = statistics.median([e for e, _ in values] + [e for e, _ in zeros])
        errors = statistics.median([x for _, x in values] + [x for _, x in zeros])
        out[key] = (episodes / baseline, errors / baseline)
    return out


def _judge(got: tuple, window: float, before: int, baseline: float, fleet: float, limits: tuple):
    """The window's finding when it is a trend against both the past and the peers, else None."""
    factor, least, ln_alpha, spread = limits
    episodes, errors = got
    peers = window * max(fleet, PRIOR / BASELINE)
    own = window * before / baseline
    if episodes < least or episodes < factor * max(own, peers):
        return None
    phi = 1.0 + spread * own
    ln_own = ln_binomial_sf(
        round(episodes / phi), round((episodes + before) / phi), window / (window + baseline)
    )
    ln_peers = ln_poisson_sf(episodes / phi, peers / phi)
    lnp = max(ln_own, ln_peers)
    if lnp > ln_alpha:
        return None
    return {
        "window": window,
        "episodes": episodes,
        "errors": errors,
        "expected": max(own, peers),
        "lnp": lnp,
        "basis": "trend",
    }


def ln_binomial_sf(k: int, n: int, p: float) -> float:
    """ln P(X >= k) for X ~ Binomial(n, p), summed in log space (n is at most a few thousand
    episodes: the 5-minute readings of a week)."""
    if k <= 0:
        return 0.0
    if k > n or p <= 0:
        return -math.inf
    if p >= 1:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k, n + 1)
    ]
    top = max(terms)
    return min(0.0, top + math.log(sum(math.exp(t - top) for t in terms)))


def _published(counter: str, got: tuple, window: float) -> dict | None:
    limit = PUBLISHED.get(counter)
    if limit is None or got[1] / window < limit[0]:
        return None
    return {
        "window": window,
        "episodes": got[0],
        "errors": got[1],
        "expected": None,
        "lnp": PUBLISHED_LNP,
        "basis": "published",
        "source": limit[1],
    }


def _better(a: dict | None, b: dict | None) -> dict | None:
    if a is None:
        return b
    if b is None:
        return a
    return b if b["lnp"] < a["lnp"] else a


def _per_h(value: float) -> float:
    return round(value * HOUR, 3)


def _finding(key: tuple, items: list, best: dict, peers: tuple, own_errors: float):
    node, device, counter = key
    label = items[-1][2] or device
    window = best["window"]
    rate = best["errors"] / window
    fleet_errors = peers[1]
    ratio = rate / own_errors if own_errors > 0 else None
    what = LABELS.get(counter) or clean(counter, 60)  # a counter a node's record named
    text = f"{clean(label, 60)} {what} {_num(rate * HOUR)}/h over {window / HOUR:g} h"
    if ratio is not None:
        text += f", {_num(ratio)}x its 7-day baseline"
    else:
        text += ", none in the 7 days before"
    text += f", fleet median {_num(fleet_errors * HOUR)}/h"
    if best["basis"] == "published":
        text += f" (at or over {best['source']})"
    return {
        "node": node,
        "device": device,
        "label": clean(label, 60),
        "counter": counter,
        "window_h": window / HOUR,
        "episodes": best["episodes"],
        "errors": best["errors"],
        "rate_per_h": _per_h(rate),
        "own_per_h": _per_h(own_errors),
        "fleet_per_h": _per_h(fleet_errors),
        "expected": None if best["expected"] is None else round(best["expected"], 3),
        "ratio": None if ratio is None else round(ratio, 2),
        "lnp": best["lnp"],
        "p": math.exp(best["lnp"]),
        "basis": best["basis"],
        "last": items[-1][0],
        "evidence": f"{clean(node)}: {text}",
    }


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2g}"
