"""BMC checks: the new entries of the System Event Log since the last health check.

Facts from sources/bmc.py (`ipmitool sel elist`). The health check runs it, never a job hook
(PHASES): each SEL read is a round trip per record through the BMC's KCS interface.

New entries only: the baseline keeps the id of the last record seen and its text. Ids grow
until the SEL is cleared (`ipmitool sel clear`, a full log a BMC wraps), which restarts them:
when the last record is gone or reads differently, every record is new. The first run with no
baseline records it and judges nothing: a SEL holds years of a node's past (its assembly, its
burn-in), which a new install must not drain it for; the message counts what is there.

Each new record is judged by its sensor type and event, as ipmitool names them (the IPMI 2.0
specification's sensor-specific offsets, Table 42-3, and threshold events, Table 42-2, in
ipmitool's lib/ipmi_sel.c and include/ipmitool/ipmi_sel_supp.h); a Deasserted record is a
condition that ended and is ok:
- fail, service: Memory "Uncorrectable ECC", "Parity", "Memory Device Disabled", "Critical
  Overtemperature"; Processor "IERR", "Thermal Trip", "FRB..." failures, "Uncorrectable machine
  check exception", "SM BIOS Uncorrectable CPU-complex Error"; Power Supply "Failure detected";
  Critical Interrupt "Bus Fatal Error", "Bus Uncorrectable error", "Fatal NMI", "PCI SERR",
  "I/O Channel check NMI"; Chip Set "Thermal Trip".
- fail, drain: a threshold crossed at Critical or Non-recoverable ("Upper Critical going high",
  "Lower Critical going low", ...) on any sensor: a temperature, a voltage, a fan.
- warn: Memory "Correctable ECC" and its "logging limit reached"; Processor "Correctable machine
  check error", "Throttled"; Power Supply "Predictive failure", "Power Supply AC lost", "AC lost
  or out-of-range", "AC out-of-range, but present" (one feed of a redundant pair); Critical
  Interrupt "PCI PERR", "Bus Correctable error", "Bus Degraded", "Bus Timeout"; a Non-critical
  threshold crossed; Drive Slot "Drive Fault", "Predictive Failure".
- ok: everything else (presence, boot and log events, OEM records).
"""

from __future__ import annotations

from slurmhealth.core.constants import CHECK, DIAG, HEALTHCHECK
from slurmhealth.core.result import DRAIN, SERVICE, Result, counted, fail, ok, warn

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Context, Facts, Schema

AREA = "bmc"
SOURCE = "bmc"
PHASES = (HEALTHCHECK, CHECK, DIAG)

DEFAULTS: Schema = {
    "expected": (False, bool, "a BMC is expected: no IPMI device or ipmitool fails the node"),
}

_TEXT_MAX = 120
# (sensor type, events) -> (status, action). Sensor types and event texts as ipmitool prints
# them (ipmi_sel_supp.h); matched on the type at the start of the sensor column.
_EVENTS = (
    ("Memory", ("Uncorrectable ECC", "Parity", "Memory Device Disabled",
                "Critical Overtemperature"), "fail", SERVICE),
    ("Memory", ("Correctable ECC", "Correctable ECC logging limit reached"), "warn", ""),
    ("Processor", ("IERR", "Thermal Trip", "FRB1/BIST failure", "FRB2/Hang in POST failure",
                   "FRB3/Processor startup/init failure", "Uncorrectable machine check exception",
                   "SM BIOS Uncorrectable CPU-complex Error"), "fail", SERVICE),
    ("Processor", ("Correctable machine check error", "Throttled"), "warn", ""),
    ("Power Supply", ("Failure detected",), "fail", SERVICE),
    ("Power Supply", ("Predictive failure", "Power Supply AC lost", "AC lost or out-of-range",
                      "AC out-of-range, but present"), "warn", ""),
    ("Critical Interrupt", ("Bus Fatal Error", "Bus Uncorrectable error", "Fatal NMI",
                            "PCI SERR", "I/O Channel check NMI"), "fail", SERVICE),
    ("Critical Interrupt", ("PCI PERR", "Bus Correctable error", "Bus Degraded", "Bus Timeout"),
     "warn", ""),
    ("Chip Set", ("Thermal Trip",), "fail", SERVICE),
    ("Drive Slot", ("Drive Fault", "Predictive Failure"), "warn", ""),
)
_RANK = {"ok": 0, "warn": 1, "fail": 2}


# ---------------------------------------------------------------- parse (pure, never raises)


def _hex(text: str) -> int | None:
    text = text.strip()
    if not text or len(text) > 4 or any(c not in "0123456789abcdefABCDEF" for c in text):
        return None
    return int(text, 16)


