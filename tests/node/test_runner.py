"""The runner: sources under deadlines, checks that crash, overrides, baselines across runs."""

from __future__ import annotations

import json
import os
import time

import conftest
import pytest
from conftest import FAKE_NVML, FIXTURES, run_cli, snapshot_path

from slurmhealth.core import store
from slurmhealth.node import config, runner
from slurmhealth.node.checks import gpu


def expect(**settings) -> dict:
    out = config.defaults()
    out["settings"].update(settings)
    return out


def replay(name: str = "healthy", **kw) -> runner.Run:
    options = runner.Options(gpu_source=snapshot_path(name))
    return runner.run("gpu01", kw.pop("expect", expect()), options, ["gpu", "nvlink"], **kw)


def by_name(run: runner.Run) -> dict:
    return {r.check: r for r in run.results}


def test_replayed_healthy_snapshot_is_ok():
    run = replay()
    assert run.verdict == "ok"
    assert {r.check for r in run.results} >= {"gpu.count", "nvlink.link_state"}
    assert all(r.duration >= 0 for r in run.results)


def test_a_crashing_check_is_error_not_fail(monkeypatch):
    def boom(facts, ctx):
        raise KeyError("surprise")

    monkeypatch.setattr(gpu, "CHECKS", (*gpu.CHECKS, boom))
    run = replay()
    assert by_name(run)["gpu.boom"].status == "error"
    assert "KeyError" in by_name(run)["gpu.boom"].message
    assert run.verdict == "warn"
    run = replay(expect=expect(error_fails=True))
    assert run.verdict == "fail"


def test_severity_overrides_and_disabled_checks():
    e = expect()
    e["checks"] = {
        "gpu.thermal": {"severity": "fail"},
        "gpu.count": {"enabled": False},
        "gpu.ecc": {"severity": "warn"},
    }
    thermal = by_name(replay("thermal", expect=e))
    assert thermal["gpu.thermal"].status == "fail"
    assert thermal["gpu.count"].status == "skip"
    assert thermal["gpu.count"].message == "disabled by config"
    assert by_name(replay("ecc-dbe", expect=e))["gpu.ecc"].status == "warn"


def test_a_job_hook_judges_its_jobs_gpus_after_the_severity_overrides():
    """GPU 7 is hot and the config makes gpu.thermal fail. A prolog of a job on GPUs 0-3 keeps
    it as a warning naming GPU 7 (the override does not make it refuse the job again); a job on
    GPU 7, the health check and `check` fail."""
    e = expect()
    e["checks"] = {"gpu.thermal": {"severity": "fail"}}
    shared = replay("thermal", expect=e, phase="prolog", job_gpus=[0, 1, 2, 3])
    thermal = by_name(shared)["gpu.thermal"]
    assert (shared.verdict, shared.job_gpus, thermal.status) == ("warn", [0, 1, 2, 3], "warn")
    assert thermal.message.startswith("GPU 7 (0000:db:00) at 88 C")
    assert thermal.data["scope"]["other_gpus"] == [7]
    own = replay("thermal", expect=e, phase="prolog", job_gpus=[6, 7])
    assert own.verdict == "fail" and by_name(own)["gpu.thermal"].status == "fail"
    for phase in ("healthcheck", "check"):
        assert replay("thermal", expect=e, phase=phase).verdict == "fail"


def test_a_job_index_nvml_does_not_list_judges_every_gpu_and_says_why():
    run = replay("ecc-dbe", phase="epilog", job_gpus=[4, 9])
    ecc = by_name(run)["gpu.ecc"]
    assert run.verdict == "fail" and run.job_gpus is None
    assert ecc.data["scope"] == {
        "job_gpus": None,
        "why": "GPU index 9 from slurmd not among the GPUs NVML lists",
    }


def test_missing_nvml_fails_only_where_gpus_are_expected(monkeypatch):
    monkeypatch.syspath_prepend(FAKE_NVML)
    monkeypatch.setenv("SLURMHEALTH_NVML_BINDING", "pynvml")
    monkeypatch.setenv("FAKE_NVML_FAULT", "driver_not_loaded")
    options = runner.Options()
    run = runner.run("gpu01", expect(), options, ["gpu", "nvlink"])
    assert by_name(run)["gpu.count"].status == "skip"
    assert "DriverNotLoaded" in by_name(run)["gpu.count"].message
    e = expect()
    e["gpu"]["count"] = 8
    run = runner.run("gpu01", e, options, ["gpu", "nvlink"])
    first = by_name(run)["gpu.count"]
    assert (first.status, run.verdict) == ("fail", "fail")
    assert all(r.status == "skip" for r in run.results if r.check != "gpu.count")


