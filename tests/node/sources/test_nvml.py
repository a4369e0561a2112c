"""The real NVML gather code path, run against tests/fakenvml (no GPU on CI machines)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import FAKE_NVML, SNAPSHOTS, snapshot_path

from slurmhealth.node.sources import SourceUnavailable


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.syspath_prepend(FAKE_NVML)
    monkeypatch.setenv("SLURMHEALTH_NVML_BINDING", "pynvml")  # the stand-in is a pynvml
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    from slurmhealth.node.sources import nvml as module

    return module


def use(monkeypatch, name: str, fault: str = "") -> dict:
    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", snapshot_path(name))
    monkeypatch.setenv("FAKE_NVML_FAULT", fault)
    with open(snapshot_path(name)) as handle:
        return json.load(handle)["gpu"]


def test_gather_returns_the_snapshot_shape(nvml, monkeypatch):
    expected = use(monkeypatch, "healthy")
    raw = nvml.sweep()
    assert raw["count"] == 8 and raw["driver_version"] == "550.90.07"
    got, want = raw["devices"][3], expected["devices"][3]
    # The sweep reads every field of nvml.FIELDS; those the snapshot does not hold come back
    # None (the stand-in answers for what the snapshot has), as on a GPU that lacks them.
    assert {k: v for k, v in got["fields"].items() if k in want["fields"]} == want["fields"]
    assert all(got["fields"][k] is None for k in set(got["fields"]) - set(want["fields"]))
    assert set(got["fields"]) == set(nvml.FIELDS)
    for key in (
        "uuid",
        "bus_id",
        "vbios",
        "persistence",
        "nvlink",
        "pcie_max_gen",
        "processes",
        "clock_event_reasons",
        "temperature",
    ):
        assert got[key] == want[key], key
    assert set(raw["timing_ms"]) == {"init", "total"}
    # The fixture predates the fabric's clique, cluster UUID and health: the stand-in answers
    # as a driver before R550 (no versioned call), so the old call gives zeros and no health.
    assert got["fabric"] == {
        **want["fabric"],
        "clique_id": 0,
        "cluster_uuid": "00000000-0000-0000-0000-000000000000",
        "health_mask": None,
        "health_summary": None,
    }


def test_unsupported_values_are_none_with_the_reason(nvml, monkeypatch):
    use(monkeypatch, "healthy")
    raw = nvml.sweep()
    dev = raw["devices"][0]
    assert dev["fields"]["retired_pending"] is None  # Hopper: NotSupported
    assert dev["error"] is None


def test_a_lost_gpu_is_recorded_not_raised(nvml, monkeypatch):
    use(monkeypatch, "healthy", "lost:5")
    raw = nvml.sweep()
    assert raw["devices"][5]["error"] == "GpuIsLost"
    assert raw["devices"][4]["error"] is None


@pytest.mark.parametrize("fault", ["library_missing", "driver_not_loaded"])
def test_no_driver_is_unavailable(nvml, monkeypatch, fault):
    use(monkeypatch, "healthy", fault)
    with pytest.raises(SourceUnavailable, match="NVML unavailable"):
        nvml.sweep()


def test_without_nvlink_the_links_are_none(nvml, monkeypatch, tmp_path):
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    for dev in doc["gpu"]["devices"]:
        dev["nvlink"] = None
        dev["fabric"] = None
    path = tmp_path / "pcie.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", str(path))
    monkeypatch.setenv("FAKE_NVML_FAULT", "")
    raw = nvml.sweep()
    assert raw["devices"][0]["nvlink"] is None
    assert raw["devices"][0]["errors"]["nvlink"] == "NotSupported"
    assert raw["devices"][0]["fabric"] is None


def test_model_memory_mig_and_current_link_are_read(nvml, monkeypatch):
    expected = use(monkeypatch, "healthy")
    raw = nvml.sweep()
    for index in (0, 7):
        got, want = raw["devices"][index], expected["devices"][index]
        for key in ("name", "memory_total", "mig_current", "mig_pending", "pcie_gen", "pcie_width"):
            assert got[key] == want[key], key
        # the healthy fixture predates application clocks: the stand-in says NotSupported
        assert got["errors"] == dict.fromkeys(("app_clock_sm", "app_clock_mem"), "NotSupported")
    assert raw["devices"][0]["memory_total"] == 85520809984  # 81559 MiB, as nvidia-smi shows


def test_new_fault_values_come_through(nvml, monkeypatch):
    use(monkeypatch, "mig-pending")
    dev = nvml.sweep()["devices"][4]
    assert (dev["mig_current"], dev["mig_pending"]) == (0, 1)
    use(monkeypatch, "pcie-under-load-gen3")
    dev = nvml.sweep()["devices"][2]
    assert (dev["pcie_gen"], dev["pcie_width"], dev["pcie_max_gen"]) == (3, 16, 5)
    assert dev["processes"] == [{"pid": 51342, "used_memory": 42949672960}]


def test_a_snapshots_mig_devices_come_back_through_the_sweep(nvml, monkeypatch, tmp_path):
    """What a MIG node's snapshot records (`mig_devices`) is what its sweep reads again: a
    replay maps a job's MIG devices to their GPUs as the live run did."""
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    migs = [{"index": k, "uuid": f"MIG-c0ffee00-0000-4000-8000-00000000000{k}", "gi": k + 1,
             "ci": 0} for k in (0, 2)]  # index 1 was destroyed: NVML says NotFound there
    dev = doc["gpu"]["devices"][6]
    dev["mig_current"], dev["mig_pending"], dev["mig_devices"] = 1, 1, migs
    path = tmp_path / "mig.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", str(path))
    monkeypatch.setenv("FAKE_NVML_FAULT", "")
    raw = nvml.sweep()
    assert raw["devices"][6]["mig_devices"] == migs
    assert "mig_devices" not in raw["devices"][5]


