"""slurm.conf read as Slurm reads it, the lines slurmhealth needs merged with a site's own, and
`slurmhealth config slurm-conf` on real files: the printed lines applied and the commands run
leave nothing more to change. (On a real Slurm: tests/slurm/test_slurm_conf.py.)"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from conftest import REPO, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm import advice as advice_text

from slurmhealth.cli import cli
from slurmhealth.core.result import printable
from slurmhealth.fleet import slurmconf

HOOK = slurmconf.HOOK
BASE = "ClusterName=site\nSlurmctldHost=head\nNodeName=gpu[01-04] CPUs=64 Prolog=/not/global\n"


def conf_of(text: str, source: str = "/etc/slurm/slurm.conf") -> slurmconf.Conf:
    return slurmconf.Conf(slurmconf.parse(text, source), [])


def advice_for(text: str) -> slurmconf.Advice:
    conf = conf_of(BASE + text)
    return slurmconf.advise(conf, slurmconf.paths_for("/etc/slurm/slurm.conf"))


def lines_of(text: str) -> dict:
    """{key: new line} of the advice for `text`."""
    return {c.key: c.line for c in advice_for(text).changes}


# --- reading slurm.conf ---------------------------------------------------------------------------


def test_keys_are_case_insensitive_and_the_last_line_wins():
    conf = conf_of("prologflags=Contain\nPROLOGFLAGS=Serial\n")
    assert conf.last("PrologFlags").value == "Serial"
    assert conf.last("prologflags").line == 2


def test_comments_continuations_quotes_and_several_pairs_on_a_line():
    text = (
        "# Prolog=/commented/out\n"
        'Prolog="/etc/slurm/my prolog" Epilog=/etc/slurm/epilog # trailing comment\n'
        "SchedulerParameters=bf_continue,\\\n"
        "bf_max_job_test=500\n"
        "MailProg=/usr/bin/mail\\#1\n"
    )
    conf = conf_of(text)
    assert conf.last("Prolog").value == "/etc/slurm/my prolog"
    assert conf.last("Epilog").value == "/etc/slurm/epilog"
    assert conf.last("Prolog").line == conf.last("Epilog").line == 2
    assert conf.last("SchedulerParameters").value == "bf_continue,bf_max_job_test=500"
    assert conf.last("SchedulerParameters").line == 3
    assert conf.last("MailProg").value == "/usr/bin/mail#1"


def test_record_lines_are_not_settings():
    conf = conf_of(BASE + "PartitionName=gpu Nodes=gpu[01-04] PrologFlags=x\n")
    assert conf.last("Prolog") is None and conf.last("PrologFlags") is None


def test_includes_are_read_in_place_relative_to_the_file_with_the_cluster_name(tmp_path):
    (tmp_path / "slurm.conf").write_text(
        "ClusterName=blue\nPrologFlags=Serial\nInclude prolog-%c.conf\nInclude gone.conf\n"
        "Include slurm.conf\nInclude conf.d/nested.conf\n"
    )
    (tmp_path / "prolog-blue.conf").write_text("PrologFlags=Contain\n")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "nested.conf").write_text("Include sched.conf\n")
    (tmp_path / "sched.conf").write_text("SchedulerParameters=bf_continue\n")  # slurm.conf's dir
    conf = slurmconf.load(str(tmp_path / "slurm.conf"))
    assert conf.last("SchedulerParameters").source == str(tmp_path / "sched.conf")
    last = conf.last("PrologFlags")
    assert (last.value, last.source, last.line) == (
        "Contain",
        str(tmp_path / "prolog-blue.conf"),
        1,
    )
    assert len(conf.notes) == 2
    assert "gone.conf not read (No such file or directory)" in conf.notes[0]
    assert "slurm.conf not read: it includes itself" in conf.notes[1]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_parses_and_advises_without_raising(text):
    conf = conf_of(text)
    advice = slurmconf.advise(conf, slurmconf.paths_for("/etc/slurm/slurm.conf"))
    for line in slurmconf.render(advice, "/etc/slurm/slurm.conf").splitlines():
        assert line == printable(line)


# --- what slurmhealth needs, merged with the site's ----------------------------------------------


def test_a_conf_without_any_of_it_gets_every_line():
    advice = advice_for("")
    assert [c.line for c in advice.changes] == [
        "Prolog=/etc/slurm/prolog.d/*",
        "Epilog=/etc/slurm/epilog.d/*",
        "PrologFlags=Alloc",
        "SchedulerParameters=nohold_on_prolog_fail",
        "PrologEpilogTimeout=30",
        f"HealthCheckProgram={HOOK}",
        "HealthCheckInterval=300",
        "HealthCheckNodeState=ANY,CYCLE",
    ]
    assert all(c.old is None for c in advice.changes)
    assert advice.steps == [
        "mkdir -p /etc/slurm/prolog.d",
        f"ln -sfn {HOOK} /etc/slurm/prolog.d/50-slurmhealth",
        "mkdir -p /etc/slurm/epilog.d",
        f"ln -sfn {HOOK} /etc/slurm/epilog.d/50-slurmhealth",
    ]


def test_the_packaged_example_needs_no_change():
    with open(os.path.join(REPO, "packaging", "slurm.conf.example"), encoding="utf-8") as handle:
        advice = advice_for(handle.read())
    assert advice.changes == []


def test_a_sites_own_prolog_keeps_running_from_the_folder():
    advice = advice_for("Prolog=/etc/slurm/prolog.sh\nEpilog=/etc/slurm/slurm.epilog.clean\n")
    prolog, epilog = advice.changes[:2]
    assert (prolog.line, prolog.old.value) == (
        "Prolog=/etc/slurm/prolog.d/*",
        "/etc/slurm/prolog.sh",
    )
    assert "90-site-prolog.sh" in prolog.why and "reverse name order" in prolog.why
    assert advice.steps[:3] == [
        "mkdir -p /etc/slurm/prolog.d",
        "ln -sfn /etc/slurm/prolog.sh /etc/slurm/prolog.d/90-site-prolog.sh",
        f"ln -sfn {HOOK} /etc/slurm/prolog.d/50-slurmhealth",
    ]
    assert epilog.line == "Epilog=/etc/slurm/epilog.d/*"
    site_epilog = "/etc/slurm/epilog.d/90-site-slurm.epilog.clean"
    assert f"ln -sfn /etc/slurm/slurm.epilog.clean {site_epilog}" in advice.steps


def test_a_sites_glob_is_kept_and_the_hook_named_to_match_it():
    advice = advice_for("Prolog=/opt/slurm/prolog.d/*.sh\nEpilog=/etc/slurm/epilog.d/*\n")
    assert "Prolog" not in {c.key for c in advice.changes}
    assert "Epilog" not in {c.key for c in advice.changes}
    assert f"ln -sfn {HOOK} /opt/slurm/prolog.d/50-slurmhealth.sh" in advice.steps
    assert f"ln -sfn {HOOK} /etc/slurm/epilog.d/50-slurmhealth" in advice.steps


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("*", "50-slurmhealth"),
        ("*.sh", "50-slurmhealth.sh"),
        ("[0-9]*", "50-slurmhealth"),
        ("job-*.sh", "job-50-slurmhealth.sh"),
        ("??-prolog", None),
    ],
)
def test_the_hooks_name_in_a_glob(pattern, name):
    assert slurmconf.name_in(pattern) == name


def test_a_glob_no_name_fits_is_a_note():
    advice = advice_for("Prolog=/etc/slurm/prolog.d/??-prolog\n")
    assert any("under a name it matches" in note for note in advice.notes)


def test_relative_paths_are_taken_from_slurm_confs_directory():
    advice = advice_for("Prolog=site/prolog.sh\nHealthCheckProgram=nhc\n")
    assert "ln -sfn /etc/slurm/site/prolog.sh /etc/slurm/prolog.d/90-site-prolog.sh" in advice.steps
    assert advice.steps[-1] == (
        "echo SLURMHEALTH_SITE_HEALTHCHECK=/etc/slurm/nhc >> /etc/slurm/slurmhealth.env"
    )


def test_the_hook_named_directly_is_fine_wherever_installed():
    text = "Prolog=/etc/slurm/slurmhealth-hook\nHealthCheckProgram=/etc/slurm/slurmhealth-hook\n"
    assert {"Prolog", "HealthCheckProgram"}.isdisjoint(lines_of(text))


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        ("Contain", None),  # Contain implies Alloc (Slurm shows Alloc,Contain)
        ("X11", None),  # X11 implies Contain and Alloc
        ("alloc,Serial", None),
        ("Serial", "PrologFlags=Alloc,Serial"),
        ("NoHold,DeferBatch", "PrologFlags=Alloc,NoHold,DeferBatch"),
    ],
)
def test_prolog_flags_keep_the_sites(flags, line):
    assert lines_of(f"PrologFlags={flags}\n").get("PrologFlags") == line


def test_scheduler_parameters_keep_the_sites_in_order():
    text = "SchedulerParameters=bf_continue,defer,bf_interval=60\n"
    assert lines_of(text)["SchedulerParameters"] == (
        "SchedulerParameters=bf_continue,defer,bf_interval=60,nohold_on_prolog_fail"
    )
    assert "SchedulerParameters" not in lines_of("SchedulerParameters=NOHOLD_ON_PROLOG_FAIL\n")


@pytest.mark.parametrize(
    ("value", "line"),
    [("60", None), ("30", None), ("20", "PrologEpilogTimeout=30"), ("x", "PrologEpilogTimeout=30")],
)
def test_a_longer_prolog_timeout_is_kept(value, line):
    assert lines_of(f"PrologEpilogTimeout={value}\n").get("PrologEpilogTimeout") == line


def test_nhc_runs_from_the_hook_named_in_its_env_file():
    advice = advice_for(
        "HealthCheckProgram=/usr/sbin/nhc\nHealthCheckInterval=300\nHealthCheckNodeState=IDLE,CYCLE\n"
    )
    changed = {c.key: c for c in advice.changes}
    assert changed["HealthCheckProgram"].line == f"HealthCheckProgram={HOOK}"
    assert "SLURMHEALTH_SITE_HEALTHCHECK" in changed["HealthCheckProgram"].why
    assert changed["HealthCheckNodeState"].line == "HealthCheckNodeState=ANY,CYCLE"
    assert "HealthCheckInterval" not in changed
    assert advice.steps[-1] == (
        "echo SLURMHEALTH_SITE_HEALTHCHECK=/usr/sbin/nhc >> /etc/slurm/slurmhealth.env"
    )


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("HealthCheckProgram=/usr/sbin/nhc\n", None),  # Slurm's default is ANY
        ("HealthCheckNodeState=ALLOC\n", "HealthCheckNodeState=ANY"),
        ("HealthCheckNodeState=any\n", None),
        ("", "HealthCheckNodeState=ANY,CYCLE"),  # no health check yet: the example's
    ],
)
def test_node_states(text, line):
    assert lines_of(text).get("HealthCheckNodeState") == line


def test_a_zero_interval_runs_no_health_check():
    assert lines_of("HealthCheckInterval=0\n")["HealthCheckInterval"] == "HealthCheckInterval=300"


def test_a_shared_line_says_what_to_keep_and_an_overridden_one_to_remove():
    advice = advice_for("PrologFlags=Contain\nPrologFlags=Serial SlurmdTimeout=300\n")
    (flags,) = [c for c in advice.changes if c.key == "PrologFlags"]
    assert "keep the line's other settings: SlurmdTimeout=300" in flags.also
    assert "remove the earlier, overridden PrologFlags at /etc/slurm/slurm.conf:4" in flags.also


def test_untrusted_bytes_never_reach_the_terminal_as_they_are():
    advice = advice_for("PrologFlags=Serial\x1b[2J\nHealthCheckProgram=/usr/sbin/nhc\x07\n")
    text = slurmconf.render(advice, "/etc/slurm/slurm.conf")
    assert "\x1b" not in text and "\x07" not in text
    assert text.startswith("# note: values below hold characters that are not printable")
    assert "PrologFlags=Alloc,Serial?[2J" in text


# --- the command, on real files -------------------------------------------------------------------

SITE = """ClusterName=site
SlurmctldHost=head
Prolog=/etc/slurm/prolog.sh Epilog=/etc/slurm/epilog.sh
PrologFlags=Contain
SchedulerParameters=bf_continue
Include health.conf
NodeName=gpu[01-04] CPUs=64
"""


@pytest.fixture
def site(tmp_path):
    """A site's slurm.conf and a file it includes."""
    (tmp_path / "slurm.conf").write_text(SITE)
    (tmp_path / "health.conf").write_text(
        "HealthCheckProgram=/usr/sbin/nhc\nHealthCheckInterval=60\n"
    )
    return tmp_path


