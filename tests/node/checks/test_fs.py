"""checks/fs.py: parse is total; required mounts, hung and stale mounts, read-only mounts and
full filesystems give their status and action, on fixture trees, on real tmpfs mounts and
through the real `slurmhealth check --host-root DIR`."""

from __future__ import annotations

import json
import os
import re
import stat as modes
import subprocess
import threading

import conftest
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.core import result
from slurmhealth.node import config, replay, runner
from slurmhealth.node.checks import fs
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import Options
from slurmhealth.node.sources import fs as source

ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw"
TMP = "28 27 0:25 / /tmp rw,nosuid - tmpfs tmpfs rw"
SCRATCH = "40 27 0:60 / /scratch rw,relatime - lustre 10.0.0.1@o2ib:/scr rw,flock"
SOFTWARE = "41 27 7:0 / /opt/sw ro,relatime - squashfs /dev/loop0 ro"
# ext4 after errors=remount-ro: the mount still says rw, its superblock ro (proc(5))
ROOT_REMOUNTED = "27 1 254:0 / / rw,relatime - ext4 /dev/vda ro"
GIB = 1 << 30


def stat(free_pct: float = 50.0, inodes_pct: float = 50.0, frsize: int = 4096) -> dict:
    """statvfs fields of a 100 GiB filesystem with `free_pct` free to users."""
    blocks = 100 * GIB // frsize
    free = int(blocks * free_pct / 100)
    return {"frsize": frsize, "blocks": blocks, "bfree": free, "bavail": free,
            "files": 1000, "ffree": int(10 * inodes_pct), "flag": 0}


def facts_of(lines: list, stats: dict | None = None) -> dict:
    return fs.parse({"mountinfo": lines, "stats": stats or {}})


def expect(**over) -> dict:
    return dict(config.defaults()["fs"], **over)


def run(check, facts: dict, **over) -> result.Result:
    res = check(facts, Context(expect=expect(**over)))
    assert isinstance(res, result.Result)
    return res


def status(res) -> tuple:
    return (res.status, res.action)


# ---------------------------------------------------------------- parse


def test_parse_line_unescapes_and_splits_both_option_sets():
    mount = fs.parse_line("31 27 0:27 /sub /data\\040set ro,relatime shared:3 - xfs /dev/sdb rw")
    assert mount == {"point": "/data set", "root": "/sub", "options": ["ro", "relatime"],
                     "fstype": "xfs", "source": "/dev/sdb", "super": ["rw"]}
    assert fs.parse_line("not a line") is None
    assert fs.parse_line("1 2 3 4 relative rw - ext4 x rw") is None


def test_the_last_line_of_a_mount_point_is_the_one_on_top():
    facts = facts_of([TMP, "29 28 0:26 / /tmp ro - tmpfs tmpfs ro"])
    assert facts["mounts"]["/tmp"]["options"] == ["ro"]


@pytest.mark.parametrize(
    "raw,expected",
    [
        (stat(10.0), {"free_pct": 10.0, "free_mb": 10.0 * 1024, "inodes_free_pct": 50.0}),
        ({"hung": 0.5}, {"hung": 0.5}),
        ({"error": "ESTALE"}, {"error": "ESTALE"}),
        ({"blocks": 0, "bfree": 0, "bavail": 0, "files": 0, "ffree": 0},
         {"free_pct": None, "free_mb": None, "inodes_free_pct": None}),
        ("garbage", {"free_pct": None, "free_mb": None, "inodes_free_pct": None}),
    ],
)
def test_parse_stat(raw, expected):
    got = fs.parse_stat(raw)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value) if value is not None else got[key] is None


