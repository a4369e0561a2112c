"""Sources: the only impure parts. One gather per source, each behind one seam.

Each source is one module with `gather(options) -> raw facts` (plain JSON-able data, so a snapshot
of them replays exactly) and one line in REGISTRY. Modules load only when their source is
gathered live: pynvml costs ~28 ms of imports and a replayed snapshot never needs it.
"""

from __future__ import annotations

import importlib

# source name -> the module that gathers it (areas name their source: checks/*.SOURCE)
REGISTRY = {
    "gpu": "slurmhealth.node.sources.nvml",  # NVML: every GPU, one sweep
    "ib": "slurmhealth.node.sources.sysfs",  # InfiniBand: /sys/class/infiniband
    "kmsg": "slurmhealth.node.sources.kmsg",  # kernel log: /dev/kmsg or a saved file
}


# The live defaults of the path options. With a snapshot, a source whose path is left at its
# default replays the snapshot's own section: a fault drill never mixes in the live node.
DEFAULT_PATHS = {"ib": "/sys", "kmsg": "/dev/kmsg"}


class SourceUnavailable(Exception):
    """The source does not exist on this node (no NVML library, no driver, no kmsg).

    Distinct from a broken source: where nothing is expected from it, its checks skip.
    `found`: raw facts that say the source should have been there all the same (NVIDIA GPUs
    on the PCI bus that NVML cannot see); the area's `expected(expect, found)` judges them.
    """

    def __init__(self, message: str, found: object = None) -> None:
        super().__init__(message)
        self.found = found


class Options:
    """Where facts come from. gpu_source: "nvml" or a snapshot file; None paths: defaults or
    the snapshot's own sections; kmsg_after: the saved kernel-log position {seq, boot_id}."""

    __slots__ = ("gpu_source", "kmsg", "kmsg_after", "sysfs_root")

    def __init__(
        self,
        gpu_source: str = "nvml",
        sysfs_root: str | None = None,
        kmsg: str | None = None,
        kmsg_after: dict | None = None,
    ) -> None:
        self.gpu_source = gpu_source
        self.sysfs_root = sysfs_root
        self.kmsg = kmsg
        self.kmsg_after = kmsg_after or {}


def gather(source: str, options: Options) -> object:
    """Gather one source live through its registered module."""
    return importlib.import_module(REGISTRY[source]).gather(options)