def test_the_printed_lines_applied_leave_nothing_to_change(site):
    conf = str(site / "slurm.conf")
    hook = str(site / "slurmhealth-hook")
    first = run_cli("config", "slurm-conf", conf, "--hook", hook, "--check")
    assert first.returncode == 1, first.stderr
    assert first.stderr == ""
    changed = [line for line, _ in advice_text.blocks(first.stdout)]
    assert changed == [
        f"Prolog={site}/prolog.d/*",
        f"Epilog={site}/epilog.d/*",
        "SchedulerParameters=bf_continue,nohold_on_prolog_fail",
        "PrologEpilogTimeout=30",
        f"HealthCheckProgram={hook}",
    ]
    advice_text.apply(first.stdout, conf)
    assert os.readlink(site / "prolog.d" / "90-site-prolog.sh") == "/etc/slurm/prolog.sh"
    assert os.readlink(site / "epilog.d" / "50-slurmhealth") == hook
    assert (site / "slurmhealth.env").read_text() == "SLURMHEALTH_SITE_HEALTHCHECK=/usr/sbin/nhc\n"
    assert (site / "health.conf").read_text().splitlines()[0] == f"HealthCheckProgram={hook}"
    again = run_cli("config", "slurm-conf", conf, "--hook", hook, "--check")
    assert again.returncode == 0, again.stdout
    assert again.stdout.splitlines()[0] == f"# slurmhealth: nothing to change in {conf}."


