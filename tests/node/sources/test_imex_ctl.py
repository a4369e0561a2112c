"""The imex source: a stand-in nvidia-imex-ctl that prints `-q` and `-N -j` in the forms
NVIDIA's IMEX guide and DCGM show (tests/fixtures/imex), run as a real program."""

from __future__ import annotations

import os

import pytest
from conftest import FIXTURES

from slurmhealth.node.sources import Options, SourceUnavailable, imex

FIX = os.path.join(FIXTURES, "imex")


def stand_in(tmp_path, query: str, domain: str) -> str:
    """A program that logs its arguments and answers `-q` with `query`, `-N -j` with `domain`
    (shell lines)."""
    path = tmp_path / "nvidia-imex-ctl"
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls\n'
        f'case "$1" in\n  -q) {query} ;;\n  -N) {domain} ;;\n  *) exit 2 ;;\nesac\n'
    )
    path.chmod(0o755)
    return str(path)


def test_no_tool_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(imex, "TOOL_PATHS", (str(tmp_path / "none"),))
    with pytest.raises(SourceUnavailable, match="nvidia-imex-ctl is not installed"):
        imex.gather(Options())


def test_both_answers_are_kept_as_printed(tmp_path, monkeypatch):
    tool = stand_in(tmp_path, f"cat {FIX}/query-ready.txt", f"cat {FIX}/domain-up.json")
    monkeypatch.setattr(imex, "TOOL_PATHS", (str(tmp_path / "none"), tool))
    options = Options()
    options.timeouts = {"imex": 4.0}
    raw = imex.gather(options)
    assert raw["tool"] == tool
    assert raw["query"] == {"status": 0, "timed_out": False, "error": None,
                            "lines": ["READY"], "stderr": ""}
    with open(os.path.join(FIX, "domain-up.json"), encoding="utf-8") as handle:
        assert raw["domain"]["lines"] == handle.read().splitlines()
    assert (tmp_path / "calls").read_text() == "-q\n-N -j\n"


def test_a_failing_or_hung_command_is_recorded_not_raised(tmp_path):
    tool = stand_in(tmp_path, "echo 'connection refused' >&2; exit 1", "sleep 30")
    raw = imex.read(tool, 1.0)
    assert raw["query"] == {"status": 1, "timed_out": False, "error": None, "lines": [],
                            "stderr": "connection refused"}
    assert raw["domain"]["timed_out"] is True and raw["domain"]["status"] is None
