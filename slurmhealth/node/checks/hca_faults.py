"""The HCA's kernel-log lines: what mlx5_core, the ConnectX driver, says of its firmware, its
ports' modules and its slot's power, and the PCI core's report of its link at probe. Their
parser (called from xid.py's one scan of the records, for the kernel's own records only) and
the xid area's checks on them (xid.hca_events, xid.hca_firmware, xid.hca_power).

Why the xid area: as for driver_faults.py, one scan of the kernel log finds them all and one
saved sequence number says what was read. They are not Xids and not recorded in the events
table (whose rows are Xids): each check reports them in its result's data, which the store keeps
for a result that is not ok.

Facts (xid.parse's "hca"): one event per HCA (PCI address) and kind, and per module where the
line names one: {"kind", "bus_id", "module", "text", "seq", "usec", "repeats"} and
    "module_error"    "error": the driver's words; "label": the project's, None when unknown
    "module_state"    "plugged", "unplugged", "disabled": how often the module said each
    "pcie_limited"    "gbps", "link", "at", "capable_gbps", "capable_link"
    "firmware"        "fatal" (count), "sensor" (the last fatal sensor), "hung", "unreachable",
                      "failed", "timeouts" (counts), "syndrome", "synd", "severity" (from the
                      health buffer), "recovered" (the driver's recovery succeeded last)
    "slot_power"      "watts": what the slot advertises
    "ports_unpowered" ports the firmware powered down for the slot's power (a module event)
`repeats` counts the lines merged into the event (the rate-limited module event repeats).

Every line starts `mlx5_core <domain:bus:dev.fn>: `; lines printed through mlx5_core_err,
_warn, _warn_rl, _info_rl and mlx5_log then carry `<function>:<line>:(pid <n>): `, those
through mlx5_core_info and dev_err do not (mlx5_core.h). The texts, Linux
drivers/net/ethernet/mellanox/mlx5/core/ (docs/sources.md, "The HCA's kernel-log lines"):
  events.c port_module() (older kernels: port.c mlx5_port_module_event()):
    `Port module event: module %u, %s`  Cable plugged / Cable unplugged / Cable disabled
    `Port module event[error]: module %u, %s, %s`  status `Cable error`, the error from
        mlx5_pme_error_to_string() (older kernels: the mlx5_pme_error table); rate-limited
  events.c mlx5_pcie_event(): `Detected insufficient power on the PCIe slot (%uW).`, and, no
    event, `PCIe slot power capability was not advertised.`, `PCIe slot advertised sufficient
    power (%uW).`
  health.c poll_health(): `Fatal error %u detected` (the sensor, mlx5_health_check_fatal_
    sensors()), `device's health compromised - reached miss count` (older kernels: `device's
    health compromised`); print_health_info(): `Health issue observed, %s, severity(%d) %s:`,
    `synd 0x%x: %s` (hsynd_str()), `PCI slot is unavailable`; mlx5_health_try_recover():
    `health recovery flow aborted, PCI reads still not working`, `health recovery failed`,
    `health recovery succeeded`; mlx5_fw_fatal_reporter_err_work(): `Driver is in error state.
    Unloading`
  cmd.c wait_func(), cb_timeout_handler(): `%s(0x%x) timeout. Will cause a leak of a command
    resource` (newer: `cmd[%d]: %s(0x%x) Async, timeout. Will cause ...`)
  drivers/pci/pci.c __pcie_print_link_status() (mlx5_core calls it at probe): `%u.%03u Gb/s
    available PCIe bandwidth, limited by %s x%d link at %s (capable of %u.%03u Gb/s with %s
    x%d link)`; a full-speed link prints `... bandwidth (%s x%d link)`, no event.
A command that fails with a status (`mlx5_cmd_out_err: ... failed, status internal error`) is
not read: reads of restricted registers fail so on healthy nodes (leptonai/gpud's matcher
notes it for ACCESS_REG), and the firmware's own failure shows in the health lines above.
"""

from __future__ import annotations

import re

from slurmhealth.core.result import (
    FAIL,
    NONE,
    REBOOT,
    SERVICE,
    WARN,
    Result,
    clean,
    counted,
    fail,
    ok,
    warn,
    worst_action,
)
from slurmhealth.node.checks.base import Context, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from slurmhealth.node.checks.base import Facts

TEXT_MAX = 160
EVENTS_MAX = 50  # events listed in a result's data; the count is always complete

