"""node/diag/run.py: a whole diagnosis of the healthy snapshot node (fixtures for NVML, sysfs and
the kernel log) with stand-in tools, its records written to a real store and read back."""

from __future__ import annotations

import json
import os
import shlex

import pytest
from conftest import FIXTURES, printing, snapshot_path, stand_in, stand_in_calls

from slurmhealth.core import store
from slurmhealth.node import config, runner
from slurmhealth.node.diag import run

H100 = "NVIDIA H100 80GB HBM3"  # the healthy snapshot's GPUs
# What the built-in GPU tests' child prints (node/diag/cuda.py main), from a stand-in interpreter.
CUDA_DOC = {
    "backend": "stand-in",
    "outcomes": [
        {"unit": f"gpu{i}", "status": "pass", "figures": {}, "evidence": f"matmul on gpu{i}: ok"}
        for i in range(8)
    ],
}


def argv_of(path: str) -> list:
    return [argv for _pid, argv in stand_in_calls(path)]


def expect(**settings) -> dict:
    out = config.defaults()
    out["settings"].update(settings)
    return out


def options(snapshot: str = "healthy") -> runner.Options:
    return runner.Options(
        gpu_source=snapshot_path(snapshot),
        sysfs_root=os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
        kmsg=os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
    )


def by_check(records: dict) -> dict:
    return {r["check_name"]: r for r in records["results"]}


def test_a_quick_diagnosis_passes_and_is_recorded_as_a_diag_run(tools, tmp_path):
    dcgmi = stand_in(tools, "dcgmi", printing("dcgmi-4.x-r3-pass.json"))
    python = stand_in(tools, "python-with-cuda", f"echo {shlex.quote(json.dumps(CUDA_DOC))}")
    settings = {"diag_tools": str(tools), "diag_python": str(tools / "python-with-cuda")}
    diagnosis = run.diagnose("gpu01", "quick", expect(**settings), options())
    assert diagnosis.verdict == "ok" and diagnosis.evidence() == "no failure"
    assert [p["probe"] for p in diagnosis.probes] == ["checks", "dcgm", "cuda"]
    assert argv_of(dcgmi) == ["diag -r 1 -j"]
    # the built-in GPU tests, briefly: every test, 2 s each where a test is timed
    (cuda_argv,) = argv_of(python)
    assert cuda_argv.startswith(
        "-m slurmhealth.node.diag.cuda --tests matmul,memory,h2d,p2p --seconds 2.0"
    )
    records = diagnosis.records()
    assert (records["run"]["phase"], records["run"]["verdict"]) == ("diag", "ok")
    sources = json.loads(records["run"]["sources"])["diag"]
    assert (sources["level"], sources["gpu_model"], sources["gpus"]) == ("quick", H100, 8)
    results = by_check(records)
    assert list(results) == ["diag.checks", "diag.dcgm", "diag.cuda"]
    assert {r["status"] for r in results.values()} == {"ok"}
    assert {r["action"] for r in results.values()} == {"none"}
    data = json.loads(results["diag.dcgm"]["data"])
    assert data["level"] == "quick"
    assert [(o["unit"], o["status"]) for o in data["outcomes"]] == [
        (f"gpu{i}", "pass") for i in range(8)
    ]
    assert data["outcomes"][0]["figures"] == {"passed": 7, "failed": 0, "skipped": 0}

    conn = store.connect(str(tmp_path / "node.db"))
    run_id = store.record_run(conn, records)
    row = conn.execute(
        "SELECT node, phase, verdict, sources FROM runs WHERE id = ?", (run_id,)
    ).fetchone()
    assert row[:3] == ("gpu01", "diag", "ok")
    assert json.loads(row[3])["diag"]["level"] == "quick"
    stored = conn.execute(
        "SELECT check_name, status, message, action, data FROM results WHERE run_id = ? "
        "ORDER BY check_name",
        (run_id,),
    ).fetchall()
    assert stored == sorted(
        (r["check_name"], r["status"], r["message"], r["action"], r["data"])
        for r in records["results"]
    )
    assert json.loads(dict((row[0], row[4]) for row in stored)["diag.dcgm"]) == data


def test_a_medium_diagnosis_gives_one_result_per_probe_ok_fail_or_skip(tools):
    dcgmi = stand_in(tools, "dcgmi", printing("dcgmi-3.3-r2-fail.json"))
    nccl = stand_in(tools, "all_reduce_perf", printing("all_reduce_perf-2.15-h100.txt"))
    python = stand_in(tools, "python-with-cuda", f"echo {shlex.quote(json.dumps(CUDA_DOC))}")
    # no ib_write_bw among the tools: skipped, and says so
    settings = {"diag_tools": str(tools), "diag_python": str(tools / "python-with-cuda")}
    diagnosis = run.diagnose("gpu01", "medium", expect(**settings), options())
    assert diagnosis.verdict == "fail"
    records = diagnosis.records()
    assert records["run"]["verdict"] == "fail"
    results = by_check(records)
    assert {k: r["status"] for k, r in results.items()} == {
        "diag.checks": "ok",
        "diag.dcgm": "fail",
        "diag.nccl": "ok",
        "diag.ib_write_bw": "skip",
        "diag.cuda": "ok",
    }
    assert [r.check for r in diagnosis.results] == list(results)
    assert results["diag.dcgm"]["action"] == "service"
    assert results["diag.ib_write_bw"]["message"] == "ib_write_bw not installed (perftest)"
    for name, result in results.items():
        data = json.loads(result["data"])
        assert data["level"] == "medium" and data["outcomes"], name
    nccl_data = json.loads(results["diag.nccl"]["data"])
    assert nccl_data["outcomes"][0]["figures"]["busbw_gbps"] == 476.84
    assert diagnosis.evidence().startswith("dcgm: gpu0 GPU Memory (+1 more failed): GPU 0 Error")
    assert argv_of(dcgmi) == ["diag -r 2 -j"]
    assert argv_of(nccl) == ["-b 8 -e 8G -f 2 -g 8"]
    (cuda_argv,) = argv_of(python)
    assert cuda_argv.startswith(
        "-m slurmhealth.node.diag.cuda --tests matmul,memory,h2d,p2p --seconds 20.0"
    )
    doc = diagnosis.to_dict()
    assert (doc["level"], doc["verdict"]) == ("medium", "fail")
    assert run.table(diagnosis).splitlines()[0].startswith("gpu01: diagnose medium: FAIL (")


def test_a_lost_gpu_fails_the_checks_probe(tools):
    stand_in(tools, "dcgmi", printing("dcgmi-4.x-r3-pass.json"))
    diagnosis = run.diagnose("gpu01", "quick", expect(diag_tools=str(tools)), options("gpu-lost"))
    assert diagnosis.verdict == "fail"
    results = by_check(diagnosis.records())
    assert (results["diag.checks"]["status"], results["diag.dcgm"]["status"]) == ("fail", "ok")
    outcomes = json.loads(results["diag.checks"]["data"])["outcomes"]
    assert outcomes and all(o["status"] == "fail" for o in outcomes)
    assert any(o["evidence"].startswith("gpu.count: ") for o in outcomes)
    assert diagnosis.evidence().startswith("checks: gpu.count: ")
    assert "GpuIsLost" in diagnosis.evidence()


def test_an_unknown_level_raises_before_anything_runs(tools):
    dcgmi = stand_in(tools, "dcgmi", printing("dcgmi-4.x-r3-pass.json"))
    with pytest.raises(ValueError, match="unknown level 'bogus'"):
        run.diagnose("gpu01", "bogus", expect(diag_tools=str(tools)), options())
    assert argv_of(dcgmi) == []
