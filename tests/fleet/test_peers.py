"""Slow nodes against their peers: fleet/peers.py on hand-made rows (pure), the rows
queries.diag_figures reads from a real store that diagnoses were recorded in, and
`slurmhealth slow`."""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest
from conftest import FIXTURES, diag_records, outcome, run_cli, snapshot_path
from hypothesis import given
from hypothesis import strategies as st

from slurmhealth.core import store
from slurmhealth.core.result import clean
from slurmhealth.fleet import peers, queries
from slurmhealth.node import config, runner
from slurmhealth.node.diag import parsers, probes, run

DAY = 86400.0
NOW = 20_000 * DAY
H100 = "8x NVIDIA H100 80GB HBM3"
A100 = "8x NVIDIA A100-SXM4-80GB"


def fleet(values: dict, model: str = H100, figure: str = "busbw_gbps", probe: str = "nccl") -> list:
    """Rows of nodes diagnosed once a day, in time order as queries.diag_figures reads them:
    {node: [the figure in each diagnosis, oldest first]}, the newest a day before NOW."""
    rows = [
        (node, NOW - (len(runs) - k) * DAY, model, probe, "node", figure, value)
        for node, runs in values.items()
        for k, value in enumerate(runs)
    ]
    return sorted(rows, key=lambda r: r[1])


def peers_of(n: int, centre: float = 461.0, runs: int = 3) -> dict:
    """n healthy nodes within +-0.4% of `centre`, a little noise from run to run."""
    return {
        f"gpu{i + 10:02d}": [centre * (1 + ((i + k) % 5 - 2) * 0.002) for k in range(runs)]
        for i in range(n)
    }


# --- the model (pure) ---------------------------------------------------------------------------


def test_a_node_7_percent_below_its_peers_is_found():
    values = {**peers_of(63), "gpu07": [427.0, 429.0, 428.0]}
    [found] = peers.slow(fleet(values))
    assert (found["node"], found["probe"], found["figure"], found["unit"]) == (
        "gpu07",
        "nccl",
        "busbw_gbps",
        "node",
    )
    assert found["gpu_model"] == H100 and found["peers"] == 63
    assert found["value"] == 428.0 and found["peer_median"] == 461.0
    assert found["deficit"] == round(33 / 461, 4)
    assert (found["samples"], found["slow_samples"]) == (3, 3)
    assert found["evidence"] == (
        "gpu07: nccl busbw_gbps 428 (slow on 3 of its latest 3 days), 7% below the median 461 "
        "of 63 peers (8x NVIDIA H100 80GB HBM3)"
    )


def test_3_percent_below_is_within_the_margin():
    values = {**peers_of(63), "gpu07": [447.0, 447.5, 446.5]}
    assert peers.slow(fleet(values)) == []
    # past a 2% margin, yet within 4 spreads (the floor: 1% of the median); within 2, not
    assert peers.slow(fleet(values), margin=0.02) == []
    assert [f["node"] for f in peers.slow(fleet(values), margin=0.02, z=2.0)] == ["gpu07"]


def test_persistent_evidence_is_three_slow_days_or_all_but_one_of_four_or_more():
    healthy = peers_of(20, runs=5)

    def found(runs: list) -> list:
        return [
            (f["samples"], f["slow_samples"]) for f in peers.slow(fleet({**healthy, "x": runs}))
        ]

    assert found([400.0]) == [] and found([400.0, 401.0]) == []  # one or two slow days
    assert found([461.0, 400.0, 461.0]) == []  # the median says 13% below: one day was
    assert found([400.0, 461.0, 401.0]) == []  # two of three, the median one of them
    assert found([400.0, 401.0, 402.0]) == [(3, 3)]
    assert found([403.0, 402.0, 401.0, 461.0, 400.0]) == [(5, 4)]  # one more for the miss
    assert found([402.0, 401.0, 461.0, 400.0]) == []  # three of four are not
    assert found([403.0, 461.0, 401.0, 462.0, 400.0]) == []  # nor three of five
    # a recovered part: the evidence is of the latest days, and its median is no longer slow
    assert found([400.0, 401.0, 402.0, 461.0, 462.0, 460.0]) == []


def test_too_few_peers_compare_nothing():
    slow_runs = [400.0] * 4
    assert peers.slow(fleet({**peers_of(4, runs=4), "gpu07": slow_runs})) == []
    few = fleet({**peers_of(5, runs=4), "gpu07": slow_runs})
    assert [f["peers"] for f in peers.slow(few)] == [5]
    assert peers.slow(fleet({**peers_of(9, runs=4), "gpu07": slow_runs}), min_peers=10) == []
    # 15 healthy days say little of how often a bad one happens: 3 of 3 could be chance
    assert peers.slow(fleet({**peers_of(5), "gpu07": slow_runs[:3]})) == []


def test_two_models_are_never_compared_with_each_other():
    h100 = fleet({**peers_of(10), "gpu07": [420.0, 421.0, 420.0]})
    a100 = fleet({f"a{i}": [230.0, 231.0, 230.0] for i in range(10)}, model=A100)
    a100 += fleet({"a99": [210.0, 211.0, 210.0]}, model=A100)
    found = peers.slow(sorted(h100 + a100, key=lambda r: r[1]))
    # the A100s are half the H100s' figure, yet only the slow node of each class is named
    assert [(f["node"], f["gpu_model"], f["peers"]) for f in found] == [
        ("gpu07", H100, 10),
        ("a99", A100, 10),
    ]


