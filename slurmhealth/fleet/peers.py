"""Slow nodes against their peers: the nodes whose diagnoses measure slower than the other nodes
of the same hardware class (docs/diagnose.md, "Slow nodes against their peers").

Pure: the rows queries.diag_figures reads go in, findings come out. Per hardware class, probe
and figure, each unit (GPU, port) of a node is summarised by its median over the window, the
node by its worst unit, and that is compared with the median of the class's other nodes.
"""

from __future__ import annotations

import bisect
import statistics

from slurmhealth.core.result import clean

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
WINDOW = 7 * 86400.0  # the diagnoses compared: a week (`slurmhealth slow`, the report)
MARGIN = 0.05  # the share worse than the peers that matters (as SuperBench's variance rule)
MIN_PEERS = 5  # a median of fewer others is no baseline
MIN_SAMPLES = 2  # the unit's diagnoses worse than the margin: repeatable, not one bad run
Z = 4.0  # robust spreads below the peers' median
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data
# The smallest spread, as a share of the median: a simulated or perfectly uniform class has a
# MAD near 0, and then any difference would be z spreads away.
SPREAD_FLOOR = 0.01


def slow(
    rows: list,
    margin: float = MARGIN,
    min_peers: int = MIN_PEERS,
    min_samples: int = MIN_SAMPLES,
    z: float = Z,
    higher_is_better: dict | None = None,
) -> list:
    """[{node, gpu_model, probe, figure, unit, value, peer_median, peers, deficit, samples,
    slow_samples, evidence}] of every node slower than its peers on a figure, worst first.

    rows: (node, time, gpu_model, probe, unit, figure, value) as queries.diag_figures reads
    them; gpu_model is the hardware class. value and peer_median are in the figure's own
    unit; deficit is the share worse than the peers' median (below it for a throughput, above
    it for a latency); unit the node's worst GPU or port ("node" for a node-wide figure);
    samples that unit's diagnoses in the rows, slow_samples those worse than the margin."""
    better = HIGHER_IS_BETTER if higher_is_better is None else higher_is_better
    limits = (margin, min_peers, min_samples, z)
    found = []
    for key, nodes in sorted(_scores(rows, better).items()):
        found.extend(_class_findings(key, nodes, better[key[2]], limits))
    return sorted(found, key=lambda f: (-f["deficit"], f["node"], f["probe"], f["figure"]))


def _scores(rows: list, better: dict) -> dict:
    """{(gpu_model, probe, figure): {node: {unit: {time: score}}}} of the compared figures.

    A score is the value signed so that higher is better (a latency negated): one rule for
    both directions below."""
    out: dict = {}
    for node, when, model, probe, unit, figure, value in rows:
        if figure in better:
            units = out.setdefault((model, probe, figure), {}).setdefault(node, {})
            units.setdefault(unit, {})[when] = value if better[figure] else -value
    return out


def _worst_unit(units: dict) -> tuple:
    """(median, unit) of the node's unit whose median over its diagnoses is the worst.

    Each unit's median first, then the worst of them: the worst of 8 GPUs in each run and
    then their median would pick each run's noise, and set a healthy node's figure (and so
    the peers' median) well below its typical GPU."""
    return min((statistics.median(runs.values()), unit) for unit, runs in units.items())


def _class_findings(key: tuple, nodes: dict, higher: bool, limits: tuple) -> list:
    """The slow nodes of one class, probe and figure."""
    margin, min_peers, min_samples, z = limits
    if len(nodes) - 1 < min_peers:
        return []
    worst = {node: _worst_unit(units) for node, units in nodes.items()}
    ordered = sorted(mine for mine, _unit in worst.values())
    out = []
    for node, (mine, unit) in worst.items():
        peer = _median_without(ordered, mine)
        if peer == 0 or (peer - mine) / abs(peer) <= margin:
            continue  # most nodes stop here, before the spread is computed
        cut = peer - margin * abs(peer)
        runs = nodes[node][unit]
        worse = sum(1 for s in runs.values() if s < cut)
        others = [m for n, (m, _u) in worst.items() if n != node]
        if worse >= min_samples and peer - mine > z * _spread(others, peer):
            found = (unit, mine, peer, len(others), len(runs), worse)
            out.append(_finding(key, node, found, higher))
    return out


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
    the unit's diagnoses, those past the margin)."""
    model, probe, figure = key
    unit, mine, peer, peers, samples, worse = found
    sign = 1 if higher else -1
    value, median = sign * mine, sign * peer
    deficit = (peer - mine) / abs(peer)
    where = "" if unit == "node" else f" on {unit}"
    side = "below" if higher else "above"
    line = (
        f"{node}: {probe} {figure} {_num(value)}{where} ({samples} runs), {deficit:.0%} {side} "
        f"the median {_num(median)} of {peers} peers ({model or 'no GPU model recorded'})"
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
        "samples": samples,
        "slow_samples": worse,
        "evidence": clean(line, 300),
    }


def _num(value: float) -> str:
    """A figure as an admin reads it: 428, 46.2, 2.13."""
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f}"