MODULE_ERROR = "module_error"
MODULE_STATE = "module_state"
PCIE_LIMITED = "pcie_limited"
FIRMWARE = "firmware"
SLOT_POWER = "slot_power"
PORTS_UNPOWERED = "ports_unpowered"

# A module the same HCA reported unplugged this many times in one read is flapping (xid area's
# hca_unplug_max; DEFAULTS in xid.py argues it).
UNPLUG_MAX = 2

# The module errors of mlx5_pme_error_to_string(), by their first words (older kernels print
# `Bus stuck(I2C ...` without the space), in the project's words. Each leaves the module in
# its error state: the firmware does not bring its port's link up (or, too hot, takes it down
# to protect the optics), and only a person changes a module, a cable or a cage.
MODULE_ERRORS = {
    "Power budget exceeded": "over the power budget",
    "Long Range for non MLNX cable": "long-range module not supported",
    "Bus stuck": "I2C bus stuck or shorted",
    "No EEPROM": "EEPROM not readable",
    "Enforce part number list": "part number not allowed",
    "Unknown identifier": "unknown module type",
    "High Temperature": "over temperature",
    "Bad or shorted cable": "bad or shorted cable or module",
}
# MLX5_MODULE_EVENT_ERROR_PCIE_POWER_SLOT_EXCEEDED, reported as a module event.
_PORTS_DOWN = "One or more network ports have been powered down"

# mlx5_health_check_fatal_sensors(): what made the driver declare the HCA failed.
SENSORS = {
    1: "PCI reads fail",
    2: "PCI channel offline",
    3: "NIC interface disabled",
    4: "NIC reset in progress",
    5: "firmware asked for a reset",
}
# The kernel's log levels (mlx5_loglevel_str()): the firmware's severity of a health syndrome.
LEVELS = ("emergency", "alert", "critical", "error", "warning", "notice", "info", "debug")
LEVEL_ERR = 3

_MLX5_LINE = (
    r"\s*mlx5_core ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): "
    r"(?:\w{1,64}:[0-9]{1,6}:\(pid [0-9]{1,10}\): )?(.*)"
)
_MODULE_ERROR = r"Port module event\[error\]: module ([0-9]{1,4}), ([^,]{1,40}), (.{1,200})"
_MODULE_STATE = r"Port module event: module ([0-9]{1,4}), Cable (plugged|unplugged|disabled)\b"
_PCIE_LIMITED = (
    r"([0-9]{1,7}\.[0-9]{3}) Gb/s available PCIe bandwidth, limited by (.{1,24}?) x([0-9]{1,2}) "
    r"link at (\S{1,40}) \(capable of ([0-9]{1,7}\.[0-9]{3}) Gb/s with (.{1,24}?) "
    r"x([0-9]{1,2}) link\)"
)
_SLOT_POWER = r"Detected insufficient power on the PCIe slot \(([0-9]{1,6}) ?W\)"
_FATAL = r"Fatal error ([0-9]{1,3}) detected"
_ISSUE = r"Health issue observed, ([^,]{1,80}), severity\(([0-9])\)"
_SYND = r"synd 0x([0-9A-Fa-f]{1,2}): (.{1,80})"
# What the firmware health lines say, by a phrase each holds (tested in this order).
_FIRMWARE_SAYS = (
    ("Fatal error ", "fatal"),
    ("health compromised", "hung"),
    ("Health issue observed", "issue"),
    ("synd 0x", "synd"),
    ("PCI slot is unavailable", "unreachable"),
    ("health recovery succeeded", "recovered"),
    ("health recovery failed", "failed"),
    ("recovery flow aborted", "failed"),
    ("error state. Unloading", "failed"),
    ("Will cause a leak of a command", "timeouts"),
)
_COUNTED = ("fatal", "hung", "unreachable", "failed", "timeouts")


def _family(msg: str) -> Any:
    """The parser of a message's family (a firmware line: what it says), or None. Substring
    tests only, no regex: a boot prints dozens of mlx5_core lines that are no event, and an
    `or` of `in` tests is the cheapest way past them (docs/benchmarks.md)."""
    if "module event" in msg:
        return _module_event
    if "limited by" in msg:
        return _pcie_limited
    if "power on the PCIe slot" in msg:
        return _slot_power
    if (
        "ealth" in msg  # health compromised, Health issue observed, health recovery ...
        or "Fatal error" in msg
        or "synd 0x" in msg
        or "slot is unavailable" in msg
        or "error state" in msg
        or "cause a leak" in msg
    ):
        return next((what for phrase, what in _FIRMWARE_SAYS if phrase in msg), None)
    return None


