"""packaging/: cron entries, systemd units, the periodic jobs' script, the example files, and the
.deb and .rpm built for real (packaging/build-packages: dpkg-buildpackage, rpmbuild) and read back.

Tools that are missing (dpkg-buildpackage, rpmbuild, systemd-analyze, scontrol, root) skip the
test that needs them, except under SLURMHEALTH_REQUIRE_REAL=1 (CI), where they fail it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import io
import os
import pwd
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time

import click
import pytest
from conftest import require_real, run_cli, snapshot_path

from slurmhealth import __version__
from slurmhealth.cli import cli
from slurmhealth.node import config
from slurmhealth.node.checks import REGISTRY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGING = os.path.join(ROOT, "packaging")
PERIODIC = os.path.join(PACKAGING, "slurmhealth-periodic")
UNITS = os.path.join(PACKAGING, "systemd")
LIBEXEC = "/usr/libexec/slurmhealth"
JOBS = ("collect", "report", "lemons", "export")
SLURMHEALTH = os.path.join(os.path.dirname(sys.executable), "slurmhealth")


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        require_real(f"{', '.join(missing)} not installed (scripts/install-deps)")


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return handle.read()


# -- cron.d -------------------------------------------------------------------------------------

CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
CRON_ENTRY = re.compile(r"^#?(\S+\s+\S+\s+\S+\s+\S+\s+\S+)\s+root\s+(.+)$")


def _cron_field_ok(field: str, low: int, high: int) -> bool:
    for part in field.split(","):
        found = re.fullmatch(r"(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?", part)
        if not found:
            return False
        numbers = [int(n) for n in found.groups()[1:] if n is not None]
        if not all(low <= n <= high for n in numbers[:2]) or (found.group(4) == "0"):
            return False
    return True


def cron_entries(text: str) -> list:
    """(schedule fields, command, enabled) of every entry, disabled ones included."""
    entries = []
    for line in text.splitlines():
        found = CRON_ENTRY.match(line)
        if found:
            entries.append((found.group(1).split(), found.group(2), not line.startswith("#")))
    return entries


def test_cron_entries_are_valid_locked_jobs_that_ship_disabled():
    text = _read("packaging", "cron.d", "slurmhealth")
    entries = cron_entries(text)
    jobs = {}
    for fields, command, enabled in entries:
        assert all(_cron_field_ok(f, *r) for f, r in zip(fields, CRON_RANGES)), fields
        # The package goes onto every node: a head-node job must not start on a compute node.
        assert not enabled, command
        argv = shlex.split(command)
        assert argv[0] == f"{LIBEXEC}/slurmhealth-periodic" and argv[-1] in JOBS, command
        assert "-q" in argv, "cron mails stdout: routine counts must not"
        jobs[argv[-1]] = fields
    assert jobs.keys() == set(JOBS)
    assert jobs["collect"][:2] == ["*/5", "*"] and jobs["export"][:2] == ["*/5", "*"]
    assert jobs["report"] == ["0", "6", "*", "*", "*"]
    assert jobs["lemons"][0].isdigit() and jobs["lemons"][1:] == ["*"] * 4
    for line in text.splitlines():
        if line and not line.startswith("#") and not CRON_ENTRY.match(line):
            assert re.fullmatch(r"[A-Z_]+=\S+", line), f"not an entry nor a variable: {line}"


def test_cron_field_validator_rejects_what_cron_rejects():
    assert _cron_field_ok("*/5", 0, 59) and _cron_field_ok("1-5,7", 0, 7)
    assert not _cron_field_ok("60", 0, 59) and not _cron_field_ok("*/0", 0, 59)
    assert not _cron_field_ok("mon", 0, 7)


# -- the periodic jobs' script --------------------------------------------------------------------


@pytest.fixture
def periodic_env(tmp_path):
    """A node and a head node in a tmp dir: state dir, spool, stores, an env file path."""
    for name in ("state", "spool"):
        (tmp_path / name).mkdir()
    return {
        "PATH": os.environ["PATH"],
        "SLURMHEALTH_BIN": SLURMHEALTH,
        "SLURMHEALTH_STATE_DIR": str(tmp_path / "state"),
        "SLURMHEALTH_SPOOL": str(tmp_path / "spool"),
        "SLURMHEALTH_DB": str(tmp_path / "gpu07.db"),
        "SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db"),
        "SLURMHEALTH_NODE": "gpu07",
        "SLURMHEALTH_PERIODIC_ENV": str(tmp_path / "periodic.env"),
    }


def periodic(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the script with the system's /bin/sh (dash on Debian), as cron and systemd do."""
    return subprocess.run(
        ["/bin/sh", PERIODIC, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _node_with_one_run(env: dict) -> None:
    """gpu07's store holds one check run that lost a GPU (check exits 1 on a failing check)."""
    done = run_cli(
        "check",
        "--gpu-source",
        snapshot_path("gpu-lost"),
        "--db",
        env["SLURMHEALTH_DB"],
        "--record",
        "--node",
        "gpu07",
    )
    assert done.returncode == 1, done.stderr


def test_periodic_export_collect_report_lemons_end_to_end(periodic_env):
    _node_with_one_run(periodic_env)
    done = periodic(periodic_env, "-q", "export")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    spool = os.path.join(periodic_env["SLURMHEALTH_SPOOL"], "gpu07.ndjson")
    with open(spool, encoding="utf-8") as handle:
        assert '"node":"gpu07"' in handle.read().replace(" ", "")
    # The collect job adds --sacct and publish (a real Slurm: tests/slurm); merge by hand here.
    merged = run_cli(
        "collect", periodic_env["SLURMHEALTH_SPOOL"], "--db", periodic_env["SLURMHEALTH_FLEET_DB"]
    )
    assert merged.returncode == 0, merged.stderr
    done = periodic(periodic_env, "report")
    assert done.returncode == 0, done.stderr
    reports = os.path.join(periodic_env["SLURMHEALTH_STATE_DIR"], "reports")
    latest = os.path.join(reports, "latest.html")
    assert os.readlink(latest) == f"slurmhealth-{time.strftime('%Y-%m-%d')}.html"
    with open(latest, encoding="utf-8") as handle:
        assert "GPU 3 GpuIsLost" in handle.read(), "the node's failure reached the report"
    done = periodic(periodic_env, "-q", "lemons")
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


def test_a_report_the_mta_could_not_send_is_still_the_latest_and_old_ones_go(periodic_env):
    """No MTA where SLURMHEALTH_MAIL_TO is set: the job fails (4: written, not mailed), and the
    report it wrote is still linked as latest.html and old reports are still pruned."""
    _node_with_one_run(periodic_env)
    assert periodic(periodic_env, "-q", "export").returncode == 0
    spool, fleet = periodic_env["SLURMHEALTH_SPOOL"], periodic_env["SLURMHEALTH_FLEET_DB"]
    assert run_cli("collect", spool, "--db", fleet).returncode == 0
    reports = os.path.join(periodic_env["SLURMHEALTH_STATE_DIR"], "reports")
    os.makedirs(reports)
    old = os.path.join(reports, "slurmhealth-2020-01-01.html")
    with open(old, "w", encoding="utf-8") as handle:
        handle.write("<html></html>")
    os.utime(old, (0, 0))
    env = dict(periodic_env, SLURMHEALTH_MAIL_TO="hpc-admins@example.org")
    env["SLURMHEALTH_SENDMAIL"] = "/nonexistent/sendmail"
    done = periodic(env, "report")
    assert done.returncode == 4, done.stderr
    assert "report not mailed" in done.stderr
    latest = os.path.join(reports, "latest.html")
    assert os.readlink(latest) == f"slurmhealth-{time.strftime('%Y-%m-%d')}.html"
    assert os.path.exists(latest) and not os.path.exists(old)


def test_the_periodic_scripts_help_says_its_jobs_and_does_nothing(periodic_env, tmp_path):
    env = dict(periodic_env, SLURMHEALTH_STATE_DIR=str(tmp_path / "not-made"))
    for flag in ("--help", "-h"):
        done = periodic(env, flag)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert done.stdout.startswith("slurmhealth-periodic [-q] [-n] collect")
        assert "-n  print the commands instead of running them" in done.stdout
    assert not (tmp_path / "not-made").exists()


def test_the_periodic_env_file_is_read_never_run_as_shell(periodic_env, tmp_path):
    """periodic.env's lines are NAME=VALUE, read: `$(...)` or `; cmd` in it never runs as
    root, and values still reach the jobs (`-n` prints the command a job would run)."""
    marker = tmp_path / "injected"
    (tmp_path / "periodic.env").write_text(
        f"SLURMHEALTH_NODE='gpu 42'\r\nSLURMHEALTH_FLEET_DB=$(touch {marker})\n"
        f"SLURMHEALTH_X=1; touch {marker}\nexit 1\n"
    )
    env = {k: v for k, v in periodic_env.items() if k != "SLURMHEALTH_NODE"}
    done = periodic(env, "-n", "export")
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert "gpu 42.ndjson" in done.stdout
    assert "periodic.env:4: not NAME=VALUE, ignored" in done.stderr


def _aged_report(reports: str, days: int) -> str:
    path = os.path.join(reports, f"slurmhealth-old-{days}.html")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("old")
    then = time.time() - days * 86400 - 3600
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize(("keep", "gone"), [("90", []), ("2w", [20]), ("1d12h", [10, 20])])
def test_the_report_retention_takes_the_clis_durations(periodic_env, keep, gone):
    """SLURMHEALTH_REPORT_KEEP_DAYS: a duration as the command line writes one (2w, 1d12h),
    or a bare number of days, as the file has always said."""
    _node_with_one_run(periodic_env)
    env = dict(periodic_env, SLURMHEALTH_REPORT_KEEP_DAYS=keep)
    merged = run_cli("collect", env["SLURMHEALTH_SPOOL"], "--db", env["SLURMHEALTH_FLEET_DB"])
    assert merged.returncode == 0, merged.stderr
    reports = os.path.join(env["SLURMHEALTH_STATE_DIR"], "reports")
    os.makedirs(reports)
    aged = {days: _aged_report(reports, days) for days in (10, 20)}
    done = periodic(env, "-q", "report")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert sorted(d for d, path in aged.items() if not os.path.exists(path)) == gone


@pytest.mark.parametrize(
    ("name", "value", "job"),
    [
        ("SLURMHEALTH_REPORT_KEEP_DAYS", "90 days", "report"),
        ("SLURMHEALTH_REPORT_KEEP_DAYS", "-1d", "report"),
        ("SLURMHEALTH_SPLAY", "soon", "export"),
        ("SLURMHEALTH_SPLAY", "1m30", "export"),
    ],
)
def test_a_duration_the_periodic_jobs_cannot_read_is_one_line(periodic_env, name, value, job):
    env = dict(periodic_env, **{name: value})
    done = periodic(env, "-n", job)
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert done.stderr == (
        f"slurmhealth-periodic: {name}={value} is not a duration: write e.g. 90d, 2w or 1d12h "
        f"(whole numbers with s, m, h, d or w; a bare number is "
        f"{'days' if 'DAYS' in name else 'seconds'})\n"
    )


def test_the_splay_takes_the_clis_durations(periodic_env):
    env = dict(periodic_env, SLURMHEALTH_SPLAY="1m")
    done = periodic(env, "-n", "export")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.endswith("gpu07.ndjson\n")


def test_periodic_skips_a_run_while_the_previous_one_holds_the_lock(periodic_env):
    _need("flock")
    _node_with_one_run(periodic_env)
    lock = os.path.join(periodic_env["SLURMHEALTH_STATE_DIR"], "periodic-export.lock")
    # The previous run, still going: flock(2) on the same file, as flock(1) takes it.
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = periodic(periodic_env, "-q", "export", timeout=20)
    assert done.returncode == 0
    assert "export skipped" in done.stderr and len(done.stderr.splitlines()) == 1
    assert os.listdir(periodic_env["SLURMHEALTH_SPOOL"]) == []
    assert periodic(periodic_env, "-q", "export").returncode == 0, "the lock outlived its holder"
    assert os.listdir(periodic_env["SLURMHEALTH_SPOOL"]) == ["gpu07.ndjson"]


def test_periodic_never_opens_a_lock_someone_could_plant(periodic_env, tmp_path):
    """The shell's >> follows a symlink: a lock planted as one (or a state folder others may
    write, where one could be) is refused in one line, and its target never created."""
    _node_with_one_run(periodic_env)
    state = periodic_env["SLURMHEALTH_STATE_DIR"]
    target = tmp_path / "etc-nologin"
    os.symlink(target, os.path.join(state, "periodic-export.lock"))
    done = periodic(periodic_env, "-q", "export")
    assert done.returncode == 1 and "refusing" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not target.exists() and os.listdir(periodic_env["SLURMHEALTH_SPOOL"]) == []
    os.unlink(os.path.join(state, "periodic-export.lock"))
    os.chmod(state, 0o777)
    done = periodic(periodic_env, "-q", "export")
    assert done.returncode == 1 and "refusing" in done.stderr
    os.chmod(state, 0o700)
    assert periodic(periodic_env, "-q", "export").returncode == 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("nightly",), 2, "(no job nightly)"),
        ((), 2, "(one job)"),
        (("-x", "report"), 2, "(unknown option -x)"),
        (("export",), 1, "is not a directory"),
        (("collect",), 1, "is not a directory"),
    ],
)
def test_periodic_user_errors_are_one_line(periodic_env, args, code, message):
    periodic_env["SLURMHEALTH_SPOOL"] += "-not-mounted"
    done = periodic(periodic_env, *args)
    assert done.returncode == code
    assert message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not os.path.exists(periodic_env["SLURMHEALTH_SPOOL"]), "a missing spool was created"


