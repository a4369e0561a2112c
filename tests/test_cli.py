"""The `slurmhealth` command as an admin runs it: exit codes, JSON contract, clear errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import FAKE_NVML, FIXTURES, run_as_nobody, run_cli, snapshot_path

from slurmhealth.node.checks import REGISTRY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check(*args, env=None):
    return run_cli("check", "--no-db", *args, env=env)


def test_healthy_exit_0_and_a_table():
    proc = check("--gpu-source", snapshot_path("healthy"), "--only", "gpu,nvlink")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split() == ["CHECK", "STATUS", "MESSAGE"]
    assert "gpu.count" in proc.stdout and "node " in proc.stdout.splitlines()[-1]


def test_fault_exit_1_and_json_contract():
    proc = check("--gpu-source", snapshot_path("gpu-lost"), "--json", "--node", "gpu07")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["node"] == "gpu07" and doc["verdict"] == "fail"
    first = doc["results"][0]
    assert set(first) == {"check", "status", "message", "action", "data"}
    assert first == {**first, "check": "gpu.count", "status": "fail", "action": "reboot"}
    statuses = {r["status"] for r in doc["results"]}
    assert statuses <= {"ok", "warn", "fail", "skip", "error"}


def test_warn_alone_exits_0():
    proc = check("--gpu-source", snapshot_path("thermal"), "--only", "gpu", "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["verdict"] == "warn"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "no such option: --bogus"),
        (["--only", "disk"], "unknown area 'disk'"),
        (["--node"], "option --node needs a value"),
        (["--gpu-source", "/nonexistent.json"], "No such file"),
        (["--config", "/nonexistent.toml"], "cannot read config"),
        (["--node", "../../escaped"], "not a node name: '../../escaped'"),
        (["--node", "gpu[01-64]"], "not a node name"),
        (["--kmsg", "/tmp"], "--kmsg /tmp: a directory, not a kernel log"),
        (["--only", ","], "--only names no area"),
        (["--gpu-source", "/dev/zero"], "/dev/zero: not a snapshot: not a regular file"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message):
    proc = check(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_config_nested_thousands_deep_is_a_one_line_error(tmp_path):
    cfg = tmp_path / "deep.toml"
    cfg.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    for proc in (
        check("--config", str(cfg), "--gpu-source", snapshot_path("healthy")),
        run_cli("config", "validate", str(cfg)),
    ):
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().endswith("nested too deep to be a config")
        assert len(proc.stderr.strip().splitlines()) == 1


def test_check_with_stdout_closed_still_gives_its_verdict():
    """`check >&-` (cron without output): no traceback on the missing stream, the exit code
    is the verdict."""
    done = subprocess.run(
        f"{shlex.quote(sys.executable)} -m slurmhealth check --no-db --gpu-source "
        f"{shlex.quote(snapshot_path('gpu-lost'))} >&-",
        shell=True,  # noqa: S602 - the test's own fixed command line, to close stdout
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr


def test_click_usage_errors_are_one_line_naming_the_help_to_read():
    for args, where in (
        (("--bogus",), "slurmhealth"),
        (("nosuch",), "slurmhealth"),
        (("config", "validate", "--bogus"), "slurmhealth config validate"),
        (("history", "--limit", "-1"), "slurmhealth history"),
        (("trends", "--factor", "nan"), "slurmhealth trends"),
    ):
        proc = run_cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("Error: ") and line.endswith(f"(see '{where} --help')"), line


def test_a_broken_config_exits_2_naming_file_and_line(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[gpu]\ncount = 8\nbogus = 1\n")
    proc = check("--config", str(cfg), "--gpu-source", snapshot_path("healthy"))
    assert proc.returncode == 2
    assert f"{cfg}:3: unknown key gpu.bogus" in proc.stderr
    validate = run_cli("config", "validate", "--config", str(cfg))
    assert validate.returncode == 2 and f"{cfg}:3:" in validate.stderr


def test_expected_gpu_count_from_config_fails_a_short_node(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[node]]\nmatch = "gpu[01-04]"\ngpu.count = 8\n')
    proc = check(
        "--config",
        str(cfg),
        "--node",
        "gpu02",
        "--gpu-source",
        snapshot_path("gpu-missing"),
        "--only",
        "gpu",
    )
    assert proc.returncode == 1 and "7 GPUs visible, 8 expected" in proc.stdout
    show = run_cli("config", "show", "--config", str(cfg), "--node", "gpu02")
    assert json.loads(show.stdout)["gpu"]["count"] == 8


def test_the_store_keeps_baselines_between_checks(db):
    args = [
        "check",
        "--db",
        db,
        "--record",
        "--gpu-source",
        snapshot_path("healthy"),
        "--only",
        "gpu",
    ]
    first = run_cli(*args, "--json")
    assert json.loads(first.stdout)["results"][1]["message"] == "inventory recorded"
    second = run_cli(*args, "--json")
    assert json.loads(second.stdout)["results"][1]["message"] == "inventory unchanged"


def test_a_replay_is_a_dry_run_that_never_becomes_the_nodes_history(tmp_path):
    """Three faulty replays on a node whose store is the default one: each says what it would
    find, exit 1, and none is read from or written to the store (once, three replays made a
    healthy node a lemon and their driver its version). --record is the explicit way to keep
    a replay, and even then its versions are not the node's."""
    state = tmp_path / "state"
    env = {"SLURMHEALTH_STATE_DIR": str(state), "SLURMHEALTH_DB": ""}
    lost = snapshot_path("gpu-lost")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    for replay in (["--gpu-source", lost], ["--gpu-source", lost, "--kmsg", str(kmsg)]):
        for _ in range(3):
            proc = run_cli("check", "--node", "gpu01", *replay, env=env)
            assert proc.returncode == 1, proc.stderr
            assert "a replay: nothing read from or written to the node's store" in proc.stderr
    assert not state.exists() or not list(state.iterdir())
    db = str(tmp_path / "kept.db")
    kept = run_cli("check", "--node", "gpu01", "--db", db, "--record", "--gpu-source", lost)
    assert kept.returncode == 1 and "a replay" not in kept.stderr
    import sqlite3

    ((verdict, sources),) = sqlite3.connect(db).execute("SELECT verdict, sources FROM runs")
    assert verdict == "fail" and json.loads(sources)["gpu"]["status"] == "ok"
    assert not any("versions" in s for s in json.loads(sources).values()), sources
    for wrong in (["--record"], ["--record", "--no-db", "--gpu-source", lost]):
        proc = run_cli("check", "--node", "gpu01", *wrong, env=env)
        assert proc.returncode == 2 and "--record records a replay" in proc.stderr


