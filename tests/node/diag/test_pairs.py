"""node/diag/pairs.py: the comparison of the suspect's pair with the reference pair (pure), the
job it reads from Slurm's environment, and the probes' answers where nothing can run. The runs
through srun on a real Slurm: tests/slurm/test_pairs.py."""

from __future__ import annotations

import os

import conftest
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.node import config
from slurmhealth.node.diag import pairs, parsers, probes
from slurmhealth.node.diag import run as diag_run

DIAG = os.path.join(conftest.FIXTURES, "diag")


def fixture(name: str) -> str:
    with open(os.path.join(DIAG, name), encoding="utf-8") as handle:
        return handle.read()


HEALTHY = parsers.all_reduce_run(fixture("all_reduce_perf-2.19-pair-h100.txt"))
SLOW = parsers.all_reduce_run(fixture("all_reduce_perf-2.19-pair-h100-slow.txt"))
ALONE = parsers.all_reduce_run(fixture("all_reduce_perf-2.19-pair-alone.txt"))
LINK = parsers.ib_write_bw_run(fixture("ib_write_bw-pair-bidir.txt"))
SLOW_LINK = parsers.ib_write_bw_run(fixture("ib_write_bw-pair-bidir-slow.txt"))
JOB = pairs.Job("gpu02", ["gpu03", "gpu04"], "/usr/bin/srun")
RANKS = 16  # two nodes of 8 GPUs


# --- the tools' output across two nodes ---------------------------------------------------------


def test_an_all_reduce_across_two_nodes_lists_every_rank_once():
    assert HEALTHY == {
        "busbw_gbps": 371.24,
        "max_bytes": 8589934592,
        "avg_busbw_gbps": 353.466,
        "wrong": 0,
        "ranks": 16,
        "rank_lines": 16,
        "hosts": 2,
        "headers": 1,
    }
    assert pairs.spans(HEALTHY, RANKS) is None


def test_tasks_that_each_ran_alone_are_no_run_across_the_pair():
    # nccl-tests without MPI: two headers, each node's ranks counted from 0 (nccl-tests#213)
    assert (ALONE["headers"], ALONE["ranks"], ALONE["rank_lines"]) == (2, 8, 16)
    assert ALONE["busbw_gbps"] == 476.2  # each node's own NVLink all-reduce: no network at all
    assert "each task ran alone (2 headers, 16 rank lines)" in pairs.spans(ALONE, RANKS)
    # one node's ranks only (a launch that gave one task no GPUs, say)
    assert pairs.spans(dict(HEALTHY, ranks=8, rank_lines=8), RANKS) == (
        "8 ranks where 16 were expected"
    )


def test_ib_write_bw_bidirectional_between_two_nodes():
    assert LINK == {"bw_avg_gbps": 779.35, "bytes": 65536}
    assert SLOW_LINK == {"bw_avg_gbps": 389.12, "bytes": 65536}
    # the server's side prints the same table after its banner
    assert parsers.ib_write_bw_run(fixture("ib_write_bw-pair-server.txt")) == LINK
    said = parsers.ib_write_bw_run("Couldn't connect to 10.1.2.3:18515\n")
    assert said == {"why": "no bandwidth table (last line: Couldn't connect to 10.1.2.3:18515)"}


def test_an_all_reduce_that_printed_no_row_says_its_last_line():
    text = "srun: error: gpu03: task 1: Exited with exit code 2\n"
    assert parsers.all_reduce_run(text) == {"why": f"no result rows (last line: {text.strip()})"}


# --- the comparison (pure) ----------------------------------------------------------------------


def test_the_suspect_as_fast_as_the_reference_passes():
    found = pairs.judge_nccl(JOB, HEALTHY, HEALTHY, RANKS)
    assert found["status"] == "pass"
    assert found["figures"] == {
        "busbw_gbps": 371.24,
        "reference_busbw_gbps": 371.24,
        "max_bytes": 8589934592,
        "deficit": 0.0,
    }
    assert found["evidence"] == (
        "busbw 371.24 GB/s across gpu02+gpu03 at 8 GiB, within 5% of gpu03+gpu04 (371.24 GB/s)"
    )


