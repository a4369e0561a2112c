"""node_exporter textfile metrics: the written file parsed by prometheus_client's own parser and
scraped through a real node_exporter; real hook processes, concurrent writers, unwritable
directories."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import FIXTURES, planted_bug, require_real, snapshot_path, tmpfs
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from test_agent import REPO, Node
from test_import_weight import HEAVY, imported

from slurmhealth.node import config, metrics, runner
from slurmhealth.node.checks import LATER, REGISTRY, runs_in

SYSFS = os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr")
KMSG = os.path.join(FIXTURES, "kmsg")
HOSTILE = 'gpu"01\\x\n} bad{="1"},\tü'
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
LABEL_NAMES = {"node", "version", "check", "status", "source", "phase", "verdict", "xid", "class"}
LABEL_NAMES |= {"device", "counter"}


def a_run(phase="prolog", snapshot="healthy", kmsg="healthy.kmsg", node="gpu01"):
    """A real run of every check on replayed facts (no store)."""
    expect = config.defaults()
    options = runner.Options(snapshot_path(snapshot), SYSFS, os.path.join(KMSG, kmsg))
    return runner.run(node, expect, options, None, phase)


def parsed(path) -> dict:
    """{(sample name, frozenset(labels)): value}; prometheus_client raises on a malformed file."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def families(path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return {f.name: f for f in text_string_to_metric_families(handle.read())}


def test_a_run_writes_every_family_with_help_and_type(tmp_path):
    path = tmp_path / "slurmhealth.prom"
    metrics.update(str(path), a_run(snapshot="gpu-lost"), "gpu01", "drained")
    found = families(path)
    # prometheus_client names counter families without _total
    names = {
        n if metrics.FAMILIES[n][0] == "gauge" else n[: -len("_total")] for n in metrics.FAMILIES
    }
    assert set(found) == names - {"slurmhealth_xid_events"}  # no Xid in this kernel log
    for name, (kind, _, help_text) in metrics.FAMILIES.items():
        family = found.get(name if kind == "gauge" else name[: -len("_total")])
        if family is not None:
            assert (family.type, family.documentation) == (kind, help_text)
    samples = parsed(path)
    assert (
        value(samples, "slurmhealth_check_status", node="gpu01", check="gpu.count", status="fail")
        == 1
    )
    assert (
        value(samples, "slurmhealth_check_status", node="gpu01", check="gpu.count", status="ok")
        == 0
    )
    assert (
        value(samples, "slurmhealth_run_verdict", node="gpu01", phase="prolog", verdict="fail") == 1
    )
    assert value(samples, "slurmhealth_drains_total", node="gpu01", outcome="drained") == 1
    assert value(samples, "slurmhealth_drains_total", node="gpu01", outcome="breaker") == 0
    assert value(samples, "slurmhealth_source_up", node="gpu01", source="nvml") == 1
    checks = {dict(k[1])["check"] for k in samples if k[0] == "slurmhealth_check_status"}
    # a prolog: every check but the health check's own (their areas' PHASES)
    assert checks == {c for c in REGISTRY if runs_in(c.split(".")[0], "prolog")}
    assert {c.split(".")[0] for c in set(REGISTRY) - checks} == set(LATER)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_a_source_the_node_does_not_have_is_not_written_as_down(tmp_path):
    """slurmhealth_source_up: 1 for a source read, 0 for one a check expects and could not
    read; none for one the node does not have and nothing expects (no BMC, IMEX or site health
    check here), so the SourceDown alert does not fire on every healthy node. A 0 an earlier
    run wrote for a source now absent goes."""
    path = tmp_path / "slurmhealth.prom"
    path.write_text(
        '# TYPE slurmhealth_source_up gauge\nslurmhealth_source_up{node="gpu01",source="bmc"} 0\n'
    )
    run = a_run(phase="healthcheck")
    absent = {name for name, got in run.sources.items() if got.absent}
    assert {"bmc", "imex", "site"} <= absent
    metrics.update(str(path), run, "gpu01")
    samples = parsed(path).items()
    up = {dict(k[1])["source"]: v for k, v in samples if k[0] == "slurmhealth_source_up"}
    assert up["nvml"] == up["sysfs"] == up["kmsg"] == 1
    assert not absent & set(up)
    assert all(run.sources[name].status == "ok" for name in up if name not in ("nvml", "sysfs"))

    expect = config.defaults()
    expect["bmc"] = dict(expect["bmc"], expected=True)  # this node should have a BMC
    options = runner.Options(snapshot_path("healthy"), SYSFS, os.path.join(KMSG, "healthy.kmsg"))
    run = runner.run("gpu01", expect, options, None, "healthcheck")
    assert run.sources["bmc"].status == "unavailable" and not run.sources["bmc"].absent
    metrics.update(str(path), run, "gpu01")
    assert value(parsed(path), "slurmhealth_source_up", node="gpu01", source="bmc") == 0