def test_a_latency_is_slow_above_its_peers():
    values = {f"gpu{i}": [2.0, 2.01, 2.0] for i in range(10)}
    fast = {**values, "gpu07": [1.7, 1.7, 1.7]}
    assert peers.slow(fleet(fast, figure="typical_usec", probe="ib_read_lat")) == []
    slow_port = {**values, "gpu07": [2.2, 2.21, 2.2]}
    [found] = peers.slow(fleet(slow_port, figure="typical_usec", probe="ib_read_lat"))
    assert (found["node"], found["value"], found["peer_median"]) == ("gpu07", 2.2, 2.0)
    assert found["deficit"] == pytest.approx(0.1)
    assert "10% above the median 2.00 of 10 peers" in found["evidence"]


def test_counts_and_unknown_figures_are_never_compared():
    for figure in ("wrong", "matmul_mismatches", "matmul_runs", "bytes", "p99_usec", "novel"):
        values = {**{f"gpu{i}": [0.0] * 3 for i in range(10)}, "gpu07": [5.0] * 3}
        assert peers.slow(fleet(values, figure=figure)) == [], figure
    # a caller's own directions replace the defaults
    values = {**{f"gpu{i}": [9.0] * 3 for i in range(10)}, "gpu07": [5.0] * 3}
    assert len(peers.slow(fleet(values, figure="novel"), higher_is_better={"novel": True})) == 1


def gpu_rows(tflops, nodes: int = 12, days: int = 3) -> list:
    """Rows of `nodes` nodes' matmul per GPU, diagnosed daily, in time order; tflops(node
    index, gpu, day) gives each figure; node 0 is gpu07."""
    rows = [
        (
            "gpu07" if i == 0 else f"gpu{i + 10}",
            NOW - (days - day) * DAY,
            H100,
            "cuda",
            f"gpu{gpu}",
            "matmul_tflops",
            tflops(i, gpu, day),
        )
        for i in range(nodes)
        for day in range(days)
        for gpu in range(8)
    ]
    return sorted(rows, key=lambda r: r[1])


def test_the_worst_unit_stands_for_the_node_and_is_named():
    rows = gpu_rows(lambda i, gpu, _day: 600.0 if (i, gpu) == (0, 3) else 690.0 + gpu * 0.5)
    [found] = peers.slow(rows)
    assert (found["node"], found["unit"], found["value"], found["peer_median"]) == (
        "gpu07",
        "gpu3",
        600.0,
        690.0,
    )
    assert (
        "matmul_tflops 600 on gpu3 (slow on 3 of its latest 3 days), 13% below the median 690 "
        "of 11 peers" in found["evidence"]
    )


def test_a_spread_out_class_needs_more_than_the_margin():
    # peers spread +-10%: a node 7% below the median is within 4 robust spreads
    values = {f"gpu{i}": [461.0 * (0.9 + 0.02 * (i % 11))] * 3 for i in range(30)}
    assert peers.slow(fleet({**values, "gpu07": [428.0] * 3})) == []
    assert [f["node"] for f in peers.slow(fleet({**values, "gpu07": [250.0] * 3}))] == ["gpu07"]


def test_a_uniform_class_still_needs_the_floor():
    """Identical peers have no spread: without the floor, any difference would count."""
    values = {f"gpu{i}": [461.0] * 3 for i in range(10)}
    near = {**values, "gpu07": [451.0] * 3}  # 2.2% below
    assert peers.slow(fleet(near), margin=0.01) == []  # not 4 x 1% of the median below
    assert len(peers.slow(fleet({**values, "gpu07": [440.0] * 3}), margin=0.01)) == 1


def test_hostile_names_are_cleaned_in_the_evidence():
    node = "gpu07\n<b>|`rm -rf /`"
    model = "8x H100\x1b[31m\r\nfake line"
    values = {f"gpu{i}": [461.0] * 3 for i in range(10)}
    rows = fleet(values, model=model) + [
        (node, NOW - (k + 1) * DAY, model, "nccl", "node\x00x", "busbw_gbps", 400.0)
        for k in range(3)
    ]
    [found] = peers.slow(sorted(rows, key=lambda r: r[1]))
    assert found["node"] == node  # as stored: JSON escapes it, the report and the CLI clean it
    line = found["evidence"]
    assert line == clean(line, 300) and "\n" not in line and "\x1b" not in line
    assert line.startswith("gpu07 <b>|`rm -rf /`: nccl busbw_gbps 400 on node?x (slow on 3")
    assert line.endswith("(8x H100?[31m fake line)")


def test_findings_come_worst_first():
    values = {**peers_of(20), "gpu07": [420.0] * 3, "gpu08": [400.0] * 3}
    assert [f["node"] for f in peers.slow(fleet(values))] == ["gpu08", "gpu07"]


# --- peer groups within a class ------------------------------------------------------------------


