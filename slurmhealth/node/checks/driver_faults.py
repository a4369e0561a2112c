"""NVSwitch SXid lines and the NVIDIA driver's failures that carry no Xid number, in the kernel
log: their parsers (called from xid.py's one scan of the records) and the xid area's checks on
them (xid.sxid_fatal, xid.sxid_nonfatal, xid.gpu_init, xid.nvlink_init).

Why the xid area and not an area of their own: the lines come from the same kernel-log read, by
the same drivers' print routines, with the same rule that only the kernel's own records count;
one scan of the records finds them all, so a run pays for one pass, and one saved sequence number
says what was read.

Facts (in xid.parse's dict):
    "sxid":   [{"sxid", "switch", "bus_id", "link", "severity", "said", "dumps", "repeats",
                "text", "seq", "usec"}]   one per (switch, SXid, link, severity); severity
                                          "fatal", "non-fatal", "correctable" or None
    "driver": [{"kind": "init_failed", "bus_id", "minor", "code", "repeats", "seq", "usec"} |
               {"kind": "link_mask", "bus_id": None, "peer", "repeats", "seq", "usec"}]

SXid lines (the NVSwitch driver, open-gpu-kernel-modules src/common/nvswitch/kernel/inc/
error_nvswitch.h and intr_nvswitch.h; docs/sources.md). Every line starts `nvidia-nvswitchN: SXid
(PCI:<bus>): <number>, ` and goes on in one of these forms:
    `Fatal, Link 44 <what> (First)` / `Non-fatal, Link 32 <what>` / `Correctable, Link 3 <what>`
        the interrupt's own report (NVSWITCH_REPORT_FATAL / _NONFATAL / _CORRECTABLE); the same
        number can be either, as the driver decides per interrupt whether the switch contained
        the error (NVSWITCH_REPORT_CONTAIN): the word on the line is the severity.
    `Fatal, <what>, instance=N, chiplet=M` (PRI errors: no link)
    `Severity 1 Engine instance 12 Sub-engine instance 00` (the error log's dump of the same
        error, NVSWITCH_ERROR_SEVERITY_TYPE: 0 non-fatal, 1 fatal; the instance is the link
        the error was logged with), then `Data {0x..., ...}` lines: data, no event.
    `SOE HALT data[0] = 0x...`, `SOE init Failed(0)`: the switch's management controller (SOE,
        SXids 26000-26008, ctrl_dev_nvswitch.h), no severity word.
"""

from __future__ import annotations

import re

from slurmhealth.core.result import FAIL, NONE, REBOOT, WARN, Result, clean, counted, fail, ok, warn
from slurmhealth.node.checks.base import Context, norm_bus_id, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts

IGNORE = "ignore"  # as xid.IGNORE: a class that is counted, never judged
FATAL = "fatal"
NONFATAL = "non-fatal"
CORRECTABLE = "correctable"
_SEVERITY_WORDS = {"Fatal": FATAL, "Non-fatal": NONFATAL, "Correctable": CORRECTABLE}
_DUMP_SEVERITY = {"0": NONFATAL, "1": FATAL}  # NVSWITCH_ERROR_SEVERITY_NONFATAL = 0, _FATAL

