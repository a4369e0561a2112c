"""The NVLink fabric of the gpu area (gpu.fabric_health, gpu.clique, genconf's `clique`) and
ps.imex, on the modelled GB200 NVL72 compute tray (tests/fixtures/snapshots/
gb200-nvl72-healthy.json: four GPUs in one clique of one cluster, IMEX running) and its faults."""

from __future__ import annotations

import copy
import json
import os

import pytest
from conftest import SNAPSHOTS, run_cli, snapshot_path

from slurmhealth.node import learned
from slurmhealth.node.checks import gpu, ps
from slurmhealth.node.checks.base import Context

GB200 = os.path.join(SNAPSHOTS, "gb200-nvl72-healthy.json")
CLUSTER = "1ac4f0e2-7b3d-4c55-9e61-0d8a2b7c4f10"
# nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*: each condition FALSE (2), configuration NONE (1)
HEALTHY_MASK = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8


def doc() -> dict:
    with open(GB200, encoding="utf-8") as handle:
        return json.load(handle)


def facts(**fabric_of_gpu: dict) -> dict:
    """The GB200 GPU facts, GPU N's fabric updated with fabric_of_gpu["gN"]."""
    raw = copy.deepcopy(doc()["gpu"])
    for key, change in fabric_of_gpu.items():
        raw["devices"][int(key[1:])]["fabric"].update(change)
    return gpu.parse(raw)


def ctx(**expect) -> Context:
    return Context("gb01", "healthcheck", {**{k: v[0] for k, v in gpu.DEFAULTS.items()}, **expect})


def test_the_modelled_tray_is_four_gb200_gpus_in_one_clique():
    f = facts()
    assert [d["name"] for d in f["devices"]] == ["NVIDIA GB200"] * 4
    assert {d["fabric"]["cluster_uuid"] for d in f["devices"]} == {CLUSTER}
    assert all(d["fabric"]["health_mask"] == HEALTHY_MASK for d in f["devices"])
    for check in gpu.CHECKS:
        result = check(f, ctx(count=4, clique=True))
        assert result.status == "ok", (check.__name__, result)
    assert gpu.clique(f, ctx()).message == f"4 GPUs in clique 32766 of cluster {CLUSTER}"


HEALTH = [
    # (health mask or summary change, status, action, message)
    ({"health_mask": HEALTHY_MASK - 1}, "warn", "none", "fabric bandwidth degraded"),
    ({"health_mask": HEALTHY_MASK - 16}, "fail", "drain", "fabric route unhealthy"),
    ({"health_mask": HEALTHY_MASK - 4}, "warn", "none", "fabric route recovery in progress"),
    ({"health_mask": HEALTHY_MASK - 64}, "warn", "none", "access timeout recovery in progress"),
    (
        {"health_mask": HEALTHY_MASK - 256 + (5 << 8)},
        "fail",
        "service",
        "fabric incorrect configuration: insufficient NVLinks",
    ),
    (
        {"health_mask": HEALTHY_MASK - 256 + (2 << 8)},
        "fail",
        "drain",
        "fabric incorrect configuration: wrong system GUID",
    ),
    ({"health_mask": HEALTHY_MASK | 2 << 12}, "fail", "drain", "not assigned to an NVLink"),
    ({"health_mask": HEALTHY_MASK | 2 << 14}, "warn", "none", "global fabric manager disconn"),
    ({"health_summary": 2}, "fail", "drain", "fabric unhealthy (driver's summary)"),
    ({"health_summary": 3}, "warn", "none", "limited capacity (driver's summary)"),
]


@pytest.mark.parametrize(("change", "status", "action", "message"), HEALTH,
                         ids=[h[3] for h in HEALTH])
def test_each_health_condition_gives_its_verdict(change, status, action, message):
    result = gpu.fabric_health(facts(g2=change), ctx())
    assert (result.status, result.action) == (status, action), result
    assert result.message.startswith("GPU 2 (0018:01:00) ") and message in result.message


