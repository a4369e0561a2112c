"""The built-in GPU tests (node/diag/cuda.py) without a GPU: the checks driven through the
adapter by a pure-Python stand-in (cuda_standin.py) that can corrupt a product, stick a memory
bit, alias two buffers, flip a bit on the way from the host, run slow, raise, hang or crash;
and the parent/child pair as real
processes (a hung child killed with its process group, a crash, no library, no GPU)."""

from __future__ import annotations

import json
import os
import time

import pytest
from cuda_standin import PCIE_GBPS, StandIn

from slurmhealth.node.diag import cuda

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = {"matmul_n": 8}


# --- the checks, in this process -----------------------------------------------------------------


def test_exact_products_pass_with_their_figures():
    o = cuda.matmul(StandIn(gpus=1), 0, seconds=0, n=8)
    assert o["unit"] == "gpu0" and o["status"] == cuda.PASS
    # 8 products timed at the stand-in's 100 TFLOPS: the figure is the arithmetic, not a timing
    assert o["figures"] == {"matmul_tflops": 100.0, "matmul_mismatches": 0, "matmul_runs": 8}


def test_products_repeat_for_about_the_seconds_asked():
    o = cuda.matmul(StandIn(gpus=1), 0, seconds=2 * 8**3 * 20 / 100e12, n=8)
    assert o["figures"]["matmul_runs"] == 24  # batches of 8 until 20 products' time has passed


def test_a_corrupted_element_fails_naming_the_gpu():
    found = cuda.run_tests(StandIn(gpus=2, corrupt=1), ["matmul"], 0, n=8)
    assert [(o["unit"], o["status"]) for o in found] == [("gpu0", "pass"), ("gpu1", "fail")]
    bad = found[1]
    assert bad["evidence"] == (
        "matmul on gpu1: 8 of 512 results differ from the exact product (silent data corruption)"
    )
    assert bad["figures"]["matmul_mismatches"] == 8  # one element of each of 8 products


def test_good_memory_passes_every_pattern_over_many_chunks():
    backend = StandIn(gpus=1, free=64 << 10)
    o = cuda.memory(backend, 0, seconds=0, chunk_bytes=4 << 10)
    assert o["status"] == cuda.PASS and o["figures"]["memory_mismatches"] == 0
    assert len(backend.made[0]) == 14  # 13 chunks of 4 KiB in 90% of 64 KiB, and the scratch
    assert "6 patterns x 1 pass" in o["evidence"]
    # the stand-in's 1000 GB/s: a fill writes each byte, a copy reads and writes each one
    assert (o["figures"]["memory_write_gbps"], o["figures"]["hbm_gbps"]) == (1000.0, 1000.0)
    assert o["evidence"].endswith("written at 1000 GB/s, copied at 1000 GB/s")


def test_a_stuck_bit_fails_memory_naming_the_patterns_that_saw_it():
    o = cuda.memory(StandIn(gpus=1, stuck=0), 0, seconds=0, chunk_bytes=4 << 10)
    assert o["status"] == "fail" and o["unit"] == "gpu0"
    assert o["figures"]["memory_mismatches"] == 3
    # bit 4 of word 512 stuck at one: unseen where the pattern sets it (ones, 0x55555555, and
    # the inverse address word 512 ^ ~0)
    assert o["evidence"].endswith("(zeros, inverse checkerboard, address)")


def test_aliased_addresses_pass_every_constant_pattern_but_not_the_address_ones():
    o = cuda.memory(StandIn(gpus=1, alias=0), 0, seconds=0, chunk_bytes=4 << 10)
    assert o["status"] == "fail"
    assert o["evidence"].endswith("(address, inverse address)")


def test_a_bad_device_copy_fails_memory_as_a_device_copy():
    class BadCopy(StandIn):
        def copy(self, dst, src):
            super().copy(dst, src)
            dst.data[0] ^= 1  # the copy within the GPU gets one word wrong

    o = cuda.memory(BadCopy(gpus=1), 0, seconds=0, chunk_bytes=4 << 10)
    assert o["status"] == "fail" and o["figures"]["memory_mismatches"] == 1
    assert o["evidence"].endswith("(device copy)")


# --- copies to and from host memory --------------------------------------------------------------


