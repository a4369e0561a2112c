"""Which node stores the admin commands read and prune (`slurmhealth history`, `slurmhealth
prune`): their reads are fleet/queries.py's, the pruning is store.prune."""

from __future__ import annotations

import glob
import os

from slurmhealth.core import store


def store_paths(db: str | None, node: str | None) -> list:
    """--db, else the node's store, else every store in the state directory."""
    if db:
        return [db]
    if node:
        return [store.default_path(node)]
    return sorted(glob.glob(os.path.join(store.state_dir(), "*.db")))
