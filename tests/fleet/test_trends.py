"""Rising error counters (slurmhealth/fleet/trends.py) and the `trends` command."""

from __future__ import annotations

import json
import random

from conftest import record_sources, run_cli, snapshot_path

from slurmhealth.core import store
from slurmhealth.fleet import trends
from slurmhealth.node import config, runner

H = 3600.0
NOW = 1_800_000_000.0
MODEL = "NVIDIA H100 80GB HBM3"


def episodes(node, device, counter, per_day, start, end, rng, size=1, label="GPU 5"):
    """Rows of a counter read every 5 min with `per_day` error episodes a day."""
    rows, t = [], start
    while True:
        t += rng.expovariate(per_day / 86400.0)
        if t > end:
            return rows
        rows.append((node, device, counter, t, float(size), label))


def fleet(n=20):
    return {f"gpu{i:02d}": MODEL for i in range(n)}


def test_a_tenfold_rise_is_found_with_its_evidence_and_a_steady_rate_is_not():
    rng = random.Random(1)
    rows = episodes(
        "gpu03", "gpu:0000:9b:00.0", "pcie_replay", 4, NOW - 8 * 86400, NOW - 86400, rng
    )
    rows += episodes("gpu03", "gpu:0000:9b:00.0", "pcie_replay", 40, NOW - 86400, NOW, rng, 3)
    rows += episodes("gpu07", "gpu:0000:18:00.0", "pcie_replay", 20, NOW - 8 * 86400, NOW, rng)
    found = trends.rising(sorted(rows, key=lambda r: r[3]), fleet(), NOW)
    assert [(f["node"], f["counter"], f["basis"]) for f in found] == [
        ("gpu03", "pcie_replay", "trend")
    ]
    f = found[0]
    assert f["episodes"] >= 20 and f["ratio"] > 5 and f["p"] < trends.ALPHA
    assert f["evidence"].startswith("gpu03: GPU 5 PCIe replays ")
    assert "x its 7-day baseline, fleet median 0/h" in f["evidence"]


def test_one_burst_is_one_episode_not_a_trend():
    rows = [("gpu03", "ib:mlx5_0:1", "symbol_error", NOW - 600, 5000.0, "mlx5_0 port 1")]
    assert trends.rising(rows, fleet(), NOW) == []


def test_a_published_limit_is_reached_whatever_the_history():
    # 12 replays a minute for the last 6 h, the same the week before: no trend, DCGM's limit
    rows = [
        ("gpu01", "gpu:0000:18:00.0", "pcie_replay", t, 60.0, "GPU 0")
        for t in range(int(NOW - 8 * 86400) + 300, int(NOW) + 1, 300)
    ]
    found = trends.rising(rows, fleet(), NOW)
    assert [(f["counter"], f["basis"]) for f in found] == [("pcie_replay", "published")]
    assert "8 replays per minute" in found[0]["evidence"]
    json.dumps(found)  # finite numbers only


def test_first_readings_gauges_and_policy_time_count_nowhere():
    rows = [
        ("gpu01", "gpu:0000:18:00.0", "ecc_sbe_aggregate", NOW - 60 * i, None, "GPU 0")
        for i in range(50)
    ]
    rows += [
        ("gpu01", "gpu:0000:18:00.0", "perf_power_ns", NOW - 60 * i, 1e9, "GPU 0")
        for i in range(50)
    ]
    rows += [
        ("gpu01", "gpu:0000:18:00.0", "thermal_margin", NOW - 60 * i, -6.0, "GPU 0")
        for i in range(50)
    ]
    assert trends.rising(rows, fleet(), NOW) == []


def test_a_rate_every_peer_shares_is_no_trend_for_a_node_without_a_past():
    rng = random.Random(2)
    rows = []
    for node in fleet():
        rows += episodes(node, "ib:mlx5_0:1", "symbol_error", 12, NOW - 8 * 86400, NOW, rng)
    newcomer = episodes("gpu99", "ib:mlx5_0:1", "symbol_error", 12, NOW - 86400, NOW, rng)
    models = dict(fleet(), gpu99=MODEL)
    found = trends.rising(sorted(rows + newcomer, key=lambda r: r[3]), models, NOW)
    assert "gpu99" not in {f["node"] for f in found}
    # the same newcomer on a model of its own has no peers' rate to hide behind
    alone = trends.rising(newcomer, dict(models, gpu99="NVIDIA A100-SXM4-80GB"), NOW)
    assert [f["node"] for f in alone] == ["gpu99"]