def variant_rows(slow_units: dict, variant: int = 12, nodes: int = 40, days: int = 3) -> list:
    """gpu_rows of a class whose first `variant` nodes (gpu07 the first) are a variant 4%
    slower on every GPU, as a power-capped SKU recorded under the same model name; each GPU a
    little apart from the others (+-0.6%); slow_units: {(node index, gpu): its own further
    share slower}."""

    def tflops(i: int, gpu: int, _day: int) -> float:
        level = 690.0 * (0.96 if i < variant else 1.0) * (1 + ((i * 3 + gpu) % 7 - 3) * 0.002)
        return level * (1 - slow_units.get((i, gpu), 0.0))

    return gpu_rows(tflops, nodes=nodes, days=days)


def test_a_slower_variant_is_its_own_peer_group():
    """30% of the class 4% slower: a GPU of that variant 2.5% below its own nodes is more than
    5% below the whole class, and named when judged against it; against its group it is not.
    A GPU 10% below its group is named there, and the line says which group it was judged
    in."""
    within = variant_rows({(0, 3): 0.025})
    assert peers.slow(within) == []
    real = variant_rows({(0, 3): 0.10})
    [found] = peers.slow(real)
    assert (found["node"], found["unit"], found["peers"]) == ("gpu07", "gpu3", 11)
    assert (found["peer_group"], found["peer_groups"]) == (1, 2)
    assert found["deficit"] == pytest.approx(0.10, abs=0.01)
    assert found["evidence"].endswith(f"of 11 peers ({H100}, the slower group of 2)")


def test_without_the_groups_the_variant_would_be_named(monkeypatch):
    """The same class judged as one (no split): the variant's GPU 2.5% below its own nodes is
    named against the whole class, as the finder did before peer groups."""
    monkeypatch.setattr(peers, "GROUP_GAP", math.inf)
    [found] = peers.slow(variant_rows({(0, 3): 0.025}))
    assert (found["node"], found["unit"], found["peer_groups"], found["peers"]) == (
        "gpu07",
        "gpu3",
        1,
        39,
    )


def two_figure_rows(slow_units: dict, p2p_spread: float = 0.015) -> list:
    """variant_rows' class on two GPU figures: its matmul, where the variant (the first 12 of
    40 nodes) is 10% slower and the nodes lie within +-0.2%, and its peer copies, where the
    variant is 4% slower but the nodes spread +-`p2p_spread`, so that the variant's gap there
    is under GROUP_GAP spreads; slow_units: {(node index, gpu): a further share slower on p2p}."""

    def level(i: int, gpu: int, half: float, variant: float) -> float:
        node = (variant if i < 12 else 1.0) * (1 + ((i * 7) % 11 - 5) / 5 * half)
        return 100.0 * node * (1 + ((i * 3 + gpu) % 7 - 3) * 0.001)

    matmul = gpu_rows(lambda i, gpu, _d: level(i, gpu, 0.002, 0.90), nodes=40)
    p2p = gpu_rows(
        lambda i, gpu, _d: level(i, gpu, p2p_spread, 0.96) * (1 - slow_units.get((i, gpu), 0.0)),
        nodes=40,
    )
    copies = [(n, t, m, p, u, "p2p_gbps", v) for n, t, m, p, u, _f, v in p2p]
    return sorted(matmul + copies, key=lambda r: r[1])


def test_a_variant_seen_on_one_gpu_figure_groups_them_all():
    """A variant is a property of the node: the class splits on its clearest GPU figure
    (matmul here) and every GPU figure is judged within those groups. On the peer copies
    alone the variant does not stand apart, and a variant node's GPU 3% below its own level
    would be named against the whole class; with the matmul's groups it is not, while a GPU
    12% below its group still is, judged in the slower group of 2."""
    rows = two_figure_rows({(0, 3): 0.03})
    copies = [r for r in rows if r[5] == "p2p_gbps"]
    [alone] = peers.slow(copies)
    assert (alone["node"], alone["figure"], alone["peer_groups"]) == ("gpu07", "p2p_gbps", 1)
    assert peers.slow(rows) == []
    [found] = peers.slow(two_figure_rows({(0, 3): 0.12}))
    assert (found["node"], found["unit"], found["figure"]) == ("gpu07", "gpu3", "p2p_gbps")
    assert (found["peer_group"], found["peer_groups"], found["peers"]) == (1, 2, 11)


def test_a_node_not_in_the_clearest_figure_joins_the_nearest_variant():
    """A node diagnosed on the peer copies but not on the matmul is judged in the variant
    group whose median level on the copies is nearest its own."""
    rows = two_figure_rows({})
    extra = [
        ("gpu99", NOW - 2 * DAY, H100, "cuda", f"gpu{g}", "p2p_gbps", 96.0 * 0.88)
        for g in range(8)
    ] + [("gpu98", NOW - 2 * DAY, H100, "cuda", f"gpu{g}", "p2p_gbps", 99.9) for g in range(8)]
    days = sorted(rows + [r[:1] + (r[1] + d * DAY,) + r[2:] for r in extra for d in range(3)],
                  key=lambda r: r[1])
    matmul = [r for r in days if r[5] == "matmul_tflops"]
    assert {r[0] for r in matmul}.isdisjoint({"gpu98", "gpu99"})
    found = peers.slow(days)
    assert [(f["node"], f["peer_group"], f["peer_groups"], f["peers"]) for f in found] == [
        ("gpu99", 1, 2, 12)
    ]


