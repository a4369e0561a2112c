"""PCIe Advanced Error Reporting in the kernel log (an area on the kmsg source: the records
newer than the saved position, as the xid area reads them; sources/kmsg.py).

Lines read, each anchored at the message start (`<driver> <domain:bus:dev.fn>: AER: ...`, the
PCI core's dev_printk prefix; `pci` where no driver is bound), from drivers/pci/pcie/aer.c:
- the port's `[Multiple ]<severity> error received: 0000:41:00.0` (aer_print_port_info; older
  kernels `... received: id=4100`, the requester id; newer ones `... error message received
  from 0000:41:00.0`), naming the function that sent the error message;
- the function's own `PCIe Bus Error: severity=<severity>, type=<layer>, (<agent>)`
  (aer_print_error; older kernels `id=4100(Receiver ID)`), then `  device [10de:2330] error
  status/mask=00004000/00000000` (its vendor:device) and one `   [14] CmpltTO (First)` line
  per error bit;
- firmware-first errors (APEI GHES, pci_print_aer): `aer_status: 0x00004000, aer_mask: 0x...`,
  the bit lines, `aer_layer=..., aer_agent=...`, and for an uncorrectable error
  `aer_uncor_severity: 0x...`, whose bits set in the status are fatal, the others non-fatal;
- drivers/pci/pcie/dpc.c: `DPC: containment event, status:0x1f01 source:0x4100`: the port
  contained an uncorrectable error by taking its link down.
The severity words: `Uncorrected (Fatal)`, `Uncorrected (Non-Fatal)`, `Corrected`; kernels
since 6.x print `Uncorrectable` and `Correctable` (the PCIe specification's terms).

Verdicts per function (its bus id; an NVIDIA GPU where its vendor is 10de, a Mellanox/NVIDIA
HCA where it is 15b3, as the `device [vendor:device]` line says):
- Uncorrectable fatal, or a DPC containment: fail, reboot. A fatal error leaves the link
  unreliable (PCIe Base Specification, 6.2.2.2.1 "Fatal Errors"), so the kernel resets the
  link below the port (Documentation/PCI/pcieaer-howto.rst, "Uncorrectable Error Recovery";
  DPC takes the link down itself): every function below loses its state, a GPU as after Xid 79
  (whose catalogue action is a reboot), an HCA its queues. A reboot retrains the link and
  reloads the drivers. One fatal error does not prove a part bad (a signal-integrity event, a
  surprise link down), so the action is not service; repeats are the lemon policy's evidence.
- Uncorrectable non-fatal: warn, service hint. The specification (6.2.2.2.2) and the howto
  say the transaction is unreliable but the link fully functional; the kernel recovers without
  a reset (error_detected with io_normal). What the lost transaction did to a GPU the driver
  reports as an Xid, which the xid area judges; many non-fatal reports are a probe's
  Unsupported Request. Recorded and visible, it drains no node alone.
- Correctable: warn above `corrected_per_h` on one function, over the span of the read (at
  least one hour): the hardware corrected them (replay, a receiver error), a steady rate means a
  marginal link or slot. The kernel rate-limits these lines, so the log undercounts; the sysfs
  counters (aer_dev_correctable) are exact.
Lines written from user space (facility not LOG_KERN) are left out.
"""

from __future__ import annotations

import re

from slurmhealth.core.result import REBOOT, SERVICE, Result, counted, fail, ok, warn
from slurmhealth.node.checks.base import Context, norm_bus_id, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Keep, Schema

AREA = "aer"
SOURCE = "kmsg"

DEFAULTS: Schema = {
    "corrected_per_h": (
        10,
        int,
        "corrected PCIe errors per hour on one function (over the read, at least an hour) "
        "that warn; 0: never",
    ),
}

FATAL, NONFATAL, CORRECTED = "fatal", "nonfatal", "corrected"
VENDORS = {"10de": "NVIDIA GPU", "15b3": "HCA"}
EVENTS_MAX = 20
BITS_MAX = 8

# Patterns stay strings for re's own cache: a read without such a line never compiles them.
_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_DEV = r"(\S{1,40}) (" + _BDF + r"): (?:(AER|DPC): )?"
_SEVERITY = r"(Uncorrect(?:ed|able) \((?:Non-)?Fatal\)|Correct(?:ed|able))"
_RECEIVED = (
    r"(Multiple )?" + _SEVERITY + r" error (?:received: |message received from )"
    r"(?:(" + _BDF + r")|id=([0-9a-fA-F]{4}))"
)
_BUS_ERROR = r"PCIe Bus Error: severity=" + _SEVERITY + r", type=([A-Za-z ]{1,24}),"
_DEVICE = r"\s*device \[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\] error status/mask="
_BIT = r"\s*\[ ?([0-9]{1,2})\] ([A-Za-z][A-Za-z ]{0,24}?)\s*(?:\(First\))?$"
_AER_STATUS = r"aer_status: 0x([0-9a-fA-F]{8}), aer_mask: 0x([0-9a-fA-F]{8})"
_UNCOR_SEVERITY = r"aer_uncor_severity: 0x([0-9a-fA-F]{8})"


