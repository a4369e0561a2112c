"""Rising error counters (slurmhealth/fleet/trends.py) and the `trends` command."""

from __future__ import annotations

import io
import json
import math
import random

from conftest import record_sources, run_cli, snapshot_path

from slurmhealth.core import store
from slurmhealth.fleet import trends
from slurmhealth.fleet.policy import ln_poisson_sf
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


def read_every(rows, step):
    """The same episodes as a node read every `step` seconds records them: one row per reading
    that found the counter grown, its delta the sum since the reading before."""
    out: dict = {}
    for node, device, counter, t, delta, _label in rows:
        at = (t // step + 1) * step
        key = (node, device, counter, at)
        out[key] = out.get(key, 0.0) + delta
    return sorted(((n, d, c, t, v, "GPU 5") for (n, d, c, t), v in out.items()), key=lambda r: r[3])


def rise(node, device, counter, base, onset, rng, size=1, after=None):
    """A device at `base` episodes a day for 10 days, then ten times as many from `onset`."""
    rows = episodes(node, device, counter, base, NOW - 10 * 86400, onset, rng, size)
    return rows + episodes(node, device, counter, after or 10 * base, onset, NOW, rng, size)


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
    assert f["episodes"] >= trends.MIN_EPISODES and f["ratio"] > 5 and f["p"] < trends.ALPHA
    assert f["evidence"].startswith("gpu03: GPU 5 PCIe replays ")
    assert "x its 7-day baseline, fleet median 0/h" in f["evidence"]


def test_a_rise_is_found_alike_at_5_minute_and_hourly_readings():
    """The errors, not the readings with errors, carry a rise at an hourly cadence: 8 episodes a
    day that become 80 are at most 24 hourly readings a day."""
    rng = random.Random(4)
    device = "gpu:0000:9b:00.0"
    steady = []
    for node in fleet():
        steady += episodes(node, device, "nvlink_crc", 2, NOW - 10 * 86400, NOW, rng, 2)
    rows = steady + rise("gpu03", device, "nvlink_crc", 8, NOW - 86400, rng, 2)
    rows = [r for r in rows if r[0] != "gpu03" or r[3] > NOW - 10 * 86400]
    for step in (300.0, 3600.0):
        found = trends.rising(read_every(rows, step), fleet(), NOW)
        assert [(f["node"], f["counter"]) for f in found] == [("gpu03", "nvlink_crc")], step


def steady_but_gpu07(device, counter, per_day, rng):
    """Every node's `device` at `per_day` episodes a day over the 10 days before NOW, but
    gpu07's (the test adds its own)."""
    rows = []
    for node in fleet():
        rows += episodes(node, device, counter, per_day, NOW - 10 * 86400, NOW, rng)
    return [r for r in rows if r[0] != "gpu07"]


def test_a_device_still_rising_stays_flagged_after_its_rise_reaches_the_baseline():
    """A rise 5 days old is inside the 7-day baseline: the older half, from before it, is the
    bar, and the device stays named while it keeps rising."""
    rng = random.Random(5)
    device = "ib:mlx5_0:1"
    rows = steady_but_gpu07(device, "symbol_error", 3, rng)
    rows += rise("gpu07", device, "symbol_error", 3, NOW - 5 * 86400, rng)
    for now in (NOW - 4 * 86400, NOW - 2 * 86400, NOW):
        rows_then = sorted((r for r in rows if r[3] <= now), key=lambda r: r[3])
        found = trends.rising(rows_then, fleet(), now)
        assert [f["node"] for f in found] == ["gpu07"], (NOW - now) / 86400


def test_bursts_that_grew_inside_the_baseline_do_not_raise_the_bar_they_are_judged_by():
    """A rise 5 days old by more and three times bigger bursts, read hourly: the baseline's
    older half is the bar, its rate and, its readings with errors having doubled too, its
    burstiness (the whole week's hours, at two rates and two burst sizes, vary far more). The
    device stays named through the last day; judged by the whole week's burstiness it was not
    named at the end."""
    rng = random.Random(0)
    device = "gpu:0000:9b:00.0"
    rows = steady_but_gpu07(device, "pcie_replay", 3, rng)
    rows += episodes("gpu07", device, "pcie_replay", 3, NOW - 10 * 86400, NOW - 5 * 86400, rng)
    rows += episodes("gpu07", device, "pcie_replay", 10, NOW - 5 * 86400, NOW, rng, 3)
    rows = read_every(sorted(rows, key=lambda r: r[3]), 3600.0)
    for back in (0, 6, 12, 18, 24):
        now = NOW - back * H
        found = trends.rising([r for r in rows if r[3] <= now], fleet(), now)
        assert [f["node"] for f in found] == ["gpu07"], back


def test_noisy_neighbours_do_not_mute_a_quiet_devices_rise():
    """Four devices of the class err in large bursts all week, steadily; a quiet device's
    single errors rise tenfold. Its dispersion is its own (or the class's median), not the
    noisy ones': it is found, and they are not."""
    rng = random.Random(6)
    device = "gpu:0000:18:00.0"
    rows = []
    for i, node in enumerate(fleet()):
        if i < 4:
            for t in range(int(NOW - 10 * 86400), int(NOW), 3 * 3600):
                rows.append(
                    (
                        node,
                        device,
                        "pcie_replay",
                        t + rng.random(),
                        rng.choice([1.0, 1.0, 40.0, 400.0]),
                        "GPU 0",
                    )
                )
        elif node != "gpu11":
            rows += episodes(node, device, "pcie_replay", 1, NOW - 10 * 86400, NOW, rng)
    rows += rise("gpu11", device, "pcie_replay", 4, NOW - 86400, rng)
    found = trends.rising(sorted(rows, key=lambda r: r[3]), fleet(), NOW)
    assert [f["node"] for f in found] == ["gpu11"]


def test_a_busy_day_is_no_trend_where_days_vary():
    """Every device of the class doubles and halves its rate from day to day: a device with one
    day at 3 times its mean is within that variation, one at 10 times is not."""
    rng = random.Random(7)
    device = "gpu:0000:18:00.0"
    rows = []
    for node in fleet(30):
        for day in range(10):
            start = NOW - (10 - day) * 86400
            busy = rng.choice([0.5, 1.0, 2.0])
            if node == "gpu05" and day == 9:
                busy = 3.0
            if node == "gpu09" and day == 9:
                busy = 10.0
            rows += episodes(node, device, "ecc_sbe_volatile", 10 * busy, start, start + 86400, rng)
    found = trends.rising(sorted(rows, key=lambda r: r[3]), fleet(30), NOW)
    assert [f["node"] for f in found] == ["gpu09"]


def test_the_tails_are_the_laws_they_name():
    # Beta(1, 1) makes every count of n equally likely: P(X >= 3) of 0..5 is 3/6
    assert math.isclose(math.exp(trends.ln_beta_binomial_sf(3, 5, 1.0, 1.0)), 0.5)
    # shape 1: geometric, P(X >= k) = q^k with q = mean / (mean + 1)
    assert math.isclose(math.exp(trends.ln_neg_binomial_sf(4, 2.0, 1.0)), (2 / 3) ** 4)
    # a very large shape: the binomial and the Poisson
    got = trends.ln_beta_binomial_sf(20, 60, 1e7, 3e7)
    assert math.isclose(got, trends.ln_binomial_sf(20, 60, 0.25), rel_tol=1e-4)
    assert math.isclose(trends.ln_neg_binomial_sf(9, 3.0, 1e8), ln_poisson_sf(9, 3.0), rel_tol=1e-4)
    assert trends.ln_beta_binomial_sf(0, 5, 1.0, 1.0) == 0.0
    assert trends.ln_beta_binomial_sf(6, 5, 1.0, 1.0) == -math.inf


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
    assert "gpu01: GPU 2 PCIe replays 13.7/h over 24 h, 192x its 7-day baseline" in text.stdout


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


def _imported(tmp_path, lines):
    """A fleet store holding `lines` (counter records), imported as `collect` and `import` do."""
    from slurmhealth.fleet import records

    conn = store.connect(str(tmp_path / "fleet.db"))
    header = json.dumps({"type": "header", "format": records.FORMAT})
    records.import_ndjson(conn, io.StringIO("\n".join([header, *lines]) + "\n"))
    return conn


def _readings(node, device, counter, rng, per_hour, label, start=NOW - 12 * 86400, size=1):
    """Counter records of a device read every 5 min from `start`, recorded when it grew: a reset
    (a reboot: delta None) on day 3, no readings at all on days 5 and 6, a label that changed
    on day 8, and a reading at each midnight (on an hour's edge); `size` times the increases."""
    out, value, t = [], 0, start
    while t <= NOW:
        day = (t - start) // 86400
        grown = rng.random() < per_hour / 12 or t % 86400 == 0
        if grown and day not in (5, 6):
            step = size * (1 + int(rng.paretovariate(1.5)))
            reset = day == 3 and not any(r["delta"] is None for r in out)
            value = step if reset else value + step
            fields = {"node": node, "device": device, "counter": counter, "time": t}
            fields.update(value=value, delta=None if reset else step, type="counter")
            out.append(dict(fields, label=label if day < 8 else f"{label} (renamed)"))
        t += 300.0
    return [json.dumps(r) for r in out]


def test_the_series_summed_in_sql_are_the_rows_summed_in_python(tmp_path):
    """queries.counter_series sums in SQL what trends.summaries sums from the rows
    queries.counter_rows reads, figure for figure and type for type (an int is not a float in
    the JSON), and the findings from either are the same: several nodes, devices and counters,
    a published limit reached, a rise, resets, a gap, gauges and policy time that count
    nowhere, as of a whole and a fractional hour."""
    from slurmhealth.fleet import queries

    rng = random.Random(5)
    lines = []
    for i in range(12):
        node = f"gpu{i:02d}"
        for g in range(2):
            device = f"gpu:0000:{18 + g:02x}:00.0"
            lines += _readings(node, device, "ecc_sbe_volatile", rng, 0.3, f"GPU {g}")
            size = 1000 if i == 0 else 1  # 8 replays a minute and more: DCGM's limit
            lines += _readings(node, device, "pcie_replay", rng, 2.0, f"GPU {g}", size=size)
            lines += _readings(node, device, "thermal_margin", rng, 1.0, f"GPU {g}")
        for per_hour, since in ((0.2, NOW - 12 * 86400), (6.0 if i == 4 else 0.2, NOW - 86400)):
            lines += _readings(node, "ib:mlx5_0:1", "symbol_error", rng, per_hour, "port 1", since)
    conn = _imported(tmp_path, lines)
    hours = trends.hours_of(trends.WINDOWS, trends.BASELINE)
    for now in (NOW, NOW - 5.5 * H - 0.25):
        rows = queries.counter_rows(conn, now - hours[2] * H, now, trends.NOT_TRENDS)
        expected = sorted(trends.summaries(rows, now, hours))
        got = sorted(queries.counter_series(conn, now, hours, trends.NOT_TRENDS))
        assert repr(got) == repr(expected)
        limits = (trends.FACTOR, trends.MIN_EPISODES, trends.ALPHA)
        found = trends.judged(got, fleet(12), trends.WINDOWS, limits, trends.BASELINE)
        assert found == trends.rising(rows, fleet(12), now)
    assert {s[2] for s in got} == {"ecc_sbe_volatile", "pcie_replay", "symbol_error"}
    assert {(f["node"], f["counter"], f["basis"]) for f in found} >= {
        ("gpu00", "pcie_replay", "published"),
        ("gpu04", "symbol_error", "trend"),
    }
