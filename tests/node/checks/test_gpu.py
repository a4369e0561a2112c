"""GPU checks against the 8-GPU H100 HGX snapshot and its one-fault variants."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import run_cli, snapshot_path

from slurmhealth.node.checks import gpu
from slurmhealth.node.checks.base import Context


def facts(name: str) -> dict:
    with open(snapshot_path(name)) as handle:
        return gpu.parse(json.load(handle)["gpu"])


def ctx(**expect) -> Context:
    base = {k: v[0] for k, v in gpu.DEFAULTS.items()}
    base.update(expect)
    return Context("gpu01", "prolog", base)


@pytest.mark.parametrize("check", gpu.CHECKS, ids=lambda fn: fn.__name__)
def test_healthy_node_passes_every_check(check):
    result = check(facts("healthy"), ctx(count=8))
    assert result.status in ("ok", "skip"), result
    assert result.action == "none"


FAULTS = [
    ("gpu-lost", gpu.count, "fail", "reboot", "GPU 3 GpuIsLost"),
    ("gpu-missing", gpu.count, "fail", "reboot", "7 GPUs visible, 8 expected"),
    ("ecc-dbe", gpu.ecc, "fail", "reset_gpu", "GPU 2 (0000:3a:00) 2 uncorrectable"),
    ("ecc-off", gpu.ecc, "fail", "drain", "GPU 5 (0000:ab:00) ECC disabled"),
    (
        "remap-failure",
        gpu.row_remap,
        "fail",
        "service",
        "GPU 1 (0000:2a:00) row remapping failed",
    ),
    (
        "remap-pending",
        gpu.row_remap,
        "warn",
        "reset_gpu",
        "GPU 6 (0000:ba:00) row remap pending",
    ),
    (
        "recovery-reset",
        gpu.recovery_action,
        "fail",
        "reset_gpu",
        "GPU 4 (0000:9a:00) driver requires GPU_RESET",
    ),
    ("persistence-off", gpu.persistence, "fail", "drain", "persistence mode off (+7 more GPUs)"),
    (
        "processes-left",
        gpu.processes,
        "fail",
        "drain",
        "GPU 0 (0000:18:00) has 1 compute process, pid 48211",
    ),
    ("thermal", gpu.thermal, "warn", "none", "GPU 7 (0000:db:00) at 88 C, slowdown at 87 C"),
    ("pcie-x8", gpu.pcie, "fail", "drain", "GPU 2 (0000:3a:00) PCIe width x 8 < 16"),
    ("fabric-in-progress", gpu.fabric, "fail", "drain", "fabric IN_PROGRESS"),
    ("vbios-drift", gpu.versions, "warn", "none", "GPU 3 (0000:5d:00) VBIOS 96.00.74.00.0D"),
    (
        "remap-spares-gone",
        gpu.row_remap,
        "fail",
        "service",
        "GPU 2 (0000:3a:00) 512 rows remapped for uncorrectable errors, spare-row limit 512",
    ),
    (
        "retired-pages-full",
        gpu.row_remap,
        "fail",
        "service",
        "GPU 0 (0000:18:00) 64 retired pages, table limit 63",
    ),
    (
        "sbe-tens-of-millions",
        gpu.corrected_ecc,
        "warn",
        "none",
        "GPU 4 (0000:9a:00) 31457280 corrected ECC errors (volatile), warn at 10000000",
    ),
    (
        "gpu-model-odd",
        gpu.model,
        "fail",
        "service",
        "GPU 5 (0000:ab:00) NVIDIA H100 PCIe, 7 others NVIDIA H100 80GB HBM3",
    ),
    (
        "ecc-pending-off",
        gpu.ecc,
        "warn",
        "none",
        "GPU 1 (0000:2a:00) ECC will be disabled at the next reboot",
    ),
    ("mig-pending", gpu.mig, "warn", "none", "GPU 4 (0000:9a:00) MIG on pending (now off)"),
]


@pytest.mark.parametrize(
    ("variant", "check", "status", "action", "message"), FAULTS, ids=[f[0] for f in FAULTS]
)
def test_each_fault_gives_its_status_and_action(variant, check, status, action, message):
    result = check(facts(variant), ctx(count=8))
    assert (result.status, result.action) == (status, action), result
    assert message in result.message


@pytest.mark.parametrize(
    ("variant", "check"), [(f[0], f[1]) for f in FAULTS], ids=[f[0] for f in FAULTS]
)
def test_a_fault_touches_only_its_own_check(variant, check):
    """Every other check stays ok on a one-fault variant (no double counting)."""
    others = [c for c in gpu.CHECKS if c is not check and c is not gpu.count]
    for other in others:
        assert other(facts(variant), ctx(count=8)).status in ("ok", "skip"), other.__name__


def test_thermal_names_clock_event_reasons():
    result = gpu.thermal(facts("thermal"), ctx())
    assert "HW slowdown" in result.message or "HW thermal slowdown" in str(result.data)


def test_pcie_expected_generation_above_what_is_seen_fails():
    result = gpu.pcie(facts("healthy"), ctx(pcie_gen=6))
    assert result.status == "fail" and "gen 5 < 6" in result.message


def test_pcie_current_width_is_never_compared():
    f = facts("healthy")
    for dev in f["devices"]:
        dev["pcie_cur_width"] = 2  # idle links drop: must not matter
    assert gpu.pcie(f, ctx()).status == "ok"


def test_pre_ampere_pending_retirement_fails_but_hopper_ignores_the_field():
    f = facts("healthy")
    f["devices"][0]["fields"]["retired_pending"] = 1
    assert gpu.row_remap(f, ctx()).status == "ok"  # Hopper: row remapping, not retirement
    f["devices"][0]["arch"] = 5  # Volta
    result = gpu.row_remap(f, ctx())
    assert (result.status, result.action) == ("fail", "reset_gpu")


def test_inventory_change_is_reported_against_the_baseline():
    healthy = facts("healthy")
    before = gpu.baseline(healthy)
    before["inventory"]["3"]["uuid"] = "GPU-old"
    result = gpu.inventory(healthy, Context(baseline=before))
    assert result.status == "warn" and "GPU 3 (0000:5d:00) uuid GPU-old ->" in result.message
    assert gpu.inventory(healthy, Context(baseline=gpu.baseline(healthy))).status == "ok"
    before = gpu.baseline(healthy)
    before["inventory"]["5"]["serial"] = "1650000000000"  # the board was replaced
    result = gpu.inventory(healthy, Context(baseline=before))
    assert result.status == "warn"
    assert "GPU 5 (0000:ab:00) serial 1650000000000 ->" in result.message


def test_driver_drift_warns():
    result = gpu.versions(facts("healthy"), ctx(driver_version="580.95.05"))
    assert result.status == "warn" and "driver 550.90.07, expected 580.95.05" in result.message


def test_vbios_is_compared_within_one_model_only():
    """Each GPU model has its own VBIOS line: a node whose GPUs are two models (gpu.model
    fails it) does not also warn that one model's VBIOS drifted from the other's."""
    f = facts("healthy")
    for dev in f["devices"][:2]:
        dev.update(name="NVIDIA L40S", vbios="95.02.5D.00.01")
    assert gpu.versions(f, ctx()).status == "ok"
    f["devices"][1]["vbios"] = "95.02.3C.00.02"  # one L40S of two: a tie, the first wins
    res = gpu.versions(f, ctx())
    assert res.status == "warn"
    assert res.message == "GPU 1 (0000:2a:00) VBIOS 95.02.3C.00.02, expected 95.02.5D.00.01"
    # The golden VBIOS is the main model's: the other model's GPUs keep to their own.
    main = f["devices"][5]["vbios"]
    assert gpu.versions(f, ctx(vbios_version=main)).message.startswith("GPU 1 (0000:2a:00)")
    other = gpu.versions(f, ctx(vbios_version="96.00.A1.00.01"))
    assert other.message.endswith("(+6 more)")  # GPU 1 among the L40S, GPUs 2-7 the golden
    assert other.data["drift"][1].endswith("expected 96.00.A1.00.01")


def test_recovery_action_reboot_wins_over_reset():
    f = facts("healthy")
    f["devices"][0]["fields"]["recovery_action"] = 1
    f["devices"][1]["fields"]["recovery_action"] = 2
    assert gpu.recovery_action(f, ctx()).action == "reboot"


def test_no_gpus_and_none_expected_is_skip():
    assert gpu.count(gpu.parse({"count": 0, "devices": []}), ctx()).status == "skip"


def test_epilog_processes_only_on_the_jobs_gpus():
    f = facts("processes-left")  # the process sits on GPU 0
    epilog = Context("gpu01", "epilog", ctx().expect, job_gpus=[4, 5])
    assert gpu.processes(f, epilog).status == "ok"
    epilog.job_gpus = [0]
    assert gpu.processes(f, epilog).status == "fail"


def test_processes_of_other_running_jobs_are_never_leftovers():
    f = facts("processes-left")  # the process sits on GPU 0
    expect = ctx().expect

    def judged(phase, running, job_gpus=None):
        baseline = {} if running == "absent" else {"open_jobs": running}
        return gpu.processes(f, Context("gpu01", phase, expect, baseline, job_gpus=job_gpus))

    # the prolog of a job on GPUs 4-5 of a shared node: GPU 0 is another job's
    assert judged("prolog", ["7"], [4, 5]).status == "ok"
    assert judged("prolog", None, [0]).status == "fail"
    # no GPUs named (a job without GPUs): judged unless another job runs here
    assert judged("prolog", [], None).status == "fail"
    assert judged("prolog", ["7"], None).status == "ok"
    # the health check: only when no job runs, and never when that is not known
    assert judged("healthcheck", []).status == "fail"
    running = judged("healthcheck", ["7", "8"])
    assert running.status == "ok" and running.message == "not judged: jobs running here"
    assert running.data["running_jobs"] == ["7", "8"]
    assert judged("healthcheck", None).status == "ok"
    assert judged("healthcheck", "absent").status == "ok"
    # `check` only reports: not known is judged
    assert judged("check", None).status == "fail"
    assert judged("check", ["7"]).status == "ok"


def test_a_job_hook_leaves_a_mig_gpu_alone_while_other_jobs_may_use_its_instances():
    """A GPU in MIG mode runs other jobs on its other instances: their processes are no
    leftovers. Judged only when the store knows no other job runs on the node."""
    f = facts("processes-left")  # the process sits on GPU 0
    f["devices"][0]["mig_current"] = 1
    expect = ctx().expect

    def judged(running):
        baseline = {} if running == "absent" else {"open_jobs": running}
        return gpu.processes(f, Context("gpu01", "prolog", expect, baseline, job_gpus=[0]))

    shared = judged(["7"])
    assert shared.status == "ok" and shared.data["shared"] == ["GPU 0 (0000:18:00)"]
    assert shared.message == (
        "no compute processes left (GPU 0 (0000:18:00) in MIG mode shared with other jobs: "
        "not judged)"
    )
    assert judged("absent").status == "ok"
    assert judged([]).status == "fail"


def mig_raw() -> dict:
    """The healthy node's GPU facts with GPUs 0 and 1 in MIG mode, two MIG devices each."""
    with open(snapshot_path("healthy")) as handle:
        raw = json.load(handle)["gpu"]
    for g in (0, 1):
        dev = raw["devices"][g]
        dev["mig_current"] = 1
        dev["mig_devices"] = [
            {"index": k, "uuid": f"MIG-aa{g}{k}", "gi": k + 3, "ci": 0} for k in range(2)
        ]
    return raw