def severity_class(words: str) -> str:
    """`Uncorrected (Fatal)` / `Uncorrectable (Fatal)` -> fatal; Non-Fatal -> nonfatal; else
    corrected."""
    if words.startswith("Uncorrect"):
        return NONFATAL if "Non-Fatal" in words else FATAL
    return CORRECTED


def _from_id(port: str, requester: str) -> str:
    """The bus id of an old kernel's `id=4100` (bus << 8 | devfn) in the port's domain."""
    value = int(requester, 16)
    bus, devfn = value >> 8, value & 0xFF
    return f"{port[:4]}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


class _Scan:
    """The events of one read, in order: what each function's own lines say (`detail`), and
    what the port's `error received` lines name (`received`), per (bus id, class)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.last: dict[str, dict[str, Any]] = {}
        self.received: dict[tuple[str, str], dict[str, Any]] = {}

    def line(self, msg: str, seq: int) -> None:
        head = re.match(_DEV, msg, re.A)
        if head is None:
            return
        bus, kind, rest = head.group(2).lower(), head.group(3), msg[head.end() :]
        if kind == "DPC":
            if rest.startswith("containment event"):
                self._new(bus, FATAL, seq, "DPC containment event")
            return
        found = re.match(_BUS_ERROR, rest, re.A)
        if found:
            layer = found.group(2).strip()
            self._new(bus, severity_class(found.group(1)), seq, layer)
            return
        self._more(bus, rest, seq)

    def _more(self, bus: str, rest: str, seq: int) -> None:
        event = self.last.get(bus)
        found = re.match(_DEVICE, rest, re.A)
        if found and event is not None and event["vendor"] is None:
            event["vendor"], event["device"] = found.group(1).lower(), found.group(2).lower()
            return
        found = re.match(_BIT, rest, re.A) if event is not None else None
        if found and event is not None and len(event["bits"]) < BITS_MAX:
            event["bits"].append(found.group(2).strip())
            return
        found = re.match(_AER_STATUS, rest, re.A)
        if found:
            status, mask = int(found.group(1), 16), int(found.group(2), 16)
            event = self._new(bus, CORRECTED, seq, "firmware-reported")
            event["status"] = status & ~mask
            return
        found = re.match(_UNCOR_SEVERITY, rest, re.A)
        if found and event is not None and "status" in event:
            fatal = event["status"] & int(found.group(1), 16)
            event["class"] = FATAL if fatal else NONFATAL
            return
        found = re.match(_RECEIVED, rest, re.A)
        if found:
            source = found.group(3).lower() if found.group(3) else _from_id(bus, found.group(4))
            level = severity_class(found.group(2))
            seen = self.received.setdefault(
                (source, level), {"bus_id": source, "class": level, "count": 0, "seq": seq}
            )
            seen["count"] += 2 if found.group(1) else 1

    def _new(self, bus: str, level: str, seq: int, what: str) -> dict[str, Any]:
        event: dict[str, Any] = {"bus_id": bus, "class": level, "what": what, "vendor": None,
                                 "device": None, "bits": [], "count": 1, "seq": seq}  # fmt: skip
        self.events.append(event)
        self.last[bus] = event
        return event

    def result(self) -> list[dict[str, Any]]:
        """Detail events, and a port's report where its function printed none (`no details
        found`, an old kernel): a function's own lines are the better account."""
        told = {(e["bus_id"], e["class"]) for e in self.events}
        out = [dict(e) for e in self.events]
        for key, seen in self.received.items():
            if key not in told:
                out.append(dict(seen, what="reported by its port", vendor=None, device=None,
                                bits=[]))  # fmt: skip
        for event in out:
            event.pop("status", None)
            event["kind"] = VENDORS.get(event["vendor"] or "", "PCIe function")
        return out


def _foreign(rec: dict[str, Any]) -> bool:
    facility = rec.get("facility")
    return isinstance(facility, int) and not isinstance(facility, bool) and facility != 0


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _candidate(msg: str, scan: _Scan) -> bool:
    """Cheap test before any regex: older kernels print the bus-error, device and bit lines
    without the `AER: ` prefix."""
    if "AER" in msg or "DPC" in msg or "PCIe Bus" in msg or "error status" in msg:
        return True
    return bool(scan.last) and "] " in msg


def parse(raw: object) -> Facts:
    """Raw kmsg facts -> {"events": [{"bus_id", "class", "kind", "vendor", "device", "what",
    "bits", "count", "seq"}], "records", "span_s"}: span_s is the time the read covers (first
    to last record's usec; None without times). Pure and total."""
    records = raw.get("records") if isinstance(raw, dict) else None
    scan, count, times = _Scan(), 0, []
    for rec in records if isinstance(records, list) else []:
        seq = _int(rec.get("seq")) if isinstance(rec, dict) else None
        if seq is None:
            continue
        count += 1
        usec = _int(rec.get("usec"))
        if usec is not None:
            times.append(usec)
        msg = rec.get("msg")
        if isinstance(msg, str) and not _foreign(rec) and _candidate(msg, scan):
            scan.line(msg, seq)
    span = (max(times) - min(times)) / 1e6 if times else None
    return {"events": scan.result(), "records": count, "span_s": span}


def gpu_index(event: dict[str, Any], ctx: Context) -> int | None:
    """The NVML index of the GPU whose PCI function sent the error (ctx.gpus), else None."""
    bus = norm_bus_id(event["bus_id"])
    gpus = ctx.gpus if isinstance(ctx.gpus, dict) else {}
    index = next((i for b, i in gpus.items() if isinstance(b, str) and norm_bus_id(b) == bus), None)
    return index if isinstance(index, int) else None


def where(event: dict[str, Any], ctx: Context | None = None) -> str:
    """`NVIDIA GPU 0000:41:00.0 (10de:2330)`, `PCIe function 0000:00:01.1`; a GPU NVML lists
    also by its index, as the GPU checks name it: `GPU 3 (0000:41:00) 0000:41:00.0`."""
    ids = f" ({event['vendor']}:{event['device']})" if event.get("vendor") else ""
    index = gpu_index(event, ctx) if ctx is not None else None
    if index is not None:
        return f"GPU {index} ({norm_bus_id(event['bus_id'])}) {event['bus_id']}{ids}"
    return f"{event['kind']} {event['bus_id']}{ids}"


def _words(event: dict[str, Any], ctx: Context | None = None) -> str:
    bits = f", {'/'.join(event['bits'])}" if event["bits"] else ""
    times = f" x{event['count']}" if event["count"] > 1 else ""
    level = {FATAL: "fatal", NONFATAL: "non-fatal", CORRECTED: "corrected"}[event["class"]]
    return f"PCIe {level} error on {where(event, ctx)}: {event['what']}{bits}{times}"


def uncorrectable(facts: Facts, ctx: Context) -> Result:
    """No uncorrectable PCIe error (AER, DPC) in the new log lines: fatal fails, non-fatal warns.
    Fatal: reboot; non-fatal: the service hint (the module docstring argues both)."""
    if not facts["records"]:
        return ok("no new kernel-log records")
    bad = [e for e in facts["events"] if e["class"] != CORRECTED]
    bad.sort(key=lambda e: (e["class"] != FATAL, e["seq"]))
    data = {"count": len(bad), "events": bad[:EVENTS_MAX]}
    if not bad:
        return ok("no uncorrectable PCIe errors", data)
    message = summarize([_words(e, ctx) for e in bad])
    if bad[0]["class"] == FATAL:
        return fail(message, data, REBOOT)
    return warn(message, data, SERVICE)


def correctable(facts: Facts, ctx: Context) -> Result:
    """Corrected PCIe errors per function in the new kernel-log lines: warn above the rate."""
    if not facts["records"]:
        return ok("no new kernel-log records")
    per: dict[str, dict[str, Any]] = {}
    for event in facts["events"]:
        if event["class"] == CORRECTED:
            kept = per.setdefault(event["bus_id"], dict(event, count=0))
            kept["count"] += event["count"]
            kept["vendor"] = kept["vendor"] or event["vendor"]
    rate = ctx.expect.get("corrected_per_h", DEFAULTS["corrected_per_h"][0])
    hours = max((facts.get("span_s") or 0) / 3600, 1.0)
    over = [e for e in per.values() if rate and e["count"] > rate * hours]
    data = {"count": sum(e["count"] for e in per.values()), "functions": list(per.values()),
            "hours": round(hours, 2)}  # fmt: skip
    if over:
        return warn(summarize([_words(e, ctx) for e in over]) + f" in {hours:.3g} h", data, SERVICE)
    return ok(counted(data["count"], "corrected PCIe error"), data)


CHECKS = (uncorrectable, correctable)

# Judged GPU by GPU in the job hooks (checks/base.py job_verdict): an error a GPU's own PCI
# function sent. One from a port or bridge above it (no GPU of its own) judges the node.
SCOPED = CHECKS


def for_gpus(facts: Facts, ctx: Context, keep: Keep) -> Facts:
    """The facts with only the errors of the GPUs `keep` takes (None: no GPU's function)."""
    return dict(facts, events=[e for e in facts["events"] if keep(gpu_index(e, ctx))])