def test_a_failing_condition_is_named_first_and_the_warnings_follow():
    result = gpu.fabric_health(facts(g0={"health_mask": HEALTHY_MASK - 1},
                                     g3={"health_mask": HEALTHY_MASK - 16}), ctx())
    assert result.status == "fail"
    assert result.message == "GPU 3 (0019:01:00) fabric route unhealthy (+1 more)"
    assert result.data["problems"] == ["GPU 0 (0008:01:00) fabric bandwidth degraded",
                                       "GPU 3 (0019:01:00) fabric route unhealthy"]


def test_health_not_reported_is_not_judged():
    """A driver before R550 (the old call: no mask), or a node without an NVLink fabric."""
    gone = {k: {"health_mask": None, "health_summary": None} for k in ("g0", "g1", "g2", "g3")}
    result = gpu.fabric_health(facts(**gone), ctx())
    assert (result.status, result.message) == ("ok", "not judged: fabric health not reported")


def test_a_gpu_in_another_clique_fails():
    result = gpu.clique(facts(g1={"clique_id": 7}), ctx())
    assert (result.status, result.action) == ("fail", "drain")
    assert result.message == "GPU 1 (0009:01:00) clique 7, 3 others 32766"


def test_a_zero_cluster_uuid_where_the_others_have_one_fails():
    zero = "00000000-0000-0000-0000-000000000000"
    result = gpu.clique(facts(g3={"cluster_uuid": zero}), ctx())
    assert result.status == "fail"
    assert result.message == f"GPU 3 (0019:01:00) cluster none, 3 others {CLUSTER}"


def test_two_cluster_uuids_on_one_node_fail():
    other = "22222222-3333-4444-5555-666666666666"
    result = gpu.clique(facts(g0={"cluster_uuid": other}), ctx())
    assert result.status == "fail" and f"cluster {other}, 3 others {CLUSTER}" in result.message


def test_an_expected_clique_that_is_gone_fails_and_otherwise_is_not_judged():
    zero = {"cluster_uuid": "00000000-0000-0000-0000-000000000000"}
    lost = facts(g0=zero, g1=zero, g2=zero, g3=zero)
    assert gpu.clique(lost, ctx()).message == "not judged: no multi-node NVLink cluster"
    result = gpu.clique(lost, ctx(clique=True))
    assert (result.status, result.action) == ("fail", "drain")
    assert result.message == (
        "GPU 0 (0008:01:00) in no multi-node NVLink cluster, expected one (+3 more GPUs)"
    )


def test_a_gpu_still_registering_is_left_to_gpu_fabric():
    f = facts(g2={"state": 2})
    assert gpu.clique(f, ctx()).status == "ok"
    assert gpu.fabric(f, ctx()).status == "fail"


def test_an_hgx_node_without_a_cluster_is_not_judged():
    result = gpu.clique(gpu.parse(json.load(open(snapshot_path("healthy")))["gpu"]), ctx())
    assert (result.status, result.message) == ("ok", "not judged: no multi-node NVLink cluster")


def test_a_malformed_cluster_uuid_reads_as_none():
    f = gpu.parse({"devices": [{"fabric": {"state": 3, "status": 0, "cluster_uuid": "x;rm"}},
                               {"fabric": {"state": "3", "cluster_uuid": 7}}]})
    assert [d["fabric"]["cluster_uuid"] for d in f["devices"]] == [None, None]
    assert f["devices"][1]["fabric"]["state"] is None


def test_genconf_and_learning_keep_the_clique_of_a_known_good_tray():
    assert gpu.expectations(facts())["clique"] is True
    hgx = gpu.parse(json.load(open(snapshot_path("healthy")))["gpu"])
    assert "clique" not in gpu.expectations(hgx)
    kept = learned.learn({"gpu": facts()}, [], None, 0.0)
    assert kept["areas"]["gpu"]["values"]["clique"] is True


