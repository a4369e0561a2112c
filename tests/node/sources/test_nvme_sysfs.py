"""The nvme source: a sysfs tree in the kernel's layout (Documentation/ABI/testing/
sysfs-class-nvme; drivers/nvme/host/hwmon.c) and a stand-in nvme-cli that prints a smart-log
in nvme-cli's JSON (tests/fixtures/nvme, nvme-print-json.c json_smart_log's names)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import FIXTURES

from slurmhealth.node.sources import Options, SourceUnavailable, nvme

SMART = os.path.join(FIXTURES, "nvme")


def controller(root, name: str, state="live", hwmon_under_device=False, dev=True, **temps):
    """One controller: its identity files (space-padded as Identify gives them), a hwmon
    device with the composite temperature in millidegrees, and its /dev node."""
    base = root / "sys" / "class" / "nvme" / name
    base.mkdir(parents=True)
    for key, value in {"state": state, "model": "SAMPLE NVMe 3.84TB                      ",
                       "serial": f"S6X0NA0T{name[-1]}00001   ", "firmware_rev": "GDC7302Q"}.items():
        (base / key).write_text(value + "\n")
    hwmon = (base / "device" / "hwmon" if hwmon_under_device else base) / "hwmon3"
    hwmon.mkdir(parents=True)
    values = {"temp1_input": 41850, "temp1_max": 84850, "temp1_crit": 89850, "temp1_alarm": 0}
    for key, value in {**values, **temps}.items():
        (hwmon / key).write_text(f"{value}\n")
    if dev:
        (root / "dev").mkdir(exist_ok=True)
        (root / "dev" / name).write_text("")


def stand_in_nvme(tmp_path, fixture: str, status: int = 0):
    """An nvme-cli that prints `fixture` for `smart-log DEV -o json` and logs its argv."""
    path = tmp_path / "nvme"
    path.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n'
        f'[ "$1 $3 $4" = "smart-log -o json" ] || exit 22\ncat {SMART}/{fixture}\nexit {status}\n'
    )
    path.chmod(0o755)
    return str(path)


def test_no_nvme_class_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable):
        nvme.read(str(tmp_path), None, 1.0)


def test_sysfs_only_without_nvme_cli(tmp_path):
    controller(tmp_path, "nvme0")
    controller(tmp_path, "nvme1", hwmon_under_device=True)
    raw = nvme.read(str(tmp_path), None, 1.0)
    assert raw["tool"] is None
    first = raw["controllers"]["nvme0"]
    assert first["state"] == "live" and first["firmware_rev"] == "GDC7302Q"
    assert first["hwmon"] == {"temp1_input": "41850", "temp1_max": "84850",
                              "temp1_crit": "89850", "temp1_alarm": "0"}
    assert raw["controllers"]["nvme1"]["hwmon"]["temp1_input"] == "41850"
    assert "smart" not in first


def test_smart_log_through_the_tool_for_each_controller_with_a_device(tmp_path):
    controller(tmp_path, "nvme0")
    controller(tmp_path, "nvme1", dev=False)
    tool = stand_in_nvme(tmp_path, "smart-log-healthy.json")
    raw = nvme.read(str(tmp_path), tool, 5.0)
    with open(os.path.join(SMART, "smart-log-healthy.json")) as handle:
        assert raw["controllers"]["nvme0"]["smart"] == json.load(handle)
    assert raw["controllers"]["nvme1"]["smart"] is None
    assert raw["controllers"]["nvme1"]["smart_error"] == f"no {tmp_path}/dev/nvme1"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"smart-log {tmp_path}/dev/nvme0 -o json"]
    json.dumps(raw)  # a snapshot section


def test_a_failing_or_hung_tool_is_said_per_controller(tmp_path):
    controller(tmp_path, "nvme0")
    failing = stand_in_nvme(tmp_path, "smart-log-healthy.json", status=1)
    got = nvme.read(str(tmp_path), failing, 5.0)["controllers"]["nvme0"]
    assert (got["smart"], got["smart_error"]) == (None, "exit 1")
    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\nsleep 30\n")
    hung.chmod(0o755)
    got = nvme.read(str(tmp_path), str(hung), 0.3)["controllers"]["nvme0"]
    assert (got["smart"], got["smart_error"]) == (None, "timed out")


def test_gather_reads_under_the_host_root_within_its_timeout(tmp_path, monkeypatch):
    controller(tmp_path, "nvme0")
    monkeypatch.setattr(nvme, "TOOL_PATHS", (stand_in_nvme(tmp_path, "smart-log-healthy.json"),))
    options = Options(host_root=str(tmp_path))
    options.timeouts = {"nvme": 2.0}
    assert nvme.gather(options)["controllers"]["nvme0"]["smart"]["percent_used"] == 3


def test_this_machines_own_nvme_reads_sanely():
    """A live read of this machine: no NVMe is unavailable; else each controller's state and
    temperature are as the kernel writes them."""
    try:
        raw = nvme.read("/", None, 1.0)
    except SourceUnavailable:
        assert not os.path.isdir("/sys/class/nvme")
        return
    for name, ctrl in raw["controllers"].items():
        assert name.startswith("nvme")
        assert ctrl["state"] in ("new", "live", "resetting", "connecting", "deleting",
                                 "deleting (no IO)", "dead", None)
        temp = (ctrl["hwmon"] or {}).get("temp1_input")
        assert temp is None or 0 < int(temp) < 150000