def test_a_job_between_two_health_checks_keeps_the_series_only_a_health_check_writes(tmp_path):
    """The areas only a health check runs (LATER: the BMC, NVMe, IMEX, the Fabric Manager log,
    the site's program): a prolog or epilog carries on their sources' series and the state sets
    of their checks that did not pass, so a BMC that cannot be read stays 0 through every job
    and its alerts' 30 minutes run out; checks that passed or skipped are let go, as before."""
    path = tmp_path / "slurmhealth.prom"
    expect = config.defaults()
    expect["bmc"] = dict(expect["bmc"], expected=True)
    options = runner.Options(snapshot_path("healthy"), SYSFS, os.path.join(KMSG, "healthy.kmsg"))
    metrics.update(str(path), runner.run("gpu01", expect, options, None, "healthcheck"), "gpu01")
    first = parsed(path)
    sources = {k: v for k, v in first.items() if dict(k[1]).get("source") in LATER}
    failing = {  # the checks of LATER areas whose current state is not ok or skip
        dict(k[1])["check"]
        for k, v in first.items()
        if k[0] == "slurmhealth_check_status"
        and dict(k[1])["check"].split(".")[0] in LATER
        and v == 1
        and dict(k[1])["status"] not in ("ok", "skip")
    }
    kept = {k: v for k, v in first.items() if dict(k[1]).get("check") in failing}
    assert value(first, "slurmhealth_source_up", node="gpu01", source="bmc") == 0
    assert "bmc.sel" in failing and len(kept) == 5 * len(failing)
    quiet = {dict(k[1])["check"] for k in first if dict(k[1]).get("check", "").startswith("nvme.")}
    for phase in ("prolog", "epilog"):
        metrics.update(str(path), a_run(phase=phase), "gpu01")
        after = parsed(path)
        assert {k: after.get(k) for k in {**sources, **kept}} == {**sources, **kept}, phase
        assert not quiet & {dict(k[1]).get("check") for k in after}, phase
    # the next health check on a node that no longer expects a BMC: its source_up goes
    metrics.update(str(path), a_run(phase="healthcheck"), "gpu01")
    assert ("slurmhealth_source_up", frozenset({("node", "gpu01"), ("source", "bmc")})) not in (
        parsed(path)
    )


def test_device_error_counters_are_the_latest_readings_non_zero_only(tmp_path):
    """slurmhealth_device_errors_total: each counter the run read, as the device counts it
    (Prometheus' rate() takes a reset as a reset); zeros and gauges are not written."""
    path = tmp_path / "m.prom"
    run = a_run(snapshot="ecc-dbe")
    run.readings["gpu:0000:18:00.0\n}{x=\"1\"|pcie_replay"] = 7  # a hostile device name
    metrics.update(str(path), run, "gpu01")
    samples = parsed(path)
    errors = {
        (dict(k[1])["device"], dict(k[1])["counter"]): v
        for k, v in samples.items()
        if k[0] == "slurmhealth_device_errors_total"
    }
    assert errors and all(v > 0 for v in errors.values())
    want = {k: v for k, v in run.readings.items() if v > 0 and "|thermal" not in k}
    assert len(errors) == len({k for k in want if not k.endswith(("pcie_gen", "pcie_width"))})
    assert any(c == "ecc_dbe_volatile" for _, c in errors)
    assert errors[("gpu:0000:18:00.0x1", "pcie_replay")] == 7
    assert all(set(d) <= set("abcdefghijklmnopqrstuvwxyz0123456789:._-") for d, _ in errors)


