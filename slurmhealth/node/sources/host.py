"""The host itself: memory (`HOST_ROOT/proc/meminfo`), CPUs (`HOST_ROOT/sys/devices/system/cpu`)
and the kernel's clock discipline (adjtimex(2)).

`gather(options)` returns the `host` section of a snapshot, so a replayed snapshot gives the same
verdicts as the live node:

    {"meminfo": {"MemTotal": "527988424 kB", "MemAvailable": "511230112 kB",
                 "SwapTotal": "0 kB", "SwapFree": "0 kB", "HugePages_Total": "0", ...},
     "cpu": {"online": "0-223", "present": "0-223", "possible": "0-223", "smt": "on",
             "packages": {"0": "0-55,112-167", "56": "56-111,168-223"},
             "threads": "0,112"},
     "clock": {"state": 0, "status": 8193, "maxerror": 16500, "esterror": 12, "offset": -3},
     "errors": {"cpu/smt/control": "ENOENT"}}

meminfo is every `Key: value` line as written (Documentation/filesystems/proc.rst, "meminfo").
The CPU files are the kernel's cpulists (Documentation/ABI/stable/sysfs-devices-system-cpu,
Documentation/admin-guide/cputopology.rst): `packages` maps the first CPU of each package to
its `topology/core_siblings_list` (the CPUs of that package) and `threads` is the first online
CPU's `topology/thread_siblings_list` (the hardware threads of its core): one file per socket
plus one, where a per-CPU read of physical_package_id and core_id costs two files per CPU (448
on a 224-CPU node) on every prolog. `smt` is `smt/control` (on, off, forceoff, notsupported,
notimplemented; kernel 4.19+), absent where the kernel lacks it.

`clock` is what adjtimex(2) reads with modes 0 (no change, no privilege needed): the return
value (`state`: TIME_OK 0 ... TIME_ERROR 5), `status` (STA_* bits, STA_UNSYNC = 0x40),
`maxerror` and `esterror` (microseconds), `offset` (microseconds, nanoseconds with STA_NANO).
The clock is not namespaced, so it is read from the running kernel whatever the host root. The
call needs ctypes, a costly import where nothing has loaded it yet (docs/benchmarks.md): the job
hooks (Options.costly false) read the clock only where ctypes is loaded already (the NVML
binding loads it on a GPU node); elsewhere `clock` is {"skipped": why} and the health check
reads it. Nothing here raises: an unreadable file is None and its reason goes to `errors`.
"""

from __future__ import annotations

import os
import sys

from slurmhealth.node.sources import Options, errno_name

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    Errors = dict[str, str]  # what could not be read -> why

_READ_MAX = 16384  # /proc/meminfo is ~1.5 KB; a cpulist of thousands of CPUs fits
_LINES_MAX = 200  # meminfo keys kept (about 55 on a 6.x kernel)
_PACKAGES_MAX = 64  # sockets read at most (real nodes have 1-8)
SKIPPED = "not read by the job hooks on this node (ctypes not loaded): the health check reads it"



def _read(path: str, key: str, errors: Errors) -> str | None:
    """One file's text, stripped; None plus a reason when it cannot be read."""
    try:
        with open(path, "rb", buffering=0) as handle:
            data = handle.read(_READ_MAX)
    except OSError as exc:
        errors[key] = errno_name(exc)
        return None
    return data.decode("utf-8", "replace").strip()


def cpulist(text: object) -> list[int] | None:
    """A kernel cpulist ("0-3,8,10-11") as sorted CPU numbers; "" is no CPU; None for text
    that is not one (lib/bitmap.c bitmap_parselist's format: ranges, no strides here)."""
    if not isinstance(text, str):
        return None
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or len(part) > 12:
            return None
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last - first > 65536:
            return None
        out.update(range(first, last + 1))
    return sorted(out)


def meminfo(text: str | None) -> dict[str, str]:
    """meminfo lines as {key: value text}: "MemTotal:  527988424 kB" -> {"MemTotal": "527988424
    kB"}."""
    out = {}
    for line in (text or "").splitlines()[:_LINES_MAX]:
        key, sep, value = line.partition(":")
        if sep and key:
            out[key.strip()] = " ".join(value.split())
    return out


def _topology(base: str, online: list[int], errors: Errors) -> tuple[dict[str, str | None], object]:
    """({first CPU of each package: its core_siblings_list}, the first CPU's
    thread_siblings_list). Each package is read once, from its first online CPU."""
    packages: dict[str, str | None] = {}
    left = set(online)
    while left and len(packages) < _PACKAGES_MAX:
        cpu = min(left)
        text = _read(f"{base}/cpu{cpu}/topology/core_siblings_list", f"cpu{cpu}/topology", errors)
        packages[str(cpu)] = text
        left -= set(cpulist(text) or ()) | {cpu}
    threads = None
    if online:
        name = f"cpu{online[0]}/topology/thread_siblings_list"
        threads = _read(f"{base}/{name}", name, errors)
    return packages, threads


def cpus(root: str, errors: Errors) -> dict[str, object]:
    """The CPU lists and the topology of the online CPUs under `root`/sys."""
    base = os.path.join(root, "sys", "devices", "system", "cpu")
    out: dict[str, object] = {
        name: _read(f"{base}/{name}", f"cpu/{name}", errors)
        for name in ("online", "present", "possible")
    }
    if os.path.exists(f"{base}/smt/control"):
        out["smt"] = _read(f"{base}/smt/control", "cpu/smt/control", errors)
    online = cpulist(out["online"]) or []
    out["packages"], out["threads"] = _topology(base, online, errors)
    return out


def clock(costly: bool = True) -> dict[str, object]:
    """adjtimex(2) with modes 0: the kernel's view of its clock discipline; {"skipped": why}
    where ctypes would have to be loaded for a job hook; {"error": name} where the call
    failed."""
    if not costly and "ctypes" not in sys.modules:
        return {"skipped": SKIPPED}
    import ctypes  # noqa: PLC0415  (costly where nothing loaded it: see the module docstring)

    class Timex(ctypes.Structure):
        # struct timex, glibc's <sys/timex.h> (the kernel's struct __kernel_timex on 64-bit):
        # int modes; long offset, freq, maxerror, esterror; int status; ... The tail is
        # padded past the real size: the kernel writes the whole structure.
        _fields_ = [
            ("modes", ctypes.c_uint),
            ("offset", ctypes.c_long),
            ("freq", ctypes.c_long),
            ("maxerror", ctypes.c_long),
            ("esterror", ctypes.c_long),
            ("status", ctypes.c_int),
            ("rest", ctypes.c_char * 256),
        ]

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        timex = Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError) as exc:  # no adjtimex in this C library
        return {"error": type(exc).__name__}
    if state < 0:
        import errno  # noqa: PLC0415

        return {"error": errno.errorcode.get(ctypes.get_errno(), "adjtimex failed")}
    return {
        "state": state,
        "status": timex.status,
        "maxerror": timex.maxerror,
        "esterror": timex.esterror,
        "offset": timex.offset,
    }


def gather(options: Options) -> dict[str, object]:
    """The registry's entry: memory, CPUs and the clock of the host under the configured
    root."""
    root = options.host_root or "/"
    errors: Errors = {}
    text = _read(os.path.join(root, "proc", "meminfo"), "meminfo", errors)
    out: dict[str, object] = {
        "meminfo": meminfo(text),
        "cpu": cpus(root, errors),
        "clock": clock(options.costly),
    }
    if errors:
        out["errors"] = errors
    return out
