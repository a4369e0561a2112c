"""`slurmhealth rma NODE`: one archive with what a vendor's RMA ticket for one node needs.

Members, in this order, in one folder `slurmhealth-rma-NODE-TIME/` (docs/rma.md):
  manifest.json            the node, when, the period, the tool's version, the store read;
                           each member and what it holds, each one left out and why
  history.ndjson           the node's runs that did not pass (diagnoses aside), each with its
                           results, and its actions (drains, resumes, resets), oldest first
  xids.ndjson              its Xid events, each with its kernel-log line
  counters.ndjson          its error-counter (and gauge) readings that changed
  diagnoses.ndjson         its `diagnose` runs: every probe's outcome and figures
  versions.json            the versions its runs recorded, per source, as they changed; each
                           device (GPU, HCA, NVMe: serial, UUID, VBIOS or firmware) from the
                           snapshot, else from the node store's last reading
  snapshot.json            on the node itself: a snapshot taken now (docs/snapshot-format.md)
  recorded-facts.json      elsewhere: what the store keeps instead (the newest run; a node
                           store's baselines)
  nvidia-bug-report.log.gz on the node itself, where nvidia-bug-report.sh is on PATH

Only this node's records: every read names it. Every stored string is untrusted (kernel-log
lines, reasons, imported exports): it goes into JSON only, never into a member's name; the
node's name is checked (is_node_name) before it names the folder or the file.

The archive is written private (0600 from its first byte, never through a symlink: files.
open_private) and whole (a temporary file renamed). Its members come in a fixed order, each
0600 (the folder 0700) of uid 0, dated with the bundle's time, as is the gzip header (which
names no file): the same store and --now give the same bytes, and no path of the machine that
made it is inside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import os
import sqlite3
import stat
import tarfile
import time
from collections.abc import Iterator
from typing import Any

from slurmhealth import __version__
from slurmhealth.core import command, files, store, timespec
from slurmhealth.core.command import CommandError, Console
from slurmhealth.core.constants import DIAG
from slurmhealth.core.result import clean
from slurmhealth.fleet import pgstore, text
from slurmhealth.node import agent, bugreport, runner, sources

FORMAT = "slurmhealth-rma/1"
EXIT_INCOMPLETE = 4  # written, but what was to be taken on the node did not all come
BUG_REPORT = "nvidia-bug-report.log.gz"


@dataclasses.dataclass(frozen=True)
class Request:
    """One `slurmhealth rma`: the node, -o (None: a name of its own here), --since and --now
    as given, --db, whether to run nvidia-bug-report.sh and for how long at most, and where a
    snapshot's facts come from (the source options; `replayed`: any was given)."""

    node: str
    output: str | None
    since: str
    now: str | None = None
    db: str | None = None
    bug_report: bool = True
    timeout: float = bugreport.TIMEOUT_S
    options: sources.Options = dataclasses.field(default_factory=sources.Options)
    replayed: bool = False


def run(request: Request, console: Console) -> int:
    """Write the bundle: 0, or EXIT_INCOMPLETE when a part taken on the node did not all come
    (said on standard error); CommandError with one line when nothing was written."""
    end = command.instant(request.now)
    start = command.start(request.since, end)
    node = request.node
    here = this_node(node)
    path, which = store_for(request.db, node, here)
    folder = f"slurmhealth-rma-{node}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(end))}"
    output = request.output or f"{folder}.tar.gz"
    refuse_output(output)
    found = read(pgstore.open_store(path, "rma"), path, node, start, end, recorded=not here)
    bundle = Bundle(node, start, end, which, here)
    bundle.add_records(found)
    if here:
        bundle.add_snapshot(_snapshot(node, request.options), request.replayed)
    with _bug_report(request, here) as report:
        bundle.add_bug_report(report)
        write(output, folder, end, bundle.members(), report.path)
    for line in text.rma(output, bundle.manifest):
        console.out(line)
    for line in bundle.failures:
        console.err(f"slurmhealth rma: {line}")
    return EXIT_INCOMPLETE if bundle.failures else 0


def this_node(node: str) -> bool:
    """Whether `node` is the node this runs on (agent.node_name: $SLURMD_NODENAME, else the
    short host name)."""
    try:
        return agent.node_name() == node
    except agent.UsageError:  # a host name that is no node name: no node of ours
        return False


def store_for(db: str | None, node: str, here: bool) -> tuple[str, str]:
    """(path, which) of the store to read: --db ("named"), else $SLURMHEALTH_FLEET_DB
    ("fleet"), else on the node itself its own store ("node"), else the fleet store."""
    if db:
        return db, "named"
    if os.environ.get("SLURMHEALTH_FLEET_DB") or not here:
        return store.fleet_path(), "fleet"
    return store.default_path(node), "node"


