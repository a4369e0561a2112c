"""The running kernel's view of the host: processes, modules, network links, EDAC counters.

`gather(options)` reads under `options.host_root` (None: "/") and returns the raw file contents as
plain strings, the `kernel` section of a snapshot, so a replayed snapshot gives the same verdicts:

    {"boot_id": "6f1c...",
     "processes": {"scope": "all", "names": {"munged": 1, "sssd_be": 2, ...}},
     "modules": {"nvidia": "Live", "ib_core": "Live", ...},
     "net": {"eth0": {"operstate": "up", "carrier": "1", "carrier_changes": "2", "type": "1",
                      "mtu": "1500", "speed": "25000", "device": true}, ...},
     "edac": {"mc0": {"ce_count": "0", "ue_count": "0", "ce_noinfo_count": "0",
                      "ue_noinfo_count": "0",
                      "dimms": {"dimm0": {"ce_count": "0", "ue_count": "0",
                                          "label": "CPU_SrcID#0_MC#0_Chan#0_DIMM#0"}}}},
     "errors": {"net/eth1/carrier": "EINVAL"}}

What each part is, from the kernel's own documentation:
- processes: the name of every process, from `/proc/PID/comm` (proc(5): the command name, at most
  15 bytes, TASK_COMM_LEN 16 with its NUL), counted by name. Only comm is read (no status, no
  cmdline): one open and one read per process. Kernel threads are left out where kthreadd's
  children list says which they are (`/proc/2/task/2/children`, proc(5), CONFIG_PROC_CHILDREN).
  `scope` "all" is every process; "init" (the job hooks, `Options.costly` False) only the
  children of PID 1 (`/proc/1/task/1/children`): the daemons systemd starts, and any daemon that
  forked away from its parent, are there, and the read costs a few dozen files instead of one
  per process on a node running thousands (docs/benchmarks.md). Where a name the ps checks look
  for (`Options.processes`: a daemon run under a supervisor that is not PID 1, a forbidden
  process) is not among PID 1's children, the hooks read every process too (`scope` "all"):
  only that path pays for the full read. Without a children file (a kernel built without
  CONFIG_PROC_CHILDREN) every process is read.
- modules: `/proc/modules`, one line per module: name, size, use count, users, state (Live,
  Loading, Unloading), address (proc(5); kernel/module/procfs.c m_show). name -> state.
- net: `/sys/class/net/IF/{operstate,carrier,carrier_changes,type,mtu,speed}`
  (Documentation/ABI/testing/sysfs-class-net); `device`: whether IF has a `device` link, i.e. a
  parent bus device (a physical NIC or an IPoIB child of an HCA); virtual interfaces (lo, bridges,
  veth, tun) have none. carrier and speed read EINVAL on a link that is down: None plus the
  reason in "errors" (not judged: the checks read operstate first). speed is read only where
  carrier is "1". The job hooks (`Options.costly` false) read these files only for an interface
  with a parent device or one the net checks name (`Options.interfaces`): of the others (lo,
  bridges, veth, the hundreds a container host may have) only `{"device": false}`, which the net
  checks never judge unless named.
- edac: `/sys/devices/system/edac/mc/mcN/{ce_count,ue_count,ce_noinfo_count,ue_noinfo_count}`
  and, per DIMM, `dimmN/{dimm_ce_count,dimm_ue_count,dimm_label}` (or, on drivers that have no
  dimm directories, `csrowN/{ce_count,ue_count}`), Documentation/admin-guide/ras.rst ("EDAC -
  Error Detection And Correction") and Documentation/ABI/testing/sysfs-devices-edac. None where
  the node has no EDAC tree (containers, many VMs, a platform without an EDAC driver). The DIMM
  counts are read only when `Options.costly` (the health check): a job hook reads the totals.

A file that cannot be read is None, and the reason (errno name) goes to "errors", present only
when something failed. Nothing here raises on a broken tree except a host root without `proc`:
SourceUnavailable.
"""

from __future__ import annotations

import os

from slurmhealth.node.sources import Options, SourceUnavailable, errno_name

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Iterable

    Tree = dict[str, object]
    Errors = dict[str, str]  # the file's key -> why it could not be read

NET_FILES = ("operstate", "carrier", "carrier_changes", "type", "mtu")
EDAC_FILES = ("ce_count", "ue_count", "ce_noinfo_count", "ue_noinfo_count")
DIMM_FILES = {"ce_count": "dimm_ce_count", "ue_count": "dimm_ue_count", "label": "dimm_label"}
CSROW_FILES = {"ce_count": "ce_count", "ue_count": "ue_count"}
KTHREADD = "2"  # the kernel's thread creator: its children are the kernel threads
COMM_MAX = 15  # TASK_COMM_LEN - 1: how much of a process's name the kernel keeps in comm
_READ_MAX = 4096  # a sysfs attribute is at most one page
_COMM_MAX = 64  # comm is at most 15 bytes and a newline
MODULES_MAX = 1 << 20  # /proc/modules of a node with a thousand modules is ~100 KiB



def _read_bytes(path: str, limit: int = _READ_MAX) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _text(path: str, key: str, errors: Errors) -> str | None:
    """One file as text without its trailing newline; None plus a reason on failure."""
    try:
        data = _read_bytes(path)
    except OSError as exc:
        errors[key] = errno_name(exc)
        return None
    return data.decode("utf-8", "replace").rstrip("\n")


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _children(proc: str, pid: str) -> list[str] | None:
    """The child PIDs of `pid`'s main thread, or None where the kernel has no children file."""
    try:
        return _read_bytes(f"{proc}/{pid}/task/{pid}/children", MODULES_MAX).decode().split()
    except (OSError, UnicodeDecodeError):
        return None


