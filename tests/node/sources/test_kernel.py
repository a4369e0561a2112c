"""sources/kernel.py: processes, modules, links and EDAC counts from a (fake or live) host."""

from __future__ import annotations

import json
import os

import conftest
import pytest

from slurmhealth.node import config, runner
from slurmhealth.node.sources import Options, SourceUnavailable, kernel

ETH = {"operstate": "up", "carrier": "1", "carrier_changes": "2", "type": "1", "mtu": "9000",
       "speed": "100000", "device": True}
DOWN = {"operstate": "down", "carrier_changes": "0", "type": "1", "mtu": "1500", "device": True}
EDAC = {"mc0": {"ce_count": "3", "ue_count": "0", "ce_noinfo_count": "0", "ue_noinfo_count": "0",
                "dimms": {"dimm0": {"dimm_ce_count": "3", "dimm_ue_count": "0",
                                    "dimm_label": "CPU_SrcID#0_MC#0_Chan#0_DIMM#0"}}}}


def tree(tmp_path, **kwargs):
    comms = {100: "munged", 101: "nvidia-persiste", 102: "sssd", 103: "sssd_be", 104: "sssd_be",
             20: "kworker/0:1", 21: "ksoftirqd/0"}
    base = dict(comms=comms, kthreads=(20, 21), init_children=(100, 101, 102),
                modules=conftest.MODULES_TEXT, net={"eth0": ETH, "eth1": DOWN, "lo": {
                    "operstate": "unknown", "carrier": "1", "carrier_changes": "0",
                    "type": "772", "mtu": "65536"}}, edac=EDAC)
    base.update(kwargs)
    return conftest.host_tree(tmp_path / "host", **base)


def test_reads_every_part_as_raw_strings(tmp_path):
    raw = kernel.read(tree(tmp_path))
    assert raw["boot_id"] == "3b1f6c0e-5c1d-4f6a-9d7e-1f2e3d4c5b6a"
    # kernel threads (kthreadd and its children) are left out; comm as the kernel keeps it
    assert raw["processes"] == {"scope": "all", "names": {
        "systemd": 1, "munged": 1, "nvidia-persiste": 1, "sssd": 1, "sssd_be": 2}}
    assert raw["modules"]["nvidia"] == "Live" and raw["modules"]["ext4"] == "Live"
    assert len(raw["modules"]) == 11
    assert raw["net"]["eth0"] == {"operstate": "up", "carrier": "1", "carrier_changes": "2",
                                  "type": "1", "mtu": "9000", "speed": "100000", "device": True}
    # a down link: carrier unreadable (EINVAL on a live host, absent here), speed not read
    assert raw["net"]["eth1"]["carrier"] is None and raw["net"]["eth1"]["speed"] is None
    assert raw["net"]["lo"]["device"] is False
    assert raw["errors"]["net/eth1/carrier"] == "ENOENT"
    assert raw["edac"]["mc0"]["ce_count"] == "3"
    assert raw["edac"]["mc0"]["dimms"]["dimm0"] == {
        "ce_count": "3", "ue_count": "0", "label": "CPU_SrcID#0_MC#0_Chan#0_DIMM#0"}
    assert json.loads(json.dumps(raw)) == raw  # a snapshot holds it exactly


def test_job_hooks_read_init_children_and_edac_totals_only(tmp_path):
    raw = kernel.gather(Options(host_root=tree(tmp_path), costly=False))
    assert raw["processes"] == {"scope": "init",
                                "names": {"munged": 1, "nvidia-persiste": 1, "sssd": 1}}
    assert "dimms" not in raw["edac"]["mc0"]


def test_job_hooks_read_the_links_of_devices_and_named_interfaces_only(tmp_path):
    veth = {"operstate": "up", "carrier": "1", "carrier_changes": "40", "type": "1", "mtu": "1500"}
    root = tree(tmp_path, net={"eth0": ETH, "lo": veth, "veth9a": veth, "docker0": veth})
    options = Options(host_root=root, costly=False)
    options.interfaces = ["docker0"]  # named by [net] up or mtu: read whole, device or not
    hook = kernel.gather(options)["net"]
    assert hook["eth0"] == kernel.read(root)["net"]["eth0"]
    assert hook["docker0"]["carrier_changes"] == "40" and hook["docker0"]["device"] is False
    assert hook["veth9a"] == hook["lo"] == {"device": False}  # of the rest: only that
    # the net area reads that as it reads the whole: not physical, never judged unnamed
    from slurmhealth.node.checks import net

    links = net.parse({"net": hook})["links"]
    assert not links["veth9a"]["physical"] and links["eth0"]["physical"]
    assert net.names({"up": ["eth0", "docker0"], "mtu": {"ib0": 4092, "eth0": 9000}}) == [
        "eth0", "docker0", "ib0"]
    # the health check (and a snapshot) reads every interface whole
    assert kernel.gather(Options(host_root=root))["net"]["veth9a"]["carrier_changes"] == "40"


def test_a_job_hook_reads_every_process_only_when_a_name_looked_for_is_not_init_s_child(tmp_path):
    options = Options(host_root=tree(tmp_path), costly=False)
    # among PID 1's children (compared by comm's 15 bytes): the usual, short read
    options.processes = ["munged", "nvidia-persistenced"]
    assert kernel.gather(options)["processes"]["scope"] == "init"
    # sssd_be: sssd's children, PID 1's grandchildren (a daemon under a supervisor)
    options.processes = ["munged", "sssd_be"]
    raw = kernel.gather(options)
    assert raw["processes"]["scope"] == "all" and raw["processes"]["names"]["sssd_be"] == 2
    assert "kworker/0:1" not in raw["processes"]["names"]  # kernel threads still left out