def test_multinode_is_a_completed_fabric_with_a_cluster_uuid():
    assert gpu.multinode(facts())
    zero = {"cluster_uuid": "00000000-0000-0000-0000-000000000000"}
    assert not gpu.multinode(facts(g0=zero, g1=zero, g2=zero, g3=zero))
    not_done = {"state": 2}
    assert not gpu.multinode(facts(g0=not_done, g1=not_done, g2=not_done, g3=not_done))


# --- ps.imex --------------------------------------------------------------------------------


def processes(scope: str, *names: str) -> dict:
    return ps.parse({"processes": {"scope": scope, "names": dict.fromkeys(names, 1)}})


def imex(procs: dict, gpus: dict | None, **expect) -> object:
    base = {k: v[0] for k, v in ps.DEFAULTS.items()}
    others = {"gpu": gpus} if gpus is not None else {}
    return ps.imex(procs, Context("gb01", "healthcheck", {**base, **expect}, facts=others))


def test_imex_runs_on_a_multinode_tray():
    result = imex(processes("all", "munged", "nvidia-imex"), facts())
    assert result.status == "ok"
    assert result.message == "nvidia-imex running (multi-node NVLink fabric)"


def test_imex_missing_on_a_multinode_tray_fails():
    result = imex(processes("all", "munged"), facts())
    assert (result.status, result.action) == ("fail", "drain")
    assert result.message == "nvidia-imex not running on a multi-node NVLink node"


def test_a_job_hook_leaves_an_imex_not_among_pid_1s_children_to_the_health_check():
    result = imex(processes("init", "munged"), facts())
    assert result.status == "ok" and result.message.startswith("not judged: nvidia-imex not")


def test_imex_is_not_required_without_a_cluster_or_when_configured_off():
    hgx = gpu.parse(json.load(open(snapshot_path("healthy")))["gpu"])
    assert imex(processes("all"), hgx).message == "not judged: no multi-node NVLink fabric"
    assert imex(processes("all"), None).message == "not judged: GPUs not read"
    off = imex(processes("all"), facts(), imex=False)
    assert (off.status, off.message) == ("ok", "nvidia-imex not required by config")


# --- the snapshot replayed, as an admin would ---------------------------------------------


def replay(tmp_path, change=None) -> dict:
    snap = doc()
    if change:
        change(snap)
    path = tmp_path / "gb200.json"
    path.write_text(json.dumps(snap))
    proc = run_cli("check", "--no-db", "--json", "--gpu-source", str(path), "--only", "gpu,ps")
    out = json.loads(proc.stdout)
    return {r["check"]: (r["status"], r["message"]) for r in out["results"]} | {
        "verdict": out["verdict"]
    }


def test_the_healthy_tray_replays_ok(tmp_path):
    got = replay(tmp_path)
    assert got["verdict"] == "ok"
    assert got["gpu.clique"] == ("ok", f"4 GPUs in clique 32766 of cluster {CLUSTER}")
    assert got["ps.imex"] == ("ok", "nvidia-imex running (multi-node NVLink fabric)")


def test_degraded_bandwidth_replays_as_a_warning(tmp_path):
    def degrade(snap):
        snap["gpu"]["devices"][1]["fabric"]["health_mask"] = HEALTHY_MASK - 1

    got = replay(tmp_path, degrade)
    assert got["verdict"] == "warn"
    assert got["gpu.fabric_health"] == ("warn", "GPU 1 (0009:01:00) fabric bandwidth degraded")


def test_a_gpu_in_another_clique_replays_as_a_fail(tmp_path):
    def move(snap):
        snap["gpu"]["devices"][3]["fabric"]["clique_id"] = 4

    got = replay(tmp_path, move)
    assert got["verdict"] == "fail"
    assert got["gpu.clique"] == ("fail", "GPU 3 (0019:01:00) clique 4, 3 others 32766")


def test_a_dead_imex_replays_as_a_fail(tmp_path):
    def stop(snap):
        del snap["kernel"]["processes"]["names"]["nvidia-imex"]

    got = replay(tmp_path, stop)
    assert got["ps.imex"] == ("fail", "nvidia-imex not running on a multi-node NVLink node")