def test_check_status_is_a_state_set_one_status_per_check(tmp_path):
    path = tmp_path / "m.prom"
    run = a_run(snapshot="thermal")
    metrics.update(str(path), run, "gpu01")
    samples = parsed(path)
    for result in run.results:
        states = {
            s: value(
                samples, "slurmhealth_check_status", node="gpu01", check=result.check, status=s
            )
            for s in ("ok", "warn", "fail", "skip", "error")
        }
        assert states == {s: float(s == result.status) for s in states}


def test_messages_and_process_names_never_become_labels(tmp_path):
    path = tmp_path / "m.prom"
    run = a_run(kmsg="hostile-names.kmsg")
    assert any("evil" in str(r.data) for r in run.results)  # the hostile names were read
    metrics.update(str(path), run, "gpu01")
    text = path.read_text()
    assert "evil" not in text and "script" not in text and "rm -rf" not in text
    samples = parsed(path)
    assert {k for _, labels in samples for k, _ in labels} <= LABEL_NAMES | {"outcome"}
    xids = {dict(k[1])["xid"] for k in samples if k[0] == "slurmhealth_xid_events_total"}
    assert xids and all(x.isdigit() for x in xids)


def test_hostile_node_names_are_escaped_and_parse_back(tmp_path):
    path = tmp_path / "m.prom"
    metrics.update(str(path), a_run(node=HOSTILE), HOSTILE)
    samples = parsed(path)
    nodes = {dict(k[1])["node"] for k in samples}
    assert nodes == {HOSTILE}
    assert len(path.read_text().splitlines()) == len(samples) + 2 * len(families(path)) + 1


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_any_label_value_round_trips_through_the_prometheus_parser(text):
    rendered = metrics.render({("slurmhealth_source_up", (("node", text), ("source", "x"))): 1.0})
    (family,) = text_string_to_metric_families(rendered)
    assert family.samples[0].labels == {"node": text, "source": "x"}
    assert metrics.unescape(metrics.escape(text)) == text


def test_undecodable_node_names_become_question_marks(tmp_path):
    path = tmp_path / "m.prom"
    name = b"gpu\xff01".decode("utf-8", "surrogateescape")  # as os.environ gives it
    metrics.update(str(path), a_run(node=name), name)
    assert {dict(k[1])["node"] for k in parsed(path)} == {"gpu?01"}


def test_path_for_keeps_node_names_inside_the_directory():
    assert metrics.path_for("/d/slurmhealth-{node}.prom", "gpu07") == "/d/slurmhealth-gpu07.prom"
    assert metrics.path_for("/d/{node}.prom", "../../etc/x y") == "/d/______etc_x_y.prom"
    assert metrics.path_for("/d/fixed.prom", "gpu07") == "/d/fixed.prom"


def test_each_phase_keeps_its_series_and_counters_add_up(tmp_path):
    path = str(tmp_path / "m.prom")
    metrics.update(path, a_run("prolog", snapshot="gpu-lost"), "gpu01", "drained")
    first = parsed(path)
    metrics.update(path, a_run("epilog"), "gpu01")
    metrics.update(path, a_run("healthcheck"), "gpu01")
    metrics.update(path, a_run("prolog"), "gpu01")
    samples = parsed(path)
    for phase, verdict in (("prolog", "ok"), ("epilog", "ok"), ("healthcheck", "ok")):
        assert (
            value(samples, "slurmhealth_run_verdict", node="gpu01", phase=phase, verdict=verdict)
            == 1
        )
    prolog_time = (
        "slurmhealth_last_run_timestamp_seconds",
        frozenset({("node", "gpu01"), ("phase", "prolog")}),
    )
    assert samples[prolog_time] > first[prolog_time]
    runs = {
        (dict(k[1])["phase"], dict(k[1])["verdict"]): v
        for k, v in samples.items()
        if k[0] == "slurmhealth_runs_total"
    }
    assert runs[("prolog", "fail")] == 1 and runs[("prolog", "ok")] == 1
    assert runs[("epilog", "ok")] == 1 and runs[("healthcheck", "ok")] == 1
    assert sum(runs.values()) == 4
    assert value(samples, "slurmhealth_drains_total", node="gpu01", outcome="drained") == 1
    # check status is the latest run's, whatever its phase
    assert (
        value(samples, "slurmhealth_check_status", node="gpu01", check="gpu.count", status="ok")
        == 1
    )


