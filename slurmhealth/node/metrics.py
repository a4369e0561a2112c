"""The node's state for node_exporter's textfile collector, after every run (docs/metrics.md).

Written by hand in the text exposition format: prometheus_client is a heavy import and this
runs in the prolog (the hook's costs: docs/benchmarks.md). Metric and label names are fixed
here, never built from data; label values (node names, check names) are escaped as the format
says.

One file holds a node's state. Check and source series describe the latest run, whatever its
phase; per-phase series (verdict, time, duration) and counters are carried forward from the
previous file, so a prolog does not erase the last epilog's. Writers take a lock beside the
file for the read-merge-write (concurrent prologs on a shared node), then rename a complete
temporary file over it: a scrape never sees half a file, and the last writer wins.
"""

from __future__ import annotations

import os
import re

from slurmhealth import __version__
from slurmhealth.core.constants import DRAIN_OUTCOMES, PHASES
from slurmhealth.core.result import FAIL, OK, STATUSES, WARN
from slurmhealth.node import counters
from slurmhealth.node.checks import LATER

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from slurmhealth.node.recordable import Recordable

    Labels = tuple[tuple[str, str], ...]  # (name, value) pairs, `node` first
    Samples = dict[tuple[str, Labels], float]  # (metric name, labels) -> value
    KmsgState = tuple[str, int]  # (boot id, last sequence number read)
    XidEvent = tuple[object, int, str]  # (seq as recorded, Xid, class)

VERDICTS = (OK, WARN, FAIL)
XID_CLASSES = ("app", WARN, FAIL)
# runner's source keys -> the module that reads them (slurmhealth/sources/)
SOURCE_NAMES = {"gpu": "nvml", "ib": "sysfs", "kmsg": "kmsg"}

# name -> (type, labels after `node`, help); the file lists families in this order.
FAMILIES = {
    "slurmhealth_build_info": ("gauge", ("version",), "slurmhealth version writing this file"),
    "slurmhealth_check_status": (
        "gauge",
        ("check", "status"),
        "Latest run's result of each check: 1 for its status, 0 for the other statuses",
    ),
    "slurmhealth_source_up": (
        "gauge",
        ("source",),
        "1 when the latest run read this source, 0 when unavailable, timed out or broken; "
        "none for a source the node does not have and no check expects",
    ),
    "slurmhealth_source_duration_seconds": (
        "gauge",
        ("source",),
        "Time the latest run spent reading this source",
    ),
    "slurmhealth_run_verdict": (
        "gauge",
        ("phase", "verdict"),
        "Verdict of the latest run of each phase: 1 for it, 0 for the others",
    ),
    "slurmhealth_last_run_timestamp_seconds": (
        "gauge",
        ("phase",),
        "Unix time the latest run of each phase started",
    ),
    "slurmhealth_run_duration_seconds": (
        "gauge",
        ("phase",),
        "Gather and check time of the latest run of each phase",
    ),
    "slurmhealth_runs_total": (
        "counter",
        ("phase", "verdict"),
        "Runs since this file was created, by phase and verdict",
    ),
    "slurmhealth_xid_events_total": (
        "counter",
        ("xid", "class"),
        "Xid events read from the kernel log since this file was created, repeats merged",
    ),
    "slurmhealth_drains_total": (
        "counter",
        ("outcome",),
        "Drains a failing run asked for, by outcome (breaker: held back by the circuit breaker)",
    ),
    "slurmhealth_device_errors_total": (
        "counter",
        ("device", "counter"),
        "Latest run's reading of a device's error counter, as the device counts it (non-zero only)",
    ),
}
PER_PHASE = (
    "slurmhealth_run_verdict",
    "slurmhealth_last_run_timestamp_seconds",
    "slurmhealth_run_duration_seconds",
)
COUNTERS = ("slurmhealth_runs_total", "slurmhealth_xid_events_total", "slurmhealth_drains_total")
# The checks and sources of the areas only a health check, `check` or `diagnose` runs (LATER):
# a prolog or epilog between two health checks carries on their sources' series and the state
# sets of their checks that did not pass, or each job would blank them and restart the `for:`
# of every alert on them
LATER_SERIES = (
    "slurmhealth_check_status",
    "slurmhealth_source_up",
    "slurmhealth_source_duration_seconds",
)
CARRIED = frozenset(PER_PHASE + COUNTERS + LATER_SERIES)
_CHECK_STATUS = LATER_SERIES[0]
# the states of such a check that no alert is on: a prolog does not carry them (it drops their
# series as before), so a healthy node's prologs write no more than they did
_QUIET = ('status="ok"', 'status="skip"')
# label -> the values a carried-forward line may have; anything else in the old file is dropped
_CLOSED = {
    "phase": PHASES,
    "verdict": VERDICTS,
    "class": XID_CLASSES,
    "outcome": DRAIN_OUTCOMES,
    "status": STATUSES,
}

