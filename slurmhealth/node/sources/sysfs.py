"""InfiniBand facts from sysfs: `ROOT/class/infiniband/<dev>/` (sysfs-class-infiniband).

`gather(root)` returns the raw file contents (trailing newline stripped) as plain strings, the
`ib` section of a snapshot, so a replayed snapshot gives the same verdicts as the live node:

    {"devices": {"mlx5_0": {"fw_ver": "28.39.1002", "hca_type": "MT4129", "board_id": "...",
                            "node_guid": "b83f:d203:00a1:2b3c",
                            "current_link_speed": "32.0 GT/s PCIe", "current_link_width": "16",
                            "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16",
                            "ports": {"1": {"state": "4: ACTIVE", "phys_state": "5: LinkUp",
                                            "rate": "400 Gb/sec (4X NDR)",
                                            "link_layer": "InfiniBand",
                                            "counters": {"symbol_error": "0", ...}}}}},
     "errors": {"mlx5_0:1/counters/link_downed": "EINVAL"}}

A file that cannot be read is None and the reason (errno name) goes to "errors", which is only
present when something failed. Bytes that are not UTF-8 are decoded with replacement characters
and noted as "non-UTF-8". Nothing here raises on a broken tree. No class/infiniband directory
means no InfiniBand on the node: {"devices": {}}. An HCA without a `device` directory (no PCI
parent) has no link keys at all.

Only the files the ib checks use are read: every PMA counter read is a MAD round trip to the
HCA firmware, and hw_counters are not needed here.
"""

from __future__ import annotations

import os

from slurmhealth.node.sources import Options, errno_name

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    # What is read, by name: a file's text (None: unreadable) or a nested tree, the shape in
    # the module docstring; checks/ib.py parse() judges it as raw facts.
    Tree = dict[str, object]
    Errors = dict[str, str]  # the file's key -> why it could not be read

DEVICE_FILES = ("fw_ver", "hca_type", "board_id", "node_guid")
# The HCA's PCIe link, in its PCI device (`<dev>/device` links to it): the kernel's
# Documentation/ABI/testing/sysfs-bus-pci; speed as "32.0 GT/s PCIe" ("32 GT/s" before 5.x
# kernels, "Unknown" or "Unknown speed" when not trained), width as "16".
LINK_FILES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
PORT_FILES = ("state", "phys_state", "rate", "link_layer")
# The error counters the ib checks judge (sysfs-class-infiniband).
COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
# PCIe Advanced Error Reporting counters of a PCI function (kernel 4.19+,
# Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats): one "<error> <count>" line per
# error type, then TOTAL_ERR_COR / TOTAL_ERR_NONFATAL / TOTAL_ERR_FATAL.
AER_FILES = {
    "correctable": "aer_dev_correctable",
    "nonfatal": "aer_dev_nonfatal",
    "fatal": "aer_dev_fatal",
}
# A sysfs attribute is at most one page; read no more than that from a file.
_READ_MAX = 4096



def _read(path: str, key: str, errors: Errors) -> str | None:
    """One sysfs file as text without its trailing newline; None plus a reason on failure."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read(_READ_MAX)
    except OSError as exc:
        errors[key] = errno_name(exc)
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", "replace")
        errors[key] = "non-UTF-8"
    return text.rstrip("\n")


def aer(path: str, key: str, errors: Errors) -> dict[str, str | None] | None:
    """The AER counter files of the PCI function at `path`, as read; None when the function has
    none (no AER capability or an older kernel: not an error)."""
    if not os.path.exists(f"{path}/{AER_FILES['correctable']}"):
        return None
    return {k: _read(f"{path}/{name}", f"{key}/{name}", errors) for k, name in AER_FILES.items()}


def _listdir(path: str, key: str, errors: Errors) -> list[str]:
    """Sorted entries of a directory, or [] plus a reason when it cannot be listed."""
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        errors[key] = errno_name(exc)
        return []


def _port(path: str, key: str, errors: Errors) -> Tree:
    """state, phys_state, rate, link_layer and the judged counters of one port."""
    port: Tree = {name: _read(f"{path}/{name}", f"{key}/{name}", errors) for name in PORT_FILES}
    port["counters"] = {
        name: _read(f"{path}/counters/{name}", f"{key}/counters/{name}", errors)
        for name in COUNTERS
    }
    return port


def _device(path: str, name: str, errors: Errors) -> Tree:
    """Identity files of one HCA, its PCIe link when it has a PCI device, its ports ("1", ...)."""
    device: Tree = {f: _read(f"{path}/{f}", f"{name}/{f}", errors) for f in DEVICE_FILES}
    if os.path.isdir(f"{path}/device"):  # no PCI parent (a software RDMA device): no link
        for f in LINK_FILES:
            device[f] = _read(f"{path}/device/{f}", f"{name}/device/{f}", errors)
        found = aer(f"{path}/device", f"{name}/device", errors)
        if found is not None:
            device["aer"] = found
    ports = _listdir(f"{path}/ports", f"{name}/ports", errors)
    device["ports"] = {p: _port(f"{path}/ports/{p}", f"{name}:{p}", errors) for p in ports}
    return device


def gather(options: Options) -> Tree:
    """The registry's entry: InfiniBand under the configured root."""
    return read(options.sysfs_root or "/sys")


def read(root: str = "/sys") -> Tree:
    """Read every HCA under `root/class/infiniband`; never raises on a broken tree."""
    base = os.path.join(root, "class", "infiniband")
    if not os.path.isdir(base):
        return {"devices": {}}
    errors: Errors = {}
    names = _listdir(base, "class/infiniband", errors)
    devices = {name: _device(f"{base}/{name}", name, errors) for name in names}
    out: Tree = {"devices": devices}
    if errors:
        out["errors"] = errors
    return out
