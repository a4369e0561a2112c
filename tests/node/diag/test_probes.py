"""node/diag/probes.py with stand-in tools: shell scripts in settings.diag_tools that print the
real output formats (tests/fixtures/diag) and record how they were called. PATH holds nothing,
so a node's own dcgmi or perftest never stands in for ours."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import time

import pytest
from conftest import DIAG, FIXTURES, printing, snapshot_path, stand_in
from conftest import stand_in_calls as calls

from slurmhealth.node import config, runner
from slurmhealth.node.diag import probes

H100 = "NVIDIA H100 80GB HBM3"  # NVML's name of the SXM5 part (the healthy snapshot's GPUs)
H200_NVL = "NVIDIA H200 NVL"
# The stand-ins run with an empty PATH: the few programs they use, by their full path here.
SED, SLEEP = (shutil.which(name) for name in ("sed", "sleep"))


def context(tools, level="medium", gpus=8, model=H100, ports=None, **settings) -> probes.Context:
    """A Context by hand, facts shaped as runner.run gives them."""
    facts = {
        "gpu": {"devices": [{"index": i, "name": model} for i in range(gpus)]},
        "ib": {"ports": ports or {}},
    }
    chosen = dict(config.defaults()["settings"], diag_tools=str(tools), **settings)
    return probes.Context(level, chosen, facts, probes.tool_path(chosen))


@pytest.fixture(scope="module")
def healthy_facts() -> dict:
    """What today's checks find on the healthy 8x H100 HGX node with 8 NDR ports."""
    options = runner.Options(
        gpu_source=snapshot_path("healthy"),
        sysfs_root=os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
        kmsg=os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
    )
    run = runner.run("gpu01", config.defaults(), options, None, "diag")
    assert run.verdict == "ok"
    return run.facts


