from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmhealth.core import hostlist


def test_expand_ranges_keep_zero_padding():
    assert hostlist.expand("gpu[01-03]") == ["gpu01", "gpu02", "gpu03"]
    assert hostlist.expand("gpu[1-2,9]") == ["gpu1", "gpu2", "gpu9"]
    assert hostlist.expand("r[1-2]n[07-08]") == ["r1n07", "r1n08", "r2n07", "r2n08"]


@pytest.mark.parametrize(
    ("pattern", "node", "expected"),
    [
        ("gpu[01-16]", "gpu07", True),
        ("gpu[01-16]", "gpu17", False),
        ("gpu[01-16]", "gpu7", False),
        ("gpu[01-16],!gpu05", "gpu05", False),
        ("gpu[01-16],!gpu05", "gpu06", True),
        ("gpu*", "gpu99", True),
        ("gpu*,!gpu9?", "gpu91", False),
        ("!login*", "gpu01", True),
        ("!login*", "login1", False),
        ("a[1-2],b[3-4]", "b4", True),
        ("node-a", "node-a", True),
    ],
)
def test_matches(pattern, node, expected):
    assert hostlist.matches(pattern, node) is expected


@pytest.mark.parametrize("bad", ["gpu[01-", "gpu01]", "gpu[1-x]", "gpu[5-1]", " "])
def test_bad_patterns_are_rejected(bad):
    with pytest.raises(hostlist.PatternError):
        hostlist.validate(bad)


@given(st.text(max_size=30), st.text(max_size=12))
def test_matching_never_crashes_on_valid_patterns(pattern, node):
    try:
        hostlist.validate(pattern)
    except hostlist.PatternError:
        return
    assert hostlist.matches(pattern, node) in (True, False)
