"""Our NVML binding (sources/nvml_lib.py) against a stand-in libnvidia-ml.so.1 built from C
(tests/fakenvml/libnvidia-ml.c): the real ctypes code, structs and return codes, in a fresh
process whose dynamic loader finds the stand-in. nvidia-ml-py loads the same library, and both
bindings must give the same sweep. The live library on a real H200: bench/bench_gpu_node.py."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, TESTS, require_real

SOURCE = os.path.join(TESTS, "fakenvml", "libnvidia-ml.c")
SWEEP = (
    "import json, sys\n"
    "from slurmhealth.node.sources import nvml, SourceUnavailable\n"
    "try:\n"
    "    raw = nvml.sweep()\n"
    "except SourceUnavailable as exc:\n"
    "    print(json.dumps({'unavailable': str(exc)})); sys.exit()\n"
    "raw.pop('timing_ms')\n"
    "print(json.dumps(raw))\n"
)


@pytest.fixture(scope="module")
def libdir(tmp_path_factory) -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        require_real("no C compiler to build the stand-in libnvidia-ml.so.1 (scripts/install-deps)")
    folder = tmp_path_factory.mktemp("nvml-lib")
    target = folder / "libnvidia-ml.so.1"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(target), SOURCE],
        check=True,
    )
    return str(folder)


def sweep(libdir: str, binding: str = "builtin", **env: str) -> dict:
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": REPO,
        "LD_LIBRARY_PATH": libdir,
        "SLURMHEALTH_NVML_BINDING": binding,
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-c", SWEEP], env=environ, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_sweep_reads_every_value_through_the_builtin_binding(libdir):
    raw = sweep(libdir)
    assert (raw["driver_version"], raw["cuda_driver_version"], raw["count"]) == (
        "580.159.04",
        13000,
        2,
    )
    first, second = raw["devices"]
    assert first["bus_id"] == "00000000:18:00.0"
    assert first["uuid"] == "GPU-fa4e0000-0000-0000-0000-000000000000"
    assert (first["name"], first["serial"], first["vbios"]) == (
        "NVIDIA H200",
        "1653724063270",
        "96.00.A5.00.10",
    )
    assert (first["arch"], first["memory_total"], first["persistence"]) == (9, 150754820096, 1)
    assert (first["temperature"], first["temp_slowdown"], first["clock_event_reasons"]) == (
        35,
        89,
        1,
    )
    assert (first["pcie_gen"], first["pcie_width"], second["pcie_gen"]) == (5, 16, 4)
    assert (first["mig_current"], first["mig_pending"], second["mig_pending"]) == (0, 0, 1)
    assert first["fabric"] == {
        "state": 3,
        "status": 0,
        "clique_id": 7,
        "cluster_uuid": ZERO_UUID,
        "health_mask": HEALTHY_MASK,
        "health_summary": 1,  # NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    }
    assert (first["app_clock_sm"], first["app_clock_mem"], second["app_clock_sm"]) == (
        1980,
        3201,
        1755,
    )
    assert first["processes"] == []
    fields = second["fields"]
    assert fields["ecc_current"] == 1 and fields["ecc_sbe_aggregate"] == 13
    assert fields["perf_power_ns"] == 2 * 2599937728  # an unsigned long long, read whole
    assert fields["energy_mj"] == 2 * 5_000_000  # field 83, in the same batched call
    # an H200 has no C2C link: the C2C fields and the 14 scoped status entries of the same
    # batch answer NotSupported, read as None, and cost no error entry
    assert [fields[k] for k in ("c2c_links", "c2c_crc", "c2c_replay", "c2c_replay_b2b")] == [
        None
    ] * 4
    assert first["c2c"] is None and second["c2c"] is None
    assert "fields" not in second["errors"]
    assert fields["below_base_ns"] == 700_000_000  # field 81
    assert (fields["pcie_replay"], fields["remap_correctable"]) == (3, 1)
    assert fields["retired_sbe"] is None  # that entry's own return: NotSupported
    links = second["nvlink"]
    assert len(links) == 18  # link 18 answers InvalidArgument: the sweep stops there
    assert links[5] == {"link": 5, "active": False, "replay": 0, "recovery": 0, "crc": 42}
    assert all(link["active"] for link in first["nvlink"])
    assert first["errors"] == {} and first["error"] is None


# nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*: degraded bandwidth, route recovery, route unhealthy and
# access timeout recovery FALSE (2 each, at bits 0, 2, 4, 6), incorrect configuration NONE (1 at
# bit 8): 2 + 8 + 32 + 128 + 256, the value NVIDIA's DCGM tests call healthy.
HEALTHY_MASK = 0x1AA
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def test_the_fabric_is_read_through_the_versioned_call_newest_struct_first(libdir):
    """v3 where the driver has it (health summary), v2 where it answers ArgumentVersionMismatch
    for v3, the old call where it has no versioned call: the fields at their nvml.h offsets."""
    nvl72 = sweep(libdir, FAKE_NVML_LIB_FAULT="nvl72")["devices"][0]["fabric"]
    assert nvl72 == {
        "state": 3,
        "status": 0,
        "clique_id": 32766,
        "cluster_uuid": "5f0b4c2e-91d7-4a63-8e10-27c4b93d6af1",
        "health_mask": HEALTHY_MASK | 1 << 12 | 1 << 14,  # partition assigned, GFM connected
        "health_summary": 1,
    }
    devices = sweep(libdir, FAKE_NVML_LIB_FAULT="degraded:1")["devices"]
    first, second = (d["fabric"] for d in devices)
    assert (first["health_mask"], first["health_summary"]) == (HEALTHY_MASK, 1)
    assert (second["health_mask"], second["health_summary"]) == (HEALTHY_MASK - 1, 3)
    v2 = sweep(libdir, FAKE_NVML_LIB_FAULT="fabric:v2")["devices"][0]
    assert (v2["fabric"]["health_mask"], v2["fabric"]["health_summary"]) == (HEALTHY_MASK, None)
    old = sweep(libdir, FAKE_NVML_LIB_FAULT="fabric:old")["devices"][0]
    assert old["fabric"] == {
        "state": 3,
        "status": 0,
        "clique_id": 7,
        "cluster_uuid": ZERO_UUID,
        "health_mask": None,
        "health_summary": None,
    }
    assert v2["errors"] == old["errors"] == {}, "a version the driver lacks is no error"


def test_both_bindings_give_the_same_sweep_over_the_same_library(libdir):
    # find_spec, not an import: a real pynvml cached in this process would shadow the Python
    # stand-in (tests/fakenvml/pynvml.py) that other tests put first on sys.path.
    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed (a test dependency in setup.cfg)")
    for fault in ("", "procs:3", "lost:1", "unsupported", "mig:1", "nvl72", "fabric:v2",
                  "fabric:old"):
        ours = sweep(libdir, FAKE_NVML_LIB_FAULT=fault)
        theirs = sweep(libdir, "pynvml", FAKE_NVML_LIB_FAULT=fault)
        assert ours == theirs, fault


def test_processes_are_listed_with_memory_not_available_as_none(libdir):
    procs = sweep(libdir, FAKE_NVML_LIB_FAULT="procs:3")["devices"][0]["processes"]
    assert procs == [
        {"pid": 4000, "used_memory": None},
        {"pid": 4001, "used_memory": 2 << 30},
        {"pid": 4002, "used_memory": 3 << 30},
    ]


def test_a_gpu_in_mig_mode_lists_its_mig_devices_and_the_others_list_none(libdir):
    """A job hook maps the MIG devices slurmd names to their GPU by these (checks/gpu.py
    job_scope): each device's own UUID and its GPU and compute instance ids."""
    plain, mig = sweep(libdir, FAKE_NVML_LIB_FAULT="mig:1")["devices"]
    assert (mig["mig_current"], mig["mig_pending"]) == (1, 1)
    assert mig["mig_devices"] == [
        {"index": 0, "uuid": "MIG-fa4e0000-0000-0000-0000-000000000100", "gi": 3, "ci": 0},
        {"index": 1, "uuid": "MIG-fa4e0000-0000-0000-0000-000000000101", "gi": 4, "ci": 0},
    ]
    assert "mig_devices" not in plain and "mig_devices" not in mig["errors"]