def test_xids_are_counted_once_however_often_the_same_records_are_read(tmp_path):
    path = str(tmp_path / "m.prom")
    for _ in range(3):  # a run without a store reads the whole log each time
        metrics.update(path, a_run("check", kmsg="xid-forms.kmsg"), "gpu01")
    samples = parsed(path)
    counted = {
        (dict(k[1])["xid"], dict(k[1])["class"]): v
        for k, v in samples.items()
        if k[0] == "slurmhealth_xid_events_total"
    }
    events = metrics.xid_events(a_run("check", kmsg="xid-forms.kmsg"))
    expected: dict = {}
    for _, xid, cls in events:
        expected[(str(xid), cls)] = expected.get((str(xid), cls), 0) + 1
    assert counted == expected and ("79", "fail") in counted


def test_lines_that_are_not_ours_are_not_carried_forward(tmp_path):
    path = tmp_path / "m.prom"
    path.write_text(
        "# junk\n"
        'slurmhealth_runs_total{node="gpu01",phase="prolog",verdict="ok"} 41\n'
        'slurmhealth_runs_total{node="gpu01",phase="prolog",verdict="bogus"} 5\n'
        'slurmhealth_runs_total{node="gpu02",phase="prolog",verdict="ok"} 7\n'
        'slurmhealth_runs_total{node="gpu01",phase="epilog",verdict="ok",x="y"} 3\n'
        'slurmhealth_runs_total{node="gpu01",phase="epilog",verdict="warn"} -4\n'
        'slurmhealth_run_duration_seconds{node="gpu01",phase="epilog"} NaN\n'
        'slurmhealth_xid_events_total{node="gpu01",xid="79 ",class="fail"} 2\n'
        'slurmhealth_xid_events_total{node="gpu01",xid="79",class="fail",} 2\n'
        'other_metric{node="gpu01"} 1\n'
        "slurmhealth_runs_total{node=gpu01} 1\n"
    )
    metrics.update(str(path), a_run("prolog"), "gpu01")
    runs = {k: v for k, v in parsed(path).items() if k[0] == "slurmhealth_runs_total"}
    assert runs == {
        (
            "slurmhealth_runs_total",
            frozenset({("node", "gpu01"), ("phase", "prolog"), ("verdict", v)}),
        ): n
        for v, n in (("ok", 42.0), ("warn", 0.0), ("fail", 0.0))
    }
    text = path.read_text()
    assert "other_metric" not in text and "gpu02" not in text and "NaN" not in text
    assert "xid_events" not in text


def test_a_file_that_cannot_be_written_raises_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "is-a-directory.prom"
    target.mkdir()
    with pytest.raises(OSError):
        metrics.update(str(target), a_run(), "gpu01")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".is-a-directory.prom.lock", target.name]


