"""checks/base.py's shared-node rules: a job hook judges its job's own GPUs (job_verdict), for
every check an area names in SCOPED, against a fault on GPU 0 of the bundled 8-GPU snapshot
(tests/fixtures/snapshots) or a kernel-log line naming GPU 0's bus."""

from __future__ import annotations

import pytest
from conftest import faults_module

from slurmhealth.node.checks import AREAS, aer, gpu, nvlink, xid
from slurmhealth.node.checks.base import (
    Context,
    demoted,
    fails_node,
    job_verdict,
    other_gpus,
)
from slurmhealth.node.checks.base import Result as BaseResult

# GPU index -> bus id as the runner's bus map keys it (runner._bus_map: norm_bus_id)
BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
GPUS = {f"0000:{bus}:00": index for index, bus in enumerate(BUSES)}
GPU0 = "GPU 0 (0000:18:00)"
JOB = [4, 5, 6, 7]


def gpu_raw(patches: list) -> dict:
    faults = faults_module()
    raw: dict = faults.apply(faults.build("healthy"), patches)["gpu"]
    return raw


def kmsg_raw(*msgs: str, hours: float = 0.0) -> dict:
    step = int(hours * 3600e6 / max(len(msgs) - 1, 1))
    records = [{"seq": n, "usec": n * step, "pri": 3, "msg": m} for n, m in enumerate(msgs)]
    return {"records": records}


def on_gpu0(**fields: object) -> list:
    return [("set", f"gpu.devices.0.fields.{k}", v) for k, v in fields.items()]


def dev0(**values: object) -> list:
    return [("set", f"gpu.devices.0.{k}", v) for k, v in values.items()]


def with_c2c(raw: dict, links: list, **gpu0_fields: int) -> dict:
    """`raw` with every GPU coupled to a Grace CPU (NVLink-C2C): GPU 0 through `links` and with
    `gpu0_fields` as its counters, the others through one active link with counters at 0."""
    for dev in raw["devices"]:
        first = dev is raw["devices"][0]
        dev["c2c"] = links if first else [{"link": 0, "active": True}]
        dev["fields"].update({k: 0 for k in ("c2c_crc", "c2c_replay", "c2c_replay_b2b")})
        dev["fields"].update(gpu0_fields if first else {})
    return raw


def nvlink_bumped() -> tuple:
    """GPU 0's link 3 with 25 recoveries since the baseline (nvlink recovery_fail: 10)."""
    before = nvlink.baseline(nvlink.parse(gpu_raw([])))
    return gpu_raw([("set", "gpu.devices.0.nvlink.3.recovery", 25)]), {"baseline": before}


AER_FATAL = [
    "pcieport 0000:17:01.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0",
    "nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), "
    "type=Transaction Layer, (Requester ID)",
    "nvidia 0000:18:00.0: AER:   device [10de:2330] error status/mask=00004000/00000000",
    "nvidia 0000:18:00.0: AER:    [14] CmpltTO                (First)",
]
AER_CORRECTED = [
    "nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
    "(Receiver ID)",
    "nvidia 0000:18:00.0: AER:   device [10de:2330] error status/mask=00000001/0000e000",
    "nvidia 0000:18:00.0: AER:    [ 0] RxErr                  (First)",
]
XID48 = "NVRM: Xid (PCI:0000:18:00): 48, pid=77, name=python3, An uncorrectable double bit error"
RMINIT = "NVRM: GPU 0000:18:00.0: RmInitAdapter failed! (0x62:0x65:1792)"

# check -> (its raw facts with a fault on GPU 0, Context keywords, whether it only warns: then
# the config's severity override, [checks."<name>"] severity = "fail", makes it fail)
CASES = {
    "gpu.ecc": (gpu_raw(on_gpu0(ecc_dbe_volatile=2)), {}, False),
    "gpu.memory_errors": (
        gpu_raw(on_gpu0(remap_correctable=3)),
        {"baseline": {"counters": {str(i): {"remap_correctable": 0} for i in range(8)}}},
        True,
    ),
    "gpu.corrected_ecc": (
        gpu_raw(on_gpu0(ecc_sbe_volatile=31457280)),
        {},
        True,
    ),
    "gpu.row_remap": (gpu_raw(on_gpu0(remap_failure=1)), {}, False),
    "gpu.recovery_action": (gpu_raw(on_gpu0(recovery_action=1)), {}, False),
    "gpu.persistence": (gpu_raw(dev0(persistence=0)), {}, False),
    "gpu.cpu_links": (
        with_c2c(gpu_raw([]), [{"link": 0, "active": False}, {"link": 1, "active": True}]),
        {},
        False,
    ),
    "gpu.cpu_link_errors": (
        with_c2c(gpu_raw([]), [{"link": 0, "active": True}], c2c_crc=20000),
        {"baseline": {"counters": {str(i): {"c2c_crc": 0} for i in range(8)}}},
        False,
    ),
    "gpu.thermal": (gpu_raw(dev0(temperature=88, clock_event_reasons=72)), {}, True),
    "gpu.pcie": (gpu_raw(dev0(pcie_max_width=8)), {}, False),
    "gpu.pcie_link": (
        gpu_raw(
            [("append", "gpu.devices.0.processes", {"pid": 7, "used_memory": 1})]
            + dev0(pcie_gen=3)
        ),
        {},
        True,
    ),
    "gpu.model": (gpu_raw(dev0(name="NVIDIA H100 PCIe")), {}, False),
    "gpu.mig": (gpu_raw(dev0(mig_current=1, mig_pending=1)), {"expect": {"mig": "off"}}, False),
    "nvlink.link_state": (gpu_raw([("set", "gpu.devices.0.nvlink.4.active", False)]), {}, False),
    "nvlink.error_counters": (*nvlink_bumped(), False),
    "xid.hardware": (kmsg_raw(XID48), {}, False),
    "xid.gpu_init": (kmsg_raw(RMINIT), {}, False),
    "aer.uncorrectable": (kmsg_raw(*AER_FATAL), {}, False),
    "aer.correctable": (kmsg_raw(*AER_CORRECTED * 20, hours=0.5), {}, True),
}