def test_job_scope_without_mig_is_slurms_indexes_checked_against_nvmls():
    with open(snapshot_path("healthy")) as handle:
        raw = json.load(handle)["gpu"]
    assert gpu.job_scope(raw, [5, 4], None) == ([4, 5], "")
    assert gpu.job_scope(raw, [4, 9], None) == (
        None,
        "GPU index 9 from slurmd not among the GPUs NVML lists",
    )
    assert gpu.job_scope(raw, None, None) == (None, "")
    assert gpu.job_scope(None, [4], None) == ([4], "")  # no GPU facts: as slurmd says


def test_job_scope_maps_mig_devices_to_their_gpus_in_both_of_slurms_forms():
    raw = mig_raw()
    gpu1 = raw["devices"][1]["uuid"]
    # MIG device UUIDs (drivers from 470.42.01) and MIG-<GPU UUID>/<GI>/<CI> (before)
    assert gpu.job_scope(raw, [2], ["MIG-aa10"]) == ([1], "")
    assert gpu.job_scope(raw, [0, 3], ["MIG-aa01", f"MIG-{gpu1}/4/0"]) == ([0, 1], "")
    unknown = (None, "MIG device MIG-ffff not found on any GPU")
    assert gpu.job_scope(raw, [2], ["MIG-ffff"]) == unknown
    # Slurm's indexes count MIG devices: without their ids the GPUs are not known
    none, why = gpu.job_scope(raw, [2], ["2"])
    assert none is None and why.startswith("MIG mode on: slurmd named no MIG device")
    assert gpu.job_scope(None, [2], ["MIG-aa10"])[0] is None


