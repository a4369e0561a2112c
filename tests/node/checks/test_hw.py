"""checks/hw.py: parse is total; a lost DIMM, low memory, swap, huge pages, lost or offline CPUs
and a changed topology give their status and action; defaults pass any node."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fs import json_values

from slurmhealth.core import result
from slurmhealth.node import config
from slurmhealth.node.checks import hw
from slurmhealth.node.checks.base import Context

KIB_PER_GIB = 1 << 20


def raw(mem_gib: float = 503.5, available_gib: float = 480.0, swap_gib: float = 0.0,
        hugepages: int = 0, online: str = "0-223", present: str = "0-223", smt: str = "on",
        packages: dict | None = None, threads: str = "0,112") -> dict:
    """The host section of a 2-socket, 112-core, SMT node (sources/host.py's shape)."""
    return {
        "meminfo": {
            "MemTotal": f"{int(mem_gib * KIB_PER_GIB)} kB",
            "MemAvailable": f"{int(available_gib * KIB_PER_GIB)} kB",
            "SwapTotal": f"{int(swap_gib * KIB_PER_GIB)} kB",
            "SwapFree": f"{int(swap_gib * KIB_PER_GIB)} kB",
            "HugePages_Total": str(hugepages),
        },
        "cpu": {"online": online, "present": present, "possible": present, "smt": smt,
                "packages": packages or {"0": "0-55,112-167", "56": "56-111,168-223"},
                "threads": threads},
    }


def run(check, raw_facts: dict, **over) -> result.Result:
    expect = dict(config.defaults()["hw"], **over)
    res = check(hw.parse(raw_facts), Context(expect=expect))
    assert isinstance(res, result.Result)
    return res


def status(res) -> tuple:
    return (res.status, res.action)


def test_parse_reads_gib_cpus_and_topology():
    facts = hw.parse(raw())
    assert facts["memory_gb"] == pytest.approx(503.5)
    assert facts["available_gb"] == pytest.approx(480.0)
    assert facts["cpus"]["sockets"] == 2 and facts["cpus"]["threads_per_core"] == 2
    assert len(facts["cpus"]["online"]) == 224


def test_mem_available_falls_back_on_old_kernels():
    old = {"meminfo": {"MemFree": "1024 kB", "Buffers": "1024 kB", "Cached": "2048 kB"}}
    assert hw.parse(old)["available_gb"] == pytest.approx(4096 / KIB_PER_GIB)


@settings(max_examples=150, deadline=None)
@given(raw_facts=st.one_of(
    json_values,
    st.fixed_dictionaries({"meminfo": st.dictionaries(st.text(max_size=12), json_values),
                           "cpu": st.dictionaries(st.sampled_from(
                               ["online", "present", "smt", "packages", "threads"]),
                               json_values)}),
))
def test_parse_and_checks_never_raise(raw_facts):
    facts = hw.parse(raw_facts)
    expect = dict(config.defaults()["hw"], memory_gb=1.0, free_memory_gb=1.0, swap_gb=0.0,
                  swap_free_gb=1.0, hugepages=2, cpus=4, sockets=2, threads_per_core=2)
    for check in hw.CHECKS:
        assert check(facts, Context(expect=expect))


def test_defaults_pass_any_node():
    for raw_facts in (raw(), {}, raw(online="0-7", present="0-7", packages={"0": "0-7"},
                                    threads="0")):
        results = [run(check, raw_facts) for check in hw.CHECKS]
        assert {r.status for r in results} <= {"ok", "skip"}, results


def test_a_lost_dimm_fails_for_service_and_a_kernel_update_does_not():
    assert run(hw.memory, raw(mem_gib=503.5), memory_gb=512.0).status == "ok"  # 1.7% below
    res = run(hw.memory, raw(mem_gib=472.0), memory_gb=503.5)  # 1 DIMM of 16 gone
    assert status(res) == ("fail", "service")
    assert res.message == "memory 472.0 GiB, expected 503.5 GiB (-2%): a DIMM lost?"
    assert run(hw.memory, raw(mem_gib=1024.0), memory_gb=503.5).status == "ok"


def test_free_memory_below_the_floor_fails_drain():
    res = run(hw.free_memory, raw(available_gib=10.0), free_memory_gb=64.0)
    assert status(res) == ("fail", "drain")
    assert res.message == "10.0 GiB memory available (floor 64 GiB)"
    assert run(hw.free_memory, raw(), free_memory_gb=64.0).status == "ok"


def test_swap_and_huge_pages_as_expected():
    assert status(run(hw.swap, raw(swap_gib=0.0), swap_gb=8.0)) == ("fail", "drain")
    assert run(hw.swap, raw(swap_gib=8.0), swap_gb=0.0).status == "warn"
    assert run(hw.swap, raw(swap_gib=8.0), swap_gb=8.0, swap_free_gb=4.0).status == "ok"
    res = run(hw.hugepages, raw(hugepages=512), hugepages=1024)
    assert status(res) == ("fail", "drain") and res.message == "512 huge pages, expected 1024"


def test_cpus_lost_fail_for_service_and_offline_ones_warn():
    lost = raw(online="0-111", present="0-111", packages={"0": "0-55"}, threads="0")
    res = run(hw.cpu_count, lost, cpus=224)
    assert status(res) == ("fail", "service") and res.message == "112 CPUs online, expected 224"
    offline = raw(online="0-221", present="0-223")
    res = run(hw.cpus_online, offline)
    assert status(res) == ("warn", "none") and res.message == "2 CPUs offline (222-223)"
    assert run(hw.cpus_online, offline, online=False).status == "ok"
    assert run(hw.cpus_online, dict(offline, cpu=dict(offline["cpu"], smt="off"))).status == "ok"
    assert status(run(hw.cpu_count, offline, cpus=224)) == ("fail", "service")


def test_a_lost_socket_and_smt_switched_off_fail():
    one = raw(packages={"0": "0-55,112-167"})
    res = run(hw.topology, one, sockets=2)
    assert status(res) == ("fail", "service") and res.message == "1 socket, expected 2"
    res = run(hw.topology, raw(threads="0"), threads_per_core=2)
    assert status(res) == ("fail", "drain") and res.message == "1 thread per core, expected 2"
    assert run(hw.topology, raw(), sockets=2, threads_per_core=2).status == "ok"
