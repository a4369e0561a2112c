"""checks/modules.py: expected modules live, forbidden ones not loaded."""

from __future__ import annotations

import conftest

from slurmhealth.node.checks import modules
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import kernel


def facts(tmp_path, text=conftest.MODULES_TEXT):
    return modules.parse(kernel.read(conftest.host_tree(tmp_path, modules=text)))


def test_expected_modules_live(tmp_path):
    ctx = Context(expect={"loaded": ["nvidia", "nvidia_uvm", "nvidia_peermem", "mlx5_ib"]})
    result = modules.loaded(facts(tmp_path), ctx)
    assert result.status == "ok" and result.message == "4 modules loaded"


def test_missing_or_stuck_module_fails_with_reboot(tmp_path):
    text = conftest.MODULES_TEXT.replace("peermem 16384 0 - Live", "peermem 16384 0 - Loading")
    ctx = Context(expect={"loaded": ["nvidia_peermem", "gdrdrv"]})
    result = modules.loaded(facts(tmp_path, text), ctx)
    assert result.status == "fail" and result.action == "reboot"
    assert result.message == "nvidia_peermem stuck Loading (+1 more module)"


def test_forbidden_module(tmp_path):
    text = conftest.MODULES_TEXT + "nouveau 2285568 0 - Live 0x0000000000000000\n"
    assert modules.absent(facts(tmp_path), Context(expect={"absent": ["nouveau"]})).status == "ok"
    result = modules.absent(facts(tmp_path / "b", text), Context(expect={"absent": ["nouveau"]}))
    assert result.status == "fail" and result.message == "nouveau loaded"


def test_nothing_required_without_config_even_without_proc_modules(tmp_path):
    found = facts(tmp_path, None)
    assert found["modules"] is None
    assert modules.loaded(found, Context()).message == "no modules expected: not judged"
    assert modules.loaded(found, Context(expect={"loaded": ["nvidia"]})).status == "fail"


def test_genconf_writes_known_modules_and_forbids_nouveau(tmp_path):
    assert modules.expectations(facts(tmp_path)) == {
        "loaded": ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem",
                   "ib_core", "ib_uverbs", "ib_ipoib", "mlx5_core", "mlx5_ib"],
        "absent": ["nouveau"],
    }