def test_a_slow_suspect_is_named_with_both_figures():
    found = pairs.judge_nccl(JOB, SLOW, HEALTHY, RANKS)
    assert found["status"] == "fail"
    assert found["evidence"] == (
        "gpu02: busbw 189.33 GB/s across gpu02+gpu03 at 8 GiB, 49% below the reference pair "
        "gpu03+gpu04 (371.24 GB/s)"
    )
    assert found["figures"]["deficit"] == pytest.approx(0.49, abs=0.001)


@pytest.mark.parametrize("share, status", [(0.049, "pass"), (0.051, "fail")])
def test_the_margin_is_five_percent_of_the_reference(share, status):
    assert pairs.MARGIN == 0.05
    suspect = dict(HEALTHY, busbw_gbps=round(400.0 * (1 - share), 3))
    reference = dict(HEALTHY, busbw_gbps=400.0)
    assert pairs.judge_nccl(JOB, suspect, reference, RANKS)["status"] == status


def test_a_faster_suspect_passes():
    suspect = dict(HEALTHY, busbw_gbps=390.0)
    found = pairs.judge_nccl(JOB, suspect, HEALTHY, RANKS)
    assert found["status"] == "pass" and found["figures"]["deficit"] < 0


def test_wrong_elements_across_the_suspects_pair_fail_whatever_the_speed():
    found = pairs.judge_nccl(JOB, dict(HEALTHY, wrong=37), HEALTHY, RANKS)
    assert found["status"] == "fail"
    assert found["evidence"].startswith("37 wrong elements across gpu02+gpu03: data corruption")
    assert found["figures"]["wrong"] == 37


def test_the_suspects_pair_failing_where_the_reference_ran_fails():
    why = {"why": "all_reduce_perf did not finish within 600 s"}
    found = pairs.judge_nccl(JOB, why, HEALTHY, RANKS)
    assert found["status"] == "fail"
    assert found["evidence"] == (
        "all_reduce_perf across gpu02+gpu03 failed: all_reduce_perf did not finish within 600 s; "
        "the reference pair gpu03+gpu04 ran: 371.24 GB/s"
    )


@pytest.mark.parametrize(
    "reference, said",
    [
        ({"why": "no result rows"}, "the reference pair gpu03+gpu04 did not run: no result rows"),
        (ALONE, "the reference pair gpu03+gpu04: each task ran alone"),
        (dict(HEALTHY, wrong=5), "the reference pair gpu03+gpu04 corrupted data (5 wrong"),
        (dict(HEALTHY, busbw_gbps=0.0), "the reference pair gpu03+gpu04 measured no bandwidth"),
    ],
)
def test_no_reference_no_verdict(reference, said):
    """Whatever the suspect's pair did: a slow one, a failed one, a fast one."""
    for suspect in (SLOW, {"why": "exit 1"}, HEALTHY):
        found = pairs.judge_nccl(JOB, suspect, reference, RANKS)
        assert found["status"] == "skip"
        assert found["evidence"].startswith(said)


def test_a_slow_link_names_the_suspects_hca():
    found = pairs.judge_ib(JOB, "mlx5_3:1", SLOW_LINK, LINK)
    assert found["status"] == "fail"
    assert found["unit"] == "mlx5_3:1"
    assert found["evidence"] == (
        "gpu02 mlx5_3:1: RDMA write 389.12 Gb/s both ways with gpu03, 50% below gpu04's link to "
        "the same HCA of gpu03: 779.35 Gb/s"
    )
    assert found["figures"] == {
        "bw_avg_gbps": 389.12,
        "reference_bw_avg_gbps": 779.35,
        "bytes": 65536,
        "deficit": 0.5007,
    }
    assert pairs.judge_ib(JOB, "mlx5_3:1", LINK, LINK)["status"] == "pass"