def test_host_round_trips_are_exact_with_both_figures():
    o = cuda.h2d(StandIn(gpus=1), 0, nbytes=4096, repeats=3)
    assert (o["unit"], o["status"]) == ("gpu0", cuda.PASS)
    # the stand-in's PCIe link, each way: the arithmetic of its clock, not a timing
    assert o["figures"] == {"h2d_gbps": PCIE_GBPS, "d2h_gbps": PCIE_GBPS, "h2d_mismatches": 0}
    assert o["evidence"] == (
        "h2d on gpu0: 4 round trips of 0.00390625 MiB exact, "
        "50.0 GB/s host to device, 50.0 GB/s back"
    )


def test_a_bit_flipped_on_the_way_from_the_host_fails_that_gpu_only():
    found = cuda.run_tests(StandIn(gpus=2, flip=1), ["h2d"], 0)
    assert [(o["unit"], o["status"]) for o in found] == [("gpu0", "pass"), ("gpu1", "fail")]
    repeats = cuda.H2D_REPEATS
    assert found[1]["figures"]["h2d_mismatches"] == repeats + 1  # one word, every round trip
    assert found[1]["evidence"] == (
        f"h2d on gpu1: {repeats + 1} words wrong after {repeats + 1} round trips of 0.0078125 "
        "MiB through host memory (PCIe data corruption)"
    )


@pytest.mark.parametrize("lost", ["upload", "download"])
def test_a_copy_that_never_happened_fails(lost):
    """Each round trip sends other words: the last round's words left behind are wrong."""

    class Lost(StandIn):
        pass

    setattr(Lost, lost, lambda self, *args: None)
    o = cuda.h2d(Lost(gpus=1), 0, nbytes=4096, repeats=2)
    assert o["status"] == "fail" and o["figures"]["h2d_mismatches"] > 0


def test_a_slow_pcie_path_passes_with_its_figures_and_fails_under_a_floor():
    found = cuda.run_tests(StandIn(gpus=2, slow=0), ["h2d"], 0)
    assert [o["status"] for o in found] == ["pass", "pass"]
    assert [o["figures"]["h2d_gbps"] for o in found] == [PCIE_GBPS / 10, PCIE_GBPS]
    assert [o["figures"]["d2h_gbps"] for o in found] == [PCIE_GBPS / 10, PCIE_GBPS]
    judged = cuda.judge(found, {"h2d_gbps": 20})
    assert [o["status"] for o in judged] == ["fail", "pass"]
    assert judged[0]["evidence"].startswith("h2d_gbps 5 below the floor 20: h2d on gpu0: ")


def test_each_gpus_host_buffer_is_made_on_its_own_numa_node(tmp_path, monkeypatch):
    """The thread moves onto the GPU's local CPUs (sysfs local_cpulist) before the pinned
    buffer is made, and gets all its CPUs back afterwards."""
    allowed = os.sched_getaffinity(0)
    mine = min(allowed)
    device = tmp_path / "bus" / "pci" / "devices" / "0000:1b:00.0"
    device.mkdir(parents=True)
    (device / "local_cpulist").write_text(f"{mine}\n")
    monkeypatch.setattr(cuda, "SYSFS", str(tmp_path))
    backend = StandIn(gpus=2, bus="0000:1b:00.0")
    found = cuda.host_copies(backend, 2, nbytes=4096, repeats=1)
    assert [o["status"] for o in found] == ["pass", "pass"]
    assert backend.pinned_made == [(0, {mine}), (1, {mine})]
    assert os.sched_getaffinity(0) == allowed
    # a GPU whose address the library cannot tell, or sysfs does not know: all the CPUs
    for bus in ("", "0000:99:00.0"):
        unknown = StandIn(gpus=1, bus=bus)
        cuda.host_copies(unknown, 1, nbytes=4096, repeats=1)
        assert unknown.pinned_made == [(0, allowed)]


@pytest.mark.parametrize(
    ("cuda_says", "sysfs"),
    [
        ("0000:1B:00.0", "0000:1b:00.0"),
        ("00000000:9A:00.0", "0000:9a:00.0"),
        ("0001:03:00.0", "0001:03:00.0"),
        ("", ""),
        ("garbage", ""),
        ("zz:1b:00.0", ""),
        ("0000:../../etc", ""),
    ],
)
def test_cuda_pci_addresses_become_sysfs_names(cuda_says, sysfs):
    assert cuda._sysfs_address(cuda_says) == sysfs


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
        ("5", {5}),
        ("", set()),
        ("0-x", set()),
    ],
)
def test_cpu_lists_are_read_as_sysfs_writes_them(text, cpus):
    assert cuda._cpulist(text) == cpus