def test_a_gpu_judged_alone_is_still_compared_with_all_its_peers():
    """model and pcie judge a GPU against the node's majority: narrowed to one GPU
    (for_gpus, a job hook's own GPUs), the reference stays every GPU's."""
    odd, wide = facts("gpu-model-odd"), facts("pcie-x8")

    def alone(f, index):
        return gpu.for_gpus(f, ctx(), lambda i: i == index)

    assert gpu.model(alone(odd, 5), ctx()).message == (
        "GPU 5 (0000:ab:00) NVIDIA H100 PCIe, 7 others NVIDIA H100 80GB HBM3"
    )
    assert gpu.model(alone(odd, 4), ctx()).status == "ok"
    assert gpu.pcie(alone(wide, 2), ctx()).message == "GPU 2 (0000:3a:00) PCIe width x 8 < 16"
    assert gpu.pcie(alone(wide, 3), ctx()).status == "ok"


def test_parse_survives_garbage():
    for raw in (
        None,
        [],
        "x",
        {"devices": "x"},
        {"devices": [None, 3, {"fields": 5}]},
        {"count": "eight", "devices": [{"index": "0", "nvlink": "x", "fabric": []}]},
    ):
        parsed = gpu.parse(raw)
        for check in gpu.CHECKS:
            check(parsed, ctx())