def test_free_space_is_what_a_user_may_use_as_df_counts_it():
    """ext4 reserves blocks for root: bfree counts them, bavail does not."""
    raw = {"frsize": 4096, "blocks": 1000, "bfree": 100, "bavail": 50, "files": 0, "ffree": 0}
    assert fs.parse_stat(raw)["free_pct"] == pytest.approx(100 * 50 / 950)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    raw=st.one_of(
        json_values,
        st.fixed_dictionaries({"mountinfo": st.lists(st.text(max_size=80), max_size=5),
                               "stats": st.dictionaries(st.text(max_size=8), json_values),
                               "files": st.dictionaries(st.sampled_from(["/x", "/y"]),
                                                        json_values)}),
    )
)
def test_parse_and_checks_never_raise(raw):
    facts = fs.parse(raw)
    over = dict(mounts=["/", "/x"], rw=["/"], ro=["/x"], files={"/x": fs.FILE_TESTS, "/z": "e"},
                free_pct_at={"/x": 5.0}, free_mb_at={"/": 1.0})
    for check in fs.CHECKS:
        assert check(facts, Context(expect=expect(**over)))


# ---------------------------------------------------------------- checks


def test_a_plain_node_passes_on_defaults():
    facts = facts_of([ROOT, TMP, SOFTWARE], {"/": stat(), "/tmp": stat()})
    results = [run(check, facts) for check in fs.CHECKS]
    assert [r.status for r in results] == ["ok"] * len(fs.CHECKS), results


def test_a_required_mount_missing_fails_and_a_wrong_type_too():
    facts = facts_of([ROOT, TMP], {"/": stat()})
    res = run(fs.mounted, facts, mounts=["/scratch", "/"])
    assert status(res) == ("fail", "drain") and res.message == "/scratch not mounted"
    res = run(fs.mounted, facts_of([ROOT, SCRATCH]), fstype={"/scratch": "nfs"})
    assert res.message == "/scratch is lustre, not nfs"
    assert run(fs.mounted, facts_of([ROOT, SCRATCH]), mounts=["/scratch"]).status == "ok"


def test_an_unreadable_mountinfo_fails_only_where_mounts_are_required():
    facts = fs.parse({"mountinfo": [], "stats": {}, "errors": {"mountinfo": "EACCES"}})
    assert run(fs.mounted, facts).message == "no mounts required"
    assert run(fs.mounted, facts, mounts=["/"]).message == "mountinfo unreadable: EACCES"


@pytest.mark.parametrize("stat_of,outcome", [
    ({"hung": 0.5}, ("fail", "drain")),
    ({"error": "ESTALE"}, ("fail", "drain")),
    ({"error": "ENOTCONN"}, ("fail", "drain")),
    ({"error": "EACCES"}, ("warn", "none")),
])
def test_a_hung_or_stale_mount_fails(stat_of, outcome):
    facts = facts_of([ROOT, SCRATCH], {"/": stat(), "/scratch": stat_of})
    res = run(fs.responsive, facts, mounts=["/scratch"])
    assert status(res) == outcome
    assert res.message.startswith("/scratch")


def test_read_only_where_read_write_is_expected_fails():
    ro_scratch = SCRATCH.replace(" rw,relatime", " ro,relatime")
    res = run(fs.writable, facts_of([ROOT, ro_scratch]), rw=["/scratch"])
    assert status(res) == ("fail", "drain")
    assert res.message == "/scratch read-only, expected read-write"
    res = run(fs.writable, facts_of([ROOT, SCRATCH]), ro=["/scratch"])
    assert status(res) == ("warn", "none")
    assert run(fs.writable, facts_of([ROOT, SOFTWARE]), ro=["/opt/sw"]).status == "ok"


def test_a_mount_the_kernel_turned_read_only_fails_with_reboot_on_defaults():
    res = run(fs.writable, facts_of([ROOT_REMOUNTED]))
    assert status(res) == ("fail", "reboot")
    assert "turned read-only by the kernel" in res.message
    # a read-only mount on purpose, not judged by default: left alone
    assert run(fs.writable, facts_of([ROOT, SOFTWARE])).status == "ok"


