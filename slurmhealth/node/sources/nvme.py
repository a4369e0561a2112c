"""NVMe facts: `ROOT/sys/class/nvme/nvme*/` and, where nvme-cli is installed, each controller's
SMART / Health Information log (`nvme smart-log /dev/nvmeX -o json`).

The `nvme` section of a snapshot, read as the files say (checks/nvme.py parse() judges them):

    {"controllers": {"nvme0": {"state": "live", "model": "...", "serial": "...",
                               "firmware_rev": "...",
                               "hwmon": {"temp1_input": "41850", "temp1_max": "84850",
                                         "temp1_crit": "89850", "temp1_alarm": "0"},
                               "smart": {"critical_warning": 0, "temperature": 315, ...},
                               "smart_error": "..."}},
     "tool": "/usr/sbin/nvme", "errors": {"nvme1/firmware_rev": "EACCES"}}

sysfs: the kernel's Documentation/ABI/testing/sysfs-class-nvme and drivers/nvme/host/core.c
(`state`: new, live, resetting, connecting, deleting, "deleting (no IO)", dead; `model`, `serial`,
`firmware_rev` as the controller's Identify data gives them, space-padded). The composite
temperature is the controller's hwmon device (drivers/nvme/host/hwmon.c, kernel 5.5+):
temp1_input in millidegrees Celsius, temp1_max the warning threshold (WCTEMP), temp1_crit the
critical one (CCTEMP), temp1_alarm the SMART log's temperature warning; a hwmonN directory of
the controller (under `device/hwmon/` on the kernels that registered it with the PCI device).

smart-log: nvme-cli's JSON is the log page's fields under the names of its json_smart_log()
(nvme-print-json.c): critical_warning, temperature (Kelvin, as the log holds it),
avail_spare, spare_thresh, percent_used, media_errors, num_err_log_entries, ...; the 128-bit
counters print as plain numbers. `smart` is None and `smart_error` says why where it could not
be read; `tool` is None where nvme-cli is not installed (sysfs only). No class/nvme directory:
no NVMe on the node (SourceUnavailable).
"""

from __future__ import annotations

import os

from slurmhealth.node.sources import Options, SourceUnavailable
from slurmhealth.node.sources.sysfs import _listdir, _read

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from slurmhealth.node.sources.sysfs import Errors

    Tree = dict[str, object]

CONTROLLER_FILES = ("state", "model", "serial", "firmware_rev")
HWMON_FILES = ("temp1_input", "temp1_max", "temp1_crit", "temp1_alarm")
# nvme-cli's usual homes (slurmd's scripts have no PATH).
TOOL_PATHS = ("/usr/sbin/nvme", "/usr/bin/nvme", "/sbin/nvme", "/bin/nvme")
DEFAULT_TIMEOUT_S = 5.0


def gather(options: Options) -> Tree:
    """The registry's entry: the controllers under the host root, SMART logs where nvme-cli
    is installed, within settings.timeout_nvme."""
    from slurmhealth.node.sources import tools  # noqa: PLC0415 - health check only

    seconds = tools.budget(options.timeouts.get("nvme", DEFAULT_TIMEOUT_S))
    return read(options.host_root or "/", tools.find(TOOL_PATHS), seconds)


def _controller_names(base: str, errors: Errors) -> list[str]:
    names = _listdir(base, "class/nvme", errors)
    return [n for n in names if n.startswith("nvme") and n[4:].isdigit()]


def _hwmon(path: str, name: str, errors: Errors) -> dict[str, str | None] | None:
    """The controller's temperature files, or None where it has no hwmon device."""
    for where in (path, f"{path}/device/hwmon"):
        found = [e for e in _listdir(where, f"{name}/hwmon", {}) if e.startswith("hwmon")]
        if found:
            at = f"{where}/{found[0]}"
            files = [f for f in HWMON_FILES if os.path.exists(f"{at}/{f}")]
            return {f: _read(f"{at}/{f}", f"{name}/{found[0]}/{f}", errors) for f in files}
    return None


def read(root: str, tool: str | None, seconds: float) -> Tree:
    """Every controller under `root`/sys/class/nvme; smart-log through `tool` (None: not
    installed) for each whose /dev node exists, all within `seconds`."""
    import time  # noqa: PLC0415

    base = os.path.join(root, "sys", "class", "nvme")
    if not os.path.isdir(base):
        raise SourceUnavailable("no NVMe controllers (no /sys/class/nvme)")
    errors: Errors = {}
    ends = time.monotonic() + seconds
    controllers: Tree = {}
    for name in _controller_names(base, errors):
        path = f"{base}/{name}"
        ctrl: Tree = {f: _read(f"{path}/{f}", f"{name}/{f}", errors) for f in CONTROLLER_FILES}
        ctrl["hwmon"] = _hwmon(path, name, errors)
        if tool is not None:
            ctrl.update(smart_log(tool, os.path.join(root, "dev", name), ends - time.monotonic()))
        controllers[name] = ctrl
    out: Tree = {"controllers": controllers, "tool": tool}
    if errors:
        out["errors"] = errors
    return out


def smart_log(tool: str, device: str, seconds: float) -> Tree:
    """{"smart": the log as nvme-cli prints it, "smart_error": None}, or smart None and why."""
    if not os.path.exists(device):
        return {"smart": None, "smart_error": f"no {device}"}
    if seconds <= 0:
        return {"smart": None, "smart_error": "not read: out of time"}
    import json  # noqa: PLC0415

    from slurmhealth.node.sources import tools  # noqa: PLC0415

    ran = tools.run([tool, "smart-log", device, "-o", "json"], seconds)
    if ran.error is not None or ran.timed_out or ran.status != 0:
        said = ran.error or ("timed out" if ran.timed_out else f"exit {ran.status}")
        detail = (ran.stderr.strip().splitlines() or [""])[-1][:200]
        return {"smart": None, "smart_error": f"{said}: {detail}" if detail else said}
    try:
        log = json.loads(ran.stdout)
    except ValueError:
        return {"smart": None, "smart_error": "not JSON"}
    if not isinstance(log, dict):
        return {"smart": None, "smart_error": "not a JSON object"}
    return {"smart": log, "smart_error": None}