def test_expectations_of_a_known_good_node():
    assert gpu.expectations(facts("healthy")) == {
        "count": 8,
        "model": "NVIDIA H100 80GB HBM3",
        "mig": "off",
        "pcie_gen": 5,
        "pcie_width": 16,
        "driver_version": "550.90.07",
        "vbios_version": "96.00.99.00.01",
    }


def test_memory_errors_warn_on_growth_since_the_baseline():
    healthy = facts("healthy")
    assert gpu.memory_errors(healthy, ctx()).message == "baseline recorded"
    before = gpu.baseline(healthy)
    grown = facts("healthy")
    grown["devices"][4]["fields"]["remap_correctable"] = 1
    grown["devices"][1]["fields"]["ecc_sbe_volatile"] = 5000
    result = gpu.memory_errors(grown, Context(expect=ctx().expect, baseline=before))
    assert result.status == "warn"
    assert "GPU 1 (0000:2a:00) 5000 new correctable ECC errors" in result.message
    grown["devices"][1]["fields"] = healthy["devices"][1]["fields"]  # only the row grows now
    result = gpu.memory_errors(grown, Context(expect=ctx().expect, baseline=before))
    assert result.message == "GPU 4 (0000:9a:00) 1 new remapped row", result.message
    assert result.data["deltas"]["4"] == {"remap_correctable": 1}
    assert gpu.memory_errors(healthy, Context(expect=ctx().expect, baseline=before)).status == "ok"


def test_versions_of_records_the_driver_and_the_vbios_set_of_answering_gpus():
    drift = gpu.versions_of(facts("vbios-drift"))
    assert drift["driver"] == facts("vbios-drift")["driver_version"]
    assert drift["vbios"] == sorted({d["vbios"] for d in facts("vbios-drift")["devices"]})
    assert len(drift["vbios"]) == 2
    lost = facts("gpu-lost")
    answering = {d["vbios"] for d in lost["devices"] if not d["error"] and d["vbios"]}
    assert gpu.versions_of(lost)["vbios"] == sorted(answering)


# ---------------------------------------------------------------- absolute thresholds


def test_first_run_is_no_free_pass():
    """No baseline: the absolute thresholds still judge (remaps, retired pages, corrected ECC)."""
    for variant, check in (
        ("remap-spares-gone", gpu.row_remap),
        ("retired-pages-full", gpu.row_remap),
        ("sbe-tens-of-millions", gpu.corrected_ecc),
    ):
        result = check(facts(variant), Context(expect=ctx().expect, baseline={}))
        assert result.status in ("warn", "fail"), variant


def test_remap_failure_still_leads_and_the_limit_follows():
    result = gpu.row_remap(facts("remap-failure"), ctx())  # 512 rows and the failure flag
    assert result.message.startswith("GPU 1 (0000:2a:00) row remapping failed (+1 more)")
    assert (result.status, result.action) == ("fail", "service")


def test_remap_limit_is_configurable_and_counts_only_uncorrectable_rows():
    f = facts("healthy")
    f["devices"][3]["fields"]["remap_correctable"] = 600  # correctable remaps can be taken back
    f["devices"][3]["fields"]["remap_uncorrectable"] = 511
    assert gpu.row_remap(f, ctx()).status == "ok"
    assert gpu.row_remap(f, ctx(remap_rows_max=256)).status == "fail"