def _other_files(tmp_path):
    """A text file and another program's SQLite database, with what each holds."""
    import sqlite3

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    other = tmp_path / "app.sqlite"
    conn = sqlite3.connect(str(other))
    conn.execute("CREATE TABLE accounts (name TEXT)")
    conn.commit()
    conn.close()
    return {notes: notes.read_bytes(), other: other.read_bytes()}


@pytest.mark.parametrize("command", ["check", "diagnose"])
def test_a_db_that_is_another_file_is_refused_and_left_as_it_was(tmp_path, command):
    """`--db` naming a file that is not a store (a typo): exit 2 with one line; the file is not
    renamed `.corrupt-...` nor given our tables (a store the hook finds damaged still is)."""
    files = _other_files(tmp_path)
    for path, before in files.items():
        args = ["--db", str(path), "--gpu-source", snapshot_path("healthy")]
        if command == "diagnose":
            proc = diagnose(tmp_path, *args, "--config", diag_config(tmp_path), *SOURCES)
        else:
            proc = run_cli(command, *args, "--only", "gpu", "--record")
        assert proc.returncode == 2, proc.stderr
        assert f"--db {path}: not a" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert path.read_bytes() == before
    left = [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name or "-wal" in p.name]
    assert left == []


def test_a_db_that_is_empty_or_new_becomes_a_store(tmp_path):
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (empty, tmp_path / "new.db"):
        proc = run_cli(
            "check", "--db", str(path), "--record", "--gpu-source", snapshot_path("healthy")
        )
        assert proc.returncode == 0, proc.stderr
        assert path.read_bytes().startswith(b"SQLite format 3\x00")


def fake_env(fault=""):
    return {
        "PYTHONPATH": f"{FAKE_NVML}:{REPO}",
        "SLURMHEALTH_NVML_BINDING": "pynvml",
        "FAKE_NVML_SNAPSHOT": snapshot_path("healthy"),
        "FAKE_NVML_FAULT": fault,
    }