def test_the_mode_is_0644_whatever_the_umask(tmp_path):
    path = tmp_path / "m.prom"
    old = os.umask(0o077)
    try:
        metrics.update(str(path), a_run(), "gpu01")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_the_mode_is_0644_from_the_first_byte_under_umask_0(tmp_path, monkeypatch):
    """Created 0644, not wider and narrowed later: with fchmod switched off and umask 0."""
    monkeypatch.setattr(os, "fchmod", lambda fd, mode: None)
    path = tmp_path / "m.prom"
    old = os.umask(0)
    try:
        metrics.write_atomic(str(path), "x 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_a_symlink_in_the_textfile_directory_is_never_written_through(tmp_path):
    """At the old pid-named temporary, and at the file itself: the victim is untouched; the
    file itself is refused (an OSError: one log line in the hook, the verdict stands)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "m.prom"
    (tmp_path / f".m.prom.{os.getpid()}.tmp").symlink_to(victim)
    metrics.update(str(path), a_run(), "gpu01")
    assert victim.read_text() == "precious\n" and not path.is_symlink()
    path.unlink()
    path.symlink_to(victim)
    with pytest.raises(OSError, match="a symlink"):
        metrics.update(str(path), a_run(), "gpu01")
    assert victim.read_text() == "precious\n" and path.is_symlink()
    temporaries = [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert temporaries == [f".m.prom.{os.getpid()}.tmp"], "only the planted one, still a link"


# --- through the real hook ----------------------------------------------------------------------


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_off_by_default_no_file_and_the_module_not_even_imported(node, tmp_path):
    assert config.defaults()["settings"]["metrics_file"] == ""
    code = "import sys, slurmhealth.node.agent as h; h.main(sys.argv[1:])"
    env = dict(node.env(), PYTHONVERBOSE="1")
    proc = subprocess.run(
        [sys.executable, "-c", code, "prolog"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0
    assert "import 'slurmhealth.node.runner'" in proc.stderr  # the measurement works
    assert "import 'slurmhealth.node.metrics'" not in proc.stderr
    made = [p for p in tmp_path.rglob("*") if p.suffix in (".prom", ".lock", ".tmp")]
    assert [p.name for p in made] in ([], ["gpu01.state.json.lock"])  # the side state's lock


@pytest.mark.parametrize("mode", ["prolog", "epilog", "healthcheck"])
def test_every_hook_writes_the_file_through_the_real_entry(node, tmp_path, mode):
    out = tmp_path / "textfile"
    out.mkdir()
    node.configure("healthy", metrics_file=str(out / "slurmhealth-{node}.prom"))
    proc = node.run(mode, job=None if mode == "healthcheck" else "7")
    assert proc.returncode == 0, proc.stderr
    samples = parsed(out / "slurmhealth-gpu01.prom")
    assert value(samples, "slurmhealth_run_verdict", node="gpu01", phase=mode, verdict="ok") == 1
    assert value(samples, "slurmhealth_runs_total", node="gpu01", phase=mode, verdict="ok") == 1
    assert sorted(p.name for p in out.iterdir()) == [
        ".slurmhealth-gpu01.prom.lock",
        "slurmhealth-gpu01.prom",
    ]


def test_the_environment_overrides_the_config(node, tmp_path):
    node.configure("healthy", metrics_file=str(tmp_path / "from-config.prom"))
    proc = node.run("prolog", SLURMHEALTH_METRICS_FILE=str(tmp_path / "from-env.prom"))
    assert proc.returncode == 0
    assert (tmp_path / "from-env.prom").exists() and not (tmp_path / "from-config.prom").exists()


def test_check_writes_only_when_asked(tmp_path):
    path = tmp_path / "check.prom"
    base = ["--no-db", "--gpu-source", snapshot_path("gpu-lost"), "--sysfs-root", SYSFS]
    base += ["--kmsg", os.path.join(KMSG, "healthy.kmsg"), "--node", "gpu09"]
    run = [sys.executable, "-m", "slurmhealth", "check", *base]
    env = dict(os.environ, SLURMHEALTH_METRICS_FILE=str(path))  # the hooks' variable: not check's
    assert subprocess.run(run, env=env, capture_output=True, check=False).returncode == 1
    assert not path.exists()
    proc = subprocess.run(
        [*run, "--metrics-file", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1, proc.stderr
    samples = parsed(path)
    assert (
        value(samples, "slurmhealth_run_verdict", node="gpu09", phase="check", verdict="fail") == 1
    )


@pytest.mark.parametrize("snapshot, code", [("healthy", 0), ("gpu-lost", 1)])
def test_an_unwritable_directory_is_one_log_line_and_the_verdict_stands(
    node, tmp_path, snapshot, code
):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    node.configure(snapshot, metrics_file=str(not_a_dir / "m.prom"))
    proc = node.run("prolog")
    assert proc.returncode == code
    lines = [line for line in proc.stderr.splitlines() if "metrics" in line]
    assert (
        len(lines) == 1 and "could not write metrics" in lines[0] and "verdict stands" in lines[0]
    ), proc.stderr
    if code:
        assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"


def test_a_bug_in_the_metrics_code_changes_nothing_but_a_log_line(node, tmp_path):
    boom = planted_bug(tmp_path, "slurmhealth.node.metrics", "update")
    node.configure("gpu-lost", metrics_file=str(tmp_path / "m.prom"))
    proc = node.run("prolog", PYTHONPATH=os.pathsep.join([boom, REPO]))
    assert proc.returncode == 1  # the verdict, not the fail-open of an internal error
    assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"
    lines = [line for line in proc.stderr.splitlines() if "metrics" in line]
    assert len(lines) == 1 and lines[0].endswith("verdict stands: bug"), proc.stderr


def test_a_stuck_lock_holder_delays_a_hook_at_most_the_lock_wait(node, tmp_path):
    path = tmp_path / "m.prom"
    node.configure("healthy", metrics_file=str(path))
    with open(tmp_path / ".m.prom.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        proc = node.run("prolog")
        waited = time.monotonic() - started
    assert proc.returncode == 0 and path.exists()  # written unlocked, still whole
    assert metrics.LOCK_WAIT_S <= waited < metrics.LOCK_WAIT_S + 5
    assert (
        value(parsed(path), "slurmhealth_runs_total", node="gpu01", phase="prolog", verdict="ok")
        == 1
    )


def test_a_lock_or_a_file_someone_else_made_in_the_textfile_folder_is_not_ours(node, tmp_path):
    """node_exporter's folder may be its own user's. A lock that user made is not waited on
    (each hook would pay the wait), and counters in a .prom file that user forged are not
    carried on as ours."""
    if os.geteuid() != 0:
        require_real("needs root to give files to another owner")
    path = tmp_path / "m.prom"
    node.configure("healthy", metrics_file=str(path))
    path.write_text('slurmhealth_runs_total{node="gpu01",phase="prolog",verdict="ok"} 5000\n')
    lock = tmp_path / ".m.prom.lock"
    lock.write_text("")
    for planted in (path, lock):
        os.chown(planted, 65534, 65534)
    assert metrics._lock(str(path)) is None  # not taken, so never waited on
    proc = node.run("prolog")
    assert proc.returncode == 0, proc.stderr
    runs = value(parsed(path), "slurmhealth_runs_total", node="gpu01", phase="prolog", verdict="ok")
    assert runs == 1 and path.stat().st_uid == 0


def test_a_folder_symlink_someone_else_planted_gets_neither_the_file_nor_its_lock(tmp_path):
    """The textfile folder reached through a symlink another user made (and could repoint) is
    refused before anything is created there: the lock too, not only the .prom file."""
    if os.geteuid() != 0:
        require_real("needs root to give a symlink to another owner")
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "textfile"
    link.symlink_to(target)
    os.lchown(link, 65534, 65534)
    with pytest.raises(OSError, match="symlink made by"):
        metrics.update(str(link / "m.prom"), a_run(), "gpu01")
    assert list(target.iterdir()) == []


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs: root writes anywhere a plain chmod would forbid."""
    with tmpfs(tmp_path / "ro", "size=64k,ro") as mount:
        yield mount


def test_a_read_only_directory_is_one_log_line_and_the_verdict_stands(node, read_only_dir):
    node.configure("gpu-lost", metrics_file=str(read_only_dir / "m.prom"))
    proc = node.run("prolog")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if "metrics" in line]
    assert len(lines) == 1 and "Read-only file system" in lines[0], proc.stderr
    assert node.slurm()["reason"] == "slurmhealth: GPU 3 GpuIsLost"


