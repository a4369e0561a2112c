"""checks/ps.py: daemons by the name the kernel keeps (15 bytes), nothing required unset."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurmhealth.node.checks import ps
from slurmhealth.node.checks.base import Context

RAW = {"processes": {"scope": "all", "names": {
    "munged": 1, "nvidia-persiste": 1, "nv-fabricmanage": 1, "sssd": 1, "sssd_be": 2}}}


def run(check, raw=RAW, **expect):
    return check(ps.parse(raw), Context(expect=expect))


def test_nothing_required_without_config():
    assert run(ps.daemons).message == "no daemons expected: not judged"
    assert run(ps.absent).status == "ok"


def test_daemons_match_by_their_first_15_bytes():
    result = run(ps.daemons, daemons=["munged", "nvidia-persistenced", "nv-fabricmanager"])
    assert result.status == "ok" and result.message == "3 daemons running"


def test_a_missing_daemon_fails_with_drain():
    result = run(ps.daemons, daemons=["munged", "nvidia-imex", "nslcd"])
    assert result.status == "fail" and result.action == "drain"
    assert result.message == "nvidia-imex not running (+1 more daemon)"
    assert result.data["missing"] == ["nvidia-imex", "nslcd"]


def test_a_forbidden_process_fails():
    assert run(ps.absent, absent=["nslcd"]).status == "ok"
    result = run(ps.absent, absent=["sssd_be"])
    assert result.status == "fail" and result.message == "sssd_be running (2)"


def test_unreadable_processes_fail_only_when_daemons_are_expected():
    assert run(ps.daemons, {}, daemons=["munged"]).status == "fail"
    assert ps.expected({"daemons": ["munged"]}) and not ps.expected({})


def test_genconf_writes_the_known_daemons_seen():
    assert ps.expectations(ps.parse(RAW)) == {
        "daemons": ["munged", "nvidia-persistenced", "nv-fabricmanager", "sssd"]}
    assert ps.expectations(ps.parse({})) == {}


@given(st.recursive(st.none() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(
    st.text(), c), max_leaves=20))
def test_parse_never_raises(raw):
    facts = ps.parse({"processes": raw})
    assert set(facts) == {"names", "scope"}