# NVIDIA Fabric Manager User Guide (DU-09883-001, checked against its v2.3 of March 2025), the
# NVSwitch SXid error tables: "Always Fatal NVSwitch SXid Errors" are "always fatal to the
# entire fabric/system" ("The host needs to be restarted", or the NVSwitches and GPUs reset),
# whatever the line says; 10003 (Host_unhandled_interrupt, "Other Notable NVSwitch SXid
# Errors"): "To recover, reset all GPUs and NVSwitches".
ALWAYS_FATAL = {
    10003: "host unhandled interrupt",
    12020: "egress sequence ID error",
    22003: "Minion halt",
    22011: "Minion exterror",
    # the guide's "Always Fatal" table, names as it gives them
    **dict.fromkeys((23001, 23010), "ingress SRC-VC buffer overflow"),
    **dict.fromkeys((23002, 23011), "ingress SRC-VC buffer underflow"),
    **dict.fromkeys((23003, 23012), "egress DST-VC credit overflow"),
    **dict.fromkeys((23004, 23013), "egress DST-VC credit underflow"),
    **dict.fromkeys((23005, 23014), "ingress packet burst error"),
    **dict.fromkeys((23006, 23015), "ingress packet sticky error"),
    **dict.fromkeys((23007, 23016), "possible bubbles at ingress"),
    23008: "ingress packet invalid dst error",
    23009: "ingress packet parity error",
    23017: "ingress credit parity error",
}
# Non-fatal SXids whose recovery in the Fabric Manager guide's non-fatal table is more than a
# warning: 11004 and 12028 stall the GPU's NVLink traffic through that port and hang the GPU's
# next access ("restart the guest VM": on bare metal, a reset of the GPUs and switches), 19084
# (AN1 heartbeat timeout) asks to "reset all GPUs and all NVSwitches". They fail (reboot) as a
# fatal one does, whatever the line's word.
STALLING = {
    11004: "stalls the port's NVLink traffic",
    12028: "stalls the port's NVLink traffic",
    19084: "AN1 heartbeat timeout",
}
# Non-fatal SXids the guide's non-fatal table says have no impact: the single-bit ECC errors the
# switch corrects itself ("No guest VM impact because the NVSwitch hardware will auto correct
# the ECC errors") and 22013 (Minion link DLREQ interrupt, "can be safely ignored"): ignored.
NO_IMPACT = frozenset((
    11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059, 19062,
    19065, 19068, 19071, 24001, 24002, 24003, 22013,
))
# The SOE, the NVSwitch's on-board management controller (its firmware runs the switch's
# thermal and error handling): NVSWITCH_ERR_HW_SOE_* in the driver's ctrl_dev_nvswitch.h.
# Stopped (halt, exception, watchdog) or never booted: the switch is unmanaged until the
# NVSwitches are reset, which on bare metal is a reboot (the guide's reset of all GPUs and
# NVSwitches). The others (reset, command queue, timeout, shutdown) go by the line's word,
# warn without one.
SOE_STOPPED = {
    26002: "SOE did not boot",
    26006: "SOE halted",
    26007: "SOE exception",
    26008: "SOE watchdog",
}

# The same non-fatal SXid on one switch and link this many times in one read fails (sxid_nonfatal).
SXID_REPEAT_MAX = 10

_SXID_LINE = (
    r"\s*nvidia-(nvswitch[0-9]{1,4}): SXid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-7])\): ([0-9]{1,6}),? ?(.*)"
)
_LINK = r"Link ([0-9]{1,3})\b"
_DUMP = r"Severity ([0-9]) Engine instance ([0-9]{1,4}) Sub-engine instance [0-9]{1,4}"
TEXT_MAX = 120


def sxid_line(msg: str, seq: int, usec: int | None, found: dict[tuple[Any, ...], Any]) -> None:
    """Add one `nvidia-nvswitchN: SXid (...)` message to `found` ({key: event}); `Data {...}`
    lines and anything else are skipped. A repeat of a key counts in its event."""
    line = re.match(_SXID_LINE, msg, re.A)
    if line is None:
        return
    switch, bus, number, rest = line.groups()
    rest = rest[: 4 * TEXT_MAX]
    if rest.startswith("Data {"):
        return
    word, _, after = rest.partition(", ")
    severity, link, dump = _SEVERITY_WORDS.get(word), None, False
    if severity is not None:
        found_link = re.match(_LINK, after, re.A)
        link = int(found_link.group(1)) if found_link else None
    elif rest.startswith("Severity "):
        found_dump = re.match(_DUMP, rest, re.A)
        if found_dump is None:
            return
        severity, link = _DUMP_SEVERITY.get(found_dump.group(1)), int(found_dump.group(2))
        dump = True
    key = (bus.lower(), int(number), link, severity)
    event = found.get(key)
    if event is None:
        event = found[key] = {
            "sxid": int(number),
            "switch": switch,
            "bus_id": bus.lower(),
            "link": link,
            "severity": severity,
            "said": 0,
            "dumps": 0,
            "text": clean(rest, TEXT_MAX),
            "seq": seq,
            "usec": usec,
        }
    event["dumps" if dump else "said"] += 1
    event["repeats"] = max(event["said"], event["dumps"])