def test_concurrent_hooks_keep_the_file_whole_and_count_every_run(node, tmp_path):
    """Many prologs and epilogs at once while a reader parses the file as fast as it can."""
    out = tmp_path / "textfile"
    out.mkdir()
    path = out / "slurmhealth.prom"
    node.configure("thermal", metrics_file=str(path))
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert reader.stdout.readline() == "ready\n"  # its SIGTERM handler is in place
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "slurmhealth", "prolog" if n % 2 else "epilog"],
            env=node.env(job=str(500 + n)),
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(24)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    time.sleep(0.2)
    reader.terminate()
    reads, bad = reader.communicate(timeout=30)[0].split()
    assert int(reads) > 0 and bad == "0", (reads, bad)
    samples = parsed(path)
    runs = {k: v for k, v in samples.items() if k[0] == "slurmhealth_runs_total"}
    assert sum(runs.values()) == 24  # the lock: no run's count lost
    assert (
        value(samples, "slurmhealth_runs_total", node="gpu01", phase="prolog", verdict="warn") == 12
    )
    assert sorted(p.name for p in out.iterdir()) == [".slurmhealth.prom.lock", "slurmhealth.prom"]


# Reads the file in a loop; prints reads and reads that were not a whole file.
# It says "ready" once its handler is set: a SIGTERM before that (a loaded machine can run all
# 24 hooks while the reader still imports its parser) ended it with nothing printed (seen once
# in CI on Python 3.13).
# It ends with os._exit: a SystemExit raised by the handler inside the parser's generator can
# be swallowed there, and the loop ran on (seen once in CI on Python 3.12).
READER = """
import os, signal, sys
from prometheus_client.parser import text_string_to_metric_families as parse
reads = bad = 0
def stop(*_):
    print(reads, bad, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    try:
        text = open(sys.argv[1]).read()
    except FileNotFoundError:
        continue
    reads += 1
    try:
        names = {f.name for f in parse(text)}
        whole = text.endswith("\\n") and {"slurmhealth_build_info", "slurmhealth_drains"} <= names
    except Exception:
        whole = False
    bad += not whole
"""