_INF = float("inf")
READ_MAX = 1 << 20  # our own file is a few KiB; a bigger one is not ours to carry forward
# A writer holds the lock for one write; past this wait, write unlocked (still whole, but the
# merge may miss a concurrent run's count). A burst of hooks on a busy node (24 at once on 2
# cores) queues writers behind holders the scheduler paused for more than 0.5 s: 2 s of the
# run's 10 s deadline keeps every count.
LOCK_WAIT_S = 2.0
_LABEL = r'([a-z_]+)="((?:[^"\\]|\\.)*)"(,|$)'
_KMSG_STATE = "# slurmhealth kmsg boot_id="


def escape(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped;
    what UTF-8 cannot carry (undecodable bytes from the environment) becomes `?`."""
    text = str(value)
    if text.isascii() and not ("\\" in text or '"' in text or "\n" in text):
        return text  # the common case, and the cost of a file of 400 label values
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def unescape(value: str) -> str:
    if "\\" not in value:
        return value
    out, chars = [], iter(value)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        escaped = next(chars, "")
        out.append("\n" if escaped == "n" else escaped)
    return "".join(out)


def number(value: float) -> str:
    """Integers without a fraction; other floats exactly (repr round-trips)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def path_for(template: str, node: str) -> str:
    """The configured path with `{node}` replaced: one file per slurmd on a shared host.

    Node names are untrusted here: only letters, digits, `_` and `-` reach the path.
    """
    safe = "".join(c if (c.isascii() and c.isalnum()) or c in "_-" else "_" for c in node)
    return template.replace("{node}", safe)


def render(samples: Samples, kmsg_state: KmsgState | None = None) -> str:
    """{(name, labels): value} -> the file's text, families in FAMILIES order with HELP/TYPE.

    `labels` is a tuple of (name, value) pairs, `node` first.
    """
    lines = []
    if kmsg_state is not None:
        lines.append(f"# slurmhealth kmsg boot_id={kmsg_state[0]} seq={kmsg_state[1]}")
    grouped: dict[str, list[tuple[Labels, float]]] = {name: [] for name in FAMILIES}
    for (name, labels), value in samples.items():
        grouped[name].append((labels, value))
    for name, rows in grouped.items():
        if not rows:
            continue
        kind, _, help_text = FAMILIES[name]
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in sorted(rows):
            body = ",".join([f'{key}="{escape(val)}"' for key, val in labels])
            lines.append(f"{name}{{{body}}} {number(value)}")
    return "\n".join(lines) + "\n"


def _labels(body: str) -> Labels | None:
    """`a="x",b="y"` -> (("a", "x"), ("b", "y")); None when it is not exactly that."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        found = re.compile(_LABEL).match(body, pos)
        if found is None or (found.group(3) == "," and found.end() == len(body)):
            return None
        out.append((found.group(1), unescape(found.group(2))))
        pos = found.end()
    return tuple(out)


def _acceptable(name: str, labels: Labels, value: float, node: str) -> bool:
    """A carried-forward sample must be one this module would write, for this node."""
    if name not in CARRIED or not abs(value) < _INF:  # NaN compares false
        return False
    if tuple(k for k, _ in labels) != ("node", *FAMILIES[name][1]) or labels[0][1] != node:
        return False
    for key, val in labels[1:]:
        if key in _CLOSED and val not in _CLOSED[key]:
            return False
        if key == "xid" and not (val.isdigit() and val.isascii() and len(val) <= 6):
            return False
        if key == "source" and val not in LATER:
            return False
        if key == "check" and not _later_check(val):
            return False
    return name not in COUNTERS or value >= 0


def _later_check(name: str) -> bool:
    """`area.function` of one of LATER, by its shape: a job hook imports none of their modules
    to list their checks."""
    area, dot, func = name.partition(".")
    shaped = func.isidentifier() and func.isascii() and len(name) <= 64
    return area in LATER and bool(dot) and shaped


def _area(body: str) -> str:
    """The area of a check_status line's check, or a source line's source: the label after
    the node's (a node name that holds either label's text only makes a line parsed in full,
    then judged by _acceptable)."""
    _, found, rest = body.rpartition(',check="')
    if not found:
        _, found, rest = body.rpartition(',source="')
        return rest.partition('"')[0]
    return rest.partition(".")[0]


def _boot_id(text: str) -> str:
    return "".join(c for c in text.lower() if c in "0123456789abcdef-")[:64]


def _kmsg_state(line: str) -> KmsgState | None:
    """`# slurmhealth kmsg boot_id=B seq=N` -> (B, N)."""
    boot, _, seq = line[len(_KMSG_STATE) :].partition(" seq=")
    ok = seq.isdigit() and seq.isascii() and _boot_id(boot) == boot
    return (boot, int(seq)) if ok else None


def _sample(line: str) -> tuple[str, Labels, float] | None:
    """`name{labels} value` of a carried family -> (name, labels, value); None otherwise.

    Most lines are the latest run's own series, replaced anyway: they cost one partition.
    """
    name, brace, rest = line.partition("{")
    body, close, text = rest.rpartition("} ")  # a value never holds "} ", a label value may
    if name not in CARRIED or not (brace and close):
        return None
    if name == _CHECK_STATUS and (text != "1" or body.endswith(_QUIET)):
        return None  # a state set: its current state stands for all; one that passed is let go
    if name in LATER_SERIES and _area(body) not in LATER:  # most check lines: replaced anyway
        return None
    labels = _labels(body)
    try:
        value = float(text)
    except ValueError:
        return None
    return (name, labels, value) if labels is not None else None


def parse_previous(text: str, node: str) -> tuple[Samples, KmsgState | None]:
    """(carried samples, kmsg state) of the previous file; lines that are not ours are dropped."""
    samples: Samples = {}
    kmsg_state: KmsgState | None = None
    for line in text.splitlines():
        if line.startswith(_KMSG_STATE):
            kmsg_state = _kmsg_state(line) or kmsg_state
            continue
        found = _sample(line)
        if found is not None and _acceptable(*found, node):
            name, labels, _ = found
            if name == _CHECK_STATUS:  # the check's whole state set, from its current state
                now = labels[2][1]
                samples.update(_state_set(name, labels[:2], "status", STATUSES, now))
            else:
                samples[found[0], found[1]] = found[2]
    return samples, kmsg_state


def _state_set(
    name: str, labels: Labels, key: str, states: tuple[str, ...], now: str
) -> Samples:
    """One sample per state, 1 for `now` and 0 for the others (OpenMetrics' StateSet)."""
    return {(name, (*labels, (key, s))): float(s == now) for s in states}


def _device(text: str) -> str:
    """A device as node/counters.py names it (`gpu:0000:18:00.0`, `ib:mlx5_0:1`): the bus id
    comes from NVML and the HCA name from sysfs, so only [a-z0-9:._-] is kept, 64 at most."""
    return "".join(c for c in text.lower() if c.isascii() and (c.isalnum() or c in ":._-"))[:64]


def run_samples(run: Recordable, node: str) -> Samples:
    """The latest run's own series: build info, checks, sources, its phase's verdict and times."""
    me = (("node", node),)
    out: Samples = {("slurmhealth_build_info", (*me, ("version", __version__))): 1.0}
    for r in run.results:
        labels: Labels = (*me, ("check", r.check))
        out.update(_state_set("slurmhealth_check_status", labels, "status", STATUSES, r.status))
    for source, got in run.sources.items():
        labels = (*me, ("source", SOURCE_NAMES.get(source, source)))
        if not got.absent:  # a source the node does not have is not one that is down
            out[("slurmhealth_source_up", labels)] = float(got.status == "ok")
        out[("slurmhealth_source_duration_seconds", labels)] = round(got.seconds, 6)
    for key, value in sorted(run.readings.items()):
        device, _, counter = key.partition("|")
        if counter not in counters.GAUGES and value > 0:
            labels = (*me, ("device", _device(device)), ("counter", counter))
            out[("slurmhealth_device_errors_total", labels)] = float(value)
    phase = (*me, ("phase", run.phase))
    out.update(_state_set("slurmhealth_run_verdict", phase, "verdict", VERDICTS, run.verdict))
    out[("slurmhealth_last_run_timestamp_seconds", phase)] = round(run.started, 3)
    out[("slurmhealth_run_duration_seconds", phase)] = round(run.duration, 6)
    return out


def xid_events(run: Recordable) -> list[XidEvent]:
    """(seq, xid, class) of every Xid event the run recorded (config applied; `ignore`-class
    Xids are not reported)."""
    return [
        (e.get("seq"), e["xid"], e["class"])
        for e in run.events
        if e["kind"] == "xid" and e.get("class") in XID_CLASSES and isinstance(e.get("xid"), int)
    ]


def kmsg_position(run: Recordable, events: list[XidEvent]) -> KmsgState | None:
    """(boot id, last sequence number) this run read up to; None when it read no kernel log."""
    base = run.baselines.get("xid")
    if not isinstance(base, dict):
        return None
    seqs = [s for s in [base.get("seq"), *(e[0] for e in events)] if isinstance(s, int)]
    boot = _boot_id(str(base.get("boot_id") or ""))
    return (boot, max(seqs)) if seqs else None


def uncounted(
    events: list[XidEvent], before: KmsgState | None, after: KmsgState | None
) -> list[XidEvent]:
    """Events no earlier writer counted: concurrent runs of one boot read the same records."""
    if before is None or after is None or before[0] != after[0]:
        return events
    return [e for e in events if isinstance(e[0], int) and e[0] > before[1]]


def _add(samples: Samples, name: str, labels: Labels, amount: float) -> None:
    samples[(name, labels)] = samples.get((name, labels), 0.0) + amount


def merge(
    previous: Samples,
    current: Samples,
    run: Recordable,
    node: str,
    counts: tuple[str | None, list[XidEvent]],
) -> Samples:
    """The new file's samples: this run's series, other phases' carried over, counters added.

    `counts` is (drain outcome or None, Xid events to count). Counters start at 0 for every
    known label value, so `increase()` sees the first event.
    """
    phase = ("phase", run.phase)
    out = {k: v for k, v in previous.items() if k[0] in COUNTERS or phase not in k[1]}
    for source, got in run.sources.items():  # an earlier run's word on a source now absent
        if got.absent:
            name = SOURCE_NAMES.get(source, source)
            out.pop(("slurmhealth_source_up", (("node", node), ("source", name))), None)
    out.update(current)
    me = (("node", node),)
    for verdict in VERDICTS:
        amount = 1.0 if verdict == run.verdict else 0.0
        _add(out, "slurmhealth_runs_total", (*me, phase, ("verdict", verdict)), amount)
    drain, xids = counts
    for outcome in DRAIN_OUTCOMES:
        _add(out, "slurmhealth_drains_total", (*me, ("outcome", outcome)), float(outcome == drain))
    for _, xid, cls in xids:
        _add(out, "slurmhealth_xid_events_total", (*me, ("xid", str(xid)), ("class", cls)), 1.0)
    return out


def _read(path: str) -> str:
    """The previous file, to carry its series forward; never read through a symlink, and not
    at all when someone else made it (node_exporter's folder may be its user's: counters it
    forged would be carried on as ours)."""
    from slurmhealth.core import files  # noqa: PLC0415

    try:
        fd = files.open_trusted(path)
    except OSError:  # none yet, a symlink someone planted, or not ours
        return ""
    with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
        text = handle.read(READ_MAX + 1)
    return text if len(text) <= READ_MAX else ""


def write_atomic(path: str, text: str) -> None:
    """Write an exclusive temporary file beside `path` (`.NAME.RANDOM.tmp`: node_exporter reads
    only *.prom), mode 0644 from its first byte whatever the umask (node_exporter runs as its
    own user), and rename it over `path`; a symlink at `path` is refused (files.Unsafe, an
    OSError), never followed. No fsync: after a crash the next run rewrites the file anyway."""
    from slurmhealth.core import files  # noqa: PLC0415

    files.write_private(path, text, mode=0o644)


def _lock(path: str) -> int | None:
    """An exclusive lock beside the file for the read-merge-write, or None after LOCK_WAIT_S
    (the write then goes ahead unlocked: still whole, the merge may miss a concurrent run).
    Reached as write_atomic reaches the file (no planted link); someone else's lock is theirs
    to hold: written unlocked."""
    from slurmhealth.core import files  # noqa: PLC0415

    directory, base = os.path.split(os.path.abspath(path))
    return files.lock(os.path.join(directory, f".{base}.lock"), LOCK_WAIT_S, 0o644, theirs=True)


def update(path: str, run: Recordable, node: str, drain: str | None = None) -> None:
    """Merge one run into the node's file. Raises OSError when the file cannot be written."""
    lock = _lock(path)
    try:
        previous, before = parse_previous(_read(path), node)
        events = xid_events(run)
        after = kmsg_position(run, events)
        counted = uncounted(events, before, after)
        samples = merge(previous, run_samples(run, node), run, node, (drain, counted))
        write_atomic(path, render(samples, after or before))
    finally:
        if lock is not None:
            os.close(lock)