def test_a_hung_nvml_ends_within_budget_as_a_fail(monkeypatch):
    monkeypatch.syspath_prepend(FAKE_NVML)
    monkeypatch.setenv("SLURMHEALTH_NVML_BINDING", "pynvml")
    monkeypatch.setenv("FAKE_NVML_SNAPSHOT", snapshot_path("healthy"))
    monkeypatch.setenv("FAKE_NVML_FAULT", "hang_device:2")
    started = time.monotonic()
    run = runner.run("gpu01", expect(timeout_gpu=0.5), runner.Options(), ["gpu"])
    assert time.monotonic() - started < 2
    assert run.hung
    count = by_name(run)["gpu.count"]
    assert (count.status, count.message) == ("fail", "gpu timed out after 0.5 s")


def test_the_host_sources_share_one_thread_and_each_keeps_its_deadline(tmp_path):
    # a real hang: /proc/meminfo a FIFO nobody writes, so the host source blocks in open()
    root = conftest.hw_tree(tmp_path, None)
    os.mkfifo(os.path.join(root, "proc", "meminfo"))
    options = runner.Options(host_root=root, costly=False)
    timeouts = {"kernel": 1.0, "host": 0.3, "fs": 0.6}
    try:
        started = time.monotonic()
        got, hung = runner.gather({"kernel", "host", "fs"}, options, timeouts, 5.0)
        took = time.monotonic() - started
    finally:  # a writer's open and close ends the reader's wait: the thread finishes
        os.close(os.open(os.path.join(root, "proc", "meminfo"), os.O_WRONLY | os.O_NONBLOCK))
    assert hung and took < 1.5
    assert got["kernel"].status != "timeout"  # read first, before the hang
    assert (got["host"].status, got["host"].message) == ("timeout", "timed out after 0.3 s")
    assert got["fs"].status == "timeout"  # queued behind the hung read
    healthy = conftest.hw_tree(tmp_path / "ok", "MemTotal:       16384 kB\n")
    options = runner.Options(host_root=healthy)
    got, hung = runner.gather({"kernel", "host", "fs"}, options, timeouts, 5.0)
    assert not hung
    assert got["host"].raw["meminfo"] == {"MemTotal": "16384 kB"}