@pytest.mark.parametrize("job", ["export", "collect"])
@pytest.mark.parametrize("dry", [(), ("-n",)])
def test_periodic_without_a_spool_set_says_so_instead_of_a_local_one(periodic_env, job, dry):
    """No default spool: a local one would fill on each node while collect reads nothing."""
    del periodic_env["SLURMHEALTH_SPOOL"]
    done = periodic(periodic_env, *dry, job)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "slurmhealth-periodic: SLURMHEALTH_SPOOL is not set: set it in "
        f"{periodic_env['SLURMHEALTH_PERIODIC_ENV']} to the spool every node and the head node"
        " share\n"
    )
    state = periodic_env["SLURMHEALTH_STATE_DIR"]
    assert not os.path.exists(os.path.join(state, "spool"))


def test_periodic_says_when_the_spool_is_read_only_here(periodic_env):
    """As under the export unit's ProtectSystem=strict with the spool outside its
    ReadWritePaths: a read-only bind mount in a private mount namespace."""
    if os.geteuid() != 0:
        require_real("needs root (a private mount namespace)")
    _need("unshare")
    _node_with_one_run(periodic_env)
    spool = shlex.quote(periodic_env["SLURMHEALTH_SPOOL"])
    script = (
        f"mount --bind {spool} {spool} && mount -o remount,bind,ro {spool} && "
        f"exec /bin/sh {shlex.quote(PERIODIC)} -q export"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=periodic_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 and "mount" in done.stderr and "ermission" in done.stderr:
        require_real(f"no private mounts here: {done.stderr.strip()}")
    assert done.returncode == 1
    assert done.stderr == (
        f"slurmhealth-periodic: spool {periodic_env['SLURMHEALTH_SPOOL']} is not writable here"
        f" (under systemd: ReadWritePaths={periodic_env['SLURMHEALTH_SPOOL']} in a drop-in,"
        " systemctl edit slurmhealth-export)\n"
    )
    assert os.listdir(periodic_env["SLURMHEALTH_SPOOL"]) == []


def test_periodic_missing_binary_says_so(periodic_env):
    periodic_env["SLURMHEALTH_BIN"] = "/nonexistent/slurmhealth"
    done = periodic(periodic_env, "lemons")
    assert done.returncode == 1 and "/nonexistent/slurmhealth not found" in done.stderr


def test_periodic_dry_run_runs_nothing(periodic_env):
    _node_with_one_run(periodic_env)
    (export,) = _dry_run(periodic_env, "export")
    assert export[1:5] == ["export", "--incremental", "--since", "2d"]
    assert os.listdir(periodic_env["SLURMHEALTH_SPOOL"]) == []
    assert os.listdir(periodic_env["SLURMHEALTH_STATE_DIR"]) == [], "not even a lock"


def _dry_run(env: dict, job: str) -> list:
    done = periodic(env, "-n", job)
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in done.stdout.splitlines()]


def _parse_with_the_cli(argv: list) -> None:
    """Parse argv as `slurmhealth` would, without running it: a wrong option raises."""
    name, *rest = argv
    group = click.Context(cli, info_name="slurmhealth", **cli.context_settings)  # -h as well
    command = cli.get_command(group, name)
    assert command is not None, f"no command {name}"
    command.make_context(name, rest, parent=group)


def test_periodic_commands_are_ones_the_cli_accepts(periodic_env):
    with open(periodic_env["SLURMHEALTH_PERIODIC_ENV"], "w") as handle:
        handle.write("SLURMHEALTH_MAIL_TO=hpc-admins@example.org\nSLURMHEALTH_SPOOL=/srv/spool\n")
    commands = {job: _dry_run(periodic_env, job) for job in JOBS}
    for argvs in commands.values():
        for argv in argvs:
            assert argv[0] == SLURMHEALTH
            _parse_with_the_cli(argv[1:])
    assert [a[1] for a in commands["collect"]] == ["collect", "publish"]
    assert commands["collect"][0][2] == "/srv/spool" and "--sacct" in commands["collect"][0]
    assert commands["export"][0][-2:] == ["-o", "/srv/spool/gpu07.ndjson"]
    assert commands["report"][0][-2:] == ["--mail-to", "hpc-admins@example.org"]
    assert commands["lemons"] == [[SLURMHEALTH, "lemons", "--apply"]]
    with open(periodic_env["SLURMHEALTH_PERIODIC_ENV"], "a") as handle:
        handle.write("SLURMHEALTH_FLEET_METRICS=/var/lib/prometheus/node-exporter/fleet.prom\n")
    sweep, metrics = _dry_run(periodic_env, "lemons")
    assert sweep[1:] == ["lemons", "--apply"]
    assert metrics[1:3] == ["report", "--since"] and metrics[-3:] == [
        "prom",
        "-o",
        "/var/lib/prometheus/node-exporter/fleet.prom",
    ]
    _parse_with_the_cli(metrics[1:])
    with pytest.raises(click.UsageError):  # the parse above would have caught a wrong option
        _parse_with_the_cli(["report", "--mail", "x"])