def test_retired_page_table_judged_only_before_ampere_and_only_when_read():
    f = facts("retired-pages-full")
    f["devices"][0]["fields"]["retired_sbe"] = 18  # 62 pages: under DCGM's 63
    assert gpu.row_remap(f, ctx()).status == "ok"
    assert gpu.row_remap(f, ctx(retired_pages_max=60)).status == "fail"
    f["devices"][0]["fields"]["retired_sbe"] = 20
    f["devices"][0]["arch"] = 7  # Ampere: row remapping, the retirement counts do not apply
    assert gpu.row_remap(f, ctx()).status == "ok"
    f["devices"][0]["arch"] = 5
    del f["devices"][0]["fields"]["retired_sbe"], f["devices"][0]["fields"]["retired_dbe"]
    assert gpu.row_remap(f, ctx()).status == "ok"  # not read by the source: nothing to judge


def test_corrected_ecc_prefers_the_aggregate_count_and_skips_when_unreported():
    f = facts("healthy")
    f["devices"][5]["fields"]["ecc_sbe_aggregate"] = 12_000_000
    result = gpu.corrected_ecc(f, ctx())
    assert result.status == "warn" and "12000000 corrected ECC errors (aggregate)" in result.message
    assert gpu.corrected_ecc(f, ctx(sbe_total_warn=20_000_000)).status == "ok"
    for dev in f["devices"]:
        dev["fields"] = {}
    assert gpu.corrected_ecc(f, ctx()).status == "skip"


def test_memory_counter_that_went_down_starts_a_new_baseline():
    before = gpu.baseline(facts("healthy"), now=0.0)
    before["counters"]["6"]["ecc_sbe_volatile"] = 900  # the driver reloaded since
    result = gpu.memory_errors(facts("healthy"), Context(expect=ctx().expect, baseline=before))
    assert result.status == "ok"
    assert result.message == "counter reset: new baseline (GPU 6 (0000:ba:00) ecc_sbe_volatile)"


def test_baseline_keeps_the_time_it_was_read():
    assert gpu.baseline(facts("healthy"), now=77.0)["taken_at"] == 77.0
    assert isinstance(gpu.baseline(facts("healthy"))["taken_at"], float)


def test_baseline_keeps_the_energy_counters_that_answered():
    f = facts("healthy")
    f["devices"][0]["fields"]["energy_mj"] = 123_456_789
    f["devices"][1]["fields"]["energy_mj"] = None  # NotSupported
    assert gpu.baseline(f)["energy"] == {"0": 123_456_789}


# ---------------------------------------------------------------- what the node should be


def _named(name: str, memory: int | None = None) -> dict:
    f = facts("healthy")
    for dev in f["devices"]:
        dev["name"] = name
        if memory is not None:
            dev["memory_total"] = memory
    return f


def test_one_gpu_of_another_model_fails_naming_it_and_the_majority():
    f = _named("NVIDIA A100-SXM4-80GB", 85899345920)
    f["devices"][5]["name"] = "NVIDIA A100-SXM4-40GB"
    f["devices"][5]["memory_total"] = 42949672960
    result = gpu.model(f, ctx())
    assert (result.status, result.action) == ("fail", "service")
    assert result.message == (
        "GPU 5 (0000:ab:00) NVIDIA A100-SXM4-40GB, 7 others NVIDIA A100-SXM4-80GB"
    )


def test_one_gpu_with_other_memory_under_the_same_name_fails():
    f = facts("healthy")
    f["devices"][3]["memory_total"] = 42949672960  # 40 GiB among 81559 MiB parts
    result = gpu.model(f, ctx())
    assert (result.status, result.action) == ("fail", "service")
    assert result.message == (
        "GPU 3 (0000:5d:00) NVIDIA H100 80GB HBM3 40960 MiB, 7 others 81559 MiB"
    )
    f["devices"][3]["memory_total"] = 85520809984 - 512 * 2**20  # a few hundred MiB off: same part
    assert gpu.model(f, ctx()).status == "ok"


def test_model_expectation_judges_every_gpu():
    assert gpu.model(facts("healthy"), ctx(model="NVIDIA H100 80GB HBM3")).status == "ok"
    result = gpu.model(facts("healthy"), ctx(model="NVIDIA H200"))
    assert (result.status, result.action) == ("fail", "service")
    assert result.message == (
        "GPU 0 (0000:18:00) NVIDIA H100 80GB HBM3, expected NVIDIA H200 (+7 more GPUs)"
    )
    odd = gpu.model(facts("gpu-model-odd"), ctx(model="NVIDIA H100 80GB HBM3"))
    assert odd.message == "GPU 5 (0000:ab:00) NVIDIA H100 PCIe, expected NVIDIA H100 80GB HBM3"


