"""node/nhc.py: an nhc.conf read as slurmhealth expectations, every line accounted for."""

from __future__ import annotations

import json
import os
import sys

import conftest
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the project's own fallback before 3.11 (setup.cfg)
    import tomli as tomllib

from slurmhealth.node import nhc

SITE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "nhc", "site.conf")


def site() -> nhc.Translation:
    with open(SITE, encoding="utf-8") as handle:
        return nhc.translate(handle.read())


def test_every_line_of_a_site_conf_is_accounted_for():
    got = site()
    with open(SITE, encoding="utf-8") as handle:
        checks = [line for line in handle if line.strip() and not line.lstrip().startswith("#")]
    assert len(got.lines) == len(checks)
    assert {how for _n, _t, how, _w in got.lines} == {"ok", "partial", "no"}


def test_the_common_checks_become_expectations_of_every_node():
    every = site().blocks[nhc.ALL]
    assert every["hw"] == {
        "sockets": 2,
        "cpus": 192,
        "threads_per_core": 2,
        "memory_gb": 1968.32,
        "memory_tolerance_pct": 3.0,
        "swap_gb": 0.0,
        "free_memory_gb": 64.0,
    }
    assert every["fs"]["mounts"] == ["/", "/home", "/opt/apps"]
    assert every["fs"]["rw"] == ["/", "/home"]
    assert every["fs"]["ro"] == ["/opt/apps"]
    assert every["fs"]["fstype"] == {"/home": "nfs"}
    assert every["fs"]["free_pct_at"] == {"/tmp": 3.0, "/var": 5.0}
    assert every["fs"]["files"] == {"/etc": "dr", "/var/spool/slurmd": "dr", "/dev/null": "crw"}
    assert every["ps"] == {"daemons": ["sshd", "munged", "slurmd"], "absent": ["nouveau"]}
    assert every["net"] == {"up": ["eno1"]}


def test_node_patterns_become_blocks_whose_lists_begin_with_every_nodes():
    got = site()
    assert list(got.blocks) == ["*", "gpu[001-128]", "gpu*"]  # mcelog: on by default
    assert got.blocks["gpu[001-128]"]["ib"] == {"rate": 400, "devices": ["mlx5_0", "mlx5_1"]}
    doc = tomllib.loads(nhc.render(got, SITE))
    gpu = next(block for block in doc["node"] if block["match"] == "gpu*")
    assert gpu["fs"]["mounts"] == ["/", "/home", "/opt/apps", "/lustre/scratch"]
    assert gpu["fs"]["fstype"] == {"/home": "nfs", "/lustre/scratch": "lustre"}
    assert gpu["ps"]["daemons"] == ["sshd", "munged", "slurmd", "nvidia-persistenced"]
    assert doc["fs"]["free_pct_at"] == {"/tmp": 3.0, "/var": 5.0}


def test_what_is_not_translated_says_why_line_by_line():
    left = {number: why for number, _text, why in site().untranslated()}
    text = nhc.render(site(), SITE)
    for number, why in left.items():
        assert f"line {number}: " in text
        assert why[:40] in text
    whys = " | ".join(left.values())
    assert "an NHC setting" in whys
    assert "a regular-expression target" in whys
    assert "runs a command" in whys
    assert "the load average is not judged" in whys
    assert "a free-inode count" in whys
    assert "the owner (-u) is not compared" in whys
    assert "the source (-s) is not compared" in whys


@pytest.mark.parametrize(
    ("line", "how", "what"),
    [
        ("* || check_fs_mount /data nfs-server:/data nfs", "partial", "the source (-s)"),
        ("* || check_fs_mount_rw -0 -f /scratch", "partial", "-0 (non-fatal)"),
        ("* || check_fs_mount -r -e 'mount -a' -f /apps", "partial", "no remount or action"),
        ("* || check_fs_mount -t '*nfs*' -f /home", "partial", "a match string"),
        ("* || check_fs_free /scratch 128MB", "ok", "fs.free_mb_at: /scratch 128.0 MiB"),
        ("* || check_fs_used / 98GB", "no", "a used-space ceiling in bytes"),
        ("* || check_hw_physmem 12582912 50331648", "partial", "the ceiling 48.0 GiB"),
        ("* || check_hw_swap 0 2097152", "no", "a range of swap sizes"),
        ("* || check_hw_mem_free 1GB", "partial", "where NHC adds the free swap"),
        ("* || check_ps_daemon sshd root", "partial", "the owner and arguments"),
        ("* || check_ps_service -k -u !root telnetd", "partial", "ps.absent: telnetd"),
        ("* || check_ps_service -m '*sshd*' sshd", "no", "a process match string"),
        ("* || check_file_test -u /usr/bin/sudo", "no", "file test(s) -u"),
        ("* || check_fs_mount", "no", "no mount point"),
        ("* || check_hw_cpuinfo two", "no", "cannot read check_hw_cpuinfo's arguments"),
        ("* || check_fs_mount -Z -f /", "no", "unknown option -Z"),
        ("* || check_fs_mount -f '/unclosed", "no", "cannot split the line"),
        ("@gpus || check_hw_eth eth0", "no", "a node-group target"),
        ("{gpu[01-} || check_hw_eth eth0", "no", "is no node pattern"),
        ("!{a[1-2],b[1-2]} || check_hw_eth eth0", "no", "a negated list of ranges"),
        ("check_hw_eth eth0", "no", "not a `TARGET || CHECK` line"),
        ("* || ", "no", "no check named"),
        ("* || my_site_check --fast", "no", "my_site_check has no slurmhealth equivalent"),
        ("* || check_hw_mcelog", "ok", "the mce and edac areas"),
    ],
)
def test_each_check_form_is_translated_or_says_why(line, how, what):
    [(_n, _text, got, said)] = nhc.translate(line).lines
    assert (got, what in said) == (how, True), said