def test_without_mig_or_the_new_calls_the_values_are_none(nvml, monkeypatch, tmp_path):
    """A GPU without MIG answers NotSupported; an older snapshot lacks the keys altogether."""
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    for dev in doc["gpu"]["devices"]:
        dev["mig_current"] = dev["mig_pending"] = None
        for key in ("memory_total", "pcie_gen", "pcie_width"):
            del dev[key]
    path = tmp_path / "no-mig.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", str(path))
    monkeypatch.setenv("FAKE_NVML_FAULT", "")
    dev = nvml.sweep()["devices"][0]
    assert (dev["mig_current"], dev["mig_pending"]) == (None, None)
    for key in ("memory_total", "pcie_gen", "pcie_width"):
        assert dev[key] is None, key
    assert dev["errors"] == {
        "mig": "NotSupported",
        "memory_total": "NotSupported",
        "pcie_gen": "NotSupported",
        "pcie_width": "NotSupported",
        "app_clock_sm": "NotSupported",
        "app_clock_mem": "NotSupported",
    }
    assert dev["error"] is None


def test_application_clocks_are_read_and_recorded_as_a_setting(nvml, monkeypatch, tmp_path):
    """nvmlDeviceGetApplicationsClock(SM, MEM) in MHz; versions_of records "SM/MEM MHz" per
    node (a node whose GPUs disagree records both), which the odd-node comparison reads."""
    from slurmhealth.node.checks import gpu  # noqa: PLC0415

    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    for dev in doc["gpu"]["devices"]:
        dev["app_clock_sm"], dev["app_clock_mem"] = 1980, 2619
    doc["gpu"]["devices"][3]["app_clock_sm"] = 1755
    path = tmp_path / "clocks.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", str(path))
    monkeypatch.setenv("FAKE_NVML_FAULT", "")
    raw = nvml.sweep()
    assert (raw["devices"][0]["app_clock_sm"], raw["devices"][0]["app_clock_mem"]) == (1980, 2619)
    assert raw["devices"][0]["errors"] == {}
    assert gpu.versions_of(gpu.parse(raw))["app_clocks"] == ["1755/2619 MHz", "1980/2619 MHz"]


def test_the_sweep_reads_retired_pages_and_lifetime_corrected_ecc(nvml, monkeypatch):
    """NVML_FI_DEV_RETIRED_SBE (29), _DBE (30) and NVML_FI_DEV_ECC_SBE_AGG_TOTAL (5) are read
    live, so the pre-Ampere retirement limit and the corrected-ECC total judge a real node, not
    only a fixture: a live sweep of the retired-pages-full GPU fails gpu.row_remap."""
    from slurmhealth.node.checks import gpu
    from slurmhealth.node.checks.base import Context

    expected = use(monkeypatch, "retired-pages-full")
    raw = nvml.sweep()
    fields = raw["devices"][0]["fields"]
    want = expected["devices"][0]["fields"]
    assert [fields[k] for k in ("retired_sbe", "retired_dbe")] == [
        want[k] for k in ("retired_sbe", "retired_dbe")
    ]
    expect = {k: v[0] for k, v in gpu.DEFAULTS.items()}
    result = gpu.row_remap(gpu.parse(raw), Context("gpu01", "prolog", expect))
    assert result.status == "fail" and result.action == "service", result.message