def test_snapshot_replays_to_the_same_verdicts(tmp_path):
    sysfs = os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr")
    kmsg = os.path.join(FIXTURES, "kmsg", "xid-forms.kmsg")
    out = tmp_path / "snap.json"
    live_args = ["--sysfs-root", sysfs, "--kmsg", kmsg, "--node", "gpu01", "--json"]
    snap = run_cli(
        "snapshot",
        "-o",
        str(out),
        "--sysfs-root",
        sysfs,
        "--kmsg",
        kmsg,
        "--node",
        "gpu01",
        env=fake_env(),
    )
    assert snap.returncode == 0, snap.stderr
    live = check(*live_args, env=fake_env())
    replayed = check("--gpu-source", str(out), "--node", "gpu01", "--json")

    def verdicts(proc):
        return [(r["check"], r["status"], r["message"]) for r in json.loads(proc.stdout)["results"]]

    assert verdicts(live) == verdicts(replayed)
    assert json.loads(out.read_text())["format"] == "slurmhealth-snapshot/1"


def test_genconf_writes_a_config_that_validates_and_passes(tmp_path):
    out = tmp_path / "gen.toml"
    sysfs = os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr")
    proc = run_cli(
        "config",
        "genconf",
        "--node",
        "gpu01",
        "-o",
        str(out),
        "--gpu-source",
        snapshot_path("healthy"),
        "--sysfs-root",
        sysfs,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "gpu.count = 8" in text and "nvlink.links_per_gpu = 18" in text
    assert run_cli("config", "validate", "--config", str(out)).returncode == 0
    again = check(
        "--config",
        str(out),
        "--node",
        "gpu01",
        "--gpu-source",
        snapshot_path("healthy"),
        "--sysfs-root",
        sysfs,
        "--only",
        "gpu,nvlink,ib",
    )
    assert again.returncode == 0, again.stdout
    short = check(
        "--config",
        str(out),
        "--node",
        "gpu01",
        "--gpu-source",
        snapshot_path("gpu-missing"),
        "--only",
        "gpu",
    )
    assert short.returncode == 1


def test_every_command_has_help_with_an_example():
    from click.testing import CliRunner

    from slurmhealth.cli import cli

    def walk(group, path):
        for name, command in group.commands.items():
            yield [*path, name], command
            if hasattr(command, "commands"):
                yield from walk(command, [*path, name])

    for path, command in walk(cli, []):
        assert command.help and "Example:" in command.help, path
        if path != ["check"]:
            shown = CliRunner().invoke(cli, [*path, "--help"])
            assert shown.exit_code == 0
            # the example stays as written, one command a line (click rewraps other paragraphs)
            assert "  Example:\n      slurmhealth " in shown.output, path
    assert "Example:" in check("--help").stdout


def test_readme_catalogue_equals_the_registry():
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    section = readme.split("## Check catalogue", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z]+\.[a-z_]+)` \|", section, re.M)
    assert listed == list(REGISTRY)


def test_every_catalogue_line_is_a_whole_sentence():
    from slurmhealth.node.checks import describe

    # the catalogue takes a docstring's first line alone: a sentence wrapped onto the next line
    # was cut mid-phrase in the README, docs/checks.md and the example config
    cut = [name for name in REGISTRY if not describe(name).endswith(".")]
    assert cut == []


def test_the_parsed_config_is_cached_in_the_store_until_the_file_changes(tmp_path, db):
    import sqlite3
    import time

    cfg = tmp_path / "c.toml"
    cfg.write_text("[gpu]\ncount = 8\n")
    args = [
        "check",
        "--db",
        db,
        "--record",
        "--config",
        str(cfg),
        "--gpu-source",
        snapshot_path("gpu-missing"),
        "--only",
        "gpu",
    ]
    assert run_cli(*args).returncode == 1
    cached = sqlite3.connect(db).execute("SELECT value FROM meta").fetchone()[0]
    assert json.loads(cached)["data"] == {"gpu": {"count": 8}}
    time.sleep(0.01)
    cfg.write_text("[gpu]\ncount = 7\n")  # a changed file is parsed again
    assert run_cli(*args).returncode == 0
    cfg.write_text("[gpu]\ncount = [\n")  # and a broken one is reported, not served stale
    proc = run_cli(*args)
    assert proc.returncode == 2 and f"{cfg}:" in proc.stderr


def test_check_through_the_click_cli_returns_instead_of_ending_the_process():
    """The click group lists `check` too; invoked in-process it returns its exit code (it used
    to re-enter the hook's main, which ends the process with os._exit)."""
    from click.testing import CliRunner

    from slurmhealth.cli import cli

    args = ["check", "--no-db", "--gpu-source", snapshot_path("gpu-lost"), "--only", "gpu"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "gpu.count" in result.output and "GpuIsLost" in result.output


def test_the_entry_point_sends_only_node_commands_to_the_agent():
    """`check --help` is the agent's own help; every other command's help is click's."""
    node_help = run_cli("check", "--help")
    assert node_help.returncode == 0 and node_help.stdout.startswith("Usage: slurmhealth check")
    admin_help = run_cli("history", "--help")
    assert admin_help.returncode == 0 and "Usage: slurmhealth history" in admin_help.stdout


@pytest.mark.parametrize(
    ("option", "message"),
    [("--sysfs-root", "no such directory"), ("--kmsg", "no such file")],
)
def test_a_named_path_that_does_not_exist_is_a_usage_error(option, message):
    """A typo must not read as "no InfiniBand" or "no Xids" and print ok."""
    proc = check("--gpu-source", snapshot_path("healthy"), option, "/nonexistent/slurmhealth")
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_check_into_a_closed_pipe_ends_quietly():
    """`check --json | head -1`: no error message, and the check's own exit status."""
    import subprocess
    import sys

    line = (
        f"{sys.executable} -m slurmhealth check --no-db --json "
        f"--gpu-source {snapshot_path('healthy')} | true; "
        'echo "status=${PIPESTATUS[0]}"'
    )
    proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "status=0", proc.stderr
    assert proc.stderr == ""


# --- durations: a unit or a one-line refusal, the same for every option -------------------------

DURATION_OPTIONS = [
    ("history", "--since"),
    ("prune", "--older-than"),
    ("export", "--since"),
    ("collect", "{tmp}", "--since"),
    ("lemons", "--window"),
    ("slow", "--window"),
    ("report", "-o", "{tmp}/r.html", "--since"),
    ("publish", "--since"),
]


@pytest.mark.parametrize("command", DURATION_OPTIONS, ids=lambda c: f"{c[0]} {c[-1]}")
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("90", "'90' has no unit (write 90s, 90m, 90h, 90d or 90w)"),
        ("1e300d", "more than 1000 years"),
        ("nand", "not a duration"),
        ("-1d", "negative"),
    ],
)
def test_every_duration_option_refuses_a_bare_number_in_one_line(tmp_path, command, value, message):
    """One parser (core/timespec.py) for every duration option: `prune --older-than 90` once
    meant 90 seconds and deleted every record."""
    from slurmhealth.core import store

    db = str(tmp_path / "node.db")
    store.connect(db).close()
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    proc = run_cli(*args, value, "--db", db, env={"SLURMHEALTH_SLURM_BIN": "/nonexistent"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (error,) = proc.stderr.strip().splitlines()  # one line, naming the option
    assert error.startswith("Error: ") and message in error and command[-1] in error, error
    assert f"(see 'slurmhealth {command[0]} --help')" in error


def test_a_duration_from_the_environment_is_named_by_its_variable(tmp_path):
    """SLURMHEALTH_SILENT_AFTER set in cron's periodic.env: the error names the variable the
    admin wrote, not only an option the cron job never passed."""
    from slurmhealth.core import store

    db = str(tmp_path / "fleet.db")
    store.connect(db).close()
    proc = run_cli("lemons", "--db", db, env={"SLURMHEALTH_SILENT_AFTER": "6"})
    assert proc.returncode == 2, proc.stderr
    (error,) = proc.stderr.strip().splitlines()
    assert error.startswith(
        "Error: Invalid value for $SLURMHEALTH_SILENT_AFTER (--silent-after): not a duration: "
        "'6' has no unit"
    ), error
    typed = {"SLURMHEALTH_SILENT_AFTER": "6h"}  # fine: the option typed is the one at fault
    proc = run_cli("lemons", "--db", db, "--silent-after", "6", env=typed)
    assert "Invalid value for --silent-after: " in proc.stderr, proc.stderr


def test_an_instant_out_of_range_is_a_one_line_error(tmp_path):
    db = str(tmp_path / "node.db")
    from slurmhealth.core import store

    store.connect(db).close()
    for now in ("1e300", "nan", "-5"):
        proc = run_cli("history", "--db", db, "--now", now)
        assert proc.returncode == 2 and "out of range" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_docs_checks_is_the_generated_catalogue():
    """docs/checks.md lists every check and every threshold with its why, from the code."""
    from slurmhealth.node.checks import catalogue_markdown

    with open(os.path.join(REPO, "docs", "checks.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert text.endswith(catalogue_markdown())
    assert all(f"`{name}`" in text for name in REGISTRY)


# --- diagnose on a node (docs/diagnose.md) -------------------------------------------------------

DIAG = os.path.join(FIXTURES, "diag")
SOURCES = (
    "--node",
    "gpu01",
    "--sysfs-root",
    os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
    "--kmsg",
    os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
)


def diag_config(tmp_path, dcgmi_output: str = "", **settings) -> str:
    """A config (root's, 0600, as config loading demands) whose diag_tools holds a stand-in
    dcgmi printing the fixture `dcgmi_output`."""
    import shutil

    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    if dcgmi_output:
        script = tools / "dcgmi"
        script.write_text(f"#!/bin/sh\nexec {shutil.which('cat')} {DIAG}/{dcgmi_output}\n")
        script.chmod(0o755)
    lines = ["[settings]", f'diag_tools = "{tools}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    cfg = tmp_path / "slurmhealth.toml"
    cfg.write_text("\n".join(lines) + "\n")
    cfg.chmod(0o600)
    return str(cfg)


def diagnose(tmp_path, *args: str) -> object:
    """`slurmhealth diagnose ARGS` with nothing on PATH: only the stand-ins are found."""
    env = {"PATH": str(tmp_path / "empty-path"), "SLURMHEALTH_SLURM_BIN": "/nonexistent"}
    return run_cli("diagnose", *args, env=env)


def test_diagnose_help_does_nothing(tmp_path):
    state = tmp_path / "state"
    for args in (["--help"], ["--submit", "--help"]):
        proc = run_cli(
            "diagnose",
            "--db",
            str(tmp_path / "x.db"),
            *args,
            env={"SLURMHEALTH_STATE_DIR": str(state), "SLURMHEALTH_DB": str(tmp_path / "y.db")},
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("Usage: slurmhealth diagnose") and "Example:" in proc.stdout
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("dcgmi_output", "code", "verdict"),
    [
        ("dcgmi-4.x-r3-pass.json", 0, "ok"),
        ("dcgmi-3.3-r2-fail.json", 1, "fail"),
        ("", 4, "inconclusive"),  # no dcgmi, no CUDA library: nothing ran that could pass it
    ],
)
def test_diagnose_quick_exits_by_its_verdict_and_records_a_diag_run(
    tmp_path, dcgmi_output, code, verdict
):
    import sqlite3

    db = str(tmp_path / "node.db")
    cfg = diag_config(tmp_path, dcgmi_output)
    args = [
        "--level",
        "quick",
        "--config",
        cfg,
        "--db",
        db,
        "--gpu-source",
        snapshot_path("healthy"),
    ]
    shown = diagnose(tmp_path, *args, *SOURCES)
    assert shown.returncode == code, shown.stderr
    assert shown.stdout.startswith(f"gpu01: diagnose quick: {verdict.upper()} (")
    assert "Traceback" not in shown.stderr
    proc = diagnose(tmp_path, *args, *SOURCES, "--json")
    assert proc.returncode == code, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["node"], doc["level"], doc["verdict"]) == ("gpu01", "quick", verdict)
    # quick runs the built-in GPU tests too (skipped where no CUDA library is installed)
    assert [p["probe"] for p in doc["probes"]] == ["checks", "dcgm", "cuda"]
    assert doc["probes"][1]["status"] == {0: "pass", 1: "fail", 4: "skip"}[code]
    assert doc["applied"] is None
    history = json.loads(run_cli("history", "--db", db, "--json").stdout)
    stored = "warn" if verdict == "inconclusive" else verdict  # the run's verdict: never ok
    assert [(r["phase"], r["verdict"]) for r in history["runs"]] == [("diag", stored)] * 2
    if code == 4:
        assert "inconclusive: no probe of the level ran" in shown.stdout
    rows = sqlite3.connect(db).execute(
        "SELECT r.check_name, r.status FROM results r JOIN runs ON runs.id = r.run_id "
        "WHERE runs.phase = 'diag' ORDER BY runs.started, r.check_name"
    )
    dcgm = {0: "ok", 1: "fail", 4: "skip"}[code]
    found = [row for row in rows.fetchall() if row[0] != "diag.cuda"]
    assert found == [("diag.checks", "ok"), ("diag.dcgm", dcgm)] * 2


def test_diagnose_without_the_cuda_extra_or_dcgm_is_inconclusive_and_says_what_to_install(
    tmp_path,
):
    """The built-in GPU tests are an optional part, as DCGM is: a node with neither (torch and
    cupy planted as absent, whatever this machine has) tested nothing, so the diagnosis is
    inconclusive (exit 4, a warn run), never OK, and each skip names what to install."""
    from slurmhealth.node.diag import cuda

    absent = tmp_path / "absent"
    absent.mkdir()
    for name in ("torch", "cupy"):
        (absent / f"{name}.py").write_text(f"raise ModuleNotFoundError(name={name!r})\n")
    path = os.pathsep.join(p for p in (str(absent), os.environ.get("PYTHONPATH")) if p)
    env = {
        "PATH": str(tmp_path / "empty-path"),
        "SLURMHEALTH_SLURM_BIN": "/nonexistent",
        "PYTHONPATH": path,
    }
    db = str(tmp_path / "node.db")
    args = ["--level", "quick", "--config", diag_config(tmp_path), "--db", db]
    args += ["--gpu-source", snapshot_path("healthy"), *SOURCES]
    shown = run_cli("diagnose", *args, env=env)
    assert shown.returncode == 4, shown.stderr
    assert shown.stdout.startswith("gpu01: diagnose quick: INCONCLUSIVE (")
    cuda_line = next(line for line in shown.stdout.splitlines() if line.split()[:1] == ["cuda"])
    assert cuda_line.split()[1] == "skip" and cuda_line.endswith(cuda.NO_LIBRARY)
    assert "slurmhealth[cuda]" in cuda.NO_LIBRARY
    doc = json.loads(run_cli("diagnose", *args, "--json", env=env).stdout)
    assert doc["verdict"] == "inconclusive"
    probes = {p["probe"]: p for p in doc["probes"]}
    assert (probes["dcgm"]["status"], probes["cuda"]["status"]) == ("skip", "skip")
    assert probes["cuda"]["outcomes"][0]["evidence"] == cuda.NO_LIBRARY
    history = json.loads(run_cli("history", "--db", db, "--json").stdout)
    assert [(r["phase"], r["verdict"]) for r in history["runs"]] == [("diag", "warn")] * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--apply", "--submit"], "--apply runs inside a diagnose job, --submit on the head node"),
        (["--nodes", "gpu01"], "--nodes goes with --submit"),
        (["--time-limit", "30"], "--time-limit goes with --submit"),
        (["--level", "bogus"], "'bogus' is not one of 'quick', 'medium', 'long'"),
        (["--submit", "--time-limit", "0"], "--time-limit: minutes from 1 to 10080"),
        # a typo must not read as "no InfiniBand, no Xids" and pass, nor end in a traceback
        (["--sysfs-root", "/nonexistent/slurmhealth"], "no such directory"),
        (["--kmsg", "/nonexistent/slurmhealth"], "no such file"),
        (["--gpu-source", "/nonexistent/slurmhealth.json"], "No such file"),
    ],
)
def test_diagnose_usage_errors_exit_2_in_one_line(tmp_path, args, message):
    db = tmp_path / "x.db"
    cfg = diag_config(tmp_path, "dcgmi-4.x-r3-pass.json")
    proc = diagnose(tmp_path, "--level", "quick", "--db", str(db), "--config", cfg, *args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (error,) = proc.stderr.strip().splitlines()
    assert error.startswith("Error: ") and message in error
    assert not db.exists()  # refused before any store is opened


def test_a_replayed_diagnosis_is_a_dry_run_and_never_returns_a_node(tmp_path):
    """As for `check`: a diagnosis of files (a snapshot, a sysfs tree, a kernel log) named on
    the command line never becomes the node's history or evidence unless a store is named, and
    --apply, which returns or drains this node, refuses one before anything runs."""
    state = tmp_path / "state"
    env = {"SLURMHEALTH_STATE_DIR": str(state), "SLURMHEALTH_DB": ""}
    cfg = diag_config(tmp_path, "dcgmi-4.x-r3-pass.json")
    args = ("--level", "quick", "--config", cfg, "--gpu-source", snapshot_path("gpu-lost"))
    env_path = {"PATH": str(tmp_path / "empty-path"), "SLURMHEALTH_SLURM_BIN": "/nonexistent"}
    proc = run_cli("diagnose", *args, *SOURCES, env=dict(env, **env_path))
    assert proc.returncode == 1, proc.stderr  # what the replay shows: the lost GPU fails it
    assert proc.stderr.splitlines() == [
        "slurmhealth diagnose: a replay: nothing written to the node's store (--db FILE records "
        "it there)"
    ]
    assert not state.exists() or not list(state.iterdir())
    applied = run_cli("diagnose", *args, "--apply", env=dict(env, **env_path))
    assert applied.returncode == 2, applied.stderr
    (error,) = applied.stderr.strip().splitlines()
    assert error == (
        "Error: --apply acts on this node's own facts: not with --gpu-source FILE, --sysfs-root, "
        "--kmsg or --host-root (a replay) (see 'slurmhealth diagnose --help')"
    )
    assert not state.exists() or not list(state.iterdir())


def test_a_user_diagnosis_says_what_it_could_not_read_and_is_inconclusive(public_dir):
    """Not root, the kernel log unread: DCGM's pass does not make the diagnosis ok (the Xid
    checks did not run), it is inconclusive (exit 4) and says which source and why, in words;
    the node's store, root's, is said once and left untouched; a store named in a directory
    this user may not write is a usage error."""
    import shutil

    kmsg = public_dir / "kmsg"
    shutil.copy(os.path.join(FIXTURES, "kmsg", "healthy.kmsg"), kmsg)
    kmsg.chmod(0o600)
    tools = public_dir / "tools"
    tools.mkdir()
    shutil.copy(os.path.join(DIAG, "dcgmi-4.x-r3-pass.json"), public_dir / "dcgmi.json")
    (public_dir / "dcgmi.json").chmod(0o644)
    dcgmi = tools / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\nexec {shutil.which('cat')} {public_dir}/dcgmi.json\n")
    dcgmi.chmod(0o755)
    cfg = public_dir / "slurmhealth.toml"
    cfg.write_text(f'[settings]\ndiag_tools = "{tools}"\n')
    cfg.chmod(0o644)
    state = public_dir / "state"
    state.mkdir(mode=0o700)
    env = {"SLURMHEALTH_STATE_DIR": str(state), "SLURMD_NODENAME": "gpu01"}
    args = ("--level", "quick", "--config", str(cfg), "--gpu-source", snapshot_path("healthy"))
    shown = run_as_nobody("diagnose", *args, "--kmsg", str(kmsg), "--json", env=env)
    assert shown.returncode == 4, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["verdict"] == "inconclusive"
    assert {p["probe"]: p["status"] for p in doc["probes"]}["dcgm"] == "pass"
    incomplete = [(u["source"], u["areas"]) for u in doc["incomplete"]]
    assert incomplete == [("kmsg", ["xid", "mce", "aer"])]
    checks = doc["probes"][0]["outcomes"][0]["evidence"]
    assert checks.endswith(
        f"none failed; kmsg not read, the xid, mce, aer checks did not run: cannot read the "
        f"kernel log (Permission denied): {kmsg}"
    )
    said = "slurmhealth diagnose: kmsg not read, the xid, mce, aer checks did not run: "
    assert said in shown.stderr
    assert "[Errno" not in shown.stdout + shown.stderr and "Traceback" not in shown.stderr
    assert os.listdir(state) == []
    table = run_as_nobody("diagnose", *args, "--kmsg", str(kmsg), env=env)
    assert table.returncode == 4
    assert "inconclusive: kmsg not read, some of today's checks did not run" in table.stdout
    # the node's own store, root's: said once in words, the run is not recorded
    own = run_as_nobody("diagnose", "--level", "quick", "--config", str(cfg), env=env)
    assert (
        f"slurmhealth diagnose: cannot write {state} (permission denied): this run is not "
        "recorded (the node's store is root's)" in own.stderr.splitlines()
    ), own.stderr
    assert "[Errno" not in own.stdout + own.stderr and "Traceback" not in own.stderr
    assert os.listdir(state) == []
    named = run_as_nobody("diagnose", *args, "--db", str(state / "x.db"), env=env)
    assert named.returncode == 2, named.stderr
    (error,) = named.stderr.strip().splitlines()
    assert error == f"Error: --db {state}/x.db: cannot write {state} (permission denied)"


@pytest.mark.parametrize("args", [["--level", "quick", *SOURCES], ["--submit"]])
def test_diagnose_refuses_a_bad_reservation_name_naming_the_setting(tmp_path, args):
    db = tmp_path / "x.db"
    cfg = diag_config(tmp_path, "dcgmi-4.x-r3-pass.json", diag_reservation="bad name!")
    proc = diagnose(tmp_path, "--db", str(db), "--config", cfg, *args)
    assert proc.returncode == 2, proc.stderr  # not 1: that says the node failed its diagnosis
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"Error: {cfg}:3: settings.diag_reservation: must be 1-64 letters")
    assert not db.exists()


def test_a_reading_command_never_turns_a_file_it_was_given_into_a_store(tmp_path):
    """`history --db FILE` on an empty file, or on another program's SQLite database, used to
    give it slurmhealth's tables (and a WAL header): refused, the file left as it was."""
    import sqlite3

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    theirs = tmp_path / "theirs.db"
    with sqlite3.connect(theirs) as conn:
        conn.execute("CREATE TABLE accounts (name TEXT)")
    before = theirs.read_bytes()
    for path, what in ((empty, "empty"), (theirs, "another program's SQLite database")):
        for args in (("history",), ("report", "--format", "json"), ("lemons",), ("export",)):
            proc = run_cli(*args, "--db", str(path))
            assert proc.returncode == 1, (args, proc.stderr)
            assert f"not a slurmhealth store ({what})" in proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1
    assert empty.read_bytes() == b"" and theirs.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "theirs.db"]


def test_a_node_name_from_slurmd_that_is_none_is_a_usage_line_for_every_command(tmp_path):
    env = {"SLURMD_NODENAME": 'gpu"01\nx', "SLURMHEALTH_STATE_DIR": str(tmp_path / "state")}
    for args, where in ((("export",), "export"), (("config", "show"), "config")):
        proc = run_cli(*args, env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"Error: not a node name: 'gpu\"01\\nx' (see 'slurmhealth {where} --help')\n"
        )
    assert not (tmp_path / "state").exists()


def test_readers_given_a_db_in_a_missing_directory_say_no_store_and_create_nothing(tmp_path):
    missing = tmp_path / "missing" / "dir" / "x.db"
    for args in (("history",), ("prune", "--older-than", "1d"), ("export",)):
        proc = run_cli(*args, "--db", str(missing))
        assert proc.returncode == 1 and proc.stderr == f"Error: no store at {missing}\n"
    assert not (tmp_path / "missing").exists()


def test_export_on_a_node_no_hook_has_run_on_says_so_and_writes_nothing(tmp_path):
    """The export timer on a node before its first health check: no store yet is no failure
    (exit 0, one line, no file); a --db that does not exist still is."""
    env = {"SLURMD_NODENAME": "gpu01", "SLURMHEALTH_STATE_DIR": str(tmp_path / "state")}
    out = tmp_path / "spool" / "gpu01.ndjson"
    out.parent.mkdir()
    proc = run_cli("export", "--incremental", "--since", "2d", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        f"no run recorded on this node yet (no store at {tmp_path}/state/gpu01.db): "
        "nothing exported\n"
    )
    assert not out.exists() and not (tmp_path / "state").exists()


def _readme_commands(readme: str) -> list:
    """(subcommand words, options) of each `slurmhealth ...` the README shows, in code blocks
    and in inline code (which may wrap onto the next line)."""
    texts = re.findall(r"```sh\n(.*?)```", readme, re.S)
    texts += [m.replace("\n", " ") for m in re.findall(r"`(slurmhealth [^`]+)`", readme)]
    found = []
    for text in texts:
        for line in text.splitlines():
            for part in re.split(r"&&|\|\||;|\|", line.split(" # ", 1)[0]):
                words = part.split()
                starts = [i for i, w in enumerate(words) if w.endswith("slurmhealth")]
                if starts:
                    tail = words[starts[0] + 1 :]
                    tail = tail[: next((i for i, w in enumerate(tail) if "$(" in w), len(tail))]
                    found.append(tail)
    return found


def test_every_command_and_file_the_readme_shows_exists():
    """A newcomer copies the README's commands: each names a real command and options it has,
    and each file of this tree it names is there."""
    import click

    from slurmhealth.cli import cli

    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    checked = 0
    for tail in _readme_commands(readme):
        command, path = cli, []
        while tail and isinstance(command, click.Group) and tail[0] in command.commands:
            command = command.commands[tail[0]]
            path.append(tail.pop(0))
        if not path or isinstance(command, click.Group):
            continue  # `slurmhealth` alone, or a word that is a file's name
        shown = run_cli(*path, "--help") if path == ["check"] else None
        known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for word in tail:
            option = word.split("=", 1)[0]
            if option.startswith("-") and option not in known:
                assert shown is not None and option in shown.stdout, (path, option)
        checked += 1
    assert checked >= 30
    named = re.findall(r"(?<![\w/.])((?:docs|packaging|scripts|tests|bench)/[\w./-]*\w)", readme)
    missing = sorted({p for p in named if not os.path.exists(os.path.join(REPO, p))})
    assert missing == []
