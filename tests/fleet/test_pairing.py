"""fleet/pairing.py: the known-good peers a drained node is diagnosed against (choose: pure), what
the fleet store says of each node (a real store, runs and actions recorded through
core/store.py), Slurm's gres read as a GPU count, and the pair job's script. The sweep that
submits the job, on a real Slurm: tests/slurm/test_pairs.py."""

from __future__ import annotations

import shlex
import time

import pytest
from conftest import record_sources

from slurmhealth.core import store
from slurmhealth.fleet import pairing, peers
from slurmhealth.node.diag import pairs as node_pairs

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def facts(**overrides) -> dict:
    """A node as choose() reads it: idle, partition gpu, 8x H100, passing, untroubled."""
    node = {
        "partitions": {"gpu"},
        "gpus": 8,
        "state": "idle",
        "model": H100,
        "latest": "ok",
        "troubled": False,
    }
    node.update(overrides)
    return node


def fleet(**nodes) -> dict:
    out = {f"gpu{i:02d}": facts() for i in range(1, 7)}
    out["gpu02"] = facts(state="drained")  # the suspect
    out.update(nodes)
    return out


def test_two_peers_in_name_order():
    assert pairing.choose("gpu02", fleet(), set(), set()) == (["gpu01", "gpu03"], "")


@pytest.mark.parametrize(
    "odd",
    [
        facts(state="mixed"),  # running a job
        facts(state="allocated"),
        facts(state="drained"),
        facts(state="maint"),  # in the maintenance reservation
        facts(state="idle~"),  # powered down
        facts(partitions={"debug"}),
        facts(gpus=4),
        facts(model=A100),
        facts(latest="fail"),
        facts(latest="warn"),
        facts(latest=None),  # no run within a day: not heard from
        facts(troubled=True),  # failed a run or was drained this week
    ],
)
def test_a_node_that_is_not_known_good_is_never_a_peer(odd):
    chosen, _ = pairing.choose("gpu02", fleet(gpu01=odd), set(), set())
    assert chosen == ["gpu03", "gpu04"]


def test_busy_nodes_are_never_peers_and_used_ones_come_last():
    busy = {"gpu01", "gpu03"}  # in the reservation, or running a diagnose job
    assert pairing.choose("gpu02", fleet(), busy, set())[0] == ["gpu04", "gpu05"]
    used = {"gpu01", "gpu03"}  # peers of another suspect this pass
    assert pairing.choose("gpu02", fleet(), set(), used)[0] == ["gpu04", "gpu05"]
    everyone = {"gpu01", "gpu03", "gpu04", "gpu05", "gpu06"}
    assert pairing.choose("gpu02", fleet(), set(), everyone)[0] == ["gpu01", "gpu03"]


def test_a_shared_partition_is_enough():
    nodes = fleet(gpu01=facts(partitions={"gpu", "long"}), gpu02=facts(partitions={"long"}))
    nodes.update({n: facts(partitions={"short"}) for n in ("gpu03", "gpu04", "gpu05", "gpu06")})
    chosen, why = pairing.choose("gpu02", nodes, set(), set())
    assert chosen == [] and why == (
        "1 known-good idle peer(s) of its class (8x NVIDIA H100 80GB HBM3, partition long): "
        "two needed"
    )


@pytest.mark.parametrize(
    "suspect, why",
    [
        (facts(model=""), "its GPU model is not in the fleet store (slurmhealth collect first)"),
        (facts(gpus=None), "Slurm lists no GPU count for it (gres)"),
        (facts(gpus=0), "Slurm lists no GPU count for it (gres)"),
    ],
)
def test_a_suspect_of_no_known_class_gets_no_peers(suspect, why):
    assert pairing.choose("gpu02", fleet(gpu02=suspect), set(), set()) == ([], why)
    assert pairing.choose("gpu99", fleet(), set(), set()) == ([], "not a node sinfo lists")


@pytest.mark.parametrize(
    "gres, count",
    [
        ("gpu:8", 8),
        ("gpu:h100:8(S:0-1)", 8),
        ("gpu:a100:4,gpu:h100:4", 8),
        ("gpu:h100:8(S:0-1),shard:h100:32", 8),
        ("(null)", 0),
        ("", 0),
        ("gpu:h100:x", None),
        ("gpu:²", None),
    ],
)
def test_gres_as_a_gpu_count(gres, count):
    assert pairing.gpu_count(gres) == count


def test_the_fleet_store_says_who_passed_recently_and_who_was_in_trouble(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = time.time()
    versions = {"gpu": {"status": "ok", "versions": {"model": [H100]}}}
    for node in ("gpu01", "gpu03", "gpu04", "gpu05"):
        record_sources(conn, node, now - 600, versions)
    record_sources(conn, "gpu06", now - 2 * pairing.FRESH, versions)  # heard from two days ago
    failed = {
        "node": "gpu03", "job_id": None, "phase": "healthcheck", "started": now - 3 * 86400,
        "duration": 0.04, "verdict": "fail", "tool_version": "x", "sources": "{}",
    }  # fmt: skip
    store.record_run(conn, {"run": failed, "results": [], "events": [], "baselines": {}})
    lemon = ("would-drain", "slurmhealth: lemon: 5 faults", "slurmhealth lemons")
    store.record_action(conn, "gpu04", *lemon, True, when=now - 60)
    found = pairing.fleet_facts(conn, ["gpu01", "gpu03", "gpu04", "gpu05", "gpu06", "gpu07"], now)
    assert found == {
        "gpu01": {"model": H100, "latest": "ok", "troubled": False},
        "gpu03": {"model": H100, "latest": "ok", "troubled": True},  # failed three days ago
        "gpu04": {"model": H100, "latest": "ok", "troubled": True},  # monitor-only drain
        "gpu05": {"model": H100, "latest": "ok", "troubled": False},
        "gpu06": {"model": H100, "latest": None, "troubled": False},
        "gpu07": {"model": "", "latest": None, "troubled": False},  # never heard from
    }


def test_the_pair_jobs_script_runs_the_diagnosis_on_the_suspect():
    script = pairing.on_suspect("/usr/bin/srun", "gpu02", "/opt/sh/bin/python -m slurmhealth x")
    assert shlex.split(script) == [
        "/usr/bin/srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu02", "--",
        "/opt/sh/bin/python", "-m", "slurmhealth", "x",
    ]  # fmt: skip
    with pytest.raises(pairing.slurm.SlurmError):
        pairing.on_suspect("/usr/bin/srun", "gpu[01-64]", "true")  # one node's name, never a set


def test_the_pair_margin_is_the_slow_nodes_margin():
    """One definition of "slower than its peers" for a synchronous job: 5%."""
    assert node_pairs.MARGIN == peers.MARGIN == 0.05