def refuse_output(output: str) -> None:
    """CommandError before any work when -o cannot be written: a symlink or anything but a
    regular file there (never followed or replaced), no such directory, or not writable.
    files.open_private checks again when it writes."""
    said = clean(output, 300)
    try:
        st = os.lstat(output)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise CommandError(f"{said}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise CommandError(f"{said}: a symlink: not replaced")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise CommandError(f"{said}: not a regular file: not replaced")
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise CommandError(f"{said}: no such directory")
    if not os.access(folder, os.W_OK):
        raise CommandError(f"{said}: its directory is not writable (permission denied)")


# --- the store's records of the node --------------------------------------------------------

_RUN = "id, job_id, phase, started, duration, verdict, tool_version, sources"
_RUN_KEYS = ("id", "job", "phase", "started", "duration", "verdict", "tool_version", "sources")
_RUNS_OF = (
    f"SELECT {_RUN} FROM runs "  # noqa: S608 - fixed columns; every value a parameter
    "WHERE node = ? AND started >= ? AND started <= ? AND "
)
_NOT_PASSED = _RUNS_OF + "verdict != 'ok' AND phase != ? ORDER BY started, id"
_DIAGNOSES = _RUNS_OF + "phase = ? ORDER BY started, id"
_RESULTS = (
    "SELECT r.check_name, r.status, r.message, r.action, r.data, r.duration "
    "FROM results r JOIN runs u ON u.id = r.run_id "
    "WHERE r.run_id = ? AND u.node = ? ORDER BY r.check_name"
)
_RESULT_KEYS = ("check", "status", "message", "action", "data", "duration")
_ACTIONS = (
    "SELECT id, time, action, reason, actor, ok, detail FROM actions "
    "WHERE node = ? AND time >= ? AND time <= ? ORDER BY time, id"
)
_ACTION_KEYS = ("id", "time", "action", "reason", "actor", "ok", "detail")
_EVENTS = (
    "SELECT id, run_id, job_id, time, kind, code, gpu, bus_id, pid, process, class, action, "
    "text, repeats FROM events WHERE node = ? AND time >= ? AND time <= ? ORDER BY time, id"
)
_EVENT_KEYS = (
    "id", "run_id", "job", "time", "kind", "code", "gpu", "bus_id", "pid", "process", "class",
    "action", "text", "repeats",
)  # fmt: skip
_COUNTERS = (
    "SELECT device, counter, label, time, value, delta, run_id FROM counters "
    "WHERE node = ? AND time >= ? AND time <= ? ORDER BY time, device, counter"
)
_COUNTER_KEYS = ("device", "counter", "label", "time", "value", "delta", "run_id")
_VERSIONS = (
    "SELECT started, sources FROM runs WHERE node = ? AND started >= ? AND started <= ? "
    "AND instr(sources, '\"versions\"') ORDER BY started, id"
)
_NEWEST = (
    f"SELECT {_RUN} FROM runs WHERE node = ? AND started <= ? "  # noqa: S608 - fixed columns
    "ORDER BY started DESC, id DESC LIMIT 1"
)
_BASELINES = (
    "SELECT area, updated, data FROM baselines WHERE node = ? AND job_id = '' ORDER BY area"
)
_KNOWN = (
    "SELECT EXISTS (SELECT 1 FROM runs WHERE node = ?) OR EXISTS "
    "(SELECT 1 FROM actions WHERE node = ?) OR EXISTS (SELECT 1 FROM events WHERE node = ?)"
)


def read(
    conn: sqlite3.Connection, path: str, node: str, start: float, end: float, recorded: bool
) -> dict[str, Any]:
    """The node's records in [start, end]: {runs, actions, events, counters, diagnoses,
    versions (the versions its runs recorded, per source, as they changed), baselines (the
    node store's, none in a fleet store), newest (its newest run, with `recorded`)}.
    CommandError with one line when the store has no record of the node or cannot be read."""
    window = (node, start, end)
    try:
        if not conn.execute(_KNOWN, (node, node, node)).fetchone()[0]:
            raise CommandError(f"no records of node {node} in {clean(path, 300)}")
        found = {
            "runs": [_run(conn, node, row) for row in conn.execute(_NOT_PASSED, (*window, DIAG))],
            "actions": _rows(conn, _ACTIONS, window, _ACTION_KEYS),
            "events": _rows(conn, _EVENTS, window, _EVENT_KEYS),
            "counters": _rows(conn, _COUNTERS, window, _COUNTER_KEYS),
            "diagnoses": [_run(conn, node, r) for r in conn.execute(_DIAGNOSES, (*window, DIAG))],
            "versions": versions(conn.execute(_VERSIONS, window)),
            "baselines": {
                area: {"updated": updated, "at": text.when(updated), "data": _parsed(data)}
                for area, updated, data in conn.execute(_BASELINES, (node,))
            },
            "newest": None,
        }
        if recorded:
            newest = conn.execute(_NEWEST, (node, end)).fetchone()
            found["newest"] = _run(conn, node, newest) if newest else None
    except sqlite3.Error as exc:
        raise CommandError(f"{clean(path, 300)}: {clean(exc)}") from None
    return found


def _rows(conn: sqlite3.Connection, sql: str, args: tuple, keys: tuple) -> list[dict[str, Any]]:
    out = []
    for row in conn.execute(sql, args):
        record = dict(zip(keys, row))
        record["at"] = text.when(record["time"])
        out.append(record)
    return out


def _run(conn: sqlite3.Connection, node: str, row: tuple) -> dict[str, Any]:
    """A run as the bundle holds it, with its results (each result's data as JSON)."""
    run = dict(zip(_RUN_KEYS, row))
    run["at"] = text.when(run["started"])
    run["sources"] = _parsed(run["sources"])
    run["results"] = [
        {**dict(zip(_RESULT_KEYS, r)), "data": _parsed(r[4])}
        for r in conn.execute(_RESULTS, (run["id"], node))
    ]
    return run


def _parsed(value: object) -> object:
    """A stored JSON text as what it holds; the text as it is when it is no JSON (or too
    deep to write back)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
        json.dumps(parsed)
    except (ValueError, RecursionError):
        return value
    return parsed


def versions(rows: Iterator[tuple]) -> dict[str, list[dict[str, Any]]]:
    """{source: [{from, to, runs, versions}]} from (started, sources JSON) rows oldest first:
    each source's recorded versions (runner: the areas' versions_of) as they changed, a new
    span where they differ from the span before. Each source on its own: a run whose GPU
    source did not answer records the others' versions only."""
    out: dict[str, list[dict[str, Any]]] = {}
    for started, sources_text in rows:
        recorded = _parsed(sources_text)
        if not isinstance(recorded, dict):
            continue
        for name, state in recorded.items():
            found = state.get("versions") if isinstance(state, dict) else None
            if not found:
                continue
            spans = out.setdefault(str(name), [])
            if spans and spans[-1]["versions"] == found:
                spans[-1]["to"] = text.when(started)
                spans[-1]["runs"] += 1
            else:
                at = text.when(started)
                spans.append({"from": at, "to": at, "runs": 1, "versions": found})
    return {name: out[name] for name in sorted(out)}