def test_a_full_filesystem_below_the_floor_fails():
    facts = facts_of([ROOT, TMP], {"/": stat(), "/tmp": stat(free_pct=1.0)})
    res = run(fs.free_space, facts)
    assert status(res) == ("fail", "drain")
    assert res.message == "/tmp 1.0% free (floor 3%)"
    res = run(fs.free_space, facts_of([ROOT], {"/": stat(free_pct=5.0)}), free_mb=10240.0)
    assert res.message == "/ 5120 MiB free (floor 10240 MiB)"


def test_a_mount_with_a_floor_of_its_own_is_judged_by_it_and_the_others_by_the_global():
    facts = facts_of([ROOT, TMP, SCRATCH],
                     {"/": stat(free_pct=5.0), "/tmp": stat(), "/scratch": stat(free_pct=8.0)})
    res = run(fs.free_space, facts, free_pct_at={"/scratch": 10.0})
    assert status(res) == ("fail", "drain")
    assert res.message == "/scratch 8.0% free (floor 10%)"
    assert list(res.data) == ["/", "/tmp", "/scratch"]  # named there: judged, though not listed
    assert run(fs.free_space, facts, free_pct_at={"/scratch": 5.0}).status == "ok"
    # a floor of its own replaces the global one there, lower or higher
    assert run(fs.free_space, facts, free_pct=6.0, free_pct_at={"/": 4.0, "/scratch": 5.0}
               ).status == "ok"
    res = run(fs.free_space, facts, free_mb_at={"/tmp": 60000.0, "/scratch": 4096.0})
    assert res.message == "/tmp 51200 MiB free (floor 60000 MiB)"


def test_paths_with_floors_on_one_mount_judge_it_by_the_highest():
    """NHC's `check_fs_free /tmp 3%` and `check_fs_used /var 95%` where both are on /."""
    facts = facts_of([ROOT], {"/": stat(free_pct=4.0)})
    res = run(fs.free_space, facts, free_pct_at={"/tmp": 3.0, "/var": 5.0})
    assert res.message == "/ 4.0% free (floor 5%)"
    assert fs.stat_paths(expect(free_on=[], free_pct_at={"/tmp": 3.0}, free_mb_at={"/x": 1})
                         ) == ["/tmp", "/x"]


def test_the_per_mount_floors_and_files_are_validated():
    good = ('[fs]\nfree_pct_at = { "/tmp" = 3, "/var" = 5.5 }\nfree_mb_at = { "/tmp" = 128.0 }\n'
            'files = { "/etc" = "dr", "/dev/null" = "crw" }\n')
    assert config.parse(good)["fs"]["free_pct_at"] == {"/tmp": 3, "/var": 5.5}
    for bad, why in [
        ('free_pct_at = { "/tmp" = 101 }', "percentages from 0 to 100"),
        ('free_pct_at = { "tmp" = 3 }', "percentages from 0 to 100"),
        ('free_mb_at = { "/tmp" = -1 }', "MiB, >= 0"),
        ('free_mb_at = { "/tmp" = "1G" }', "MiB, >= 0"),
        ('files = { "/etc" = "dz" }', "test(1) letters"),
        ('files = { "/etc" = "" }', "test(1) letters"),
        ('files = ["/etc"]', "must be dict"),
    ]:
        with pytest.raises(config.ConfigError, match=re.escape(why)):
            config.parse(f"[fs]\n{bad}\n")


def test_tmp_on_root_is_judged_once_and_read_only_mounts_never():
    facts = facts_of([ROOT, SOFTWARE], {"/": stat(free_pct=20.0), "/opt/sw": stat(free_pct=0.0)})
    res = run(fs.free_space, facts, ro=["/opt/sw"])
    assert res.status == "ok" and list(res.data) == ["/"]


