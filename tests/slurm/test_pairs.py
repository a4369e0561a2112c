"""Validation across nodes on a real Slurm (docs/diagnose.md, "Across nodes"): a node drained by
a planted fault is diagnosed against two known-good peers in one job of the three, its
diagnosis run on it by srun, the all-reduce and ib_write_bw run through srun steps of the job.
The tools are stand-ins printing their real formats (tests/fixtures/diag): the all-reduce slow
on any step that holds the slow node, ib_write_bw slow from the slow node's mlx5_3."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import TESTS, run_cli

from .lab import Lab, copy_store, missing
from .test_diagnose import diag_runs, drained_by_fault, reserved, results_of

DIAG = os.path.join(TESTS, "fixtures", "diag")
RESERVATION = "slurmhealth_diag"

# The stand-ins: Python (this interpreter), text fixed here; what they print is a fixture file.
# Every task of a step runs them; the tools print from one task (rank 0, the client).
ALL_REDUCE = """#!{python}
import os, re, sys
with open({calls!r}, "a") as f:
    f.write(os.environ.get("SLURMD_NODENAME", "") + " " + os.environ.get("SLURM_STEP_NODELIST", "")
            + " " + " ".join(sys.argv[1:]) + "\\n")
if os.environ.get("SLURM_PROCID", "0") != "0":
    sys.exit(0)
nodes = set()
listed = os.environ["SLURM_STEP_NODELIST"]
for prefix, inner, plain in re.findall(r"([a-z]+)\\[([^]]*)\\]|([a-z0-9]+)", listed):
    if plain:
        nodes.add(plain)
    for part in inner.split(",") if inner else ():
        low, _, high = part.partition("-")
        for i in range(int(low), int(high or low) + 1):
            nodes.add(prefix + str(i).zfill(len(low)))
slow = set(open({slow!r}).read().split())
name = "all_reduce_perf-2.19-pair-h100" + ("-slow" if nodes & slow else "") + ".txt"
sys.stdout.write(open(os.path.join({diag!r}, name)).read())
"""
WRITE_BW = """#!{python}
import os, sys
args = sys.argv[1:]
node = os.environ.get("SLURMD_NODENAME", "")
with open({calls!r}, "a") as f:
    f.write(node + " " + " ".join(args) + "\\n")
if args[-1].startswith("-") or args[-1].isdigit():  # no server address: the server
    sys.stdout.write(open(os.path.join({diag!r}, "ib_write_bw-pair-server.txt")).read())
    sys.exit(0)