# --- the driver's failures without an Xid number ------------------------------------------
#
# A GPU that does not initialise: `NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:
# 1792)` then `NVRM: GPU 0000:98:00.0: rm_init_adapter failed, device minor number 0`, once per
# attempt (every open of the device retries; captured lines in docs/sources.md). NVML then
# lists the GPUs that did initialise, and with no count configured 7 healthy GPUs look like a
# healthy node: the kernel log names the one that is missing.
# NVLink not brought up: `NVRM: knvlinkUpdatePostRxDetectLinkMask_IMPL: Failed to update Rx
# Detect Link mask!` and `NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's
# postRxDetLinkMask failed!` (kernel_nvlink.c and arch/hopper/kernel_nvlink_gh100.c: the GSP
# call that reads which links detected a receiver failed). The lines name no GPU.
_INIT_FAILED = (
    r"\s*NVRM: GPU (?:at )?(?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?): "
    r"(?:RmInitAdapter failed! ?(?:\((0x[0-9A-Fa-f]{1,8}:0x[0-9A-Fa-f]{1,8}:[0-9]{1,6})\))?"
    r"|rm_init_adapter failed, device minor number ([0-9]{1,4}))"
)
_LINK_MASK = (
    r"\s*NVRM: knvlink(?:UpdatePostRxDetectLinkMask|DiscoverPostRxDetLinks)_\w{1,32}: "
    r"(?:Failed to update Rx Detect Link mask!|Getting peer ?([0-9]{1,3})(?:'s)? "
    r"postRxDetLinkMask failed!)"
)
INIT_FAILED = "init_failed"
LINK_MASK = "link_mask"


def driver_line(msg: str, seq: int, usec: int | None, found: dict[tuple[Any, ...], Any]) -> None:
    """Add one NVRM message that reports a GPU that did not initialise or an NVLink link mask
    that could not be read to `found` ({key: event}); other messages cost a substring test."""
    if "nit_adapter" in msg or "nitAdapter failed" in msg:
        line = re.match(_INIT_FAILED, msg, re.A)
        if line is None:
            return
        bus, code, minor = line.groups()
        key = (INIT_FAILED, norm_bus_id(bus))
        event = found.setdefault(key, _driver_event(INIT_FAILED, key[1], seq, usec))
        event["minor"] = int(minor) if minor is not None else event["minor"]
        event["code"] = code or event["code"]
        event["adapter" if minor is None else "rm_init"] += 1
        event["repeats"] = max(event["adapter"], event["rm_init"])
    elif "RxDet" in msg:
        line = re.match(_LINK_MASK, msg, re.A)
        if line is None:
            return
        event = found.setdefault((LINK_MASK, None), _driver_event(LINK_MASK, None, seq, usec))
        if line.group(1) is not None:
            event["peers"] = sorted({*event["peers"], int(line.group(1))})
        event["repeats"] += 1


def _driver_event(kind: str, bus: str | None, seq: int, usec: int | None) -> dict[str, Any]:
    if kind == INIT_FAILED:
        extra: dict[str, Any] = {"minor": None, "code": None, "adapter": 0, "rm_init": 0}
    else:
        extra = {"peers": []}
    return {"kind": kind, "bus_id": bus, "repeats": 0, "seq": seq, "usec": usec, **extra}


# --- checks ---------------------------------------------------------------------------------


def sxid_class(event: dict[str, Any]) -> tuple[str, str]:
    """(class, action) of one SXid event: always-fatal numbers, a stopped SOE and the stalling
    non-fatal ones (STALLING) fail whatever the line says; else the line's word: fatal fails
    (reboot); correctable, and the numbers the guide says have no impact (NO_IMPACT), are
    ignored; non-fatal or no word warns."""
    number = event["sxid"]
    if number in ALWAYS_FATAL or number in SOE_STOPPED or number in STALLING:
        return FAIL, REBOOT
    if event["severity"] == FATAL:
        return FAIL, REBOOT
    if event["severity"] == CORRECTABLE or number in NO_IMPACT:
        return IGNORE, NONE
    return WARN, NONE


def _sxid_words(event: dict[str, Any]) -> str:
    """`NVSwitch nvswitch1 (0000:aa:00.0) link 12 SXid 24007 fatal x2`, in the project's words."""
    number = event["sxid"]
    link = f" link {event['link']}" if event["link"] is not None else ""
    what = SOE_STOPPED.get(number) or ALWAYS_FATAL.get(number) or STALLING.get(number)
    said = f"{what}, always fatal" if number in ALWAYS_FATAL else what
    said = said or (event["severity"] or "no severity given")
    times = f" x{event['repeats']}" if event["repeats"] > 1 else ""
    return f"NVSwitch {event['switch']} ({event['bus_id']}){link} SXid {number} {said}{times}"


def _sxid_data(events: list[Any]) -> dict[str, Any]:
    keys = ("sxid", "switch", "bus_id", "link", "severity", "repeats", "text", "seq")
    return {"count": len(events), "events": [{k: e.get(k) for k in keys} for e in events[:50]]}