def test_a_few_slow_nodes_never_form_a_group():
    """Nodes slow on every GPU (one bad change, a hot row) move their level, not only a
    unit's: below GROUP_SHARE of the class (7 of 40) or below min_peers + 1 (5 of 12) they
    are no group, and each is judged against the class and named."""
    slowed = {(i, gpu): 0.08 for i in range(7) for gpu in range(8)}
    found = peers.slow(variant_rows(slowed, variant=0))
    assert len({f["node"] for f in found}) == 7
    assert {(f["peer_groups"], f["peers"]) for f in found} == {(1, 39)}
    small = {(i, gpu): 0.08 for i in range(5) for gpu in range(8)}
    found = peers.slow(variant_rows(small, variant=0, nodes=12))
    assert len({f["node"] for f in found}) == 5
    assert {(f["peer_groups"], f["peers"]) for f in found} == {(1, 11)}


def test_a_class_of_one_level_is_never_split():
    """A class whose levels vary evenly (no gap) or in steps finer than the part-to-part
    spread is one group: every node's peers are all the others."""
    even = variant_rows({(0, 3): 0.10}, variant=0)
    [found] = peers.slow(even)
    assert (found["peer_groups"], found["peers"]) == (1, 39)
    steps = {**{f"gpu{i}": [461.0 + (i % 2) * 2.0] * 3 for i in range(30)}, "gpu07": [420.0] * 3}
    [found] = peers.slow(fleet(steps))
    assert (found["peer_groups"], found["peers"]) == (1, 30)


# --- persistent evidence, over time --------------------------------------------------------------


def daily(
    values: dict, figure: str = "busbw_gbps", probe: str = "nccl", unit: str = "node"
) -> list:
    """Rows of nodes diagnosed at 03:00 each day from NOW on: {node: [the figure on day 0, 1,
    ...]}, None where the node was not diagnosed that day."""
    return [
        (node, NOW + day * DAY + 3 * 3600, H100, probe, unit, figure, value)
        for node, runs in values.items()
        for day, value in enumerate(runs)
        if value is not None
    ]


def sweeps(rows: list, days: int) -> list:
    """The nodes peers.slow names at the end of each day over the week before it, as a daily
    `slurmhealth slow --now` would."""
    rows = sorted(rows, key=lambda r: r[1])
    out = []
    for day in range(days):
        end = NOW + (day + 1) * DAY
        found = peers.slow([r for r in rows if end - 7 * DAY <= r[1] < end])
        out.append(sorted({f["node"] for f in found}))
    return out


def healthy(n: int, days: int, centre: float = 461.0) -> dict:
    """n healthy nodes, each day's figure within +-1% of `centre`."""
    return {
        f"gpu{i + 20:02d}": [centre * (1 + ((i * 7 + d * 3) % 11 - 5) * 0.002) for d in range(days)]
        for i in range(n)
    }


def test_one_off_lows_early_never_make_a_node_slow():
    """Two noisy-neighbour runs among a node's first three diagnoses (the median of the three
    is one of them: the case the week's median named), a bad hour diagnosed three times, a low
    run every third day: none is a slow part, at any sweep."""
    values = healthy(30, 10)
    values["gpu07"] = [323.0, 461.0, 330.0] + [461.0] * 7
    values["gpu09"] = [300.0 if d % 3 == 1 else 460.0 for d in range(10)]
    rows = daily(values)
    rows += [
        ("gpu08", NOW + 2 * DAY + 3 * 3600 + k * 1200, H100, "nccl", "node", "busbw_gbps", 320.0)
        for k in range(3)
    ]
    assert sweeps(rows, 10) == [[]] * 10


def test_a_run_again_the_same_day_is_one_days_evidence():
    """A diagnosis run again within the day replaces the one before: a bad hour diagnosed
    three times is one slow day, and a good rerun answers a bad run."""
    values = healthy(30, 4)
    values["gpu07"] = [461.0, 400.0, 400.0, 400.0]
    rows = daily(values)
    # day 0: a bad run at 01:00, then the 03:00 one (good); day 1 three times bad, within hours
    rows.append(("gpu07", NOW + 3600, H100, "nccl", "node", "busbw_gbps", 320.0))
    rows += [
        ("gpu07", NOW + DAY + (4 + k) * 3600, H100, "nccl", "node", "busbw_gbps", 401.0)
        for k in range(2)
    ]
    assert sweeps(rows, 4) == [[], [], [], ["gpu07"]]
    [found] = peers.slow(sorted(rows, key=lambda r: r[1]))
    assert (found["samples"], found["slow_samples"]) == (3, 3)