# --- the devices: from a snapshot, else the node store's last reading -----------------------

_GPU_KEYS = ("index", "name", "serial", "uuid", "bus_id", "vbios", "memory_total", "arch")
_HCA_KEYS = ("hca_type", "board_id", "fw_ver", "node_guid")
_NVME_KEYS = ("model", "serial", "firmware_rev")


def devices_of(doc: dict[str, Any]) -> dict[str, Any]:
    """Each device a snapshot saw, by its identity and firmware: {driver, cuda, gpus: [{index,
    name, serial, uuid, bus_id, vbios, memory_total, arch}], hcas: [{device, hca_type,
    board_id, fw_ver, node_guid}], nvme: [{controller, model, serial, firmware_rev}]}."""
    gpu = _section(doc, "gpu")
    ib = _section(_section(doc, "ib"), "devices")
    nvme = _section(_section(doc, "nvme"), "controllers")
    return {
        "driver": gpu.get("driver_version"),
        "cuda": gpu.get("cuda_driver_version"),
        "gpus": [
            {k: d.get(k) for k in _GPU_KEYS}
            for d in gpu.get("devices") or ()
            if isinstance(d, dict)
        ],
        "hcas": [
            {"device": name, **{k: _section(ib, name).get(k) for k in _HCA_KEYS}}
            for name in sorted(ib)
        ],
        "nvme": [
            {"controller": n, **{k: _stripped(_section(nvme, n).get(k)) for k in _NVME_KEYS}}
            for n in sorted(nvme)
        ],
    }