def test_the_file_defaults_to_slurm_conf_in_the_environment(site):
    result = CliRunner().invoke(
        cli, ["config", "slurm-conf"], env={"SLURM_CONF": str(site / "slurm.conf")}
    )
    assert result.exit_code == 0, result.output
    assert f"was {site}/slurm.conf:3: Prolog=/etc/slurm/prolog.sh" in result.output
    assert f"was {site}/health.conf:1: HealthCheckProgram=/usr/sbin/nhc" in result.output


def test_conf_dir_names_where_slurm_conf_lives_on_the_nodes(site):
    done = run_cli("config", "slurm-conf", str(site / "slurm.conf"), "--conf-dir", "/etc/slurm")
    assert done.returncode == 0
    assert "Prolog=/etc/slurm/prolog.d/*" in done.stdout.splitlines()
    assert ">> /etc/slurm/slurmhealth.env" in done.stdout


@pytest.mark.parametrize("name", ["missing.conf", "."])
def test_a_file_that_cannot_be_read_is_one_line(tmp_path, name):
    path = str(tmp_path / name)
    done = run_cli("config", "slurm-conf", path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(f"Error: {path}: ")


def test_one_line_to_change_is_said_in_the_singular(tmp_path):
    with open(os.path.join(REPO, "packaging", "slurm.conf.example"), encoding="utf-8") as handle:
        text = handle.read().replace("PrologEpilogTimeout=30\n", "")
    (tmp_path / "slurm.conf").write_text(text)
    done = run_cli("config", "slurm-conf", str(tmp_path / "slurm.conf"))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.replace("#", " ").split())  # the comment as one line
    assert said.startswith(f"slurmhealth: 1 line of {tmp_path}/slurm.conf to change,"), said