def test_a_gpu_8_percent_slow_from_the_middle_of_the_window_is_found_and_stays_found():
    """One GPU of 20 nodes 8% slow from day 3: named at the end of day 5, its third slow day,
    and at every sweep after; a GPU slow from the first diagnosis at the end of day 2."""

    def rows_with(onset: int) -> list:
        runs = list(healthy(20, 10, 690.0).values())
        return gpu_rows(
            lambda i, gpu, day: (
                runs[i][day]
                * (1 + (gpu % 3 - 1) * 0.003)
                * (0.92 if (i, gpu) == (0, 3) and day >= onset else 1.0)
            ),
            nodes=20,
            days=10,
        )

    def from_now(rows: list) -> list:  # gpu_rows ends a day before NOW: sweeps start at NOW
        return [(r[0], r[1] + 10 * DAY, *r[2:]) for r in rows]

    assert sweeps(from_now(rows_with(3)), 10) == [[]] * 5 + [["gpu07"]] * 5
    assert sweeps(from_now(rows_with(0)), 10) == [[]] * 2 + [["gpu07"]] * 8
    [found] = peers.slow(rows_with(3))
    # the 7 slow days of the window, the day before them not slow
    assert (found["unit"], found["samples"], found["slow_samples"]) == ("gpu3", 7, 7)
    assert found["deficit"] == pytest.approx(0.08, abs=0.01)


def test_a_class_wide_shift_makes_no_node_slow():
    """A new NCCL 12% slower rolled out over three days; one node away until the rollout (its
    every diagnosis after it), another away after it, a third diagnosed every other day: each
    node's latest days against the other nodes' latest days, nobody is slow. Nor on a day when
    the whole fabric is busy and every reading is 15% low."""
    values = healthy(20, 12)
    for i, (node, runs) in enumerate(values.items()):
        values[node] = [v * (0.88 if d >= 4 + i % 3 else 1.0) for d, v in enumerate(runs)]
    values["gpu39"] = [None] * 4 + values["gpu39"][4:]
    values["gpu38"] = values["gpu38"][:4] + [None] * 8
    values["gpu37"] = [v if d % 2 else None for d, v in enumerate(values["gpu37"])]
    assert sweeps(daily(values), 12) == [[]] * 12
    busy = {
        node: [v * (0.85 if d == 5 else 1.0) for d, v in enumerate(runs)]
        for node, runs in healthy(20, 8).items()
    }
    assert sweeps(daily(busy), 8) == [[]] * 8


def test_a_class_full_of_bad_days_needs_more_evidence():
    """Persistent evidence is judged against the class's own rate of slow days: where a noisy
    neighbour hits one day in ten of every node, three slow of three could be chance among 41
    nodes; six of six are not. A quiet class names the node at its third."""
    quiet = healthy(40, 10)
    noisy = {
        node: [v * (0.7 if d == i % 10 else 1.0) for d, v in enumerate(runs)]
        for i, (node, runs) in enumerate(quiet.items())
    }
    slow_node = {"gpu07": [461.0] + [415.0] * 9}
    assert sweeps(daily({**quiet, **slow_node}), 10) == [[]] * 3 + [["gpu07"]] * 7
    assert sweeps(daily({**noisy, **slow_node}), 10) == [[]] * 6 + [["gpu07"]] * 4


def ports(node: str, days: int, slow_from: int, noisy: bool) -> list:
    """A node's RDMA bandwidth on 8 ports, diagnosed daily from NOW on: port 3 10% slow from
    day `slow_from`; noisy: each of the other ports 20% low on one day in ten, a different
    day for each (every port's median as its peers')."""
    rows = []
    for day in range(days):
        for p in range(8):
            value = 392.0 * (1 + (p % 3 - 1) * 0.002)
            if p == 3 and day >= slow_from:
                value *= 0.9
            elif noisy and (day + p) % 10 == 0:
                value *= 0.8
            rows.append(
                (
                    node,
                    NOW + day * DAY + 3 * 3600,
                    H100,
                    "ib_write_bw",
                    f"mlx5_{p}:1",
                    "bw_avg_gbps",
                    value,
                )
            )
    return rows


def test_a_noisy_node_needs_more_evidence_than_a_quiet_one():
    """A node whose ports read low now and then, each port's median as its peers', is noisy:
    three slow days of one port are less telling there than on a quiet node, which is named
    at its third slow day; the noisy one only once the run is long enough for its own rate
    (a week of them). A node slow on every port is slow, not noisy: named at its third."""
    class_rows = [r for i in range(30) for r in ports(f"gpu{i + 20}", 12, 99, False)]
    quiet = sweeps(class_rows + ports("gpu07", 12, 3, noisy=False), 12)
    noisy = sweeps(class_rows + ports("gpu07", 12, 3, noisy=True), 12)
    assert quiet == [[]] * 5 + [["gpu07"]] * 7
    assert noisy == [[]] * 11 + [["gpu07"]]
    everywhere = [
        (*r[:6], r[6] * 0.9 if r[1] >= NOW + 3 * DAY else r[6])
        for r in ports("gpu07", 12, 99, False)
    ]
    assert sweeps(class_rows + everywhere, 12) == [[]] * 5 + [["gpu07"]] * 7


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=40), st.data())
def test_the_median_without_one_value_is_the_median_of_the_rest(values, data):
    ordered = sorted(values)
    gone = data.draw(st.sampled_from(values))
    rest = list(values)
    rest.remove(gone)
    assert math.isclose(
        peers._median_without(ordered, gone), statistics.median(rest), rel_tol=1e-9, abs_tol=1e-6
    )


# --- queries.diag_figures over a real store ----------------------------------------------------


