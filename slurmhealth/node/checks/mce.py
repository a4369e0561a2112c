"""Machine checks and hardware errors in the kernel log (a second area on the kmsg source: the
records newer than the saved position, as the xid area reads them; sources/kmsg.py).

Lines read (the message, after the kernel log's own prefix), each anchored at its start so that
a user-controlled string inside another subsystem's line cannot pass for one:
- `mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 7: cc00008000010090` (and `Machine Check
  Exception:` while the exception is in progress): arch/x86/kernel/cpu/mce/core.c __print_mce,
  `HW_ERR "CPU %d: Machine Check%s: %Lx Bank %d: %016Lx"`, the last number being the bank's
  MCi_STATUS. Its bits decide (Intel SDM vol. 3B "IA32_MCi_STATUS MSRs"; AMD APM vol. 2
  "MCi_STATUS"): UC (bit 61) uncorrected, PCC (bit 57) processor context corrupt (fatal); an
  error without UC was corrected. The same lines appear at boot for the errors a fatal machine
  check left in the banks before the reset.
- `mce: [Hardware Error]: Machine check events logged` (mce_notify_irq): corrected errors were
  logged for mcelog or rasdaemon to decode (the kernel reports uncorrected ones by the line
  above or by a panic).
- `mce: [Hardware Error]: Machine check: <why>` (mce_panic) and `mce: Uncorrected hardware
  memory error in user-access at <addr>` (kill_me_maybe): uncorrected.
- `Memory failure: 0x<pfn>: recovery action for <page>: Recovered|Delayed|Ignored|Failed`
  (mm/memory-failure.c action_result): the kernel handled a poisoned page, an uncorrected memory
  error; Ignored or Failed left it in use: reboot.
- `{N}[Hardware Error]: event severity: corrected|recoverable|fatal` (firmware-first errors,
  drivers/acpi/apei/ghes.c and drivers/firmware/efi/cper.c cper_estatus_print). The same record
  without `{N}` is one the firmware kept from the previous boot, printed once at this boot after
  `BERT: Error records from previous boot:` (drivers/acpi/apei/bert.c; the form is quoted in the
  kernel commit "efi: cper: Add support for printing Firmware Error Record Reference", 2020): a
  fatal one is most often why the node went down, and judged like a live one. Arm servers
  (NVIDIA Grace among them) report memory and CPU errors this firmware-first way (GHES).
- `[Hardware Error]: Corrected error, no action required.` and the other summaries of AMD's
  decoder (drivers/edac/mce_amd.c decode_error_status): `Uncorrected, software restartable
  error.`, `Uncorrected, software containable error.`, `System Fatal error.`, `Deferred error,
  no action required.` (a deferred error is an uncorrected one not yet consumed).
rasdaemon and mcelog read the same events from the kernel's trace points and /dev/mcelog; the
lines above are what the log keeps where neither runs.

Uncorrected and fatal fail with the service hint (the DIMM or the CPU needs inspection); a
memory failure left unrecovered asks for a reboot. Corrected ones warn from `corrected_warn`
lines in one read (0: never). Lines written from user space (facility not LOG_KERN) are left out.
"""

from __future__ import annotations

import re

from slurmhealth.core.result import REBOOT, SERVICE, Result, counted, fail, ok, warn
from slurmhealth.node.checks.base import Context, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "mce"
SOURCE = "kmsg"

DEFAULTS: Schema = {
    "corrected_warn": (
        1,
        int,
        "corrected machine-check lines in one read of the log that warn; 0: never",
    ),
}

CORRECTED, UNCORRECTED, FATAL = "corrected", "uncorrected", "fatal"
UC_BIT, PCC_BIT = 1 << 61, 1 << 57  # MCi_STATUS
EVENTS_MAX = 20
TEXT_MAX = 160

# Patterns stay strings for re's own cache: a read without such a line never compiles them.
_CPU = (
    r"mce: \[Hardware Error\]: CPU ([0-9]{1,5}): Machine Check(?: Exception)?: "
    r"[0-9a-fA-F]{1,16} Bank ([0-9]{1,3}): ([0-9a-fA-F]{1,16})\b"
)
_MEMORY_FAILURE = r"Memory failure: (0x[0-9a-fA-F]{1,16}): recovery action for .{0,60}?: (\w+)"
_GHES = r"\{[0-9]{1,10}\}\[Hardware Error\]: event severity: (\w+)"
# AMD's decoder summaries (mce_amd.c decode_error_status) -> class
_AMD = {
    "Corrected error, no action required.": CORRECTED,
    "Deferred error, no action required.": UNCORRECTED,
    "Uncorrected, software restartable error.": UNCORRECTED,
    "Uncorrected, software containable error.": UNCORRECTED,
    "System Fatal error.": FATAL,
}
_GHES_SEVERITY = {"corrected": CORRECTED, "recoverable": UNCORRECTED, "fatal": FATAL}
_HW = "[Hardware Error]: "