# --- several Prolog or Epilog lines: Slurm 24.05 runs them all ------------------------------------

SEVERAL = "Prolog=/etc/slurm/prolog.sh\nPrologFlags=Contain\nProlog=/opt/site/prolog.d/*\n"


def advice_on(text: str, slurm: tuple | None) -> slurmconf.Advice:
    paths = slurmconf.paths_for("/etc/slurm/slurm.conf", slurm=slurm)
    return slurmconf.advise(conf_of(BASE + text), paths)


def test_before_24_05_the_last_prolog_line_is_the_one_kept():
    advice = advice_on(SEVERAL, (22, 5))
    assert "Prolog" not in {c.key for c in advice.changes}  # the last line is a glob: kept
    assert f"ln -sfn {HOOK} /opt/site/prolog.d/50-slurmhealth" in advice.steps
    assert not any("lines" in note for note in advice.notes)


def test_from_24_05_every_prolog_line_runs_and_the_hook_comes_last():
    for version in [(24, 5), (25, 11)]:
        advice = advice_on(SEVERAL, version)
        (prolog,) = [c for c in advice.changes if c.key == "Prolog"]
        assert (prolog.line, prolog.old) == (f"Prolog={HOOK}", None)
        assert "after your 2 Prolog lines" in prolog.why
        assert not any("prolog.d" in step for step in advice.steps)  # nothing linked anywhere
    done = advice_on(SEVERAL + f"Prolog={HOOK}\n", (24, 5))
    assert "Prolog" not in {c.key for c in done.changes}


def test_one_prolog_line_is_merged_alike_whatever_the_version():
    text = "Prolog=/etc/slurm/prolog.sh\n"
    assert advice_on(text, (24, 11)) == advice_on(text, (22, 5)) == advice_on(text, None)


def test_several_lines_without_a_version_say_what_each_slurm_does():
    advice = advice_on("Epilog=/etc/slurm/a.sh\nEpilog=/etc/slurm/b.sh\n", None)
    (epilog,) = [c for c in advice.changes if c.key == "Epilog"]
    assert epilog.old.value == "/etc/slurm/b.sh" and "overridden Epilog" in epilog.also
    (note,) = [n for n in advice.notes if "Epilog is set on 2 lines" in n]
    assert "Slurm 24.05 and later runs every one" in note and "--slurm-version" in note


