"""Snapshots: load one, check its shape, replay its sources (docs/snapshot-format.md).

A snapshot is a file an admin replays: one a node wrote while failing, or one edited by hand. A
wrong type anywhere the checks read, deep nesting or a number that is not finite would otherwise
replay as "no GPUs" or "no Xids" and pass: every such file is refused with one line that names
the first bad path. The shape below is what the sources write (sources/nvml.py, sysfs.py,
kmsg.py, kernel.py, fs.py, host.py, nvme.py, bmc.py, imex.py, fmlog.py, site.py); keys it does
not name are left alone, so a newer snapshot with more facts still loads.
"""

from __future__ import annotations

import json
import math
import os
import stat

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

FORMAT = "slurmhealth-snapshot/1"
MAX_DEPTH = 64  # the deepest real snapshot path is 7 levels; JSON nesting past this is refused


class Shape:
    """What one value may be: `kinds` among "int", "num", "str", "bool", "null", "any", or a
    dict/list/map shape: `keys` {key: Shape} for an object, `item` for a list, `values` for a
    map (an object with free keys)."""

    __slots__ = ("item", "keys", "kinds", "values")

    def __init__(self, *kinds: str, keys: dict[str, Shape] | None = None, item: Shape | None = None,
                 values: Shape | None = None) -> None:
        self.kinds, self.keys, self.item, self.values = kinds, keys, item, values


def _s(*kinds: str) -> Shape:
    return Shape(*kinds)


def _obj(keys: dict[str, Shape], *kinds: str) -> Shape:
    return Shape("obj", *kinds, keys=keys)


def _list(item: Shape, *kinds: str) -> Shape:
    return Shape("list", *kinds, item=item)


def _map(values: Shape, *kinds: str) -> Shape:
    return Shape("map", *kinds, values=values)


INT, NUM, STR, BOOL = _s("int", "null"), _s("num", "null"), _s("str", "null"), _s("bool", "null")
SOURCE = _obj({"status": _s("str"), "message": STR, "seconds": NUM, "versions": _map(STR, "null")})
LINK = _obj({"link": INT, "active": BOOL, "crc": INT, "recovery": INT, "replay": INT})
DEVICE = _obj(
    {
        "index": _s("int"),
        "error": STR,
        "errors": _map(_s("str")),
        "fields": _map(NUM, "null"),
        "nvlink": _list(LINK, "null"),
        "fabric": _obj(
            {"state": INT, "status": INT, "clique_id": INT, "cluster_uuid": STR,
             "health_mask": INT, "health_summary": INT},
            "null",
        ),
        "processes": _list(_obj({"pid": INT, "used_memory": INT}), "null"),
        "bus_id": STR,
        "uuid": STR,
        "name": STR,
        "serial": STR,
        "vbios": STR,
        "arch": INT,
        "persistence": INT,
        "temperature": NUM,
        "temp_slowdown": NUM,
        "clock_event_reasons": INT,
        "pcie_max_gen": INT,
        "pcie_max_width": INT,
        "pcie_gen": INT,
        "pcie_width": INT,
        "memory_total": INT,
        "mig_current": INT,
        "mig_pending": INT,
        "mig_devices": _list(_obj({"index": INT, "uuid": STR, "gi": INT, "ci": INT}), "null"),
        "app_clock_sm": INT,
        "app_clock_mem": INT,
    }
)
GPU = _obj(
    {
        "count": INT,
        "driver_version": STR,
        "devices": _list(DEVICE),
        "timing_ms": _map(NUM, "null"),
        "pci_gpus": _list(_s("str"), "null"),
    },
    "null",
)
PORT = _obj(
    {
        "state": STR,
        "phys_state": STR,
        "rate": STR,
        "link_layer": STR,
        "counters": _map(STR, "null"),
    }
)
IB = _obj(
    {
        "devices": _map(
            _obj({"ports": _map(PORT), "fw_ver": STR, "hca_type": STR, "board_id": STR,
                  "node_guid": STR, "current_link_speed": STR, "current_link_width": STR,
                  "max_link_speed": STR, "max_link_width": STR})
        ),
        "errors": _map(_s("str"), "null"),
    },
    "null",
)
RECORD = _obj({"seq": _s("int"), "msg": _s("str"), "pri": INT, "usec": INT})
KMSG = _obj(
    {
        "records": _list(RECORD),
        "path": STR,
        "boot_id": STR,
        "first_seq": INT,
        "after_seq": INT,
        "lost": BOOL,
        "missed": INT,
    },
    "null",
)
LINK_FILES = {k: STR for k in ("operstate", "carrier", "carrier_changes", "type", "mtu", "speed")}
COUNTS = {k: STR for k in ("ce_count", "ue_count", "ce_noinfo_count", "ue_noinfo_count")}
KERNEL = _obj(
    {
        "boot_id": STR,
        "processes": _obj({"scope": STR, "names": _map(_s("int"))}, "null"),
        "modules": _map(_s("str"), "null"),
        "net": _map(_obj({**LINK_FILES, "device": BOOL})),
        "edac": _map(_obj({**COUNTS, "dimms": _map(_obj({"ce_count": STR, "ue_count": STR,
                                                          "label": STR}))}), "null"),
        "errors": _map(_s("str"), "null"),
    },
    "null",
)
NVME = _obj(
    {
        "controllers": _map(
            _obj({"state": STR, "model": STR, "serial": STR, "firmware_rev": STR,
                  "hwmon": _map(STR, "null"), "smart": _map(_s("any"), "null"),
                  "smart_error": STR})
        ),
        "tool": STR,
        "errors": _map(_s("str"), "null"),
    },
    "null",
)
STAT = _obj(
    {
        **{k: INT for k in ("frsize", "blocks", "bfree", "bavail", "files", "ffree", "flag")},
        "hung": NUM,
        "error": STR,
    }
)
FILE = _obj(
    {
        **{k: INT for k in ("lmode", "mode", "size")},
        "access": _obj({k: BOOL for k in "rwx"}),
        "hung": NUM,
        "error": STR,
    }
)
FS = _obj(
    {"mountinfo": _list(_s("str")), "stats": _map(STAT), "files": _map(FILE),
     "errors": _map(_s("str"), "null")},
    "null",
)
CPU = _obj(
    {
        **{k: STR for k in ("online", "present", "possible", "smt", "threads")},
        "packages": _map(STR),
    },
    "null",
)
CLOCK = _obj(
    {
        **{k: INT for k in ("state", "status", "maxerror", "esterror", "offset")},
        "skipped": STR,
        "error": STR,
    },
    "null",
)
HOST = _obj(
    {"meminfo": _map(_s("str")), "cpu": CPU, "clock": CLOCK, "errors": _map(_s("str"), "null")},
    "null",
)
BMC = _obj({"tool": STR, "device": STR, "lines": _list(_s("str"))}, "null")
RAN = _obj({"status": INT, "timed_out": BOOL, "error": STR, "lines": _list(_s("str")),
            "stderr": STR})
