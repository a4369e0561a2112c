"""Rising error counters: the devices whose error rate rose against their own past and their
peers' (docs/trends.md). Pure: the rows queries.counter_rows reads go in, findings come out.

A series is one counter of one device (GPU, NVLink, HCA, port) of one node. The node records a
reading only when the counter grew (node/counters.py), each with its increase. The test counts
errors, the sum of the increases: unlike the readings with an increase (episodes), that sum does
not depend on how often the node is read, so a rise is found alike at 5-minute and hourly
health checks. Errors come in bursts (one marginal lane retrains and replays 50 times), so
counts are divided by how bursty the device is: the variance-to-mean ratio of its hourly
errors over its past (below), never below its class's median until it has OWN_SIZES bursts.

For each series and each recent window (6 h, 24 h and 3 days by default), with x its errors in
the window and x_b those in the 7 days before the longest window (a past that ends before any
window tested, so a rise of up to 3 days is never its own baseline; and its older half alone
where the newer half holds more than FACTOR times its errors, with the older half's dispersion
where it also holds FACTOR times its readings, so a rise that began in the week raises neither
the bar nor the dispersion):
- against its own past: under a steady rate each error falls in the window with probability
  window / (window + past); an exact binomial test of the two counts, both scaled by the
  dispersion, which carries the uncertainty of a past of few errors;
- against its peers: the median error rate over every device of the same kind on the nodes of
  the same GPU model (devices without a row count 0; at least PRIOR errors a week), a Poisson
  test of the scaled x against the window's scaled expectation;
- day-to-day variation: error rates follow the work a node runs. The variance of a device's
  daily errors is phi m + c m^2 (m the daily mean); c is the median over the class's devices
  (the fleet's when fewer than MIN_CLASS measured it), and the tests become beta-binomial and
  negative binomial: Poisson at a rate drawn from a gamma law of shape 1 / c a day.
The series is rising when the window holds at least `min_episodes` readings with errors (one
burst is never a trend), its errors are at least `factor` times both its own past's and its
peers' expectation, and both tests give P <= `alpha`.
Published limits are judged on error counts besides: DCGM's health watches warn at 8 PCIe
replays per minute (DCGM_LIMIT_MAX_PCIREPLAY_RATE) and at 100 NVLink CRC errors per second
(DCGM_LIMIT_MAX_NVLINK_CRC_ERROR), over the shortest window here.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
from collections.abc import Iterator

from slurmhealth.core.result import clean
from slurmhealth.fleet.policy import ln_poisson_sf

HOUR = 3600.0
DAY = 86400.0
WINDOWS = (6 * HOUR, DAY, 3 * DAY)  # recent windows tested (seconds)
BASELINE = 7 * DAY  # the series' own past, before the longest window
FACTOR = 2.0  # "a rate that doubled"
MIN_EPISODES = 4  # fewer readings with errors in a window are never a trend
ALPHA = 1e-7  # per series, window and sweep (docs/trends.md: what it costs in false flags)
MIN_SIZES = 5  # baseline bursts that measure a device's own dispersion...
OWN_SIZES = 30  # ...never below its class's median until it has this many
MIN_SPREAD = 14  # a week's readings with errors that measure day-to-day variation
MIN_CLASS = 10  # devices that measured day-to-day variation: a class's own median
MIN_C = 1e-3  # day-to-day variation below this is none (a sd of 3% a day)
PRIOR = 0.5  # errors (hours with errors) a week: the least rate a device's peers are taken to have
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
    "c2c_crc": "C2C CRC errors",
    "c2c_replay": "C2C replays",
    "c2c_replay_b2b": "C2C back-to-back replays",
    "symbol_error": "IB symbol errors",
    "link_error_recovery": "IB link recoveries",
    "port_rcv_errors": "IB receive errors",
    "link_downed": "IB link downs",
    "local_link_integrity_errors": "IB link integrity errors",
    "excessive_buffer_overrun_errors": "IB buffer overruns",
}


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
    baseline, now]; a row whose delta is None (a first reading, a reset) counts nowhere. models:
    {node: GPU model} of every node of the fleet, those without a row included (the fleet's
    median counts them as 0). Windows and baseline are whole hours."""
    found = summaries(rows, now, hours_of(windows, baseline))
    return judged(found, models, windows, (factor, min_episodes, alpha), baseline)