def test_the_command_takes_the_nodes_slurm_version(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(BASE + SEVERAL)
    hook = str(tmp_path / "slurmhealth-hook")
    argv = ["config", "slurm-conf", str(conf), "--hook", hook, "--slurm-version"]
    done = run_cli(*argv, "slurm 24.05.3")
    assert done.returncode == 0, done.stderr
    assert [line for line, _ in advice_text.blocks(done.stdout)][0] == f"Prolog={hook}"
    advice_text.apply(done.stdout, str(conf))
    prologs = [line for line in conf.read_text().splitlines() if line.startswith("Prolog=")]
    assert prologs == [
        "Prolog=/etc/slurm/prolog.sh",
        "Prolog=/opt/site/prolog.d/*",
        f"Prolog={hook}",
    ]
    again = run_cli(*argv, "24.05")
    assert "\nProlog=" not in again.stdout, again.stdout


@pytest.mark.parametrize("text", ["24", "latest", "24.05\n--check", "2405"])
def test_a_slurm_version_that_is_not_one_is_one_line(tmp_path, text):
    (tmp_path / "slurm.conf").write_text(BASE)
    done = run_cli("config", "slurm-conf", str(tmp_path / "slurm.conf"), "--slurm-version", text)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "not a Slurm version" in done.stderr


def test_an_include_takes_the_cluster_name_in_lower_case(tmp_path):
    """slurmctld puts ClusterName into `%c` in lower case: ClusterName=Blue reads blue.conf."""
    (tmp_path / "slurm.conf").write_text("ClusterName=Blue\nInclude %c.conf\n")
    (tmp_path / "blue.conf").write_text("PrologFlags=Serial\n")
    conf = slurmconf.load(str(tmp_path / "slurm.conf"))
    assert conf.notes == []
    assert conf.last("PrologFlags").source == str(tmp_path / "blue.conf")


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        # Slurm 25.05: PrologTimeout and EpilogTimeout each replace PrologEpilogTimeout
        ("PrologEpilogTimeout=60\nPrologTimeout=5\n", {"PrologTimeout": "PrologTimeout=30"}),
        ("PrologTimeout=60\nEpilogTimeout=45\n", {}),  # both set: PrologEpilogTimeout unused
        (
            "PrologTimeout=60\nEpilogTimeout=20\n",
            {"EpilogTimeout": "EpilogTimeout=30"},
        ),
        (
            "PrologTimeout=60\n",  # the epilog still waits forever
            {"PrologEpilogTimeout": "PrologEpilogTimeout=30"},
        ),
        (
            "EpilogTimeout=x\nPrologTimeout=9\n",
            {"PrologTimeout": "PrologTimeout=30", "EpilogTimeout": "EpilogTimeout=30"},
        ),
    ],
)
def test_a_prolog_or_epilog_timeout_of_its_own_is_the_one_that_counts(text, lines):
    changed = lines_of(text)
    timeouts = {k: v for k, v in changed.items() if k.endswith("Timeout")}
    assert timeouts == lines
    if "PrologTimeout" in lines:
        (change,) = [c for c in advice_for(text).changes if c.key == "PrologTimeout"]
        assert change.old.value in change.why and "shorter" in change.why


@pytest.mark.parametrize("option", ["--hook", "--conf-dir"])
def test_a_relative_path_on_the_nodes_is_one_line(site, option):
    """A relative --hook would be linked into prolog.d as a dangling link (every prolog fails,
    every node drains); slurmd reads a relative path from slurm.conf's directory, `ln` from
    the shell's: only an absolute one means one place."""
    done = run_cli("config", "slurm-conf", str(site / "slurm.conf"), option, "slurmhealth-hook")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "not an absolute path" in done.stderr


@pytest.mark.parametrize(
    ("script", "when"), [("site.sh", "before"), ("10-site.sh", "after")]
)
def test_a_sites_script_already_in_the_folder_is_not_linked_beside_itself(script, when):
    """`Prolog=/etc/slurm/prolog.d/site.sh` made `prolog.d/*`: the glob matches site.sh
    itself; a 90-site-site.sh link beside it would run the site's prolog twice."""
    advice = advice_for(f"Prolog=/etc/slurm/prolog.d/{script}\n")
    (prolog,) = [c for c in advice.changes if c.key == "Prolog"]
    assert prolog.line == "Prolog=/etc/slurm/prolog.d/*"
    assert f"{script}, is in it already" in prolog.why and f"{when} slurmhealth's" in prolog.why
    links = [step for step in advice.steps if "/etc/slurm/prolog.d/" in step]
    assert links == [f"ln -sfn {HOOK} /etc/slurm/prolog.d/50-slurmhealth"]
