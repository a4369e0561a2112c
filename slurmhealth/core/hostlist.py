"""Node-set patterns as Slurm admins write them: `gpu[01-16]`, `gpu[01-04,07],login1`,
globs (`gpu*`) and negation (`gpu[01-16],!gpu05`).
"""

from __future__ import annotations

import fnmatch
import re


class PatternError(ValueError):
    """A node-set pattern that cannot be read."""


def split_terms(pattern: str) -> list[str]:
    """Split on commas outside brackets: `a[1-2,5],b` -> [`a[1-2,5]`, `b`]."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(pattern):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise PatternError(f"unbalanced ']' in {pattern!r}")
        elif ch == "," and depth == 0:
            terms.append(pattern[start:i].strip())
            start = i + 1
    if depth:
        raise PatternError(f"unbalanced '[' in {pattern!r}")
    terms.append(pattern[start:].strip())
    return [t for t in terms if t]


def _range_items(body: str, pattern: str) -> list[str]:
    items = []
    for part in body.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise PatternError(f"bad range {part!r} in {pattern!r}")
        if not sep:
            items.append(lo)
            continue
        if int(hi) < int(lo) or int(hi) - int(lo) > 100000:
            raise PatternError(f"bad range {part!r} in {pattern!r}")
        width = len(lo)
        items.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return items


def expand(term: str) -> list[str]:
    """All names of one bracketed term: `gpu[01-03]` -> gpu01 gpu02 gpu03 (zero padding kept)."""
    match = re.search(r"\[([^\]]*)\]", term)
    if not match:
        return [term]
    head, tail = term[: match.start()], term[match.end() :]
    return [n for item in _range_items(match.group(1), term) for n in expand(head + item + tail)]


def _is_glob(term: str) -> bool:
    return any(ch in term for ch in "*?") or re.search(r"\[[!^]|\[[a-zA-Z]", term) is not None


def _term_matches(term: str, node: str) -> bool:
    if "[" in term and not _is_glob(term):
        return node in expand(term)
    return fnmatch.fnmatchcase(node, term)


def matches(pattern: str, node: str) -> bool:
    """True when `node` is in the set: any positive term matches and no `!` term does.

    A pattern of only negations means "every node except".
    """
    terms = split_terms(pattern)
    positive = [t for t in terms if not t.startswith("!")]
    negative = [t[1:] for t in terms if t.startswith("!")]
    if any(_term_matches(t, node) for t in negative):
        return False
    return not positive or any(_term_matches(t, node) for t in positive)


def validate(pattern: str) -> None:
    """Raise PatternError when the pattern cannot be read."""
    if not pattern.strip():
        raise PatternError("empty node pattern")
    for term in (t.lstrip("!") for t in split_terms(pattern)):
        if "[" in term and not _is_glob(term):
            expand(term)