def test_a_busy_gpu_is_sampled_and_an_idle_one_is_not(libdir):
    """SM clock and utilisation are read only where processes run (the job's GPUs during a
    health check): the idle GPU costs no call and has no keys."""
    busy, idle = sweep(libdir, FAKE_NVML_LIB_FAULT="procs:1")["devices"]
    assert (busy["sm_clock"], busy["util_gpu"]) == (1980, 97)
    assert "sm_clock" not in idle and "util_gpu" not in idle


def test_a_lost_gpu_is_its_own_error_and_the_others_are_read(libdir):
    raw = sweep(libdir, FAKE_NVML_LIB_FAULT="lost:1", FAKE_NVML_LIB_GPUS="4")
    lost = raw["devices"][1]
    assert lost["error"] == "GpuIsLost" and lost["errors"]["bus_id"] == "GpuIsLost"
    assert [d["index"] for d in raw["devices"]] == [0, 1, 2, 3]  # in order, whatever the threads
    assert all(
        d["error"] is None and d["name"] == "NVIDIA H200"
        for i, d in enumerate(raw["devices"])
        if i != 1
    )


def test_unsupported_calls_are_none_with_the_reason(libdir):
    dev = sweep(libdir, FAKE_NVML_LIB_FAULT="unsupported")["devices"][0]
    assert dev["temp_slowdown"] is None and dev["errors"]["temp_slowdown"] == "NotSupported"
    assert dev["mig_current"] is None and dev["errors"]["mig"] == "NotSupported"
    assert dev["nvlink"] is None and dev["errors"]["nvlink"] == "NotSupported"
    assert dev["fabric"] is None and dev["pcie_gen"] is None
    assert dev["fields"]["ecc_current"] == 1 and dev["fields"]["pcie_replay"] is None
    assert dev["error"] is None  # a GPU without these features is not a broken GPU


