"""sources/tools.py: real programs run from an argv, stopped in time, their output kept to its
last OUTPUT_MAX bytes however much they write."""

from __future__ import annotations

import resource
import shutil
import time

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