def test_a_link_without_its_reference_is_no_verdict():
    found = pairs.judge_ib(JOB, "mlx5_0:1", SLOW_LINK, {"why": "the server did not listen"})
    assert found["status"] == "skip"
    assert found["evidence"] == (
        "the reference link gpu04->gpu03 did not run: the server did not listen"
    )
    failed = pairs.judge_ib(JOB, "mlx5_0:1", {"why": "no bandwidth table"}, LINK)
    assert failed["status"] == "fail" and failed["evidence"].startswith("ib_write_bw to gpu03")
    # peer 1's server, which served the reference, not listening the second time: no verdict
    server = {"why": "the server on gpu03 did not listen: nothing", "server": "gpu03"}
    assert pairs.judge_ib(JOB, "mlx5_0:1", server, LINK)["status"] == "skip"


# --- the job, from Slurm's environment ----------------------------------------------------------


@pytest.fixture
def slurm_bin(tmp_path) -> str:
    """settings.slurm_bin: a directory with an srun in it (never run here)."""
    folder = tmp_path / "slurm-bin"
    folder.mkdir()
    (folder / "srun").write_text("#!/bin/sh\nexit 99\n")
    (folder / "srun").chmod(0o755)
    return str(folder)


def test_the_job_is_this_node_and_the_other_two_in_name_order(slurm_bin):
    env = {"SLURM_JOB_NODELIST": "gpu[02,07],gpu04"}
    job = pairs.job_of("gpu02", {"slurm_bin": slurm_bin, "diag_mpi": "pmix"}, env)
    assert (job.node, job.peers) == ("gpu02", ["gpu04", "gpu07"])
    assert (job.suspect_pair, job.reference_pair) == (("gpu02", "gpu04"), ("gpu04", "gpu07"))
    assert job.step(job.suspect_pair, "/opt/nccl-tests/all_reduce_perf", "-g", "8") == [
        f"{slurm_bin}/srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--nodelist=gpu02,gpu04", "--mpi=pmix", "--", "/opt/nccl-tests/all_reduce_perf", "-g", "8",
    ]  # fmt: skip
    assert "--unbuffered" in job.step(("gpu04",), "ib_write_bw", unbuffered=True)


@pytest.mark.parametrize(
    "env, said",
    [
        ({}, "not inside a Slurm job with two peers"),
        ({"SLURM_JOB_NODELIST": "gpu[03-04]"}, "gpu02 is not one of the job's nodes"),
        ({"SLURM_JOB_NODELIST": "gpu[02-03]"}, "the job has 1 other node(s)"),
        ({"SLURM_JOB_NODELIST": "gpu[02-"}, "cannot read the job's nodes"),
    ],
)
def test_no_pair_job_is_said(env, said, slurm_bin):
    found = pairs.job_of("gpu02", {"slurm_bin": slurm_bin}, env)
    assert isinstance(found, str) and found.startswith(said)


# --- the probes where nothing can run: inconclusive, never a pass or a fail ---------------------


