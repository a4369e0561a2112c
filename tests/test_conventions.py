"""What admins expect of a Unix tool: man pages and completion that match the commands, -V,
quiet output, `config validate FILE`, and time specs such as 2024-01-01, now-7d and 1d12h."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from conftest import REPO, require_real, run_cli, snapshot_path

from slurmhealth import __version__
from slurmhealth.cli import cli
from slurmhealth.core import timespec
from slurmhealth.core.constants import HOOKS
from slurmhealth.node import agent
from slurmhealth.node.checks import AREAS

SCRIPT = os.path.join(REPO, "scripts", "cli-docs")
COMPLETION = os.path.join(REPO, "packaging", "completion")
HEALTHY = snapshot_path("healthy")


@pytest.fixture(scope="module")
def docs():
    """scripts/cli-docs as a module (a script, so it has no .py suffix)."""
    loader = importlib.machinery.SourceFileLoader("cli_docs", SCRIPT)
    spec = importlib.util.spec_from_loader("cli_docs", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def command_paths() -> list:
    """Every command as its words, from click's tree, plus the hooks the entry point sends to
    node/agent.py: what a man page and completion must cover."""
    out = []

    def walk(command: click.Command, words: tuple) -> None:
        out.append(words)
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), (*words, name))

    walk(cli, ())
    return out + [(mode,) for mode in HOOKS]


def help_of(words: tuple) -> str:
    proc = run_cli(*words, "--help")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# --- man pages -------------------------------------------------------------------------------


def test_make_man_writes_a_page_per_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, SCRIPT, "man", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    expected = {"-".join(("slurmhealth", *words)) + ".1" for words in command_paths()}
    assert set(os.listdir(tmp_path)) == expected
    assert "slurmhealth-check.1" in expected and "slurmhealth-config-validate.1" in expected


def test_every_page_carries_its_commands_current_help(docs):
    """Each option `--help` lists and each paragraph of its description is on the page (in
    roff, hyphens are \\-), so a page cannot fall behind the command."""
    pages = docs.man_pages()
    for words in command_paths():
        page = pages["-".join(("slurmhealth", *words)) + ".1"]
        text = help_of(words)
        for option in set(
            re.findall(r"(?<![\w-])--?[a-zA-Z][-a-zA-Z]*", text.split("Options:")[-1])
        ):
            assert docs.roff(option) in page, (words, option)
        first = text.split("\n\n")[1].split()[:6]  # the description's first words
        assert docs.roff(" ".join(first)) in " ".join(page.split()), (words, first)
        assert page.startswith('.TH "SLURMHEALTH') and ".SH SYNOPSIS" in page


def test_a_page_renders_as_text_without_roff_warnings(docs, tmp_path):
    if shutil.which("man") is None or shutil.which("groff") is None:
        pytest.skip("man and groff not installed")
    page = tmp_path / "slurmhealth-check.1"
    page.write_text(docs.man_pages()["slurmhealth-check.1"])
    proc = subprocess.run(
        ["man", "--warnings", "-l", str(page)],
        capture_output=True,
        text=True,
        env=dict(os.environ, MANWIDTH="100", PAGER="cat"),
        check=False,
    )
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    text = re.sub(".\b", "", proc.stdout)  # bold and underline as overstrikes
    assert "--only AREA" in text and "slurmhealth check --only gpu,ib --json" in text


# --- completion ------------------------------------------------------------------------------


def test_completion_files_match_the_commands():
    """packaging/completion is generated (make completion); a new command or option without
    regenerating it fails here. Checked in a process of its own, as `make completion` writes
    them: click keeps each command's help option once made, so a command another test parsed
    without the top level's settings (-h) would be listed without -h here."""
    proc = subprocess.run(
        [sys.executable, SCRIPT, "completion", "--check", COMPLETION],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"run: make completion\n{proc.stderr}"


def bash_complete(*words: str) -> list:
    script = (
        f"source {COMPLETION}/slurmhealth.bash\n"
        'COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _slurmhealth\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    proc = subprocess.run(
        ["bash", "--norc", "-c", script, "bash", "slurmhealth", *words],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_bash_completes_the_real_commands_and_options():
    top = click.Context(cli)
    commands = set(cli.list_commands(top)) | set(HOOKS)
    assert set(bash_complete("")) == commands
    assert bash_complete("conf") == ["config"]
    assert set(bash_complete("config", "")) == {
        "example",
        "from-nhc",
        "genconf",
        "show",
        "slurm-conf",
        "validate",
    }
    # check is parsed by hand (node/agent.py): its options are the agent's own
    assert set(bash_complete("check", "-")) == set(agent._VALUED) | set(agent._FLAGS)
    assert bash_complete("check", "--only", "") == list(AREAS)
    assert bash_complete("check", "--only", "gpu,nvl") == ["gpu,nvlink"]
    assert bash_complete("check", "--node", "gpu01", "--qu") == ["--quiet"]
    assert "--quiet" in bash_complete("history", "--")
    assert bash_complete("report", "--format", "") == ["html", "md", "json", "prom"]
    assert bash_complete("-") == ["-V", "--version", "-h", "--help"]
    for words in command_paths()[1:]:  # every click option of every command
        command = cli
        for word in words:
            command = command.get_command(top, word) if isinstance(command, click.Group) else None
        if words == ("check",) or not isinstance(command, click.Command):
            continue
        names = {n for p in command.params if isinstance(p, click.Option) for n in p.opts}
        assert names <= set(bash_complete(*words, "-")), words


@pytest.mark.real
def test_zsh_completes_the_real_commands_and_options():
    if shutil.which("zsh") is None:
        require_real("zsh not installed (apt-get install zsh)")
    stubs = "\n".join(
        (
            '_describe() { local -a items; items=("${(@P)${@[-1]}}")',
            '  print -rl -- "${items[@]%%:*}" }',
            'compadd() { shift; print -rl -- "$@" }',
            "_files() { print FILES }",
            "",
        )
    )

    def complete(*words: str) -> list:
        script = (
            f'{stubs}words=(slurmhealth "$@"); CURRENT=${{#words}}\n'
            f"source {COMPLETION}/_slurmhealth\n"
        )
        proc = subprocess.run(
            ["zsh", "-f", "-c", script, "zsh", *words], capture_output=True, text=True, check=False
        )
        assert not proc.stderr, proc.stderr
        return proc.stdout.split()

    assert set(complete("")) == set(cli.list_commands(click.Context(cli))) | set(HOOKS)
    assert set(complete("check", "-")) == set(agent._VALUED) | set(agent._FLAGS)
    assert complete("check", "--only", "") == list(AREAS)
    assert "--quiet" in complete("history", "--node", "gpu01", "-")
    assert complete("config", "validate", "") == ["FILES"]


# --- -V, quiet output, config validate FILE ---------------------------------------------------


def test_dash_v_prints_the_version():
    proc = run_cli("-V")
    assert proc.returncode == 0 and proc.stdout.strip() == f"slurmhealth, version {__version__}"


def test_check_quiet_shows_only_what_did_not_pass():
    proc = run_cli("check", "--no-db", "--gpu-source", snapshot_path("gpu-lost"), "-q")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "STATUS", "MESSAGE"] and lines[-1].startswith("node ")
    assert all(line.split()[1] in ("warn", "fail", "error") for line in lines[1:-1]), lines
    assert any("gpu.count" in line for line in lines)
    healthy = run_cli(
        "check", "--no-db", "--gpu-source", snapshot_path("healthy"), "--only", "gpu", "--quiet"
    )
    assert healthy.returncode == 0 and healthy.stdout.splitlines()[0].startswith("node ")
    doc = json.loads(
        run_cli(
            "check", "--no-db", "--gpu-source", snapshot_path("gpu-lost"), "-q", "--json"
        ).stdout
    )
    assert doc["results"] and {r["status"] for r in doc["results"]} <= {"warn", "fail", "error"}


def test_history_quiet_shows_only_runs_that_did_not_pass(tmp_path):
    db = str(tmp_path / "gpu01.db")
    for name in ("healthy", "gpu-lost", "healthy"):
        run_cli(
            "check", "--node", "gpu01", "--db", db, "--record", "--gpu-source", snapshot_path(name)
        )
    full = run_cli("history", "--db", db).stdout.splitlines()
    quiet = run_cli("history", "--db", db, "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert len(full) == 4 and len(quiet.stdout.splitlines()) == 2, quiet.stdout
    assert quiet.stdout.splitlines()[1].split()[4] == "fail"
    as_json = json.loads(run_cli("history", "--db", db, "--quiet", "--json").stdout)
    assert [r["verdict"] for r in as_json["runs"]] == ["fail"]
    clean_db = str(tmp_path / "gpu02.db")
    run_cli("check", "--node", "gpu02", "--db", clean_db, "--record", "--gpu-source", HEALTHY)
    nothing = run_cli("history", "--db", clean_db, "--quiet")
    assert nothing.returncode == 0 and nothing.stdout == ""


def test_config_validate_takes_the_file_as_an_argument(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[settings]\ndeadline = 5.0\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("[settings]\ndeadline = -1\nbogus = 3\n")
    for path in (good, bad):
        path.chmod(0o600)
    result = CliRunner().invoke(cli, ["config", "validate", str(good)])
    assert result.exit_code == 0 and result.output == f"{good}: ok\n"
    proc = run_cli("config", "validate", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"{bad}:2: settings.deadline: must be > 0 and at most 86400 seconds, not -1",
        f"{bad}:3: unknown key settings.bogus",
    ]
    missing = run_cli("config", "validate", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    both = run_cli("config", "validate", str(good), "--config", str(bad))
    assert both.returncode == 2 and "Traceback" not in both.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the trust check passes root's files only")
def test_config_validate_says_why_a_file_is_not_trusted_in_one_line(tmp_path):
    path = tmp_path / "open.toml"
    path.write_text("[settings]\n")
    path.chmod(0o666)
    proc = run_cli("config", "validate", str(path))
    assert proc.returncode == 2 and "not trusted" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


# --- time specs ------------------------------------------------------------------------------

NOW = timespec.parse_instant("2024-01-29T00:00:00Z")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1d12h", 129600), ("2h30m", 9000), ("1w1d", 8 * 86400), ("90d", 90 * 86400), ("1.5h", 5400)],
)
def test_durations_compound_and_plain(text, seconds):
    assert timespec.parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("2024-01-01", "2024-01-01T00:00:00Z"),
        ("now", "2024-01-29T00:00:00Z"),
        ("now-7d", "2024-01-22T00:00:00Z"),
        ("now-1d12h", "2024-01-27T12:00:00Z"),
        ("NOW - 2h", "2024-01-28T22:00:00Z"),
    ],
)
def test_instants_absolute_and_relative(text, when):
    assert timespec.iso(timespec.parse_instant(text, NOW)) == when


@pytest.mark.parametrize(
    ("text", "when"),
    [("7d", "2024-01-22T00:00:00Z"), ("1d12h", "2024-01-27T12:00:00Z")]
    + [("2024-01-01", "2024-01-01T00:00:00Z"), ("now-7d", "2024-01-22T00:00:00Z")],
)
def test_a_start_is_a_duration_back_or_a_time(text, when):
    assert timespec.iso(timespec.parse_start(text, NOW)) == when


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("90", "has no unit"),
        ("1d12", "not a duration"),
        ("now-7", "has no unit"),
        ("now+7d", "not a time"),
        ("2030-01-01", "after the end"),
        ("2024-13-01", "not a time"),
        ("now-3000w", "before 1970"),
    ],
)
def test_bad_starts_are_one_line_errors(text, message):
    with pytest.raises(ValueError, match=message):
        timespec.parse_start(text, NOW)


def test_since_takes_a_date_and_now_minus_on_the_command_line(tmp_path):
    db = str(tmp_path / "gpu01.db")
    run_cli("check", "--node", "gpu01", "--db", db, "--record", "--gpu-source", HEALTHY)
    for since in ("1d12h", "now-7d", "2024-01-01"):
        proc = run_cli("history", "--db", db, "--since", since)
        assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, (since, proc.stderr)
    proc = run_cli("history", "--db", db, "--since", "2999-01-01")
    assert (
        proc.returncode == 2 and "after the end" in proc.stderr and "Traceback" not in proc.stderr
    )