def judged(series: list, models: dict, windows: tuple, limits: tuple, baseline: float) -> list:
    """rising's findings from the series' hourly summaries (summaries, or the same read in SQL:
    queries.counter_series); limits: (factor, min_episodes, alpha)."""
    factor, min_episodes, alpha = limits
    width = int(round(baseline / HOUR))
    with no_gc():  # many small objects at 10,000 nodes, none of them cyclic
        past = {s[:3]: _past(s[6], width, baseline) for s in series}
        classes = _classes(past, models, baseline)
        bounds = (factor, min_episodes, math.log(alpha))
        found = []
        for s in series:
            key = s[:3]
            group = classes.get((models.get(key[0], ""), kind_of(key[1]), key[2]), _NO_CLASS)
            best = _best(key[2], s[5], past[key], windows, bounds + (group,))
            if best is not None:
                found.append(_finding(s, best, group["errors"], past[key]["rate"]))
    return sorted(found, key=lambda f: (f["lnp"], f["node"], f["device"], f["counter"]))


def hours_of(windows: tuple, baseline: float) -> tuple:
    """The hours (counted back from now, the last hour 0) a series is summed over: (each
    window's end, the baseline's first hour, its end, its older half's first hour, each of its
    days' first hour and the baseline's end). The baseline starts where the longest window
    ends."""
    first = int(round(max(windows) / HOUR))
    width = int(round(baseline / HOUR))
    days = max(1, width // 24)
    return (
        tuple(int(round(w / HOUR)) for w in windows),
        first,
        first + width,
        first + width // 2,
        tuple(first + 24 * d for d in range(days)) + (first + width,),
    )


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off for a while, then as it was: it walks every live
    object each time enough new ones were made, which a sweep's rows, series and per-node
    objects (none of them in a cycle) make a million times over; at 100,000 nodes it was a
    quarter of the report's own CPU (docs/benchmarks.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def summaries(rows: list, now: float, hours: tuple) -> list:
    """[(node, device, counter, last time, last label, recent, past)]: each series' hourly
    summary (hours: hours_of) from its rows, in Python; queries.counter_series reads the same in
    SQL. An hour is int((now - time) // HOUR); a row counts when its delta is above 0 and its
    time in (now - the baseline's end in hours, now].
    - recent: (readings with errors, errors, the most errors in one hour) of each window;
    - past: (errors, readings with errors, both in the older half, the sums of the squares
      of the hourly errors and readings, both in the older half, (errors of each day)) over
      the baseline."""
    with no_gc():
        series = _series(rows, now, now - hours[2] * HOUR)
        return [
            key + (entry[1], entry[2], _recent(entry[0], hours[0]), _sums(entry[0], hours))
            for key, entry in series.items()
        ]


def _series(rows: list, now: float, start: float) -> dict:
    """{(node, device, counter): [hours, last time, last label]} of the rows that count:
    hours {hours before now (0: the last hour): [errors, readings with errors]}."""
    series: dict = {}
    for node, device, counter, t, delta, label in rows:
        if counter in NOT_TRENDS or delta is None or delta <= 0 or not start < t <= now:
            continue
        key = (node, device, counter)
        entry = series.get(key)
        if entry is None:
            entry = series[key] = [{}, t, label]
        got = entry[0].setdefault(int((now - t) // HOUR), [0.0, 0])
        got[0] += delta
        got[1] += 1
        entry[1], entry[2] = t, label
    return series


def _recent(hours: dict, ends: tuple) -> tuple:
    """((readings with errors, errors, the most errors in one hour) of the hours before each
    end)."""
    out = []
    for end in ends:
        last = [v for h, v in hours.items() if h < end]
        worst = max((v[0] for v in last), default=0.0)
        out.append((sum(v[1] for v in last), sum((v[0] for v in last), 0.0), worst))
    return tuple(out)


def _sums(hours: dict, spans: tuple) -> tuple:
    """A series' baseline sums (summaries: past) over the hours [first, end)."""
    _, first, end, newer, days = spans
    errors = older = squares = older_squares = 0.0
    readings = older_readings = readings_squares = older_readings_squares = 0
    per_day = [0.0] * (len(days) - 1)
    for h, (e, r) in hours.items():
        if not first <= h < end:
            continue
        errors += e
        readings += r
        squares += e * e
        readings_squares += r * r
        if h >= newer:
            older += e
            older_readings += r
            older_squares += e * e
            older_readings_squares += r * r
        per_day[min(len(per_day) - 1, (h - first) // 24)] += e
    return (
        (errors, readings, older, older_readings, squares, readings_squares)
        + (older_squares, older_readings_squares, tuple(per_day))
    )


def _best(counter: str, recent: tuple, past: dict, windows: tuple, limits: tuple):
    """The series' most significant window (a trend, or a published limit reached), or None:
    recent holds each window's (readings with errors, errors, worst hour), the longest's
    readings decide whether any window holds enough."""
    least, group = limits[1], limits[3]
    best = None
    if max(got[0] for got in recent) >= least:  # else no window holds enough readings
        own = dict(past, phi=_phi(past, group, "phi"), phi_r=_phi(past, group, "phi_r"))
        for window, got in zip(windows, recent):
            best = _better(best, _judge(got, window, own, limits))
    for window, got in zip(windows, recent) if counter in PUBLISHED else ():
        best = _better(best, _published(counter, got[:2], window))
    return best


_NO_CLASS = {"errors": 0.0, "readings": 0.0, "phi": 1.0, "phi_r": 1.0, "c": 0.0}


def _past(sums: tuple, width: int, baseline: float) -> dict:
    """A series' baseline from its sums (summaries: past), the `baseline` of `width` hours
    ending where the longest window starts: {errors, readings (with errors), span (the seconds
    they are over), rate (errors per s), phi and phi_r (the variance-to-mean ratio of its
    hourly errors and readings over that span, at least 1; None from fewer than MIN_SIZES
    readings), c (day-to-day variation beyond phi over the whole baseline, None from fewer than
    MIN_SPREAD readings), seen (the readings of that span)}.

    Where the newer half holds more than FACTOR times the older half's errors, a rise may have
    begun inside the baseline; it must not raise the bar it is judged by, so the counts are the
    older half's. Where the newer half also holds more than FACTOR times its readings with
    errors (the device errs more often, not only in a few bigger bursts), the dispersions are
    the older half's too: hours at two rates, and the bigger bursts of a rise, raise a week's
    variance-to-mean ratio (up to threefold on the validation's fleets) and with it the bar. A
    few large bursts alone, which a heavy-tailed device has now and then, leave the week's
    dispersion, which saw them. The device's days still count towards its class's day-to-day
    variation: a few rising devices do not move the class's median, and leaving out every
    device whose newer half was busier would leave out the variation itself."""
    errors, readings, older, older_readings, squares, readings_squares = sums[:6]
    older_squares, older_readings_squares, days = sums[6:]
    whole = _dispersion(errors, squares, width) if readings >= MIN_SIZES else None
    c = _day_variation(list(days), whole) if readings >= MIN_SPREAD and whole else None
    out = {
        "errors": errors,
        "readings": readings,
        "span": baseline,
        "rate": errors / baseline,
        "phi": whole,
        "phi_r": _dispersion(readings, readings_squares, width) if whole else None,
        "c": c,
        "seen": readings,
    }
    rose = errors - older > FACTOR * max(older, 1.0)
    if rose:
        out.update(errors=older, readings=older_readings, span=baseline / 2)
        out["rate"] = older / (baseline / 2)
    if rose and readings - older_readings > FACTOR * max(older_readings, 1):
        half, enough = width - width // 2, older_readings >= MIN_SIZES
        out["phi"] = _dispersion(older, older_squares, half) if enough else None
        out["phi_r"] = _dispersion(older_readings, older_readings_squares, half) if enough else None
        out["seen"] = older_readings
    return out


def _dispersion(total: float, squares: float, hours: int) -> float:
    """Variance over mean of hourly counts (their sum and the sum of their squares; the hours
    without a reading are 0), at least 1: a sum of bursts varies by about its bursts' sum(x^2)
    / sum(x)."""
    if total <= 0:
        return 1.0
    mean = total / hours
    return max(1.0, (squares / hours - mean * mean) / mean)


def _day_variation(days: list, phi: float) -> float:
    """c in variance = phi m + c m^2 of a series' daily errors: an unbiased estimate, so
    negative at times (a median over devices is taken, then floored at 0)."""
    m = sum(days) / len(days)
    if m <= 0 or len(days) < 2:
        return 0.0
    variance = sum((d - m) ** 2 for d in days) / (len(days) - 1)
    return (variance - phi * m) / (m * m)


def _phi(own: dict, group: dict, key: str) -> float:
    """A dispersion a series is judged with: its own once it has OWN_SIZES readings with
    errors, else the larger of its own and its class's median (a quiet device's few bursts
    say little of its tail)."""
    if own[key] is None:
        return group[key]
    return own[key] if own["seen"] >= OWN_SIZES else max(own[key], group[key])


def kind_of(device: str) -> str:
    """ "gpu:0000:18:00.0" -> "gpu": the kind of device peers are compared by."""
    return device.partition(":")[0]


def _classes(past: dict, models: dict, baseline: float) -> dict:
    """{(model, kind, counter): {errors, readings, phi, phi_r, c}}: the median rates (per s)
    of errors and of readings with errors over every device of that kind on the model's nodes
    (devices that recorded nothing count 0; a node's device count is the most that recorded
    the counter on any node of the model: 8 GPUs, 8 ports), and the medians of the
    dispersions its devices measured (1 and 0 when none did)."""
    nodes_of: dict = {}
    for node, model in models.items():
        nodes_of.setdefault(model, set()).add(node)
    groups: dict = {}
    for (node, device, counter), own in past.items():
        key = (models.get(node, ""), kind_of(device), counter)
        groups.setdefault(key, {}).setdefault(node, []).append(own)
    every = [o["c"] for o in past.values() if o["c"] is not None]
    fleet_c = max(0.0, statistics.median(every)) if every else 0.0
    out = {}
    for key, per_node in groups.items():
        width = max(len(v) for v in per_node.values())
        total = max(len(nodes_of.get(key[0], ())), len(per_node)) * width
        owns = [o for items in per_node.values() for o in items]
        zeros = [0.0] * max(0, total - len(owns))
        out[key] = {
            "errors": statistics.median([o["errors"] / o["span"] for o in owns] + zeros),
            "readings": statistics.median([o["readings"] / o["span"] for o in owns] + zeros),
            "phi": _median([o["phi"] for o in owns], 1.0),
            "phi_r": _median([o["phi_r"] for o in owns], 1.0),
            "c": _day_spread([o["c"] for o in owns], fleet_c),
        }
    return out


def _day_spread(values: list, fleet: float) -> float:
    """A class's day-to-day variation: the median of its devices' estimates once MIN_CLASS
    devices measured it, else the fleet's over every counter (7 days of a few devices say
    little)."""
    known = [v for v in values if v is not None]
    return max(0.0, statistics.median(known)) if len(known) >= MIN_CLASS else fleet


def _median(values: list, none: float) -> float:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else none


def _judge(got: tuple, window: float, own: dict, limits: tuple) -> dict | None:
    """The window's finding when it is a trend against both the past and the peers, else None.

    Two counts are tested, and either may carry the rise: the readings with errors (how often
    the device errs, blind to burst sizes; at an hourly cadence it saturates at one an hour),
    and the errors without the window's worst hour (how much it errs: a device that errs at
    every reading already, bursts that grow). Each is scaled by its own dispersion, and
    leaving out the worst hour keeps one large burst from ever being a trend."""
    factor, least, ln_alpha, group = limits
    readings, errors, worst = got
    past, peers = window * own["rate"], window * max(group["errors"], PRIOR / BASELINE)
    if readings < least or errors < factor * max(past, peers):
        return None
    shape = _shape(window, group["c"])
    share = window / (window + own["span"])
    ln_errors = _ln_p(errors - worst, own["errors"], (past, peers), own["phi"], shape, share)
    peers_r = window * max(group["readings"], PRIOR / BASELINE)
    past_r = window * own["readings"] / own["span"]
    ln_readings = _ln_p(readings, own["readings"], (past_r, peers_r), own["phi_r"], shape, share)
    lnp = min(ln_errors, ln_readings)
    if lnp > ln_alpha:
        return None
    return {
        "window": window,
        "episodes": readings,
        "errors": errors,
        "expected": max(past, peers),
        "lnp": lnp,
        "basis": "trend",
    }


def _shape(window: float, c: float) -> float | None:
    """The shape of the gamma law of the window's rate against its mean, from day-to-day
    variation c (variance c m^2 of a day whose mean is m): one day's 1 / c, and the days' sum
    for a longer window (days vary apart); None when the days do not vary (Poisson)."""
    if c < MIN_C:
        return None
    return max(1.0, window / DAY) / c


def _ln_p(
    count: float, before: float, expected: tuple, phi: float, shape: float | None, share: float
) -> float:
    """ln P of `count` in the window against its own past (`before` in the baseline) and
    against its peers' expectation: the larger of the two.

    Counts are in bursts (divided by the dispersion phi). Against the past: given the window's
    and the past's bursts together, the window's share is binomial (a steady rate) or, when days
    vary, beta-binomial: each is Poisson at a rate drawn from a gamma law, and given their sum
    the window's is beta-binomial with the two laws' shapes, the past's set so that its mean
    share is the window's share of the time. Against the peers: Poisson, or negative binomial
    (Poisson at a gamma rate) when days vary. The gamma tail is what day-to-day variation
    allows: a busy week doubles a rate, it does not make it tenfold."""
    _past, peers = expected
    k, n = round(count / phi), round((count + before) / phi)
    if shape is None:
        own = ln_binomial_sf(k, n, share)
        fleet = ln_poisson_sf(count / phi, peers / phi)
    else:
        own = ln_beta_binomial_sf(k, n, shape, shape * (1 - share) / share)
        fleet = ln_neg_binomial_sf(k, peers / phi, shape)
    return max(own, fleet)


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
    return _ln_sum(terms)


def _ln_sum(terms: list) -> float:
    top = max(terms)
    return min(0.0, top + math.log(sum(math.exp(t - top) for t in terms)))


def ln_beta_binomial_sf(k: int, n: int, a: float, b: float) -> float:
    """ln P(X >= k) for X ~ BetaBinomial(n, a, b): binomial with its p drawn from Beta(a, b)."""
    if k <= 0:
        return 0.0
    if k > n:
        return -math.inf
    front = math.lgamma(n + 1) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front -= math.lgamma(n + a + b)
    return _ln_sum(
        [
            front
            + math.lgamma(i + a)
            + math.lgamma(n - i + b)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            for i in range(k, n + 1)
        ]
    )


def ln_neg_binomial_sf(k: int, mean: float, shape: float) -> float:
    """ln P(X >= k) for X negative binomial with that mean: Poisson at a rate drawn from a gamma
    law of that shape. The terms past the mode fall off geometrically; summed until they add
    nothing."""
    if k <= 0:
        return 0.0
    if mean <= 0:
        return -math.inf
    q = mean / (mean + shape)  # the chance of one more
    front = shape * math.log1p(-q) - math.lgamma(shape)
    terms, i = [], k
    while True:
        terms.append(front + math.lgamma(i + shape) - math.lgamma(i + 1) + i * math.log(q))
        if i > k + 10 and terms[-1] < max(terms) - 40:
            return _ln_sum(terms)
        i += 1


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


def _finding(series: tuple, best: dict, fleet_errors: float, own_errors: float):
    node, device, counter, last, label = series[:5]
    label = label or device
    window = best["window"]
    rate = best["errors"] / window
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
        "last": last,
        "evidence": f"{clean(node)}: {text}",
    }


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2g}"
