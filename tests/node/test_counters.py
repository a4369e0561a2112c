"""Error counters over time, as a run records them (slurmhealth/node/counters.py)."""

from __future__ import annotations

import json
import os
import shutil

from conftest import FIXTURES, snapshot_path

from slurmhealth.core import store
from slurmhealth.node import config, counters, runner
from slurmhealth.node.sources import sysfs

AER = os.path.join(FIXTURES, "aer")


def healthy_gpu() -> dict:
    with open(snapshot_path("healthy")) as handle:
        return json.load(handle)["gpu"]


def test_aer_totals_are_read_from_the_kernels_format():
    with open(os.path.join(AER, "aer_dev_correctable")) as handle:
        text = handle.read()
    assert counters.aer_total(text, "TOTAL_ERR_COR") == 4
    assert counters.aer_total(text, "TOTAL_ERR_FATAL") is None
    assert counters.aer_total(None, "TOTAL_ERR_COR") is None
    assert counters.aer_total("TOTAL_ERR_COR x\n", "TOTAL_ERR_COR") is None


def test_a_healthy_nodes_first_run_records_nothing_but_its_gauges_and_the_next_nothing():
    gpu = healthy_gpu()
    read = counters.readings(gpu, None)
    rows, kept = counters.changes({}, read, 100.0)
    # every counter of the healthy node is 0: no row; the first reading of a gauge is one
    assert {r["counter"] for r in rows} <= set(counters.GAUGES)
    assert len(kept["d"]) == gpu["count"]
    again, _ = counters.changes(kept, counters.readings(gpu, None), 400.0)
    assert again == []


def bump(gpu: dict, index: int, field: str, value: int) -> dict:
    out = json.loads(json.dumps(gpu))
    out["devices"][index]["fields"][field] = value
    return out


def test_an_increase_is_a_row_with_its_delta_and_a_reset_restarts_at_zero():
    gpu = healthy_gpu()
    _, kept = counters.changes({}, counters.readings(gpu, None), 0.0)
    rows, kept = counters.changes(
        kept, counters.readings(bump(gpu, 5, "pcie_replay", 40), None), 60.0
    )
    assert [(r["device"], r["counter"], r["value"], r["delta"], r["label"]) for r in rows] == [
        ("gpu:" + counters.bus(gpu["devices"][5]["bus_id"]), "pcie_replay", 40, 40, "GPU 5")
    ]
    rows, kept = counters.changes(
        kept, counters.readings(bump(gpu, 5, "pcie_replay", 55), None), 120.0
    )
    assert [(r["value"], r["delta"]) for r in rows] == [(55, 15)]
    # a driver reload: the counter restarted at 0 and counted 3 since
    rows, kept = counters.changes(
        kept, counters.readings(bump(gpu, 5, "pcie_replay", 3), None), 180.0
    )
    assert [(r["value"], r["delta"]) for r in rows] == [(3, 3)]
    rows, _ = counters.changes(kept, counters.readings(bump(gpu, 5, "pcie_replay", 3), None), 240.0)
    assert rows == []


def test_a_first_reading_claims_no_increase_and_a_new_device_is_a_first_reading():
    gpu = bump(healthy_gpu(), 2, "ecc_sbe_aggregate", 1_000_000)
    rows, kept = counters.changes({}, counters.readings(gpu, None), 0.0)
    sbe = [r for r in rows if r["counter"] == "ecc_sbe_aggregate"]
    assert [(r["value"], r["delta"]) for r in sbe] == [(1_000_000, None)]
    # the GPU is swapped: the new board's lifetime count is not a rise either
    swapped = json.loads(json.dumps(gpu))
    swapped["devices"][2]["bus_id"] = "00000000:FF:00.0"
    swapped["devices"][2]["fields"]["ecc_sbe_aggregate"] = 7
    rows, _ = counters.changes(kept, counters.readings(swapped, None), 60.0)
    new = [r for r in rows if r["counter"] == "ecc_sbe_aggregate"]
    assert [(r["device"], r["delta"]) for r in new] == [("gpu:0000:ff:00.0", None)]


def test_gauges_are_recorded_when_they_moved_by_their_band():
    gpu = healthy_gpu()
    for dev in gpu["devices"]:
        dev["processes"] = []
    _, kept = counters.changes({}, counters.readings(gpu, None), 0.0)
    warmer = json.loads(json.dumps(gpu))
    warmer["devices"][1]["temperature"] += 3
    assert counters.changes(kept, counters.readings(warmer, None), 60.0)[0] == []
    warmer["devices"][1]["temperature"] += 3
    rows, _ = counters.changes(kept, counters.readings(warmer, None), 120.0)
    assert [(r["counter"], r["delta"]) for r in rows] == [("thermal_margin", -6)]