def test_the_live_gather_reads_each_gpus_aer_counters_from_its_pci_function(
    nvml, monkeypatch, tmp_path
):
    import os
    import shutil

    from conftest import FIXTURES

    from slurmhealth.node.sources import Options

    use(monkeypatch, "healthy")
    first = tmp_path / "bus" / "pci" / "devices" / "0000:18:00.0"
    first.mkdir(parents=True)
    for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
        shutil.copy(os.path.join(FIXTURES, "aer", name), first / name)
    raw = nvml.gather(Options(sysfs_root=str(tmp_path)))
    devices = raw["devices"]
    assert devices[0]["bus_id"] == "00000000:18:00.0"
    assert devices[0]["aer"]["correctable"].endswith("TOTAL_ERR_COR 4")
    assert devices[1]["aer"] is None  # no AER files: not an error
    assert "aer_dev_correctable" not in json.dumps(devices[1]["errors"])
    assert nvml.pci_address("00000000:9B:00.0") == "0000:9b:00.0"


def _gb200(tmp_path, change=None) -> str:
    """The modelled GB200 tray's snapshot (C2C links to the Grace CPU), changed by `change`."""
    with open(os.path.join(SNAPSHOTS, "gb200-nvl72-healthy.json")) as handle:
        doc = json.load(handle)
    if change:
        change(doc["gpu"]["devices"])
    path = tmp_path / "gb200.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _count_field_calls(monkeypatch) -> list:
    """The stand-in's nvmlDeviceGetFieldValues, wrapped: each call's ids are appended."""
    import pynvml

    calls, real = [], pynvml.nvmlDeviceGetFieldValues

    def counted(handle, ids):
        calls.append(list(ids))
        return real(handle, ids)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", counted)
    return calls


def test_c2c_links_and_counters_ride_in_the_one_batched_call(nvml, monkeypatch, tmp_path):
    def trouble(devices):
        devices[2]["c2c"][7]["active"] = False
        devices[2]["fields"]["c2c_replay"] = 40

    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", _gb200(tmp_path, trouble))
    monkeypatch.setenv("FAKE_NVML_FAULT", "")
    calls = _count_field_calls(monkeypatch)
    raw = nvml.sweep()
    # per GPU, one call for the device's fields and one for its NVLinks' counters, as before
    # the C2C fields: the C2C ids are in the first, the C2C status once per link it may have
    assert len(calls) == 2 * 4
    batches = [ids for ids in calls if 170 in ids]
    assert len(batches) == 4
    assert all([i for i in ids if isinstance(i, tuple)] == [(171, n) for n in range(14)]
               for ids in batches)
    assert all({170, 231, 232, 233} <= set(ids) for ids in batches)
    dev = raw["devices"][2]
    assert dev["fields"]["c2c_links"] == 10 and dev["fields"]["c2c_replay"] == 40
    assert (dev["fields"]["c2c_crc"], dev["fields"]["c2c_replay_b2b"]) == (0, 0)
    assert [x["link"] for x in dev["c2c"]] == list(range(10))  # the count's, not the 14 asked
    assert [x["link"] for x in dev["c2c"] if not x["active"]] == [7]
    assert all(x["active"] for x in raw["devices"][0]["c2c"])


def test_a_gpu_without_c2c_reads_none_and_no_more_calls(nvml, monkeypatch):
    use(monkeypatch, "healthy")  # H100 HGX: no C2C, the stand-in answers NotSupported
    calls = _count_field_calls(monkeypatch)
    raw = nvml.sweep()
    assert len(calls) == 2 * 8
    for dev in raw["devices"]:
        assert dev["c2c"] is None
        assert [dev["fields"][k] for k in ("c2c_links", "c2c_crc", "c2c_replay")] == [None] * 3
        assert "c2c" not in dev["errors"] and "fields" not in dev["errors"]


def test_c2c_links_take_the_count_and_a_status_not_read_is_none(nvml):
    assert nvml.c2c_links(None, [1] * 14) is None
    assert nvml.c2c_links(0, [None] * 14) is None
    assert nvml.c2c_links(True, [1] * 14) is None
    assert nvml.c2c_links(2, [1, None, 1]) == [
        {"link": 0, "active": True},
        {"link": 1, "active": None},
    ]
    assert nvml.c2c_links(3, [0, 1, 1, 1]) == [
        {"link": 0, "active": False},
        {"link": 1, "active": True},
        {"link": 2, "active": True},
    ]
    # a count past the links asked for keeps those asked for
    assert len(nvml.c2c_links(20, [1] * nvml.C2C_LINKS_MAX)) == nvml.C2C_LINKS_MAX