def test_genconf_on_the_tray_writes_its_clique_and_imex():
    proc = run_cli("config", "genconf", "--gpu-source", GB200, "--node", "gb01")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "gpu.clique = true" in lines
    assert 'ps.daemons = ["munged", "slurmd", "nvidia-persistenced", "nvidia-imex"]' in lines


def test_a_gpu_without_a_fabric_beside_clustered_ones_fails():
    f = facts()
    f["devices"][2]["fabric"] = None  # NotSupported
    result = gpu.clique(f, ctx())
    assert (result.status, result.action) == ("fail", "drain")
    assert result.message == "GPU 2 (0018:01:00) reports no NVLink fabric, 3 others in a cluster"


# --- NVLink-C2C: each GPU's link to its Grace CPU -------------------------------------------


def c2c(change=None) -> dict:
    """The GB200 GPU facts with `change` applied to the raw devices first."""
    raw = copy.deepcopy(doc()["gpu"])
    if change:
        change(raw["devices"])
    return gpu.parse(raw)


def counting(**counts_of_gpu: dict):
    """A change that sets GPU N's C2C counters (counts_of_gpu["gN"])."""

    def change(devices):
        for key, counts in counts_of_gpu.items():
            devices[int(key[1:])]["fields"].update(counts)

    return change


def with_baseline(before: dict, **expect) -> Context:
    base = gpu.baseline(before, now=1000.0)
    limits = {**{k: v[0] for k, v in gpu.DEFAULTS.items()}, **expect}
    return Context("gb01", "epilog", limits, base)


def test_the_modelled_tray_has_ten_active_c2c_links_per_gpu():
    f = c2c()
    assert [len(d["c2c"]) for d in f["devices"]] == [10] * 4
    result = gpu.cpu_links(f, ctx())
    assert (result.status, result.message) == ("ok", "all C2C links active on 4 GPUs")
    first = gpu.cpu_link_errors(f, ctx())
    assert (first.status, first.message) == ("ok", "baseline recorded")
    assert gpu.baseline(f)["counters"]["0"]["c2c_replay_b2b"] == 0


def test_a_c2c_link_down_fails_drain_naming_the_gpu_and_link():
    def down(devices):
        devices[1]["c2c"][3]["active"] = False

    result = gpu.cpu_links(c2c(down), ctx())
    assert (result.status, result.action) == ("fail", "drain")
    assert result.message == "GPU 1 (0009:01:00) C2C link 3 down (9/10 active)"

    def two_gpus(devices):
        devices[0]["c2c"][0]["active"] = False
        devices[0]["c2c"][9]["active"] = False
        devices[3]["c2c"][5]["active"] = False

    result = gpu.cpu_links(c2c(two_gpus), ctx())
    assert result.message == "GPU 0 (0008:01:00) C2C links 0, 9 down (8/10 active) (+1 more GPU)"
    assert result.data["down"][1] == "GPU 3 (0019:01:00) C2C link 5 down (9/10 active)"


def test_a_c2c_status_not_read_is_not_a_link_down():
    def unread(devices):
        devices[2]["c2c"][4]["active"] = None

    result = gpu.cpu_links(c2c(unread), ctx())
    assert result.status == "ok"
    assert result.message == "C2C links active; status not read: GPU 2 (0018:01:00) C2C link 4"


def test_gpus_without_c2c_are_not_judged():
    hgx = gpu.parse(json.load(open(snapshot_path("healthy")))["gpu"])
    # ok, not skip: a skip is a store row every run on every node without C2C
    links = gpu.cpu_links(hgx, ctx())
    assert (links.status, links.message) == (
        "ok", "not judged: no C2C links reported (no Grace-coupled GPU)")
    result = gpu.cpu_link_errors(hgx, with_baseline(hgx))
    assert (result.status, result.message) == (
        "ok",
        "not judged: C2C error counters not reported (no Grace-coupled GPU, or a driver before "
        "R575)",
    )