def test_hung_process_exits_on_time(tmp_path):
    """The whole command ends although a gather thread is stuck forever."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[settings]\ntimeout_gpu = 1\n")
    env = {
        "PYTHONPATH": f"{FAKE_NVML}:{__import__('os').getcwd()}",
        "SLURMHEALTH_NVML_BINDING": "pynvml",
        "FAKE_NVML_SNAPSHOT": snapshot_path("healthy"),
        "FAKE_NVML_FAULT": "hang_init",
    }
    started = time.monotonic()
    proc = run_cli(
        "check", "--only", "gpu", "--json", "--no-db", "--config", str(cfg), env=env, timeout=20
    )
    assert time.monotonic() - started < 8
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["results"][0]["message"] == "gpu timed out after 1 s"


def test_baselines_carry_counters_between_runs(tmp_path):
    conn = store.connect(str(tmp_path / "n.db"))
    first = replay()
    store.record_run(conn, first.records())
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    doc["gpu"]["devices"][1]["nvlink"][7]["recovery"] = 25
    later = tmp_path / "later.json"
    later.write_text(json.dumps(doc))
    second = runner.run(
        "gpu01",
        expect(),
        runner.Options(gpu_source=str(later)),
        ["nvlink"],
        baselines=store.load_baselines(conn, "gpu01"),
    )
    result = by_name(second)["nvlink.error_counters"]
    assert result.status == "fail" and "GPU 1 (0000:2a:00) link 7 recovery +25" in result.message


def test_snapshot_source_failures_replay_as_recorded(tmp_path):
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    doc["sources"]["gpu"] = {"status": "timeout", "message": "timed out after 5 s", "seconds": 5}
    path = tmp_path / "hung.json"
    path.write_text(json.dumps(doc))
    run = runner.run("gpu01", expect(), runner.Options(gpu_source=str(path)), ["gpu"])
    assert by_name(run)["gpu.count"].status == "fail"
    assert run.to_dict()["sources"]["gpu"] == doc["sources"]["gpu"]  # no facts: no versions


@pytest.mark.parametrize("content", ["{", "[]", '{"format": "other"}'])
def test_a_file_that_is_not_a_snapshot_is_refused(tmp_path, content):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="snapshot"):
        runner.run("n", expect(), runner.Options(gpu_source=str(path)), ["gpu"])


def test_a_lost_gpu_is_named_in_xid_messages_from_the_last_inventory(tmp_path):
    conn = store.connect(str(tmp_path / "n.db"))
    store.record_run(conn, replay().records())  # the healthy node's inventory
    run = runner.run(
        "gpu01",
        expect(),
        runner.Options(gpu_source=snapshot_path("xid-79")),
        ["gpu", "xid"],
        baselines=store.load_baselines(conn, "gpu01"),
    )
    hardware = by_name(run)["xid.hardware"]
    assert (hardware.status, hardware.action) == ("fail", "reboot")
    assert hardware.message.startswith("GPU 3 (0000:5d:00) Xid 79")


def _raw_versions(snapshot: str, sysfs: str) -> tuple:
    """Driver and VBIOS set read from the snapshot file, firmware and product (hca_type) per HCA
    from the sysfs files: what the runner must record, found without it."""
    with open(snapshot_path(snapshot)) as handle:
        doc = json.load(handle)["gpu"]
    alive = [d for d in doc["devices"] if not d.get("error")]
    vbios = sorted({d["vbios"] for d in alive if d.get("vbios")})
    root = os.path.join(FIXTURES, "sysfs", sysfs, "class", "infiniband")
    firmware, products, rates = {}, {}, set()
    for hca in sorted(os.listdir(root)):
        with open(os.path.join(root, hca, "fw_ver")) as handle:
            firmware[hca] = handle.read().strip()
        with open(os.path.join(root, hca, "hca_type")) as handle:
            products[hca] = handle.read().strip()
        for port in os.listdir(os.path.join(root, hca, "ports")):
            with open(os.path.join(root, hca, "ports", port, "state")) as handle:
                active = "ACTIVE" in handle.read()
            with open(os.path.join(root, hca, "ports", port, "rate")) as handle:
                if active:
                    rates.add(float(handle.read().split()[0]))
    gpu = {
        "driver": doc["driver_version"],
        "vbios": vbios,
        "model": sorted({d["name"] for d in alive}),
        "persistence": sorted({d["persistence"] for d in alive}),
        "ecc": sorted({d["fields"]["ecc_current"] for d in alive}),
        "mig": sorted({d["mig_current"] for d in alive}),
    }
    return gpu, {"fw_ver": firmware, "product": products, "rate": sorted(rates)}


def test_versions_travel_with_the_sources_into_the_store(tmp_path):
    options = runner.Options(
        gpu_source=snapshot_path("vbios-drift"),
        sysfs_root=os.path.join(FIXTURES, "sysfs", "fw-drift"),
    )
    run = runner.run("gpu01", expect(), options, ["gpu", "nvlink", "ib"])
    gpu_versions, ib_versions = _raw_versions("vbios-drift", "fw-drift")
    assert len(gpu_versions["vbios"]) == 2 and len(set(ib_versions["fw_ver"].values())) == 2
    sources = run.to_dict()["sources"]
    assert sources["gpu"]["versions"] == gpu_versions
    assert sources["ib"]["versions"] == ib_versions
    conn = store.connect(str(tmp_path / "n.db"))
    store.record_run(conn, run.records())
    stored = json.loads(conn.execute("SELECT sources FROM runs").fetchone()[0])
    assert stored["gpu"]["versions"] == gpu_versions
    assert stored["ib"]["versions"] == ib_versions


def test_unchanged_versions_are_recorded_again_only_every_six_hours(tmp_path):
    conn = store.connect(str(tmp_path / "n.db"))
    sysfs = os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr")
    plain = runner.Options(gpu_source=snapshot_path("healthy"), sysfs_root=sysfs)
    drifted = runner.Options(gpu_source=snapshot_path("vbios-drift"), sysfs_root=sysfs)

    def recorded(options: runner.Options, age: float = 0) -> bool:
        baselines = store.load_baselines(conn, "gpu01")
        if age and "versions" in baselines:
            baselines["versions"]["recorded"] -= age
        run = runner.run("gpu01", expect(), options, ["gpu", "ib"], baselines=baselines)
        shown = run.to_dict()["sources"]  # check --json always shows them
        assert shown["gpu"]["versions"] and shown["ib"]["versions"]
        store.record_run(conn, run.records())
        row = conn.execute("SELECT sources FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()
        return "versions" in json.loads(row[0])["gpu"]

    assert recorded(plain)  # first run: nothing known yet
    assert not recorded(plain)  # unchanged
    assert recorded(drifted)  # changed: recorded at once
    assert not recorded(drifted)
    assert recorded(drifted, age=runner.VERSIONS_EVERY + 1)  # unchanged, but 6 h on


def _pci_tree(root, devices: dict):
    """root/bus/pci/devices/<addr>/{vendor,class} as the kernel writes them (sysfs-bus-pci)."""
    for addr, (vendor, cls) in devices.items():
        d = root / "bus" / "pci" / "devices" / addr
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
    return str(root)


def test_no_nvml_with_nvidia_gpus_on_the_pci_bus_fails_even_without_a_config(
    monkeypatch, tmp_path
):
    """Zero config must still catch a dead driver: NVML cannot start, yet the PCI bus shows
    NVIDIA 3D controllers. An NVSwitch (a bridge) and other vendors' devices do not count."""
    monkeypatch.syspath_prepend(FAKE_NVML)
    monkeypatch.setenv("SLURMHEALTH_NVML_BINDING", "pynvml")
    monkeypatch.setenv("FAKE_NVML_FAULT", "driver_not_loaded")
    gpus = {"0000:18:00.0": ("0x10de", "0x030200"), "0000:2a:00.0": ("0x10de", "0x030200")}
    others = {"0000:05:00.0": ("0x10de", "0x068000"), "0000:00:1f.0": ("0x8086", "0x060100")}
    root = _pci_tree(tmp_path / "sys", {**gpus, **others})
    run = runner.run("gpu01", expect(), runner.Options(sysfs_root=root), ["gpu"])
    count = by_name(run)["gpu.count"]
    assert (count.status, run.verdict) == ("fail", "fail")
    assert "DriverNotLoaded while 2 NVIDIA GPUs are on the PCI bus" in count.message
    only_others = _pci_tree(tmp_path / "sys2", others)
    run = runner.run("gpu01", expect(), runner.Options(sysfs_root=only_others), ["gpu"])
    assert by_name(run)["gpu.count"].status == "skip"


