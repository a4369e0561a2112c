"""The site source runs a real executable standing in for NHC, which prints as NHC's die()
does ("ERROR:  nhc:  Health check failed:  <check>:  <what>", LBNL NHC's nhc script) and exits
as told."""

from __future__ import annotations

import os
import time

import pytest
from conftest import FIXTURES

from slurmhealth.node.sources import Options, SourceUnavailable, site


def stand_in_nhc(tmp_path, body: str) -> str:
    path = tmp_path / "nhc"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_none_configured_is_unavailable():
    with pytest.raises(SourceUnavailable, match="no site health check configured"):
        site.gather(Options())


def test_a_failing_nhc_is_recorded_with_its_status_and_last_lines(tmp_path):
    failing = os.path.join(FIXTURES, "nhc", "failing.out")
    program = stand_in_nhc(tmp_path, f"echo 'Node Health Check starting.'\ncat {failing}\nexit 1")
    raw = site.gather(Options(site_program=program))
    assert (raw["program"], raw["status"], raw["timed_out"], raw["error"]) == (
        program, 1, False, None)
    assert raw["lines"] == [
        "Node Health Check starting.",
        "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted",
    ]


def test_a_program_that_cannot_run_says_why(tmp_path):
    assert site.run("nhc", 1.0)["error"] == "not an absolute path"
    assert site.run(str(tmp_path / "nhc"), 1.0)["error"] == "not an executable file"


def test_a_hung_program_and_its_children_are_stopped_in_time(tmp_path):
    marker = tmp_path / "child-lived"
    program = stand_in_nhc(tmp_path, f"(sleep 2; touch {marker}) &\nsleep 30")
    started = time.monotonic()
    raw = site.run(program, 0.5)
    assert raw["timed_out"] and raw["status"] is None
    assert time.monotonic() - started < 5
    time.sleep(2.5)
    assert not marker.exists(), "a child of the program outlived it"
