"""sources/fs.py: mountinfo as the kernel writes it (proc(5), "/proc/pid/mountinfo"), and a
statvfs per judged mount that a hung mount cannot hold past its deadline."""

from __future__ import annotations

import json
import os
import threading

import pytest

from slurmhealth.node.sources import Options, fs

# proc(5)'s own example line, then a node's: root, /tmp on its own tmpfs, an NFS home under an
# automounter, a mount point with a space (written \040 by the kernel) and /dev/shm mounted twice.
MOUNTINFO = [
    "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
    "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard",
    "28 27 0:25 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw,size=1048576k",
    "29 27 0:26 / /home rw,relatime - autofs systemd-1 rw,fd=29,pgrp=1",
    "30 29 0:50 / /home/alice rw,relatime - nfs4 srv:/home/alice rw,vers=4.2",
    "31 27 0:27 / /data\\040set rw,relatime - xfs /dev/sdb rw",
    "32 27 0:22 / /sys rw,nosuid - sysfs sysfs rw",
    "33 27 0:23 / /dev/shm rw - tmpfs tmpfs rw",
    "34 33 0:24 / /dev/shm rw - tmpfs tmpfs rw,size=4k",
]


def host_tree(tmp_path, lines=MOUNTINFO) -> str:
    """A host root whose proc/self/mountinfo holds `lines`."""
    where = tmp_path / "host" / "proc" / "self"
    where.mkdir(parents=True)
    (where / "mountinfo").write_text("".join(f"{line}\n" for line in lines))
    return str(tmp_path / "host")


@pytest.mark.parametrize(
    "field,path",
    [
        ("/data\\040set", "/data set"),
        ("/a\\011b\\012c\\134d", "/a\tb\nc\\d"),
        ("/plain", "/plain"),
        ("/not\\08", "/not\\08"),  # not three octal digits: left as it is
        ("/end\\04", "/end\\04"),
    ],
)
def test_unescape_reads_the_kernels_octal_escapes(field, path):
    assert fs.unescape(field) == path


def test_mount_point_and_type_of_a_line():
    assert fs.mount_point(MOUNTINFO[0]) == ("/mnt2", "ext3")
    assert fs.mount_point(MOUNTINFO[5]) == ("/data set", "xfs")
    assert fs.mount_point("garbage") == ("", "")
    assert fs.mount_point("1 2 3 4 /x rw a b c d") == ("", "")  # no separator


def test_holder_is_the_longest_mount_point_above_a_path():
    points = ["/", "/tmp", "/home", "/home/alice"]
    assert fs.holder("/var", points) == "/"
    assert fs.holder("/tmp", points) == "/tmp"
    assert fs.holder("/tmpx", points) == "/"
    assert fs.holder("/home/alice/x", points) == "/home/alice"
    assert fs.holder("relative", points) is None


def test_judged_resolves_paths_and_skips_pseudo_filesystems():
    assert fs.judged(MOUNTINFO, ["/", "/tmp", "/var"]) == ["/", "/tmp"]
    every = fs.judged(MOUNTINFO, None)
    assert "/sys" not in every and "/home" not in every  # sysfs; autofs would mount on stat
    assert {"/", "/tmp", "/home/alice", "/data set", "/dev/shm", "/mnt2"} == set(every)


def test_gather_from_a_host_root_stats_under_it(tmp_path):
    root = host_tree(tmp_path)
    (tmp_path / "host" / "tmp").mkdir()
    options = Options(host_root=root)
    options.mounts = ["/", "/tmp", "/var", "/gone/away"]
    raw = fs.gather(options)
    assert raw["mountinfo"] == MOUNTINFO
    assert sorted(raw["stats"]) == ["/", "/tmp"]
    stat = raw["stats"]["/"]
    assert set(stat) == set(fs.STAT_FIELDS) and stat["blocks"] > 0
    assert json.loads(json.dumps(raw)) == raw  # a snapshot section as it is
    assert "errors" not in raw


def test_missing_mountinfo_is_an_error_not_an_exception(tmp_path):
    raw = fs.gather(Options(host_root=str(tmp_path)))
    assert raw == {"mountinfo": [], "stats": {}, "errors": {"mountinfo": "ENOENT"}}


def test_a_hung_statvfs_is_recorded_and_the_gather_goes_on(tmp_path, monkeypatch):
    """A dead NFS server blocks statvfs in the kernel: the stand-in blocks until released."""
    release = threading.Event()
    real = os.statvfs

    def stat(path):
        if path.endswith("/tmp"):
            release.wait(30)
        return real(path)

    monkeypatch.setattr(fs, "statvfs", stat)
    root = host_tree(tmp_path)
    (tmp_path / "host" / "tmp").mkdir()
    try:
        got = fs.stat_all(["/", "/tmp"], root, 0.2)
    finally:
        release.set()
    assert got["/tmp"] == {"hung": 0.2}
    assert got["/"]["blocks"] > 0


def test_a_stat_error_is_named(tmp_path, monkeypatch):
    def stale(path):
        raise OSError(116, "Stale file handle", path)

    monkeypatch.setattr(fs, "statvfs", stale)
    assert fs.stat_all(["/"], str(tmp_path), 1.0) == {"/": {"error": "ESTALE"}}


def test_live_gather_of_this_machine_is_sane():
    options = Options()
    options.mounts = ["/", "/tmp"]
    raw = fs.gather(options)
    points = [fs.mount_point(line)[0] for line in raw["mountinfo"]]
    assert "/" in points
    assert "/" in raw["stats"]
    stat = raw["stats"]["/"]
    assert stat["blocks"] >= stat["bfree"] >= 0 and stat["frsize"] > 0


def test_in_memory_filesystems_are_stated_inline_and_network_ones_in_a_thread(
    tmp_path, monkeypatch
):
    """ext4, xfs and tmpfs answer statfs from in-memory counters: no thread is started for
    them; an NFS mount, which a dead server can hang, gets its thread and its deadline."""
    root = host_tree(tmp_path)
    for point in ("tmp", "home/alice"):
        (tmp_path / "host" / point).mkdir(parents=True)
    threaded: list[str] = []
    real_start = fs.start

    def start(paths, where, call):
        threaded.extend(paths if call is fs._statvfs else [])
        return real_start(paths, where, call)

    monkeypatch.setattr(fs, "start", start)
    options = Options(host_root=root)
    options.mounts = ["/", "/tmp", "/home/alice/notes"]
    raw = fs.gather(options)
    assert threaded == ["/home/alice"]
    assert list(raw["stats"]) == ["/", "/home/alice", "/tmp"]
    assert all(stat["blocks"] > 0 for stat in raw["stats"].values())