def test_sizes_read_as_nhc_reads_them():
    assert nhc.size_mib("1048576") == 1024.0  # kB when no unit
    assert nhc.size_mib("128MB") == nhc.size_mib("128m") == 128.0
    assert nhc.size_mib("2GB") == nhc.size_mib("2g") == nhc.size_mib("2GiB") == 2048.0
    assert nhc.size_mib("1TB") == 1024.0**2
    with pytest.raises(ValueError, match="not a size"):
        nhc.size_mib("lots")


def test_two_patterns_setting_one_key_are_said():
    text = "gpu* || check_hw_eth eth0\n{gpu[01-04]} || check_hw_eth eth1\n"
    [said] = nhc.overlaps(nhc.translate(text))
    assert said == "net.up is set for gpu* and for gpu[01-04]: a node in both gets the later one's"


def test_hostile_lines_reach_the_output_cleaned():
    """Control characters never reach the terminal, the comments or the expectations; a
    source name cannot open a TOML table."""
    text = "* || check_fs_mount_rw -f /x\x1b[31m\n* || evil\x07 $(reboot)\n"
    got = nhc.translate(text)
    assert [how for _n, _t, how, _w in got.lines] == ["no", "no"]
    out = nhc.render(got, "nhc.conf\n[settings]")
    assert "\x1b" not in out and "\x07" not in out
    doc = tomllib.loads(out)
    assert doc == {}


# ---------------------------------------------------------------- through the real commands

# gpu001's mounts as site.conf asks for them (proc(5) mountinfo lines): / and /home read-write,
# /home over NFS, /opt/apps read-only, /lustre/scratch a Lustre client mount.
GPU001_MOUNTS = [
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
    "40 27 0:50 / /home rw,relatime - nfs storage01:/export/home rw,vers=3",
    "41 27 7:0 / /opt/apps ro,relatime - squashfs /dev/loop0 ro",
    "42 27 0:60 / /lustre/scratch rw,relatime - lustre 10.0.0.1@o2ib:/scratch rw,flock",
]
# /proc/meminfo of a node with 2063937844 kB (check_hw_physmem's figure), no swap
GPU001_MEMINFO = """MemTotal:       2063937844 kB
MemFree:        2000000000 kB
MemAvailable:   2010000000 kB
SwapTotal:             0 kB
SwapFree:              0 kB
HugePages_Total:       0
"""
ETH = {"operstate": "up", "carrier": "1", "carrier_changes": "2", "type": "1", "mtu": "1500",
       "speed": "25000", "device": True}


def gpu001(tmp_path, mounts=GPU001_MOUNTS) -> str:
    """A host tree that meets what site.conf asks of gpu001 (the ps, fs, hw and net parts)."""
    root = tmp_path / "host"
    daemons = {100: "sshd", 101: "munged", 102: "slurmd", 103: "nvidia-persiste"}
    conftest.host_tree(root, comms=daemons, init_children=tuple(daemons), net={"eno1": ETH})
    conftest.hw_tree(root, GPU001_MEMINFO, online="0-191", present="0-191", sockets=2)
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "mountinfo").write_text("".join(f"{m}\n" for m in mounts))
    for path in ("home", "opt/apps", "lustre/scratch", "tmp", "var/spool/slurmd", "etc", "dev"):
        (root / path).mkdir(parents=True, exist_ok=True)
    os.symlink("/dev/null", root / "dev" / "null")  # the host's own character device
    return str(root)


def test_a_translated_site_conf_validates_and_judges_a_host_tree(tmp_path):
    """`config from-nhc` writes a config `config validate` accepts; `check` with it passes a
    host that meets every translated expectation and fails one without a required mount."""
    out = tmp_path / "slurmhealth.toml"
    done = conftest.run_cli("config", "from-nhc", SITE, "-o", str(out))
    assert done.returncode == 0, done.stderr
    valid = conftest.run_cli("config", "validate", str(out))
    assert valid.returncode == 0, valid.stderr + valid.stdout
    args = ("check", "--config", str(out), "--node", "gpu001", "--only", "fs,hw,ps,net",
            "--json")
    passed = conftest.run_cli(*args, "--host-root", gpu001(tmp_path / "good"))
    doc = json.loads(passed.stdout)
    assert passed.returncode == 0, [r for r in doc["results"] if r["status"] != "ok"]
    checks = {r["check"]: r for r in doc["results"]}
    assert checks["fs.files"]["message"] == "3 files as expected"
    assert checks["ps.daemons"]["message"] == "4 daemons running"
    assert checks["hw.cpu_count"]["status"] == checks["net.link_up"]["status"] == "ok"
    broken = gpu001(tmp_path / "bad", GPU001_MOUNTS[:3])
    failed = conftest.run_cli(*args, "--host-root", broken)
    assert failed.returncode == 1, failed.stderr
    doc = json.loads(failed.stdout)
    bad = {r["check"]: r["message"] for r in doc["results"] if r["status"] == "fail"}
    assert bad == {"fs.mounted": "/lustre/scratch not mounted"}