def status_class(status: int) -> str:
    """MCi_STATUS -> fatal (UC and PCC), uncorrected (UC) or corrected."""
    if status & UC_BIT:
        return FATAL if status & PCC_BIT else UNCORRECTED
    return CORRECTED


def parse_line(msg: str) -> dict[str, Any] | None:
    """One message -> {"class", "what", "action"}, or None when it is no hardware error."""
    if msg.startswith("mce: "):
        return _mce_line(msg)
    if msg.startswith("Memory failure: "):
        found = re.match(_MEMORY_FAILURE, msg, re.A)
        if not found:
            return None
        result = found.group(2)
        action = REBOOT if result in ("Failed", "Ignored") else SERVICE
        return _event(UNCORRECTED, f"memory failure at pfn {found.group(1)}: {result}", action)
    if msg.startswith("{"):
        found = re.match(_GHES, msg, re.A)
        if not found:
            return None
        severity = found.group(1)
        return _event(_GHES_SEVERITY.get(severity), f"firmware-reported {severity} hardware error")
    if msg.startswith(_HW):
        summary = msg[len(_HW):].strip()
        if summary.startswith("event severity: "):  # a record of the previous boot (BERT)
            severity = summary[16:]
            what = f"firmware-reported {severity} hardware error, recorded at the previous boot"
            return _event(_GHES_SEVERITY.get(severity), what)  # None unless a known word
        level = _AMD.get(summary)
        return _event(level, summary.rstrip(".")) if level else None
    return None


def _mce_line(msg: str) -> dict[str, Any] | None:
    found = re.match(_CPU, msg, re.A)
    if found:
        status = int(found.group(3), 16)
        level = status_class(status)
        what = f"CPU {found.group(1)} bank {found.group(2)} status 0x{status:016x}"
        return _event(level, f"{level} machine check: {what}")
    rest = msg[len("mce: "):]
    if rest.startswith(_HW + "Machine check events logged"):
        return _event(CORRECTED, "machine check events logged")
    if rest.startswith(_HW + "Machine check: "):
        return _event(FATAL, "fatal machine check: " + rest[len(_HW) + 15:].strip())
    if rest.startswith("Uncorrected hardware memory error"):
        return _event(UNCORRECTED, rest.strip())
    return None


def _event(level: str | None, what: str, action: str = SERVICE) -> dict[str, Any] | None:
    if level is None:
        return None
    action = action if level != CORRECTED else "none"
    return {"class": level, "text": what[:TEXT_MAX], "action": action}


def _foreign(rec: dict[str, Any]) -> bool:
    facility = rec.get("facility")
    return isinstance(facility, int) and not isinstance(facility, bool) and facility != 0


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(raw: object) -> Facts:
    """Raw kmsg facts -> {"events": [{"seq", "usec", "class", "text", "action"}], "records"}.
    Pure and total."""
    records = raw.get("records") if isinstance(raw, dict) else None
    events, count = [], 0
    for rec in records if isinstance(records, list) else []:
        if not isinstance(rec, dict) or _int(rec.get("seq")) is None:
            continue
        count += 1
        msg = rec.get("msg")
        if not isinstance(msg, str) or _foreign(rec):
            continue
        if not (msg.startswith(("mce: ", "Memory failure: ", "{")) or msg.startswith(_HW)):
            continue
        event = parse_line(msg)
        if event is not None:
            event.update(seq=rec["seq"], usec=_int(rec.get("usec")))
            events.append(event)
    return {"events": events, "records": count}


def _listed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return events[:EVENTS_MAX]


def uncorrected(facts: Facts, ctx: Context) -> Result:
    """No uncorrected or fatal machine check or memory failure in the new kernel-log lines."""
    if not facts["records"]:
        return ok("no new kernel-log records")
    bad = [e for e in facts["events"] if e["class"] != CORRECTED]
    data = {"count": len(bad), "events": _listed(bad)}
    if not bad:
        return ok("no uncorrected machine checks", data)
    action = REBOOT if any(e["action"] == REBOOT for e in bad) else SERVICE
    return fail(summarize([e["text"] for e in bad], " error"), data, action)


def corrected(facts: Facts, ctx: Context) -> Result:
    """Corrected machine checks in the new kernel-log lines (warn: hardware wearing)."""
    if not facts["records"]:
        return ok("no new kernel-log records")
    seen = [e for e in facts["events"] if e["class"] == CORRECTED]
    data = {"count": len(seen), "events": _listed(seen)}
    limit = ctx.expect.get("corrected_warn", DEFAULTS["corrected_warn"][0])
    if seen and limit and len(seen) >= limit:
        return warn(f"{counted(len(seen), 'corrected hardware error')}: {seen[0]['text']}", data)
    return ok(f"{counted(len(seen), 'corrected hardware error')}", data)


CHECKS = (uncorrected, corrected)