def test_periodic_ignores_an_env_file_it_does_not_own(periodic_env):
    if os.geteuid() != 0:
        require_real("needs root to give the env file to another user")
    path = periodic_env["SLURMHEALTH_PERIODIC_ENV"]
    with open(path, "w") as handle:
        handle.write("SLURMHEALTH_MAIL_TO=attacker@example.org\n")
    os.chown(path, 65534, 65534)
    (report,) = _dry_run(periodic_env, "report")
    assert "--mail-to" not in report
    done = periodic(periodic_env, "-n", "report")  # and says so, where it was silent
    assert f"{path} ignored: it is not owned by root" in done.stderr


# -- the hook's env file: its values run as root ----------------------------------------------

HOOK = os.path.join(PACKAGING, "slurmhealth-hook")


@pytest.fixture
def user():
    """A real unprivileged account (useradd), gone again after the test; root only."""
    if os.geteuid() != 0:
        require_real("needs root to create a user and to run the hook as slurmd does")
    _need("useradd", "userdel", "runuser")
    name = f"shtest-{os.urandom(3).hex()}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def etc():
    """/etc/slurm in a directory every user can reach: slurm.conf's directory (0755, root),
    a root-owned program for SLURMHEALTH_BIN that leaves a mark, and a user's program that
    would too. Removed after."""
    base = tempfile.mkdtemp(prefix="slurmhealth-hook-")
    os.chmod(base, 0o755)
    slurm = os.path.join(base, "slurm")
    os.mkdir(slurm, 0o755)
    for name in ("ours", "theirs"):
        with open(os.path.join(base, name), "w") as handle:
            handle.write(f'#!/bin/sh\necho "$0 $1" > {base}/ran-{name}\n')
        os.chmod(os.path.join(base, name), 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def hook(etc: str) -> subprocess.CompletedProcess:
    """The hook as slurmd runs a prolog: /bin/sh, no PATH, SLURM_CONF and the context only."""
    env = {"SLURM_CONF": os.path.join(etc, "slurm", "slurm.conf")}
    env["SLURM_SCRIPT_CONTEXT"] = "prolog_slurmd"
    return subprocess.run(["/bin/sh", HOOK], env=env, capture_output=True, text=True, timeout=30)


def _env_file(etc: str, mode: int = 0o644) -> str:
    path = os.path.join(etc, "slurm", "slurmhealth.env")
    with open(path, "w") as handle:
        handle.write(f"SLURMHEALTH_BIN={etc}/ours\n")
    os.chmod(path, mode)
    return path


def test_the_hook_script_help_never_acts(etc):
    """`--help` prints what the script does and runs nothing (it used to ignore its
    arguments and run a real prolog); any other argument is one line, exit 2."""
    _env_file(etc)
    env = {"SLURM_CONF": os.path.join(etc, "slurm", "slurm.conf")}
    env["SLURM_SCRIPT_CONTEXT"] = "prolog_slurmd"
    for flag in ("--help", "-h"):
        done = subprocess.run(["/bin/sh", HOOK, flag], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "takes no arguments" in done.stdout, done.stderr
    done = subprocess.run(["/bin/sh", HOOK, "prolog"], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert not os.path.exists(os.path.join(etc, "ran-ours"))


def test_the_hook_reads_a_root_only_env_file(etc):
    _env_file(etc)
    done = hook(etc)
    assert (done.returncode, done.stderr) == (0, "")
    assert open(os.path.join(etc, "ran-ours")).read() == f"{etc}/ours prolog\n"


def test_a_world_writable_env_file_is_refused_and_the_users_program_never_runs(etc, user):
    path = _env_file(etc, 0o666)  # root-owned: the old check (owner only) let it through
    as_user = ["runuser", "-u", user.pw_name, "--", "sh", "-c"]
    write = f"echo SLURMHEALTH_BIN={etc}/theirs > {path}"
    subprocess.run([*as_user, write], check=True, capture_output=True, timeout=30)
    done = hook(etc)
    assert done.returncode == 0, "fail open: a suspicious install never drains the node"
    assert done.stderr == (
        f"slurmhealth: {path} not read: writable by group or others (-rw-rw-rw-): prolog skipped\n"
    )
    assert not os.path.exists(os.path.join(etc, "ran-theirs")), "the user's program ran as root"
    assert not os.path.exists(os.path.join(etc, "ran-ours")), "nothing runs"


@pytest.mark.parametrize("fault", ["group-writable", "directory", "symlink", "owner"])
def test_an_env_file_someone_else_could_have_written_is_refused_loudly(etc, fault):
    if fault == "owner" and os.geteuid() != 0:
        require_real("needs root to give the env file to another user")
    path = _env_file(etc)
    why = {
        "group-writable": "writable by group or others (-rw-rw-r--)",
        "directory": f"its directory {etc}/slurm is writable by group or others (drwxrwxrwt)",
        "symlink": "a symlink",
        "owner": "owned by uid 65534, not root",
    }[fault]
    if fault == "group-writable":
        os.chmod(path, 0o664)
    elif fault == "directory":
        os.chmod(os.path.dirname(path), 0o1777)
    elif fault == "symlink":
        os.rename(path, os.path.join(etc, "real.env"))
        os.symlink(os.path.join(etc, "real.env"), path)
    else:
        os.chown(path, 65534, 65534)
    done = hook(etc)
    assert done.returncode == 0
    assert done.stderr == f"slurmhealth: {path} not read: {why}: prolog skipped\n"
    assert "ran-ours" not in os.listdir(etc), "nothing runs"


def _program(etc: str, name: str, body: str) -> str:
    path = os.path.join(etc, name)
    with open(path, "w") as handle:
        handle.write(f"#!/bin/sh\n{body}\n")
    os.chmod(path, 0o755)
    return path


def _env_lines(etc: str, text: str) -> None:
    path = os.path.join(etc, "slurm", "slurmhealth.env")
    with open(path, "w", newline="") as handle:
        handle.write(text)
    os.chmod(path, 0o644)


def test_the_env_file_is_read_never_run_as_shell(etc):
    """Its lines are NAME=VALUE, read: text in it never runs as root, and a typo (a stray quote,
    an `exit 1`, a CRLF, a BOM) never fails the prolog, which would make slurmd drain the node."""
    marker = os.path.join(etc, "injected")
    shows = _program(etc, "shows", f'echo "$SLURMHEALTH_CONFIG|$EXTRA" > {etc}/seen')
    lines = [
        "# a comment",
        f"SLURMHEALTH_BIN={shows}\r",
        "export SLURMHEALTH_CONFIG='/etc/slurmhealth/my config.toml'",
        'EXTRA="a b"',
        f"SLURMHEALTH_X=$(touch {marker})",
        f"SLURMHEALTH_Y=1; touch {marker}",
        "exit 1",
        'SLURMHEALTH_Z="unbalanced',
        "\ufeffBOM=1",
        "not a setting",
    ]
    _env_lines(etc, "\n".join(lines) + "\n")
    done = hook(etc)
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(marker), "text in the env file ran as root"
    assert open(os.path.join(etc, "seen")).read() == "/etc/slurmhealth/my config.toml|a b\n"
    ignored = [line for line in done.stderr.splitlines() if "ignored" in line]
    assert [line.split(":")[-2] for line in ignored] == ["7", "9", "10"]


@pytest.mark.parametrize(
    ("body", "code", "said"),
    [
        ("exit 10", 1, ""),  # the verdict: the job is refused
        ("exit 0", 0, ""),
        ("exit 1", 0, "ended with status 1, not a verdict"),  # a traceback exits 1 too
        ("exec /nonexistent/python3", 0, "ended with status 127, not a verdict"),
        ("kill -9 $$", 0, "ended with status 137, not a verdict"),
    ],
)
def test_only_the_verdict_refuses_the_job(etc, body, code, said):
    """slurmd drains the node on any non-zero prolog: a venv whose Python is gone, a
    half-upgraded install's traceback or a crash must not pass for a failing check. The
    verdict says itself with status 10 ($SLURMHEALTH_REFUSE_STATUS, which the hook sets)."""
    program = _program(etc, "bin", f'[ "$SLURMHEALTH_REFUSE_STATUS" = 10 ] || exit 3\n{body}')
    _env_lines(etc, f"SLURMHEALTH_BIN={program}\n")
    done = hook(etc)
    assert done.returncode == code, done.stderr
    assert said in done.stderr and (said or done.stderr == "")


def test_a_slurmhealth_bin_that_is_a_directory_is_skipped(etc):
    _env_lines(etc, f"SLURMHEALTH_BIN={etc}\n")
    done = hook(etc)
    assert done.returncode == 0
    assert done.stderr == f"slurmhealth: {etc} is not an executable file: prolog skipped\n"


def healthcheck(etc: str, context: str | None = None) -> subprocess.CompletedProcess:
    """The hook as slurmd runs HealthCheckProgram: /bin/sh, no PATH, no script context."""
    env = {"SLURM_CONF": os.path.join(etc, "slurm", "slurm.conf")}
    if context:
        env["SLURM_SCRIPT_CONTEXT"] = context
    return subprocess.run(["/bin/sh", HOOK], env=env, capture_output=True, text=True, timeout=90)


def _ours_and_nhc(etc: str, ours: str, nhc: str) -> None:
    """slurmhealth and a stand-in NHC that each write one line to `ran` (NHC: its parent's
    name), then exit as told; the env file names both."""
    ran = os.path.join(etc, "ran")
    bin_ = _program(etc, "bin", f'echo "ours $1 $SLURMHEALTH_REFUSE_STATUS" >> {ran}\n{ours}')
    site = _program(etc, "nhc", f'echo "nhc $(cat /proc/$PPID/comm)" >> {ran}\n{nhc}')
    _env_lines(etc, f"SLURMHEALTH_BIN={bin_}\nSLURMHEALTH_SITE_HEALTHCHECK={site}\n")


def _ran(etc: str) -> list:
    with open(os.path.join(etc, "ran")) as handle:
        return handle.read().splitlines()


@pytest.mark.parametrize(
    ("ours", "nhc", "code", "said"),
    [
        ("exit 0", "exit 0", 0, ""),
        ("exit 10", "exit 0", 1, ""),  # our verdict: the node is sick
        ("exit 0", "exit 1", 1, ""),  # NHC's: it drained the node itself
        ("exit 10", "exit 3", 1, ""),
        ("exit 1", "exit 0", 0, "ended with status 1, not a verdict"),  # our crash: fail open
        ("kill -9 $$", "exit 3", 3, "ended with status 137, not a verdict"),
    ],
)
def test_the_health_check_runs_the_sites_own_after_ours(etc, ours, nhc, code, said):
    """HealthCheckProgram takes one program: the hook runs slurmhealth's health check, then the
    site's (NHC) under timeout(1), whatever the first one said; the status is the first
    verdict that failed (slurmd only logs it: each program drains by itself)."""
    _ours_and_nhc(etc, ours, nhc)
    done = healthcheck(etc)
    assert done.returncode == code, done.stderr
    assert said in done.stderr and (said or done.stderr == "")
    assert _ran(etc) == ["ours healthcheck 10", "nhc timeout"]


def test_the_sites_health_check_runs_even_when_ours_cannot(etc):
    _ours_and_nhc(etc, "exit 0", "exit 0")
    os.remove(os.path.join(etc, "bin"))
    done = healthcheck(etc)
    assert done.returncode == 0
    assert done.stderr == f"slurmhealth: {etc}/bin not found: healthcheck skipped\n"
    assert _ran(etc) == ["nhc timeout"]


def test_the_sites_health_check_is_never_run_by_the_prolog_or_epilog(etc):
    _ours_and_nhc(etc, "exit 0", "exit 0")
    for context in ("prolog_slurmd", "epilog_slurmd"):
        assert healthcheck(etc, context).returncode == 0
    assert _ran(etc) == ["ours prolog 10", "ours epilog 10"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("nhc", "SLURMHEALTH_SITE_HEALTHCHECK=nhc is not an absolute path: not run"),
        ("/nonexistent/nhc", "/nonexistent/nhc is not an executable file: not run"),
    ],
)
def test_a_site_health_check_that_cannot_run_is_said_and_ours_still_runs(etc, value, said):
    _ours_and_nhc(etc, "exit 0", "exit 0")
    _env_lines(etc, f"SLURMHEALTH_BIN={etc}/bin\nSLURMHEALTH_SITE_HEALTHCHECK={value}\n")
    done = healthcheck(etc)
    assert done.returncode == 2
    assert done.stderr == f"slurmhealth: {said}\n"
    assert _ran(etc) == ["ours healthcheck 10"]


NHC_FAILED = "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted"


def _real_slurmhealth_and_nhc(etc: str, nhc: str) -> None:
    """The real slurmhealth (this checkout, by its Python) as SLURMHEALTH_BIN, on a healthy
    snapshot, monitor-only (no Slurm to call), with a stand-in NHC that prints in NHC's format
    and says who ran it (its parent's name) in `ran`."""
    ran = os.path.join(etc, "ran")
    bin_ = _program(etc, "bin", f'PYTHONPATH={ROOT} exec {sys.executable} -m slurmhealth "$@"')
    site = _program(etc, "nhc", f'echo "nhc $(cat /proc/$PPID/comm)" >> {ran}\n{nhc}')
    config = os.path.join(etc, "slurmhealth.toml")
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    with open(config, "w") as handle:
        handle.write(
            f'[settings]\ngpu_source = "{snapshot_path("healthy")}"\n'
            f'sysfs_root = "{fixtures}/sysfs/healthy-8x-ndr"\n'
            f'kmsg = "{fixtures}/kmsg/healthy.kmsg"\nmonitor_only = true\n'
        )
    os.chmod(config, 0o600)
    _env_lines(etc, f"SLURMHEALTH_BIN={bin_}\nSLURMHEALTH_SITE_HEALTHCHECK={site}\n"
                    f"SLURMHEALTH_CONFIG={config}\nSLURMHEALTH_STATE_DIR={etc}/state\n"
                    "SLURMD_NODENAME=gpu01\n")


@pytest.mark.parametrize(
    ("nhc", "code", "status", "message"),
    [
        ("exit 0", 0, "ok", "nhc passed"),
        (f"echo '{NHC_FAILED}'\nexit 1", 1, "warn",
         "nhc failed (exit 1): check_fs_mount: /scratch not mounted"),
    ],
)
def test_slurmhealth_runs_the_sites_health_check_once_and_records_its_verdict(
    etc, nhc, code, status, message
):
    """The health check runs NHC itself (its parent is slurmhealth's Python, not the hook's
    timeout), records its verdict as site.program, and tells the hook, which does not run it
    again; the status is non-zero when NHC failed."""
    _real_slurmhealth_and_nhc(etc, nhc)
    done = healthcheck(etc)
    assert done.returncode == code, done.stderr
    assert _ran(etc) == [f"nhc {os.path.basename(sys.executable)[:15]}"]
    with contextlib.closing(sqlite3.connect(os.path.join(etc, "state", "gpu01.db"))) as conn:
        phases = conn.execute("SELECT phase, verdict FROM runs").fetchall()
        rows = conn.execute(
            "SELECT status, message, action FROM results WHERE check_name = 'site.program'"
        ).fetchall()
    assert phases[-1][0] == "healthcheck"
    # only what is not ok is kept per check (runner.Run.records)
    assert rows == ([] if status == "ok" else [(status, message, "none")])


def test_the_prolog_never_runs_the_sites_health_check_through_slurmhealth(etc):
    _real_slurmhealth_and_nhc(etc, "exit 1")
    env = {"SLURM_CONF": os.path.join(etc, "slurm", "slurm.conf"),
           "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": "7"}
    done = subprocess.run(["/bin/sh", HOOK], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(os.path.join(etc, "ran"))


def test_the_hook_reads_both_verdicts_from_slurmhealths_status(etc):
    """20 to 23: slurmhealth ran the site's check; +1 its own refusal, +2 the site's failure.
    The hook does not run the site's check again and exits non-zero when either failed."""
    for status, code in ((20, 0), (21, 1), (22, 1), (23, 1)):
        ours = f'[ "$SLURMHEALTH_SITE_STATUS" = 20 ] || exit 3\nexit {status}'
        _ours_and_nhc(etc, ours, "exit 0")
        if os.path.exists(os.path.join(etc, "ran")):
            os.remove(os.path.join(etc, "ran"))
        done = healthcheck(etc)
        assert (done.returncode, done.stderr) == (code, ""), status
        assert _ran(etc) == ["ours healthcheck 10"], "the site's check ran twice"


def test_the_agent_gives_the_refuse_status_the_hook_asks_for(monkeypatch):
    from slurmhealth.node import agent

    assert agent.hook_status(1) == 1  # run by hand: 1 as always
    assert agent.hook_status(1, "sick") == 1  # the script did not ask
    monkeypatch.setenv("SLURMHEALTH_REFUSE_STATUS", "10")
    assert (agent.hook_status(1), agent.hook_status(0), agent.hook_status(2)) == (10, 0, 2)
    monkeypatch.setenv("SLURMHEALTH_SITE_STATUS", "20")
    got = [agent.hook_status(c, s) for c in (0, 1) for s in ("ok", "sick")]
    assert got == [20, 22, 21, 23]
    assert (agent.hook_status(1, None), agent.hook_status(2, "sick")) == (10, 2)
    monkeypatch.setenv("SLURMHEALTH_REFUSE_STATUS", "0")  # nonsense: ignored
    assert agent.hook_status(1) == 1


def test_the_refusal_goes_to_syslog_too(etc):
    """The same line through logger(1), by its absolute path: a stand-in bind-mounted over
    /usr/bin/logger in a private mount namespace records what the hook gave it."""
    if os.geteuid() != 0:
        require_real("needs root (a private mount namespace)")
    _need("unshare")
    if not os.path.exists("/usr/bin/logger"):
        require_real("no /usr/bin/logger to stand in for (bsdutils, util-linux)")
    path = _env_file(etc, 0o666)
    stand_in = os.path.join(etc, "logger")
    with open(stand_in, "w") as handle:
        handle.write(f'#!/bin/sh\nprintf "%s|" "$@" > {etc}/logged\n')
    os.chmod(stand_in, 0o755)
    script = f"mount --bind {shlex.quote(stand_in)} /usr/bin/logger && /bin/sh {shlex.quote(HOOK)}"
    env = {"SLURM_CONF": os.path.join(etc, "slurm", "slurm.conf"), "PATH": os.environ["PATH"]}
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0 and "mount" in done.stderr and "ermission" in done.stderr:
        require_real(f"no private mounts here: {done.stderr.strip()}")
    assert done.returncode == 0 and len(done.stderr.splitlines()) == 1, done.stderr
    with open(os.path.join(etc, "logged")) as handle:
        logged = handle.read().split("|")
    line = f"{path} not read: writable by group or others (-rw-rw-rw-): healthcheck skipped"
    assert logged == ["-t", "slurmhealth", "-p", "daemon.err", "--", line, ""]


# -- systemd units ------------------------------------------------------------------------------


def read_unit(path: str) -> dict:
    """{section: {key: [values]}}: systemd's syntax (repeated keys add up), comments dropped."""
    sections: dict = {}
    current = None
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), {})
                continue
            key, sep, value = line.partition("=")
            assert sep and current is not None, f"{path}: not key=value: {line}"
            current.setdefault(key, []).append(value)
    return sections


HARDENING = {
    "ProtectSystem": "strict",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "NoNewPrivileges": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "UMask": "0077",
}


@pytest.mark.parametrize("job", JOBS)
def test_each_job_has_a_hardened_oneshot_service_and_a_timer(job):
    service = read_unit(os.path.join(UNITS, f"slurmhealth-{job}.service"))
    timer = read_unit(os.path.join(UNITS, f"slurmhealth-{job}.timer"))
    assert service["Service"]["Type"] == ["oneshot"]
    assert service["Service"]["ExecStart"] == [f"{LIBEXEC}/slurmhealth-periodic {job}"]
    for key, value in HARDENING.items():
        assert service["Service"].get(key) == [value], (job, key)
    assert service["Service"]["ProtectHome"][0] in ("yes", "read-only")
    assert "/var/lib/slurmhealth" in " ".join(service["Service"]["ReadWritePaths"]).split()
    assert "Install" not in service, "the timer starts the service, nothing else"
    assert len(timer["Timer"]["OnCalendar"]) == 1
    assert timer["Install"]["WantedBy"] == ["timers.target"]
    kinds = ("service", "timer")
    assert set(os.listdir(UNITS)) == {f"slurmhealth-{j}.{k}" for j in JOBS for k in kinds}


def test_timers_fire_when_the_cron_entries_do():
    _need("systemd-analyze")
    expected = {
        "collect": "*-*-* *:00/5:00",
        "export": "*-*-* *:00/5:00",
        "report": "*-*-* 06:00:00",
        "lemons": "*-*-* *:17:00",
    }
    entries = cron_entries(_read("packaging", "cron.d", "slurmhealth"))
    cron = {shlex.split(command)[-1]: fields for fields, command, _ in entries}
    assert cron["lemons"][0] == "17", "the hourly sweep runs at the same minute in both"
    for job, normalized in expected.items():
        timer = read_unit(os.path.join(UNITS, f"slurmhealth-{job}.timer"))
        (calendar,) = timer["Timer"]["OnCalendar"]
        done = subprocess.run(
            ["systemd-analyze", "calendar", calendar], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert f"Normalized form: {normalized}" in done.stdout


def _verify_root(tmp_path, units_dir: str):
    """A root with the host's units, ours, and the script our ExecStart= names."""
    root = tmp_path / "root"
    shutil.copytree("/lib/systemd/system", root / "lib/systemd/system", symlinks=True)
    (root / LIBEXEC.lstrip("/")).mkdir(parents=True)
    shutil.copy2(PERIODIC, root / LIBEXEC.lstrip("/") / "slurmhealth-periodic")
    ours = []
    for name in sorted(os.listdir(units_dir)):
        shutil.copy(os.path.join(units_dir, name), root / "lib/systemd/system" / name)
        ours.append(str(root / "lib/systemd/system" / name))
    return root, ours


def _verify(root, units: list) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", *units],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_systemd_analyze_verify_is_clean(tmp_path):
    _need("systemd-analyze")
    if not os.path.isdir("/lib/systemd/system"):
        require_real("no /lib/systemd/system to verify against (apt-get install systemd)")
    root, units = _verify_root(tmp_path, UNITS)
    done = _verify(root, units)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    # The same harness sees a unit's mistake: it is not clean by accident.
    with open(units[0], "a") as handle:
        handle.write("ProtectSytem=strict\n")
    done = _verify(root, units)
    assert "Unknown key" in done.stderr and "ProtectSytem" in done.stderr


# -- example files --------------------------------------------------------------------------------


def _toml():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    return tomllib


def uncommented(text: str) -> str:
    """The example with every commented TOML line switched on (values shown as ... stay off)."""
    lines = []
    for line in text.splitlines():
        body = line[2:] if line.startswith("# ") else None
        is_toml = body is not None and (
            body.startswith("[") or re.match(r"[A-Za-z_][\w.]* = (?!\.\.\.)", body)
        )
        lines.append(body if is_toml else line)
    return "\n".join(lines) + "\n"


def test_example_toml_is_the_catalogue_and_every_shown_default_is_the_real_one():
    text = _read("packaging", "slurmhealth.toml")
    tomllib = _toml()
    assert set(tomllib.loads(text)) == set(config.defaults()) - {"checks"}
    switched_on = tomllib.loads(uncommented(text))
    config.parse(uncommented(text), "slurmhealth.toml")
    assert set(switched_on["checks"]) == set(REGISTRY)
    assert switched_on["node"][0]["match"]
    for section, values in config.defaults().items():
        if section == "checks":
            continue
        shown = {k: v for k, v in values.items() if v is not None}
        assert switched_on[section] == shown, section


SLURM_BASE = """ClusterName=packaging
SlurmctldHost=localhost(127.0.0.1)
NodeName=gpu01 CPUs=1 State=UNKNOWN
PartitionName=gpu Nodes=gpu01 Default=YES
"""


def _slurm_parses(tmp_path, text: str) -> subprocess.CompletedProcess:
    """Slurm's own parser reads the file: `scontrol show hostnames` needs no controller."""
    path = tmp_path / "slurm.conf"
    path.write_text(text)
    return subprocess.run(
        ["scontrol", "show", "hostnames", "gpu[01-02]"],
        env=dict(os.environ, SLURM_CONF=str(path)),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_slurm_conf_example_is_a_snippet_slurm_accepts(tmp_path):
    _need("scontrol")
    example = _read("packaging", "slurm.conf.example")
    done = _slurm_parses(tmp_path, SLURM_BASE + example)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.split() == ["gpu01", "gpu02"]
    done = _slurm_parses(tmp_path, SLURM_BASE + example + "HealthCheckIntreval=300\n")
    assert done.returncode != 0 and "unrecognized key: HealthCheckIntreval" in done.stderr
    hook = re.search(r"^HealthCheckProgram=(\S+)", example, re.M).group(1)
    assert hook == f"{LIBEXEC}/slurmhealth-hook", "the path the packages install"


def test_package_versions_agree_with_the_code():
    changelog = _read("packaging", "debian", "changelog").splitlines()[0]
    assert changelog.startswith(f"slurmhealth ({__version__}-")
    spec = _read("packaging", "rpm", "slurmhealth.spec")
    assert re.search(r"^Version:\s+(\S+)$", spec, re.M).group(1) == __version__
    assert f"- {__version__}-" in spec.split("%changelog", 1)[1].splitlines()[1]


# -- the packages, built for real -----------------------------------------------------------------


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """Both packages, built once from a copy of this tree by packaging/build-packages."""
    _need("dpkg-buildpackage", "dh", "dh_python3", "rpmbuild", "rpm2archive")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [os.path.join(PACKAGING, "build-packages"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = os.listdir(out)
    (deb,) = [n for n in names if n.endswith(".deb")]
    (rpm,) = [n for n in names if n.endswith(".rpm")]
    return {"deb": str(out / deb), "rpm": str(out / rpm), "dir": out}


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _source_files(top: str) -> set:
    """Package files relative to slurmhealth/: every module and template the wheel must carry."""
    found = set()
    for folder, dirs, files in os.walk(os.path.join(ROOT, "slurmhealth", top)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(folder, os.path.join(ROOT, "slurmhealth"))
        found |= {os.path.normpath(os.path.join(rel, f)) for f in files if not f.endswith(".pyc")}
    return found


def _test_only(paths: set) -> set:
    """Installed paths of what only tests, benchmarks and the demo use (sim/, the simulated
    fleet): none may ship."""
    return {p for p in paths if "/sim/" in p or p.startswith("sim/") or "simulate" in p}


def test_the_test_only_filter_sees_the_simulator():
    """The filter's own control: what a package would hold if sim/ shipped."""
    assert _test_only({"/usr/lib/python3/dist-packages/sim/simulate.py", "sim/__init__.py"}) == {
        "/usr/lib/python3/dist-packages/sim/simulate.py",
        "sim/__init__.py",
    }
    assert _test_only({"slurmhealth/fleet/policy.py"}) == set()


def _common_paths(sitelib: str, units: str, doc: str) -> set:
    return {
        "/usr/bin/slurmhealth",
        f"{LIBEXEC}/slurmhealth-hook",
        f"{LIBEXEC}/slurmhealth-periodic",
        "/etc/cron.d/slurmhealth",
        "/etc/slurmhealth/periodic.env",
        "/usr/share/slurmhealth/prometheus/slurmhealth-alerts.yml",
        f"{doc}/README.md",
        f"{doc}/packaging.md",
        f"{doc}/examples/slurmhealth.toml",
        f"{doc}/examples/slurm.conf.example",
        *(f"{units}/{name}" for name in os.listdir(UNITS)),
        *(f"{sitelib}/slurmhealth/{f}" for f in _source_files(".")),
    }


def test_deb_carries_the_package_hooks_units_cron_and_docs(packages):
    listing = _run("dpkg-deb", "-c", packages["deb"])
    paths = {line.split()[5].lstrip(".") for line in listing.splitlines()}
    expected = _common_paths(
        "/usr/lib/python3/dist-packages", "/lib/systemd/system", "/usr/share/doc/slurmhealth"
    )
    assert expected - paths == set()
    assert _test_only(paths) == set()
    modes = {line.split()[5].lstrip("."): line.split()[0] for line in listing.splitlines()}
    assert modes[f"{LIBEXEC}/slurmhealth-hook"] == "-rwxr-xr-x"
    assert modes["/usr/bin/slurmhealth"] == "-rwxr-xr-x"


def test_deb_control_depends_on_python_click_jinja2_and_not_on_nvml(packages):
    fields = {
        name: _run("dpkg-deb", "-f", packages["deb"], name).strip()
        for name in ("Version", "Depends", "Recommends", "Architecture")
    }
    assert fields["Version"] == f"{__version__}-1" and fields["Architecture"] == "all"
    depends = [d.strip() for d in fields["Depends"].split(",")]
    assert {"python3 (>= 3.9)", "python3-click", "python3-jinja2"} <= set(depends)
    assert "nvml" not in fields["Depends"].lower()
    # Live GPU checks use our own binding over the driver's library: no Python NVML bindings.
    control = _run("dpkg-deb", "-f", packages["deb"])
    assert "\nSuggests:" not in control and "pynvml" not in control, control
    assert "nvidia-ml-py" not in control and "libnvidia-ml.so.1" in control, control
    info = _run("dpkg-deb", "-I", packages["deb"])
    assert "conffiles" in info and "postinst" in info
    conffiles = subprocess.run(
        ["dpkg-deb", "--ctrl-tarfile", packages["deb"]], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(conffiles)) as tar:
        listed = tar.extractfile("./conffiles").read().decode().split()
        postinst = tar.extractfile("./postinst").read().decode()
    assert {"/etc/cron.d/slurmhealth", "/etc/slurmhealth/periodic.env"} <= set(listed)
    assert _read("packaging", "debian", "postinst").split("#DEBHELPER#")[0] in postinst
    assert "deb-systemd-invoke start" not in postinst, "timers are the admin's to enable"


def test_deb_postinst_creates_the_state_dir_root_only(tmp_path):
    """The source postinst (dh's snippets aside) run for real, /var/lib on a private tmpfs."""
    if os.geteuid() != 0:
        require_real("needs root (a private mount namespace)")
    _need("unshare")
    postinst = os.path.join(PACKAGING, "debian", "postinst")
    script = (
        "mount -t tmpfs tmpfs /var/lib && "
        f"sh {shlex.quote(postinst)} configure && stat -c '%a %U %G' /var/lib/slurmhealth && "
        "chmod 755 /var/lib/slurmhealth && "
        f"sh {shlex.quote(postinst)} configure && stat -c '%a' /var/lib/slurmhealth"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0 and "mount" in done.stderr and "ermission" in done.stderr:
        require_real(f"no private mounts here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["700 root root", "755"], "an admin's choice is kept"


def _extracted_deb(packages, tmp_path) -> str:
    root = str(tmp_path / "deb")
    _run("dpkg-deb", "-x", packages["deb"], root)
    return root


def _extracted_rpm(packages, tmp_path) -> str:
    copy = str(tmp_path / "slurmhealth.rpm")
    shutil.copy(packages["rpm"], copy)
    _run("rpm2archive", copy)
    root = str(tmp_path / "rpm")
    with tarfile.open(copy + ".tgz") as tar:
        tar.extractall(root)
    return root


def _interpreter(root: str, sitelib: str, el9: dict | None = None) -> tuple:
    """(argv, env) of a Python that sees the packaged package: this interpreter (it has click),
    or with `el9` Python 3.9 with -S (no site-packages of its own) and EL9's libraries."""
    if el9 is None:
        return [sys.executable], dict(os.environ, PYTHONPATH=root + sitelib)
    return [el9["python"], "-S"], dict(os.environ, PYTHONPATH=f"{root}{sitelib}:{el9['site']}")


def _packaged_run(
    root: str, sitelib: str, *args: str, el9: dict | None = None
) -> subprocess.CompletedProcess:
    """The packaged /usr/bin/slurmhealth and package."""
    argv, env = _interpreter(root, sitelib, el9)
    return subprocess.run(
        [*argv, root + "/usr/bin/slurmhealth", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )


def _report_from_packaged_code(root: str, sitelib: str, tmp_path, el9: dict | None = None) -> None:
    where = _packaged_run(root, sitelib, "--version", el9=el9)
    assert where.returncode == 0 and __version__ in where.stdout, where.stderr
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    fleet = str(tmp_path / "fleet.db")
    done = _packaged_run(root, sitelib, "collect", str(spool), "--db", fleet, el9=el9)
    assert done.returncode == 0, done.stderr
    done = _packaged_run(root, sitelib, "report", "--db", fleet, "--format", "html", el9=el9)
    assert done.returncode == 0 and "<html" in done.stdout.lower(), done.stderr
    argv, env = _interpreter(root, sitelib, el9)
    probe = subprocess.run(
        [*argv, "-c", "import slurmhealth.report.build as r; print(r.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert probe.stdout.startswith(root + sitelib), "ran the packaged code, not the checkout"


def test_deb_payload_runs_and_renders_a_report(packages, tmp_path):
    root = _extracted_deb(packages, tmp_path)
    _report_from_packaged_code(root, "/usr/lib/python3/dist-packages", tmp_path)


def _rpm_query(packages, *args: str) -> list:
    return _run("rpm", "-qp", *args, packages["rpm"]).splitlines()


def test_rpm_carries_the_package_hooks_units_cron_and_docs(packages):
    listing = _rpm_query(packages, "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]")
    modes = {line.split()[1]: line.split()[0] for line in listing}
    (init,) = [p for p in modes if p.endswith("/site-packages/slurmhealth/__init__.py")]
    assert init == f"{EL9_SITELIB}/slurmhealth/__init__.py", "EL9's python3 reads only its own"
    expected = _common_paths(EL9_SITELIB, "/usr/lib/systemd/system", "/usr/share/doc/slurmhealth")
    assert expected - set(modes) == set()
    assert _test_only(set(modes)) == set()
    assert modes["/var/lib/slurmhealth"] == "drwx------"
    assert modes[f"{LIBEXEC}/slurmhealth-hook"] == "-rwxr-xr-x"
    configs = set(_rpm_query(packages, "-c"))
    assert {"/etc/cron.d/slurmhealth", "/etc/slurmhealth/periodic.env"} <= configs


def test_rpm_requires_python_click_jinja2_and_not_nvml(packages):
    requires = set(_rpm_query(packages, "--requires"))
    # python(abi) comes from rpm's generator reading the path: EL9's python3 provides 3.9.
    el9 = {"python(abi) = 3.9", "python3 >= 3.9", "python3-click >= 7.1", "python3-jinja2 >= 2.11"}
    assert el9 <= requires, requires
    assert not [r for r in requires if r.startswith("python(abi)") and r not in el9], requires
    assert not [r for r in requires if "nvidia" in r or "dist(" in r], requires
    # Live GPU checks use our own binding over the driver's library: no Python NVML bindings.
    assert _rpm_query(packages, "--suggests") == []
    version = _rpm_query(packages, "--qf", "%{VERSION}")
    assert version == [__version__]


def test_rpm_payload_runs_and_renders_a_report_on_el9s_python_click_and_jinja2(
    packages, el9, tmp_path
):
    root = _extracted_rpm(packages, tmp_path)
    with open(root + "/usr/bin/slurmhealth") as handle:
        assert handle.readline() == "#!/usr/bin/python3 -s\n", "EL9's python3, no user site"
        assert "from slurmhealth.__main__ import main" in handle.read()
    argv, env = _interpreter(root, EL9_SITELIB, el9)
    probe = "import sys, click, jinja2, markupsafe as m; print(sys.version[:3], click.__version__,"
    probe += " jinja2.__version__, m.__version__)"
    done = subprocess.run([*argv, "-c", probe], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["3.9", "7.1.2", "2.11.3", "1.1.1"], done.stdout + done.stderr
    usage = _packaged_run(root, EL9_SITELIB, "--help", el9=el9)
    assert usage.returncode == 0 and "history" in usage.stdout, usage.stderr
    healthy = snapshot_path("healthy")
    done = _packaged_run(root, EL9_SITELIB, "check", "--no-db", "--gpu-source", healthy, el9=el9)
    assert done.returncode == 0 and re.search(r"^node \S+: ok", done.stdout, re.M), done.stdout
    lost = snapshot_path("gpu-lost")
    done = _packaged_run(root, EL9_SITELIB, "check", "--no-db", "--gpu-source", lost, el9=el9)
    assert done.returncode == 1 and "GPU 3 GpuIsLost" in done.stdout, done.stdout + done.stderr
    _report_from_packaged_code(root, EL9_SITELIB, tmp_path, el9)


def test_rpm_hook_runs_a_prolog_on_el9s_python(packages, el9, tmp_path):
    """The packaged hook, as slurmd runs it, starts the packaged command on EL9's Python 3.9
    (SLURMHEALTH_BIN: a two-line stand-in for /usr/bin/slurmhealth whose interpreter is that
    Python instead of this host's python3), which reads its TOML config with EL9's tomli."""
    root = _extracted_rpm(packages, tmp_path)
    argv, env = _interpreter(root, EL9_SITELIB, el9)
    launcher = tmp_path / "slurmhealth"
    command = shlex.join([*argv, root + "/usr/bin/slurmhealth"])
    pythonpath = shlex.quote(env["PYTHONPATH"])
    launcher.write_text(f'#!/bin/sh\nPYTHONPATH={pythonpath} exec {command} "$@"\n')
    launcher.chmod(0o755)
    done = _prolog(root, tmp_path, {"SLURMHEALTH_BIN": str(launcher)})
    assert (done.returncode, done.stderr) == (0, "")
    assert _runs(str(tmp_path / "state" / "gpu07.db")) == [("gpu07", "1", "prolog", "ok")]


def _prolog(root: str, where, env: dict) -> subprocess.CompletedProcess:
    """ROOT's hook as slurmd runs a prolog (no PATH), its config and store in `where`."""
    (where / "state").mkdir()
    config_file = where / "slurmhealth.toml"
    config_file.write_text(f'[settings]\ngpu_source = "{snapshot_path("healthy")}"\n')
    env = {
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURM_CONF": str(where / "slurm" / "slurm.conf"),
        "SLURMD_NODENAME": "gpu07",
        "SLURM_JOB_ID": "1",
        "SLURMHEALTH_CONFIG": str(config_file),
        "SLURMHEALTH_STATE_DIR": str(where / "state"),
        **env,
    }
    hook_path = root + f"{LIBEXEC}/slurmhealth-hook"
    return subprocess.run(
        ["/bin/sh", hook_path], env=env, capture_output=True, text=True, timeout=60
    )


def _runs(path: str) -> list:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT node, job_id, phase, verdict FROM runs").fetchall()


def test_periodic_collect_publishes_unless_switched_off(periodic_env):
    commands = [argv[1] for argv in _dry_run(periodic_env, "collect")]
    assert commands == ["collect", "publish"]
    off = dict(periodic_env, SLURMHEALTH_PUBLISH="no")
    assert [argv[1] for argv in _dry_run(off, "collect")] == ["collect"]


def test_periodic_collect_reads_accounting_unless_the_site_has_none(periodic_env):
    """SLURMHEALTH_ACCOUNTING=no (no slurmdbd): collect without --sacct, which would fail each
    cycle after merging the spool; the command is still one the CLI accepts."""
    (collect, _) = _dry_run(periodic_env, "collect")
    assert "--sacct" in collect
    with open(periodic_env["SLURMHEALTH_PERIODIC_ENV"], "a") as handle:
        handle.write("SLURMHEALTH_ACCOUNTING=no\n")
    (collect, _) = _dry_run(periodic_env, "collect")
    assert "--sacct" not in collect
    assert collect[1:3] == ["collect", periodic_env["SLURMHEALTH_SPOOL"]]
    _parse_with_the_cli(collect[1:])


def test_periodic_notifies_a_webhook_after_collect_and_the_sweep(periodic_env):
    secret = "https://hooks.example.org/services/T000/B000/secretkey"
    with open(periodic_env["SLURMHEALTH_PERIODIC_ENV"], "a") as handle:
        handle.write(f"SLURMHEALTH_WEBHOOK_URL={secret}\nSLURMHEALTH_WEBHOOK_FORMAT=slack\n")
    collect = _dry_run(periodic_env, "collect")
    sweep = _dry_run(periodic_env, "lemons")
    assert [a[1] for a in collect] == ["collect", "publish", "notify"]
    assert [a[1] for a in sweep] == ["lemons", "notify"]
    assert sweep[-1][1:] == ["notify", "--format", "slack"]
    _parse_with_the_cli([*sweep[-1][1:], "--url", secret])
    # the URL (a secret key) travels in the environment, never on a command line
    assert not any("secretkey" in " ".join(argv) for argv in collect + sweep)
    off = dict(periodic_env, SLURMHEALTH_PUBLISH="no")
    assert [a[1] for a in _dry_run(off, "collect")] == ["collect", "notify"]


# -- the packages on their targets: EL9's Python, a fresh Debian 12 root -------------------------

# What RHEL/Rocky 9 ship (AppStream: python3-click, python3-jinja2, python3-markupsafe; CRB:
# python3-tomli): the RPM's code runs on exactly these, under Python 3.9. MarkupSafe stays at 1.1:
# jinja2 2.11 imports soft_unicode, which MarkupSafe 2.1 removed.
EL9_LIBRARIES = ("click==7.1.2", "jinja2==2.11.3", "markupsafe==1.1.1", "tomli==1.2.3")
EL9_SITELIB = "/usr/lib/python3.9/site-packages"


def _python39() -> str:
    """Python 3.9 where the Makefile finds it: $PY39, pyenv's 3.9, or python3.9 on PATH."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = [os.environ.get("PY39", "")]
    found += sorted(glob.glob(os.path.join(pyenv, "versions", "3.9*", "bin", "python3")))
    found.append(shutil.which("python3.9") or "")
    for path in found:
        if path and os.access(path, os.X_OK):
            return path
    require_real("Python 3.9 not found (pyenv install 3.9, or PY39=...)")
    return ""


@pytest.fixture(scope="module")
def el9(tmp_path_factory) -> dict:
    """Python 3.9 and EL9's libraries in a scratch target (pip, from the package index),
    once per session; the run helpers start it with -S, so it sees nothing else."""
    python = _python39()
    site = str(tmp_path_factory.mktemp("el9-site"))
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    done = subprocess.run(
        [*pip, "--target", site, *EL9_LIBRARIES], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"python": python, "site": site}


def _host_sources() -> list:
    """The host's Debian sources when the host is Debian 12 (its mirror or proxy, as apt uses
    it); otherwise none, and mmdebstrap takes Debian's default mirror."""
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            codename = re.search(r"^VERSION_CODENAME=(\S+)", handle.read(), re.M)
    except OSError:
        codename = None
    if not codename or codename.group(1) != "bookworm":
        return []
    candidates = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")
    found = []
    for path in candidates:
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                if re.search(r"^(deb |URIs:)", handle.read(), re.M):
                    found.append(path)
    return found


@pytest.fixture(scope="module")
def debian_root(packages, tmp_path_factory) -> str:
    """A fresh Debian 12 root (mmdebstrap --variant=apt) in which apt installs the built .deb
    and pulls its Depends from Debian's archive, as `apt install ./slurmhealth_*.deb` does on a
    node. Built once per session (20-40 s, most of it downloads)."""
    if os.geteuid() != 0:
        require_real("needs root (mmdebstrap's root mode, chroot)")
    _need("mmdebstrap", "chroot")
    root = str(tmp_path_factory.mktemp("debian") / "root")
    done = subprocess.run(
        [
            "mmdebstrap",
            "--variant=apt",
            "--quiet",
            # dpkg without fsync (halves the build; removed again at the end).
            "--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata",
            # Makes the .deb given to --include visible inside the root while apt installs it.
            "--hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount",
            f"--include={packages['deb']}",
            "bookworm",
            root,
            *_host_sources(),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root


CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"  # found here: a hook's env has no PATH


def _in_root(root: str, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = env if env is not None else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run(
        [CHROOT, root, *argv], env=env, capture_output=True, text=True, timeout=120
    )


def test_deb_installs_into_a_fresh_debian_root_and_checks_a_node_there(debian_root):
    status = _in_root(debian_root, "dpkg-query", "-W", "-f=${Status} ${Version}", "slurmhealth")
    assert status.stdout == f"install ok installed {__version__}-1", status.stderr
    probe = (
        "import sys, click, jinja2; print(sys.version[:4], click.__version__, jinja2.__version__)"
    )
    done = _in_root(debian_root, "/usr/bin/python3", "-c", probe)
    assert done.stdout.split()[0] == "3.11", "Debian 12's own python3, click and jinja2"
    work = os.path.join(debian_root, "srv")
    for name in ("healthy", "gpu-lost"):
        shutil.copy(snapshot_path(name), os.path.join(work, f"{name}.json"))
    usage = _in_root(debian_root, "/usr/bin/slurmhealth", "--help")
    assert usage.returncode == 0 and "history" in usage.stdout, usage.stderr
    done = _in_root(
        debian_root, "slurmhealth", "check", "--no-db", "--gpu-source", "/srv/healthy.json"
    )
    assert done.returncode == 0 and re.search(r"^node \S+: ok", done.stdout, re.M), done.stdout
    done = _in_root(
        debian_root, "slurmhealth", "check", "--no-db", "--gpu-source", "/srv/gpu-lost.json"
    )
    assert done.returncode == 1 and "GPU 3 GpuIsLost" in done.stdout, done.stdout + done.stderr


def test_deb_hook_runs_a_prolog_in_a_fresh_debian_root(debian_root):
    """The installed hook, as slurmd runs it (no PATH), with the packaged defaults: the config in
    /etc/slurmhealth and the store in the postinst's /var/lib/slurmhealth."""
    shutil.copy(snapshot_path("healthy"), os.path.join(debian_root, "srv", "prolog.json"))
    etc = os.path.join(debian_root, "etc", "slurmhealth")
    with open(os.path.join(etc, "slurmhealth.toml"), "w") as handle:
        handle.write('[settings]\ngpu_source = "/srv/prolog.json"\n')
    state = os.path.join(debian_root, "var", "lib", "slurmhealth")
    assert oct(os.stat(state).st_mode & 0o777) == "0o700", "the postinst's root-only state dir"
    env = {"SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURMD_NODENAME": "gpu07", "SLURM_JOB_ID": "1"}
    done = _in_root(debian_root, "/bin/sh", f"{LIBEXEC}/slurmhealth-hook", env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert _runs(os.path.join(state, "gpu07.db")) == [("gpu07", "1", "prolog", "ok")]


# -- man pages, completion, license and maintainer ----------------------------------------------


def _man_pages() -> set:
    """slurmhealth.1 and a page per command: the click commands, `check` and the hooks."""
    names = {"slurmhealth", "slurmhealth-check", "slurmhealth-prolog", "slurmhealth-epilog"}
    return {f"{n}.1" for n in names | {f"slurmhealth-{c}" for c in cli.commands}}


def test_packages_carry_man_pages_completion_and_the_license(packages):
    listing = _run("dpkg-deb", "-c", packages["deb"]).splitlines()
    deb = {line.split()[5].lstrip(".") for line in listing}
    rpm = set(_rpm_query(packages, "-l"))
    for paths in (deb, rpm):
        man1 = "/usr/share/man/man1/"
        pages = {p[len(man1) :].removesuffix(".gz") for p in paths if p.startswith(man1)}
        assert _man_pages() - pages == set()
        assert "/usr/share/bash-completion/completions/slurmhealth" in paths
    assert "/usr/share/zsh/vendor-completions/_slurmhealth" in deb
    assert "/usr/share/zsh/site-functions/_slurmhealth" in rpm
    assert "/usr/share/doc/slurmhealth/copyright" in deb
    assert "/usr/share/licenses/slurmhealth/LICENSE" in rpm


def test_license_maintainer_and_dep5_copyright():
    license_text = _read("LICENSE")
    assert license_text.startswith("MIT License") and "slurmhealth developers" in license_text
    assert re.search(r"^license = MIT$", _read("setup.cfg"), re.M)
    assert re.search(r"^license_files = LICENSE$", _read("setup.cfg"), re.M)
    spec = _read("packaging", "rpm", "slurmhealth.spec")
    assert re.search(r"^License:\s+MIT$", spec, re.M)
    for text in (
        _read("packaging", "debian", "control"),
        _read("packaging", "debian", "changelog"),
        spec,
    ):
        assert "root@localhost" not in text
    assert "Maintainer: slurmhealth developers <" in _read("packaging", "debian", "control")
    # DEP-5 (machine-readable format 1.0): a header, a Files paragraph, the licence's text.
    header, *paragraphs = _read("packaging", "debian", "copyright").split("\n\n")
    assert header.splitlines()[0] == (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    )
    fields = [dict(re.findall(r"^(\S+): (.*)$", p, re.M)) for p in paragraphs]
    (files,) = [f for f in fields if "Files" in f]
    assert files["Files"] == "*" and files["License"] == "MIT" and files["Copyright"]
    (text,) = [p for p in paragraphs if p.startswith("License: MIT\n")]
    body = [line for line in text.splitlines()[1:]]
    assert all(line.startswith(" ") for line in body), "continuation lines start with a space"
    assert " ".join(line.strip() for line in body if line != " .") in " ".join(license_text.split())


def test_classifiers_name_every_python_ci_tests():
    classifiers = re.findall(r"Programming Language :: Python :: (3\.\d+)", _read("setup.cfg"))
    assert classifiers == ["3.9", "3.10", "3.11", "3.12", "3.13"]


# -- the source distribution --------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> str:
    """dist/slurmhealth-X.Y.Z.tar.gz as `make sdist` builds it (python -m build --sdist).
    setuptools assembles the release in ROOT/slurmhealth-X.Y.Z and removes it: the other
    Pythons' suites of `make test` build there too, so one build at a time (a lock on ROOT)."""
    out = tmp_path_factory.mktemp("sdist")
    tree = os.open(ROOT, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(tree, fcntl.LOCK_EX)
        done = subprocess.run(
            [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), ROOT],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        os.close(tree)  # and with it the lock
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.listdir(out) == [f"slurmhealth-{__version__}.tar.gz"]
    return str(out / f"slurmhealth-{__version__}.tar.gz")


def _makefile_paths() -> set:
    """The tree's paths that the Makefile runs or reads (scripts, benchmarks, packaging)."""
    return set(
        re.findall(r"\b((?:scripts|bench|packaging|tests)/[\w.-]+(?:/[\w.-]+)*)", _read("Makefile"))
    )


def test_sdist_is_a_whole_source_release(sdist):
    top = f"slurmhealth-{__version__}/"
    with tarfile.open(sdist) as tar:
        names = {n[len(top) :] for n in tar.getnames() if n.startswith(top)}
        pkg_info = tar.extractfile(top + "PKG-INFO").read().decode()
    assert {"LICENSE", "README.md", "Makefile", "setup.cfg", "pyproject.toml"} <= names
    assert {"packaging/rpm/slurmhealth.spec", "packaging/debian/control"} <= names
    assert {"tests/conftest.py", "prolog.d/50-slurmhealth", "scripts/install-deps"} <= names
    assert "sim/simulate.py" in names  # for the tests, benchmarks and demo: never installed
    assert [n for n in names if n.startswith("slurmhealth/report/templates/")]
    missing = {
        p
        for p in _makefile_paths()
        if p not in names and not any(n.startswith(p + "/") for n in names)
    }
    assert missing == set(), "the Makefile runs what the sdist lacks"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "License: MIT" in pkg_info or "License-Expression: MIT" in pkg_info
    assert "License-File: LICENSE" in pkg_info
    for version in ("3.9", "3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}\n" in pkg_info


def test_sdist_pip_installs_into_a_fresh_venv_and_runs(sdist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", sdist]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    command = str(venv / "bin" / "slurmhealth")
    usage = subprocess.run([command, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert usage.returncode == 0 and "history" in usage.stdout, usage.stderr
    healthy = snapshot_path("healthy")
    done = subprocess.run(
        [command, "check", "--no-db", "--gpu-source", healthy],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and re.search(r"^node \S+: ok", done.stdout, re.M), done.stdout
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import slurmhealth.report.render as r; print(r.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(venv)), "the installed package, not the checkout"
    templates = os.path.join(os.path.dirname(where.stdout.strip()), "templates")
    assert os.listdir(templates), "the report's templates were installed"
    # What the wheel built from the sdist installed: the package alone, no simulated fleet
    files = "import importlib.metadata as m; print(*m.files('slurmhealth'), sep='\\n')"
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", files],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    installed = set(listed.stdout.split())
    assert "slurmhealth/fleet/policy.py" in installed, listed.stderr
    assert _test_only(installed) == set()
    assert {p.split("/")[0] for p in installed if p.endswith(".py")} == {"slurmhealth"}


# -- scripts/install-deps: what `make demo` and `make test` install, named first ----------------


def _install_deps(tmp_path, *args: str) -> tuple:
    """scripts/install-deps as root on a machine whose /usr/sbin is empty (a private mount
    namespace: Slurm's and MariaDB's daemons are not there), with an apt-get that records its
    arguments: (stdout, the apt-get calls)."""
    if os.geteuid() != 0:
        require_real("hiding /usr/sbin takes root (a private mount namespace)")
    _need("unshare")
    fake = tmp_path / "bin"
    fake.mkdir(parents=True)
    calls = tmp_path / "apt.calls"
    (fake / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (fake / "apt-get").chmod(0o755)
    script = os.path.join(ROOT, "scripts", "install-deps")
    inner = f"mount -t tmpfs none /usr/sbin && exec bash {shlex.quote(script)} {' '.join(args)}"
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
        env={"PATH": f"{fake}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, calls.read_text().splitlines() if calls.exists() else []


def test_make_demo_installs_only_its_own_needs_and_says_so_first(tmp_path):
    out, calls = _install_deps(tmp_path, "--demo")
    wanted = calls[-1].split()[3:]  # install -y -qq PACKAGES
    assert calls[0] == "update -qq" and calls[-1].startswith("install -y -qq ")
    assert set(wanted) == {"slurm-wlm", "munge"}  # the demo's local Slurm; nothing for tests
    assert out.splitlines()[0] == (
        "Installing Debian packages for the demo with apt-get: " + " ".join(wanted)
    )
    _, full = _install_deps(tmp_path / "full", "")
    assert {"slurmdbd", "mariadb-server", "slurm-wlm"} <= set(full[-1].split())


def test_no_apt_names_what_is_missing_and_installs_nothing(tmp_path):
    if os.geteuid() != 0:
        require_real("hiding /usr/sbin takes root (a private mount namespace)")
    _need("unshare")
    script = os.path.join(ROOT, "scripts", "install-deps")
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs none /usr/sbin && exec bash {shlex.quote(script)} --demo"],
        env={"PATH": "/usr/bin:/bin", "SLURMHEALTH_NO_APT": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.startswith("note: slurm-wlm munge not installed: the parts of the demo")