def test_inodes_below_the_floor_fail_and_no_limit_is_not_judged():
    facts = facts_of([ROOT], {"/": stat(inodes_pct=1.0)})
    assert run(fs.free_inodes, facts).message == "/ 1.0% inodes free (floor 3%)"
    no_limit = dict(stat(), files=0, ffree=0)
    res = run(fs.free_inodes, facts_of([ROOT], {"/": no_limit}))
    assert res.message == "no inode limits to judge"


def test_a_mount_point_from_mountinfo_reaches_a_reason_cleaned():
    line = "50 27 0:70 / /evil\\012NHC:\\033[31m rw - nfs4 x:/y rw"
    res = run(fs.mounted, facts_of([ROOT, line]), fstype={"/evil\nNHC:\x1b[31m": "lustre"})
    assert res.status == "fail" and res.message.isprintable() and "\n" not in res.message


def test_genconf_names_the_lasting_mounts_only():
    lines = [ROOT, TMP, SCRATCH, SOFTWARE,
             "29 27 0:26 / /home rw - autofs systemd-1 rw",
             "30 29 0:50 / /home/alice rw - nfs4 srv:/home/alice rw",
             "45 27 254:0 /etc/hosts /etc/hosts rw - ext4 /dev/vda rw",
             "46 27 0:22 / /sys rw - sysfs sysfs rw"]
    found = fs.expectations(facts_of(lines))
    assert found == {"mounts": ["/", "/opt/sw", "/scratch"], "rw": ["/", "/scratch"],
                     "ro": ["/opt/sw"],
                     "fstype": {"/": "ext4", "/opt/sw": "squashfs", "/scratch": "lustre"}}
    text = config.toml_value(found["fstype"])
    assert config.parse(f"[fs]\nfstype = {text}\n")["fs"]["fstype"] == found["fstype"]


def test_stat_paths_are_the_listed_mounts_and_the_floors_paths():
    assert fs.stat_paths(expect(mounts=["/scratch"], fstype={"/home": "nfs"})) == [
        "/scratch", "/home", "/", "/tmp", "/var"]


# ---------------------------------------------------------------- files (NHC check_file_test)


def file_tree(tmp_path) -> str:
    """A host root holding one of each kind of file test(1) tells apart, but a block device."""
    root = tmp_path / "host"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "mountinfo").write_text(f"{ROOT}\n")
    (root / "etc" / "slurm").mkdir(parents=True)
    (root / "etc" / "slurm" / "slurm.conf").write_text("ClusterName=c\n")
    (root / "etc" / "empty").write_text("")
    (root / "etc" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "etc" / "run.sh", 0o755)
    os.symlink("slurm", root / "etc" / "current")
    os.symlink("gone", root / "etc" / "dangling")
    os.mkfifo(root / "etc" / "fifo")
    (root / "dev").mkdir()
    os.symlink("/dev/null", root / "dev" / "null")  # the host's own: a character device
    return str(root)


def files_of(root: str, wanted: dict) -> dict:
    options = Options(host_root=root)
    options.files = list(wanted)
    return fs.parse(source.gather(options))


def test_each_test_letter_on_real_files(tmp_path):
    root = file_tree(tmp_path)
    wanted = {"/etc/slurm": "edrwx", "/etc/slurm/slurm.conf": "efrs", "/etc/run.sh": "fx",
              "/etc/current": "Ld", "/etc/fifo": "p", "/dev/null": "crw"}
    res = run(fs.files, files_of(root, wanted), files=wanted)
    assert status(res) == ("ok", "none") and res.message == "6 files as expected", res.message
    for path, letters, said in [
        ("/etc/empty", "fs", "/etc/empty not non-empty (-s)"),
        ("/etc/slurm/slurm.conf", "dx", "/etc/slurm/slurm.conf not a directory (-d), "
                                        "executable (-x)"),
        ("/etc/dangling", "e", "/etc/dangling not there (-e)"),
        ("/etc/slurm", "L", "/etc/slurm not a symbolic link (-L)"),
        ("/etc/fifo", "bS", "/etc/fifo not a block device (-b), a socket (-S)"),
        ("/etc/missing", "e", "/etc/missing missing"),
    ]:
        res = run(fs.files, files_of(root, {path: letters}), files={path: letters})
        assert (status(res), res.message) == (("fail", "drain"), said)
    assert run(fs.files, files_of(root, {"/etc/dangling": "L"}), files={"/etc/dangling": "L"}
               ).status == "ok"