def test_a_snapshot_replays_its_own_sections_when_paths_are_left_at_their_defaults():
    """The hooks pass settings.sysfs_root=/sys and kmsg=/dev/kmsg (the defaults): with a
    snapshot as the GPU source they must replay the snapshot's InfiniBand and kernel-log
    sections, as `check` does, not read the live node (a fault drill drained every node on
    "HCA missing")."""
    options = runner.Options(
        gpu_source=snapshot_path("healthy"), sysfs_root="/sys", kmsg="/dev/kmsg"
    )
    run = runner.run("gpu01", expect(), options)
    assert run.sources["ib"].status == "ok" and run.sources["kmsg"].status == "ok"
    assert len(run.facts["ib"]["devices"]) == 8  # the snapshot's 8 HCAs, not this machine's


def test_the_hosts_nccl_is_read_by_the_health_check_and_carried_by_the_job_hooks():
    """The job hooks (sources.Options costly=False) leave the host's NCCL out of their read;
    the versions they record keep the health check's reading, as application clocks do."""
    kmsg = runner.Gathered("ok", {})
    kmsg.versions = {"kernel": "6.1.0-28-amd64"}
    before = {"seen": {"kmsg": {"kernel": "6.1.0-28-amd64", "nccl": "2.21.5"}}, "recorded": 0}
    due, kept = runner._versions_due({"kmsg": kmsg}, before, 100.0)
    assert kmsg.versions == {"kernel": "6.1.0-28-amd64", "nccl": "2.21.5"}
    assert (due, kept) == (False, before)  # unchanged: nothing new to record


@pytest.mark.parametrize("phase", ["prolog", "epilog", "healthcheck", "check", "diag"])
def test_health_check_areas_run_only_where_their_phases_say(tmp_path, monkeypatch, phase):
    """nvme, bmc, imex and site (PHASES) never run in a job hook: their sources are never gathered
    there; the health check, `check` and `diagnose` run them."""
    gathered = []
    real = runner.sources.gather

    def counted_gather(source, options):
        gathered.append(source)
        return real(source, options)

    monkeypatch.setattr(runner.sources, "gather", counted_gather)
    nhc = tmp_path / "nhc"
    nhc.write_text("#!/bin/sh\nexit 0\n")
    nhc.chmod(0o755)
    options = runner.Options(
        gpu_source=snapshot_path("healthy"),
        sysfs_root=os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
        kmsg=os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
        host_root=str(tmp_path),  # no NVMe, no IPMI device there
        site_program=str(nhc),
    )
    run = runner.run("gpu01", expect(), options, None, phase)
    areas = {r.check.split(".")[0] for r in run.results}
    hooks = phase in ("prolog", "epilog")
    assert ({"nvme", "bmc", "imex", "site"} & areas == set()) is hooks
    assert (set(gathered) & {"nvme", "bmc", "imex", "site"} == set()) is hooks
    if not hooks:
        assert by_name(run)["site.program"].message == "nhc passed"
        assert by_name(run)["nvme.present"].status == "skip"


def test_the_site_program_gets_its_own_deadline_within_slurmds():
    settings = expect()["settings"]
    assert runner.deadline_for(settings, "healthcheck", "/usr/sbin/nhc") == 42.0
    assert runner.deadline_for(settings, "healthcheck", None) == settings["deadline"]
    assert runner.deadline_for(settings, "prolog", "/usr/sbin/nhc") == settings["deadline"]