def sxid_fatal(facts: Facts, ctx: Context) -> Result:
    """NVSwitch fatal SXids since the last run fail (reboot): the fabric needs its reset.

    The Fabric Manager guide: a fatal SXid stalls the NVLink traffic through that switch port
    (the GPUs see it as Xid 74 or 45) and needs the GPUs and NVSwitches reset; the always-fatal
    ones take the whole fabric down. On bare metal the reset of every GPU and NVSwitch is a
    reboot (or fabric manager's own recovery where the site runs it)."""
    found = [e for e in facts.get("sxid") or [] if sxid_class(e)[0] == FAIL]
    if not found:
        return ok("no fatal NVSwitch SXids")
    found.sort(key=lambda e: (e["bus_id"], e["link"] if e["link"] is not None else -1, e["seq"]))
    return fail(summarize([_sxid_words(e) for e in found]), _sxid_data(found), REBOOT)


def sxid_nonfatal(facts: Facts, ctx: Context) -> Result:
    """NVSwitch non-fatal SXids warn; sxid_repeat_max of one on one switch link fail (reboot).

    The switch contained each one (the guide's non-fatal tables: at worst the job over that port
    sees Xid 45; the three that stall the port, STALLING, are sxid_fatal's), so one is evidence,
    not a verdict. The same error again and again on one link
    is a link that keeps failing: the bound is the count at which the nvlink area fails a GPU's
    NVLink recoveries in one interval (recovery_fail, 10), the GPU side's link-level error of the
    same kind. A reboot resets the switch and retrains its links."""
    events = [e for e in facts.get("sxid") or [] if sxid_class(e)[0] == WARN]
    correctable = sum(1 for e in facts.get("sxid") or [] if sxid_class(e)[0] == IGNORE)
    if not events:
        extra = f" ({counted(correctable, 'correctable')})" if correctable else ""
        return ok(f"no non-fatal NVSwitch SXids{extra}")
    bound = _repeat_max(ctx)
    repeated = [e for e in events if bound and e["repeats"] >= bound and e["link"] is not None]
    shown = repeated + [e for e in events if e not in repeated]
    message = summarize([_sxid_words(e) for e in shown])
    if repeated:
        return fail(f"{message}: repeats on one link", _sxid_data(shown), REBOOT)
    return warn(message, _sxid_data(shown))


def _repeat_max(ctx: Context) -> int:
    value = ctx.expect.get("sxid_repeat_max", SXID_REPEAT_MAX)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _gpu_words(event: dict[str, Any], ctx: Context) -> str:
    bus = event["bus_id"]
    gpus = ctx.gpus if isinstance(ctx.gpus, dict) else {}
    index = next((i for b, i in gpus.items() if isinstance(b, str) and norm_bus_id(b) == bus), None)
    name = f"GPU {index} ({bus})" if index is not None else f"GPU {bus}"
    minor = f", device minor {event['minor']}" if event.get("minor") is not None else ""
    times = f", {counted(event['repeats'], 'attempt')}" if event["repeats"] > 1 else ""
    return f"{name} did not initialise (RmInitAdapter failed{minor}{times})"


def gpu_init(facts: Facts, ctx: Context) -> Result:
    """A GPU whose initialisation (RmInitAdapter) failed since the last run fails (reboot).

    It is named by its bus id from the kernel log.
    NVML lists only the GPUs that initialised, so with no count configured the node would pass
    one GPU short; the kernel log names the missing one. A reboot re-runs the GPU's whole
    initialisation; a GPU that fails it again needs a person (its repeat, across boots)."""
    found = [e for e in facts.get("driver") or [] if e["kind"] == INIT_FAILED]
    if not found:
        return ok("no GPU initialisation failures")
    data = {"count": len(found), "events": found[:50]}
    return fail(summarize([_gpu_words(e, ctx) for e in found], " GPU"), data, REBOOT)


def nvlink_init(facts: Facts, ctx: Context) -> Result:
    """An NVLink link mask the driver could not read since the last run fails (reboot).

    The mask is read after receiver detection: without it the NVLink fabric did not come up.
    The driver prints it when its call to the GPU's firmware for the links that detected a
    receiver fails; NVLink then stays down or partial (peer traffic over PCIe or failing),
    which only a reset of the GPUs, i.e. a reboot, retrains. The lines name no GPU."""
    found = [e for e in facts.get("driver") or [] if e["kind"] == LINK_MASK]
    if not found:
        return ok("no NVLink link-mask failures")
    event = found[0]
    peers = f" (peers {', '.join(str(p) for p in event['peers'])})" if event["peers"] else ""
    times = f" x{event['repeats']}" if event["repeats"] > 1 else ""
    return fail(
        f"NVLink link mask after receiver detection not read{peers}{times}",
        {"count": event["repeats"], "events": found},
        REBOOT,
    )


CHECKS = (sxid_fatal, sxid_nonfatal, gpu_init, nvlink_init)