def parse_line(line: object) -> dict[str, Any] | None:
    """One `sel elist`/`sel list` line -> {id, when, sensor, event, asserted, text}; None for
    a line that is no record. Pre-Init and OEM records keep what their columns hold."""
    if not isinstance(line, str):
        return None
    cells = [c.strip() for c in line.split("|")]
    record = _hex(cells[0]) if cells else None
    if record is None or len(cells) < 2:
        return None
    sensor = cells[3] if len(cells) > 3 else cells[1]
    event = cells[4] if len(cells) > 4 else ""
    return {
        "id": record,
        "when": " ".join(cells[1:3]) if len(cells) > 3 else "",
        "sensor": sensor[:_TEXT_MAX],
        "event": event[:_TEXT_MAX],
        "asserted": (cells[5] if len(cells) > 5 else "Asserted") != "Deasserted",
        "text": " | ".join(cells[1:])[:2 * _TEXT_MAX],
    }


def parse(raw: object) -> Facts:
    """The source's raw lines -> {"records": [{id, when, sensor, event, asserted, text}]}."""
    lines = raw.get("lines") if isinstance(raw, dict) else None
    parsed = (parse_line(line) for line in (lines if isinstance(lines, list) else []))
    return {"records": [r for r in parsed if r is not None]}


# ---------------------------------------------------------------- judging one record


def severity(record: dict[str, Any]) -> tuple[str, str]:
    """(ok|warn|fail, action) of one record: the tables in the module docstring."""
    if not record["asserted"]:
        return "ok", ""
    sensor, event = record["sensor"], record["event"]
    for kind, events, status, action in _EVENTS:
        if sensor.startswith(kind) and event in events:
            return status, action
    if event.endswith(("going high", "going low")):
        if "Critical" in event and "Non-critical" not in event or "Non-recoverable" in event:
            return "fail", DRAIN
        if "Non-critical" in event:
            return "warn", ""
    return "ok", ""


def new_records(
    records: list[dict[str, Any]], before: dict[str, Any]
) -> tuple[list[dict[str, Any]], bool]:
    """(the records since the baseline, whether the SEL was cleared since). No baseline: none
    (the first run records one)."""
    last, text = before.get("last_id"), before.get("last_text")
    if not isinstance(last, int) or isinstance(last, bool):
        return [], False
    if last == 0:  # the SEL was empty
        return list(records), False
    seen = next((r for r in records if r["id"] == last), None)
    if seen is None or seen["text"] != text:
        return list(records), True
    return [r for r in records if r["id"] > last], False


def _line(record: dict[str, Any]) -> str:
    return f"{record['sensor']} {record['event']} (SEL {record['id']:#x}, {record['when']})"


# ---------------------------------------------------------------- checks


def sel(facts: Facts, ctx: Context) -> Result:
    """New BMC event log entries: uncorrectable ECC, IERR, a failed PSU, a critical threshold."""
    records = facts["records"]
    before = ctx.baseline if isinstance(ctx.baseline, dict) else {}
    fresh, cleared = new_records(records, before)
    if "last_id" not in before:
        judged = [severity(r)[0] for r in records]
        bad = judged.count("fail") + judged.count("warn")
        said = f", {bad} of them warn or fail (not judged)" if bad else ""
        return ok(f"baseline recorded: {counted(len(records), 'SEL entry', 'SEL entries')}{said}")
    worst, action, named = "ok", "", []
    for record in fresh:
        status, act = severity(record)
        if status != "ok":
            named.append(_line(record))
        if _RANK[status] > _RANK[worst] or (status == worst == "fail" and act == SERVICE):
            worst, action = status, act or action
    data = {"new": len(fresh), "cleared": cleared, "entries": named[:10]}
    if worst != "ok":
        more = f" (+{len(named) - 1} more)" if len(named) > 1 else ""
        text = f"BMC SEL: {named[0]}{more}"
        return fail(text, data, action or DRAIN) if worst == "fail" else warn(text, data)
    since = " since it was cleared" if cleared else ""
    return ok(f"{counted(len(fresh), 'new SEL entry', 'new SEL entries')}{since}, none severe",
              data)


CHECKS = (sel,)


# ---------------------------------------------------------------- memory and genconf


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """The last record seen (id and text), from which the next run reads new entries."""
    records = facts["records"]
    if not records:
        return {"last_id": 0, "last_text": "", "taken_at": now}
    last = max(records, key=lambda r: r["id"])
    return {"last_id": last["id"], "last_text": last["text"], "taken_at": now}


def expectations(facts: Facts) -> dict[str, Any]:
    """A node whose BMC answered (its SEL was read) expects one."""
    return {"expected": True}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """A BMC is expected where the config says so (bmc.expected)."""
    return bool(expect.get("expected"))