def hca_line(msg: str, seq: int, usec: int | None, found: dict[tuple[Any, ...], Any]) -> None:
    """Add the HCA event of one mlx5_core message to `found` ({(kind, bus, module): event});
    a line of no family (`_family`) costs substring tests only."""
    parse = _family(msg)
    if parse is None:
        return
    line = re.match(_MLX5_LINE, msg, re.A)
    if line is None:
        return
    bus, rest = line.group(1).lower(), line.group(2)[: 4 * TEXT_MAX]
    if isinstance(parse, str):
        _firmware(bus, rest, parse, seq, usec, found)
        return
    event = parse(rest)
    if event is None:
        return
    said = event.pop("said", None)
    key = (event["kind"], bus, event["module"])
    kept = found.get(key)
    if kept is None:
        found[key] = kept = dict(
            event, bus_id=bus, text=clean(rest, TEXT_MAX), seq=seq, usec=usec, repeats=0
        )
    kept["repeats"] += 1
    if said is not None:
        kept[said] += 1


def _module_event(rest: str) -> dict[str, Any] | None:
    state = re.search(_MODULE_STATE, rest, re.A)
    if state is not None:
        module, said = int(state.group(1)), state.group(2)
        counts = {"plugged": 0, "unplugged": 0, "disabled": 0}
        return {"kind": MODULE_STATE, "module": module, "said": said, **counts}
    error = re.search(_MODULE_ERROR, rest, re.A)
    if error is None:
        return None
    words = clean(error.group(3), 120)
    if words.startswith(_PORTS_DOWN):
        return {"kind": PORTS_UNPOWERED, "module": int(error.group(1))}
    label = next((mine for theirs, mine in MODULE_ERRORS.items() if words.startswith(theirs)), None)
    return {"kind": MODULE_ERROR, "module": int(error.group(1)), "error": words, "label": label}


def _pcie_limited(rest: str) -> dict[str, Any] | None:
    pcie = re.search(_PCIE_LIMITED, rest, re.A)
    if pcie is None:
        return None
    gbps, speed, width, at, capable, cap_speed, cap_width = pcie.groups()
    return {
        "kind": PCIE_LIMITED,
        "module": None,
        "gbps": float(gbps),
        "link": f"{clean(speed, 24)} x{width}",
        "at": clean(at, 40),
        "capable_gbps": float(capable),
        "capable_link": f"{clean(cap_speed, 24)} x{cap_width}",
    }


def _slot_power(rest: str) -> dict[str, Any] | None:
    power = re.search(_SLOT_POWER, rest, re.A)
    if power is None:
        return None
    return {"kind": SLOT_POWER, "module": None, "watts": int(power.group(1))}


def _firmware_said(rest: str, said: str) -> dict[str, Any] | None:
    """What one firmware health line adds to its HCA's event ({} for a line that only
    counts), or None when the line is not the driver's."""
    if said == "fatal":
        fatal = re.search(_FATAL, rest, re.A)
        return {"sensor": int(fatal.group(1))} if fatal else None
    if said == "issue":
        issue = re.search(_ISSUE, rest, re.A)
        if issue is None:
            return None
        return {"syndrome": _syndrome(issue.group(1)), "severity": int(issue.group(2))}
    if said == "synd":
        synd = re.search(_SYND, rest, re.A)
        if synd is None:
            return None
        return {"synd": int(synd.group(1), 16), "named": _syndrome(synd.group(2))}
    return {}


def _firmware(
    bus: str, rest: str, said: str, seq: int, usec: int | None, found: dict[tuple[Any, ...], Any]
) -> None:
    """Fold one firmware health line into the HCA's one firmware event, in the order the
    driver prints them: a failure clears `recovered`, `health recovery succeeded` sets it."""
    update = _firmware_said(rest, said)
    if update is None:
        return
    key = (FIRMWARE, bus, None)
    event = found.get(key)
    if event is None:
        event = found[key] = _firmware_event(bus, rest, seq, usec)
    named = update.pop("named", None)
    event.update(update)
    event["syndrome"] = event["syndrome"] or named
    if said in _COUNTED:
        event[said] += 1
    if said in ("fatal", "hung", "unreachable", "failed"):
        event["recovered"] = False
    elif said == "recovered":
        event["recovered"] = True
    event["repeats"] += 1


