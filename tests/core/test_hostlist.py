from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given, settings
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


# --- matching without expanding ---------------------------------------------------------------

HUGE = "gpu[0-99999][0-99999]"  # 10^10 names: expanding it hung validate and every prolog


def _no_expand(term):
    raise AssertionError(f"expand({term!r}) called by matching or validation")


@pytest.mark.parametrize(
    ("pattern", "node", "expected"),
    [
        (HUGE, "gpu12345678", True),
        (HUGE, "gpu00", True),  # 0 then 0: unpadded ranges
        (HUGE, "gpu0000", False),  # no split of 0000 is two unpadded numbers
        (HUGE, "gpu" + "9" * 10, True),
        (HUGE, "gpu" + "9" * 11, False),
        (HUGE, "gpu", False),
        (HUGE + ",!gpu5[0-99999]", "gpu512", False),
        (HUGE + ",!gpu5[0-99999]", "gpu612", True),
        ("r[00-99]n[0000-9999]", "r07n0420", True),
        ("r[00-99]n[0000-9999]", "r7n0420", False),
        ("r[00-99]n[0000-9999]", "r07n420", False),
        ("r[00-99]n[0000-9999]", "r100n0000", False),
        ("gpu[0-999999]", "gpu654321", True),  # one wide range is no longer refused
        ("n[1-10][1-10]", "n110", True),  # 1|10 and 11|0: the walk tries every split
        ("n[1-10][1-10]", "n101", True),
        ("n[1-10][1-10]", "n111", False),
    ],
)
def test_hostile_patterns_match_without_expanding(monkeypatch, pattern, node, expected):
    monkeypatch.setattr(hostlist, "expand", _no_expand)
    hostlist.validate(pattern)
    assert hostlist.matches(pattern, node) is expected


def test_expand_refuses_more_than_its_cap_before_listing_anything():
    with pytest.raises(hostlist.PatternError, match=f"more than {hostlist.MAX_NAMES}"):
        hostlist.expand(HUGE)
    with pytest.raises(hostlist.PatternError, match="more than"):
        hostlist.expand(f"gpu[1-{hostlist.MAX_NAMES + 1}]")
    names = hostlist.expand(f"gpu[1-{hostlist.MAX_NAMES}]")
    assert len(names) == hostlist.MAX_NAMES and names[-1] == f"gpu{hostlist.MAX_NAMES}"


def test_digits_int_cannot_read_are_a_pattern_error_not_a_crash():
    with pytest.raises(hostlist.PatternError):
        hostlist.validate("gpu[\N{SUPERSCRIPT TWO}-3]")
    with pytest.raises(hostlist.PatternError):
        hostlist.validate(f"gpu[1-{'9' * 5000}]")


_LITERALS = st.text(alphabet="ab0-", max_size=3)


@st.composite
def _bracket_set(draw):
    items = []
    for _ in range(draw(st.integers(1, 2))):
        low = draw(st.one_of(st.integers(0, 120), st.sampled_from([0, 1, 5, 9, 95, 99])))
        text = str(low).zfill(draw(st.integers(0, 3)))
        if draw(st.booleans()):
            text += f"-{low + draw(st.integers(0, 12))}"
        items.append(text)
    return "[" + ",".join(items) + "]"


@st.composite
def _bracket_term(draw):
    parts = [draw(_LITERALS)]
    for _ in range(draw(st.integers(1, 3))):
        parts += [draw(_bracket_set()), draw(_LITERALS)]
    return "".join(parts)


@st.composite
def _name_for(draw, names):
    """A name of the set, one a digit away from it (a zero more or less padding a number, a
    character less), or any short name."""
    name = draw(st.sampled_from(names))
    at = draw(st.integers(0, len(name)))
    digits = [i for i, ch in enumerate(name) if ch.isdigit()] or [at]
    pad = draw(st.sampled_from(digits))
    return draw(
        st.sampled_from(
            [
                name,
                name[:pad] + "0" + name[pad:],
                name[:pad] + name[pad + 1 :],
                name[:at] + name[at + 1 :],
                draw(st.text(alphabet="ab0123456789-", max_size=10)),
            ]
        )
    )


@settings(max_examples=300)
@given(st.data())
def test_matching_a_bracket_term_agrees_with_its_expansion(data):
    term = data.draw(_bracket_term())
    names = hostlist.expand(term)
    node = data.draw(_name_for(names))
    assert hostlist.matches(term, node) is (node in names)


def _reference_matches(pattern, node):
    """The semantics before the walk: bracket terms by expansion, everything else by fnmatch."""

    def term_matches(term):
        if "[" in term and not hostlist._is_glob(term):
            return node in hostlist.expand(term)
        return fnmatch.fnmatchcase(node, term)

    terms = hostlist.split_terms(pattern)
    positive = [t for t in terms if not t.startswith("!")]
    negative = [t[1:] for t in terms if t.startswith("!")]
    if any(term_matches(t) for t in negative):
        return False
    return not positive or any(term_matches(t) for t in positive)


_TERMS = st.one_of(
    _bracket_term(),
    st.sampled_from(["a*", "b?0", "a[0-9]*", "[ab]1", "a[!0]1", "ab", "0"]),
)


def _names_of(term):
    term = term.lstrip("!")
    return hostlist.expand(term) if "[" in term and not hostlist._is_glob(term) else [term]


@settings(max_examples=300)
@given(st.data())
def test_whole_patterns_agree_with_matching_by_expansion(data):
    terms = data.draw(st.lists(st.tuples(st.booleans(), _TERMS), min_size=1, max_size=3))
    pattern = ",".join(("!" if negated else "") + term for negated, term in terms)
    hostlist.validate(pattern)
    names = [n for t in hostlist.split_terms(pattern) for n in _names_of(t)]
    node = data.draw(_name_for(names or ["a1"]))
    assert hostlist.matches(pattern, node) is _reference_matches(pattern, node)
