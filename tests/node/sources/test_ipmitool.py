"""The bmc source: a stand-in ipmitool that prints a SEL in `sel elist`'s format (ipmitool's
lib/ipmi_sel.c; tests/fixtures/bmc) through an IPMI device node under the host root."""

from __future__ import annotations

import os

import pytest
from conftest import FIXTURES

from slurmhealth.node.sources import Options, SourceUnavailable, bmc

SEL = os.path.join(FIXTURES, "bmc", "sel-elist.txt")


def stand_in_ipmitool(tmp_path, body: str) -> str:
    path = tmp_path / "ipmitool"
    path.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n{body}\n')
    path.chmod(0o755)
    return str(path)


def options(tmp_path, device="dev/ipmi0") -> Options:
    (tmp_path / device).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / device).write_text("")
    out = Options(host_root=str(tmp_path))
    out.timeouts = {"bmc": 2.0}
    return out


def test_no_device_or_no_tool_is_unavailable(tmp_path, monkeypatch):
    with pytest.raises(SourceUnavailable, match="no IPMI device"):
        bmc.gather(Options(host_root=str(tmp_path)))
    monkeypatch.setattr(bmc, "TOOL_PATHS", (str(tmp_path / "none"),))
    with pytest.raises(SourceUnavailable, match="ipmitool is not installed"):
        bmc.gather(options(tmp_path))


@pytest.mark.parametrize("device", ["dev/ipmi0", "dev/ipmi/0", "dev/ipmidev/0"])
def test_the_sel_is_read_through_the_device_found(tmp_path, monkeypatch, device):
    tool = stand_in_ipmitool(tmp_path, f"cat {SEL}")
    monkeypatch.setattr(bmc, "TOOL_PATHS", (tool,))
    raw = bmc.gather(options(tmp_path, device))
    with open(SEL) as handle:
        assert raw["lines"] == handle.read().splitlines()
    assert (tmp_path / "calls").read_text() == "-I open -d 0 sel elist\n"


def test_a_bmc_that_fails_or_hangs_is_an_oserror(tmp_path):
    failing = stand_in_ipmitool(tmp_path, "echo 'Could not open device at /dev/ipmi0' >&2\nexit 1")
    with pytest.raises(OSError, match="exit 1: Could not open device at /dev/ipmi0"):
        bmc.read(failing, "/dev/ipmi0", 2.0)
    hung = stand_in_ipmitool(tmp_path, "sleep 30")
    with pytest.raises(OSError, match="timed out"):
        bmc.read(hung, "/dev/ipmi0", 0.3)