def scoped_checks() -> set:
    return {f"{a}.{fn.__name__}" for a, m in AREAS.items() for fn in getattr(m, "SCOPED", ())}


def test_every_scoped_check_has_a_case_here():
    assert set(CASES) == scoped_checks()


def verdict(name: str, phase: str = "prolog", job_gpus: list | None = None) -> tuple:
    """(the check on every GPU, its job hook verdict) as runner._for_job judges it."""
    area, check_name = name.split(".")
    module = AREAS[area]
    fn = next(f for f in module.CHECKS if f.__name__ == check_name)
    raw, extra, warns = CASES[name]
    expect = {k: v[0] for k, v in module.DEFAULTS.items()}
    expect.update(extra.get("expect", {}))
    ctx = Context("gpu01", phase, expect, extra.get("baseline"), GPUS, job_gpus, now=1e9)
    facts = module.parse(raw)

    def judge(narrowed: dict) -> BaseResult:
        result = fn(narrowed, ctx)
        if warns and result.status == "warn":  # the severity override, as the runner's
            result.status = "fail"
        return result

    def narrow(keep):
        return module.for_gpus(facts, ctx, keep)

    node = judge(facts)
    return node, job_verdict(node, judge, narrow, ctx, list(range(8)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_fault_on_another_jobs_gpu_is_a_warning_naming_it_that_drains_the_node(name):
    node, mine = verdict(name, job_gpus=[4, 5, 6, 7])
    assert node.status == "fail" and GPU0 in node.message, node
    assert mine.status == "warn" and mine.message == node.message
    assert mine.action == node.action
    scope = {"job_gpus": [4, 5, 6, 7], "other_gpus": [0], "node_verdict": "fail"}
    assert mine.data["scope"] == scope
    assert fails_node(mine) and other_gpus(mine) == [0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_fault_on_the_jobs_own_gpu_refuses_it_naming_the_gpu(name):
    _, mine = verdict(name, job_gpus=[0, 1, 2, 3])
    assert mine.status == "fail" and GPU0 in mine.message


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize(("phase", "job"), [("healthcheck", JOB), ("check", JOB), ("prolog", None)])
def test_without_a_job_hook_or_its_gpus_every_gpu_is_judged(name, phase, job):
    node, verdict_ = verdict(name, phase, job)
    assert verdict_ is node


def test_a_gpu_the_kernel_log_names_by_an_unknown_bus_refuses_the_job():
    """The safe side: an Xid on a bus NVML never listed may be the job's GPU."""
    facts = xid.parse(kmsg_raw(XID48.replace("0000:18:00", "0000:77:00")))
    ctx = Context("gpu01", "prolog", {}, None, GPUS, [4, 5, 6, 7])
    node = xid.hardware(facts, ctx)

    def narrow(keep):
        return xid.for_gpus(facts, ctx, keep)

    result = job_verdict(node, lambda f: xid.hardware(f, ctx), narrow, ctx, list(range(8)))
    assert result.status == "fail" and "GPU 0000:77:00 Xid 48" in result.message


def test_an_aer_error_on_a_port_above_the_gpus_judges_the_node():
    lines = [line.replace("nvidia 0000:18:00.0", "pcieport 0000:17:01.0") for line in AER_FATAL]
    facts = aer.parse(kmsg_raw(*lines))
    ctx = Context("gpu01", "prolog", {"corrected_per_h": 10}, None, GPUS, [4, 5, 6, 7])
    node = aer.uncorrectable(facts, ctx)

    def narrow(keep):
        return aer.for_gpus(facts, ctx, keep)

    result = job_verdict(node, lambda f: aer.uncorrectable(f, ctx), narrow, ctx, list(range(8)))
    assert result.status == "fail" and "0000:17:01.0" in result.message


def test_a_fault_no_single_gpu_shows_stays_a_fail():
    """A check that fails only on two GPUs together: the job is refused (the safe side)."""
    facts = gpu.parse(gpu_raw([]))
    ctx = Context("gpu01", "epilog", {}, None, GPUS, [4, 5, 6, 7])

    def pair(f: dict, _ctx: Context) -> BaseResult:
        return BaseResult("fail" if len(f["devices"]) > 4 else "ok", "GPUs disagree")

    node = pair(facts, ctx)

    def narrow(keep):
        return gpu.for_gpus(facts, ctx, keep)

    assert job_verdict(node, lambda f: pair(f, ctx), narrow, ctx, list(range(8))) is node


def test_demoted_keeps_the_words_and_the_action_and_only_a_warning_with_gpus_drains():
    fault = BaseResult("fail", "GPU 0 (0000:18:00) row remapping failed", {"n": 1}, "service")
    fault.check = "gpu.row_remap"
    kept = demoted(fault, [4, 5], [0])
    assert (kept.status, kept.message, kept.action, kept.check) == (
        "warn",
        fault.message,
        "service",
        "gpu.row_remap",
    )
    assert kept.data["n"] == 1 and fails_node(kept) and fails_node(fault)
    assert not fails_node(BaseResult("warn", "GPU 0 at 88 C", {}))
    assert other_gpus(fault) is None
