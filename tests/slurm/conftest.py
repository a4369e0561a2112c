"""A real local Slurm (tests/slurm/lab.py) for the tests in this folder.

Needs root, munge and Slurm (apt-get install slurm-wlm munge). Without them the tests skip, except
under SLURMHEALTH_REQUIRE_REAL=1 (set by .ci/run), where a missing Slurm is a failure: CI must
never pass by silently skipping the real-cluster tests.
"""

from __future__ import annotations

import pytest
from conftest import require_real

from .lab import Lab, LabError, missing


@pytest.fixture(scope="module")
def lab():
    reason = missing()
    if reason:
        require_real(f"the real-Slurm tests cannot run: {reason}")
    with Lab(nodes=4) as running:
        yield running


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def cluster(lab, request):
    """The module's lab, put back as found after the test: no faults, nodes idle, weights reset.

    When the test failed, the tails of the Slurm logs go to the report (the lab dir is removed at
    the end of the module).
    """
    yield lab
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(lab.log_tails())
    restore(lab)


def restore(lab: Lab) -> None:
    for node in list(lab.faults):
        lab.clear(node)
    lab.cancel_all()
    for name in lab.names:
        lab.set_weight(name, int(name[3:]) * 10)
        if "DRAIN" in lab.node(name)["state"]:
            lab.resume(name)
    try:
        lab.wait_idle(timeout=20)
    except LabError:
        pytest.fail(f"the lab did not come back to idle after the test; logs in {lab.dir}/log")