def test_a_driver_that_is_not_loaded_makes_the_source_unavailable(libdir):
    raw = sweep(libdir, FAKE_NVML_LIB_FAULT="init:9")
    assert raw == {"unavailable": "NVML unavailable: DriverNotLoaded"}


def test_no_library_at_all_is_library_not_found(tmp_path):
    import ctypes.util  # noqa: PLC0415

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    raw = sweep(str(tmp_path))
    assert raw == {"unavailable": "NVML unavailable: LibraryNotFound"}


def test_an_unknown_binding_is_a_clear_message(libdir):
    raw = sweep(libdir, "nvidia")
    assert raw == {
        "unavailable": "SLURMHEALTH_NVML_BINDING must be builtin or pynvml, not 'nvidia'"
    }


def test_the_builtin_binding_imports_nothing_heavy():
    code = (
        "import sys; before = set(sys.modules); from slurmhealth.node.sources import nvml_lib; "
        "print(sorted(m for m in set(sys.modules) - before "
        "if m.split('.')[0] in ('pynvml', 'json', 're')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "[]"


def hook_env(libdir: str, tmp_path, gpu_source: str = "nvml", gpus: int = 2) -> dict:
    """A prolog as slurmd runs it, on a node whose NVML is the stand-in library."""
    config = tmp_path / "slurmhealth.toml"
    config.write_text(
        f"[[node]]\nmatch = 'gpu01'\ngpu.count = {gpus}\n\n[settings]\n"
        f"gpu_source = {json.dumps(gpu_source)}\n"
        f"kmsg = {json.dumps(os.path.join(TESTS, 'fixtures', 'kmsg', 'healthy.kmsg'))}\n"
        f"slurm_bin = {json.dumps(os.path.join(TESTS, 'fakeslurm'))}\n"
    )
    slurm = tmp_path / "slurm.json"
    slurm.write_text(json.dumps({"gpu01": {"state": "IDLE", "reason": ""}}))
    return {
        "PYTHONPATH": REPO,
        "LD_LIBRARY_PATH": libdir,
        "FAKE_NVML_LIB_LOG": str(tmp_path / "nvml.log"),
        "FAKE_SLURM_STATE": str(slurm),
        "SLURMD_NODENAME": "gpu01",
        "SLURMHEALTH_CONFIG": str(config),
        "SLURMHEALTH_STATE_DIR": str(tmp_path / "state"),
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_GPUS": "0,1",
    }


def prolog(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurmhealth", "prolog", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def gpu_results(tmp_path) -> dict:
    import sqlite3  # noqa: PLC0415

    with sqlite3.connect(str(tmp_path / "state" / "gpu01.db")) as conn:
        rows = conn.execute("SELECT check_name, status, message FROM results").fetchall()
    return {name: (status, message) for name, status, message in rows}


def test_the_prolog_sweeps_the_gpus_once_and_leaves_the_teardown_to_its_exit(libdir, tmp_path):
    """One nvmlInit in all, whether the sweep started early (a node with /dev/nvidiactl) or
    with the run, and the verdicts are the stand-in library's GPUs (its GPU 1 has NVLink 5
    down; the store keeps the results that were not ok). The hook leaves NVML's teardown to
    its exit: no nvmlShutdown on the hot path."""
    proc = prolog(hook_env(libdir, tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert (tmp_path / "nvml.log").read_text() == "init\n"
    results = gpu_results(tmp_path)
    assert results["nvlink.link_state"] == (
        "fail",
        "GPU 1 (0000:28:00) 17/18 NVLinks active, down [5]",
    )
    assert "gpu.count" not in results  # ok: the 2 GPUs expected


def test_check_shuts_nvml_down_after_its_sweep(libdir, tmp_path):
    env = dict(hook_env(libdir, tmp_path), PATH=os.environ.get("PATH", "/usr/bin:/bin"))
    proc = subprocess.run(
        [sys.executable, "-m", "slurmhealth", "check", "--no-db", "--only", "gpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (tmp_path / "nvml.log").read_text() == "init\nshutdown\n"


def test_help_never_touches_nvml(libdir, tmp_path):
    proc = prolog(hook_env(libdir, tmp_path), "--help")
    assert proc.returncode == 0 and "Usage: slurmhealth prolog" in proc.stdout
    assert not (tmp_path / "nvml.log").exists()


def test_with_a_snapshot_configured_the_early_sweep_is_not_used(libdir, tmp_path):
    from conftest import snapshot_path  # noqa: PLC0415

    proc = prolog(hook_env(libdir, tmp_path, snapshot_path("healthy")))
    assert proc.returncode == 1  # the snapshot's 8 GPUs against the expected 2
    assert gpu_results(tmp_path)["gpu.count"][0] == "fail"
    assert "8" in gpu_results(tmp_path)["gpu.count"][1]


@pytest.fixture
def early(monkeypatch, tmp_path):
    """sources.start_early in this process, on the Python stand-in pynvml, as on a node whose
    driver control device exists."""
    from conftest import FAKE_NVML, snapshot_path  # noqa: PLC0415

    from slurmhealth.node import sources  # noqa: PLC0415

    device = tmp_path / "nvidiactl"
    device.write_text("")
    monkeypatch.setitem(sources.EARLY_IF, "gpu", str(device))
    monkeypatch.syspath_prepend(FAKE_NVML)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("SLURMHEALTH_NVML_BINDING", "pynvml")
    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", snapshot_path("healthy"))
    monkeypatch.setenv("FAKE_NVML_FAULT", "")
    monkeypatch.setattr(sources, "_EARLY", {})
    return sources


def test_the_early_sweep_is_handed_to_a_run_with_the_default_options(early):
    early.start_early("gpu")  # a prolog's: without the costly settings
    take = early.take_early("gpu", early.Options(costly=False))
    raw = take()
    assert raw["count"] == 8 and raw["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert "app_clock_sm" not in raw["devices"][0]
    assert early.take_early("gpu", early.Options(costly=False)) is None  # handed over once
    early.start_early("gpu", costly=True)  # a health check's
    assert early.take_early("gpu", early.Options(costly=False)) is None  # not what it read


def test_the_early_sweep_is_not_used_for_other_options(early):
    early.start_early("gpu")
    assert early.take_early("gpu", early.Options(gpu_source="snap.json")) is None
    early.start_early("gpu")
    assert early.take_early("gpu", early.Options(sysfs_root="/elsewhere")) is None


def test_the_early_sweep_raises_what_the_gather_raised(early, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_FAULT", "driver_not_loaded")
    early.start_early("gpu")
    with pytest.raises(early.SourceUnavailable, match="DriverNotLoaded"):
        early.take_early("gpu", early.Options(costly=False))()


def test_no_early_sweep_without_the_drivers_device(early, monkeypatch, tmp_path):
    monkeypatch.setitem(early.EARLY_IF, "gpu", str(tmp_path / "absent"))
    early.start_early("gpu")
    assert early.take_early("gpu", early.Options(costly=False)) is None


def recorded_gpu_versions(tmp_path) -> list:
    """[(phase, the GPU area's recorded versions or None)] of the node's runs, oldest first."""
    import sqlite3  # noqa: PLC0415

    with sqlite3.connect(str(tmp_path / "state" / "gpu01.db")) as conn:
        rows = conn.execute("SELECT phase, sources FROM runs ORDER BY started").fetchall()
    return [(phase, json.loads(text)["gpu"].get("versions")) for phase, text in rows]


def test_application_clocks_are_left_to_the_health_check_and_carried_forward(libdir, tmp_path):
    """The SM application clock costs ~6 ms on first use (H200): prolog and epilog do not read
    it, the health check does, and a job hook's run keeps the last reading in its versions."""
    env = hook_env(libdir, tmp_path)
    assert prolog(env).returncode == 1  # GPU 1's NVLink 5 is down in the stand-in
    health = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "slurmhealth", "healthcheck"],
        env=health,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    (tmp_path / "state" / "gpu01.state.json").unlink()  # no pending fault: a plain second run
    env["SLURM_JOB_ID"] = "8"
    prolog(env)
    runs = recorded_gpu_versions(tmp_path)
    assert [phase for phase, _ in runs] == ["prolog", "healthcheck", "prolog"]
    assert "app_clocks" not in runs[0][1]
    assert runs[1][1]["app_clocks"] == ["1755/3201 MHz", "1980/3201 MHz"]
    # the second prolog's versions equal the health check's (carried), so none are recorded
    assert runs[2][1] is None


def test_no_permission_is_unread_for_a_user_and_a_failure_for_root(public_dir):
    """NVML's NoPermission (the GPU device files not open to this user): for a user who is not
    root the GPU checks did not run, so `check` says the source was not read and exits 4
    (incomplete), never `ok` nor a failed node; for root, as in the hooks, it is a broken
    source and the node expected to have GPUs fails."""
    from conftest import run_as_nobody, run_cli  # noqa: PLC0415

    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        require_real("no C compiler to build the stand-in libnvidia-ml.so.1 (scripts/install-deps)")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(public_dir / "libnvidia-ml.so.1"), SOURCE],
        check=True,
    )
    cfg = public_dir / "slurmhealth.toml"
    cfg.write_text("[gpu]\ncount = 8\n")
    cfg.chmod(0o644)
    kmsg = public_dir / "kmsg"
    kmsg.write_text("")
    kmsg.chmod(0o644)
    env = {
        "LD_LIBRARY_PATH": str(public_dir),
        "SLURMHEALTH_NVML_BINDING": "builtin",
        "FAKE_NVML_LIB_FAULT": "init:4",  # NVML_ERROR_NO_PERMISSION (nvml.h)
        "SLURMD_NODENAME": "gpu01",
    }
    args = ("check", "--no-db", "--json", "--config", str(cfg), "--only", "gpu,xid")
    args += ("--kmsg", str(kmsg))
    user = run_as_nobody(*args, env=env)
    assert user.returncode == 4, user.stderr
    doc = json.loads(user.stdout)
    assert [u["source"] for u in doc["incomplete"]] == ["gpu"]
    assert "NoPermission (the GPU device files are not open to this user)" in user.stderr
    assert {r["status"] for r in doc["results"] if r["check"].startswith("gpu.")} == {"skip"}
    root = run_cli(*args, env=env)
    assert root.returncode == 1, root.stderr
    doc = json.loads(root.stdout)
    assert doc["incomplete"] == [] and doc["results"][0]["status"] == "fail"
