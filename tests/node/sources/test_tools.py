"""sources/tools.py: real programs run from an argv, stopped in time, their output kept to its
last OUTPUT_MAX bytes however much they write."""

from __future__ import annotations

import os
import resource
import shutil
import threading
import time

import pytest

from slurmhealth.node.sources import tools


def script(tmp_path, body: str) -> str:
    path = tmp_path / "prog"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_program_that_floods_its_output_costs_a_bounded_tail(tmp_path):
    yes = shutil.which("yes")
    assert yes, "coreutils' yes"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ran = tools.run([yes, "slurmhealth"], 1.0)  # hundreds of MB a second until stopped
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert ran.timed_out and ran.status is None
    assert 0 < len(ran.stdout) <= tools.OUTPUT_MAX
    assert ran.stdout.endswith("slurmhealth\n") or ran.stdout.endswith("slurmhealth")
    assert grown_mib < 64, f"the run held {grown_mib:.0f} MiB"


def test_the_last_bytes_of_each_stream_are_kept(tmp_path):
    mib = tools.OUTPUT_MAX
    body = (
        f"head -c {3 * mib} /dev/zero | tr '\\0' a\necho END\n"
        "echo oops >&2\nexit 3"
    )
    ran = tools.run([script(tmp_path, body)], 10.0)
    assert (ran.status, ran.timed_out, ran.error) == (3, False, None)
    assert len(ran.stdout) == mib and ran.stdout.endswith("a" * 10 + "END\n")
    assert ran.stderr == "oops\n"


def test_a_grandchild_holding_the_output_open_is_not_waited_for(tmp_path):
    # setsid: the grandchild leaves the program's group, so it is not stopped with it, and
    # keeps the pipe open for 5 s after the program itself ended
    body = "setsid sleep 5 &\necho done\nexit 0"
    started = time.monotonic()
    ran = tools.run([script(tmp_path, body)], 10.0)
    assert time.monotonic() - started < 3
    assert (ran.status, ran.stdout) == (0, "done\n")


def test_a_program_that_cannot_start_says_why(tmp_path):
    ran = tools.run([str(tmp_path / "missing")], 1.0)
    assert ran.error and ran.status is None


def test_a_ctrl_c_while_the_readers_start_still_stops_the_program(tmp_path, monkeypatch):
    """Thread.start waits for the new thread to run: on a loaded machine Ctrl-C (at `rma`) can
    come there, before the wait. The program, in a session of its own, never hears it: it is
    stopped all the same (it was left running, and rma's test saw it outlive rma)."""
    witness = tmp_path / "pid"
    # written whole, then renamed: the witness never exists half written
    prog = script(tmp_path, f"echo $$ > {witness}.new\nmv {witness}.new {witness}\nexec sleep 300")
    real = threading.Thread.start

    def interrupted(self) -> None:
        deadline = time.monotonic() + 10
        while not witness.exists() and time.monotonic() < deadline:  # the program runs
            time.sleep(0.01)
        real(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tools.run([prog], 60.0)
    monkeypatch.undo()
    pid = int(witness.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped: no such process
        os.kill(pid, 0)