def test_model_skips_when_no_name_is_reported():
    f = facts("healthy")
    for dev in f["devices"]:
        dev["name"] = None
    assert gpu.model(f, ctx()).status == "skip"


def test_ecc_off_now_still_fails_and_pending_off_only_warns():
    off = gpu.ecc(facts("ecc-off"), ctx())  # off now and pending: the fail stands
    assert (off.status, off.action, off.message) == (
        "fail",
        "drain",
        "GPU 5 (0000:ab:00) ECC disabled",
    )
    f = facts("healthy")
    f["devices"][5]["fields"]["ecc_pending"] = 1
    f["devices"][5]["fields"]["ecc_current"] = 0  # off now, on after the reboot: still off now
    assert gpu.ecc(f, ctx()).status == "fail"
    assert gpu.ecc(facts("ecc-pending-off"), ctx(ecc=False)).status == "ok"
    dbe = facts("ecc-dbe")
    dbe["devices"][1]["fields"]["ecc_pending"] = 0
    assert gpu.ecc(dbe, ctx()).status == "fail"  # the worse news leads


def test_mig_mode_against_the_expectation():
    assert gpu.mig(facts("healthy"), ctx(mig="off")).status == "ok"
    on = gpu.mig(facts("mig-on"), ctx())
    assert on.status == "warn", "no expectation: one GPU in MIG mode among the others warns"
    result = gpu.mig(facts("mig-on"), ctx(mig="off"))
    assert (result.status, result.action) == ("fail", "drain")
    assert result.message == "GPU 6 (0000:ba:00) MIG on, expected off"
    result = gpu.mig(facts("healthy"), ctx(mig="on"))
    assert result.message == "GPU 0 (0000:18:00) MIG off, expected on (+7 more GPUs)"


def test_one_gpu_in_mig_mode_among_the_others_warns_with_a_drain_hint():
    """No expectation: the GPUs of one node agree on MIG mode. One GPU in MIG mode warns (a
    job handed it as a whole GPU finds no CUDA device), with drain as the hint; a split can be
    meant, so it never drains alone."""
    res = gpu.mig(facts("mig-on"), ctx())
    assert (res.status, res.action) == ("warn", "drain")
    assert res.message == "GPU 6 (0000:ba:00) MIG on, 7 others off"
    assert res.data["mixed"] == ["GPU 6 (0000:ba:00) MIG on, 7 others off"]
    # The fewer are named: one GPU left off among seven in MIG mode.
    f = facts("healthy")
    for dev in f["devices"][1:]:
        dev["mig_current"] = dev["mig_pending"] = 1
    res = gpu.mig(f, ctx())
    assert (res.status, res.message) == ("warn", "GPU 0 (0000:18:00) MIG off, 7 others on")
    # An even split names the GPUs in MIG mode.
    for dev in f["devices"][1:4]:
        dev["mig_current"] = dev["mig_pending"] = 0
    res = gpu.mig(f, ctx())
    assert res.message == "GPU 4 (0000:9a:00) MIG on, 4 others off (+3 more GPUs)"


def test_a_reconfiguration_under_way_is_judged_by_the_pending_modes():
    """An admin turning MIG on GPU by GPU: the ones done are on, the rest wait for their reset
    with MIG on pending. The node will be uniform: only the pending changes warn, no split."""
    f = facts("healthy")
    for dev in f["devices"][:3]:
        dev["mig_current"] = dev["mig_pending"] = 1
    for dev in f["devices"][3:]:
        dev["mig_pending"] = 1
    res = gpu.mig(f, ctx())
    assert res.status == "warn" and res.action == "none" and res.data["mixed"] == []
    assert res.message == "GPU 3 (0000:5d:00) MIG on pending (now off) (+4 more GPUs)"
    # With the expectation set, a GPU in the other mode still fails, split or not.
    assert gpu.mig(facts("mig-on"), ctx(mig="off")).status == "fail"
    assert gpu.mig(facts("healthy"), ctx(mig="off")).status == "ok"


def test_a_gpu_without_mig_counts_as_off():
    f = facts("mig-on")
    for dev in f["devices"][:6]:
        dev["mig_current"] = dev["mig_pending"] = None  # NotSupported
    res = gpu.mig(f, ctx())
    assert res.message == "GPU 6 (0000:ba:00) MIG on, 7 others off"


