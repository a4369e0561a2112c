"""Gather each source once, under a deadline, then run every check the expectations call for.

Gathers run in daemon threads: a hung NVML call (a sick GSP stalls each call ~6 s, Xid 119)
cannot hold the run past its deadline. The caller must end the process with os._exit when
`Run.hung` is set, since a thread stuck inside a C call cannot be stopped.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time

from slurmhealth.core.result import ERROR, FAIL, OK, WARN, Result, clean, fail, skip, verdict
from slurmhealth.node import checks, counters, sources
from slurmhealth.node.checks import runs_in
from slurmhealth.node.checks.base import JOB_PHASES, Context, job_verdict, norm_bus_id
from slurmhealth.node.sources import Options, SourceUnavailable

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, Callable

    from slurmhealth.core.command import Console
    from slurmhealth.core.store import RunRecords, RunRow
    from slurmhealth.node.checks.base import Facts, Keep
    from slurmhealth.node.config import Data
    from slurmhealth.node.counters import CounterRow

    # A source's gather: a zero-argument function that returns its raw facts, or raises.
    Gather = Callable[[], object]

SOURCES = ("gpu", "ib", "kmsg", "kernel", "fs", "host", "nvme", "bmc", "imex", "fmlog", "site")
# The site's own health check gets the run this much past its own deadline, to be stopped,
# said and recorded (sources/tools.py stops it a little before).
SITE_MARGIN_S = 2.0


class Gathered:
    """The outcome of one source: status ok|unavailable|timeout|error, raw facts or a message,
    and the versions its areas report (driver, VBIOS, HCA firmware) once parsed. `errno`: the
    error of a source that could not be read (a kernel log only root may read), else None.
    `absent`: unavailable where no area expected it (no BMC, no IMEX, no site health check
    configured), so its areas skipped: nothing the node should have is unread."""

    __slots__ = ("absent", "errno", "message", "raw", "seconds", "status", "versions")

    def __init__(self, status: str, raw: object = None, message: str = "", seconds: float = 0):
        self.status = status
        self.raw = raw
        self.message = message
        self.seconds = seconds
        self.versions: dict[str, Any] = {}
        self.errno: int | None = None
        self.absent = False

    def to_dict(self, versions: bool = True) -> dict[str, Any]:
        out = {"status": self.status, "message": self.message, "seconds": round(self.seconds, 6)}
        if versions and self.versions:
            out["versions"] = self.versions
        return out


def load_snapshot(path: str) -> dict[str, Any]:
    """A snapshot document, its shape checked (node/replay.py); ValueError with one line."""
    from slurmhealth.node import replay  # noqa: PLC0415 - only when a snapshot is replayed

    return replay.load(path)


def _replayed(doc: dict[str, Any], source: str) -> Gathered:
    """A source as the snapshot recorded it, failures included."""
    state = (doc.get("sources") or {}).get(source) or {}
    status = state.get("status", "ok")
    if status != "ok":
        return Gathered(status, doc.get(source), state.get("message", ""), state.get("seconds", 0))
    if doc.get(source) is None:
        return Gathered("unavailable", None, "not in the snapshot")
    return Gathered("ok", doc[source])


def _plan(wanted: set[str], options: Options, strict: bool = True) -> dict[str, Gathered | Gather]:
    """source -> a zero-argument gather function, or a Gathered already known (replay). A
    snapshot that cannot be replayed raises ValueError when `strict` (`check`: the user's
    argument, exit 2); otherwise (a hook's settings.gpu_source) the sources it was to give are
    errors, and sources given their own paths still run."""
    doc = None
    if options.gpu_source not in ("nvml", "", None):
        try:
            doc = load_snapshot(options.gpu_source)
        except ValueError as exc:
            if strict:
                raise
            doc = {"sources": {s: {"status": "error", "message": str(exc)} for s in wanted}}
    plan: dict[str, Gathered | Gather] = {}
    for source in wanted:
        # the site's program, like a path, is named: it runs, even beside a snapshot
        path = {
            "ib": options.sysfs_root,
            "kmsg": options.kmsg,
            "kernel": options.host_root,
            "fs": options.host_root,
            "host": options.host_root,
            "nvme": options.host_root,
            "bmc": options.host_root,
            "fmlog": options.host_root,
            "site": options.site_program,
        }.get(source)
        explicit = path not in (None, "", sources.DEFAULT_PATHS.get(source))
        if doc is not None and not explicit:
            plan[source] = _replayed(doc, source)
        else:
            early = sources.take_early(source, options)  # the hooks' early GPU sweep
            plan[source] = early or functools.partial(sources.gather, source, options)
    return plan


def _worker(func: Gather, box: list[Gathered]) -> None:
    started = time.perf_counter()
    try:
        box.append(Gathered("ok", func(), seconds=time.perf_counter() - started))
    except SourceUnavailable as exc:
        gone = Gathered("unavailable", exc.found, str(exc), time.perf_counter() - started)
        gone.errno = exc.errno  # set where the source is there but not this user's to read
        box.append(gone)
    except OSError as exc:
        message = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
        unread = Gathered("unavailable", None, message, time.perf_counter() - started)
        unread.errno = exc.errno
        box.append(unread)
    except Exception as exc:  # our bug or an unexpected library failure: error, not fail
        box.append(Gathered("error", None, f"{type(exc).__name__}: {exc}"))


# The sources that read this host's /proc and /sys run one after another in one thread: each
# is a few dozen small reads, and fs stats a network or FUSE mount in a thread of its own under
# fs.stat_timeout, so none holds up the others for long. One thread for the three costs 0.4 ms
# less than three in a fresh process (docs/benchmarks.md). Each keeps its own deadline; one
# still running at its deadline is a timeout, and so are those queued behind it.
TOGETHER = ("kernel", "host", "fs")


def _in_turn(jobs: list[tuple[Gather, list[Gathered]]]) -> None:
    for job, box in jobs:
        _worker(job, box)


def _started(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def gather(
    wanted: set[str],
    options: Options,
    timeouts: dict[str, float],
    deadline: float,
    strict: bool = True,
) -> tuple[dict[str, Gathered], bool]:
    """Gather sources concurrently (TOGETHER in one thread); returns ({source: Gathered},
    hung). `strict`: see _plan."""
    started = time.monotonic()
    plan = _plan(wanted, options, strict)
    out: dict[str, Gathered] = {}
    boxes: dict[str, list[Gathered]] = {}
    threads: dict[str, threading.Thread] = {}
    together: list[tuple[Gather, list[Gathered]]] = []
    for source in sorted(plan, key=lambda s: TOGETHER.index(s) if s in TOGETHER else -1):
        job = plan[source]
        if isinstance(job, Gathered):
            out[source] = job
            continue
        box = boxes[source] = []
        if source in TOGETHER:
            together.append((job, box))
        else:
            threads[source] = _started(_worker, job, box)
    if together:
        shared = _started(_in_turn, together)
        threads.update({source: shared for source in boxes if source in TOGETHER})
    hung = False
    for source, box in boxes.items():
        limit = min(timeouts.get(source, deadline), deadline)
        threads[source].join(max(0.0, min(limit, deadline) - (time.monotonic() - started)))
        if box:
            out[source] = box[0]
        else:
            hung = True
            out[source] = Gathered("timeout", None, f"timed out after {limit:g} s", limit)
    return out, hung


class Run:
    """The outcome of one run: results, verdict, per-source status, new baselines."""

    def __init__(self, node: str, phase: str) -> None:
        self.node = node
        self.phase = phase
        self.results: list[Result] = []
        self.sources: dict[str, Gathered] = {}
        self.baselines: dict[str, Any] = {}
        self.facts: dict[str, Facts] = {}
        self.events: list[dict[str, Any]] = []  # what the areas' events_of() reported, to record
        self.resets: list[int] = []  # GPU indexes a reset would mend (areas' resets_of())
        self.counters: list[CounterRow] = []  # counter readings that changed (node/counters.py)
        self.readings: dict[str, Any] = {}  # every counter read: {"<device>|<counter>": value}
        self.job_telemetry: dict[str, Any] | None = None  # the epilog's: counters.job_telemetry
        # The job's GPUs as NVML indexes (checks/gpu.py job_scope), or None: no job, or not
        # known, and why not (every GPU is then judged).
        self.job_gpus: list[int] | None = None
        self.scope_note = ""
        self.verdict = OK
        self.record_versions = True  # False: unchanged since recorded (VERSIONS_EVERY)
        self.hung = False
        self._error_fails = False
        self.started = time.time()
        self.duration = 0.0

    def carry(self, result: Result) -> None:
        """Add a result that is not a check of this run (a fault still pending from an earlier
        one), and judge the verdict again."""
        self.results.append(result)
        self.verdict = verdict(self.results, self._error_fails)

    def records(self, job_id: str | None = None) -> RunRecords:
        """The run as the store records it (core/store.py record_run). Only what is not ok is
        kept per check (an ok check says nothing the verdict doesn't): a node's history stays
        small with a health check every few minutes. Only the epilog gives events to the job,
        and only those on the job's GPUs: what a prolog reads happened before the job."""
        from slurmhealth import __version__  # noqa: PLC0415

        sources = {k: v.to_dict(self.record_versions) for k, v in self.sources.items()}
        results = [
            {
                "check_name": x.check,
                "status": x.status,
                "message": x.message,
                "action": x.action,
                "data": json.dumps(x.data, default=str),
                "duration": x.duration,
            }
            for x in self.results
            if x.status != OK
        ]
        events = [
            {
                "id": f"{e['kind']}:{self.node}:{e['key']}",
                "node": self.node,
                "job_id": job_id if self.phase == "epilog" and e.get("job", True) else None,
                "time": self.started,
                "kind": e["kind"],
                "code": e.get("xid"),
                "gpu": e.get("gpu"),
                "bus_id": e.get("bus_id"),
                "pid": e.get("pid"),
                "process": e.get("name"),
                "class": e.get("class"),
                "action": e.get("action"),
                "text": e.get("text"),
                "repeats": e.get("repeats") or 1,
            }
            for e in self.events
        ]
        run: RunRow = {
            "node": self.node,
            "job_id": job_id,
            "phase": self.phase,
            "started": self.started,
            "duration": self.duration,
            "verdict": self.verdict,
            "tool_version": __version__,
            "sources": json.dumps(sources),
        }
        return {
            "run": run,
            "results": results,
            "events": events,
            "baselines": self.baselines,
            "counters": [dict(c, time=self.started) for c in self.counters],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "phase": self.phase,
            "verdict": self.verdict,
            "results": [r.to_dict() for r in self.results],
            "sources": {k: v.to_dict() for k, v in self.sources.items()},
            "duration": round(self.duration, 6),
        }


def _source_results(area: str, got: Gathered, expect: Data) -> list[Result]:
    """Results of an area whose source gave no facts: the first check carries the reason."""
    names = [fn.__name__ for fn in checks.module(area).CHECKS]
    what = f"{checks.module(area).SOURCE} source {got.status}: {got.message}"
    if got.status == "timeout":
        first = fail(f"{checks.module(area).SOURCE} {got.message}", got.to_dict(), "drain")
    elif got.status == "error":
        first = Result(ERROR, what, got.to_dict())
    elif _denied(got):  # not this user's to read: unread (runner.unread), not the node's fault
        first = skip(f"not read: {what}", got.to_dict())
    elif checks.expected(area, expect, got.raw):
        first = fail(what, got.to_dict(), "drain")
    else:
        first = skip(what, got.to_dict())
    rest = [skip(f"not run: {what}") for _ in names[1:]]
    for name, result in zip(names, [first, *rest]):
        result.check = f"{area}.{name}"
    return [first, *rest]


def _absent(area: str, got: Gathered, expect: Data) -> bool:
    """The area's source is not there, and the area did not expect it (_source_results skips
    it): a node without a BMC, IMEX or a site health check, not a source it failed to read."""
    return (
        got.status == "unavailable"
        and not _denied(got)
        and not checks.expected(area, expect, got.raw)
    )


def _denied(got: Gathered) -> bool:
    """The source refused this user (EACCES, EPERM) who is not root: its checks cannot judge
    the node, and the run says it is incomplete. Root refused is a broken source: judged."""
    import errno  # noqa: PLC0415 - a builtin module

    return got.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0


def _apply_override(result: Result, override: dict[str, Any]) -> Result:
    severity = override.get("severity")
    if severity == WARN and result.status == FAIL:
        result.status = WARN
    elif severity == FAIL and result.status == WARN:
        result.status = FAIL
    return result


def _run_check(
    name: str, fn: Callable[[Facts, Context], Result], facts: Facts, ctx: Context
) -> Result:
    started = time.perf_counter()
    try:
        result = fn(facts, ctx)
    except Exception as exc:  # our bug is not the node's fault
        result = Result(ERROR, f"check crashed: {type(exc).__name__}: {exc}")
    result.check = name
    result.duration = time.perf_counter() - started
    return result


def _area_results(
    area: str, raw: object, expect: Data, ctx: Context, note: str = ""
) -> tuple[list[Result], Facts | None]:
    """The area's results; `note`: why the job hook's job's GPUs are not known, if so."""
    module = checks.module(area)
    try:
        facts = module.parse(raw)
    except Exception as exc:
        broken = Gathered("error", None, f"parse crashed: {type(exc).__name__}: {exc}")
        return _source_results(area, broken, expect), None
    results = []
    scoped = getattr(module, "SCOPED", ())
    for fn in module.CHECKS:
        name = f"{area}.{fn.__name__}"
        override = expect["checks"].get(name, {})
        if override.get("enabled") is False:
            disabled = skip("disabled by config")
            disabled.check = name
            results.append(disabled)
            continue
        result = _apply_override(_run_check(name, fn, facts, ctx), override)
        if fn in scoped and result.status != OK and ctx.phase in JOB_PHASES:
            result = _for_job(result, fn, facts, ctx, override, note)
        results.append(result)
    return results, facts


def _for_job(
    result: Result,
    fn: Callable[[Facts, Context], Result],
    facts: Facts,
    ctx: Context,
    override: dict[str, Any],
    note: str,
) -> Result:
    """A scoped check's result in a job hook: judged on the job's GPUs (base.job_verdict), or,
    where they are not known, on every GPU, saying why in `scope`."""
    if ctx.job_gpus is None:
        if note:
            result.data = dict(result.data, scope={"job_gpus": None, "why": note})
        return result
    module = checks.module(result.check.split(".")[0])

    def judge(narrowed: Facts) -> Result:
        return _apply_override(_run_check(result.check, fn, narrowed, ctx), override)

    def narrow(keep: Keep) -> Facts:
        narrowed: Facts = module.for_gpus(facts, ctx, keep)
        return narrowed

    known = {i for i in ctx.gpus.values() if isinstance(i, int)}
    known |= {d["index"] for d in facts.get("devices") or [] if isinstance(d.get("index"), int)}
    return job_verdict(result, judge, narrow, ctx, sorted(known))


def _bus_map(gathered: dict[str, Gathered], baselines: dict[str, Any]) -> dict[str, int | None]:
    """Bus id -> GPU index, from this sweep and the last known inventory: a GPU that fell off
    the bus has no bus id now, but its Xid lines still name it."""
    known = ((baselines.get("gpu") or {}).get("inventory") or {}).items()
    out: dict[str, int | None] = {
        norm_bus_id(v["bus_id"]): int(k) for k, v in known if v.get("bus_id")
    }
    got = gathered.get("gpu")
    if not got or got.status != "ok" or not isinstance(got.raw, dict):
        return out
    for dev in got.raw.get("devices") or []:
        if isinstance(dev, dict) and isinstance(dev.get("bus_id"), str):
            out[norm_bus_id(dev["bus_id"])] = dev.get("index")
    return out


def _contributed(area: str, name: str, *args: object) -> Any:
    """What an area contributes besides its results, if it has the function (checks/__init__):
    versions_of (recorded with the run's sources; the report compares them across the fleet),
    events_of (recorded events), resets_of (GPUs a reset would mend). A crash here is our bug
    and costs that contribution, never the run."""
    func = getattr(checks.module(area), name, None)
    try:
        return func(*args) if func else None
    except Exception:
        return None


# Unchanged versions are recorded again this often: a health check every 5 min would otherwise
# double the size of every run record for facts that change at a maintenance window; the report
# looks back VERSIONS_EVERY plus a margin for each node's last recorded versions.
VERSIONS_EVERY = 6 * 3600.0


# Versions a run may not read (sources.Options.costly: the job hooks leave them to the health
# check): where this run has none, the last reading stands, carried into what it records.
CARRIED = {"gpu": ("app_clocks",), "kmsg": ("nccl",)}


def _carry(sources: dict[str, Gathered], before: dict[str, Any]) -> None:
    for name, keys in CARRIED.items():
        got, last = sources.get(name), (before.get("seen") or {}).get(name) or {}
        if got is None or not got.versions or not isinstance(last, dict):
            continue
        for key in keys:
            if key not in got.versions and key in last:
                got.versions[key] = last[key]


def _versions_due(
    sources: dict[str, Gathered], before: dict[str, Any], now: float
) -> tuple[bool, dict[str, Any]]:
    """(record the versions with this run?, the versions baseline to keep)."""
    _carry(sources, before)
    seen = {name: got.versions for name, got in sorted(sources.items()) if got.versions}
    if not seen:
        return False, before
    if before.get("seen") == seen and 0 <= now - before.get("recorded", 0) < VERSIONS_EVERY:
        return False, before
    return True, {"seen": seen, "recorded": now}


def _counters(out: Run, before: object) -> None:
    """The error counters that changed since the node's previous reading (node/counters.py),
    from the sources that were read; a crash here is our bug and costs the rows, never the run."""
    raw = {
        name: got.raw if got.status == "ok" else None
        for name, got in out.sources.items()
        if name in ("gpu", "ib")
    }
    if not any(isinstance(v, dict) for v in raw.values()):
        return
    try:
        read = counters.readings(raw.get("gpu"), raw.get("ib"))
        out.readings = {key: value for key, (value, _) in read.values.items()}
        out.counters, out.baselines["counters"] = counters.changes(before, read, out.started)
    except Exception:
        out.counters = []


def _samples(out: Run, before: object) -> None:
    """The GPU baseline gets the SM clock and utilisation sums with this run's samples added
    (node/counters.py add_samples); a crash here is our bug and costs the samples, never the
    run."""
    gpu = out.baselines.get("gpu")
    if not isinstance(gpu, dict):
        return
    try:
        sums = before.get("samples") if isinstance(before, dict) else None
        gpu["samples"] = counters.add_samples(sums, out.facts.get("gpu"))
    except Exception:
        gpu.pop("samples", None)


def _job_telemetry(
    out: Run, before: object, job_gpus: list[int] | None
) -> dict[str, Any] | None:
    """The job's figures per GPU, from its prolog's readings (`job_start` of the GPU baseline);
    a crash here is our bug and costs the figures, never the run."""
    start = before.get("job_start") if isinstance(before, dict) else None
    sums = (out.baselines.get("gpu") or {}).get("samples")
    try:
        return counters.job_telemetry(start, out.facts.get("gpu"), out.started, job_gpus, sums)
    except Exception:
        return None


def _what_to_read(options: Options, areas: list[str], expect: Data) -> None:
    """The host sources' reads that the areas' expectations choose (sources.Options)."""
    if "fs" in areas:  # the mounts and files the fs checks judge, each under its own deadline
        options.mounts = checks.module("fs").stat_paths(expect["fs"])
        options.files = checks.module("fs").file_paths(expect["fs"])
        options.stat_timeout = expect["fs"]["stat_timeout"]
    if "ps" in areas:  # the names a job hook must find, among PID 1's children or elsewhere
        options.processes = checks.module("ps").names(expect["ps"])
    if "net" in areas:  # the interfaces a job hook reads whole though they have no device
        options.interfaces = checks.module("net").names(expect["net"])


def run(
    node: str,
    expect: Data,
    options: Options,
    areas: list[str] | None = None,
    phase: str = "check",
    baselines: dict[str, Any] | None = None,
    job_gpus: list[int] | None = None,
    deadline: float | None = None,
    visible: list[str] | None = None,
) -> Run:
    """One full run: gather, check, verdict. Never raises for a node's state. `deadline`: the
    seconds the gathers may take at most (default settings.deadline; the hooks pass what is
    left of theirs). `job_gpus` and `visible`: what slurmd names of the job's GPUs
    (SLURM_JOB_GPUS, the MIG device ids of CUDA_VISIBLE_DEVICES), mapped to NVML's GPUs
    (checks/gpu.py job_scope) once the GPUs are read."""
    started = time.perf_counter()
    out = Run(node, phase)
    areas = [a for a in checks.NAMES if (areas is None or a in areas) and runs_in(a, phase)]
    settings = expect["settings"]
    timeouts = {s: settings[f"timeout_{s}"] for s in SOURCES}
    options.timeouts = timeouts
    needed = {checks.module(a).SOURCE for a in areas}
    _what_to_read(options, areas, expect)
    most = deadline_for(settings, phase, options.site_program)
    limit = most if deadline is None else min(deadline, most)
    out.sources, out.hung = gather(needed, options, timeouts, limit, strict=phase == "check")
    baselines = baselines or {}
    gpus = _bus_map(out.sources, baselines)
    out.job_gpus, out.scope_note = _job_scope(out.sources, job_gpus, visible)
    absent: dict[int, bool] = {}  # id(Gathered): no area reading it expected it
    for area in areas:
        got = out.sources[checks.module(area).SOURCE]
        area_expect = dict(expect[area], checks=expect["checks"])
        before = baselines.get(area) or {}
        ctx = Context(
            node, phase, area_expect, before, gpus, out.job_gpus, time.time(), out.facts
        )
        if got.status != "ok":
            out.results.extend(_source_results(area, got, area_expect))
            # absent while no area that reads it expected it
            absent[id(got)] = absent.get(id(got), True) and _absent(area, got, area_expect)
            got.absent = absent[id(got)]
            continue
        results, facts = _area_results(area, got.raw, area_expect, ctx, out.scope_note)
        out.results.extend(results)
        if facts is not None:
            out.facts[area] = facts
            remembered = checks.baseline(area, facts, ctx.now)
            if remembered:  # an area that judges only the present keeps no store row
                out.baselines[area] = remembered
            got.versions.update(_contributed(area, "versions_of", facts) or {})
            kind = checks.module(area).AREA
            events = _contributed(area, "events_of", facts, ctx) or []
            out.events.extend(dict(e, kind=kind) for e in events)
            out.resets.extend(_contributed(area, "resets_of", facts) or [])
    before = baselines.get("versions") or {}
    out.record_versions, kept = _versions_due(out.sources, before, out.started)
    if kept:
        out.baselines["versions"] = kept
    _counters(out, baselines.get("counters"))
    _samples(out, baselines.get("gpu"))
    if phase == "epilog":
        out.job_telemetry = _job_telemetry(out, baselines.get("gpu"), out.job_gpus)
    out._error_fails = settings["error_fails"]
    out.verdict = verdict(out.results, out._error_fails)
    out.duration = time.perf_counter() - started
    return out


def _job_scope(
    gathered: dict[str, Gathered], job_gpus: list[int] | None, visible: list[str] | None
) -> tuple[list[int] | None, str]:
    """The job's GPUs as NVML's indexes, from what slurmd named and the GPUs read (checks/gpu.py
    job_scope): (indexes, "") or (None, why not known); (None, "") with no job named."""
    if job_gpus is None and not visible:
        return None, ""
    swept = gathered.get("gpu")
    raw = swept.raw if swept is not None and swept.status == "ok" else None
    scope: tuple[list[int] | None, str] = checks.HOOKED["gpu"].job_scope(raw, job_gpus, visible)
    return scope


def deadline_for(settings: Data, phase: str, site_program: str | None) -> float:
    """A run's deadline: settings.deadline, or, where the site's own health check runs in this
    phase, long enough for it to end within settings.timeout_site and be recorded (slurmd
    kills a health check after 60 s: timeout_site is at most 55)."""
    base = float(settings["deadline"])
    if not site_program or not runs_in("site", phase):
        return base
    return max(base, float(settings["timeout_site"]) + SITE_MARGIN_S)


def unread(gathered: dict[str, Gathered]) -> list[dict[str, Any]]:
    """The sources that could not be read though the node has them (`/dev/kmsg` to a user who
    is not root, where the kernel restricts it), from {source: Gathered}: [{source, message,
    areas}], the areas whose checks they feed. A source the node lacks (no such file) is not
    one: its checks skip, as in the hooks."""
    import errno  # noqa: PLC0415 - a builtin module

    return [
        {
            "source": name,
            "message": got.message + _restricted(name, got.errno),
            "areas": [a for a, module in checks.areas().items() if module.SOURCE == name],
        }
        for name, got in sorted(gathered.items())
        if got.errno is not None and got.errno != errno.ENOENT
    ]


def _restricted(source: str, code: int) -> str:
    """Why the kernel refused its log (EPERM, not a file's mode: EACCES), where it is the
    sysctl an admin sets: ` (kernel.dmesg_restrict=1: only root may read it)`, else ""."""
    import errno  # noqa: PLC0415 - a builtin module

    if source != "kmsg" or code != errno.EPERM:
        return ""
    try:
        with open("/proc/sys/kernel/dmesg_restrict", encoding="ascii") as handle:
            restricted = handle.read().strip() == "1"
    except (OSError, ValueError):
        return ""
    return " (kernel.dmesg_restrict=1: only root may read it)" if restricted else ""


def snapshot(
    node: str, options: Options, timeouts: dict[str, float], deadline: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Everything the checks read on this node, as one JSON-able document, and the sources it
    could not read (unread): (document, unread)."""
    options.timeouts = timeouts
    gathered, _ = gather(set(SOURCES), options, timeouts, deadline)
    from slurmhealth import __version__  # noqa: PLC0415
    from slurmhealth.node import replay  # noqa: PLC0415 - the format's one home

    doc: dict[str, Any] = {
        "format": replay.FORMAT,
        "node": node,
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tool_version": __version__,
        "sources": {k: v.to_dict() for k, v in gathered.items()},
    }
    for source in SOURCES:
        doc[source] = gathered[source].raw
    return doc, unread(gathered)


def default_snapshot(node: str, options: Options) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """snapshot() with the default timeouts and deadline (`slurmhealth snapshot`, `rma`);
    OSError or ValueError when a source's options refuse."""
    from slurmhealth.node import config  # noqa: PLC0415

    settings = config.defaults()["settings"]
    timeouts = {s: settings[f"timeout_{s}"] for s in SOURCES}
    return snapshot(node, options, timeouts, settings["deadline"])


def save_snapshot(node: str, options: Options, output: str, console: Console) -> bool:
    """`slurmhealth snapshot`: the snapshot of this node with the default timeouts and
    deadline, to standard output ("-") or the private file `output`; each source it could not
    read said in one line on standard error. Whether one was not read (the answer is
    incomplete); CommandError when a source's options or the file refuse."""
    from slurmhealth.core.command import CommandError, emit  # noqa: PLC0415

    try:
        doc, missing = default_snapshot(node, options)
    except (OSError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    emit(json.dumps(doc, indent=1, sort_keys=True) + "\n", output, console)
    for source in missing:  # its message names the path: not trusted, cleaned
        lacks = f"the snapshot lacks it (the {', '.join(source['areas'])} checks)"
        said = f"{source['source']}: {clean(source['message'], 300)}: {lacks}"
        console.err(f"slurmhealth snapshot: {said}, the answer is incomplete")
    return bool(missing)