def devices_recorded(baselines: dict[str, Any]) -> dict[str, Any] | None:
    """The GPUs a node store's last run saw ({gpus: [{index, serial, uuid, bus_id}]}: the gpu
    area's baseline inventory), or None where the store keeps none (a fleet store)."""
    gpu = baselines.get("gpu")
    inventory = _section(_section(gpu, "data"), "inventory") if gpu else {}
    if not inventory:
        return None
    ordered = sorted(inventory, key=_by_index)
    return {"gpus": [{"index": _index(i), **_section(inventory, i)} for i in ordered]}


def _index(key: str) -> object:
    return int(key) if key.isdigit() else key


def _by_index(key: str) -> tuple:
    """GPU 2 before GPU 10; a key that is no number (a forged store) after them."""
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def _section(doc: object, key: str) -> dict[str, Any]:
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, dict) else {}


def _stripped(value: object) -> object:
    """sysfs's NVMe identity strings are space-padded."""
    return value.strip() if isinstance(value, str) else value


# --- the parts taken on the node itself -----------------------------------------------------


def _snapshot(node: str, options: sources.Options) -> tuple[dict[str, Any], list]:
    """(snapshot document, sources it could not read); CommandError when a source's options
    refuse (a --gpu-source that is no snapshot)."""
    try:
        return runner.default_snapshot(node, options)
    except (OSError, ValueError) as exc:
        raise CommandError(clean(exc, 300)) from None


@contextlib.contextmanager
def _bug_report(request: Request, here: bool) -> Iterator[bugreport.Report]:
    """nvidia-bug-report.sh's output while the block runs, or why there is none."""
    tool = bugreport.find() if here and request.bug_report else None
    refused = bugreport.refused(tool) if tool else None
    if not here:
        said = f"{bugreport.TOOL} is run only on {request.node} itself"
        yield bugreport.Report(None, said, failed=False)
    elif not request.bug_report:
        yield bugreport.Report(None, "not asked for (--no-bug-report)", failed=False)
    elif tool is None:
        yield bugreport.Report(None, f"{bugreport.TOOL} is not on PATH", failed=False)
    elif refused:
        said = f"{bugreport.TOOL} not run: {clean(refused, 200)}"
        yield bugreport.Report(None, said, failed=True)
    else:
        with bugreport.collected(tool, request.timeout) as report:
            yield report


# --- the bundle ------------------------------------------------------------------------------


