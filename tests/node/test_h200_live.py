"""Two snapshots of a real node replayed through `check`: the verdicts equal the live ones.

On 2026-11-30 bench/bench_gpu_node.py ran on a rented one-GPU NVIDIA H200 node (driver
580.159.04, no InfiniBand, no NVLink): `slurmhealth snapshot` (h200-live.json), `config
genconf` (h200-live.toml) and `check --json --node gpu01 --config` live, then the same while a
CUDA program held GPU 0 (h200-live-busy.json). h200-live-verdicts.json keeps the live verdicts.

A replay takes every source from the snapshot when no --kmsg or --sysfs-root is named
(node/runner.py `_plan`): the kernel-log records and the (empty) InfiniBand facts the node had,
not this machine's. So every message replays exactly, the record count of xid.log_continuity
(the live idle run had a fresh store, the busy one --no-db: both saw all 358 records) and the
pid of gpu.processes included.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import SNAPSHOTS, run_cli

IDLE = os.path.join(SNAPSHOTS, "h200-live.json")
BUSY = os.path.join(SNAPSHOTS, "h200-live-busy.json")
CONFIG = os.path.join(SNAPSHOTS, "h200-live.toml")
VERDICTS = os.path.join(SNAPSHOTS, "h200-live-verdicts.json")
CAPTURED = ("gpu", "nvlink", "ib", "xid")  # the areas there were when they were taken


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def replay(tmp_path, snapshot: str) -> tuple:
    """`check --json --no-db` on the snapshot with the node's genconf, as node gpu01 (the name
    the live run used and the config's `match`): (exit code, the JSON document). The config is
    copied to a private file first: a checkout others can write would make it untrusted."""
    config = tmp_path / "h200-live.toml"
    shutil.copyfile(CONFIG, config)
    config.chmod(0o600)
    proc = run_cli(
        "check",
        "--json",
        "--no-db",
        "--node",
        "gpu01",
        "--config",
        str(config),
        "--gpu-source",
        snapshot,
    )
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def verdicts(doc: dict) -> dict:
    """check -> "status: message", the form the live verdicts were recorded in."""
    return {r["check"]: f"{r['status']}: {r['message']}" for r in doc["results"]}


@pytest.mark.parametrize(("name", "snapshot", "code"), [("idle", IDLE, 0), ("busy", BUSY, 1)])
def test_the_replay_gives_every_live_verdict(tmp_path, name, snapshot, code):
    live = load(VERDICTS)[name]
    got_code, doc = replay(tmp_path, snapshot)
    assert got_code == code
    assert doc["verdict"] == ("ok" if code == 0 else "fail")
    # the snapshots predate the host areas (fs, hw, time, ps, modules, net, edac, nvme, bmc, imex,
    # site): their sources are not in them and replay as unavailable; nothing of this machine
    # is read instead
    captured = {c: v for c, v in verdicts(doc).items() if c.split(".")[0] in CAPTURED}
    # checks added to a captured area since (the xid area's NVSwitch SXid and driver-failure
    # checks) have no live verdict: on this node's log they must pass
    added = {c: v for c, v in captured.items() if c not in live}
    assert all(v.startswith("ok: ") for v in added.values()), added
    assert {c: v for c, v in captured.items() if c in live} == live
    later = [r for r in doc["results"] if r["check"].split(".")[0] not in CAPTURED]
    assert later and all(r["status"] in ("skip", "ok") for r in later)
    newer = ("fs", "host", "kernel", "nvme", "bmc", "imex", "fmlog", "site")
    assert set(doc["sources"]) == {"gpu", "ib", "kmsg", *newer}
    assert all(doc["sources"][s]["status"] == "unavailable" for s in newer)
    # every source came from the snapshot, none was read here: a gathered one takes time
    old = [doc["sources"][s] for s in ("gpu", "ib", "kmsg")]
    assert all(s["status"] == "ok" and s["seconds"] == 0 for s in old)
    kernel = load(snapshot)["kmsg"]["kernel"]
    assert doc["sources"]["kmsg"]["versions"]["kernel"] == kernel == "6.18.44-fc-v657-gpu"


def test_the_idle_snapshot_is_one_h200_with_integer_fields(tmp_path):
    snap = load(IDLE)
    assert snap["format"] == "slurmhealth-snapshot/1" and snap["node"] == "gpu01"
    assert snap["gpu"]["count"] == 1 and len(snap["gpu"]["devices"]) == 1
    device = snap["gpu"]["devices"][0]
    assert device["name"] == "NVIDIA H200" and device["processes"] == []
    power_ns = device["fields"]["perf_power_ns"]
    assert isinstance(power_ns, int) and not isinstance(power_ns, bool)
    assert snap["ib"] == {"devices": {}} and len(snap["kmsg"]["records"]) == 358
    _, doc = replay(tmp_path, IDLE)
    status = {r["check"]: r["status"] for r in doc["results"]}
    nvlink = {c: s for c, s in status.items() if c.startswith("nvlink.")}
    assert nvlink == {"nvlink.link_state": "skip", "nvlink.error_counters": "skip"}


def test_the_busy_snapshot_fails_naming_the_cuda_process(tmp_path):
    device = load(BUSY)["gpu"]["devices"][0]
    assert device["processes"] == [{"pid": 1743, "used_memory": 3198156800}]
    _, doc = replay(tmp_path, BUSY)
    (result,) = [r for r in doc["results"] if r["check"] == "gpu.processes"]
    assert result["status"] == "fail" and "pid 1743" in result["message"]
    assert result["message"] == "GPU 0 (0000:00:06) has 1 compute process, pid 1743"