C2C_RISES = [
    # (GPU 2's counters now, against 0 at the last run: status, action, message)
    ({"c2c_crc": 99, "c2c_replay": 99}, "ok", "none", "C2C errors below the warning limits"),
    ({"c2c_crc": 100}, "warn", "none", "GPU 2 (0018:01:00) C2C +100 CRC errors"),
    ({"c2c_replay": 250}, "warn", "none", "GPU 2 (0018:01:00) C2C +250 replays"),
    ({"c2c_replay_b2b": 1}, "warn", "none", "GPU 2 (0018:01:00) C2C +1 back-to-back replays"),
    ({"c2c_crc": 10000}, "fail", "drain", "GPU 2 (0018:01:00) C2C +10000 CRC errors"),
    (
        {"c2c_replay": 150, "c2c_replay_b2b": 12},
        "fail",
        "drain",
        "GPU 2 (0018:01:00) C2C +12 back-to-back replays (+1 more)",
    ),
]


@pytest.mark.parametrize(("now", "status", "action", "message"), C2C_RISES)
def test_c2c_errors_rising_since_the_last_run_are_judged(now, status, action, message):
    result = gpu.cpu_link_errors(c2c(counting(g2=now)), with_baseline(c2c()))
    assert (result.status, result.action, result.message) == (status, action, message)
    grown = {k: v for k, v in now.items() if v}
    assert result.data["deltas"] == ({"2": grown} if grown else {})


def test_c2c_limits_come_from_the_config():
    now, before = c2c(counting(g0={"c2c_crc": 5})), c2c()
    assert gpu.cpu_link_errors(now, with_baseline(before)).status == "ok"
    tight = gpu.cpu_link_errors(now, with_baseline(before, c2c_crc_warn=5, c2c_crc_fail=6))
    assert (tight.status, tight.message) == ("warn", "GPU 0 (0008:01:00) C2C +5 CRC errors")


def test_a_lower_c2c_counter_is_a_reset_counted_from_zero():
    before = c2c(counting(g1={"c2c_replay": 5000}))
    after_reset = c2c(counting(g1={"c2c_replay": 120}))
    result = gpu.cpu_link_errors(after_reset, with_baseline(before))
    assert (result.status, result.message) == ("warn", "GPU 1 (0009:01:00) C2C +120 replays")
    reset = ["GPU 1 (0009:01:00) c2c_replay"]
    assert result.data == {"deltas": {"1": {"c2c_replay": 120}}, "reset": reset}
    quiet = gpu.cpu_link_errors(c2c(), with_baseline(before))
    assert (quiet.status, quiet.data["reset"]) == ("ok", ["GPU 1 (0009:01:00) c2c_replay"])


def test_c2c_counters_are_recorded_for_the_trends_finder():
    from slurmhealth.node import counters

    raw = copy.deepcopy(doc()["gpu"])
    counting(g3={"c2c_crc": 7, "c2c_replay_b2b": 2})(raw["devices"])
    read = counters.readings(raw, None)
    assert read.values["gpu:0019:01:00.0|c2c_crc"] == (7, "GPU 3")
    assert read.values["gpu:0019:01:00.0|c2c_replay_b2b"] == (2, "GPU 3")
    assert not any("c2c" in key for key in read.values if not key.startswith("gpu:0019"))


def test_a_c2c_link_down_and_rising_errors_replay_as_a_fail(tmp_path):
    def trouble(snap):
        snap["gpu"]["devices"][0]["c2c"][6]["active"] = False
        snap["gpu"]["devices"][0]["fields"]["c2c_crc"] = 20000

    got = replay(tmp_path, trouble)
    assert got["verdict"] == "fail"
    assert got["gpu.cpu_links"] == ("fail", "GPU 0 (0008:01:00) C2C link 6 down (9/10 active)")
    assert got["gpu.cpu_link_errors"] == ("ok", "baseline recorded")  # --no-db: no last run