def members(pgid: int) -> list:
    """Live (not zombie) processes of a process group, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            found.append(int(entry))
    return found


def until(condition) -> bool:
    """True once `condition()` is; a killed process may take a moment to finish exiting (this
    waits for an event, it measures nothing)."""
    deadline = time.monotonic() + 10
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def gone(pids) -> bool:
    pids = list(pids)
    return until(lambda: not any(_alive(p) for p in pids))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


# --- where tools are found -----------------------------------------------------------------------


def test_the_tools_directory_comes_before_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert probes.tool_path({"diag_tools": str(tmp_path)}) == f"{tmp_path}:/usr/bin:/bin"
    assert probes.tool_path({"diag_tools": ""}) == "/usr/bin:/bin"


def test_a_stand_in_in_the_tools_directory_is_the_tool(tools):
    stand_in(tools, "dcgmi", "true")
    assert context(tools).tool("dcgmi") == str(tools / "dcgmi")
    assert context(tools).tool("all_reduce_perf") is None


@pytest.mark.parametrize(
    ("probe", "tool"),
    [
        (probes.probe_dcgm, "dcgmi"),
        (probes.probe_nccl, "all_reduce_perf"),
        (probes.probe_ib_bw, "ib_write_bw"),
        (probes.probe_ib_lat, "ib_read_lat"),
    ],
)
def test_a_tool_that_is_not_installed_is_skipped_by_name(tools, probe, tool):
    ports = {"mlx5_0:1": {"device": "mlx5_0", "port": "1", "rate": 400.0, "state_name": "ACTIVE"}}
    (found,) = probe(context(tools, level="long", ports=ports))
    assert (found["unit"], found["status"]) == ("node", "skip")
    assert found["evidence"].startswith(f"{tool} not installed (")


def test_a_probe_whose_tool_is_absent_is_a_skipped_probe(tools):
    done = probes.run_probe("dcgm", context(tools, level="quick"))
    assert (done["probe"], done["status"]) == ("dcgm", "skip")
    assert done["seconds"] >= 0
    # nothing of the level ran: inconclusive (a warn run), never ok
    assert probes.verdict([done]) == "warn"


# --- a tool that hangs ---------------------------------------------------------------------------


def test_a_hung_tool_is_killed_with_its_whole_process_group(tmp_path):
    pids = tmp_path / "pids"
    script = tmp_path / "hang"
    script.write_text(f"#!/bin/sh\n{SLEEP} 600 &\necho $$ $! > {pids}\n{SLEEP} 600\n")
    script.chmod(0o755)
    try:
        code, text = probes.run_tool([str(script)], 2.0)
        leader, child = (int(p) for p in pids.read_text().split())
        assert gone([leader, child])
        assert until(lambda: not members(leader))  # nothing else it started either
    finally:
        if pids.exists():
            try:
                os.killpg(int(pids.read_text().split()[0]), signal.SIGKILL)
            except OSError:
                pass
    assert code is None
    assert text == "hang did not finish within 2 s"


def test_a_tool_that_cannot_run_says_why(tmp_path):
    script = tmp_path / "broken"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    code, text = probes.run_tool([str(script)], 5.0)
    assert code is None and text == "cannot run broken (No such file or directory)"


def test_a_tool_that_finishes_gives_its_exit_code_and_output(tmp_path):
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\necho out\necho err >&2\nexit 3\n")
    script.chmod(0o755)
    assert probes.run_tool([str(script)], 30.0) == (3, "out\nerr\n")


# --- dcgmi diag -j ----------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "flag"), [("quick", "1"), ("medium", "2"), ("long", "3")])
def test_dcgmi_runs_at_the_level_and_every_gpu_passes(tools, level, flag):
    argv = stand_in(tools, "dcgmi", printing("dcgmi-4.x-r3-pass.json"))
    found = probes.probe_dcgm(context(tools, level=level))
    assert [(o["unit"], o["status"]) for o in found] == [(f"gpu{i}", "pass") for i in range(8)]
    assert [a for _pid, a in calls(argv)] == [f"diag -r {flag} -j"]


def test_dcgmi_failing_a_gpu_fails_that_gpu_only(tools):
    stand_in(tools, "dcgmi", printing("dcgmi-3.3-r2-fail.json"))
    done = probes.run_probe("dcgm", context(tools, level="medium", gpus=2, model="Tesla T4"))
    statuses = [(o["unit"], o["status"]) for o in done["outcomes"]]
    assert statuses == [("gpu0", "fail"), ("gpu1", "pass"), ("node", "pass")]
    assert done["status"] == "fail"
    assert "cuCtxCreate" in done["outcomes"][0]["evidence"]


def test_dcgmi_printing_garbage_fails_the_node_with_its_last_line(tools):
    stand_in(tools, "dcgmi", "echo 'Error: unable to connect to host engine'; exit 1")
    (found,) = probes.probe_dcgm(context(tools, level="quick"))
    assert (found["unit"], found["status"]) == ("node", "fail")
    assert found["evidence"] == (
        "unreadable dcgmi diag output: no JSON document "
        "(last line: Error: unable to connect to host engine)"
    )


# --- all_reduce_perf ---------------------------------------------------------------------------


def test_all_reduce_on_a_healthy_h100_node_passes_the_default_floor(tools, healthy_facts):
    argv = stand_in(tools, "all_reduce_perf", printing("all_reduce_perf-2.15-h100.txt"))
    settings = dict(config.defaults()["settings"], diag_tools=str(tools))
    ctx = probes.Context("medium", settings, healthy_facts, probes.tool_path(settings))
    (found,) = probes.probe_nccl(ctx)
    assert found["status"] == "pass", found
    assert found["evidence"].startswith("busbw 476.84 GB/s at 8 GiB >= floor 460 GB/s")
    assert found["figures"]["wrong"] == 0
    assert [a for _pid, a in calls(argv)] == ["-b 8 -e 8G -f 2 -g 8"]


@pytest.mark.parametrize(
    ("floor", "status", "evidence"),
    [
        (0.0, "skip", "no bus-bandwidth floor for this GPU model (busbw 476.84 GB/s at 8 GiB)"),
        (400.0, "pass", "busbw 476.84 GB/s at 8 GiB >= floor 400 GB/s (avg 179.432 GB/s, 0 wrong)"),
        (500.0, "fail", "busbw 476.84 GB/s at 8 GiB < floor 500 GB/s"),
    ],
)
def test_an_nvl_part_has_no_default_floor_but_a_site_floor_counts(tools, floor, status, evidence):
    """H200 NVL GPUs are not all-to-all NVLink connected: no default floor, -g still the count."""
    argv = stand_in(tools, "all_reduce_perf", printing("all_reduce_perf-2.15-h100.txt"))
    ctx = context(tools, gpus=4, model=H200_NVL, diag_allreduce_floor_gbps=floor)
    (found,) = probes.probe_nccl(ctx)
    assert (found["status"], found["evidence"]) == (status, evidence)
    assert [a for _pid, a in calls(argv)] == ["-b 8 -e 8G -f 2 -g 4"]


def test_all_reduce_needs_two_gpus_and_does_not_run_with_one(tools):
    argv = stand_in(tools, "all_reduce_perf", printing("all_reduce_perf-2.15-h100.txt"))
    (found,) = probes.probe_nccl(context(tools, gpus=1))
    assert found["status"] == "skip" and found["evidence"].startswith("1 GPU: ")
    assert calls(argv) == []


# --- ib_write_bw, loopback per active port -------------------------------------------------------

PORTS = {
    "mlx5_0:1": {"device": "mlx5_0", "port": "1", "rate": 400.0, "state_name": "ACTIVE"},
    # an 800 Gb/s (XDR) port: the fixture's 392 Gb/s is under 90% of it
    "mlx5_1:2": {"device": "mlx5_1", "port": "2", "rate": 800.0, "state_name": "ACTIVE"},
    "mlx5_2:1": {"device": "mlx5_2", "port": "1", "rate": 400.0, "state_name": "DOWN"},
}

# The server waits (and is killed once the client is done); the client, whose last argument is
# the server's host, prints the fixture with the HCA it was given in perftest's banner.
IB_STAND_IN = f"""for last in "$@"; do :; done
if [ "$last" != localhost ]; then exec {SLEEP} 600; fi
while [ $# -gt 1 ]; do [ "$1" = -d ] && dev=$2; shift; done
{SED} "s/mlx5_0/$dev/" {shlex.quote(os.path.join(DIAG, "ib_write_bw-gbits.txt"))}"""


def test_ib_write_bw_runs_per_active_port_and_fails_a_slow_one(tools):
    argv = stand_in(tools, "ib_write_bw", IB_STAND_IN)
    done = probes.run_probe("ib_write_bw", context(tools, ports=PORTS))
    found = {o["unit"]: o for o in done["outcomes"]}
    assert list(found) == ["mlx5_0:1", "mlx5_1:2"]  # the port that is down is not tested
    assert found["mlx5_0:1"]["status"] == "pass"
    assert found["mlx5_1:2"] == {
        "unit": "mlx5_1:2",
        "status": "fail",
        "figures": {"bw_avg_gbps": 392.14, "bytes": 65536},
        "evidence": "RDMA write 392.14 Gb/s at 64 KiB < 90% of the 800 Gb/s port rate",
    }
    assert done["status"] == "fail"
    recorded = calls(argv)
    servers = [a for _pid, a in recorded if not a.endswith("localhost")]
    clients = [a for _pid, a in recorded if a.endswith("localhost")]
    assert servers == ["-d mlx5_0 -i 1 -F --report_gbits", "-d mlx5_1 -i 2 -F --report_gbits"]
    assert clients == [f"{s} localhost" for s in servers]
    assert gone(int(pid) for pid, _a in recorded)  # each server killed after its client


def test_a_lower_share_setting_passes_the_same_port(tools):
    stand_in(tools, "ib_write_bw", IB_STAND_IN)
    ports = {"mlx5_1:2": PORTS["mlx5_1:2"]}
    (found,) = probes.probe_ib_bw(context(tools, ports=ports, diag_ib_min_share=0.45))
    assert (found["unit"], found["status"]) == ("mlx5_1:2", "pass")


def test_no_active_port_is_a_skip_and_runs_nothing(tools):
    argv = stand_in(tools, "ib_write_bw", IB_STAND_IN)
    (found,) = probes.probe_ib_bw(context(tools, ports={"mlx5_2:1": PORTS["mlx5_2:1"]}))
    assert (found["status"], found["evidence"]) == ("skip", "no active InfiniBand port")
    assert calls(argv) == []


def test_the_healthy_nodes_ports_are_all_active(healthy_facts, tools):
    ctx = probes.Context("medium", {}, healthy_facts, "")
    assert sorted(ctx.ports) == [f"mlx5_{i}:1" for i in range(8)]
    assert {p["rate"] for p in ctx.ports.values()} == {400.0}


# --- a probe that breaks -------------------------------------------------------------------------


def test_a_probe_that_raises_is_a_failed_probe_not_an_exception(tools):
    stand_in(tools, "ib_write_bw", IB_STAND_IN)
    broken = {"mlx5_0:1": {"port": "1", "rate": 400.0, "state_name": "ACTIVE"}}  # no device
    done = probes.run_probe("ib_write_bw", context(tools, ports=broken))
    assert done["probe"] == "ib_write_bw" and done["status"] == "fail"
    (found,) = done["outcomes"]
    assert (found["unit"], found["evidence"]) == (
        "node",
        "probe ib_write_bw failed: KeyError: 'device'",
    )


def test_a_probe_at_an_unknown_level_fails_before_its_tool_runs(tools):
    argv = stand_in(tools, "dcgmi", printing("dcgmi-4.x-r3-pass.json"))
    done = probes.run_probe("dcgm", context(tools, level="bogus"))
    assert done["status"] == "fail"
    assert done["outcomes"][0]["evidence"] == "probe dcgm failed: KeyError: 'bogus'"
    assert calls(argv) == []


def test_only_known_levels_have_probes():
    # quick runs the built-in GPU tests briefly: the micro-benchmarks peers are compared on
    assert probes.probes_of("quick") == ["dcgm", "cuda"]
    assert probes.probes_of("medium") == ["dcgm", "nccl", "ib_write_bw", "cuda"]
    assert probes.probes_of("long") == ["dcgm", "nccl", "ib_write_bw", "ib_read_lat", "cuda"]
    # across nodes: only the pair's probes (today's checks run before every level)
    assert probes.probes_of("pair") == ["pair_nccl", "pair_ib"]
    with pytest.raises(ValueError, match="unknown level 'bogus'"):
        probes.probes_of("bogus")


# --- the verdict and its evidence ---------------------------------------------------------------


def raw(unit: str, status: str, evidence: str) -> dict:
    """An outcome as a probe might hand it over, evidence not cleaned."""
    return {"unit": unit, "status": status, "figures": {}, "evidence": evidence}


def test_any_failed_probe_fails_the_diagnosis_and_only_a_probe_that_ran_passes_it():
    passed = probes.summary("dcgm", [raw("gpu0", "pass", "7 passed")], 1.0)
    skipped = probes.summary("nccl", [raw("node", "skip", "all_reduce_perf not installed")], 0.0)
    failed = probes.summary("cuda", [raw("gpu0", "pass", "ok"), raw("gpu1", "fail", "bad")], 2.0)
    assert (passed["status"], skipped["status"], failed["status"]) == ("pass", "skip", "fail")
    assert probes.verdict([passed, skipped]) == "ok"
    assert probes.verdict([skipped]) == "warn"  # inconclusive
    checks = probes.summary("checks", [raw("node", "pass", "29 checks, none failed")], 0.1)
    assert probes.verdict([checks, skipped]) == "warn"  # the hooks' checks alone pass nothing
    assert probes.verdict([passed, skipped, failed]) == "fail"
    assert probes.evidence([passed, skipped]) == "no failure"
    assert probes.skipped([checks, passed, skipped]) == "nccl: all_reduce_perf not installed"


@pytest.mark.parametrize(
    ("probe", "unit", "text", "expected"),
    [
        ("checks", "node", "gpu.count: 7 GPUs visible", "checks: gpu.count: 7 GPUs visible"),
        ("dcgm", "gpu3", "memory: volatile DBE", "dcgm: gpu3 memory: volatile DBE"),
        (
            "ib_write_bw",
            "mlx5_1:2",
            "RDMA write 392 Gb/s",
            "ib_write_bw: mlx5_1:2 RDMA write 392 Gb/s",
        ),
        # the built-in GPU tests name their GPU themselves (node/diag/cuda.py)
        (
            "cuda",
            "gpu1",
            "matmul on gpu1: 8 of 512 differ",
            "cuda: matmul on gpu1: 8 of 512 differ",
        ),
        (
            "cuda",
            "gpu1",
            "matmul_tflops 50 below the floor 100: matmul on gpu1: 50 TFLOPS",
            "cuda: matmul_tflops 50 below the floor 100: matmul on gpu1: 50 TFLOPS",
        ),
        ("cuda", "gpu2", "p2p gpu2 -> gpu0: 3 words copied wrong", None),
    ],
)
def test_evidence_names_the_probe_and_the_unit_once(probe, unit, text, expected):
    line = probes.evidence([probes.summary(probe, [raw(unit, "fail", text)], 0.0)])
    assert line == (expected or f"{probe}: {text}")
    assert line.startswith(f"{probe}: ")
    if unit != "node":
        assert line.split().count(unit) + line.split().count(f"{unit}:") == 1
    else:
        assert "node" not in line


def test_evidence_is_one_clean_bounded_line_of_every_failure():
    hostile = raw("gpu0", "fail", "memory:\n\x1b[31mbad\x1b[0m\r\tpage " + "x" * 300)
    done = [
        probes.summary("checks", [raw("node", "pass", "29 checks, none failed")], 0.0),
        probes.summary("dcgm", [hostile, raw("gpu1", "pass", "ok")], 0.0),
        probes.summary("nccl", [raw("node", "fail", "3 wrong elements: data corruption")], 0.0),
    ]
    line = probes.evidence(done)
    assert len(line) <= 160 and line.endswith("...")
    assert line.isprintable() and "\x1b" not in line and "  " not in line
    assert line.startswith("dcgm: gpu0 memory: ?[31mbad?[0m page xxx")
    short = probes.evidence([done[2], probes.summary("dcgm", [raw("gpu5", "fail", "pcie")], 0.0)])
    assert short == "nccl: 3 wrong elements: data corruption; dcgm: gpu5 pcie"