IMEX = _obj({"tool": STR, "query": RAN, "domain": RAN}, "null")
FMLOG = _obj(
    {"path": STR, "inode": INT, "size": INT, "start": INT,
     "records": _list(_obj({"offset": INT, "line": STR, "more": _list(_s("str"))}))},
    "null",
)
SITE = _obj(
    {"program": STR, "status": INT, "timed_out": BOOL, "error": STR,
     "lines": _list(_s("str")), "seconds": NUM},
    "null",
)
SNAPSHOT = _obj(
    {
        "format": _s("str"),
        "node": STR,
        "taken_at": STR,
        "tool_version": STR,
        "sources": _map(SOURCE, "null"),
        "gpu": GPU,
        "ib": IB,
        "kmsg": KMSG,
        "kernel": KERNEL,
        "fs": FS,
        "host": HOST,
        "nvme": NVME,
        "bmc": BMC,
        "imex": IMEX,
        "fmlog": FMLOG,
        "site": SITE,
    }
)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "num" if math.isfinite(value) else "not finite"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "obj" if isinstance(value, dict) else type(value).__name__


def problem(value: object, shape: Shape, path: str = "", depth: int = 0) -> str:
    """Where `value` first departs from `shape` ("gpu.devices.0.fields.ecc_current: a list,
    not a number"), or "" when it fits."""
    if depth > MAX_DEPTH:
        return f"{path or 'the document'}: nested deeper than {MAX_DEPTH} levels"
    kind = _kind(value)
    allowed = set(shape.kinds)
    fits = kind in allowed or "any" in allowed or (kind == "int" and "num" in allowed)
    if kind == "obj" and "map" in allowed:
        fits = True
    if not fits:
        want = " or ".join(_WORDS.get(k, k) for k in shape.kinds if k != "null")
        return f"{path or 'the document'}: {_WORDS.get(kind, kind)}, not {want}"
    # isinstance here says what `kind` already said ("obj", "list"), to the type checker too
    if isinstance(value, dict) and shape.keys is not None:
        for key, inner in shape.keys.items():
            if key in value:
                found = problem(value[key], inner, _join(path, key), depth + 1)
                if found:
                    return found
    elif isinstance(value, dict) and shape.values is not None:
        for key, item in value.items():
            found = problem(item, shape.values, _join(path, key), depth + 1)
            if found:
                return found
    elif isinstance(value, list) and shape.item is not None:
        for i, item in enumerate(value):
            found = problem(item, shape.item, _join(path, str(i)), depth + 1)
            if found:
                return found
    return ""


_WORDS = {
    "int": "an integer",
    "num": "a number",
    "str": "text",
    "bool": "true/false",
    "null": "null",
    "list": "a list",
    "obj": "an object",
    "map": "an object",
}


def _join(path: str, key: str) -> str:
    text = str(key)[:40]
    return f"{path}.{text}" if path else text


READ_MAX = 64 << 20  # bytes: an 8-GPU node's snapshot is ~100 KiB


def _read(path: str) -> str:
    """The file's text: a regular file (a FIFO would block, /dev/zero never end), at most
    READ_MAX bytes; ValueError saying why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read snapshot: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a snapshot: not a regular file")
        try:
            data = handle.read(READ_MAX + 1)
        except OSError as exc:
            raise ValueError(f"{path}: cannot read snapshot: {exc.strerror}") from None
    if len(data) > READ_MAX:
        raise ValueError(f"{path}: not a snapshot: over {READ_MAX >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a JSON snapshot: {exc.reason}") from None


def load(path: str) -> dict[str, Any]:
    """A snapshot document; ValueError with a one-line reason when it is not one."""
    text = _read(path)
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"{path}: not a snapshot: nested too deep") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a JSON snapshot: {exc.reason}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not a JSON snapshot: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a slurmhealth snapshot (format {FORMAT})")
    found = problem(doc, SNAPSHOT)
    if found:
        raise ValueError(f"{path}: not a usable snapshot: {found}")
    return doc


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number a snapshot may hold")