def _kernel_threads(proc: str) -> set[str]:
    """PIDs of kernel threads: kthreadd's children, when PID 2 is kthreadd (in a container's PID
    namespace PID 2 is whatever ran second)."""
    try:
        if _read_bytes(f"{proc}/{KTHREADD}/comm", _COMM_MAX) != b"kthreadd\n":
            return set()
    except OSError:
        return set()
    return {KTHREADD, *(_children(proc, KTHREADD) or ())}


def _comms(proc: str, pids: list[str]) -> dict[str, int]:
    """Process name -> how many run, from each PID's comm (a process gone meanwhile is left out)."""
    names: dict[str, int] = {}
    for pid in pids:
        try:
            data = _read_bytes(f"{proc}/{pid}/comm", _COMM_MAX)
        except OSError:
            continue
        name = data.decode("utf-8", "replace").rstrip("\n")
        names[name] = names.get(name, 0) + 1
    return names


def comm(name: str) -> str:
    """A process name as comm holds it: its first COMM_MAX bytes (`nvidia-persistenced` runs as
    `nvidia-persiste`)."""
    return name.encode()[:COMM_MAX].decode("utf-8", "ignore")


def processes(proc: str, everything: bool = True, wanted: Iterable[str] = ()) -> Tree:
    """{"scope", "names"}: see the module docstring. `everything` False: PID 1's children, or
    every process where a `wanted` name is not among them."""
    if not everything:
        children = _children(proc, "1")
        if children is not None:
            names = _comms(proc, children)
            if all(comm(name) in names for name in wanted):
                return {"scope": "init", "names": names}
    skip = _kernel_threads(proc)
    pids = [e.name for e in os.scandir(proc) if e.name.isdigit() and e.name not in skip]
    return {"scope": "all", "names": _comms(proc, pids)}


def modules(proc: str, errors: Errors) -> dict[str, str] | None:
    """Module name -> state from /proc/modules; None when it cannot be read (a kernel without
    loadable modules has no such file)."""
    try:
        text = _read_bytes(f"{proc}/modules", MODULES_MAX).decode("utf-8", "replace")
    except OSError as exc:
        errors["modules"] = errno_name(exc)
        return None
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            out[fields[0]] = fields[4]
    return out


def interface(path: str, name: str, errors: Errors, everything: bool = True) -> Tree:
    """The link files of one interface (module docstring); unless `everything`, only that it
    has no parent device where it has none."""
    device = os.path.lexists(f"{path}/device")
    if not device and not everything:
        return {"device": False}
    key = f"net/{name}"
    link: Tree = {f: _text(f"{path}/{f}", f"{key}/{f}", errors) for f in NET_FILES}
    up = link["carrier"] == "1"
    link["speed"] = _text(f"{path}/speed", f"{key}/speed", errors) if up else None
    link["device"] = device
    return link


def network(sysfs: str, errors: Errors, everything: bool = True, named: Iterable[str] = ()) -> Tree:
    """Every interface's links; unless `everything`, the files of those with a parent device
    and those `named` only (module docstring)."""
    base = f"{sysfs}/class/net"
    listed = set(named)
    return {
        name: interface(f"{base}/{name}", name, errors, everything or name in listed)
        for name in _listdir(base)
    }


def _counts(path: str, files: dict[str, str], key: str, errors: Errors) -> Tree:
    return {k: _text(f"{path}/{f}", f"{key}/{f}", errors) for k, f in files.items()}


def controller(path: str, name: str, errors: Errors, per_dimm: bool) -> Tree:
    """One memory controller's counts, and its DIMMs' (or csrows') when `per_dimm`."""
    key = f"edac/{name}"
    mc: Tree = {f: _text(f"{path}/{f}", f"{key}/{f}", errors) for f in EDAC_FILES}
    if not per_dimm:
        return mc
    entries = _listdir(path)
    dimms = [e for e in entries if e.startswith("dimm") or e.startswith("rank")]
    files = DIMM_FILES
    if not dimms:  # drivers without dimm directories count per chip-select row
        dimms, files = [e for e in entries if e.startswith("csrow")], CSROW_FILES
    mc["dimms"] = {d: _counts(f"{path}/{d}", files, f"{key}/{d}", errors) for d in dimms}
    return mc


def edac(sysfs: str, errors: Errors, per_dimm: bool) -> Tree | None:
    base = f"{sysfs}/devices/system/edac/mc"
    if not os.path.isdir(base):
        return None
    names = [n for n in _listdir(base) if n.startswith("mc") and n[2:].isdigit()]
    return {n: controller(f"{base}/{n}", n, errors, per_dimm) for n in names}


def gather(options: Options) -> Tree:
    """The registry's entry: the host under the configured root, fully for the health check."""
    root = options.host_root or "/"
    return read(root, options.costly, options.processes or (), options.interfaces or ())


def read(
    root: str = "/",
    everything: bool = True,
    wanted: Iterable[str] = (),
    named: Iterable[str] = (),
) -> Tree:
    """Read the host under `root` (module docstring); SourceUnavailable without `root/proc`.
    `wanted`: the process names the ps checks look for; `named`: the interfaces the net checks
    name."""
    proc, sysfs = os.path.join(root, "proc"), os.path.join(root, "sys")
    if not os.path.isdir(proc):
        raise SourceUnavailable(f"no {proc}")
    errors: Errors = {}
    boot = _text(f"{proc}/sys/kernel/random/boot_id", "boot_id", errors)
    out: Tree = {
        "boot_id": boot,
        "processes": processes(proc, everything, wanted),
        "modules": modules(proc, errors),
        "net": network(sysfs, errors, everything, named),
        "edac": edac(sysfs, errors, everything),
    }
    if errors:
        out["errors"] = errors
    return out