def test_the_trends_command_reads_what_the_node_recorded(tmp_path):
    """Node runs (replayed snapshots, the real runner and store) recorded in a fleet store, then
    `slurmhealth trends --json` as an admin runs it."""
    path = str(tmp_path / "fleet.db")
    conn = store.connect(path)
    expect = config.defaults()
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    t0 = NOW - 9 * 86400
    replays = 0
    for i in range(0, 9 * 288, 6):  # a run every 30 min for 9 days
        when = t0 + i * 300
        if when > NOW - 86400:
            replays += 7  # the last day: 7 replays every half hour on GPU 2
        elif i % 144 == 0:
            replays += 1  # before: one every 12 h
        doc["gpu"]["devices"][2]["fields"]["pcie_replay"] = replays
        snap = tmp_path / "snap.json"
        snap.write_text(json.dumps(doc))
        run = runner.run(
            "gpu01",
            expect,
            runner.Options(gpu_source=str(snap)),
            ["gpu"],
            "check",
            store.load_baselines(conn, "gpu01"),
        )
        records = run.records()
        records["run"]["started"] = when
        for row in records["counters"]:
            row["time"] = when
        store.record_run(conn, records)
    conn.close()
    got = run_cli("trends", "--db", path, "--now", str(NOW), "--json")
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert [(f["node"], f["label"], f["counter"]) for f in out["rising"]] == [
        ("gpu01", "GPU 2", "pcie_replay")
    ]
    text = run_cli("trends", "--db", path, "--now", str(NOW))
    assert "gpu01: GPU 2 PCIe replays 13.7/h over 24 h, 164x its 7-day baseline" in text.stdout


def test_a_rising_counter_is_a_lemon_warning_at_its_newest_episode(tmp_path):
    """fleet/signals.py: the lemon sweep counts each rising counter as a warning episode."""
    from slurmhealth.fleet import signals

    conn = store.connect(str(tmp_path / "fleet.db"))
    rng = random.Random(3)
    rows = episodes(
        "gpu03", "gpu:0000:9b:00.0", "pcie_replay", 2, NOW - 8 * 86400, NOW - 86400, rng
    )
    rows += episodes("gpu03", "gpu:0000:9b:00.0", "pcie_replay", 40, NOW - 86400, NOW, rng)
    value = 0.0
    for node, device, counter, t, delta, label in rows:
        value += delta
        conn.execute(
            "INSERT INTO counters (node, device, counter, time, value, delta, label) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (node, device, counter, t, value, delta, label),
        )
    conn.commit()
    got = signals.signals(conn, NOW - 28 * 86400, NOW + 1)
    assert got["gpu03"]["warnings"] == [(rows[-1][3], "warn", 1.0, None)]
    before = signals.signals(conn, NOW - 28 * 86400, NOW - 2 * 86400)
    assert before.get("gpu03", {}).get("warnings", []) == []


def test_a_nodes_class_comes_from_the_run_before_one_whose_gpu_source_failed(tmp_path):
    """The peers a node's counters are compared with are its GPU model's: a newest run that
    recorded versions without GPU facts (NVML did not answer once) leaves the node in its class,
    read from the run before, as the report's drift section reads it; a model the caller
    already knows is taken as it is."""
    from slurmhealth.fleet import queries

    conn = store.connect(str(tmp_path / "fleet.db"))
    gpu = {"versions": {"model": ["NVIDIA H100 80GB HBM3"], "driver": "550.90.07"}}
    ib = {"versions": {"fw_ver": {"mlx5_0": "28.39.1002"}}}
    for started, sources in ((100.0, {"gpu": gpu, "ib": ib}), (200.0, {"ib": ib})):
        record_sources(conn, "gpu01", started, sources)
    models = queries.node_models(conn, ["gpu01", "gpu02"], 300.0, 1000.0)
    assert models == {"gpu01": "NVIDIA H100 80GB HBM3", "gpu02": ""}
    known = queries.node_models(conn, ["gpu01"], 300.0, 1000.0, {"gpu01": "NVIDIA H200"})
    assert known == {"gpu01": "NVIDIA H200"}
