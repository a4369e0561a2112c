"""`slurmhealth check --gpu-source FILE` on damaged snapshots: a one-line error (exit 2) or a
verdict that fails the node (exit 1), never a traceback and never a silent pass (exit 0).

A snapshot is a file an admin replays, possibly one a node wrote while failing, or one edited by
hand: deep nesting and a wrong type at any level are input errors. Each case is built from the
healthy snapshot (tests/fixtures/snapshots/faults.py) and run through the real command.
"""

from __future__ import annotations

import json

import pytest
from conftest import faults_module, run_cli

DEEP = 100_000

# name -> patches on the healthy snapshot (faults.py's form: ("set", PATH, VALUE), ...)
WRONG_TYPES = {
    # the document's own sections
    "sources a list": [("set", "sources", [])],
    "sources.gpu a string": [("set", "sources.gpu", "ok")],
    "sources.gpu.status a number": [("set", "sources.gpu.status", 0)],
    "node a list": [("set", "node", ["gpu01"])],
    # gpu
    "gpu section a list": [("set", "gpu", [])],
    "gpu section a string": [("set", "gpu", "nvml")],
    "gpu.count a string": [("set", "gpu.count", "eight")],
    "gpu.devices a string": [("set", "gpu.devices", "all of them")],
    "gpu.devices an object": [("set", "gpu.devices", {"0": {}})],
    "a device a number": [("set", "gpu.devices.0", 5)],
    "a device's index a string": [("set", "gpu.devices.0.index", "zero")],
    "a device's fields a number": [("set", "gpu.devices.0.fields", 7)],
    "a device's field a string": [("set", "gpu.devices.2.fields.ecc_dbe_volatile", "two")],
    "a device's field a list": [("set", "gpu.devices.2.fields.ecc_current", [1])],
    "a device's field NaN": [("set", "gpu.devices.2.fields.ecc_dbe_volatile", float("nan"))],
    "a device's errors a list": [("set", "gpu.devices.0.errors", ["NotSupported"])],
    "a device's error a number": [("set", "gpu.devices.3.error", 15)],
    "a device's nvlink an object": [("set", "gpu.devices.0.nvlink", {"0": {"active": True}})],
    "a device's nvlink link a string": [("set", "gpu.devices.0.nvlink.0", "up")],
    "a device's fabric a list": [("set", "gpu.devices.0.fabric", [3, 0])],
    "a device's pcie width a string": [("set", "gpu.devices.0.pcie_max_width", "x16")],
    "a device's temperature a string": [("set", "gpu.devices.0.temperature", "hot")],
    # ib
    "ib section a list": [("set", "ib", [])],
    "ib devices a list": [("set", "ib.devices", ["mlx5_0"])],
    "an ib device a string": [("set", "ib.devices.mlx5_0", "MT4129")],
    "an ib device's ports a list": [("set", "ib.devices.mlx5_0.ports", [])],
    "an ib port a number": [("set", "ib.devices.mlx5_0.ports.1", 1)],
    "an ib port's counters a list": [("set", "ib.devices.mlx5_0.ports.1.counters", [0])],
    "an ib counter a list": [("set", "ib.devices.mlx5_0.ports.1.counters.symbol_error", [0])],
    "an ib port's state a number": [("set", "ib.devices.mlx5_0.ports.1.state", 4)],
    # kmsg
    "kmsg section a list": [("set", "kmsg", [])],
    "kmsg records not a list": [("set", "kmsg.records", "Xid 79")],
    "kmsg records an object": [("set", "kmsg.records", {"0": {}})],
    "a kmsg record a number": [("set", "kmsg.records.0", 79)],
    "a kmsg record's msg a number": [("set", "kmsg.records.0.msg", 79)],
    "a kmsg record's seq a string": [("set", "kmsg.records.0.seq", "first")],
    "kmsg.lost a string": [("set", "kmsg.lost", "yes")],
}



def _snapshot(tmp_path, name: str, text: str) -> str:
    path = tmp_path / "BAD.json"
    path.write_text(text)
    return str(path)


def assert_refused_or_failed(proc) -> None:
    """Exit 2 with one line on stderr, or exit 1 (a failing verdict); no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr[-2000:])
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]


def check(path: str, *extra: str):
    return run_cli("check", "--no-db", "--node", "gpu01", "--gpu-source", path, *extra)


@pytest.mark.parametrize("name", list(WRONG_TYPES))
def test_a_wrong_type_in_a_snapshot(tmp_path, name):
    faults = faults_module()
    doc = faults.apply(faults.build("healthy"), WRONG_TYPES[name])
    path = _snapshot(tmp_path, name, json.dumps(doc))
    assert_refused_or_failed(check(path))


NESTED = {
    "the document 100k lists deep": "[" * DEEP + "]" * DEEP,
    "the gpu section 100k lists deep": (
        '{"format": "slurmhealth-snapshot/1", "gpu": ' + "[" * DEEP + "]" * DEEP + "}"
    ),
    "the gpu section 100k objects deep": (
        '{"format": "slurmhealth-snapshot/1", "gpu": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}"
    ),
}


@pytest.mark.parametrize("name", list(NESTED))
def test_deep_nesting_in_a_snapshot(tmp_path, name):
    path = _snapshot(tmp_path, name, NESTED[name])
    assert_refused_or_failed(check(path))


@pytest.mark.parametrize("name", ["a device field 500 lists deep"])
def test_a_device_field_nested_within_the_parsers_limit(tmp_path, name):
    """500 deep parses (json's limit is the recursion limit): still a wrong type."""
    faults = faults_module()
    deep: object = 1
    for _ in range(500):
        deep = [deep]
    doc = faults.build("healthy")
    doc["gpu"]["devices"][2]["fields"]["ecc_current"] = deep  # faults.apply would deepcopy it
    path = _snapshot(tmp_path, name, json.dumps(doc))
    for extra in ([], ["--json"]):
        assert_refused_or_failed(check(path, *extra))


@pytest.mark.parametrize(
    "text", ["[1]", '{"format": 1}', '{"format": "slurmhealth-snapshot/1"', "", "\x00"]
)
def test_what_is_refused_today_is_one_line_and_exit_2(tmp_path, text):
    """The harness's control: not a snapshot at all is already a one-line error."""
    proc = check(_snapshot(tmp_path, "control", text))
    assert_refused_or_failed(proc)
    assert proc.returncode == 2