# --- a real node_exporter -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def node_exporter(tmp_path):
    """node_exporter with only the textfile collector, on a free local port."""
    if NODE_EXPORTER is None:
        require_real("node_exporter not installed (apt-get install prometheus-node-exporter)")
    directory = tmp_path / "textfile"
    directory.mkdir()
    port = _free_port()
    argv = [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile"]
    argv += [
        f"--collector.textfile.directory={directory}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    yield directory, url
    proc.terminate()
    proc.wait(timeout=10)


def test_node_exporter_serves_what_the_hooks_wrote(node, node_exporter):
    directory, url = node_exporter
    # No node has white space, a comma or `=` in its name (Slurm splits on them; the hooks
    # refuse such a name): the rest of the label's hostile characters, maybe
    node.name = 'gpu"01\\x}bad{:"1"}ü'
    node.set_slurm("IDLE", "")
    node.configure("gpu-lost", metrics_file=str(directory / "slurmhealth-{node}.prom"))
    assert node.run("prolog").returncode == 1
    assert node.run("epilog", SLURM_JOB_EXIT_CODE="0").returncode == 1
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    scraped = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scraped[(sample.name, frozenset(sample.labels.items()))] = sample.value
    assert value(scraped, "node_textfile_scrape_error") == 0
    assert (
        value(scraped, "slurmhealth_run_verdict", node=node.name, phase="prolog", verdict="fail")
        == 1
    )
    assert (
        value(scraped, "slurmhealth_run_verdict", node=node.name, phase="epilog", verdict="fail")
        == 1
    )
    assert (
        value(scraped, "slurmhealth_check_status", node=node.name, check="gpu.count", status="fail")
        == 1
    )


def test_a_prolog_writing_metrics_imports_nothing_heavy(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[settings]\ngpu_source = "{snapshot_path("healthy")}"\nsysfs_root = "{SYSFS}"\n'
        f'kmsg = "{os.path.join(KMSG, "healthy.kmsg")}"\n'
        f'metrics_file = "{tmp_path / "m.prom"}"\n'
    )
    env = {"SLURMD_NODENAME": "gpu01", "SLURMHEALTH_CONFIG": str(cfg)}
    env.update(SLURMHEALTH_STATE_DIR=str(tmp_path), SLURM_JOB_ID="1")
    imported(["prolog"], env)  # the first run parses the config and caches it
    modules = imported(["prolog"], dict(env, SLURM_JOB_ID="2"))
    assert "slurmhealth.node.metrics" in modules and (tmp_path / "m.prom").exists()
    assert not modules & (HEAVY | {"tomllib", "tomli"}), modules & HEAVY
