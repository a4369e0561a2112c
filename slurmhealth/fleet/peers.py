"""Slow nodes against their peers: the nodes whose diagnoses measure slower than the other nodes
of the same hardware class (docs/diagnose.md, "Slow nodes against their peers").

Pure: the rows queries.diag_figures reads go in, findings come out. Per hardware class, probe
and figure, a unit (GPU, port) has one reading a UTC day, its latest, put on the class's scale
by that day's class-wide level (a rollout or a busy fabric moves every node alike); a unit is
summarised by the median of its latest days, a node by its worst unit, and that is compared
with the median of the class's other nodes; of the other nodes of its peer group where the
class's nodes fall into well-separated groups (a slower variant recorded under the same GPU
model: _groups). Slow only on persistent evidence: the unit slow on
its latest days, at least three in a row (or all but one of four or more), and more of them
than chance makes likely, chance being the class's rate of slow days, or the node's own where
it is noisier. One or two one-off low readings, or a bad hour run again, never make a node
slow.
"""

from __future__ import annotations

import bisect
import math
import statistics

from slurmhealth.core.result import clean, counted

# The figures compared, and which way is better: True for a throughput, False for a latency.
# Everything else node/diag records is a count (wrong elements, mismatches, matmul runs, DCGM
# tests) or a size (bytes, max_bytes, memory_gib): never compared, a count is no speed.
HIGHER_IS_BETTER = {
    "busbw_gbps": True,  # nccl: all_reduce_perf bus bandwidth at the largest size
    "avg_busbw_gbps": True,  # nccl: its average over the sizes
    "bw_avg_gbps": True,  # ib_write_bw: RDMA write bandwidth, per port
    "matmul_tflops": True,  # cuda: the timed fixed-size matmul, per GPU
    "memory_write_gbps": True,  # cuda: the pattern test's write rate, per GPU
    "hbm_gbps": True,  # cuda: device-to-device copy, bytes read and written, per GPU
    "h2d_gbps": True,  # cuda: pinned host buffer to the GPU, per GPU
    "d2h_gbps": True,  # cuda: the GPU to the pinned host buffer, per GPU
    "p2p_gbps": True,  # cuda: copy to the next GPU, per GPU
    "typical_usec": False,  # ib_read_lat: the median latency, per port
    "avg_usec": False,  # ib_read_lat: the mean (a duration run reports only this)
    # p99_usec is left out: a loopback tail is the host's interrupts and scheduling as much as
    # the port's, and a slow port already shows in its typical latency.
}

# This project's defaults; each is argued in docs/diagnose.md.
DAY = 86400.0
WINDOW = 7 * DAY  # the diagnoses compared: a week (`slurmhealth slow`, the report)
MARGIN = 0.05  # the share worse than the peers that matters (as SuperBench's variance rule)
MIN_PEERS = 5  # a median of fewer others is no baseline
Z = 4.0  # robust spreads below the peers' median
RECENT = 5  # a unit's figure: the median of its latest days diagnosed
MIN_SAMPLES = 3  # slow days, at least: more than a noisy neighbour's day or two
ALPHA = 1e-4  # findings by chance, per class, figure and sweep, at most
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data
# The smallest spread, as a share of the median: a simulated or perfectly uniform class has a
# MAD near 0, and then any difference would be z spreads away.
SPREAD_FLOOR = 0.01
LEVEL_NODES = 500  # a day's class level: of this many to twice as many nodes (_day_scale)
# Peer groups (_groups): a class splits where its nodes' typical levels leave a gap this many
# robust spreads of either side wide, each side this share of the class at least (and
# min_peers + 1 nodes): a few slow nodes, or the share one bad change slowed, never make a
# group of their own.
GROUP_GAP = 2.0
GROUP_SHARE = 0.2
# The figures measured on each GPU, which a slower variant of the GPU moves together (its
# power cap or clock): a class's variant groups are taken from the one of them where the
# variant stands clearest (_variants) and apply to all of them.
PER_GPU = frozenset(
    ("matmul_tflops", "memory_write_gbps", "hbm_gbps", "h2d_gbps", "d2h_gbps", "p2p_gbps")
)


