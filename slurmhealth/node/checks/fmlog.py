"""Fabric Manager log checks: what the node's Fabric Manager logged since the last health check.

Facts from sources/fmlog.py (the records above INFO of the log's last MiB), health check only
(PHASES). New records only: the baseline keeps the file's inode and size, and a record is new
when it starts at or after that size in the same file. A different inode or a shorter file (a
rotation, or a Fabric Manager restarted with LOG_APPEND_TO_LOG=0) makes every record read new.
The first run with no baseline records it and judges nothing: the log holds the board's past.

Each new record, from the Fabric Manager's own wording (the forms leptonai/gpud matches in
components/accelerator/nvidia/fabric-manager/log_matcher.go, and the GPU NVL block as NVIDIA's
NVLink switch controller prints it):
- fail, reboot: `detected NVSwitch fatal error N on fid F on NVSwitch pci bus id B physical id P
  port Q`, a fatal SXid as the Fabric Manager saw it, and the non-fatal ones driver_faults
  fails whatever the word (always fatal, a stopped SOE, the stalling 11004, 12028, 19084): each
  judged by driver_faults.sxid_class, as the NVSwitch driver's line for the same SXid in the
  kernel log is, with the same action (the Fabric Manager guide: a reset of the GPUs and
  NVSwitches, a reboot on bare metal); this record also reaches a site whose kernel log
  rotated away, and names the switch and port.
- fail, drain: `Fabric Manager detected GPU NVL Fatal error on :` and its `key : value` lines
  (named: moduleId, gpuGuid, portNum, errorCode, errorSubcode).
- ok: the non-fatal SXids the guide says have no impact (driver_faults.NO_IMPACT).
- warn: another non-fatal SXid, a GPU NVL Non Fatal error, `Trunk port failure detected ...`, a
  multicast team setup that lost a GPU (`failed to find the GPU handle ... in the multicast
  team`: a GPU dropped from the NVLink fabric), and any other record at ERROR or CRITICAL
  (named, not judged further: the guide publishes no list).
- ok: WARNING records not named above, counted.
"""

from __future__ import annotations

import re

from slurmhealth.core.constants import CHECK, DIAG, HEALTHCHECK
from slurmhealth.core.result import (
    DRAIN,
    NONE,
    Result,
    clean,
    counted,
    fail,
    ok,
    warn,
    worst_action,
)
from slurmhealth.node.checks.driver_faults import FATAL, IGNORE, NONFATAL, sxid_class

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Context, Facts, Schema

AREA = "fmlog"
SOURCE = "fmlog"
PHASES = (HEALTHCHECK, CHECK, DIAG)

DEFAULTS: Schema = {
    "expected": (
        False,
        bool,
        "the Fabric Manager logs to a file on this node (an NVSwitch board): no log fails it; "
        "genconf writes it where one was read",
    ),
}

_HEAD = re.compile(r"\[(\w{3} +\d+ \d{4} [\d:]{8})\] \[([A-Z]+)\] \[tid \d+\] ?(.*)")
_SXID = re.compile(
    r"detected NVSwitch (fatal|non-fatal) error (\d+)(?: on fid \d+)?"
    r"(?: on NVSwitch pci bus id ([0-9A-Fa-f:.]+))?(?: physical id (\d+))?(?: port (\d+))?"
)
_NVL = re.compile(r"detected (?:stale )?GPU NVL (Fatal|Non Fatal) error", re.IGNORECASE)
_TRUNK = re.compile(r"Trunk port failure detected for switch GUID (0x[0-9A-Fa-f]+)"
                    r".*?port number (\d+)")
_MULTICAST = re.compile(r"failed to find the GPU handle \d+ in the multicast team")
_FIELD = re.compile(r"\s*(\w+)\s*:\s*(\S+)")
_NVL_FIELDS = ("moduleId", "gpuGuid", "portNum", "errorCode", "errorSubcode")
_LOUD = ("ERROR", "CRITICAL", "FATAL")
_TEXT_MAX = 140
_RANK = {"ok": 0, "warn": 1, "fail": 2}


