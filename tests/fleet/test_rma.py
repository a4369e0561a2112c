"""`slurmhealth rma NODE`: the archive opened member by member, from real node and fleet stores
as the hooks leave them, through the real command; on the node itself with the
nvidia-bug-report.sh stand-in (tests/fixtures/bugreport) present, absent and hanging."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time

import pytest
from conftest import (
    FIXTURES,
    NOBODY,
    diag_records,
    outcome,
    run_as_nobody,
    run_cli,
    snapshot_path,
)
from stores import export_text, node_store

from slurmhealth.core import store, timespec
from slurmhealth.fleet import records, rma

STAND_IN = os.path.join(FIXTURES, "bugreport", "nvidia-bug-report.sh")
MEMBERS = (
    "manifest.json",
    "versions.json",
    "history.ndjson",
    "xids.ndjson",
    "counters.ndjson",
    "diagnoses.ndjson",
    "recorded-facts.json",
)
SECRET = "slurmhealth: only-gpu02-says-this"


@pytest.fixture
def stores_of(tmp_path):
    """Node stores of gpu01 and gpu02 as the hooks leave them (a job's prolog and epilog, a
    health check, a drain), each with a diagnosis, gpu02 with a reason of its own; and a fleet
    store that collected both. {"state": the state dir, "fleet": the fleet store's path}."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    fleet = store.connect(str(tmp_path / "fleet" / "fleet.db"))
    for node in ("gpu01", "gpu02"):
        conn = node_store(str(state / f"{node}.db"), node)
        figures = {"gpu0_tflops": 700.0 if node == "gpu01" else 650.0}
        probes = {"gpu_tests": [outcome("gpu", figures, "fail" if node == "gpu01" else "pass")]}
        store.record_run(conn, diag_records(node, time.time(), probes))
        if node == "gpu02":
            store.record_action(conn, node, "drain", SECRET, "admin")
        records.import_ndjson(fleet, io.BytesIO(export_text(conn).encode()))
        conn.close()
    fleet.close()
    return {"state": state, "fleet": str(tmp_path / "fleet" / "fleet.db")}


def opened(path) -> dict:
    """{member name (its folder dropped): (TarInfo, bytes)} in the archive's order."""
    out = {}
    with tarfile.open(path, "r:gz") as tar:
        members = tar.getmembers()
        folder = members[0]
        assert folder.isdir() and stat.S_IMODE(folder.mode) == 0o700
        for info in members[1:]:
            prefix, _, name = info.name.partition("/")
            assert prefix == folder.name and "/" not in name, info.name
            out[name] = (info, tar.extractfile(info).read())
    return out


def ndjson(data: bytes) -> list:
    return [json.loads(line) for line in data.decode().splitlines()]


def later() -> str:
    """A --now just after the records the fixture made (their times are the clock's)."""
    return timespec.iso(time.time() + 60)


def fleet_rma(stores_of, tmp_path, *args: str, node: str = "gpu01"):
    out = tmp_path / f"{node}.tar.gz"
    proc = run_cli("rma", node, "--db", stores_of["fleet"], "-o", str(out), *args)
    return proc, out


# --- from the fleet store (the head node) ----------------------------------------------------


def test_the_bundle_holds_the_nodes_records_member_by_member(stores_of, tmp_path):
    proc, out = fleet_rma(stores_of, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    got = opened(out)
    assert tuple(got) == MEMBERS
    for info, data in got.values():
        assert stat.S_IMODE(info.mode) == 0o600 and info.isreg()
        assert (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")
        assert info.size == len(data)

    fleet = store.connect(stores_of["fleet"])
    manifest = json.loads(got["manifest.json"][1])
    assert manifest["format"] == "slurmhealth-rma/1" and manifest["node"] == "gpu01"
    assert manifest["store"] == "named" and manifest["on_node"] is False
    assert [m["name"] for m in manifest["members"]] == list(MEMBERS[1:])
    assert [m["name"] for m in manifest["missing"]] == ["snapshot.json", "nvidia-bug-report.log.gz"]
    why = {m["name"]: m["why"] for m in manifest["missing"]}
    assert why["snapshot.json"].startswith("no snapshot: one is taken only on gpu01 itself")
    assert why["nvidia-bug-report.log.gz"] == "nvidia-bug-report.sh is run only on gpu01 itself"

    history = ndjson(got["history.ndjson"][1])
    runs = [r for r in history if r["kind"] == "run"]
    expected = fleet.execute(
        "SELECT id FROM runs WHERE node = 'gpu01' AND verdict != 'ok' AND phase != 'diag' "
        "ORDER BY started, id"
    ).fetchall()
    assert [r["id"] for r in runs] == [i for (i,) in expected] and len(runs) == 3
    assert all(r["verdict"] != "ok" and r["results"] for r in runs)
    ecc = next(r for r in runs if r["phase"] == "epilog")
    assert {x["check"] for x in ecc["results"]} >= {"gpu.ecc"}
    assert all(isinstance(x["data"], dict) for r in runs for x in r["results"])
    (drain,) = [r for r in history if r["kind"] == "action"]
    assert drain["action"] == "drain" and drain["reason"] == "slurmhealth: gpu.ecc"
    assert [r.get("started", r.get("time")) for r in history] == sorted(
        r.get("started", r.get("time")) for r in history
    )

    xids = ndjson(got["xids.ndjson"][1])
    stored = fleet.execute("SELECT id, text FROM events WHERE node = 'gpu01' ORDER BY time, id")
    assert [(x["id"], x["text"]) for x in xids] == stored.fetchall()
    assert any(x["code"] == 79 and x["text"] == "GPU has fallen off the bus." for x in xids)

    (diagnosis,) = ndjson(got["diagnoses.ndjson"][1])
    assert diagnosis["phase"] == "diag" and diagnosis["verdict"] == "fail"
    (probe,) = diagnosis["results"]
    assert probe["data"]["outcomes"][0]["figures"] == {"gpu0_tflops": 700.0}

    counters = ndjson(got["counters.ndjson"][1])
    count = fleet.execute("SELECT count(*) FROM counters WHERE node = 'gpu01'").fetchone()[0]
    assert len(counters) == count > 0
    assert manifest["counts"] == {
        "runs_not_passed": 3, "actions": 1, "xid_events": len(xids),
        "counter_readings": count, "diagnoses": 1,
    }  # fmt: skip

    versions = json.loads(got["versions.json"][1])
    (span,) = versions["recorded"]["gpu"]
    assert span["versions"]["driver"] == "550.90.07" and span["runs"] >= 3
    assert versions["devices"] is None  # a fleet store keeps no device of the node
    facts = json.loads(got["recorded-facts.json"][1])
    newest = fleet.execute(
        "SELECT id FROM runs WHERE node = 'gpu01' ORDER BY started DESC, id DESC LIMIT 1"
    ).fetchone()[0]
    assert facts["newest_run"]["id"] == newest and facts["baselines"] == {}

    (line, *without) = proc.stdout.splitlines()
    assert line.startswith(f"{out}: gpu01, ")
    assert line.endswith(
        f"from the store --db names: 3 runs that did not pass, 1 action, {len(xids)} Xid "
        f"events, {count} counter readings, 1 diagnosis"
    )
    assert without == [
        f"  without snapshot.json: {why['snapshot.json']}",
        "  without nvidia-bug-report.log.gz: nvidia-bug-report.sh is run only on gpu01 itself",
    ]


def test_nothing_of_another_node_is_in_the_bundle(stores_of, tmp_path):
    proc, out = fleet_rma(stores_of, tmp_path)
    assert proc.returncode == 0, proc.stderr
    fleet = store.connect(stores_of["fleet"])
    theirs = {i for (i,) in fleet.execute("SELECT id FROM runs WHERE node = 'gpu02'")}
    theirs |= {i for (i,) in fleet.execute("SELECT id FROM events WHERE node = 'gpu02'")}
    theirs |= {i for (i,) in fleet.execute("SELECT id FROM actions WHERE node = 'gpu02'")}
    assert len(theirs) > 5
    for name, (_info, data) in opened(out).items():
        text = data.decode()
        assert "gpu02" not in text and SECRET not in text, name
        assert not [i for i in theirs if i in text], name
    # and gpu02's own bundle holds its secret: the filter, not an empty store, kept it out
    proc, out = fleet_rma(stores_of, tmp_path, node="gpu02")
    assert proc.returncode == 0, proc.stderr
    assert SECRET in opened(out)["history.ndjson"][1].decode()


def test_the_same_store_and_now_give_the_same_bytes_and_no_path_of_this_machine(
    stores_of, tmp_path
):
    now = later()
    first = fleet_rma(stores_of, tmp_path, "--now", now)[1].read_bytes()
    os.rename(tmp_path / "gpu01.tar.gz", tmp_path / "first.tar.gz")
    second = fleet_rma(stores_of, tmp_path, "--now", now)[1].read_bytes()
    assert first == second
    assert gzip.decompress(first)  # one gzip stream, named nothing
    assert first[3] & 0x08 == 0  # FNAME unset: the header names no file
    for name, (info, data) in opened(tmp_path / "gpu01.tar.gz").items():
        assert str(tmp_path) not in data.decode(), name
        assert info.mtime == int(timespec.parse_instant(now))


def test_since_bounds_the_history(stores_of, tmp_path):
    proc, out = fleet_rma(stores_of, tmp_path, "--now", later(), "--since", "1s")
    assert proc.returncode == 0, proc.stderr
    got = opened(out)
    assert got["history.ndjson"][1] == got["xids.ndjson"][1] == b""
    manifest = json.loads(got["manifest.json"][1])
    assert manifest["counts"]["runs_not_passed"] == 0
    assert json.loads(got["recorded-facts.json"][1])["newest_run"] is not None


def test_the_default_name_is_the_nodes_and_the_time_here(stores_of, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    proc = run_cli(
        "rma", "gpu01", "--db", stores_of["fleet"], "--now", "2030-01-02T03:04:05", cwd=str(here)
    )
    assert proc.returncode == 0, proc.stderr
    name = "slurmhealth-rma-gpu01-20300102T030405Z"
    assert os.listdir(here) == [f"{name}.tar.gz"]
    with tarfile.open(here / f"{name}.tar.gz") as tar:
        assert tar.getnames()[:2] == [name, f"{name}/manifest.json"]


def test_the_archive_is_private_whatever_the_umask_and_replaces_a_file_there(
    stores_of, tmp_path
):
    out = tmp_path / "gpu01.tar.gz"
    out.write_text("an older bundle\n")
    out.chmod(0o644)
    proc = subprocess.run(
        ["sh", "-c", 'umask 0; exec "$0" -m slurmhealth "$@"', sys.executable,
         "rma", "gpu01", "--db", stores_of["fleet"], "-o", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert "manifest.json" in opened(out)
    assert sorted(os.listdir(tmp_path)) == ["fleet", "gpu01.tar.gz", "state"]


def test_a_symlink_planted_at_the_output_is_refused_and_its_target_untouched(stores_of, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    out = tmp_path / "gpu01.tar.gz"
    out.symlink_to(victim)
    proc = run_cli("rma", "gpu01", "--db", stores_of["fleet"], "-o", str(out))
    assert proc.returncode == 1
    assert proc.stderr == f"Error: {out}: a symlink: not replaced\n"
    assert victim.read_text() == "root's file\n" and out.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["fleet", "gpu01.tar.gz", "state", "victim"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gpu99",), "no records of node gpu99 in {fleet}"),
        (("gpu01", "-o", "{tmp}/missing/o.tar.gz"), "{tmp}/missing/o.tar.gz: no such directory"),
        (("gpu01", "-o", "{tmp}/fifo"), "{tmp}/fifo: not a regular file: not replaced"),
        (("gpu01", "--db", "{tmp}/nothing.db"), "no store at {tmp}/nothing.db"),
        (("gpu01", "--db", "{tmp}/state"), "{tmp}/state: not a regular file"),
    ],
)
def test_user_errors_are_one_line_and_exit_1(stores_of, tmp_path, args, message):
    fill = {"tmp": str(tmp_path), "fleet": stores_of["fleet"]}
    os.mkfifo(tmp_path / "fifo")
    argv = [a.format(**fill) for a in args]
    if "--db" not in argv:
        argv += ["--db", stores_of["fleet"]]
    if "-o" not in argv:
        argv += ["-o", str(tmp_path / "out.tar.gz")]
    proc = run_cli("rma", *argv)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"Error: {message.format(**fill)}\n"
    assert not (tmp_path / "out.tar.gz").exists()


def test_a_store_that_is_no_store_is_one_line(tmp_path):
    other = tmp_path / "other.db"
    other.write_bytes(b"not sqlite at all, but long enough to be looked at" * 100)
    proc = run_cli("rma", "gpu01", "--db", str(other), "-o", str(tmp_path / "o.tar.gz"))
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("Error: ") and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("node", "shown"),
    [("../etc/x", "'../etc/x'"), ("gpu[01-02]", "'gpu[01-02]'"), ("gpu\x1b]0;x", "'gpu\\x1b]0;x'")],
)
def test_a_node_argument_that_is_no_node_name_is_a_usage_line(tmp_path, node, shown):
    proc = run_cli("rma", node, "-o", str(tmp_path / "o.tar.gz"))
    assert proc.returncode == 2
    said = f"Invalid value for 'NODE': not a node name: {shown}"
    assert proc.stderr == f"Error: {said} (see 'slurmhealth rma --help')\n"
    assert os.listdir(tmp_path) == []


def test_a_user_who_may_not_read_the_store_is_told_in_one_line(stores_of, public_dir):
    fleet = public_dir / "fleet.db"
    shutil.copy(stores_of["fleet"], fleet)
    fleet.chmod(0o600)
    mine = public_dir / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    proc = run_as_nobody("rma", "gpu01", "--db", str(fleet), "-o", str(mine / "o.tar.gz"))
    assert proc.returncode == 1
    assert proc.stderr == (
        f"Error: cannot read {fleet} (permission denied): rma needs root, or --db a copy you own\n"
    )
    assert os.listdir(mine) == []


def test_an_output_directory_the_user_may_not_write_is_said_before_any_work(
    stores_of, public_dir
):
    mine = public_dir / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    fleet = mine / "fleet.db"
    shutil.copy(stores_of["fleet"], fleet)
    os.chown(fleet, NOBODY, NOBODY)
    out = public_dir / "o.tar.gz"
    proc = run_as_nobody("rma", "gpu01", "--db", str(fleet), "-o", str(out))
    assert proc.returncode == 1
    assert proc.stderr == f"Error: {out}: its directory is not writable (permission denied)\n"
    assert not out.exists()
    # the same user writes where it may
    proc = run_as_nobody("rma", "gpu01", "--db", str(fleet), "-o", str(mine / "o.tar.gz"))
    assert proc.returncode == 0, proc.stderr
    assert os.stat(mine / "o.tar.gz").st_uid == NOBODY


# --- on the node itself: a snapshot, and nvidia-bug-report.sh ---------------------------------


@pytest.fixture
def on_node(stores_of, tmp_path):
    """The environment of `rma gpu01` run on gpu01 itself: its own store, no fleet store
    named, PATH holding the stand-in alone (its witness file beside it)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(STAND_IN, folder / "nvidia-bug-report.sh")
    (folder / "nvidia-bug-report.sh").chmod(0o755)
    return {
        "SLURMD_NODENAME": "gpu01",
        "SLURMHEALTH_STATE_DIR": str(stores_of["state"]),
        "SLURMHEALTH_DB": "",
        "SLURMHEALTH_FLEET_DB": "",
        "PATH": str(folder),
        "STANDIN_WITNESS": str(tmp_path / "witness"),
    }


def node_rma(tmp_path, env: dict, *args: str):
    out = tmp_path / "gpu01.tar.gz"
    replay = ("--gpu-source", snapshot_path("healthy"))
    proc = run_cli("rma", "gpu01", "-o", str(out), *replay, *args, env=env)
    return proc, out


def test_on_the_node_a_snapshot_and_the_bug_report_come_from_the_node_itself(on_node, tmp_path):
    proc, out = node_rma(tmp_path, on_node)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    got = opened(out)
    assert tuple(got) == (
        "manifest.json", "snapshot.json", "versions.json", "history.ndjson", "xids.ndjson",
        "counters.ndjson", "diagnoses.ndjson", "nvidia-bug-report.log.gz",
    )  # fmt: skip
    manifest = json.loads(got["manifest.json"][1])
    assert manifest["store"] == "node" and manifest["on_node"] is True
    assert manifest["missing"] == []
    assert manifest["members"][-1] == {
        "name": "nvidia-bug-report.log.gz", "what": "nvidia-bug-report.sh's log", "partial": False,
    }  # fmt: skip
    with open(snapshot_path("healthy"), encoding="utf-8") as handle:
        replayed = json.load(handle)
    snapshot = json.loads(got["snapshot.json"][1])
    assert snapshot["node"] == "gpu01" and snapshot["gpu"] == replayed["gpu"]

    devices = json.loads(got["versions.json"][1])["devices"]
    serials = [d["serial"] for d in replayed["gpu"]["devices"]]
    assert [g["serial"] for g in devices["gpus"]] == serials
    assert devices["gpus"][0]["uuid"] == replayed["gpu"]["devices"][0]["uuid"]
    assert devices["gpus"][0]["vbios"] == "96.00.99.00.01" and devices["driver"] == "550.90.07"

    log = gzip.decompress(got["nvidia-bug-report.log.gz"][1]).decode()
    assert "command line flags: --output-file nvidia-bug-report.log\n" in log
    assert "Serial Number                         : 1652324020000" in log
    for name, (_info, data) in got.items():
        text = gzip.decompress(data).decode() if name.endswith(".gz") else data.decode()
        assert str(tmp_path) not in text, name
    assert len(ndjson(got["history.ndjson"][1])) == 4  # its own store: 3 runs and a drain


def test_on_the_node_without_the_tool_the_bundle_says_so(on_node, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc, out = node_rma(tmp_path, {**on_node, "PATH": str(empty)})
    assert proc.returncode == 0, proc.stderr
    got = opened(out)
    assert "nvidia-bug-report.log.gz" not in got and "snapshot.json" in got
    manifest = json.loads(got["manifest.json"][1])
    assert manifest["missing"] == [
        {"name": "nvidia-bug-report.log.gz", "why": "nvidia-bug-report.sh is not on PATH"}
    ]
    assert proc.stdout.splitlines()[1:] == [
        "  without nvidia-bug-report.log.gz: nvidia-bug-report.sh is not on PATH"
    ]


def test_no_bug_report_runs_nothing(on_node, tmp_path):
    proc, out = node_rma(tmp_path, on_node, "--no-bug-report")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "witness").exists()
    manifest = json.loads(opened(out)["manifest.json"][1])
    assert manifest["missing"] == [
        {"name": "nvidia-bug-report.log.gz", "why": "not asked for (--no-bug-report)"}
    ]


def test_a_hung_bug_report_is_stopped_and_the_bundle_written_with_what_it_wrote(
    on_node, tmp_path
):
    started = time.monotonic()
    proc, out = node_rma(
        tmp_path, {**on_node, "STANDIN_MODE": "hang"}, "--bug-report-timeout", "1"
    )
    assert time.monotonic() - started < 30
    assert proc.returncode == rma.EXIT_INCOMPLETE, proc.stderr
    assert proc.stderr == (
        "slurmhealth rma: nvidia-bug-report.sh: stopped after 1 s: what it wrote by then is kept\n"
    )
    got = opened(out)
    log = gzip.decompress(got["nvidia-bug-report.log.gz"][1]).decode()
    assert "Start of NVIDIA bug report log file." in log
    entry = json.loads(got["manifest.json"][1])["members"][-1]
    assert entry["partial"] is True and "stopped after 1 s" in entry["what"]
    with open(tmp_path / "witness", encoding="utf-8") as handle:
        child = int(dict(line.rstrip().split(" ", 1) for line in handle)["child"])
    give_up = time.monotonic() + 5
    while time.monotonic() < give_up and _running(child):
        time.sleep(0.05)
    assert not _running(child), "the tool's child outlived the bundle"


def test_an_interrupted_bundle_stops_the_bug_report_and_leaves_nothing(on_node, tmp_path):
    """Ctrl-C reaches `rma`, not the tool (a session of its own): rma stops it on its way out."""
    env = _absolute_env({**on_node, "STANDIN_MODE": "hang"})
    out = tmp_path / "gpu01.tar.gz"
    # as a terminal's foreground job: Ctrl-C is heard even where the tests themselves run in
    # the background of a shell, which ignores SIGINT for them and their children
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", "rma", "gpu01", "-o", str(out),
         "--gpu-source", snapshot_path("healthy")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    seen: dict = {}
    give_up = time.monotonic() + 30
    while "child" not in seen and time.monotonic() < give_up:
        time.sleep(0.05)
        if (tmp_path / "witness").exists():
            with open(tmp_path / "witness", encoding="utf-8") as handle:
                seen = dict(line.rstrip().split(" ", 1) for line in handle if " " in line)
    assert "child" in seen, proc.communicate(timeout=10)
    proc.send_signal(signal.SIGINT)
    _stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "Traceback" not in stderr
    for pid in (seen["child"], seen["pid"]):
        give_up = time.monotonic() + 5
        while time.monotonic() < give_up and _running(pid):
            time.sleep(0.05)
        assert not _running(pid), "the tool outlived an interrupted rma"
    assert not os.path.exists(seen["cwd"]) and not out.exists()
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


def _running(pid) -> bool:
    """Whether the process runs: a zombie is dead, only not yet reaped (a killed tool's child
    is reparented to PID 1, which in a container may reap it late)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _absolute_env(env: dict) -> dict:
    full = dict(os.environ, **env)
    if full.get("PYTHONPATH"):
        full["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in full["PYTHONPATH"].split(os.pathsep)
        )
    return full


def test_a_failed_bug_report_is_said_and_the_bundle_still_written(on_node, tmp_path):
    proc, out = node_rma(tmp_path, {**on_node, "STANDIN_MODE": "fail"})
    assert proc.returncode == rma.EXIT_INCOMPLETE
    said = "exited 1: ERROR: Please run nvidia-bug-report.sh as root."
    assert proc.stderr == f"slurmhealth rma: nvidia-bug-report.sh: {said}\n"
    manifest = json.loads(opened(out)["manifest.json"][1])
    assert manifest["missing"] == [{"name": "nvidia-bug-report.log.gz", "why": said}]


def test_a_bug_report_others_may_write_is_never_run(on_node, tmp_path):
    os.chmod(tmp_path / "bin" / "nvidia-bug-report.sh", 0o777)
    proc, out = node_rma(tmp_path, on_node)
    assert proc.returncode == rma.EXIT_INCOMPLETE
    assert not (tmp_path / "witness").exists()
    why = "nvidia-bug-report.sh not run: writable by group or others (mode 0777)"
    assert proc.stderr == f"slurmhealth rma: nvidia-bug-report.sh: {why}\n"
    assert "nvidia-bug-report.log.gz" not in opened(out)


def test_help_never_acts(on_node, tmp_path):
    proc = run_cli("rma", "gpu01", "--help", env=on_node, cwd=str(tmp_path))
    assert proc.returncode == 0 and "Example:" in proc.stdout
    assert not (tmp_path / "witness").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tar.gz")]


def test_another_node_than_this_one_is_read_from_the_fleet_store_with_no_live_parts(
    on_node, stores_of, tmp_path
):
    env = {**on_node, "SLURMHEALTH_FLEET_DB": stores_of["fleet"]}
    out = tmp_path / "gpu02.tar.gz"
    proc = run_cli("rma", "gpu02", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "witness").exists()
    manifest = json.loads(opened(out)["manifest.json"][1])
    assert manifest["store"] == "fleet" and manifest["on_node"] is False


# --- the parts, pure ---------------------------------------------------------------------------


def test_the_store_read_is_the_named_one_then_the_fleets_then_the_nodes_own(monkeypatch):
    monkeypatch.delenv("SLURMHEALTH_FLEET_DB", raising=False)
    monkeypatch.setenv("SLURMHEALTH_STATE_DIR", "/state")
    monkeypatch.delenv("SLURMHEALTH_DB", raising=False)
    assert rma.store_for("/x.db", "gpu01", True) == ("/x.db", "named")
    assert rma.store_for(None, "gpu01", True) == ("/state/gpu01.db", "node")
    assert rma.store_for(None, "gpu01", False) == ("/var/lib/slurmhealth/fleet.db", "fleet")
    monkeypatch.setenv("SLURMHEALTH_FLEET_DB", "/f.db")
    assert rma.store_for(None, "gpu01", True) == ("/f.db", "fleet")


def test_versions_are_spans_per_source_that_a_failed_source_does_not_split():
    gpu_a = {"gpu": {"status": "ok", "versions": {"driver": "535.1"}}}
    gpu_b = {"gpu": {"status": "ok", "versions": {"driver": "550.2"}}}
    ib = {"ib": {"status": "ok", "versions": {"fw_ver": {"mlx5_0": "28.1"}}}}
    gpu_down = {"gpu": {"status": "timeout"}, **ib}
    rows = [
        (100.0, json.dumps({**gpu_a, **ib})),
        (200.0, json.dumps(gpu_down)),
        (300.0, json.dumps({**gpu_a, **ib})),
        (400.0, json.dumps({**gpu_b, **ib})),
        (500.0, "{not json"),
    ]
    spans = rma.versions(iter(rows))
    assert list(spans) == ["gpu", "ib"]
    assert [(s["from"], s["to"], s["runs"], s["versions"]) for s in spans["gpu"]] == [
        (timespec.iso(100), timespec.iso(300), 2, {"driver": "535.1"}),
        (timespec.iso(400), timespec.iso(400), 1, {"driver": "550.2"}),
    ]
    (ib_span,) = spans["ib"]
    assert (ib_span["runs"], ib_span["versions"]) == (4, {"fw_ver": {"mlx5_0": "28.1"}})


def test_devices_come_from_a_snapshot_or_a_node_stores_inventory():
    with open(snapshot_path("healthy"), encoding="utf-8") as handle:
        doc = json.load(handle)
    found = rma.devices_of(doc)
    assert len(found["gpus"]) == 8 and found["gpus"][3]["index"] == 3
    assert set(found["gpus"][0]) == {
        "index", "name", "serial", "uuid", "bus_id", "vbios", "memory_total", "arch",
    }  # fmt: skip
    inventory = {
        str(i): {"uuid": f"GPU-{i}", "bus_id": f"0000:{i:02x}:00.0", "serial": str(i)}
        for i in (10, 2, 0)
    }
    recorded = rma.devices_recorded({"gpu": {"data": {"inventory": inventory}}})
    assert [g["index"] for g in recorded["gpus"]] == [0, 2, 10]
    assert rma.devices_recorded({}) is None
    assert rma.devices_of({"gpu": None, "ib": "forged"}) == {
        "driver": None, "cuda": None, "gpus": [], "hcas": [], "nvme": [],
    }  # fmt: skip