class Bundle:
    """The members of one node's bundle as they are added, and its manifest: what each holds,
    what was left out and why, and `failures` (lines: what was taken on the node and did not
    all come)."""

    def __init__(self, node: str, start: float, end: float, which: str, here: bool) -> None:
        self.files: dict[str, bytes] = {}
        self.failures: list[str] = []
        self.manifest: dict[str, Any] = {
            "format": FORMAT,
            "node": node,
            "created": timespec.iso(end),
            "period": {"since": timespec.iso(start), "until": timespec.iso(end)},
            "tool_version": __version__,
            "store": which,
            "on_node": here,
            "counts": {},
            "members": [],
            "missing": [],
        }
        self.snapshot: dict[str, Any] | None = None
        self.found: dict[str, Any] = {}

    def _add(self, name: str, what: str, data: bytes, **more: object) -> None:
        self.files[name] = data
        self.manifest["members"].append({"name": name, "what": what, **more})

    def _missing(self, name: str, why: str) -> None:
        self.manifest["missing"].append({"name": name, "why": why})

    def add_records(self, found: dict[str, Any]) -> None:
        self.found = found
        history = sorted(
            [{"kind": "run", **r} for r in found["runs"]]
            + [{"kind": "action", **a} for a in found["actions"]],
            key=lambda r: (_order(r.get("started", r.get("time"))), str(r["id"])),
        )
        self.manifest["counts"] = {
            "runs_not_passed": len(found["runs"]),
            "actions": len(found["actions"]),
            "xid_events": len(found["events"]),
            "counter_readings": len(found["counters"]),
            "diagnoses": len(found["diagnoses"]),
        }
        for name, what, records in (
            ("history.ndjson", "runs that did not pass, with their results, and actions", history),
            ("xids.ndjson", "Xid events with their kernel-log lines", found["events"]),
            ("counters.ndjson", "counter and gauge readings that changed", found["counters"]),
            ("diagnoses.ndjson", "diagnose runs: each probe's outcomes", found["diagnoses"]),
        ):
            self._add(name, what, _ndjson(records), records=len(records))
        if found["newest"] is not None:
            recorded = {"newest_run": found["newest"], "baselines": found["baselines"]}
            what = "the node's facts the store keeps: its newest run, a node store's baselines"
            self._add("recorded-facts.json", what, _json(recorded))

    def add_snapshot(self, taken: tuple[dict[str, Any], list], replayed: bool) -> None:
        doc, unread = taken
        self.snapshot = doc
        how = "from the sources given" if replayed else "live"
        said = [{"source": u["source"], "message": clean(u["message"], 300)} for u in unread]
        what = f"a snapshot taken on the node, {how} (docs/snapshot-format.md)"
        self._add("snapshot.json", what, _json(doc), unread=said)
        for u in said:
            self.failures.append(f"snapshot.json lacks {u['source']}: {u['message']}")

    def add_bug_report(self, report: bugreport.Report) -> None:
        if report.path is None:
            self._missing(BUG_REPORT, report.note)
        else:
            what = "nvidia-bug-report.sh's log" + (f" ({report.note})" if report.note else "")
            entry = {"name": BUG_REPORT, "what": what, "partial": report.partial}
            self.manifest["members"].append(entry)
        if report.failed:
            self.failures.append(f"nvidia-bug-report.sh: {report.note}")

    def members(self) -> list[tuple[str, bytes]]:
        """(name, bytes) of every member but the tool's log, the manifest first: the last
        step (it adds versions.json and completes the manifest)."""
        if self.snapshot is None:
            node = self.manifest["node"]
            why = f"no snapshot: one is taken only on {node} itself"
            if "recorded-facts.json" in self.files:
                why += "; recorded-facts.json holds what the store keeps"
            self._missing("snapshot.json", why)
        what = "the versions recorded, per source as they changed; each device's identity"
        self._add("versions.json", what, _json(self._versions()))
        rank = {name: n for n, name in enumerate((*ORDER, BUG_REPORT))}
        for key in ("members", "missing"):
            self.manifest[key].sort(key=lambda m: rank[m["name"]])
        present = [(name, self.files[name]) for name in ORDER if name in self.files]
        return [("manifest.json", _json(self.manifest)), *present]

    def _versions(self) -> dict[str, Any]:
        baselines = self.found.get("baselines") or {}
        devices: dict[str, Any] | None
        source: str | None
        if self.snapshot is not None:
            devices, source = devices_of(self.snapshot), "the snapshot taken now"
        else:
            devices = devices_recorded(baselines)
            read_at = (baselines.get("gpu") or {}).get("at")
            source = f"the node store's last reading, {read_at}" if devices else None
        recorded = self.found.get("versions") or {}
        return {"recorded": recorded, "devices": devices, "devices_from": source}


# The members after the manifest, in the archive's order (the tool's log last).
ORDER = (
    "snapshot.json",
    "versions.json",
    "history.ndjson",
    "xids.ndjson",
    "counters.ndjson",
    "diagnoses.ndjson",
    "recorded-facts.json",
)


def _order(value: object) -> float:
    """A sort key for a stored time: a forged store's records may hold any type."""
    return float(value) if isinstance(value, (int, float)) else float("-inf")


def _json(doc: object) -> bytes:
    """A JSON document: every string escaped (ensure_ascii: no control character, no byte a
    terminal acts on), keys sorted."""
    dumped = json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True, default=str)
    return (dumped + "\n").encode()


def _ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"".join(
        json.dumps(r, sort_keys=True, ensure_ascii=True, default=str).encode() + b"\n"
        for r in records
    )


# --- the archive ------------------------------------------------------------------------------


def write(
    output: str, folder: str, created: float, members: list[tuple[str, bytes]], log: str | None
) -> None:
    """The archive at `output`: `folder`/ (0700), each member 0600 in it, `log` (the tool's
    gzip output, a path) last as BUG_REPORT; private from the first byte and whole.
    CommandError with one line when it cannot be written."""
    try:
        with files.open_private(output, 0o600, binary=True) as handle:
            with gzip.GzipFile("", "wb", 6, handle, int(created)) as packed:
                with tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    tar.addfile(_entry(folder, created, 0, directory=True))
                    for name, data in members:
                        entry = _entry(f"{folder}/{name}", created, len(data))
                        tar.addfile(entry, io.BytesIO(data))
                    if log is not None:
                        with bugreport.open_log(log) as source:
                            size = os.fstat(source.fileno()).st_size
                            tar.addfile(_entry(f"{folder}/{BUG_REPORT}", created, size), source)
    except OSError as exc:
        raise CommandError(f"{clean(output, 300)}: {exc.strerror or exc}") from None


def _entry(name: str, created: float, size: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o700 if directory else 0o600
    info.size, info.mtime = size, int(created)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