def slow(
    rows: list,
    margin: float = MARGIN,
    min_peers: int = MIN_PEERS,
    min_samples: int = MIN_SAMPLES,
    z: float = Z,
    higher_is_better: dict | None = None,
) -> list:
    """[{node, gpu_model, probe, figure, unit, value, peer_median, peers, deficit, peer_group,
    peer_groups, samples, slow_samples, evidence}] of every node slower than its peers on a
    figure, worst first.

    rows: (node, time, gpu_model, probe, unit, figure, value) as queries.diag_figures reads
    them, in time order; gpu_model is the hardware class. value (the unit's median over its
    latest RECENT days) and peer_median are in the figure's own unit, on the class's scale of
    the window (_day_scale); deficit is the share worse than the peers' median (below it for
    a throughput, above it for a latency); peers the other nodes of its peer group, that
    group peer_group of peer_groups, slowest first (1 of 1 where the class does not split:
    _groups); unit the node's worst GPU or port ("node" for a node-wide figure); samples the
    unit's latest days judged as evidence, slow_samples the slow ones among them."""
    better = HIGHER_IS_BETTER if higher_is_better is None else higher_is_better
    limits = (margin, min_peers, min_samples, z)
    prepared = {
        key: _prepare(nodes, min_peers)
        for key, nodes in _scores(rows, better).items()
        if len(nodes) - 1 >= min_peers
    }
    variants = _variants(prepared, min_peers)
    figures = {
        key: _figure(ready, limits, variants.get(key[0]) if key[2] in PER_GPU else None)
        for key, ready in prepared.items()
    }
    noise: dict = {}  # (class, node) -> the node's own rate of slow days (_own_rate)
    found = []
    for key, figure in sorted(figures.items()):
        suspects = _suspects(figure, limits)
        units, chance = _class_rate(figure) if suspects else (0, 0.0)
        for node, unit, mine, peer, cut, peers in suspects:
            if (key[0], node) not in noise:
                noise[(key[0], node)] = _own_rate(figures, key[0], node)
            days = _scaled(figure["nodes"][node][unit], figure["scale"])
            rate = max(chance, noise[(key[0], node)])
            judged = _persistent(days, cut, min_samples, units, rate)
            if judged:
                group = (figure["group"][node], len(figure["groups"]))
                evidence = (unit, mine, peer, peers, group, *judged)
                found.append(_finding(key, node, evidence, better[key[2]]))
    return sorted(found, key=lambda f: (-f["deficit"], f["node"], f["probe"], f["figure"]))


