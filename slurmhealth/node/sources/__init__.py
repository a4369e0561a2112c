"""Sources: the only impure parts. One gather per source, each behind one seam.

Each source is one module with `gather(options) -> raw facts` (plain JSON-able data, so a snapshot
of them replays exactly) and one line in REGISTRY. Modules load only when their source is
gathered live: the NVML binding and ctypes cost imports (docs/benchmarks.md), and a replayed
snapshot never needs them.
"""

from __future__ import annotations

import errno
import importlib
import os

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping
    from typing import Any, Callable

    # What an early gather left: (True, its facts) or (False, what it raised).
    Outcome = tuple[bool, Any]

# source name -> the module that gathers it (areas name their source: checks/*.SOURCE)
REGISTRY = {
    "gpu": "slurmhealth.node.sources.nvml",  # NVML: every GPU, one sweep
    "ib": "slurmhealth.node.sources.sysfs",  # InfiniBand: /sys/class/infiniband
    "kmsg": "slurmhealth.node.sources.kmsg",  # kernel log: /dev/kmsg or a saved file
    "kernel": "slurmhealth.node.sources.kernel",  # processes, modules, net links, EDAC: /proc, /sys
    "fs": "slurmhealth.node.sources.fs",  # mounts: /proc/self/mountinfo, statvfs per mount
    "host": "slurmhealth.node.sources.host",  # memory, CPUs, the clock: /proc, /sys, adjtimex
    "nvme": "slurmhealth.node.sources.nvme",  # NVMe: /sys/class/nvme, nvme-cli's smart-log
    "bmc": "slurmhealth.node.sources.bmc",  # the BMC's event log: ipmitool sel elist
    "imex": "slurmhealth.node.sources.imex",  # IMEX (multi-node NVLink): nvidia-imex-ctl
    "fmlog": "slurmhealth.node.sources.fmlog",  # the Fabric Manager's log file (NVSwitch boards)
    "site": "slurmhealth.node.sources.site",  # the site's own health check (LBNL NHC)
}


# The live defaults of the path options. With a snapshot, a source whose path is left at its
# default replays the snapshot's own section: a fault drill never mixes in the live node.
DEFAULT_PATHS = {
    "ib": "/sys",
    "kmsg": "/dev/kmsg",
    "kernel": "/",
    "fs": "/",
    "host": "/",
    "nvme": "/",
    "bmc": "/",
    "fmlog": "/",
}


def errno_name(exc: OSError) -> str:
    """`OSError(EINVAL)` -> "EINVAL" (the exception's class name where it has no errno)."""
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


class SourceUnavailable(Exception):
    """The source does not exist on this node (no NVML library, no driver, no kmsg).

    Distinct from a broken source: where nothing is expected from it, its checks skip.
    `found`: raw facts that say the source should have been there all the same (NVIDIA GPUs
    on the PCI bus that NVML cannot see); the area's `expected(expect, found)` judges them.
    `errno`: EACCES where the source is there but this user may not read it (NVML's
    NoPermission: /dev/nvidia* not open to a user who is not root), as an OSError carries it.
    """

    def __init__(self, message: str, found: object = None, errno: int | None = None) -> None:
        super().__init__(message)
        self.found = found
        self.errno = errno