def test_mig_not_supported_is_off():
    f = facts("healthy")
    for dev in f["devices"]:
        dev["mig_current"] = dev["mig_pending"] = None
    assert gpu.mig(f, ctx()).status == "skip"
    assert gpu.mig(f, ctx(mig="off")).status == "skip"
    result = gpu.mig(f, ctx(mig="on"))
    assert (result.status, result.action) == ("fail", "drain")
    assert "MIG not reported, expected on" in result.message


def test_mig_pending_with_a_wrong_mode_fails():
    f = facts("mig-pending")
    result = gpu.mig(f, ctx(mig="on"))
    assert result.status == "fail" and "GPU 0 (0000:18:00) MIG off, expected on" in result.message
    assert "MIG on pending (now off)" in str(result.data["pending"])


def test_current_pcie_link_is_judged_only_under_load():
    result = gpu.pcie_link(facts("pcie-under-load-gen3"), ctx(count=8))
    assert (result.status, result.action) == ("warn", "none")
    assert result.message == "GPU 2 (0000:3a:00) PCIe link Gen3 x16 under load, expected Gen5 x16"
    idle = facts("healthy")
    for dev in idle["devices"]:
        dev["pcie_gen"], dev["pcie_width"] = 1, 8  # idle: NVIDIA says it may be reduced
    assert gpu.pcie_link(idle, ctx()).status == "ok"
    assert "not judged" in gpu.pcie_link(idle, ctx()).message


def test_current_pcie_width_under_load_and_the_expectations():
    f = facts("processes-left")  # a process on GPU 0
    assert gpu.pcie_link(f, ctx()).status == "ok"
    f["devices"][0]["pcie_width"] = 8
    result = gpu.pcie_link(f, ctx())
    assert result.status == "warn" and "Gen5 x8 under load, expected Gen5 x16" in result.message
    f["devices"][0]["pcie_width"], f["devices"][0]["pcie_gen"] = 16, 4
    assert gpu.pcie_link(f, ctx(pcie_gen=4)).status == "ok"  # the configured floor rules
    f["devices"][0]["pcie_gen"] = f["devices"][0]["pcie_width"] = None
    assert gpu.pcie_link(f, ctx()).status == "skip"


def test_under_load_fault_touches_only_the_link_and_the_left_process():
    variant = facts("pcie-under-load-gen3")
    for check in gpu.CHECKS:
        if check in (gpu.pcie_link, gpu.processes, gpu.count):
            continue
        assert check(variant, ctx(count=8)).status in ("ok", "skip"), check.__name__


def test_mig_on_fault_touches_only_mig():
    variant = facts("mig-on")
    for check in gpu.CHECKS:
        status = check(variant, ctx(count=8, mig="off")).status
        assert status in (("fail",) if check is gpu.mig else ("ok", "skip")), check.__name__


def test_a_snapshot_with_the_new_fields_mistyped_is_refused():
    from slurmhealth.node import replay

    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    assert replay.problem(doc, replay.SNAPSHOT) == ""
    for key, bad in (("memory_total", "80GB"), ("mig_current", [1]), ("pcie_gen", "5")):
        wrong = json.loads(json.dumps(doc))
        wrong["gpu"]["devices"][1][key] = bad
        assert replay.problem(wrong, replay.SNAPSHOT).startswith(f"gpu.devices.1.{key}: ")
    wrong = json.loads(json.dumps(doc))
    wrong["ib"]["devices"]["mlx5_0"]["current_link_width"] = 16
    assert replay.problem(wrong, replay.SNAPSHOT).startswith("ib.devices.mlx5_0.current_link_width")


def test_the_cuda_version_the_driver_supports_is_recorded():
    """Issue 13: nvmlSystemGetCudaDriverVersion 12040 is CUDA 12.4, compared across the fleet."""
    raw = {"driver_version": "550.90.07", "cuda_driver_version": 12040, "count": 0, "devices": []}
    facts = gpu.parse(raw)
    assert facts["cuda_version"] == "12.4" and gpu.versions_of(facts)["cuda"] == "12.4"
    assert "cuda" not in gpu.versions_of(gpu.parse(dict(raw, cuda_driver_version=None)))