def _scores(rows: list, better: dict) -> dict:
    """{(gpu_model, probe, figure): {node: {unit: {UTC day: score}}}} of the compared figures,
    days in time order (as the rows). A day's score is the unit's latest reading that day: a
    diagnosis run again the same day replaces the doubted one, and the evidence is of days,
    not of runs (a bad hour diagnosed three times is one bad day).

    A score is the value signed so that higher is better (a latency negated): one rule for
    both directions below."""
    out: dict = {}
    last = None
    mine: dict = {}  # this diagnosis's {(probe, figure): units}, set by its first row
    for node, when, model, probe, unit, figure, value in rows:
        higher = better.get(figure)
        if higher is None:
            continue
        if (node, when) != last:  # a diagnosis's rows come together: its day once
            last, day, mine = (node, when), int(when // DAY), {}
        units = mine.get((probe, figure))
        if units is None:  # .get first: setdefault would build dicts for every row
            units = out.setdefault((model, probe, figure), {}).setdefault(node, {})
            mine[(probe, figure)] = units
        days = units.get(unit)
        if days is None:
            units[unit] = {day: value if higher else -value}
        else:
            days[day] = value if higher else -value
    return out


def _day_scale(nodes: dict, min_peers: int) -> dict:
    """{UTC day: factor} that puts a day's scores on the class's scale of the window: the
    median of the day levels over that day's level, a day's level the median of the scores of
    every unit diagnosed that day. A class-wide change (a driver or NCCL rollout, a busy
    fabric) moves every node's scores alike: a slow node stays slow across it, and no node is
    slow for being diagnosed on its other side. A day of fewer than min_peers + 1 nodes keeps
    its scores as they are: its median is no class level. In a class of 2 x LEVEL_NODES
    nodes or more, the levels are of every k-th node, LEVEL_NODES to twice that many
    (thousands of readings a day: the median is as good, and a large class costs less)."""
    names = list(nodes)
    level: dict = {}
    present: dict = {}
    for node in names[:: max(1, len(names) // LEVEL_NODES)]:
        seen: set = set()
        for days in nodes[node].values():
            for day, score in days.items():
                level.setdefault(day, []).append(score)
            seen.update(days)
        for day in seen:
            present[day] = present.get(day, 0) + 1
    level = {d: statistics.median(s) for d, s in level.items() if present[d] > min_peers}
    middle = statistics.median(level.values()) if level else 0.0
    return {d: middle / got for d, got in level.items() if got and middle / got > 0}


def _scaled(days: dict, scale: dict) -> list:
    """A unit's scores of its days, oldest first, on the class's scale."""
    return [s * scale.get(d, 1.0) for d, s in days.items()]


def _prepare(nodes: dict, min_peers: int) -> dict:
    """One class, probe and figure of the window before its peer groups: {nodes (as _scores
    gives them), scale (_day_scale's), worst ({node: (its figure, its worst unit)}), levels
    ({node: the median of its units' figures})}."""
    scale = _day_scale(nodes, min_peers)
    recent = {n: {u: _recent(d, scale) for u, d in units.items()} for n, units in nodes.items()}
    # Each unit's median first, then the worst of them: the worst of 8 GPUs in each run and
    # then their median would pick each run's noise, and set a healthy node's figure (and so
    # the peers' median) well below its typical GPU.
    worst = {node: min((mine, u) for u, mine in units.items()) for node, units in recent.items()}
    levels = {node: statistics.median(units.values()) for node, units in recent.items()}
    return {"nodes": nodes, "scale": scale, "worst": worst, "levels": levels}


def _figure(ready: dict, limits: tuple, variants: list | None = None) -> dict:
    """_prepare's figure with its peer groups: adds group ({node: its peer group's index,
    slowest first}) and groups ([{members, ordered (their figures, sorted), cut (the group's
    median node's figure less the margin or z spreads: a slow day by the group's measure)}]);
    one group where the class does not split. The groups are the class's variants where
    given (a GPU figure: _variants), else this figure's own (_groups)."""
    levels, worst = ready["levels"], ready["worst"]
    members = _as_variants(levels, variants, limits[1]) if variants else None
    groups = []
    for group in members or _groups(levels, limits[1]):
        ordered = sorted(worst[node][0] for node in group)
        centre = statistics.median(ordered)
        cut = centre - _gap(ordered, centre, limits)
        groups.append({"members": group, "ordered": ordered, "cut": cut})
    group = {node: i for i, g in enumerate(groups) for node in g["members"]}
    return {**ready, "group": group, "groups": groups}


def _variants(prepared: dict, min_peers: int) -> dict:
    """{gpu_model: [set of nodes of each variant]} of the classes whose nodes split into
    groups (_groups) on one of their GPU figures (PER_GPU): the split of the figure where it
    is clearest (the widest gap in robust spreads). A variant is a property of the node, not
    of a figure: a power-capped part is 10% slower on its matmul and 3% on its copies, where
    the part-to-part spread alone would not split the class, so a variant node's slowest GPU
    would be named against the whole class."""
    best: dict = {}
    for (model, _probe, name), ready in prepared.items():
        if name not in PER_GPU:
            continue
        groups, clarity = _grouped(ready["levels"], min_peers)
        if len(groups) > 1 and clarity > best.get(model, (0.0, None))[0]:
            best[model] = (clarity, groups)
    return {model: [set(g) for g in groups] for model, (_, groups) in best.items()}


def _as_variants(levels: dict, variants: list, min_peers: int) -> list | None:
    """The nodes of `levels` in the class's variant groups, slowest first by this figure's
    group medians; a node the variants do not know joins the group whose median level is
    nearest its own. None where a group would have fewer than min_peers + 1 nodes here (a
    figure few nodes measured): then the figure's own groups."""
    known = [[n for n in levels if n in variant] for variant in variants]
    if any(len(g) < min_peers + 1 for g in known):
        return None
    middles = [statistics.median(levels[n] for n in g) for g in known]
    for node, level in levels.items():
        if not any(node in variant for variant in variants):
            nearest = min(range(len(known)), key=lambda i: abs(middles[i] - level))
            known[nearest].append(node)
    order = sorted(range(len(known)), key=middles.__getitem__)
    return [known[i] for i in order]


def _groups(levels: dict, min_peers: int) -> list:
    """[the nodes of each peer group], slowest first: the class split where its nodes' levels
    (a node's level: the median of its units' figures, which one slow part hardly moves) fall
    into well-separated groups, as a slower variant of the GPU recorded under the same model
    name does (a power cap, a lower clock). The split is at the widest gap between neighbours
    in level order that leaves each side max(min_peers + 1, GROUP_SHARE of the class) nodes,
    when that gap is more than GROUP_GAP robust spreads of each side and more than
    SPREAD_FLOOR of the level (levels nearer than the part-to-part spread are no two
    variants, and a figure read in coarse steps is no set of groups); each side is split
    again by the same rule. The sizes keep a few slow nodes, or a small share slowed by one bad
    change, from being a group: they stay judged against the class."""
    return _grouped(levels, min_peers)[0]


def _grouped(levels: dict, min_peers: int) -> tuple:
    """(_groups, how clear the first split is: its gap over the least gap that splits; 0.0
    where the class does not split)."""
    ordered = sorted(levels, key=levels.__getitem__)
    least = max(min_peers + 1, math.ceil(GROUP_SHARE * len(ordered)))
    return _split(ordered, [levels[node] for node in ordered], least)


def _split(names: list, values: list, least: int) -> tuple:
    """_grouped of the nodes `names`, their levels `values` (sorted)."""
    if len(values) < 2 * least:
        return [names], 0.0
    at = max(range(least, len(values) - least + 1), key=lambda i: values[i] - values[i - 1])
    wide = max(GROUP_GAP * _mad(values[:at]), GROUP_GAP * _mad(values[at:]))
    needed = max(wide, SPREAD_FLOOR * abs(values[at]))
    gap = values[at] - values[at - 1]
    if gap <= needed:
        return [names], 0.0
    low, high = _split(names[:at], values[:at], least), _split(names[at:], values[at:], least)
    return low[0] + high[0], gap / needed if needed else math.inf


def _mad(values: list) -> float:
    """The values' robust spread: their scaled MAD about their median (no floor: a group of
    near-identical levels is as much a group)."""
    centre = statistics.median(values)
    return MAD_SCALE * statistics.median(abs(v - centre) for v in values)


def _recent(days: dict, scale: dict) -> float:
    """A unit's figure: the median of its latest RECENT days on the class's scale (sorted by
    hand: it runs once per unit, and statistics.median costs more)."""
    recent = sorted([s * scale.get(d, 1.0) for d, s in list(days.items())[-RECENT:]])
    half = len(recent) // 2
    return recent[half] if len(recent) % 2 else (recent[half - 1] + recent[half]) / 2


def _suspects(figure: dict, limits: tuple) -> list:
    """[(node, unit, its figure, the peers' median, cut, peers)] of the nodes whose figure is
    worse than the median of the other nodes of its peer group by more than the margin and
    more than z robust spreads of theirs; cut is that median less the larger of the two."""
    worst, groups = figure["worst"], figure["groups"]
    out = []
    for node, (mine, unit) in worst.items():
        group = groups[figure["group"][node]]
        peer = _median_without(group["ordered"], mine)
        if peer == 0 or (peer - mine) / abs(peer) <= limits[0]:
            continue  # most nodes stop here, before the spread is computed
        others = [worst[n][0] for n in group["members"] if n != node]
        cut = peer - _gap(others, peer, limits)
        if mine < cut:
            out.append((node, unit, mine, peer, cut, len(others)))
    return out


def _persistent(days: list, cut: float, min_samples: int, units: int, chance: float) -> tuple:
    """(n, k): the unit's latest n days, k of them slow (below `cut`), when they are
    persistent evidence; else (). The latest days since the last one not slow, at least
    min_samples of them; or since the one before that, at least min_samples + 1 slow (a day
    that was not slow is evidence against, one more slow one answers it). And more than
    chance: k slow of n are chance when units x P(Binomial(n, chance) >= k) > ALPHA, a sign
    test for all the class's units at once (Bonferroni)."""
    good = [i for i, score in enumerate(days) if score >= cut]  # the days not slow
    for misses in range(min(2, len(good) + 1)):
        n = len(days) - (good[-1 - misses] + 1 if len(good) > misses else 0)
        k = n - misses
        if k >= min_samples + misses and units * _tail(n, k, chance) <= ALPHA:
            return n, k
    return ()


def _class_rate(figure: dict) -> tuple:
    """(units, rate): the class's units, and the share of slow days (below the cut of the
    node's peer group) among the nodes whose figure is not past it: how often a day of this
    class is that bad by chance (a noisy neighbour, a thermal event, a heavy-tailed figure).
    The slow nodes are left out, as from a baseline: their slow days are no chance. Jeffreys'
    estimate, (slow + 1/2) / (days + 1): a class with no slow day yet is not one where they
    never happen."""
    scale = figure["scale"]
    bad = days = units = 0
    for node, mine in figure["nodes"].items():
        units += len(mine)
        cut = _cut(figure, node)
        if figure["worst"][node][0] >= cut:
            for scores in mine.values():
                days += len(scores)
                bad += sum(1 for s in _scaled(scores, scale) if s < cut)
    return units, (bad + 0.5) / (days + 1)


def _own_rate(figures: dict, model: str, node: str) -> float:
    """The node's own rate of slow days: on every figure of its class, the days of its GPUs,
    ports and node-wide figures whose own figure is not slow, slow by the cut of its peer
    group on that figure, over all those days. A node whose parts read slow now and then,
    each part's median as its peers', is noisy: a run of slow days is less telling there than
    on a quiet node. A part slow throughout, or the whole node, is no noise and counts
    nothing."""
    bad = days = 0
    for (of, _probe, _name), figure in figures.items():
        units = figure["nodes"].get(node) if of == model else None
        cut = _cut(figure, node) if units else 0.0
        for scores in (units or {}).values():
            if _recent(scores, figure["scale"]) >= cut:
                days += len(scores)
                bad += sum(1 for s in _scaled(scores, figure["scale"]) if s < cut)
    return bad / days if days else 0.0


def _cut(figure: dict, node: str) -> float:
    """A slow day of the node by its peer group's measure (_figure)."""
    return figure["groups"][figure["group"][node]]["cut"]


def _tail(n: int, k: int, p: float) -> float:
    """P(Binomial(n, p) >= k)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _gap(values: list, centre: float, limits: tuple) -> float:
    """How far below `centre` (the peers' median) is slow: more than the margin and more than
    z robust spreads of the peers' figures."""
    margin, _min_peers, _min_samples, z = limits
    return max(margin * abs(centre), z * _spread(values, centre))


def _spread(values: list, centre: float) -> float:
    """The peers' robust spread: their scaled MAD about `centre` (their median), at least
    SPREAD_FLOOR of it."""
    mad = statistics.median(abs(v - centre) for v in values)
    return max(MAD_SCALE * mad, SPREAD_FLOOR * abs(centre))


def _median_without(ordered: list, value: float) -> float:
    """The median of a sorted list with one occurrence of `value` taken out: O(1) after the
    search, so every node of a large class gets its own leave-one-out baseline."""
    gone = bisect.bisect_left(ordered, value)
    rest = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < gone else k + 1]

    return (at((rest - 1) // 2) + at(rest // 2)) / 2


def _finding(key: tuple, node: str, found: tuple, higher: bool) -> dict:
    """One slow node on one figure; found: (unit, its score, the peers' median score, peers,
    (its peer group's index, slowest first, and how many), the unit's latest days judged, the
    slow ones among them)."""
    model, probe, figure = key
    unit, mine, peer, peers, (group, groups), samples, worse = found
    sign = 1 if higher else -1
    value, median = sign * mine, sign * peer
    deficit = (peer - mine) / abs(peer)
    where = "" if unit == "node" else f" on {unit}"
    side = "below" if higher else "above"
    line = (
        f"{node}: {probe} {figure} {_num(value)}{where} (slow on {worse} of its latest "
        f"{counted(samples, 'day')}), {deficit:.0%} {side} the median {_num(median)} of "
        f"{counted(peers, 'peer')} ({model or 'no GPU model recorded'}"
        f"{_group_words(group, groups)})"
    )
    return {
        "node": node,
        "gpu_model": model,
        "probe": probe,
        "figure": figure,
        "unit": unit,
        "value": round(value, 3),
        "peer_median": round(median, 3),
        "peers": peers,
        "deficit": round(deficit, 4),
        "peer_group": group + 1,
        "peer_groups": groups,
        "samples": samples,
        "slow_samples": worse,
        "evidence": clean(line, 300),
    }


def _group_words(group: int, groups: int) -> str:
    """Which peer group of its class the node was judged in, where the class split."""
    if groups == 1:
        return ""
    if groups == 2:
        return f", the {('slower', 'faster')[group]} group of 2"
    return f", group {group + 1} of {groups}, slowest first"


def _num(value: float) -> str:
    """A figure as an admin reads it: 428, 46.2, 2.13."""
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f}"
