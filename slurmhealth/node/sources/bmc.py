"""The BMC's System Event Log: `ipmitool sel elist` through the local IPMI device.

The `bmc` section of a snapshot, the program's lines as it printed them (checks/bmc.py parse()
judges them):

    {"tool": "/usr/bin/ipmitool", "device": "/dev/ipmi0",
     "lines": ["   1 | 05/02/2024 | 08:14:31 | Event Logging Disabled SEL | Log area reset/cleared"
               " | Asserted", ...]}

ipmitool(1) `sel elist`: one line per record, `ID | DATE | TIME | SENSOR | EVENT | DIRECTION`,
the record id in hex (`%4x`), the sensor as its type and its SDR name ("Memory DIMM_A1"; `sel
list`, without the SDR, prints "Memory #0x01"), then for threshold sensors `| Reading R > Threshold
T unit` (ipmitool's lib/ipmi_sel.c ipmi_sel_print_std_entry). An empty SEL prints nothing and
"SEL has no entries" on stderr. The device: the kernel's IPMI driver node, /dev/ipmi0 (devfs
and udev's older names /dev/ipmi/0 and /dev/ipmidev/0 too), which ipmitool's open interface
uses. No device or no ipmitool: SourceUnavailable; ipmitool failing or outliving its time
(a BMC that does not answer): OSError. Either way the checks skip unless a BMC is expected
(bmc.expected), and the baseline stays as it was.
"""

from __future__ import annotations

import os

from slurmhealth.node.sources import Options, SourceUnavailable

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    Tree = dict[str, object]

DEVICES = ("dev/ipmi0", "dev/ipmi/0", "dev/ipmidev/0")
TOOL_PATHS = ("/usr/bin/ipmitool", "/usr/sbin/ipmitool", "/bin/ipmitool", "/sbin/ipmitool")
DEFAULT_TIMEOUT_S = 8.0
LINES_MAX = 4096  # a SEL holds at most 64 KiB of 16-byte records: 4096


def gather(options: Options) -> Tree:
    """The registry's entry: the SEL through the first IPMI device under the host root."""
    from slurmhealth.node.sources import tools  # noqa: PLC0415 - health check only

    root = options.host_root or "/"
    device = next((d for d in DEVICES if os.path.exists(os.path.join(root, d))), None)
    if device is None:
        raise SourceUnavailable("no IPMI device (/dev/ipmi0: ipmi_si and ipmi_devintf loaded?)")
    tool = tools.find(TOOL_PATHS)
    if tool is None:
        raise SourceUnavailable("ipmitool is not installed")
    seconds = tools.budget(options.timeouts.get("bmc", DEFAULT_TIMEOUT_S))
    return read(tool, os.path.join(root, device), seconds)


def read(tool: str, device: str, seconds: float) -> Tree:
    """Run `ipmitool -I open -d N sel elist` on the device's number; OSError when it fails."""
    from slurmhealth.node.sources import tools  # noqa: PLC0415

    number = device.rstrip("/").rsplit("/", 1)[-1].removeprefix("ipmi") or "0"
    ran = tools.run([tool, "-I", "open", "-d", number, "sel", "elist"], seconds)
    if ran.error is not None or ran.timed_out or ran.status != 0:
        said = ran.error or (f"timed out after {seconds:g} s" if ran.timed_out else "")
        said = said or f"exit {ran.status}"
        detail = (ran.stderr.strip().splitlines() or [""])[-1][:200]
        raise OSError(f"ipmitool sel elist: {said}" + (f": {detail}" if detail else ""))
    return {"tool": tool, "device": device, "lines": ran.stdout.splitlines()[-LINES_MAX:]}