def context(tools, ports=None, node="gpu02") -> probes.Context:
    facts = {
        "gpu": {"devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]},
        "ib": {"ports": ports or {}},
    }
    chosen = dict(config.defaults()["settings"], diag_tools=str(tools))
    return probes.Context("pair", chosen, facts, str(tools), node)


PORT = {"mlx5_0:1": {"device": "mlx5_0", "port": 1, "rate": 400.0, "state_name": "ACTIVE"}}


def test_missing_tools_skip_and_say_which(tmp_path):
    nccl = probes.run_probe("pair_nccl", context(tmp_path, PORT))
    ib = probes.run_probe("pair_ib", context(tmp_path, PORT))
    assert (nccl["status"], ib["status"]) == ("skip", "skip")
    assert nccl["outcomes"][0]["evidence"] == "all_reduce_perf not installed (NVIDIA nccl-tests)"
    assert ib["outcomes"][0]["evidence"] == "ib_write_bw not installed (perftest)"


def test_no_active_port_skips_the_links(tmp_path):
    conftest.stand_in(tmp_path, "ib_write_bw", "exit 0")
    ib = probes.run_probe("pair_ib", context(tmp_path))
    assert ib["outcomes"][0]["evidence"] == "no active InfiniBand port"


def test_outside_a_pair_job_the_tools_are_not_run(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    calls = conftest.stand_in(tmp_path, "all_reduce_perf", "exit 0")
    nccl = probes.run_probe("pair_nccl", context(tmp_path))
    assert nccl["status"] == "skip"
    assert nccl["outcomes"][0]["evidence"].startswith("not inside a Slurm job with two peers")
    assert conftest.stand_in_calls(calls) == []


def summary(name: str, status: str) -> dict:
    return {"probe": name, "status": status, "seconds": 0.0, "outcomes": []}


def test_the_pair_level_passes_only_when_every_probe_of_it_passed():
    ran = [summary("checks", "pass"), summary("pair_nccl", "pass")]
    assert probes.verdict([*ran, summary("pair_ib", "pass")], every=True) == "ok"
    assert probes.verdict([*ran, summary("pair_ib", "skip")], every=True) == "warn"
    assert probes.verdict([*ran, summary("pair_ib", "fail")], every=True) == "fail"
    # a level of one node passes on any probe that ran
    assert probes.verdict([*ran, summary("dcgm", "skip")]) == "ok"
    assert probes.EVERY_PROBE == ("pair",)


def test_a_pair_diagnosis_with_no_tools_is_inconclusive(tmp_path, monkeypatch, slurm_bin):
    """The whole level on the healthy snapshot node, no tool installed: today's checks pass,
    both pair probes skip and say why, the verdict is inconclusive (exit 4), recorded warn."""
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-03]")
    expect = config.defaults()
    expect["settings"].update(diag_tools=str(tmp_path), slurm_bin=slurm_bin)
    options = diag_run.runner.Options(
        gpu_source=conftest.snapshot_path("healthy"),
        sysfs_root=os.path.join(conftest.FIXTURES, "sysfs", "healthy-8x-ndr"),
        kmsg=os.path.join(conftest.FIXTURES, "kmsg", "healthy.kmsg"),
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    diagnosis = diag_run.diagnose("gpu01", "pair", expect, options)
    assert [p["probe"] for p in diagnosis.probes] == ["checks", "pair_nccl", "pair_ib"]
    assert (diagnosis.outcome, diagnosis.verdict) == ("inconclusive", "warn")
    assert diagnosis.evidence() == (
        "pair_nccl: all_reduce_perf not installed (NVIDIA nccl-tests); pair_ib: ib_write_bw not "
        "installed (perftest)"
    )


# --- never raises -------------------------------------------------------------------------------

RUNS = st.sampled_from(
    [
        fixture(n)
        for n in sorted(os.listdir(DIAG))
        if n.startswith(("all_reduce_perf", "ib_write_bw"))
    ]
)


@st.composite
def mangled(draw) -> str:
    text = draw(RUNS)
    cut = draw(st.integers(0, len(text)))
    junk = draw(st.text(max_size=40))
    return text[:cut] + junk + text[cut:] if draw(st.booleans()) else text[cut:]


@settings(max_examples=300, deadline=None)
@given(one=mangled(), other=mangled())
def test_the_judges_never_raise_on_any_run(one, other):
    nccl = parsers.all_reduce_run(one), parsers.all_reduce_run(other)
    ib = parsers.ib_write_bw_run(one), parsers.ib_write_bw_run(other)
    for found in (pairs.judge_nccl(JOB, *nccl, RANKS), pairs.judge_ib(JOB, "mlx5_0:1", *ib)):
        assert found["status"] in ("pass", "fail", "skip")
        assert "\n" not in found["evidence"] and len(found["evidence"]) <= parsers.EVIDENCE_MAX