def test_the_recorded_file_facts_fit_the_snapshot_format(tmp_path):
    options = Options(host_root=file_tree(tmp_path))
    options.files = ["/etc/slurm", "/etc/dangling", "/etc/missing"]
    raw = json.loads(json.dumps(source.gather(options)))
    assert replay.problem(raw, replay.FS) == ""
    assert raw["files"]["/etc/dangling"] == {"lmode": raw["files"]["/etc/dangling"]["lmode"],
                                             "error": "ENOENT"}
    assert raw["files"]["/etc/missing"] == {"error": "ENOENT"}
    assert replay.problem({"files": {"/x": {"size": "big"}}}, replay.FS) != ""


def test_the_letters_as_test_reads_the_recorded_facts():
    def facts(kind: int, size: int = 1, access: str = "rw") -> dict:
        return fs.parse_file({"lmode": kind | 0o644, "mode": kind | 0o644, "size": size,
                              "access": {k: k in access for k in "rwx"}})

    assert fs.passes("b", facts(modes.S_IFBLK)) and not fs.passes("c", facts(modes.S_IFBLK))
    assert fs.passes("S", facts(modes.S_IFSOCK)) and fs.passes("e", facts(modes.S_IFSOCK))
    assert not fs.passes("w", facts(modes.S_IFREG, access="r"))
    assert not fs.passes("s", facts(modes.S_IFREG, size=0))
    missing = fs.parse_file({"error": "ENOENT"})
    assert not any(fs.passes(letter, missing) for letter in fs.FILE_TESTS)


def test_a_file_on_a_read_only_mount_is_not_writable(tmp_path):
    where = tmp_path / "ro"
    with conftest.tmpfs(where, "size=1m,ro"):
        options = Options(host_root="/")
        options.files = [str(where)]
        facts = fs.parse(source.gather(options))
    res = run(fs.files, facts, files={str(where): "drw"})
    assert res.message == f"{where} not writable (-w)"


def test_a_hung_path_fails_and_the_gather_does_not_wait(tmp_path, monkeypatch):
    """A path on a dead NFS server blocks its lstat in the kernel: the gather goes on."""
    release = threading.Event()
    real = source.lstat

    def blocking(path: str):
        if path.endswith("/hung"):
            release.wait(5)
        return real(path)

    monkeypatch.setattr(source, "lstat", blocking)
    options = Options(host_root=file_tree(tmp_path))
    options.files, options.stat_timeout = ["/hung", "/etc/slurm"], 0.05
    try:
        raw = source.gather(options)
    finally:
        release.set()
    assert raw["files"]["/hung"] == {"hung": 0.05}
    assert raw["files"]["/etc/slurm"]["access"] == {"r": True, "w": True, "x": True}
    res = run(fs.files, fs.parse(raw), files={"/hung": "e", "/etc/slurm": "d"})
    assert (status(res), res.message) == (("fail", "drain"), "/hung hung (no answer in 0.05 s)")


def test_no_files_listed_are_not_judged_and_a_path_reaches_a_reason_cleaned(tmp_path):
    assert run(fs.files, facts_of([ROOT])).message == "no files listed: not judged"
    evil = "/etc/\nNHC:\x1b[31m"
    res = run(fs.files, files_of(file_tree(tmp_path), {evil: "e"}), files={evil: "e"})
    assert res.status == "fail" and res.message.isprintable() and "\n" not in res.message
    # a replayed snapshot taken without the path: not read, not called missing
    assert run(fs.files, facts_of([ROOT]), files={"/etc": "d"}).status == "skip"