# ---------------------------------------------------------------- parse (pure, never raises)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _judged(record: dict[str, Any]) -> dict[str, Any] | None:
    """One record -> {"offset", "time", "level", "status", "action", "what"}; None where its
    first line is no record head."""
    line = record.get("line")
    head = _HEAD.match(line) if isinstance(line, str) else None
    offset = _int(record.get("offset"))
    if head is None or offset is None:
        return None
    when, level, text = head.group(1), head.group(2), head.group(3)
    more = [m for m in record.get("more") or [] if isinstance(m, str)]
    status, action, what = "ok", NONE, ""
    sxid, nvl, trunk = _SXID.search(text), _NVL.search(text), _TRUNK.search(text)
    if sxid:  # judged as the kernel's line for it is (driver_faults.sxid_class)
        fatal = sxid.group(1) == "fatal"
        event = {"sxid": int(sxid.group(2)), "severity": FATAL if fatal else NONFATAL}
        status, action = sxid_class(event)
        status = "ok" if status == IGNORE else status
        what = f"{'fatal' if fatal else 'non-fatal'} SXid {sxid.group(2)}"
        for label, value in zip((" on NVSwitch", " physical id", " port"), sxid.groups()[2:]):
            what += f"{label} {value}" if value else ""
    elif nvl:
        fatal = nvl.group(1).lower() == "fatal"
        fields = {f.group(1): f.group(2) for f in map(_FIELD.match, more) if f}
        named = ", ".join(f"{k} {fields[k]}" for k in _NVL_FIELDS if k in fields)
        status, action = ("fail", DRAIN) if fatal else ("warn", NONE)
        what = f"GPU NVL {'fatal' if fatal else 'non-fatal'} error"
        what += f" ({named})" if named else ""
    elif trunk:
        status, what = "warn", f"trunk port failure, switch {trunk.group(1)} port {trunk.group(2)}"
    elif _MULTICAST.search(text):
        status, what = "warn", "a GPU missing from a multicast team (NVLink fabric)"
    elif level in _LOUD:
        status, what = "warn", f"{level}: {text}"
    return {"offset": offset, "time": when, "level": level, "status": status,
            "action": action, "what": clean(what, _TEXT_MAX)}


def parse(raw: object) -> Facts:
    """The source's raw facts -> {"path", "inode", "size", "start", "records": [judged]}."""
    r = raw if isinstance(raw, dict) else {}
    listed = r.get("records")
    found = [_judged(x) for x in listed if isinstance(x, dict)] if isinstance(listed, list) else []
    path = r.get("path")
    return {
        "path": clean(path, 200) if isinstance(path, str) else "",
        "inode": _int(r.get("inode")),
        "size": _int(r.get("size")) or 0,
        "start": _int(r.get("start")) or 0,
        "records": [x for x in found if x is not None],
    }


def new_records(facts: Facts, before: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The records written since the baseline, and why all of them count ("" when only the
    ones past the saved size: "rotated" for another file or a shorter one)."""
    inode, size = before.get("inode"), before.get("size")
    if inode != facts["inode"] or not isinstance(size, int) or size > facts["size"]:
        return list(facts["records"]), "rotated"
    return [x for x in facts["records"] if x["offset"] >= size], ""


# ---------------------------------------------------------------- checks


def events(facts: Facts, ctx: Context) -> Result:
    """New Fabric Manager log records: a fatal SXid or GPU NVL error, a trunk port failure."""
    before = ctx.baseline if isinstance(ctx.baseline, dict) else {}
    if "size" not in before:
        loud = sum(1 for x in facts["records"] if x["status"] != "ok")
        said = f", {loud} of them warn or fail (not judged)" if loud else ""
        return ok(f"baseline recorded: {counted(len(facts['records']), 'record')} above INFO in "
                  f"{facts['path'] or 'the log'}{said}")
    fresh, why = new_records(facts, before)
    skipped = not why and before["size"] < facts["start"]  # why "": the size is an int
    worst = max((x["status"] for x in fresh), key=_RANK.__getitem__, default="ok")
    named = [f"{x['what']} ({x['time']})" for x in fresh if x["status"] == worst != "ok"]
    data = {"new": len(fresh), "rotated": bool(why), "entries": named[:10],
            "unread_bytes": facts["start"] - before["size"] if skipped else 0}
    if named:
        more = f" (+{len(named) - 1} more)" if len(named) > 1 else ""
        text = f"Fabric Manager: {named[0]}{more}"
        if worst == "fail":
            failed = [x["action"] for x in fresh if x["status"] == "fail"]
            return fail(text, data, worst_action(failed))
        return warn(text, data)
    since = " since the log was rotated" if why else ""
    gap = f"; {data['unread_bytes']} bytes past the last run not read" if skipped else ""
    return ok(f"{counted(len(fresh), 'new record')} above INFO{since}, none severe{gap}", data)


CHECKS = (events,)


# ---------------------------------------------------------------- memory and genconf


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """The file and how far it was read, from which the next run reads new records."""
    return {"inode": facts["inode"], "size": facts["size"], "taken_at": now}


def expectations(facts: Facts) -> dict[str, Any]:
    """A node whose Fabric Manager log was read keeps expecting one."""
    return {"expected": True}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The log is expected where the config says so (fmlog.expected)."""
    return bool(expect.get("expected"))
