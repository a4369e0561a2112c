"""Sources: the only impure parts. One gather per source, each behind one seam.

Each gather returns plain JSON-able raw facts, so a snapshot of them replays exactly.
"""

from __future__ import annotations


class SourceUnavailable(Exception):
    """The source does not exist on this node (no NVML library, no driver, no kmsg).

    Distinct from a broken source: where nothing is expected from it, its checks skip.
    """
