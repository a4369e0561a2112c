"""The site's own health check as one check (checks/site.py): NHC's failure warns with its own
failure line, a program that could not run or did not end is an error, a pass is ok."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurmhealth.node.checks import site
from slurmhealth.node.checks.base import Context

NHC_FAILED = "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted"


def judge(**raw):
    facts = site.parse(dict({"program": "/usr/sbin/nhc", "status": 0, "lines": []}, **raw))
    return site.program(facts, Context(phase="healthcheck"))


def test_a_pass_is_ok():
    assert (judge().status, judge().message) == ("ok", "nhc passed")


def test_a_failure_warns_with_nhcs_own_line_never_a_drain():
    result = judge(status=1, lines=["Node Health Check starting.", NHC_FAILED])
    assert (result.status, result.action) == ("warn", "none")
    assert result.message == "nhc failed (exit 1): check_fs_mount: /scratch not mounted"
    other = judge(status=3, lines=["disk check: /tmp 99% full"])
    assert other.message == "nhc failed (exit 3): disk check: /tmp 99% full"


def test_not_run_or_not_ended_is_an_error():
    assert judge(status=None, error="not an executable file").message == (
        "nhc could not run: not an executable file")
    hung = judge(status=None, timed_out=True)
    assert (hung.status, hung.message) == (
        "error", "nhc did not end within settings.timeout_site: stopped")


@given(st.dictionaries(st.sampled_from(["program", "status", "lines", "error", "timed_out"]),
                       st.none() | st.integers() | st.text(max_size=5)
                       | st.lists(st.text(max_size=5), max_size=3)))
def test_parse_and_the_check_never_raise(raw):
    site.program(site.parse(raw), Context())