def _firmware_event(bus: str, rest: str, seq: int, usec: int | None) -> dict[str, Any]:
    counts = dict.fromkeys(_COUNTED, 0)
    return {
        "kind": FIRMWARE,
        "bus_id": bus,
        "module": None,
        "sensor": None,
        "syndrome": None,
        "synd": None,
        "severity": None,
        "recovered": False,
        **counts,
        "text": clean(rest, TEXT_MAX),
        "seq": seq,
        "usec": usec,
        "repeats": 0,
    }


def _syndrome(text: str) -> str:
    """hsynd_str()'s words; `HW fatal error\\n` ends in a newline the kernel log escapes."""
    return clean(text.replace("\\x0a", " "), 60)


# --- verdicts -------------------------------------------------------------------------------


def firmware_class(event: dict[str, Any]) -> tuple[str, str]:
    """(status, action) of an HCA's firmware event.

    Fail, reboot: a fatal error, a firmware whose health counter stopped, an HCA no longer
    reachable over PCIe, a failed recovery, or a syndrome of error severity or worse (or of
    none, as older kernels print it), unless the driver's own recovery succeeded last. The
    driver then reset the HCA and reloaded its functions (NVIDIA's MLNX_OFED "Reset Flow"):
    the job that used it saw a fatal device event and failed, the node works again: warn.
    A reboot resets the HCA and reloads its firmware, the project's way to do what the
    driver could not; the same failure after it is a card for service (its repeat).
    Warn: a syndrome the firmware rates below error, a command that timed out (its slot stays
    leaked until the driver reloads; the next commands run)."""
    if event["recovered"]:
        return WARN, NONE
    if event["fatal"] or event["hung"] or event["unreachable"] or event["failed"]:
        return FAIL, REBOOT
    severity = event["severity"]
    if event["syndrome"] and (severity is None or severity <= LEVEL_ERR):
        return FAIL, REBOOT
    return WARN, NONE


def _firmware_words(event: dict[str, Any]) -> str:
    parts = []
    if event["fatal"]:
        sensor = event["sensor"]
        why = SENSORS.get(sensor, f"sensor {sensor}") if sensor is not None else "sensor unknown"
        parts.append(f"fatal error ({why})")
    if event["hung"]:
        parts.append("firmware not responding (health counter stopped)")
    if event["unreachable"]:
        parts.append("not reachable over PCIe")
    if event["syndrome"]:
        severity = event["severity"]
        level = f", {LEVELS[severity]}" if severity is not None and severity < len(LEVELS) else ""
        synd = f"synd 0x{event['synd']:x}" if event["synd"] is not None else ""
        said = ", ".join(p for p in (synd, level.lstrip(", ")) if p)
        parts.append(f"{event['syndrome']} ({said})" if said else event["syndrome"])
    if event["timeouts"]:
        parts.append(f"{counted(event['timeouts'], 'command')} timed out")
    if event["failed"]:
        parts.append("the driver's recovery failed")
    if event["recovered"]:
        parts.append("recovered by the driver's reset")
    return f"HCA {event['bus_id']} firmware: {', '.join(parts) or 'health event'}"


def module_class(event: dict[str, Any], unplug_max: int) -> tuple[str, str] | None:
    """(status, action) of a module or link event, or None when it is no problem.

    A module error the driver names fails (service): its port has no link or loses it, and a
    person changes the module, the cable or the cage. One it does not name warns (service).
    A module that says `unplugged` unplug_max times in one read warns (service): a boot
    reports an empty cage once and a reseat is one unplug, but a module that keeps losing
    contact takes its link down each time. `Cable disabled` warns: the module is switched
    off. A PCIe link downtrained at probe warns (service): the HCA runs at a fraction of its
    bandwidth (a x8 Gen3 link feeds 63 Gb/s to a 400 Gb/s port), which slows every multi-node
    job without breaking it; the link stays so until a reseat or a reboot retrains it."""
    kind = event["kind"]
    if kind == MODULE_ERROR:
        return (FAIL if event["label"] else WARN), SERVICE
    if kind == MODULE_STATE:
        flapping = unplug_max > 0 and event["unplugged"] >= unplug_max
        return (WARN, SERVICE) if flapping or event["disabled"] else None
    if kind == PCIE_LIMITED:
        return WARN, SERVICE
    return None


