"""Node-set patterns as Slurm admins write them: `gpu[01-16]`, `gpu[01-04,07],login1`,
globs (`gpu*`) and negation (`gpu[01-16],!gpu05`).

A bracket term (`r[00-99]n[0000-9999]`) is parsed once into literal parts and bracket sets and a
name is matched by walking it, ranges checked by number and width: matching and validating never
expand the pattern, so their cost does not depend on how many names it covers. Only expand()
lists names, and it refuses more than MAX_NAMES of them.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import re

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Union

    # A parsed bracket term: literal text and bracket sets, in turn. A bracket set's items are
    # text the name holds verbatim or ranges (low, high, width, longest).
    _Range = tuple[int, int, int, int]
    _Set = tuple[Union[str, _Range], ...]
    _Part = Union[str, _Set]

MAX_NAMES = 100_000  # most names expand() lists from one term (sacct nodelists are far smaller)

_BRACKET = re.compile(r"\[([^\]]*)\]")
_ASCII_DIGITS = frozenset("0123456789")


# One node's name, never a node set or an option: Slurm reads `[`, `]` and `,` as hostlist syntax
# ("gpu[01-64]" is 64 nodes) and splits slurm.conf on white space and `=`, so no node has them;
# `/` would make the store's file name a path, and a leading `-` an option to scontrol; `ALL` is
# every node to `scontrol update NodeName=ALL` (any case). Any other printable character is
# Slurm's business (the readers escape it where they print it).
_NOT_IN_NAME = frozenset("[],/=")
NODE_NAME_MAX = 255


def is_node_name(name: object) -> bool:
    """Whether `name` is one node's name (never a node set, an option, a path or junk)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= NODE_NAME_MAX
        and name.isprintable()
        and not name.startswith("-")
        and name.upper() != "ALL"
        and not any(ch.isspace() or ch in _NOT_IN_NAME for ch in name)
    )


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


def _bracket_set(body: str, term: str) -> _Set:
    """`01-16,20` -> items: a str (`20`, the name holds it verbatim) or a range
    (low, high, width, longest): the numbers low..high, each zero-padded to width digits."""
    items: list[str | _Range] = []
    for part in body.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise PatternError(f"bad range {part!r} in {term!r}")
        if not sep:
            items.append(lo)
            continue
        try:
            low, high = int(lo), int(hi)
            longest = max(len(lo), len(str(high)))
        except ValueError:  # a digit int() cannot read ('²'), or thousands of digits
            raise PatternError(f"bad range {part!r} in {term!r}") from None
        if high < low:
            raise PatternError(f"bad range {part!r} in {term!r}")
        items.append((low, high, len(lo), longest))
    return tuple(items)


@functools.lru_cache(maxsize=1024)
def _parse(term: str) -> tuple[_Part, ...]:
    """A bracket term -> its parts: literal strs and bracket sets (tuples), in order.

    Text after the last `[...]` is literal, an unclosed `[` included (split_terms rejects it).
    """
    parts: list[_Part] = []
    rest = term
    found = _BRACKET.search(rest)
    while found:
        parts += [rest[: found.start()], _bracket_set(found.group(1), term)]
        rest = rest[found.end() :]
        found = _BRACKET.search(rest)
    parts.append(rest)
    return tuple(parts)


def _set_ends(items: _Set, name: str, start: int) -> set[int]:
    """Where one bracket set, read from name[start:], can end."""
    ends = set()
    digits = start
    while digits < len(name) and name[digits] in _ASCII_DIGITS:
        digits += 1
    for item in items:
        if isinstance(item, str):
            if name.startswith(item, start):
                ends.add(start + len(item))
            continue
        low, high, width, longest = item
        for end in range(start + width, min(digits, start + longest) + 1):
            text = name[start:end]
            # str(n).zfill(width): exactly width digits, or more without a leading zero
            if (len(text) == width or text[0] != "0") and low <= int(text) <= high:
                ends.add(end)
    return ends


def _walk(parts: tuple[_Part, ...], name: str) -> bool:
    """True when name is one of the names of the parsed term, without listing them."""
    positions = {0}
    for part in parts:
        if isinstance(part, str):
            positions = {p + len(part) for p in positions if name.startswith(part, p)}
        else:
            positions = set().union(*(_set_ends(part, name, p) for p in positions))
        if not positions:
            return False
    return len(name) in positions


def _size(part: _Set) -> int:
    return sum(1 if isinstance(item, str) else item[1] - item[0] + 1 for item in part)


def _names(part: _Set) -> list[str]:
    out: list[str] = []
    for item in part:
        if isinstance(item, str):
            out.append(item)
        else:
            out.extend(str(n).zfill(item[2]) for n in range(item[0], item[1] + 1))
    return out


def expand(term: str) -> list[str]:
    """All names of one bracketed term: `gpu[01-03]` -> gpu01 gpu02 gpu03 (zero padding kept).

    PatternError when the term names more than MAX_NAMES nodes (counted before listing any).
    """
    parts = _parse(term)
    total = 1
    for part in parts:
        total *= 1 if isinstance(part, str) else _size(part)
        if total > MAX_NAMES:
            raise PatternError(f"{term!r} names more than {MAX_NAMES} nodes: not expanded")
    lists = [[part] if isinstance(part, str) else _names(part) for part in parts]
    return ["".join(choice) for choice in itertools.product(*lists)]


def _is_glob(term: str) -> bool:
    return any(ch in term for ch in "*?") or re.search(r"\[[!^]|\[[a-zA-Z]", term) is not None


def _term_matches(term: str, node: str) -> bool:
    if "[" in term and not _is_glob(term):
        return _walk(_parse(term), node)
    return fnmatch.fnmatchcase(node, term)


def matches(pattern: str, node: str) -> bool:
    """True when `node` is in the set: any positive term matches and no `!` term does.

    A pattern of only negations means "every node except". Bracket terms are matched without
    expanding them (microseconds, however many names they cover).
    """
    terms = split_terms(pattern)
    positive = [t for t in terms if not t.startswith("!")]
    negative = [t[1:] for t in terms if t.startswith("!")]
    if any(_term_matches(t, node) for t in negative):
        return False
    return not positive or any(_term_matches(t, node) for t in positive)


def validate(pattern: str) -> None:
    """Raise PatternError when the pattern cannot be read.

    Syntax only: nothing is expanded, so a pattern covering any number of names is valid
    (`gpu[0-99999][0-99999]`); only expand() has a cap (MAX_NAMES), and matching needs none.
    """
    if not pattern.strip():
        raise PatternError("empty node pattern")
    for term in (t.lstrip("!") for t in split_terms(pattern)):
        if "[" in term and not _is_glob(term):
            _parse(term)