# ---------------------------------------------------------------- real mounts


def test_a_real_full_tmpfs_fails_and_a_real_read_only_one_too(tmp_path):
    root = tmp_path / "host"
    (root / "proc" / "self").mkdir(parents=True)
    full, ro = tmp_path / "full", tmp_path / "ro"
    with conftest.tmpfs(full, "size=1m"), conftest.tmpfs(ro, "size=1m,ro"):
        with open(full / "fill", "wb") as handle:
            try:
                handle.write(b"\0" * (2 << 20))
            except OSError:
                pass  # ENOSPC: full, as a job would leave it
        with open("/proc/self/mountinfo") as handle:
            (root / "proc" / "self" / "mountinfo").write_text(handle.read())
        options = Options(host_root="/")
        options.mounts = [str(full), str(ro)]
        raw = source.gather(options)
    facts = fs.parse(raw)
    ctx = Context(expect=expect(mounts=[str(full)], rw=[str(ro)]))
    res = fs.free_space(facts, ctx)
    assert status(res) == ("fail", "drain") and res.message.startswith(f"{full} 0.0% free")
    res = fs.writable(facts, ctx)
    assert status(res) == ("fail", "drain")
    assert res.message == f"{ro} read-only, expected read-write"


# ---------------------------------------------------------------- the real command


def test_check_host_root_end_to_end(tmp_path):
    """`slurmhealth check --host-root DIR --json`: a required mount missing fails the node
    (exit 1); the node is a replay, so no store is touched."""
    root = tmp_path / "host"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "mountinfo").write_text(f"{ROOT}\n{TMP}\n")
    (root / "tmp").mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fs]\nmounts = ["/", "/scratch"]\n')
    os.chmod(cfg, 0o600)
    args = ("check", "--host-root", str(root), "--kmsg", os.devnull, "--only", "fs,hw,time",
            "--config", str(cfg), "--node", "cpu01", "--json")
    proc = conftest.run_cli(*args)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    by_name = {r["check"]: r for r in doc["results"]}
    assert (by_name["fs.mounted"]["status"], by_name["fs.mounted"]["message"]) == (
        "fail", "/scratch not mounted")
    assert by_name["fs.free_space"]["status"] == "ok"  # / and /tmp under DIR: this disk
    assert by_name["hw.memory"]["status"] == "skip"  # no meminfo under DIR, none expected
    assert doc["verdict"] == "fail"
    assert "a replay" in proc.stderr


def test_snapshot_of_a_host_root_replays_to_the_same_verdicts(tmp_path):
    root = tmp_path / "host"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "mountinfo").write_text(f"{ROOT}\n{TMP}\n{SCRATCH}\n")
    out = tmp_path / "snap.json"
    common = ("--node", "cpu01")
    snap = conftest.run_cli("snapshot", "-o", str(out), "--host-root", str(root),
                            "--kmsg", os.devnull, *common)
    assert snap.returncode == 0, snap.stderr
    doc = json.loads(out.read_text())
    assert doc["fs"]["stats"]["/scratch"] == {"error": "ENOENT"}  # no such dir under DIR
    live = conftest.run_cli("check", "--host-root", str(root), "--kmsg", os.devnull,
                            "--only", "fs", "--json", *common)
    replayed = conftest.run_cli("check", "--gpu-source", str(out), "--only", "fs", "--json",
                                *common)

    def verdicts(proc: subprocess.CompletedProcess) -> list:
        return [(r["check"], r["status"], r["message"]) for r in json.loads(proc.stdout)["results"]]

    assert verdicts(live) == verdicts(replayed)
    assert runner.load_snapshot(str(out))["fs"]["mountinfo"][2] == SCRATCH