def _fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, "diag", name), encoding="utf-8") as handle:
        return handle.read()


def real_diagnosis(node: str) -> dict:
    """A diagnosis of the healthy snapshot node as node/diag/run.py records it: today's checks,
    and the probes' outcomes parsed from real tool output; the GPU tests as cuda.py gives
    them."""
    options = runner.Options(
        gpu_source=snapshot_path("healthy"),
        sysfs_root=os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
        kmsg=os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
    )
    check = runner.run(node, config.defaults(), options, None, run.PHASE)
    gpu_tests = [
        outcome(f"gpu{g}", {"matmul_tflops": 690.5 + g, "matmul_mismatches": 0, "matmul_runs": 9})
        for g in range(8)
    ]
    gpu_tests.append(outcome("gpu0", {"p2p_gbps": 361.2, "p2p_mismatches": 0}))
    found = [
        probes.summary("checks", probes.checks_outcomes(check.results), 1.0),
        probes.summary(
            "nccl", parsers.all_reduce(_fixture("all_reduce_perf-2.15-h100.txt"), 360.0), 9.0
        ),
        probes.summary(
            "ib_write_bw", parsers.ib_write_bw(_fixture("ib_write_bw-gbits.txt"), 400.0), 2.0
        ),
        probes.summary("ib_read_lat", parsers.ib_read_lat(_fixture("ib_read_lat.txt"), 4.5), 2.0),
        probes.summary("cuda", gpu_tests, 30.0),
        probes.summary("dcgm", parsers.dcgm_diag(_fixture("dcgmi-4.x-r3-pass.json")), 60.0),
    ]
    return run.Diagnosis(node, "long", check, found, 120.0).records()


def expected_rows(records: dict) -> list:
    """What diag_figures must read back, from the records alone."""
    sources = json.loads(records["run"]["sources"])["diag"]
    model = f"{sources['gpus']}x {sources['gpu_model']}"
    out = []
    for result in sorted(records["results"], key=lambda r: r["check_name"]):
        for o in json.loads(result["data"])["outcomes"]:
            if o["status"] in ("pass", "fail"):
                for name, value in o["figures"].items():
                    probe = result["check_name"][len("diag.") :]
                    row = (records["run"]["node"], records["run"]["started"], model, probe)
                    out.append((*row, o["unit"], name, float(value)))
    return out


def test_diag_figures_reads_back_what_a_diagnosis_recorded(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    records = real_diagnosis("gpu01")
    records["run"]["started"] = NOW - DAY
    store.record_run(conn, records)
    rows = queries.diag_figures(conn, NOW - 7 * DAY, NOW)
    assert rows == expected_rows(records)
    by_figure = {(r[3], r[4], r[5]): r[6] for r in rows}
    assert by_figure[("nccl", "node", "busbw_gbps")] == 476.84
    assert by_figure[("ib_write_bw", "mlx5_0:1", "bw_avg_gbps")] == 392.14
    assert by_figure[("ib_read_lat", "mlx5_0:1", "typical_usec")] == 2.01
    assert by_figure[("cuda", "gpu3", "matmul_tflops")] == 693.5
    assert {r[2] for r in rows} == {H100}
    assert not any(r[3] == "checks" for r in rows)  # no figures


def test_diag_figures_reads_only_measured_numbers_of_the_window(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))

    def put(node, when, found, **kw):
        return store.record_run(conn, diag_records(node, when, {"nccl": found}, **kw))

    put("a", NOW - DAY, [outcome("node", {"busbw_gbps": 470, "wrong": 0})])
    put("a", NOW - 8 * DAY, [outcome("node", {"busbw_gbps": 1.0})])  # before the window
    put("a", NOW, [outcome("node", {"busbw_gbps": 2.0})])  # the window's end is open
    put("b", NOW - DAY, [outcome("node", {"busbw_gbps": 300.0}, "fail")])
    # skipped (no floor to judge against): not a measurement of this node against others
    put("c", NOW - DAY, [outcome("node", {"busbw_gbps": 470.0}, "skip")])
    odd = {"t": True, "s": "fast", "n": None, "nan": math.nan, "inf": math.inf, "l": [1]}
    put("d", NOW - DAY, [outcome("node", {**odd, "busbw_gbps": 1})])
    put("e", NOW - DAY, [outcome("node", {"busbw_gbps": 5.0})], gpus=0)
    put("f", NOW - DAY, [outcome("node", {"busbw_gbps": 6.0})], model="", gpus=8)
    broken = put("g", NOW - DAY, [outcome("node", {"busbw_gbps": 7.0})])
    conn.execute("UPDATE results SET data = '{not json' WHERE run_id = ?", (broken,))
    lost = put("h", NOW - DAY, [outcome("node", {"busbw_gbps": 8.0})])
    conn.execute("UPDATE runs SET sources = '[1, 2' WHERE id = ?", (lost,))
    weird = put("i", NOW - DAY, ["not an outcome", {"unit": 3, "status": "pass", "figures": {}}])
    conn.execute(
        "INSERT INTO results (run_id, check_name, status, message, action, data, duration) "
        "VALUES (?, 'gpu.count', 'fail', '', 'none', ?, 0)",
        (weird, json.dumps({"outcomes": [outcome("node", {"busbw_gbps": 9.0})]})),
    )
    hook = diag_records("j", NOW - DAY, {"nccl": [outcome("node", {"busbw_gbps": 10.0})]})
    hook["run"]["phase"] = "healthcheck"
    store.record_run(conn, hook)
    rows = queries.diag_figures(conn, NOW - 7 * DAY, NOW)
    got = sorted((r[0], r[2], r[5], r[6]) for r in rows)
    h100 = "8x NVIDIA H100 80GB HBM3"
    assert got == [
        ("a", h100, "busbw_gbps", 470.0),
        ("a", h100, "wrong", 0.0),
        ("b", h100, "busbw_gbps", 300.0),
        ("d", h100, "busbw_gbps", 1.0),
        ("e", "NVIDIA H100 80GB HBM3", "busbw_gbps", 5.0),
        ("f", "", "busbw_gbps", 6.0),
    ]