def test_a_daemon_under_a_supervisor_passes_a_prolog_and_a_missing_one_still_fails(tmp_path):
    """Through runner.run as the prolog runs it: the expected daemons reach the source."""
    root = tree(tmp_path)
    expect = config.defaults()
    expect["ps"]["daemons"] = ["munged", "sssd_be"]
    run = runner.run("n1", expect, Options(host_root=root, costly=False), ["ps"], "prolog")
    result = {r.check: r for r in run.results}["ps.daemons"]
    assert (result.status, result.data["scope"]) == ("ok", "all")
    expect["ps"]["daemons"] = ["munged", "nvidia-imex"]
    run = runner.run("n1", expect, Options(host_root=root, costly=False), ["ps"], "prolog")
    result = {r.check: r for r in run.results}["ps.daemons"]
    assert (result.status, result.message) == ("fail", "nvidia-imex not running")
    # a forbidden process is looked for everywhere too
    expect["ps"].update(daemons=None, absent=["sssd_be"])
    run = runner.run("n1", expect, Options(host_root=root, costly=False), ["ps"], "prolog")
    result = {r.check: r for r in run.results}["ps.absent"]
    assert (result.status, result.message) == ("fail", "sssd_be running (2)")


def test_without_children_files_every_process_is_read(tmp_path):
    root = tree(tmp_path, kthreads=(), init_children=None)
    raw = kernel.read(root, everything=False)
    assert raw["processes"]["scope"] == "all"
    assert raw["processes"]["names"]["kworker/0:1"] == 1  # no kthreadd: not told apart


def test_csrow_counts_where_a_driver_has_no_dimm_directories(tmp_path):
    edac = {"mc0": {"ce_count": "1", "ue_count": "0", "dimms": {"csrow0": {
        "ce_count": "1", "ue_count": "0"}}}}
    raw = kernel.read(tree(tmp_path, edac=edac))
    assert raw["edac"]["mc0"]["dimms"] == {"csrow0": {"ce_count": "1", "ue_count": "0"}}
    assert raw["errors"]["edac/mc0/ce_noinfo_count"] == "ENOENT"


def test_no_edac_tree_no_modules_file(tmp_path):
    raw = kernel.read(tree(tmp_path, edac=None, modules=None))
    assert raw["edac"] is None and raw["modules"] is None
    assert raw["errors"]["modules"] == "ENOENT"


def test_a_root_without_proc_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable):
        kernel.read(str(tmp_path))


def test_live_host_gives_sane_facts():
    raw = kernel.gather(Options())
    assert raw["processes"]["scope"] == "all"
    names = raw["processes"]["names"]
    assert sum(names.values()) >= 1 and all(len(n.encode()) <= 15 for n in names)
    here = open(f"/proc/{os.getpid()}/comm").read().strip()
    assert names.get(here, 0) >= 1  # this very process
    assert "lo" in raw["net"] and raw["net"]["lo"]["type"] == "772"
    assert raw["net"]["lo"]["device"] is False
    assert raw["edac"] is None or all(k.startswith("mc") for k in raw["edac"])
    assert isinstance(raw["boot_id"], str) and len(raw["boot_id"]) == 36


CONFIG = """
[ps]
daemons = ["munged", "nvidia-persistenced", "nvidia-imex"]
[modules]
loaded = ["nvidia", "nvidia_peermem", "mlx5_ib"]
absent = ["nouveau"]
[net]
up = ["eth0", "eth1"]
mtu = { eth0 = 9000 }
[edac]
expected = true
"""


def verdicts(doc):
    return {r["check"]: r["status"] for r in doc["results"]}


def test_check_host_root_end_to_end_and_its_snapshot_replays_alike(tmp_path):
    root = tree(tmp_path)
    cfg = tmp_path / "slurmhealth.toml"
    cfg.write_text(CONFIG)
    cfg.chmod(0o644)
    areas = "ps,modules,net,edac,mce"
    args = ("check", "--host-root", root, "--config", str(cfg), "--only", areas, "--json")
    done = conftest.run_cli(*args, "--no-db")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    got = verdicts(doc)
    assert {k: got[k] for k in ("ps.daemons", "modules.loaded", "modules.absent", "net.link_up",
                                "net.mtu", "edac.uncorrected")} == {
        "ps.daemons": "fail", "modules.loaded": "ok", "modules.absent": "ok",
        "net.link_up": "fail", "net.mtu": "ok", "edac.uncorrected": "ok"}
    failed = {r["check"]: r["message"] for r in doc["results"] if r["status"] == "fail"}
    assert failed["ps.daemons"] == "nvidia-imex not running"
    assert failed["net.link_up"] == "eth1 down, no carrier"
    assert doc["sources"]["kernel"]["status"] == "ok"
    snap = tmp_path / "snap.json"
    made = conftest.run_cli("snapshot", "--host-root", root, "-o", str(snap))
    assert made.returncode in (0, 4), made.stderr  # 4: the live kernel log unread (not root)
    assert json.loads(snap.read_text())["kernel"] == kernel.read(root)
    replay = conftest.run_cli("check", "--gpu-source", str(snap), "--config", str(cfg),
                              "--only", "ps,modules,net,edac", "--json")
    assert replay.returncode == 1, replay.stderr
    assert verdicts(json.loads(replay.stdout)) == {
        k: v for k, v in got.items() if not k.startswith("mce.")}


def test_host_root_must_exist(tmp_path):
    done = conftest.run_cli("check", "--host-root", str(tmp_path / "nope"), "--no-db")
    assert done.returncode == 2 and "--host-root" in done.stderr
