"""sources/host.py: /proc/meminfo (Documentation/filesystems/proc.rst), the CPU lists and
topology of /sys/devices/system/cpu (Documentation/ABI/stable/sysfs-devices-system-cpu,
Documentation/admin-guide/cputopology.rst) and adjtimex(2)."""

from __future__ import annotations

import json
import sys

import conftest
import pytest

from slurmhealth.node import config
from slurmhealth.node.checks import hw
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import Options, host

MEMINFO = """MemTotal:       527988424 kB
MemFree:        500000000 kB
MemAvailable:   511230112 kB
Buffers:            2048 kB
Cached:          8000000 kB
SwapTotal:       8388604 kB
SwapFree:        8388604 kB
HugePages_Total:    1024
HugePages_Free:     1024
Hugepagesize:       2048 kB
"""


def write_host(root, meminfo=MEMINFO, **cpus) -> str:
    """A host root with proc/meminfo and the CPU tree (conftest.hw_tree)."""
    return conftest.hw_tree(root, meminfo, **cpus)


@pytest.mark.parametrize(
    "text,cpus",
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0\n", [0]),
        ("", []),
        ("3-1", None),
        ("a-b", None),
        ("0-", None),
        (None, None),
        ("0-99999999", None),
    ],
)
def test_cpulist(text, cpus):
    assert host.cpulist(text) == cpus


def test_meminfo_keeps_each_value_as_written():
    found = host.meminfo(MEMINFO)
    assert found["MemTotal"] == "527988424 kB"
    assert found["HugePages_Total"] == "1024"
    assert host.meminfo(None) == {}
    assert host.meminfo("garbage\n: x\n") == {}


def test_gather_reads_one_topology_file_per_package(tmp_path):
    root = write_host(tmp_path / "host")
    raw = host.gather(Options(host_root=root))
    assert raw["meminfo"]["MemAvailable"] == "511230112 kB"
    cpu = raw["cpu"]
    assert (cpu["online"], cpu["present"], cpu["smt"]) == ("0-7", "0-7", "on")
    assert cpu["packages"] == {"0": "0-1,4-5", "2": "2-3,6-7"}
    assert cpu["threads"] == "0,4"
    assert json.loads(json.dumps(raw)) == raw
    assert "errors" not in raw


def test_an_empty_root_gives_errors_not_exceptions(tmp_path):
    raw = host.gather(Options(host_root=str(tmp_path)))
    assert raw["meminfo"] == {}
    assert raw["cpu"]["online"] is None and raw["cpu"]["packages"] == {}
    assert raw["errors"]["meminfo"] == "ENOENT"
    assert "smt" not in raw["cpu"]  # a kernel without smt/control: not an error


def test_the_job_hooks_leave_the_clock_where_ctypes_is_not_loaded(monkeypatch):
    monkeypatch.delitem(sys.modules, "ctypes", raising=False)
    assert host.clock(costly=False) == {"skipped": host.SKIPPED}


def test_live_gather_of_this_machine_is_sane():
    raw = host.gather(Options())
    facts = raw["meminfo"]
    assert int(facts["MemTotal"].split()[0]) > 0
    online = host.cpulist(raw["cpu"]["online"])
    assert online and set(online) <= set(host.cpulist(raw["cpu"]["present"]))
    assert raw["cpu"]["packages"]
    clock = raw["clock"]
    assert 0 <= clock["state"] <= 5 and clock["maxerror"] >= 0, clock


def test_genconf_of_a_fixture_tree_passes_its_own_checks(tmp_path):
    root = write_host(tmp_path / "host")
    facts = hw.parse(host.gather(Options(host_root=root)))
    found = hw.expectations(facts)
    assert found == {"memory_gb": 503.5, "swap_gb": 7.9, "hugepages": 1024, "cpus": 8,
                     "sockets": 2, "threads_per_core": 2}
    ctx = Context(expect=dict(config.defaults()["hw"], **found))
    assert {check(facts, ctx).status for check in hw.CHECKS} <= {"ok", "skip"}