def test_nvlink_and_ib_counters_and_the_hcas_aer(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"), root)
    pci = root / "class" / "infiniband" / "mlx5_0" / "device"
    pci.mkdir()
    for name in os.listdir(AER):
        if name.startswith("aer_dev_"):
            shutil.copy(os.path.join(AER, name), pci / name)
    ib = sysfs.read(str(root))
    assert ib["devices"]["mlx5_0"]["aer"]["correctable"].endswith("TOTAL_ERR_COR 4")
    assert "aer" not in ib["devices"]["mlx5_1"]  # no PCI parent: nothing to read
    gpu = healthy_gpu()
    gpu["devices"][0]["nvlink"][3]["crc"] = 9
    rows, _ = counters.changes({}, counters.readings(gpu, ib), 0.0)
    found = {(r["device"], r["counter"], r["value"]) for r in rows}
    assert ("hca:mlx5_0", "aer_correctable", 4) in found
    bus = counters.bus(gpu["devices"][0]["bus_id"])
    assert (f"nvlink:{bus}:3", "nvlink_crc", 9) in found
    labels = {r["device"]: r["label"] for r in rows}
    assert labels[f"nvlink:{bus}:3"] == "GPU 0 link 3"


def test_a_run_records_its_changed_counters_in_the_store(tmp_path):
    conn = store.connect(str(tmp_path / "n.db"))
    expect = config.defaults()

    def one(name: str) -> str:
        run = runner.run(
            "gpu01",
            expect,
            runner.Options(gpu_source=snapshot_path(name)),
            ["gpu", "nvlink"],
            "check",
            store.load_baselines(conn, "gpu01"),
        )
        return store.record_run(conn, run.records())

    one("healthy")
    first = conn.execute(
        "SELECT count(*) FROM counters WHERE counter NOT IN "
        "('thermal_margin', 'pcie_gen', 'pcie_width')"
    ).fetchone()[0]
    assert first == 0
    run_id = one("ecc-dbe")
    rows = conn.execute(
        "SELECT counter, delta FROM counters WHERE run_id = ? AND counter = 'ecc_dbe_volatile'",
        (run_id,),
    ).fetchall()
    assert rows and all(delta and delta > 0 for _, delta in rows)


# --- the job's energy: the prolog's reading against the epilog's ----------------------------------


def energy_facts(readings: dict) -> dict:
    """The healthy GPUs with NVML's energy counter (mJ) where given."""
    gpu = healthy_gpu()
    for dev in gpu["devices"]:
        dev["fields"]["energy_mj"] = readings.get(dev["index"])
    return gpu


def prolog_start(readings: dict, taken_at: float = 1000.0) -> dict:
    from slurmhealth.node.checks import gpu  # noqa: PLC0415

    return gpu.baseline(energy_facts(readings), now=taken_at)


def test_the_jobs_energy_is_each_gpus_reading_at_the_epilog_less_the_prologs():
    start = prolog_start({0: 1_000_000, 1: 2_000_000, 2: 3_000_000})
    end = energy_facts({0: 61_000_000, 1: 2_000_500, 2: 9_000_000})
    got = counters.job_telemetry(start, end, 1100.0, None)
    assert got == {"s": 100.0, "j": {"0": 60000.0, "1": 0.5, "2": 6000.0}}
    # only the job's GPUs
    assert counters.job_telemetry(start, end, 1100.0, [2])["j"] == {"2": 6000.0}


def test_a_reloaded_driver_a_changed_gpu_or_a_missing_reading_leaves_that_gpu_out():
    start = prolog_start({0: 5_000_000, 1: 5_000_000, 2: 5_000_000, 3: 5_000_000})
    end = energy_facts({0: 100, 1: 6_000_000, 2: None, 3: 7_000_000})
    end["devices"][1]["uuid"] = "GPU-swapped"  # another GPU at that index
    end["devices"][4]["fields"]["energy_mj"] = 9_000_000  # no prolog reading
    assert counters.job_telemetry(start, end, 1010.0, None) == {"s": 10.0, "j": {"3": 2000.0}}


def test_no_prolog_reading_or_no_time_gives_no_energy():
    end = energy_facts({0: 5_000_000})
    assert counters.job_telemetry(None, end, 1010.0, None) is None
    assert counters.job_telemetry({}, end, 1010.0, None) is None
    start = prolog_start({0: 1_000_000})
    assert counters.job_telemetry(start, end, 1000.0, None) is None  # the clock went back
    assert counters.job_telemetry(start, energy_facts({}), 1010.0, None) is None
    assert counters.job_telemetry(start, "garbage", 1010.0, None) is None


# --- time below base clocks, and the SM clock and utilisation samples -----------------------------


def busy(gpu: dict, samples: dict) -> dict:
    """The GPUs with a health check's sample ({index: (SM MHz, utilisation %)}) where given."""
    for dev in gpu["devices"]:
        dev["sm_clock"], dev["util_gpu"] = samples.get(dev["index"], (None, None))
    return gpu


def test_samples_add_up_per_gpu_and_a_gpu_not_sampled_keeps_its_sums():
    sums = counters.add_samples(None, busy(healthy_gpu(), {0: (1980, 90), 1: (1500, 100)}))
    assert sums == {"0": [1, 1980, 90], "1": [1, 1500, 100]}
    sums = counters.add_samples(sums, busy(healthy_gpu(), {0: (1960, 96)}))
    assert sums == {"0": [2, 3940, 186], "1": [1, 1500, 100]}
    # a lost GPU, a reading out of range and garbage kept from before add nothing
    gpu = busy(healthy_gpu(), {2: (1980, 101), 3: (1980, 50)})
    gpu["devices"][3]["error"] = "GpuIsLost"
    assert counters.add_samples(dict(sums, x="junk", y=[1, -2, 3]), gpu) == sums


def test_the_job_gets_its_gpus_time_below_base_clocks_and_the_mean_of_its_samples():
    first = counters.add_samples(None, busy(healthy_gpu(), {0: (1000, 10)}))  # before the job
    facts = energy_facts({0: 1_000_000, 1: 1_000_000})
    for dev in facts["devices"]:
        dev["fields"]["below_base_ns"] = 5 * 10**9
    start = dict(prolog_start({}), below_base={"0": 5 * 10**9, "1": 5 * 10**9}, samples=first)
    during = counters.add_samples(first, busy(healthy_gpu(), {0: (1900, 90), 1: (1700, 80)}))
    during = counters.add_samples(during, busy(healthy_gpu(), {0: (1980, 100), 1: (1500, 60)}))
    end = energy_facts({0: 61_000_000, 1: 31_000_000})
    end["devices"][0]["fields"]["below_base_ns"] = 5 * 10**9 + 1_250_000_000
    end["devices"][1]["fields"]["below_base_ns"] = 100  # fell: the driver reloaded
    got = counters.job_telemetry(start, end, 1100.0, ["0", "1"], during)
    assert got == {
        "s": 100.0,
        "j": {},  # the prolog here read no energy
        "b": {"0": 1.2},
        "u": {"0": [2, 1940, 95.0], "1": [2, 1600, 70.0]},  # the sample before the job left out
    }
    # a prolog of an older version kept no sums: the node's include time before the job
    older = {k: v for k, v in start.items() if k != "samples"}
    assert "u" not in counters.job_telemetry(older, end, 1100.0, None, during)
    # the node's sums lost meanwhile (a new store): fewer than at the prolog, no figure
    assert "u" not in counters.job_telemetry(start, end, 1100.0, None, {"0": [1, 1, 1]})


def test_the_jobs_row_keeps_its_worst_gpus_share_below_base_clocks():
    assert counters.below_share({"s": 100.0, "j": {}, "b": {"0": 12.5, "3": 41.0}}) == 0.41
    assert counters.below_share({"s": 10.0, "b": {"0": 25.0}}) == 1.0  # at most the whole job
    for figures in (None, {"s": 100.0, "j": {}}, {"s": 0, "b": {"0": 1.0}}, {"s": 9, "b": {}}):
        assert counters.below_share(figures) is None


def test_a_bus_id_or_hca_name_that_is_not_one_forges_no_counter(tmp_path):
    """Keys are `device|counter`: a snapshot's bus id holding `|` made a counter of its own
    choosing (terminal controls and all) on another GPU's device."""
    gpu = bump(healthy_gpu(), 2, "pcie_replay", 5)
    gpu["devices"][2]["bus_id"] = "00000000:2A:00.0|pcie_replay\x1b]0;pwn\x07"
    ib = {"devices": {"mlx5_0|x": {"ports": {"1": {"counters": {"symbol_error": 3}}}},
                      "mlx5_1": {"ports": {"1|y": {"counters": {"symbol_error": 3}}}}}}  # fmt: skip
    read = counters.readings(gpu, ib)
    assert all(key.count("|") == 1 for key in [*read.values, *read.missing]), read.values
    assert not [k for k in read.values if "pwn" in k or "mlx5_0" in k or "1|y" in k]
