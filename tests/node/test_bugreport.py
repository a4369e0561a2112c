"""nvidia-bug-report.sh run for an RMA bundle: a stand-in that writes the real script's log
(tests/fixtures/bugreport/README.md), run as a real process in each of its cases."""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import time

import pytest
from conftest import FIXTURES

from slurmhealth.node import bugreport

STAND_IN = os.path.join(FIXTURES, "bugreport", "nvidia-bug-report.sh")


@pytest.fixture
def tool(tmp_path, monkeypatch):
    """The stand-in on PATH (alone there), root's or ours, 0755; its witness file."""
    folder = tmp_path / "bin"
    folder.mkdir()
    path = folder / bugreport.TOOL
    shutil.copy(STAND_IN, path)
    path.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setenv("STANDIN_WITNESS", str(tmp_path / "witness"))
    return str(path)


def witness(tmp_path) -> dict:
    """{key: value} of what the stand-in wrote about itself (pid, cwd, args, child)."""
    with open(tmp_path / "witness", encoding="utf-8") as handle:
        return dict(line.rstrip("\n").split(" ", 1) for line in handle)


def gone(pid: int, within: float = 5.0) -> bool:
    give_up = time.monotonic() + within
    while time.monotonic() < give_up:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_found_on_path_and_absent_without_it(tool, tmp_path, monkeypatch):
    assert bugreport.find() == tool
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert bugreport.find() is None


def test_its_log_is_kept_as_it_wrote_it_from_a_private_folder_that_goes_after(tool, tmp_path):
    with bugreport.collected(tool, 30) as report:
        assert report.note == "" and not report.failed and not report.partial
        with gzip.open(report.path, "rt") as handle:
            log = handle.read()
        seen = witness(tmp_path)
        folder = seen["cwd"]
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert os.path.dirname(report.path) == folder
    # told to write a name of its own folder: the log names no path of this machine
    assert seen["args"] == "--output-file nvidia-bug-report.log"
    assert "command line flags: --output-file nvidia-bug-report.log\n" in log
    assert log.count("____________________________________________") == 3
    assert "Serial Number                         : 1652324020000" in log
    assert not os.path.exists(folder)


def test_a_node_without_gzip_gets_its_plain_log_compressed(tool, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "plain")
    with bugreport.collected(tool, 30) as report:
        assert not report.failed
        with open(report.path, "rb") as handle:
            packed = handle.read()
    assert packed[:2] == b"\x1f\x8b" and packed[4:8] == b"\0\0\0\0"  # gzip, mtime 0
    assert b"command line flags: --output-file nvidia-bug-report.log" in gzip.decompress(packed)


def test_a_log_written_under_umask_0_is_still_read(tool, tmp_path):
    """Its mode is the tool's umask's; no one else can write in the private folder."""
    old = os.umask(0)
    try:
        with bugreport.collected(tool, 30) as report:
            assert stat.S_IMODE(os.stat(report.path).st_mode) == 0o666
            with bugreport.open_log(report.path) as handle:
                assert gzip.decompress(handle.read()).startswith(b"_____")
    finally:
        os.umask(old)


def test_a_log_that_is_a_symlink_is_never_read(tmp_path):
    (tmp_path / "secret").write_text("root's\n")
    (tmp_path / "log").symlink_to(tmp_path / "secret")
    with pytest.raises(OSError):
        bugreport.open_log(str(tmp_path / "log"))


def test_a_hung_report_is_stopped_with_its_children_and_what_it_wrote_kept(
    tool, tmp_path, monkeypatch
):
    monkeypatch.setenv("STANDIN_MODE", "hang")
    started = time.monotonic()
    with bugreport.collected(tool, 1) as report:
        took = time.monotonic() - started
        assert report.partial and report.failed
        assert report.note == "stopped after 1 s: what it wrote by then is kept"
        with gzip.open(report.path, "rt") as handle:
            log = handle.read()
    assert 1 <= took < 5
    assert "Start of NVIDIA bug report log file." in log and "nvidia-smi -q" not in log
    assert gone(int(witness(tmp_path)["child"])), "its sleeping child outlived the timeout"
    assert gone(int(witness(tmp_path)["pid"]))


def test_a_refusal_says_its_last_line(tool, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "fail")
    with bugreport.collected(tool, 30) as report:
        assert report.path is None and report.failed
        assert report.note == "exited 1: ERROR: Please run nvidia-bug-report.sh as root."


def test_ending_without_a_log_is_said(tool, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "silent")
    with bugreport.collected(tool, 30) as report:
        assert report.path is None and report.failed
        assert report.note == "it ended without writing its log"


def test_a_tool_that_cannot_start_is_said(tmp_path):
    broken = tmp_path / bugreport.TOOL
    broken.write_text("not a program\n")
    broken.chmod(0o755)
    with bugreport.collected(str(broken), 30) as report:
        assert report.path is None and report.failed
        assert report.note.startswith("could not run: ")


def test_a_tool_others_may_write_is_refused_and_never_run(tool, tmp_path):
    os.chmod(tool, 0o777)
    assert bugreport.refused(tool) == "writable by group or others (mode 0777)"
    os.chmod(tool, 0o755)
    assert bugreport.refused(tool) is None
    assert not (tmp_path / "witness").exists()