class Options:
    """Where facts come from. gpu_source: "nvml" or a snapshot file; None paths: defaults or
    the snapshot's own sections; kmsg_after: the saved kernel-log position {seq, boot_id};
    host_root: where the host's /proc, /sys and /dev are read (None: "/"); site_program: the
    site's own health check to run (sources/site.py; None: none); timeouts: each source's
    deadline in seconds (settings.timeout_<source>), which a source that runs a program
    keeps that program within."""

    __slots__ = (
        "costly",
        "exiting",
        "files",
        "gpu_source",
        "host_root",
        "interfaces",
        "kmsg",
        "kmsg_after",
        "mounts",
        "processes",
        "site_program",
        "stat_timeout",
        "sysfs_root",
        "timeouts",
    )

    def __init__(
        self,
        gpu_source: str = "nvml",
        sysfs_root: str | None = None,
        kmsg: str | None = None,
        kmsg_after: Mapping[str, object] | None = None,
        exiting: bool = False,
        costly: bool = True,
        host_root: str | None = None,
        site_program: str | None = None,
    ) -> None:
        self.gpu_source = gpu_source
        self.host_root = host_root
        self.sysfs_root = sysfs_root
        self.kmsg = kmsg
        self.kmsg_after = kmsg_after or {}
        # The process ends right after this run (a hook): a source may leave its teardown to
        # the exit (nvmlShutdown costs driver time, docs/benchmarks.md; the driver frees a
        # process's NVML resources when it ends, as after a crash).
        self.exiting = exiting
        # Read the settings that cost more on first use and change only at maintenance
        # (application clocks, docs/benchmarks.md). The job hooks leave them to the
        # health check, and the run carries the last reading forward (runner.CARRIED).
        self.costly = costly
        self.host_root = host_root
        # The fs source's statvfs: the paths the fs checks judge (None: every mount of a
        # filesystem that stores data, as a snapshot takes) and each stat's deadline. The run
        # sets them from the [fs] expectations (runner.run).
        self.mounts: list[str] | None = None
        self.stat_timeout = 0.5
        # The fs source's file tests: the paths of [fs] files, each stat'ed under stat_timeout
        # (None: none). The run sets them (runner.run).
        self.files: list[str] | None = None
        # The kernel source's processes: the names the ps checks look for ([ps] daemons and
        # absent). A job hook reads PID 1's children, and every process only when one of these
        # is not among them (sources/kernel.py). The run sets them (runner.run).
        self.processes: list[str] | None = None
        # The kernel source's network links: the interfaces the net checks name ([net] up and
        # mtu). A job hook reads the link files of these and of every interface with a parent
        # device; of the others (lo, bridges, veth) only that they have none (sources/kernel.py).
        self.interfaces: list[str] | None = None
        self.site_program = site_program
        self.timeouts: dict[str, float] = {}


def gather(source: str, options: Options) -> object:
    """Gather one source live through its registered module."""
    return importlib.import_module(REGISTRY[source]).gather(options)


# Sources started before the run knows its options (start_early), by name:
# (thread, box, costly).
_EARLY: dict[str, tuple[threading.Thread, list[Outcome], bool]] = {}
# A source is started early only where this file exists: the NVIDIA driver's control device,
# which a node with a loaded driver has. Elsewhere (CPU-only nodes, this project's CI) the early
# start would only cost its imports; the run's own gather then says why NVML is unavailable.
EARLY_IF = {"gpu": "/dev/nvidiactl"}


def start_early(source: str, costly: bool = False) -> None:
    """Begin gathering `source` live with the default options now, in a daemon thread.

    The hooks start the GPU sweep as the process starts: NVML's init and first sweep are a
    large part of a prolog on a GPU node, nearly all inside the driver with the GIL released,
    so they overlap the imports, the config and the store reads that come before the run
    (docs/benchmarks.md). `take_early` hands the result to the run if its options turn out to
    be the defaults; otherwise it is never used (a read of NVML, which changes nothing).
    """
    if not os.path.exists(EARLY_IF[source]):
        return
    import threading  # noqa: PLC0415

    box: list[Outcome] = []

    def work() -> None:
        try:
            box.append((True, gather(source, Options(exiting=True, costly=costly))))
        except BaseException as exc:  # handed to the run, which judges it as its own gather's
            box.append((False, exc))

    thread = threading.Thread(target=work, name=f"early-{source}", daemon=True)
    thread.start()
    _EARLY[source] = (thread, box, costly)


def _defaults(source: str, options: Options) -> bool:
    """Are these the options start_early gathered with, for what this source reads?"""
    if source == "gpu":
        live = options.gpu_source in ("nvml", "", None)
        return live and options.sysfs_root in (None, "", DEFAULT_PATHS["ib"])
    return False


def take_early(source: str, options: Options) -> Callable[[], object] | None:
    """A zero-argument function that waits for the early gather of `source` and returns its
    facts (or raises what it raised), or None when none was started or its options differ.
    The caller waits under its own deadline, as for any gather."""
    entry = _EARLY.pop(source, None)
    if entry is None or not _defaults(source, options) or entry[2] != options.costly:
        return None
    thread, box, _ = entry

    def result() -> object:
        thread.join()
        done, value = box[0]
        if not done:
            raise value
        return value

    return result