def test_p2p_copies_each_gpu_to_its_neighbour():
    found = cuda.p2p(StandIn(gpus=3), 3, nbytes=1024, repeats=2)
    assert [o["unit"] for o in found] == ["gpu0", "gpu1", "gpu2"]
    assert all(o["status"] == cuda.PASS for o in found)
    assert found[2]["evidence"] == "p2p gpu2 -> gpu0: 1000 GB/s"
    assert found[0]["figures"] == {"p2p_gbps": 1000.0, "p2p_mismatches": 0}


def test_p2p_skips_one_gpu_and_pairs_without_peer_access():
    assert cuda.p2p(StandIn(gpus=1), 1)[0]["status"] == "skip"
    found = cuda.p2p(StandIn(gpus=2, peer=False), 2, nbytes=1024)
    assert [o["status"] for o in found] == ["skip", "skip"]
    assert "no peer access" in found[0]["evidence"]


def test_a_slow_gpu_passes_with_its_figure_and_fails_under_a_floor():
    found = cuda.run_tests(StandIn(gpus=2, slow=1), ["matmul"], 0, n=8)
    assert [o["status"] for o in found] == ["pass", "pass"]
    assert [o["figures"]["matmul_tflops"] for o in found] == [100.0, 10.0]
    judged = cuda.judge(found, {"matmul_tflops": 50})
    assert [o["status"] for o in judged] == ["pass", "fail"]
    assert judged[1]["evidence"] == (
        "matmul_tflops 10 below the floor 50: matmul on gpu1: 8 products of 8x8 exact, "
        "10 TFLOPS fp16"
    )


def test_a_cuda_error_fails_that_gpus_test_only():
    found = cuda.run_tests(StandIn(gpus=2, error=0, free=4096), ["matmul", "memory"], 0, n=4)
    assert [(o["unit"], o["status"]) for o in found] == [
        ("gpu0", "fail"),
        ("gpu0", "pass"),
        ("gpu1", "pass"),
        ("gpu1", "pass"),
    ]
    assert found[0]["evidence"] == (
        "matmul on gpu0: RuntimeError: CUDA error: uncorrectable ECC error encountered"
    )


def test_no_gpu_visible_skips():
    (o,) = cuda.run_tests(StandIn(gpus=0), list(cuda.TESTS), 0)
    assert (o["unit"], o["status"]) == ("node", "skip")
    assert o["evidence"].startswith("no CUDA GPU visible")


# --- parent and child, as real processes ---------------------------------------------------------


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """Run the child on the stand-in: returns a function (settings, **run kwargs) -> outcomes."""
    monkeypatch.setenv("PYTHONPATH", HERE)
    monkeypatch.setenv("CUDA_STANDIN_PIDS", str(tmp_path / "pids"))
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)

    def run(settings: str, tests=cuda.TESTS, timeout=60.0, **kwargs) -> list:
        monkeypatch.setenv("CUDA_STANDIN", settings)
        return cuda.run(list(tests), 0, timeout, backend="cuda_standin", **SMALL, **kwargs)

    return run


def test_the_child_reports_every_gpus_outcomes_despite_library_noise(standin):
    found = standin("gpus=2 noise=1")
    assert [(o["unit"], o["evidence"].split(":")[0]) for o in found] == [
        ("gpu0", "matmul on gpu0"),
        ("gpu0", "memory on gpu0"),
        ("gpu1", "matmul on gpu1"),
        ("gpu1", "memory on gpu1"),
        ("gpu0", "h2d on gpu0"),
        ("gpu1", "h2d on gpu1"),
        ("gpu0", "p2p gpu0 -> gpu1"),
        ("gpu1", "p2p gpu1 -> gpu0"),
    ]
    assert {o["status"] for o in found} == {"pass"}
    assert json.dumps(found)  # what the runner records


def test_floors_reach_the_child(standin):
    found = standin("gpus=1", tests=["matmul"], floors={"matmul_tflops": 1e6})
    assert found[0]["status"] == "fail"
    assert "below the floor" in found[0]["evidence"]


def dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def die_soon(pid: int, within: float = 10.0) -> bool:
    """A process SIGKILLed closes its files before it becomes a zombie: the parent's read of the
    pipe ends while /proc may still show it running for a moment."""
    deadline = time.monotonic() + within
    while not dead(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_hang_is_killed_at_the_timeout_with_its_process_group(standin, tmp_path):
    (o,) = standin("gpus=2 hang=1", timeout=2)
    assert (o["unit"], o["status"]) == ("node", "fail")
    assert o["evidence"].startswith("GPU tests did not finish within 2 s (still running: ")
    assert "gpu1 matmul" in o["evidence"]
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert all(die_soon(pid) for pid in pids)  # the child and the helper it started


def test_a_crash_fails_with_its_last_line_of_stderr(standin):
    (o,) = standin("gpus=2 crash=1")
    assert (o["unit"], o["status"]) == ("node", "fail")
    assert o["evidence"].startswith("GPU tests ended without a result (killed by signal 11;")
    # the crashed GPU's test is among those named as running (the other GPU's thread may be at
    # any test by then: the threads run at their own pace)
    assert "gpu1 matmul" in o["evidence"]
    assert o["evidence"].endswith(": CUDA error: an illegal memory access was encountered")


def test_output_that_is_not_the_document_fails_with_the_last_error_line(tmp_path):
    """An interpreter that cannot run the child (too old, say) prints something else."""
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\necho 'Python 2.7 says hello'\n"
        "echo 'Traceback (most recent call last):' >&2\n"
        "echo 'SyntaxError: invalid syntax' >&2\nexit 1\n"
    )
    python.chmod(0o755)
    (o,) = cuda.run(["matmul"], 1, 60, python=str(python))
    assert (o["unit"], o["status"]) == ("node", "fail")
    assert o["evidence"] == "GPU tests ended without a result (exit 1): SyntaxError: invalid syntax"


@pytest.mark.parametrize(
    "planted, evidence",
    [
        ('raise ModuleNotFoundError("No module named {0!r}", name={0!r})', cuda.NO_LIBRARY),
        ("raise OSError('libcudart.so.12: cannot open shared object file')", "no usable CUDA"),
    ],
)
def test_no_cuda_library_skips(monkeypatch, tmp_path, planted, evidence):
    """torch and cupy planted on the path as absent (or broken), whatever this machine has."""
    for name in ("torch", "cupy"):
        (tmp_path / f"{name}.py").write_text(planted.format(name) + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (o,) = cuda.run(list(cuda.TESTS), 1, 60)
    assert (o["unit"], o["status"]) == ("node", "skip")
    assert o["evidence"].startswith(evidence)
    if evidence != cuda.NO_LIBRARY:
        assert "torch: OSError: libcudart.so.12" in o["evidence"]


def test_the_skip_names_the_extra_and_the_extra_installs_a_library_the_tests_drive():
    """setup.cfg's extra installs a library open_backend knows; the test extra does not (the
    suite runs on machines without a GPU, through the stand-in)."""
    import configparser
    import re

    from conftest import REPO

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    extras = cfg["options.extras_require"]

    def names(extra: str) -> set:
        return {re.match(r"[\w.-]+", line).group(0) for line in extras[extra].split() if line}

    (package,) = names(cuda.EXTRA)
    assert package.split("-")[0] in cuda.LIBRARIES  # cupy-cuda12x provides the module cupy
    assert not {n for n in names("test") if n.split("-")[0] in cuda.LIBRARIES}
    assert f"slurmhealth[{cuda.EXTRA}]" in cuda.NO_LIBRARY


def test_no_gpu_visible_skips_through_the_child(standin):
    (o,) = standin("gpus=0")
    assert (o["status"], o["evidence"]) == ("skip", "no CUDA GPU visible (stand-in)")


def test_an_interpreter_that_cannot_run_skips():
    (o,) = cuda.run(["matmul"], 1, 10, python="/nonexistent/python3")
    assert (o["unit"], o["status"]) == ("node", "skip")
    assert o["evidence"].startswith("cannot run /nonexistent/python3")


def test_unknown_tests_are_refused():
    with pytest.raises(ValueError, match="unknown GPU test"):
        cuda.run(["matmul", "fp8"], 1, 10)
