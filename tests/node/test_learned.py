"""A node's own known-good runs as its expectations when no config exists: pure rules on
parsed facts, then `slurmhealth check` and the prolog as real processes on real stores, with
NVML served by the stand-in module and the PCI bus by sysfs trees in the kernel's layout."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from conftest import FAKE_NVML, FIXTURES, TESTS, faults_module, run_cli, snapshot_path

from slurmhealth.core.result import FAIL, OK, Result
from slurmhealth.node import config, learned, runner
from slurmhealth.node.checks import gpu, ib

REPO = os.path.dirname(TESTS)
SYSFS = os.path.join(FIXTURES, "sysfs")
HEALTHY_BUS = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
]


def gpu_facts(name="healthy"):
    return gpu.parse(faults_module().build(name)["gpu"])


def ib_facts(tree):
    from slurmhealth.node.sources import sysfs

    return ib.parse(sysfs.gather(runner.Options(sysfs_root=os.path.join(SYSFS, tree))))


def result(check, status=OK):
    out = Result(status, "m")
    out.check = check
    return out


# ---------------------------------------------------------------- the pure rules


def test_a_passing_area_is_learned_with_the_time_it_was_first_shown():
    facts = {"gpu": gpu_facts(), "ib": ib_facts("healthy-8x-ndr")}
    doc = learned.learn(facts, [result("gpu.count"), result("ib.port_state")], None, 100.0)
    assert doc["areas"]["gpu"] == {
        "values": {"count": 8, "model": "NVIDIA H100 80GB HBM3", "pcie_gen": 5, "pcie_width": 16},
        "since": 100.0,
    }
    ports = doc["areas"]["ib"]["values"]
    assert len(ports["ports"]) == 8 and ports["rate"] == 400 and ports["link_layer"] == "InfiniBand"
    assert "fw_ver" not in ports  # versions change on purpose: never learned
    # the same values again change nothing: the stored row is left alone
    assert learned.learn(facts, [], doc, 200.0) is None


def test_an_area_that_failed_or_errored_keeps_what_was_known():
    before = learned.learn({"gpu": gpu_facts()}, [], None, 100.0)
    facts = {"gpu": gpu_facts("gpu-missing"), "ib": ib_facts("port-down")}
    failed = [result("gpu.count", FAIL), result("ib.port_state", FAIL)]
    assert learned.learn(facts, failed, before, 200.0) is None  # no area passed: none learned


def test_a_node_with_no_gpus_or_ports_learns_nothing_to_expect():
    empty = gpu.parse({"count": 0, "devices": []})
    assert learned.learn({"gpu": empty}, [], None, 1.0) is None


def test_applied_values_set_the_checks_expectations_and_failures_say_whose_they_are():
    expect = config.defaults()
    doc = learned.learn({"gpu": gpu_facts()}, [], None, 1796428800.0)  # 2026-12-05
    applied = learned.apply(expect, doc)
    assert expect["gpu"]["count"] == 8 and applied["gpu"]["keys"][0] == "count"
    results = runner.run(
        "gpu01", expect, runner.Options(gpu_source=snapshot_path("gpu-missing")), ["gpu"]
    ).results
    learned.annotate(results, applied)
    count = next(r for r in results if r.check == "gpu.count")
    assert count.status == FAIL
    assert count.message == (
        "7 GPUs visible, 8 expected (as this node showed since 2026-12-05; "
        "no config: slurmhealth config genconf writes one)"
    )
    assert all("genconf" not in r.message for r in results if r.check != "gpu.count")


def test_garbage_in_the_stored_row_applies_nothing():
    for doc in (None, [], {"areas": []}, {"areas": {"gpu": "x", "nope": {"values": {}}}}):
        expect = config.defaults()
        assert learned.apply(expect, doc) == {}
        assert expect == config.defaults()


# ---------------------------------------------------------------- the PCI bus


def bound_tree(tmp_path, addresses, extra=()):
    """root/bus/pci/drivers/nvidia/<address>/class as the kernel lays it out: GPUs are
    0x030200 (3D controller); `extra` are bridges (NVSwitches, 0x068000) bound there too."""
    base = tmp_path / "sys" / "bus" / "pci" / "drivers" / "nvidia"
    for address, cls in [(a, "0x030200") for a in addresses] + [(a, "0x068000") for a in extra]:
        (base / address).mkdir(parents=True)
        (base / address / "class").write_text(cls + "\n")
    (base / "bind").write_text("")  # the driver's own files sit beside the devices
    return str(tmp_path / "sys")


def nvml_env(name="healthy"):
    return {
        "PYTHONPATH": f"{FAKE_NVML}:{REPO}",
        "SLURMHEALTH_NVML_BINDING": "pynvml",
        "FAKE_NVML_SNAPSHOT": snapshot_path(name),
        "FAKE_NVML_FAULT": "",
        "SLURMHEALTH_CONFIG": "",
    }


def test_a_gpu_the_driver_holds_but_nvml_does_not_list_fails_without_config_and_replays(tmp_path):
    root = bound_tree(tmp_path, HEALTHY_BUS, extra=["0000:05:00.0"])
    args = ["--node", "gpu01", "--sysfs-root", root, "--kmsg", os.devnull]
    live = run_cli("check", *args, "--json", env=nvml_env("gpu-missing"))
    assert live.returncode == 1, live.stderr
    count = next(r for r in json.loads(live.stdout)["results"] if r["check"] == "gpu.count")
    assert count["message"] == "1 of 8 GPUs on the PCI bus not seen by NVML: 0000:db:00.0"
    snap = tmp_path / "snap.json"
    taken = run_cli("snapshot", *args, "-o", str(snap), env=nvml_env("gpu-missing"))
    assert taken.returncode == 0, taken.stderr
    assert json.loads(snap.read_text())["gpu"]["pci_gpus"] == HEALTHY_BUS
    replayed = run_cli("check", "--node", "gpu01", "--gpu-source", str(snap), "--json")
    assert replayed.returncode == 1
    again = next(r for r in json.loads(replayed.stdout)["results"] if r["check"] == "gpu.count")
    assert again["message"] == count["message"]
    # all eight listed: the bridge bound beside them is no GPU
    whole = run_cli("check", *args, "-q", env=nvml_env("healthy"))
    assert whole.returncode == 0, whole.stdout


# ---------------------------------------------------------------- through the real CLI


def stored_check(db, name, *extra):
    env = dict(nvml_env(name), **dict(extra))
    return run_cli("check", "--db", db, "--node", "gpu01", "--json", env=env)


def learned_row(db):
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT data FROM baselines WHERE area = 'expect'").fetchall()
    return [json.loads(r[0]) for r in rows]


def test_check_without_a_config_learns_and_fails_a_gpu_gone(tmp_path):
    db = str(tmp_path / "gpu01.db")
    first = stored_check(db, "healthy")
    assert first.returncode == 0, first.stderr
    assert learned_row(db)[0]["areas"]["gpu"]["values"]["count"] == 8
    gone = stored_check(db, "gpu-missing")
    assert gone.returncode == 1
    count = next(r for r in json.loads(gone.stdout)["results"] if r["check"] == "gpu.count")
    assert count["status"] == "fail"
    assert count["message"].startswith("7 GPUs visible, 8 expected (as this node showed since ")
    assert count["message"].endswith("no config: slurmhealth config genconf writes one)")
    # the failing run taught nothing: the node back whole passes, 8 still expected
    assert len(learned_row(db)) == 1 and learned_row(db)[0]["areas"]["gpu"]["values"]["count"] == 8
    assert stored_check(db, "healthy").returncode == 0


def test_a_config_file_replaces_what_the_node_showed(tmp_path):
    db = str(tmp_path / "gpu01.db")
    assert stored_check(db, "healthy").returncode == 0
    conf = tmp_path / "slurmhealth.toml"
    conf.write_text("[settings]\nmonitor_only = false\n")
    os.chmod(conf, 0o644)
    with_config = stored_check(db, "gpu-missing", ("SLURMHEALTH_CONFIG", str(conf)))
    assert with_config.returncode == 0, with_config.stdout  # the config names no count


def test_a_replay_neither_learns_nor_is_judged_by_what_was_learned(tmp_path):
    db = str(tmp_path / "gpu01.db")
    replay = ["--gpu-source", snapshot_path("gpu-missing"), "--record", "--kmsg", os.devnull]
    no_config = {"SLURMHEALTH_CONFIG": ""}
    first = run_cli("check", "--db", db, "--node", "gpu01", *replay, env=no_config)
    assert first.returncode == 0 and learned_row(db) == []
    assert stored_check(db, "healthy").returncode == 0  # learns 8 from the live run
    second = run_cli("check", "--db", db, "--node", "gpu01", *replay, env=no_config)
    assert second.returncode == 0, second.stdout  # another node's file: not held to this one


@pytest.mark.parametrize("fault", ["gpu-missing", "gpu-model-odd"])
def test_the_prolog_without_a_config_drains_a_drop_from_what_the_node_showed(tmp_path, fault):
    state = tmp_path / "state"
    slurm_state = tmp_path / "slurm.json"
    slurm_state.write_text(json.dumps({"gpu01": {"state": "IDLE", "reason": "", "since": 0}}))
    env = dict(
        nvml_env("healthy"),
        SLURMD_NODENAME="gpu01",
        SLURMHEALTH_STATE_DIR=str(state),
        SLURMHEALTH_SLURM_BIN=os.path.join(TESTS, "fakeslurm"),
        FAKE_SLURM_STATE=str(slurm_state),
        SLURM_JOB_ID="101",
        SLURM_JOB_UID="1234",
        SLURM_JOB_USER="alice",
    )
    assert run_cli("prolog", env=env).returncode == 0
    env["FAKE_NVML_SNAPSHOT"] = snapshot_path(fault)
    env["SLURM_JOB_ID"] = "102"
    proc = run_cli("prolog", env=env)
    assert proc.returncode == 1, proc.stderr
    reason = json.loads(slurm_state.read_text())["gpu01"]["reason"]
    assert reason.startswith("slurmhealth: ")
    assert "(as this node showed since " in reason  # the Reason is cut; the store has it all


def test_config_validate_without_a_file_says_the_nodes_own_runs_set_expectations():
    proc = run_cli("config", "validate", env={"SLURMHEALTH_CONFIG": ""})
    assert proc.returncode == 0
    assert proc.stdout.startswith("no config file: built-in defaults apply, and each node's own")