def test_a_gpu_is_named_the_same_by_its_checks_and_by_its_xid_lines(tmp_path):
    """Index first, then the bus id in the kernel log's form: the ECC check (NVML says
    `00000000:3A:00.0`) and the Xid line (the kernel says `0000:3a:00`) name GPU 2 alike."""
    log = tmp_path / "xid48.kmsg"
    log.write_text(
        "3,500,99000000,-;NVRM: Xid (PCI:0000:3a:00): 48, pid=77, name=python3, "
        "An uncorrectable double bit error\n"
    )
    proc = run_cli(
        "check", "--no-db", "--json", "--gpu-source", snapshot_path("ecc-dbe"), "--kmsg", str(log)
    )
    assert proc.returncode == 1, proc.stderr
    said = {r["check"]: r["message"] for r in json.loads(proc.stdout)["results"]}
    assert said["gpu.ecc"].startswith("GPU 2 (0000:3a:00) 2 uncorrectable")
    assert said["xid.hardware"].startswith("GPU 2 (0000:3a:00) Xid 48")


# ---------------------------------------------------------------- thermal share of a job

HOUR = 3600.0


def with_thermal(name: str, seconds: dict) -> dict:
    """The scenario's facts with NVML's thermal-policy counter (field 75, ns) on every GPU:
    `seconds` by index, 0 elsewhere."""
    f = facts(name)
    for dev in f["devices"]:
        dev["fields"]["perf_thermal_ns"] = int(seconds.get(dev["index"], 0) * 1e9)
    return f


def at_epilog(end: dict, start: dict, span: float, job_gpus=None, **expect) -> object:
    """gpu.thermal_share at an epilog `span` seconds after the prolog that read `start`: the
    job's prolog reading as the agent hands it (`job_start` of the GPU baseline)."""
    prolog = gpu.baseline(start, now=1000.0)
    base = {k: v[0] for k, v in gpu.DEFAULTS.items()}
    base.update(expect)
    ctx = Context("gpu01", "epilog", base, {"job_start": prolog}, job_gpus=job_gpus)
    ctx.now = 1000.0 + span
    return gpu.thermal_share(end, ctx)


def test_a_job_that_spent_a_large_share_thermally_slowed_warns_naming_its_gpu():
    start = with_thermal("healthy", {3: 500, 5: 40})
    end = with_thermal("healthy", {3: 500 + 0.25 * 2 * HOUR, 5: 40 + 0.05 * 2 * HOUR})
    res = at_epilog(end, start, 2 * HOUR)
    assert (res.status, res.action) == ("warn", "none")
    assert res.message == "GPU 3 (0000:5d:00) thermally slowed 25% of the job (1800 s of 7200 s)"
    assert res.data["share"]["3"] == 0.25 and res.data["share"]["5"] == 0.05
    # the share is the setting's
    assert at_epilog(end, start, 2 * HOUR, thermal_share_warn=0.3).status == "ok"
    assert at_epilog(end, start, 2 * HOUR, thermal_share_warn=0.04).message.endswith(
        "(+1 more GPU)"
    )


def test_thermal_share_judges_only_the_jobs_gpus_that_stayed_the_same():
    start = with_thermal("healthy", {})
    end = with_thermal("healthy", {3: 0.5 * HOUR, 4: 0.5 * HOUR})
    assert at_epilog(end, start, HOUR, job_gpus=[0, 1]).status == "ok"
    res = at_epilog(end, start, HOUR, job_gpus=[4])
    assert res.status == "warn" and res.message.startswith("GPU 4 ")
    swapped = copy.deepcopy(end)
    swapped["devices"][4]["uuid"] = "GPU-another-board"
    assert at_epilog(swapped, start, HOUR, job_gpus=[4]).data["share"] == {}


def test_thermal_share_ignores_short_slowdowns_and_counters_that_fell():
    start = with_thermal("healthy", {2: 900})
    # 50 s of a 100 s job: half of it, but under a minute in all
    assert at_epilog(with_thermal("healthy", {2: 950}), start, 100.0).status == "ok"
    # the counter fell: the driver reloaded during the job, the job's share is unknown
    fell = at_epilog(with_thermal("healthy", {2: 10}), start, HOUR, job_gpus=[2])
    assert fell.status == "ok" and fell.data["share"] == {}
    assert fell.message.startswith("not judged")


def test_thermal_share_is_judged_only_at_an_epilog_with_its_prolog_reading():
    f = with_thermal("healthy", {3: HOUR})
    for phase in ("prolog", "healthcheck", "check"):
        res = gpu.thermal_share(f, Context("gpu01", phase, {}, {"job_start": {"taken_at": 1.0}}))
        assert res.status == "ok" and res.message.startswith("not judged")
    # an epilog whose prolog left no reading (no store, an older version's baseline)
    assert gpu.thermal_share(f, Context("gpu01", "epilog", {}, {})).status == "ok"
    no_counter = at_epilog(facts("healthy"), facts("healthy"), HOUR)
    assert no_counter.status == "ok" and no_counter.message.startswith("not judged")