def _module_words(event: dict[str, Any]) -> str:
    times = f" x{event['repeats']}" if event["repeats"] > 1 else ""
    where = f"HCA {event['bus_id']}"
    if event["kind"] == MODULE_ERROR:
        what = event["label"] or f"error: {event['error']}"
        return f"{where} module {event['module']} {what}{times}"
    if event["kind"] == MODULE_STATE:
        said = [f"unplugged {counted(event['unplugged'], 'time')}"] if event["unplugged"] else []
        said += [f"disabled {counted(event['disabled'], 'time')}"] if event["disabled"] else []
        return f"{where} module {event['module']} {', '.join(said)}"
    return (
        f"{where} PCIe link downtrained: {event['link']} at {event['at']}, "
        f"capable of {event['capable_link']} ({event['gbps']:g} of "
        f"{event['capable_gbps']:g} Gb/s){times}"
    )


def _data(events: list[Any]) -> dict[str, Any]:
    return {"count": len(events), "events": events[:EVENTS_MAX]}


def _unplug_max(ctx: Context) -> int:
    value = ctx.expect.get("hca_unplug_max", UNPLUG_MAX)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _judged(
    judged: list[tuple[dict[str, Any], tuple[str, str]]], words: Callable[..., str]
) -> Result:
    """The result of (event, (status, action)) pairs: failures first, in log order."""
    judged = sorted(judged, key=lambda pair: (pair[1][0] != FAIL, pair[0]["seq"]))
    message = summarize([words(event) for event, _ in judged])
    data = _data([event for event, _ in judged])
    failing = [action for _, (status, action) in judged if status == FAIL]
    if failing:
        return fail(message, data, worst_action(failing))
    return warn(message, data, worst_action([action for _, (_, action) in judged]))


def hca_events(facts: Facts, ctx: Context) -> Result:
    """HCA module and PCIe link events since the last run: module errors fail, flaps warn.

    mlx5_core's port module events and the PCI core's link report at probe (module_class:
    a module error the driver names fails with service; an unnamed one, a module unplugged
    hca_unplug_max times or disabled, and a downtrained link warn with service). A boot's
    `Cable plugged` and one reseat are no event."""
    unplug_max = _unplug_max(ctx)
    judged = []
    for event in facts.get("hca") or []:
        if event["kind"] in (MODULE_ERROR, MODULE_STATE, PCIE_LIMITED):
            verdict = module_class(event, unplug_max)
            if verdict is not None:
                judged.append((event, verdict))
    if not judged:
        return ok("no HCA events in the kernel log")
    return _judged(judged, _module_words)


def hca_firmware(facts: Facts, ctx: Context) -> Result:
    """HCA firmware failures since the last run: fatal, hung or unrecovered fail (reboot).

    mlx5_core's health poller (firmware_class): a fatal error, a stopped health counter, an
    HCA gone from PCIe, a failed recovery or an error-severity syndrome fail with reboot
    unless the driver's recovery succeeded last (warn); a lesser syndrome or a command
    timeout warns. The HCA is named by its PCI address."""
    found = [e for e in facts.get("hca") or [] if e["kind"] == FIRMWARE]
    if not found:
        return ok("no HCA firmware failures in the kernel log")
    return _judged([(e, firmware_class(e)) for e in found], _firmware_words)


def _power_words(event: dict[str, Any]) -> str:
    if event["kind"] == PORTS_UNPOWERED:
        times = f" x{event['repeats']}" if event["repeats"] > 1 else ""
        return f"HCA {event['bus_id']} ports powered down for lack of PCIe slot power{times}"
    watts = event["watts"]
    return f"HCA {event['bus_id']} PCIe slot power insufficient (slot advertises {watts} W)"


def hca_power(facts: Facts, ctx: Context) -> Result:
    """HCA slot power since the last run: ports powered down fail, a short slot warns.

    The firmware compares the power the slot advertises with what the card needs. Ports it
    powered down for it fail (service): their links are gone until the slot, its riser or the
    BIOS's slot-power setting is fixed. `Detected insufficient power` alone warns (service):
    the card runs, its ports up, at most held to a lower power profile; NVIDIA's NVSentinel
    rates it non-fatal (a power negotiation, often transient at boot), and no reboot mends a
    slot (docs/sources.md)."""
    found = [e for e in facts.get("hca") or [] if e["kind"] in (SLOT_POWER, PORTS_UNPOWERED)]
    if not found:
        return ok("no HCA slot power events in the kernel log")
    judged = [(e, (FAIL if e["kind"] == PORTS_UNPOWERED else WARN, SERVICE)) for e in found]
    return _judged(judged, _power_words)


CHECKS = (hca_events, hca_firmware, hca_power)
