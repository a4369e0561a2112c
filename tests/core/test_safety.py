"""The circuit breaker and probation: pure functions of counts, times and recorded actions."""

from __future__ import annotations

import pytest

from slurmhealth.core import safety

DAY = 86400.0


# --- circuit breaker ----------------------------------------------------------------------------


def test_breaker_caps_at_a_share_of_the_fleet():
    assert safety.allowed_drains(0, 512, 0.10) == 51
    assert safety.may_drain_more(50, 512, 0.10)
    assert not safety.may_drain_more(51, 512, 0.10)
    assert safety.allowed_drains(60, 512, 0.10) == 0
    assert safety.allowed_drains(0, 100, 0.10) == 10  # 10.000000000000002 is still 10
    assert safety.allowed_drains(-3, 100, 0.10) == 10


def test_breaker_allows_one_drain_on_a_small_cluster():
    assert safety.allowed_drains(0, 4, 0.10) == 1
    assert safety.may_drain_more(0, 4)
    assert not safety.may_drain_more(1, 4)
    assert safety.allowed_drains(0, 1, 0.0) == 1


def test_breaker_rejects_nonsense():
    with pytest.raises(ValueError):
        safety.may_drain_more(0, 0)
    with pytest.raises(ValueError):
        safety.may_drain_more(0, 10, 1.5)


# --- probation ----------------------------------------------------------------------------------

T0 = 1_700_000_000.0


def test_drained_soon_after_our_resume_is_probation():
    actions = [(T0, "drain"), (T0 + DAY, "resume"), (T0 + 3 * DAY, "drain")]
    assert safety.on_probation(actions, now=T0 + 3 * DAY)
    assert safety.on_probation(actions, now=T0 + 40 * DAY)  # stays until an admin resumes


def test_drained_long_after_the_resume_is_not():
    actions = [(T0, "drain"), (T0 + DAY, "resume"), (T0 + 9 * DAY, "drain")]
    assert not safety.on_probation(actions, now=T0 + 9 * DAY)
    assert safety.on_probation(actions, now=T0 + 9 * DAY, days=10)


def test_probation_edges():
    resume_then = [(T0, "resume"), (T0 + 7 * DAY, "drain")]
    assert safety.on_probation(resume_then, T0 + 7 * DAY)  # exactly 7 days: within
    assert not safety.on_probation([(T0, "drain")], T0 + DAY)  # never resumed by us
    assert not safety.on_probation([(T0, "drain"), (T0 + DAY, "resume")], T0 + 2 * DAY)
    assert not safety.on_probation([], T0)
    later = [(T0, "resume"), (T0 + DAY, "drain")]
    assert not safety.on_probation(later, now=T0 + DAY / 2)  # the drain is after `now`


def test_probation_ignores_other_actions_and_order():
    actions = [
        (T0 + 2 * DAY, "drain", "slurmhealth: lemon: ..."),
        (T0 + DAY, "reset_gpu"),
        (T0 + DAY, "resume"),
        (T0 + 1.5 * DAY, "breaker"),
    ]
    assert safety.on_probation(actions, T0 + 2 * DAY)


def test_probation_as_the_drain_path_asks():
    """actions.drain appends the drain it is about to make to the node's history."""
    history = [(T0, "drain"), (T0 + DAY, "resume")]
    assert safety.on_probation([*history, (T0 + 2 * DAY, "drain")], T0 + 2 * DAY)
    assert not safety.on_probation([*history, (T0 + 30 * DAY, "drain")], T0 + 30 * DAY)


def test_a_node_in_our_maintenance_reservation_may_be_drained_when_we_say_so():
    """The diagnose job's node shows MAINT once our reservation is active; its failed diagnosis
    drains it all the same (ignore=("MAINT",)). Any other flag, or MAINT without the ignore,
    still means someone else took it out."""
    from slurmhealth.core import slurm  # noqa: PLC0415

    maint = {"flags": ["ALLOCATED", "MAINTENANCE", "RESERVED"], "reason": ""}
    assert not slurm.may_drain(maint)
    assert slurm.may_drain(maint, ("MAINT",))
    drained = {"flags": ["IDLE", "DRAIN", "MAINTENANCE"], "reason": "disk swap"}
    assert not slurm.may_drain(drained, ("MAINT",))
    assert slurm.may_drain({"flags": ["IDLE"], "reason": ""})