def test_the_figures_are_read_through_indexes(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    seen: list = []
    conn.set_trace_callback(seen.append)
    queries.diag_figures(conn, NOW - 7 * DAY, NOW)
    conn.set_trace_callback(None)
    [sql] = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
    plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
    assert "SCAN u" not in plan and "SCAN r" not in plan, plan


# --- `slurmhealth slow` -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory) -> str:
    """12 H100 nodes, gpu07's all-reduce 8% slow, and 8 A100 nodes, diagnosed daily for 3 days."""
    path = str(tmp_path_factory.mktemp("slow") / "fleet.db")
    conn = store.connect(path)
    for day in range(3):
        when = NOW - (day + 1) * DAY + 3600
        for i in range(12):
            node = f"gpu{i + 1:02d}"
            busbw = 424.0 if node == "gpu07" else 461.0 + i * 0.3
            found = {"nccl": [outcome("node", {"busbw_gbps": busbw, "wrong": 0})]}
            store.record_run(conn, diag_records(node, when, found))
        for i in range(8):
            found = {"nccl": [outcome("node", {"busbw_gbps": 230.0 + i * 0.2})]}
            store.record_run(conn, diag_records(f"a{i}", when, found, "NVIDIA A100-SXM4-80GB"))
    conn.close()
    return path


def test_slow_lists_the_slow_node_with_its_evidence(fleet_db):
    proc = run_cli("slow", "--db", fleet_db, "--now", str(NOW), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["nodes"], doc["margin"], doc["window_days"]) == (20, 0.05, 7)
    [found] = doc["slow"]
    assert (found["node"], found["peers"], found["samples"]) == ("gpu07", 11, 3)
    text = run_cli("slow", "--db", fleet_db, "--now", str(NOW))
    assert text.returncode == 0 and text.stderr == ""
    assert text.stdout.splitlines() == [
        "1 slow node among 20 diagnosed over 7 days (margin 5%)",
        f"  {found['evidence']}",
    ]
    assert (
        "gpu07: nccl busbw_gbps 424 (slow on 3 of its latest 3 days), 8% below the median 462"
        in (text.stdout)
    )


def test_slow_follows_its_margin_and_window(fleet_db):
    wide = run_cli("slow", "--db", fleet_db, "--now", str(NOW), "--margin", "0.1")
    assert wide.returncode == 0
    assert wide.stdout == "0 slow nodes among 20 diagnosed over 7 days (margin 10%)\n"
    # one day of diagnoses: one run each, not repeatable yet
    day = run_cli("slow", "--db", fleet_db, "--now", str(NOW), "--window", "1d", "--json")
    assert json.loads(day.stdout)["slow"] == []


@pytest.mark.parametrize("margin", ["1.5", "0", "-0.1", "five", "nan"])
def test_a_bad_margin_is_a_one_line_usage_error(fleet_db, margin):
    proc = run_cli("slow", "--db", fleet_db, "--margin", margin)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("Error")]) == 1


def write_export(path: str, diagnoses: list) -> None:
    """Diagnoses (as diag_records gives them) as an export file (docs/fleet.md): a header,
    then each run and its results."""
    lines = [{"type": "header", "format": 1, "schema": store.SCHEMA_VERSION, "exported": NOW}]
    for k, records in enumerate(diagnoses):
        run_id = f"diag{k:06d}"
        lines.append({"type": "run", "id": run_id, **records["run"]})
        lines += [{"type": "result", "run_id": run_id, **r} for r in records["results"]]
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)