device = args[args.index("-d") + 1]
slow = node in open({slow!r}).read().split() and device == "mlx5_3"
name = "ib_write_bw-pair-bidir-slow.txt" if slow else "ib_write_bw-pair-bidir.txt"
sys.stdout.write(open(os.path.join({diag!r}, name)).read())
"""


@pytest.fixture(scope="module")
def lab():
    """The lab of this folder, its backfill every second: a job on nodes outside its FLEX
    reservation is started by backfill alone."""
    reason = missing()
    if reason:
        from conftest import require_real

        require_real(f"the real-Slurm tests cannot run: {reason}")
    with Lab(nodes=4, backfill_interval=1) as running:
        yield running


@pytest.fixture
def pair(cluster, tmp_path):
    """The lab with the stand-ins in tmp_path/tools (which may be taken away), our drains
    returned only by a diagnosis; tmp_path/slow names the slow node."""
    lab = cluster
    tools = tmp_path / "tools"
    tools.mkdir()
    (tmp_path / "slow").write_text("")
    for name, text in (("all_reduce_perf", ALL_REDUCE), ("ib_write_bw", WRITE_BW)):
        body = text.format(
            python=sys.executable,
            calls=str(tmp_path / f"{name}.calls"),
            slow=str(tmp_path / "slow"),
            diag=DIAG,
        )
        (tools / name).write_text(body)
        (tools / name).chmod(0o755)
    os.chmod(tmp_path, 0o755)
    lab.settings.update(diag_before_resume=True, diag_tools=str(tools))
    lab._write_config()
    lab.tools = tools
    yield lab
    lab.settings.pop("diag_before_resume")
    lab.settings.pop("diag_tools")
    lab._write_config()
    lab.scontrol("delete", f"ReservationName={RESERVATION}", check=False)


def collected(lab, tmp_path) -> str:
    """The head node's fleet store: every node store copied and collected, as the timer does
    (who passed recently, each node's GPU model)."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700, exist_ok=True)
    for node in lab.names:
        copy_store(lab.db_path(node), str(spool / f"{node}.db"))
    fleet = str(tmp_path / "fleet.db")
    proc = run_cli("collect", str(spool), "--db", fleet, env=lab.client_env())
    assert proc.returncode == 0, proc.stderr
    return fleet


def submit(lab, fleet: str, *args: str) -> dict:
    env = lab.client_env(
        {
            "SLURMHEALTH_STATE_DIR": lab.path("state"),
            "SLURMHEALTH_CONFIG": lab.path("etc", "slurmhealth.toml"),
        }
    )
    argv = ("diagnose", "--submit", "--level", "pair", "--db", fleet, "--json", *args)
    proc = run_cli(*argv, env=env)
    assert proc.returncode == 0, proc.stderr
    return {d["node"]: d for d in json.loads(proc.stdout)}


def calls(tmp_path, name: str) -> list:
    path = tmp_path / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


def test_a_slow_node_is_named_against_its_peers(pair, tmp_path):
    lab, node = pair, "gpu02"
    (tmp_path / "slow").write_text(node)
    drained_by_fault(lab, node)
    steps = submit(lab, collected(lab, tmp_path))
    assert steps[node]["what"] == "diagnose", steps
    detail = steps[node]["detail"]
    assert "(pair, 30 min, with gpu01 and gpu03;" in detail
    job_id = detail.split()[1]
    job = lab.wait_job(job_id, timeout=120)
    assert job["NodeList"] == "gpu[01-03]" and job["Reservation"] == RESERVATION
    assert job["JobState"] == "FAILED"  # diagnose's exit 1: the node failed
    assert reserved(lab).count("gpu0") == 1 and node in reserved(lab)  # the peers never in it
    state = lab.wait_node(node, lambda n: "service" in n["reason"], 60, what="to be marked")
    assert state["reason"].startswith(
        "slurmhealth: service: diagnose pair: pair_nccl: gpu02: busbw 189.33 GB/s across "
        "gpu02+gpu01 at 8 GiB, 49% below the reference pair gpu01+gpu03 (371.24 GB/s)"
    )
    (run,) = diag_runs(lab, node)
    assert run["verdict"] == "fail"
    assert json.loads(run["sources"])["diag"]["level"] == "pair"
    results = results_of(lab, node, run["id"])
    nccl = json.loads(results["diag.pair_nccl"]["data"])["outcomes"]
    assert [o["figures"] for o in nccl] == [
        {
            "busbw_gbps": 189.33,
            "reference_busbw_gbps": 371.24,
            "max_bytes": 8589934592,
            "deficit": 0.49,
        }
    ]
    links = {o["unit"]: o for o in json.loads(results["diag.pair_ib"]["data"])["outcomes"]}
    assert sorted(links) == [f"mlx5_{i}:1" for i in range(8)]
    assert [u for u, o in links.items() if o["status"] == "fail"] == ["mlx5_3:1"]
    assert links["mlx5_3:1"]["evidence"].startswith(
        "gpu02 mlx5_3:1: RDMA write 389.12 Gb/s both ways with gpu01, 50% below gpu03's link"
    )
    # each all-reduce spanned its pair in one step (-g: the node's 8 GPUs): the reference first
    ranks0 = [c.split() for c in calls(tmp_path, "all_reduce_perf")]
    assert list(dict.fromkeys(c[1] for c in ranks0)) == ["gpu[01,03]", "gpu[01-02]"]
    assert all(c[-2:] == ["-g", "8"] for c in ranks0)
    # ib_write_bw: the server on peer 1, clients from peer 2 then the suspect, port by port
    servers = [c for c in calls(tmp_path, "ib_write_bw") if not c.endswith(("127.0.0.1",))]
    clients = [c.split()[0] for c in calls(tmp_path, "ib_write_bw") if c.endswith("127.0.0.1")]
    assert {s.split()[0] for s in servers} == {"gpu01"} and len(servers) == 16
    assert clients == ["gpu03", "gpu02"] * 8
    # the next pass takes it out of the reservation, drained for service
    again = submit(lab, collected(lab, tmp_path))
    assert again[node]["what"] == "released"


def test_a_missing_tool_makes_the_pair_diagnosis_inconclusive(pair, tmp_path):
    """No ib_write_bw on the nodes: the all-reduce ran and passed, the links could not be
    tested, so the node is not returned (a pair diagnosis passes only when both ran), nor
    failed: it stays out for an admin, saying which tool is missing."""
    lab, node = pair, "gpu04"
    (lab.tools / "ib_write_bw").unlink()
    drained_by_fault(lab, node)
    steps = submit(lab, collected(lab, tmp_path))
    assert "with gpu01 and gpu03" in steps[node]["detail"], steps
    done = lab.wait_job(steps[node]["detail"].split()[1], timeout=120)
    assert (done["JobState"], done["ExitCode"]) == ("FAILED", "4:0")  # diagnose's exit 4
    state = lab.wait_node(node, lambda n: "inconclusive" in n["reason"], 60, what="to be held")
    assert state["reason"] == (
        "diagnose pair inconclusive (slurmhealth): pair_ib: ib_write_bw not installed (perftest)"
    )
    (run,) = diag_runs(lab, node)
    assert run["verdict"] == "warn"
    results = results_of(lab, node, run["id"])
    assert (results["diag.pair_nccl"]["status"], results["diag.pair_ib"]["status"]) == (
        "ok",
        "skip",
    )
    assert calls(tmp_path, "ib_write_bw") == []


def test_a_node_without_two_known_good_peers_is_left_as_it_is(pair, tmp_path):
    """gpu02 and gpu04 were drained by faults this week (the tests above): of gpu03's class only
    gpu01 is known-good. Named by an admin while in service, gpu03 is neither put in the
    reservation nor given a job, and says why."""
    lab, node = pair, "gpu03"
    fleet = collected(lab, tmp_path)
    steps = submit(lab, fleet, "--nodes", node)
    assert steps[node]["what"] == "no-peers"
    assert steps[node]["detail"] == (
        "1 known-good idle peer(s) of its class (8x NVIDIA H100 80GB HBM3, partition gpu): "
        "two needed; stays out (was: named by an admin)"
    )
    assert node not in reserved(lab)
    assert "DRAIN" not in lab.node(node)["state"]
    assert lab.squeue("-h", "-n", "slurmhealth-diagnose").stdout.strip() == ""
