"""core/slurm.py: the adapter runs real commands (a recording scontrol here; a real slurmctld in
tests/slurm). What it refuses never reaches the command at all."""

from __future__ import annotations

import pytest

from slurmhealth.core import slurm
from slurmhealth.core.hostlist import is_node_name


@pytest.fixture
def recorded(tmp_path):
    """A scontrol that writes its arguments, one call a line, and succeeds."""
    log = tmp_path / "calls"
    tool = tmp_path / "scontrol"
    tool.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    tool.chmod(0o755)
    return slurm.Slurm(slurm_bin=str(tmp_path)), log


@pytest.mark.parametrize(
    "name", ["gpu[01-64]", "gpu01,gpu02", "-v", "--help", "", "gpu 01", "gpu01\n", "a/b",
             "gpu\x1b7", "x" * 256, "gpu01]", "ALL", "State=RESUME"]  # fmt: skip
)
def test_a_name_that_is_not_one_node_never_reaches_scontrol(recorded, name):
    client, log = recorded
    for call in (
        lambda: client.drain(name, "slurmhealth: lemon"),
        lambda: client.resume(name),
        lambda: client.node(name),
    ):
        with pytest.raises(slurm.SlurmError, match="not a node name"):
            call()
    assert not log.exists()


def test_one_node_goes_through(recorded):
    client, log = recorded
    client.drain("gpu01.rack-2_b", "slurmhealth: GPU 3 GpuIsLost")
    client.resume("gpu01.rack-2_b")
    assert log.read_text().splitlines() == [
        "update NodeName=gpu01.rack-2_b State=DRAIN Reason=slurmhealth: GPU 3 GpuIsLost",
        "update NodeName=gpu01.rack-2_b State=RESUME",
    ]


def test_node_names():
    # Slurm's business: any printable name without hostlist syntax or white space
    assert all(map(is_node_name, ["gpu01", "n0001", "GPU-07", "a.b.c", "_x", "9", ".x", "é"]))
    assert not any(map(is_node_name, ["gpu[1-2]", "a,b", "-x", "a b", "a\tb", "a/b", None, 7]))
    # every node to `scontrol update NodeName=ALL` (a real Slurm drains them all), and options
    assert not any(map(is_node_name, ["ALL", "all", "All", "a=b", "Reason=x"]))
    assert is_node_name("allgpu01")


def test_a_slurm_bin_the_admin_named_is_the_only_one_used(recorded, tmp_path, monkeypatch):
    """settings.slurm_bin names this cluster's commands: when they are not there, another
    scontrol on PATH (another cluster's, a test's) is never called in their place."""
    _, log = recorded
    monkeypatch.setenv("PATH", str(tmp_path))  # the recording scontrol is on PATH
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(slurm.SlurmError, match="scontrol not found in .*empty"):
        slurm.Slurm(slurm_bin=str(empty)).drain("gpu01", "slurmhealth: x")
    assert not log.exists()
    slurm.Slurm().drain("gpu01", "slurmhealth: x")  # named by nobody: PATH is searched
    assert log.read_text().startswith("update NodeName=gpu01")


def test_a_node_in_two_partitions_is_one_node(tmp_path):
    """`sinfo -N` prints a node once per partition (real Slurm 22.05 does, for a node in a
    second, overlapping partition): the fleet is counted by node, not by line, for the report
    and for the circuit breaker's share."""
    tool = tmp_path / "sinfo"
    tool.write_text(
        "#!/bin/sh\nprintf '%s\\n' 'gpu01|idle|Unknown|none' 'gpu01|idle|Unknown|none' "
        "'gpu02|drained|2026-11-29T23:59:01|slurmhealth: GPU 3' "
        "'gpu02|drained|2026-11-29T23:59:01|slurmhealth: GPU 3'\n"
    )
    tool.chmod(0o755)
    nodes = slurm.Slurm(slurm_bin=str(tmp_path)).nodes()
    assert [n["name"] for n in nodes] == ["gpu01", "gpu02"]
    assert slurm.drained_by_us(nodes, 0) == ["gpu02"]


# `scontrol -o show node` lines (the fields parse_node reads, the rest cut) as Slurm 22.05.8
# printed them in the tests/slurm lab: a node whose reboot slurmctld issued while its slurmd was
# down (plain, ASAP, nextstate=DOWN), one it marked down when its slurmd stopped answering, and
# (reasons an admin could have given) a node set down and a drained one rebooted.
REBOOTING = "NodeName=gpu02 State=DOWN+REBOOT_ISSUED+NOT_RESPONDING Weight=20 Partitions=gpu "
NODES = {
    "plain": REBOOTING + "Reason=reboot requested : reboot issued [root@2026-12-06T05:16:26]",
    "asap": "NodeName=gpu02 State=DOWN+DRAIN+REBOOT_ISSUED+NOT_RESPONDING Weight=20 "
    "NextState=RESUME Partitions=gpu Reason=Reboot ASAP : reboot issued [root@2026-12-06T05:16:29]",
    "to_down": REBOOTING.replace("Partitions", "NextState=DOWN Partitions")
    + "Reason=reboot requested : reboot issued [root@2026-12-06T05:16:32]",
    "not_responding": "NodeName=gpu02 State=DOWN+NOT_RESPONDING Weight=20 Partitions=gpu "
    "Reason=Not responding [root@2026-12-06T05:17:05]",
    "admin_down": "NodeName=gpu02 State=DOWN Weight=20 Reason=admin: PSU [root@2026-12-06T05:18]",
    "drained_rebooting": "NodeName=gpu02 State=DOWN+DRAIN+REBOOT_ISSUED+NOT_RESPONDING Weight=20 "
    "Reason=admin: fan : reboot issued [root@2026-12-06T05:11:51]",
    "idle": "NodeName=gpu02 State=IDLE Weight=20 Partitions=gpu",
}


@pytest.mark.parametrize(
    ("node", "rejoins", "lifts"),
    [
        ("plain", True, False),  # returns to service at registration; a drain made now holds
        ("asap", True, True),  # returns, and Slurm lifts any DRAIN then (its own ASAP one too)
        ("to_down", False, True),  # ends DOWN: out, by the admin's choice
        ("not_responding", True, False),  # ReturnToService returns it; a drain holds
        ("admin_down", False, False),  # someone's DOWN: not ours to touch
        ("drained_rebooting", False, False),  # an admin's drain stays across a plain reboot
        ("idle", False, False),  # in service: drained as ever (may_drain)
    ],
)
def test_a_node_out_only_until_its_slurmd_registers_is_told_apart(node, rejoins, lifts):
    """What the health check at slurmd's start sees of its own node, before the registration
    that returns it to service (slurm.conf(5), HealthCheckProgram; scontrol(1), reboot)."""
    info = slurm.parse_node(NODES[node])
    assert slurm.rejoins(info) is rejoins
    assert slurm.lifts_drain(info) is lifts


def test_next_state_is_read_only_where_scontrol_prints_it():
    assert slurm.parse_node(NODES["asap"])["next_state"] == "RESUME"
    assert slurm.parse_node(NODES["asap"])["reason"] == "Reboot ASAP : reboot issued"
    assert "next_state" not in slurm.parse_node(NODES["plain"])
    assert slurm.parse_node(NODES["not_responding"])["reason"] == slurm.NOT_RESPONDING