def test_slow_names_the_persistent_node_only_in_an_imported_fleet(tmp_path):
    """Through `slurmhealth import` and `slurmhealth slow --json`, as a site's timer reads it:
    16 H100 nodes diagnosed daily; gpu07's all-reduce 8% slow throughout; gpu03 twice hit by a
    noisy neighbour among its first three diagnoses (the median of the three is a low one); a
    new NCCL 12% slower on every node from day 3, gpu11 away until then. Only gpu07 is slow,
    at the end of day 2 and of day 5."""
    diagnoses = []
    for day in range(6):
        for i in range(16):
            node = f"gpu{i + 1:02d}"
            if node == "gpu11" and day < 3:
                continue
            busbw = 461.0 * (1 + (i % 5 - 2) * 0.003) * (0.88 if day >= 3 else 1.0)
            busbw *= 0.92 if node == "gpu07" else 0.7 if node == "gpu03" and day in (0, 2) else 1
            found = {"nccl": [outcome("node", {"busbw_gbps": round(busbw, 2), "wrong": 0})]}
            diagnoses.append(diag_records(node, NOW + day * DAY + 7200 + i * 60, found))
    export, db = str(tmp_path / "fleet.ndjson"), str(tmp_path / "fleet.db")
    write_export(export, diagnoses)
    imported = run_cli("import", "--db", db, export)
    assert imported.returncode == 0 and imported.stderr == "", imported.stderr
    for day in (2, 5):
        proc = run_cli("slow", "--db", db, "--now", str(NOW + (day + 1) * DAY), "--json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["nodes"] == 16 if day == 5 else 15
        assert [(f["node"], f["slow_samples"]) for f in doc["slow"]] == [("gpu07", day + 1)]
        assert doc["slow"][0]["deficit"] == pytest.approx(0.08, abs=0.005)


def test_slow_without_a_store_says_so_and_help_never_acts(tmp_path):
    missing = str(tmp_path / "none.db")
    proc = run_cli("slow", "--db", missing)
    assert proc.returncode == 1 and proc.stderr.strip() == f"Error: no store at {missing}"
    shown = run_cli("slow", "--db", missing, "--help")
    assert shown.returncode == 0 and "Example:" in shown.stdout
    assert not os.path.exists(missing)


def test_a_slow_node_is_a_lemon_warning_at_its_newest_diagnosis(tmp_path):
    """fleet/signals.py: the lemon sweep counts a node slower than its peers as a warning."""
    from slurmhealth.fleet import signals

    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 100 * 86400.0
    for day in range(3):
        for i in range(10):
            busbw = 420.0 if i == 0 else 460.0 + i * 0.2
            found = {"nccl": [outcome("node", {"busbw_gbps": busbw, "wrong": 0})]}
            store.record_run(conn, diag_records(f"gpu{i:02d}", now - (day + 1) * 86400, found))
    got = signals.signals(conn, now - 28 * 86400, now)
    assert [w[:3] for w in got["gpu00"]["warnings"]] == [(now - 86400, "warn", 1.0)]
    assert all(got[f"gpu{i:02d}"]["warnings"] == [] for i in range(1, 10))


def test_a_node_10_percent_slower_from_host_to_gpu_is_found_on_that_gpu():
    """The quick level's host copies: one GPU's PCIe path 10% short (a link trained a notch
    down in width, a tired switch) on one node of 12, the others within +-0.5%."""
    rows = []
    for i in range(12):
        node = "gpu07" if i == 0 else f"gpu{i + 10:02d}"
        for day in range(3):
            for gpu in range(8):
                gbps = 49.5 if (node, gpu) == ("gpu07", 5) else 55.0 * (1 + (gpu % 3 - 1) * 0.005)
                when = NOW - (day + 1) * DAY
                rows.append((node, when, H100, "cuda", f"gpu{gpu}", "h2d_gbps", gbps))
                rows.append((node, when, H100, "cuda", f"gpu{gpu}", "h2d_mismatches", 0.0))
    [found] = peers.slow(sorted(rows, key=lambda r: r[1]))
    assert (found["node"], found["figure"], found["unit"]) == ("gpu07", "h2d_gbps", "gpu5")
    assert found["value"] == 49.5 and found["peer_median"] == pytest.approx(54.725)
    assert found["deficit"] == pytest.approx(1 - 49.5 / 54.725, abs=1e-4)
    assert (
        "cuda h2d_gbps 49.5 on gpu5 (slow on 3 of its latest 3 days), 10% below"
        in (found["evidence"])
    )


def test_the_gpu_tests_throughputs_are_compared_and_their_counts_are_not():
    for figure in ("matmul_tflops", "memory_write_gbps", "hbm_gbps", "h2d_gbps", "d2h_gbps"):
        assert peers.HIGHER_IS_BETTER[figure] is True, figure
    for figure in ("h2d_mismatches", "memory_mismatches", "memory_gib"):
        assert figure not in peers.HIGHER_IS_BETTER, figure


def test_quick_diagnoses_give_no_figure_that_depends_on_the_test_length(tmp_path):
    """A quick diagnosis runs each GPU test for 2 s: its matmul rate is no peer of a medium
    one's (a GPU lowers its clocks as it warms), so diag_figures leaves it out; copy bandwidths
    are the same work at every level and stay."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    found = {"cuda": [outcome("gpu0", {"matmul_tflops": 900.0, "h2d_gbps": 53.0})]}
    records = diag_records("gpu01", 1000.0, found)
    sources = json.loads(records["run"]["sources"])
    sources["diag"]["level"] = "quick"
    records["run"]["sources"] = json.dumps(sources)
    store.record_run(conn, records)
    store.record_run(conn, diag_records("gpu02", 1001.0, found))  # medium
    rows = {(r[0], r[5]) for r in queries.diag_figures(conn, 0, 2000)}
    assert rows == {("gpu01", "h2d_gbps"), ("gpu02", "h2d_gbps"), ("gpu02", "matmul_tflops")}
