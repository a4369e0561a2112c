"""The node agent: `slurmhealth check` and the hooks slurmd runs (prolog, epilog, healthcheck).

The entry point (__main__.py) sends exactly these here. They run before and after every job, so
this module never imports click or jinja2: it parses its few options by hand. The hooks fail
open: a broken config, an unwritable store or our own bug is logged loudly and never drains a
node; only a failing check does.
"""

from __future__ import annotations

import json
import os
import sys
import time

from slurmhealth.core.constants import (
    ACT_REBOOT,
    ACT_RESET_GPU,
    ACT_WOULD_DRAIN,
    BREAKER,
    DRAINED,
    EPILOG,
    HEALTHCHECK,
    HOOKS,
    RESET,
    SERVICE,
    SKIPPED,
    WOULD_DRAIN,
)
from slurmhealth.core.hostlist import is_node_name
from slurmhealth.core.result import DRAIN, FAIL, OK, RESET_GPU, clean, counted, worst_action
from slurmhealth.core.result import REBOOT as REBOOT_ACTION
from slurmhealth.core.result import SERVICE as SERVICE_ACTION
from slurmhealth.node import checks, config, counters, learned, runner, sources, state
from slurmhealth.node.checks.base import demoted, fails_node, other_gpus
from slurmhealth.node.journal import Journal

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    import sqlite3
    import threading
    from collections.abc import Mapping
    from typing import Any

    from slurmhealth.core import slurm  # the failure path imports it
    from slurmhealth.core.result import Result
    from slurmhealth.node.config import Data
    from slurmhealth.node.ladder import Ladder
    from slurmhealth.node.learned import Applied
    from slurmhealth.node.recordable import Recordable

    Baselines = dict[str, Any]  # {area: what its baseline(facts) kept}, from the store

    # The node's store, or None where it cannot be used (the verdict never depends on it).
    Store = sqlite3.Connection | None

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INCOMPLETE = 4  # `check`: a source could not be read (4: inconclusive, as for diagnose)
DEFAULT_DEADLINE_S = config.SETTINGS["deadline"][0]
# The first wait for the store's lock on the hook path. A concurrent prolog holds it for its
# writes (64 prologs starting at once on a loaded 2-core node queue for up to a second or two:
# docs/benchmarks.md); an admin's sqlite3 shell or a long prune, minutes. Past it the write is
# given up (the run is spooled, its verdict logged) and the rest of the run waits 0.1 s per
# write (_wait_less), so a locked store costs a hook about this much, well inside the deadline.
HOOK_BUSY_S = 3.0
# Kept back from the deadline for what follows the last bounded wait: logging, exiting.
RESERVE_S = 0.3
# How long the watchdog waits to spool a store write it cut short (a small append; a disk that
# takes longer is the disk that hung the store).
SPOOL_AT_DEADLINE_S = 0.2
PENDING_CHECK = "slurmhealth.pending"
LOG_MAX = 4000  # a log line's characters at most (a traceback, folded onto one line)
SPOOL_SUFFIX = ".unrecorded.ndjson"  # beside the store: runs it could not take, replayed later


class Deadline:
    """The whole hook's deadline, enforced by a watchdog thread: whatever blocks (a store lock,
    a hung NVML call, a stuck nvidia-smi), the process exits by settings.deadline, with the
    verdict's exit code once it is known (`code`), else 0 (fail open), and says so."""

    def __init__(self, mode: str, seconds: float = DEFAULT_DEADLINE_S) -> None:
        self.mode = mode
        self.started = time.monotonic()
        self.code = EXIT_OK
        self.summary = "no verdict yet"
        self.timer: threading.Timer | None = None
        # (spool, entry) of a store write under way: spooled if the deadline cuts it short
        self.unsaved: tuple[str, dict[str, Any]] | None = None
        # what the site's own health check came to in this run (site_outcome), once known
        self.site: str | None = None
        self.limit(seconds)

    def limit(self, seconds: float) -> None:
        """(Re)arm the watchdog to fire `seconds` after the hook started."""
        import threading  # noqa: PLC0415 - already imported by the runner

        self.stop()
        self.ends = self.started + seconds
        self.seconds = seconds
        self.timer = threading.Timer(max(0.0, self.ends - time.monotonic()), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def left(self, reserve: float = 0.0) -> float:
        """Seconds left before the deadline, less `reserve`; never below zero."""
        return max(0.0, self.ends - time.monotonic() - reserve)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _fire(self) -> None:
        log(
            f"deadline of {self.seconds:g} s reached ({self.summary}): exiting {self.code}",
            self.mode,
        )
        if self.unsaved is not None:
            self._spool_unsaved(*self.unsaved)
        _finish(hook_status(self.code, self.site))

    def _spool_unsaved(self, spool: str, entry: dict[str, Any]) -> None:
        """The store write the deadline cut short goes to the spool, for the next run to record
        (the run carries its id: a write that landed after all is not recorded twice). Bounded
        too: the disk that hung the store may hang this write, and the hook must end."""
        import threading  # noqa: PLC0415 - already imported by the runner

        def write() -> None:
            try:
                state.spool(spool, entry)
                log("the cut-short run is spooled for the next run to record", self.mode)
            except OSError as exc:
                log(f"could not spool the cut-short run: {exc}", self.mode)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(SPOOL_AT_DEADLINE_S)


CHECK_HELP = """Usage: slurmhealth check [OPTIONS]

  Gather GPU, NVLink, InfiniBand, kernel-log and host facts (filesystems, memory, CPUs, the
  clock, processes, modules, network links, EDAC) once, run every check the node's expectations
  call for, and print a verdict per check.

  Exit 0 when every check is ok, warn or skip; 1 when any fails; 2 for usage or config errors;
  4 when none fails but a source could not be read (the kernel log, not being root): the
  answer is incomplete, and says which source and why.

Options:
  --node NAME          node name (default: $SLURMD_NODENAME, else the host name)
  --only AREA          only these areas: gpu, nvlink, ib, xid, mce, aer, fs, hw, time, ps,
                       modules, net, edac, nvme, bmc, imex, fmlog, site (repeat or
                       comma-separate)
  --json               print one JSON object instead of a table
  -q, --quiet          only the checks that did not pass (warn, fail, error) and the verdict
  --gpu-source SRC     nvml (default) or a snapshot file to replay
  --sysfs-root DIR     read DIR/class/infiniband (default /sys)
  --kmsg PATH          kernel log: /dev/kmsg (default) or a file of kmsg records/dmesg lines
  --host-root DIR      read the host's facts (mounts, memory, CPUs, processes, modules, links,
                       EDAC, NVMe, the BMC's device, the Fabric Manager log) under DIR
                       (DIR/proc, DIR/sys, ...; default /)
  --db PATH            node store (default $SLURMHEALTH_DB or /var/lib/slurmhealth/NODE.db)
  --no-db              keep no history and no baselines
  --record             record a replay (--gpu-source FILE, --sysfs-root, --kmsg,
                       --host-root) in the
                       store as the node's own run; without it a replay is a dry run that
                       reads and writes no store (its versions are never recorded)
  --config PATH        expectations (default $SLURMHEALTH_CONFIG or
                       /etc/slurmhealth/slurmhealth.toml)
  --metrics-file PATH  also write node_exporter textfile metrics there (docs/metrics.md)
  -h, --help           show this message

Example:
  slurmhealth check --only gpu,ib --json
  slurmhealth check --gpu-source node.json
  slurmhealth check --metrics-file /var/lib/prometheus/node-exporter/slurmhealth.prom
"""

_VALUED = (
    "--node",
    "--only",
    "--gpu-source",
    "--sysfs-root",
    "--kmsg",
    "--host-root",
    "--db",
    "--config",
    "--metrics-file",
)
_FLAGS = ("--json", "--no-db", "--record", "-q", "--quiet", "-h", "--help")
# What makes `check` a replay: facts from files, not from this node as it is now.
_REPLAY = ("--gpu-source", "--sysfs-root", "--kmsg", "--host-root")
_PASSED = ("ok", "skip")  # what --quiet leaves out


class UsageError(Exception):
    """A command line that cannot be run: one line for the user, exit 2."""


def log(message: str, mode: str = "check") -> None:
    """One line to stderr (slurmd's log for hooks) and to syslog."""
    import syslog  # noqa: PLC0415 - a C module, cheap; only when there is something to say

    # untrusted text reaches here too (config keys, store errors): one printable line
    line = clean(message.replace("\n", " | "), LOG_MAX)
    print(f"slurmhealth {mode}: {line}", file=sys.stderr)
    syslog.openlog("slurmhealth", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, f"{mode}: {line}")


def parse_args(
    argv: list[str], valued: tuple[str, ...] = _VALUED, flags: tuple[str, ...] = _FLAGS
) -> dict[str, Any]:
    """`--opt value`, `--opt=value` and flags; repeated options collect into lists."""
    opts: dict[str, Any] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in flags and not eq:
            opts[name] = True
        elif name in valued:
            if not eq:
                if not args:
                    raise UsageError(f"option {name} needs a value")
                value = args.pop(0)
            opts.setdefault(name, []).append(value)
        else:
            raise UsageError(f"no such option: {arg}{_closest(name, valued + flags)}")
    return opts


def _closest(name: str, known: tuple[str, ...]) -> str:
    """` (did you mean --json?)` for a mistyped option, as the click commands suggest one; ''
    when none is close. difflib loads only on this error path, never on a hook's."""
    if not name.startswith("-"):
        return ""
    import difflib  # noqa: PLC0415

    close = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], 3)
    if len(close) > 1:
        return f" (did you mean one of: {', '.join(close)}?)"
    return f" (did you mean {close[0]}?)" if close else ""


def _one(opts: dict[str, Any], name: str, default: str | None = None) -> str | None:
    values = opts.get(name)
    return values[-1] if values else default


def node_name(explicit: str | None = None) -> str:
    """The one place a node's name is worked out: the option, else $SLURMD_NODENAME (several
    slurmd may run on one host, `slurmd -N gpu01`), else the short host name."""
    name = explicit or os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    if not is_node_name(name):  # it names the store's file: never a path (`../x`) or a node set
        raise UsageError(f"not a node name: {clean(repr(name), 80)}")
    return name


def _areas(opts: dict[str, Any]) -> list[str] | None:
    if "--only" not in opts:
        return None
    areas = [a.strip() for v in opts["--only"] for a in v.split(",") if a.strip()]
    unknown = [a for a in areas if a not in checks.NAMES]
    if unknown:
        raise UsageError(f"unknown area {unknown[0]!r} (choose from {', '.join(checks.NAMES)})")
    return areas


def open_store(
    path: str, mode: str, busy_timeout: float | None = None, named: bool = False
) -> Store:
    """The node store, or None (logged) when it cannot be used: the verdict never depends on it.

    A corrupt file is moved aside and a new store started, so history resumes at once.
    `named`: the user named this file (`--db`): one that holds something else (not SQLite, or
    another program's database) is a UsageError and stays as it was, never moved or written.
    """
    from slurmhealth.core import store  # noqa: PLC0415 - sqlite3 only when a store is used

    busy = store.BUSY_TIMEOUT_S if busy_timeout is None else busy_timeout
    if named:
        _refuse_other_file(path, busy)
    try:
        return store.connect(path, busy)
    except store.StoreError as exc:
        if not exc.corrupt:
            log(f"store unusable, verdict stands: {exc}", mode)
            return None
        aside = store.move_aside(path)
        log(f"store corrupt, moved to {aside}, starting a new one: {exc}", mode)
    try:
        return store.connect(path, busy)
    except store.StoreError as exc:
        log(f"store unusable, verdict stands: {exc}", mode)
        return None


def _refuse_other_file(path: str, busy: float) -> None:
    """UsageError if `path` is a file with content that is not a slurmhealth store: a typo'd
    `--db ~/notes.txt` must not be renamed `.corrupt-...`, nor another program's database be
    given our tables. A file that is missing or empty (or a SQLite file with no table) becomes
    a new store; one of ours whose pages are damaged is still moved aside."""
    from slurmhealth.core import store  # noqa: PLC0415

    try:
        with open(path, "rb") as handle:
            head = handle.read(len(store.SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"--db {clean(path, 200)}: {exc.strerror}") from None
    if not head:
        return
    if head != store.SQLITE_HEADER:
        raise UsageError(f"--db {clean(path, 200)}: not a SQLite file: not a store, left as it is")
    try:
        store.connect(path, busy, existing=True).close()
    except store.StoreError as exc:
        if "another program's" in str(exc):
            raise UsageError(f"--db {clean(str(exc), 300)}") from None
        # anything else (locked, damaged, unsafe) is met and handled by open_store's connect


def load_config(path: str | None, conn: Store, mode: str = "check") -> config.Config:
    """The config, parsed from the store's cache while the file is unchanged.

    Parsing TOML (tomllib's import and the parse) is a large share of the hot path's budget
    (docs/benchmarks.md); the cache is keyed on the file's identity and this slurmhealth's version.
    """
    resolved = config.resolve_path(path)
    if resolved is None or conn is None:
        return config.load(resolved)
    from slurmhealth import __version__  # noqa: PLC0415
    from slurmhealth.core import store  # noqa: PLC0415

    try:
        st = os.stat(resolved)
    except OSError:
        return config.load(resolved)  # raises the clear error
    stamp = [st.st_mtime_ns, st.st_size, st.st_ino, __version__]
    key = _config_key(resolved)
    try:
        cached = store.get_meta(conn, key)
    except Exception:  # a store that reads badly must not cost the config
        cached = None
    if isinstance(cached, dict) and cached.get("stamp") == stamp:
        return config.Config(cached["data"], resolved)
    loaded = config.load(resolved)
    try:
        store.set_meta(conn, key, {"stamp": stamp, "data": loaded.data})
    except Exception as exc:
        log(f"could not cache the config: {exc}", mode)
        _wait_less(conn)
    return loaded


def _config_key(path: str) -> str:
    """Where load_config caches a config file's parse in the store's meta table."""
    return f"config:{os.path.abspath(path)}"


def record(
    conn: Store,
    run: Recordable,
    mode: str,
    job_id: str | None = None,
    path: str = "",
    clock: Deadline | None = None,
    **kw: Any,  # record_run's: job, job_baselines
) -> Store:
    """Record a run; returns the connection to go on with. If the store cannot take it (locked
    past the busy timeout, unusable), the run goes to the spool beside it, replayed by the next
    run that can write the store, and its verdict goes to syslog at once: nothing recorded is
    lost. A store found damaged past its header only now is moved aside like a corrupt one, and
    the run recorded in a new store. A write still under way at the hook's deadline (a hung
    disk) is spooled by the watchdog (`clock`)."""
    from slurmhealth.core import store  # noqa: PLC0415 - loaded already where a store is open

    records = run.records(job_id)
    # the spooled copy and the store's are one run, replayed once, whatever path it takes
    records["run"]["id"] = store.new_id()
    if conn is not None:
        if clock is not None and path:
            clock.unsaved = (spool_for(path), {"records": records, "kw": kw})
        try:
            store.record_run(conn, records, **kw)
            return _saved(conn, clock)
        except store.StoreError as exc:
            conn = _reopen_if_corrupt(conn, exc, path, mode)
            if conn is not None:
                try:
                    store.record_run(conn, records, **kw)
                    return _saved(conn, clock)
                except store.StoreError as again:
                    exc = again
            log(f"could not record the run, verdict stands: {exc}", mode)
            _wait_less(conn)
    failing = "; ".join(f"{r.check}: {r.message}" for r in run.results if r.status == FAIL)
    log(f"unrecorded run on {run.node}: {run.verdict} {failing}", mode)
    if path:
        try:
            state.spool(spool_for(path), {"records": records, "kw": kw})
        except OSError as exc:
            log(f"could not spool the run either: {exc}", mode)
    return _saved(conn, clock)


def _saved(conn: Store, clock: Deadline | None) -> Store:
    """The run is in the store or the spool: nothing left for the watchdog to spool."""
    if clock is not None:
        clock.unsaved = None
    return conn


def _wait_less(conn: Store) -> None:
    """The store kept us waiting once: the rest of this run waits 0.1 s per write, then spools
    (a lock held that long is an admin's shell or a prune, not a concurrent prolog)."""
    if conn is not None:
        try:
            conn.execute("PRAGMA busy_timeout = 100")
        except Exception:  # noqa: S110 - the connection is unusable: its writes will spool
            pass


def spool_for(path: str) -> str:
    """The spool of the store at `path`: the runs and actions it could not take."""
    return path + SPOOL_SUFFIX


def _reopen_if_corrupt(conn: sqlite3.Connection, exc: Exception, path: str, mode: str) -> Store:
    """The store's file is damaged (not merely locked or full): move it aside, start a new one
    (None when that fails too; the caller spools). Otherwise the same connection."""
    from slurmhealth.core import store  # noqa: PLC0415

    if not getattr(exc, "corrupt", False) or not path:
        return conn
    try:
        conn.close()
    except Exception:  # noqa: S110 - closing a damaged store may fail too; it is moved aside
        pass
    aside = store.move_aside(path)
    log(f"store damaged, moved to {aside}, starting a new one: {exc}", mode)
    return open_store(path, mode, HOOK_BUSY_S)


def replay_spool(conn: Store, spool: str, mode: str) -> None:
    """Record the runs earlier runs could not, oldest first; on a failure, give the rest back
    in place, still first in line (the store is busy again: the next run tries). An entry that
    can never be recorded (damaged: not the shape a run of ours writes) is dropped, loudly:
    kept, it would fail every replay after it and fill the spool."""
    if conn is None or not spool:
        return
    entries, taken = state.take_spool(spool)
    if not entries and not taken:
        return
    from slurmhealth.core import store  # noqa: PLC0415

    for n, entry in enumerate(entries):
        kw = entry["kw"] if isinstance(entry.get("kw"), dict) else {}
        try:
            if "action" in entry:
                given = entry.get("id") if isinstance(entry.get("id"), str) else None
                # mypy takes a spread of unknown length to reach action_id as well
                store.record_action(conn, *entry["action"], action_id=given)  # type: ignore[misc]
            else:
                store.record_run(conn, entry["records"], **kw)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            log(f"dropped a damaged spooled entry: {type(exc).__name__}: {exc}", mode)
        except store.StoreError as exc:
            if exc.bad_record:
                log(f"dropped a spooled entry the store refuses: {exc}", mode)
                continue
            log(f"could not replay spooled runs, kept for the next run: {exc}", mode)
            _wait_less(conn)
            # not appended to the spool: after newer runs, a prolog would replay after its
            # epilog and leave its job "running" for good
            state.release(taken, entries[n:])
            return
    state.finish(taken)


def format_table(
    run: runner.Run, quiet: bool = False, unread: tuple[dict[str, Any], ...] = ()
) -> str:
    """The verdict per check; quiet: only those that did not pass (no header when none).
    unread: the sources that could not be read (_unread): the verdict says it is incomplete."""
    results = [r for r in run.results if not quiet or r.status not in _PASSED]
    width = max([len(r.check) for r in results] + [5])
    lines = [f"{'CHECK':<{width}}  STATUS  MESSAGE"] if results else []
    for r in results:
        lines.append(f"{r.check:<{width}}  {r.status:<6}  {r.message}")
    said = f", incomplete: {' and '.join(u['source'] for u in unread)} not read" if unread else ""
    lines.append(f"node {clean(run.node, 80)}: {run.verdict}{said} ({run.duration * 1000:.0f} ms)")
    return "\n".join(lines)


def check(argv: list[str]) -> int:
    opts = parse_args(argv)
    if opts.get("-h") or opts.get("--help"):
        print(CHECK_HELP, end="")
        return EXIT_OK
    areas = _areas(opts)
    _named_paths_exist(opts)
    node = node_name(_one(opts, "--node"))
    conn = None
    replay = _replay(opts)
    if opts.get("--record") and (opts.get("--no-db") or not replay):
        raise UsageError(
            "--record records a replay (--gpu-source FILE, --sysfs-root, --kmsg, --host-root)"
        )
    stored = not opts.get("--no-db") and (not replay or opts.get("--record"))
    if replay and not stored and not opts.get("--no-db"):
        # a dry run: its verdict must never become the node's history, evidence or versions
        print(
            "slurmhealth check: a replay: nothing read from or written to the node's store "
            "(--record records it)",
            file=sys.stderr,
        )
    if stored:
        from slurmhealth.core import store  # noqa: PLC0415

        path = _one(opts, "--db") or store.default_path(node)
        stored = store_writable(path, named=_one(opts, "--db") is not None)
    if stored:
        conn = open_store(path, "check", named=_one(opts, "--db") is not None)
        replay_spool(conn, spool_for(path), "check")
    expect = load_config(_one(opts, "--config"), conn).for_node(node)
    baselines = _baselines(conn, node, "", "check")
    own = None if replay else _own_expectations(_one(opts, "--config"), conn, expect, baselines)
    options = sources.Options(
        gpu_source=_one(opts, "--gpu-source", "nvml") or "nvml",
        sysfs_root=_one(opts, "--sysfs-root"),
        kmsg=_one(opts, "--kmsg"),
        kmsg_after=baselines.get("xid"),
        host_root=_one(opts, "--host-root"),
        site_program=None if replay else site_program(expect["settings"]),
    )
    if areas is None or "xid" in areas:
        baselines = _with_history(conn, node, baselines, expect, "check")
    baselines = _with_open_jobs(conn, node, "", baselines, "check")
    run = runner.run(node, expect, options, areas, "check", baselines)
    _learn(run, baselines, own)
    if replay:
        run.record_versions = False  # a file's driver and firmware are not this node's
    if stored:
        conn = record(conn, run, "check", path=path)
    write_metrics(_one(opts, "--metrics-file"), run, None, "check")
    unread = _unread(run)
    code = EXIT_FAIL if run.verdict == FAIL else EXIT_INCOMPLETE if unread else EXIT_OK
    quiet = bool(opts.get("-q") or opts.get("--quiet"))
    doc = dict(run.to_dict(), incomplete=unread)
    if quiet:
        doc["results"] = [r for r in doc["results"] if r["status"] not in _PASSED]
    for source in unread:
        what = f"{source['source']}: {source['message']}: the {', '.join(source['areas'])} checks"
        print(f"slurmhealth check: {what} did not run, the answer is incomplete", file=sys.stderr)
    try:
        table = format_table(run, quiet, tuple(unread))
        print(json.dumps(doc, indent=1) if opts.get("--json") else table)
        if sys.stdout is not None:  # None: started with stdout closed; the verdict is the code
            sys.stdout.flush()
    except BrokenPipeError:  # `check --json | head -1`: the reader has all it wanted
        _silence_stdout()
    return code


def site_program(settings: Data) -> str | None:
    """The site's own health check to run and record (sources/site.py): settings.
    site_healthcheck, else $SLURMHEALTH_SITE_HEALTHCHECK (the packaged hook's env file sets
    it); None: none."""
    chosen = settings.get("site_healthcheck") or os.environ.get("SLURMHEALTH_SITE_HEALTHCHECK")
    return str(chosen) if chosen else None


def site_outcome(run: runner.Run) -> str | None:
    """What the site's own health check came to in `run`: "ok" (it passed), "sick" (it failed,
    could not run, or timed out), or None where this run did not run it (none configured, a
    job hook), so the packaged hook runs it itself."""
    got = run.sources.get("site")
    if got is None or got.status not in ("ok", "timeout"):
        return None
    judged = [r for r in run.results if r.check.startswith("site.")]
    return "ok" if judged and all(r.status == OK for r in judged) else "sick"


def _replay(opts: dict[str, Any]) -> bool:
    """True when facts come from files (a snapshot, a sysfs tree, a kernel log)."""
    return any(
        _one(opts, name) not in (None, "nvml") if name == "--gpu-source" else name in opts
        for name in _REPLAY
    )


def _unread(run: runner.Run) -> list[dict[str, Any]]:
    """The sources this run could not read though the node has them (runner.unread)."""
    return runner.unread(run.sources)


def store_writable(path: str, named: bool, mode: str = "check") -> bool:
    """Whether `check` (or `diagnose`: `mode`) may keep its run in the store at `path`. A user
    who may not write it (not root: the state directory is root's) is told once and the run
    goes on unrecorded, its verdict whole; a store named with --db is then a usage error."""
    denied = _unwritable(path)
    if denied is None:
        return True
    said = f"cannot write {clean(denied, 200)} (permission denied)"
    if named:
        raise UsageError(f"--db {clean(path, 200)}: {said}")
    why = "the node's store is root's" + ("; --no-db keeps none" if mode == "check" else "")
    print(f"slurmhealth {mode}: {said}: this run is not recorded ({why})", file=sys.stderr)
    return False


def _unwritable(path: str) -> str | None:
    """The store file, or the directory on its way, that this user may not write: None for
    root, or with nothing in the way (any other problem is open_store's to say)."""
    if os.geteuid() == 0:
        return None
    target = probe = os.path.abspath(path)
    while not os.path.exists(probe):  # missing, or in a directory this user may not enter
        if os.path.dirname(probe) == probe:
            return None
        probe = os.path.dirname(probe)
    wanted = os.R_OK | os.W_OK if probe == target else os.W_OK | os.X_OK
    return None if os.access(probe, wanted) else probe


def _absent(path: str) -> bool:
    """No such file: not merely hidden in a directory this user may not enter."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:  # there, or in a directory this user may not enter: said where it is read
        return False
    return False


def _named_paths_exist(opts: dict[str, Any]) -> None:
    """A path the admin names must exist: a typo must not read as "no InfiniBand, no Xids"; a
    store's directory too (the store is made, never its directory)."""
    root, kmsg, db = _one(opts, "--sysfs-root"), _one(opts, "--kmsg"), _one(opts, "--db")
    if root is not None and not os.path.isdir(root):
        raise UsageError(f"--sysfs-root {root}: no such directory")
    host = _one(opts, "--host-root")
    if host is not None and not os.path.isdir(host):
        raise UsageError(f"--host-root {host}: no such directory")
    if kmsg is not None and _absent(kmsg):
        raise UsageError(f"--kmsg {kmsg}: no such file")
    named = "--db"
    if db is None and not opts.get("--no-db") and os.environ.get("SLURMHEALTH_DB"):
        named, db = "$SLURMHEALTH_DB", os.environ["SLURMHEALTH_DB"]  # --db's other spelling
    folder = os.path.dirname(os.path.abspath(db)) if db is not None else None
    if folder is not None and _absent(folder):
        raise UsageError(f"{named} {db}: no such directory: {folder}")
    if kmsg is not None and os.path.isdir(kmsg):
        raise UsageError(f"--kmsg {kmsg}: a directory, not a kernel log")
    if "--only" in opts and not _areas(opts):
        raise UsageError("--only names no area (choose from " + ", ".join(checks.NAMES) + ")")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the final flush cannot fail again (like other Unix tools,
    a closed pipe ends the output quietly)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# --- the hooks: prolog, epilog, healthcheck -------------------------------------------------


def _int_or_none(text: str | None) -> int | None:
    """A number slurmd passed, or None: not digits, or past what a store column holds."""
    if not text or not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


# A hook's CUDA_VISIBLE_DEVICES names at most this many devices, each at most this long (a MIG
# device id is `MIG-` and a UUID, or before driver 470.42.01 `MIG-GPU-<UUID>/<GI>/<CI>`).
VISIBLE_MAX, VISIBLE_ID_MAX = 64, 128


def job_env(env: Mapping[str, str]) -> dict[str, Any]:
    """What slurmd tells a prolog/epilog about the job (Slurm's Prolog and Epilog Guide).

    SLURM_JOB_EXIT_CODE is a raw wait status: 768 is `exit 3`, 9 is SIGKILL. `gpus`: Slurm's
    GPU indexes (SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES's numbers); `visible`: the ids of
    CUDA_VISIBLE_DEVICES, which for a MIG device slurmd gives as the device's id (Slurm's
    gres_common.c), mapped to its GPU once the GPUs are read (checks/gpu.py job_scope).
    """
    gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    ids = (env.get("CUDA_VISIBLE_DEVICES") or "").split(",")[:VISIBLE_MAX]
    job: dict[str, Any] = {
        "id": env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "",
        "uid": _int_or_none(env.get("SLURM_JOB_UID")),
        "user": env.get("SLURM_JOB_USER"),
        "gpus": [int(g) for g in gpus.split(",") if g.strip().isdigit()] or None,
        "visible": [i.strip()[:VISIBLE_ID_MAX] for i in ids if i.strip()] or None,
        "num_nodes": _int_or_none(env.get("SLURM_JOB_NUM_NODES")),
    }
    raw = env.get("SLURM_JOB_EXIT_CODE", "")
    if raw.lstrip("-").isdigit():
        status = int(raw)
        job["exit_code"] = (status >> 8) & 0xFF
        job["signal"] = status & 0x7F
    return job


def _node_faults(run: runner.Run) -> list[Result]:
    """What takes the node out of service (base.fails_node): the failing checks first, then a
    job hook's faults on GPUs its job does not hold."""
    return sorted((r for r in run.results if fails_node(r)), key=lambda r: r.status != FAIL)


def _failure_message(run: runner.Run) -> str:
    """The drain reason's words: the first failing check's message (a fault on GPUs the job
    does not hold drains too: base.job_verdict)."""
    failing = _node_faults(run)
    more = f" (+{counted(len(failing) - 1, 'more check')})" if len(failing) > 1 else ""
    return failing[0].message + more if failing else ""


def _needs_service(run: runner.Run) -> bool:
    """A failing check says the hardware needs service (a missing HCA, a row-remap failure, a
    fatal Xid come back): the reason says so first (`service: ...`), and such a drain is lifted
    by an admin, never by passing health checks (actions.may_resume)."""
    return any(r.action == SERVICE_ACTION for r in _node_faults(run))


def _others_only(run: runner.Run) -> list[int] | None:
    """The GPUs of a job hook's faults when they are all on GPUs its job does not hold (the
    job runs, the node drains), else None."""
    if any(r.status == FAIL for r in run.results):
        return None
    gpus = {g for r in run.results for g in other_gpus(r) or []}
    return sorted(gpus) or None


def metrics_path(settings: Data) -> str:
    """$SLURMHEALTH_METRICS_FILE (slurmhealth.env beside slurm.conf), else the config's."""
    return os.environ.get("SLURMHEALTH_METRICS_FILE") or settings["metrics_file"]


def write_metrics(path: str | None, run: Recordable, drain_outcome: str | None, mode: str) -> None:
    """The node's state for node_exporter, when configured. Never changes the verdict: any
    failure is one log line (our own bug included: the exit code must stay the checks')."""
    if not path:
        return
    try:
        from slurmhealth.node import metrics  # noqa: PLC0415 - only when metrics are on

        path = metrics.path_for(path, run.node)
        metrics.update(path, run, run.node, drain_outcome)
    except Exception as exc:
        log(f"could not write metrics to {path}, verdict stands: {exc}", mode)


def _hook_config(conn: Store, node: str, mode: str) -> Data:
    """The node's expectations. A config that cannot be read (not TOML, an unknown key or
    section, refused as untrusted) must neither gate jobs on expectations nobody wrote nor drop
    the ones the admin did (monitor-only, checks switched off): the hook runs with the last
    config this store parsed from the same file, loudly. With none known, with the built-in
    defaults in monitor-only mode: every verdict recorded, nothing enforced."""
    try:
        return load_config(None, conn, mode).for_node(node, mode)
    except config.ConfigError as exc:
        if exc.usable is not None:  # only some values are unusable: their defaults apply
            log(f"config values unusable, running with their defaults: {exc}", mode)
            return exc.usable.for_node(node, mode)
        last = _last_good_config(conn)
        if last is not None:
            log(f"config broken, running with the last one that worked: {exc}", mode)
            return last.for_node(node, mode)
        log(f"config broken and none known to work: built-in defaults, monitor-only: {exc}", mode)
        out = config.defaults(mode)
        out["settings"]["monitor_only"] = True
        return out


def _own_expectations(
    path: str | None, conn: Store, expect: Data, baselines: Baselines
) -> dict[str, Applied] | None:
    """With no config file and a store to remember in, the node's own known-good values are
    its expectations (node/learned.py): what was applied; None when not learning (a config
    file exists, even a broken one: the admin's word, not the node's, sets them)."""
    if conn is None or config.chosen_path(path) is not None:
        return None
    return learned.apply(expect, baselines.get(learned.BASELINE))


def _learn(run: runner.Run, baselines: Baselines, applied: dict[str, Applied] | None) -> None:
    """Failures of learned values say so; an area that passed updates what is learned (None:
    not learning)."""
    if applied is None:
        return
    learned.annotate(run.results, applied)
    doc = learned.learn(run.facts, run.results, baselines.get(learned.BASELINE), run.started)
    if doc is not None:
        run.baselines[learned.BASELINE] = doc


def _last_good_config(conn: Store) -> config.Config | None:
    """The config load_config last cached for the hooks' config file (by this version)."""
    if conn is None:
        return None
    from slurmhealth import __version__  # noqa: PLC0415
    from slurmhealth.core import store  # noqa: PLC0415

    chosen = os.environ.get("SLURMHEALTH_CONFIG") or config.DEFAULT_PATH
    try:
        cached = store.get_meta(conn, _config_key(chosen))
    except Exception:  # a store that reads badly: no last config, like a new node
        return None
    if not isinstance(cached, dict) or not isinstance(cached.get("data"), dict):
        return None
    stamp = cached.get("stamp")
    if not isinstance(stamp, list) or stamp[-1:] != [__version__]:
        return None  # parsed by another version: its shape may differ
    return config.Config(cached["data"], chosen)


# What the epilog takes of its job's prolog GPU baseline for the job's figures (`job_start`).
_JOB_START = ("taken_at", "energy", "below_base", "thermal", "samples", "inventory")


def _baselines(conn: Store, node: str, job_id: str, mode: str) -> Baselines:
    """Node baselines; the epilog takes counters (GPU, NVLink, IB) from its job's prolog, and
    the prolog's GPU readings for the job's figures (`job_start`: energy, time below base
    clocks, SM clock and utilisation sums; node/counters.py job_telemetry)."""
    if conn is None:
        return {}
    from slurmhealth.core import store  # noqa: PLC0415

    try:
        node_level: dict[str, Any] = store.load_baselines(conn, node)
        if mode != "epilog" or not job_id:
            return node_level
        job_level: dict[str, Any] = store.load_baselines(conn, node, job_id)
    except Exception as exc:
        log(f"could not read baselines: {exc}", mode)
        return {}
    merged = dict(node_level)
    for area in ("nvlink", "ib"):
        if area in job_level:
            merged[area] = job_level[area]
    if "gpu" in job_level:
        prolog = job_level["gpu"]
        merged["gpu"] = dict(
            node_level.get("gpu") or {},
            counters=prolog.get("counters"),
            job_start={k: prolog.get(k) for k in _JOB_START},
        )
    return merged


def _with_history(
    conn: Store, node: str, baselines: Baselines, expect: Data, mode: str
) -> Baselines:
    """The baselines with the node's recent Xid events as the xid area's "recent": one
    indexed read of the fatal ones and Xid 13, all that checks/xid.py's repeat rules use. No
    store, or a read that fails: none, and those rules do not fire."""
    window = checks.HOOKED["xid"].history_s(expect["xid"])
    if conn is None or window <= 0:
        return baselines
    from slurmhealth.core import store  # noqa: PLC0415

    try:
        since = time.time() - window
        rows = store.recent_events(conn, node, since, "xid", ("fail",), (13,))
    except Exception as exc:
        log(f"could not read recent events: {exc}", mode)
        return baselines
    return dict(baselines, xid=dict(baselines.get("xid") or {}, recent=rows))


def _with_memory(
    conn: Store, node: str, job_id: str, baselines: Baselines, expect: Data, mode: str
) -> tuple[Baselines, dict[str, Applied] | None]:
    """What the store remembers for a hook's checks: the baselines with the recent Xid events
    (_with_history) and the jobs still open on the node (_with_open_jobs); and, with no config
    file, the node's own expectations applied to `expect` (what was applied, else None)."""
    own = _own_expectations(None, conn, expect, baselines)
    baselines = _with_history(conn, node, baselines, expect, mode)
    return _with_open_jobs(conn, node, job_id, baselines, mode), own


def _booted_at() -> float:
    """When this node booted (the wall clock less the time since boot); 0 where unknown."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    try:
        return time.time() - time.clock_gettime(clock) if clock is not None else 0.0
    except OSError:
        return 0.0


def _with_open_jobs(
    conn: Store, node: str, job_id: str, baselines: Baselines, mode: str
) -> Baselines:
    """The baselines with the other jobs running on the node as the gpu area's `open_jobs`:
    those whose prolog ran here since the node booted and whose epilog has not. A GPU running
    processes is one of theirs, not a fault (checks/gpu.py processes): slurmd runs the health
    check on busy nodes too (HealthCheckNodeState=ANY), and a shared node starts a job while
    others run. No store, or a read that fails: None, not known."""
    jobs = None
    if conn is not None:
        from slurmhealth.core import store  # noqa: PLC0415

        try:
            found = store.open_jobs(conn, node, _booted_at())
            jobs = [j for j in found if j != job_id]
        except Exception as exc:
            log(f"could not read the running jobs: {exc}", mode)
    return dict(baselines, gpu=dict(baselines.get("gpu") or {}, open_jobs=jobs))


def _job_columns(
    mode: str, job: dict[str, Any], run: runner.Run, conn: Store
) -> dict[str, Any] | None:
    """The jobs row: the prolog opens it, the epilog closes it. A job whose prolog failed here
    never ran here: its epilog records the end but no exit status (the job ran elsewhere)."""
    if not job["id"] or mode not in ("prolog", "epilog"):
        return None
    out = {"uid": job["uid"], "user": job["user"]}
    if mode == "prolog":
        failed = run.verdict == FAIL
        state = "prolog_failed" if failed else "running"
        return dict(out, start=run.started, state=state, num_nodes=job["num_nodes"])
    out["end"] = run.started
    if run.job_telemetry:
        out["gpu_energy"] = json.dumps(run.job_telemetry, sort_keys=True)
        out["below_base"] = counters.below_share(run.job_telemetry)
    if _job_state(conn, run.node, job["id"]) != "prolog_failed":
        out["state"] = "ended"
        out.update({k: job[k] for k in ("exit_code", "signal") if k in job})
    return out


def _job_state(conn: Store, node: str, job_id: str) -> str | None:
    if conn is None:
        return None
    from slurmhealth.core import store  # noqa: PLC0415

    try:
        return store.job_state(conn, node, job_id)
    except Exception:
        return None


class HookJournal(Journal):
    """What a hook's run owns besides its facts: the node's store (`conn`, None when it cannot
    be used) and the spool beside it, the side state (node/state.py: the kernel-log position
    and a fault pending until a drain lands), the deadline, the log and who acts. Everything
    the run writes and every action it takes goes through here, so `hook()` reads top to
    bottom: gather and check, record, act."""

    def __init__(self, mode: str, node: str, clock: Deadline) -> None:
        from slurmhealth.core import store  # noqa: PLC0415

        self.mode, self.node, self.clock = mode, node, clock
        self.db_path = store.default_path(node)
        self.spool = spool_for(self.db_path)
        self.side_path = state.path_for(store.state_dir(), node)
        self.side = state.load(self.side_path)
        conn = open_store(self.db_path, mode, HOOK_BUSY_S)
        super().__init__(conn, f"slurmhealth {mode}", self._say, self._keep)

    def _say(self, text: str) -> None:
        log(text, self.mode)

    def _keep(self, entry: dict[str, Any]) -> None:
        """An action the store could not take: to the spool, replayed by a later run."""
        try:
            state.spool(self.spool, entry)
        except OSError as exc:
            self.say(f"could not spool the action either: {exc}")

    def replay(self) -> None:
        """Record what earlier runs could not (replay_spool)."""
        replay_spool(self.conn, self.spool, self.mode)

    def record(self, run: runner.Run, **kw: Any) -> None:
        """The run into the store, else the spool (record: nothing recorded is lost)."""
        self.conn = record(self.conn, run, self.mode, path=self.db_path, clock=self.clock, **kw)

    def save_side(
        self,
        run: runner.Run,
        message: str,
        pending: dict[str, Any] | None,
        service: bool = False,
        gpus: list[int] | None = None,
        action: str = "",
    ) -> None:
        """The kernel-log position this run read up to, and the fault to act on (or none);
        `gpus`: the GPUs the fault is on, where it drains without refusing the job (a job
        hook's fault on GPUs its job does not hold), so a later job hook carries it alike;
        `action`: the remediation its fault asks for (reset_gpu, reboot), if any."""
        side = self.side
        doc = dict(side)
        position = run.baselines.get("xid")
        if isinstance(position, dict) and isinstance(position.get("seq"), int):
            doc["kmsg"] = {"seq": position["seq"], "boot_id": position.get("boot_id")}
        if message:
            if pending:
                doc["pending"] = pending
            else:
                doc["pending"] = {"message": message, "since": run.started, "phase": self.mode}
                if service:
                    doc["pending"]["service"] = True
                if gpus:
                    doc["pending"]["gpus"] = list(gpus)
                if action:
                    doc["pending"]["action"] = action
        else:
            doc.pop("pending", None)
        if doc == side:
            return
        try:
            saved = state.update(self.side_path, side, doc)  # merged with a concurrent hook's
            side.clear()
            side.update(saved)
        except OSError as exc:
            self.say(f"could not save the node's side state {self.side_path}: {exc}")

    def slurm_client(self, settings: Data) -> slurm.Slurm:
        """Slurm for the failure path: each call bounded by settings.drain_timeout (a slow
        controller answers each in time), all of them together by what is left of the run's
        deadline (slurmd is never held past it)."""
        from slurmhealth.core import slurm  # noqa: PLC0415

        left = self.clock.left(RESERVE_S)
        return slurm.Slurm(settings["slurm_bin"], settings["drain_timeout"], left)

    def drain(self, reason: str, settings: Data) -> str:
        """Drain this node through actions.drain (owned reasons, breaker, probation, recorded):
        its outcome. A health check does not record a skip (a drained node's every check). A
        node out only until its slurmd registers (the health check at slurmd's start, after a
        reboot) is drained too, or its fault held pending (actions.drain, `rejoining`)."""
        from slurmhealth.node import actions  # noqa: PLC0415 - failure path only

        client = self.slurm_client(settings)
        record_skip = self.mode != HEALTHCHECK
        return actions.drain(
            client, self.node, reason, settings, self, record_skip, rejoining=True
        )

    def would(self, reason: str) -> None:
        """Monitor-only: say and record what enforcing would have done."""
        if not reason:
            return
        from slurmhealth.core import slurm  # noqa: PLC0415

        why = slurm.reason(reason)
        self.say(f"monitor-only: would drain {self.node}: {why}")
        self.note(self.node, ACT_WOULD_DRAIN, why, True)

    def resume(self, settings: Data, run: runner.Run | None = None) -> None:
        """Resume our own drain after `resume_after` consecutive passing health checks; a node
        on the remediation ladder takes its step instead (reset on an empty node, a reboot
        done, a diagnosis passed: node/ladder.py)."""
        from slurmhealth.node import actions  # noqa: PLC0415

        client = self.slurm_client(settings)
        actions.resume_if_due(
            client, self.node, settings, self, lambda: self._ladder(client, settings, run)
        )

    def remediate(self, message: str, wanted: str, settings: Data, run: runner.Run) -> None:
        """Take the ladder's next step after a failing run's drain (node/ladder.py); the GPUs
        of a reset kept in the side state for the health check that finds the node empty. A
        step Slurm did not take is said: the node stays drained, the next run goes on."""
        from slurmhealth.core import slurm  # noqa: PLC0415
        from slurmhealth.node import ladder  # noqa: PLC0415

        if wanted == RESET:
            faults = [r for r in _node_faults(run) if r.action == RESET_GPU]
            self.save_remediation({"gpus": ladder.gpus_of([dict(r.data) for r in faults])})
        try:
            self._ladder(self.slurm_client(settings), settings, run).after_drain(message, wanted)
        except slurm.SlurmError as exc:
            self.say(f"remediation of {self.node} not taken further now, it stays drained: {exc}")
            if wanted != RESET:  # a reboot, asked again by the next run (node/ladder.py)
                why = slurm.reason(f"{wanted} {message}")
                self.note(self.node, ACT_REBOOT, why, False, f"failed: {exc}", once=True)

    def _ladder(self, client: slurm.Slurm, settings: Data, run: runner.Run | None) -> Ladder:
        """The ladder's steps for this node: resets within this hook's deadline (the health
        check only: the one hook that runs on an empty node), of the fault's GPUs, else every
        GPU the run saw."""
        from slurmhealth.node import ladder  # noqa: PLC0415

        saved = self.side.get("remediation")
        gpus = saved.get("gpus") if isinstance(saved, dict) else None
        if not (isinstance(gpus, list) and gpus and all(isinstance(g, int) for g in gpus)):
            gpus = _gpu_indexes(run)
        reset = None
        if self.mode == HEALTHCHECK:
            reset = lambda indexes: self.reset_gpus(indexes, settings, record=False)  # noqa: E731
        return ladder.Ladder(client, self.node, settings, self, reset, gpus)

    def save_remediation(self, doc: dict[str, Any] | None) -> None:
        """The side state's `remediation` (the GPUs a reset is for), saved merged."""
        side = self.side
        wanted = dict(side)
        if doc:
            wanted["remediation"] = doc
        else:
            wanted.pop("remediation", None)
        if wanted == side:
            return
        try:
            saved = state.update(self.side_path, side, wanted)
            side.clear()
            side.update(saved)
        except OSError as exc:
            self.say(f"could not save the node's side state {self.side_path}: {exc}")

    def reset_gpus(self, indexes: list[int], settings: Data, record: bool = True) -> list[int]:
        """Reset each GPU with nvidia-smi (epilog, GPU idle; the ladder's reset on an empty
        node: `record` False, it records the step itself); returns those whose reset failed."""
        import subprocess  # noqa: PLC0415 - rare path

        failed = []
        for index in indexes:
            argv = [settings["nvidia_smi"], "-r", "-i", str(index)]
            try:
                limit = max(0.1, min(60.0, self.clock.left(RESERVE_S)))
                proc = subprocess.run(
                    argv, capture_output=True, text=True, timeout=limit, check=False
                )
                ok, detail = proc.returncode == 0, (proc.stdout + proc.stderr).strip()[:200]
            except (OSError, subprocess.TimeoutExpired) as exc:
                ok, detail = False, str(exc)
            if not ok:
                failed.append(index)
                if not record:
                    self.say(f"GPU {index} reset failed: {clean(detail, 200)}")
            if record:
                self.note(self.node, ACT_RESET_GPU, f"GPU {index}", ok, detail)
        return failed


def _gpu_indexes(run: runner.Run | None) -> list[int]:
    """Every GPU index the run's GPU facts list ([] without a run or GPU facts)."""
    devices = ((run.facts.get("gpu") or {}).get("devices") or []) if run is not None else []
    return [d["index"] for d in devices if isinstance(d, dict) and isinstance(d.get("index"), int)]


def refusal(verdict: str, outcome: str | None) -> int:
    """The hook's exit code, the one place a job is refused: only a failing check whose node
    is out of service now (our drain landed, or it was out already). Until then the fault is
    pending and the next run drains: slurmd drains a node whose prolog or epilog fails,
    whatever the circuit breaker says, so an exit 1 on every node of a fleet-wide fault (the
    controller not taking updates, a bug of ours in the drain path) would empty the cluster
    past it. BREAKER, HELD, REBOOTING, FAILED: fail open (actions.drain logged and recorded it)."""
    return EXIT_FAIL if verdict == FAIL and outcome in (DRAINED, SKIPPED) else EXIT_OK


def hook(mode: str, clock: Deadline) -> int:
    """Prolog, epilog or health check: gather and check, record, act (drain on a failing
    check). Exit 1 only on a failing check whose node is out of service (refusal): slurmd then
    requeues the job / drains the node.

    Order matters: the kernel-log position and a fault to act on are saved in the side state
    (node/state.py) before the store is written or Slurm is called, so neither a locked or lost
    store nor a failed drain can lose them; a pending fault is acted on again by every run
    until a drain lands."""
    node = node_name()
    no_job = {"id": "", "gpus": None, "visible": None}
    job = job_env(dict(os.environ)) if mode != HEALTHCHECK else no_job
    journal = HookJournal(mode, node, clock)
    expect = _hook_config(journal.conn, node, mode)
    settings = expect["settings"]
    clock.limit(runner.deadline_for(settings, mode, site_program(settings)))
    monitor = bool(settings.get("monitor_only"))
    # gather and check
    run, pending = _gather_and_check(journal, job, expect, monitor)
    clock.site = site_outcome(run)
    # record: the side state first, then the store
    clock.code = EXIT_OK  # nothing is refused until our drain lands (refusal)
    message, service = _failure_message(run), _needs_service(run)
    clock.summary = f"verdict {run.verdict}" + (f": {message}" if message else "")
    others = _others_only(run)
    if others and message:
        _say_others(journal, message, others, monitor)
    remedy = _ladder_action(run) if message else ""
    journal.save_side(run, "" if monitor else message, pending, service, others, remedy)
    journal.record(
        run,
        job_id=job["id"] or None,
        job=_job_columns(mode, job, run, journal.conn),
        job_baselines=mode == "prolog",
    )
    if mode == EPILOG:
        message = _epilog(journal, run, job, settings, monitor, message, pending)
    # act
    return _act(journal, run, settings, monitor, (message, service, remedy), pending)


def _say_others(journal: HookJournal, message: str, gpus: list[int], monitor: bool) -> None:
    """Log that the fault is on GPUs the job does not hold: the job runs, the node drains."""
    drains = "would drain" if monitor else "drains"
    names = ", ".join(str(g) for g in gpus)
    journal.say(f"{message}: GPU {names} not the job's: the job runs, the fault {drains} the node")


def _gather_and_check(
    journal: HookJournal, job: dict[str, Any], expect: Data, monitor: bool
) -> tuple[runner.Run, dict[str, Any] | None]:
    """The run, with a fault still pending from an earlier run carried into it (unless
    monitor-only): (run, the pending fault or None)."""
    conn, node, mode = journal.conn, journal.node, journal.mode
    settings = expect["settings"]
    baselines = _baselines(conn, node, job["id"], mode)
    options = sources.Options(
        gpu_source=settings["gpu_source"],
        sysfs_root=settings["sysfs_root"],
        kmsg=settings["kmsg"],
        host_root=settings["host_root"],
        kmsg_after=_kmsg_after(journal.side, baselines),
        exiting=True,  # the hook ends right after: NVML's teardown is left to the exit
        costly=mode == HEALTHCHECK,  # the job hooks leave the dear settings to the health check
        site_program=site_program(settings) if mode == HEALTHCHECK else None,
    )
    journal.replay()
    baselines, own = _with_memory(conn, node, job["id"], baselines, expect, mode)
    left = journal.clock.left()
    run = runner.run(
        node, expect, options, None, mode, baselines, job["gpus"], left, job["visible"]
    )
    _learn(run, baselines, own)
    pending = None if monitor else state.pending(journal.side)
    if pending and not any(r.message == pending["message"] for r in run.results):
        run.carry(_pending_result(pending, run))
    return run, pending


def _epilog(
    journal: HookJournal,
    run: runner.Run,
    job: dict[str, Any],
    settings: Data,
    monitor: bool,
    message: str,
    pending: dict[str, Any] | None,
) -> str:
    """After the job: its Xids attributed to it, its baselines dropped; idle GPUs that need a
    reset reset where allowed. The drain reason, if any is left."""
    conn = journal.conn
    if conn is not None and job["id"]:
        from slurmhealth.core import store  # noqa: PLC0415

        try:
            store.attribute_events(conn, run.node, job["id"], run.job_gpus)
            store.forget_job_baselines(conn, run.node, job["id"])
        except Exception as exc:
            journal.say(f"could not attribute the job's Xids: {exc}")
    if message:
        return message
    message = _epilog_reset(journal, run, settings, monitor)
    if message and not monitor:
        journal.save_side(run, message, pending)
    return message


def _act(
    journal: HookJournal,
    run: runner.Run,
    settings: Data,
    monitor: bool,
    fault: tuple[str, bool, str],
    pending: dict[str, Any] | None,
) -> int:
    """Drain on a failing check (monitor-only: say and record that it would), and take the
    remediation its fault asks for (node/ladder.py); resume our own drain after enough passing
    health checks; the exit code (refusal). `fault`: its message ("" for none), whether it
    needs service, and the remediation its action hint asks for ("" for none)."""
    message, service, remedy = fault
    reason = (f"{SERVICE} " if service else "") + message if message else ""
    wanted = _rung(remedy, settings, service) if message else None
    if wanted is not None:
        from slurmhealth.node import ladder  # noqa: PLC0415 - failure path only

        reason = ladder.first_reason(journal, journal.node, message, wanted, settings)[0]
    path = metrics_path(settings)
    if monitor:
        journal.would(reason)
        if wanted is not None:
            ladder.would(journal, journal.node, wanted, reason)
        write_metrics(path, run, WOULD_DRAIN if message else None, journal.mode)
        return EXIT_OK  # monitor-only: everything recorded, nothing enforced
    outcome = journal.drain(reason, settings) if message else None
    code = journal.clock.code = refusal(run.verdict, outcome)
    if outcome in (DRAINED, SKIPPED, BREAKER) and (pending or message):
        # Acted on: drained, already out, or judged by the breaker (a fleet-wide fault: the
        # refusal is recorded, and the node must not be drained later for it). A drain that
        # failed, or one held (the fleet could not be counted, or a reboot's registration
        # would lift it), stays pending.
        journal.save_side(run, "", None)
    if wanted is not None and outcome in (DRAINED, SKIPPED):
        journal.remediate(message, wanted, settings, run)
    write_metrics(path, run, outcome, journal.mode)
    if code == EXIT_OK and not message and journal.mode == HEALTHCHECK:
        journal.resume(settings, run)
    return code


def _ladder_action(run: runner.Run) -> str:
    """The remediation the node's faults ask for by their action hints: reset_gpu or reboot
    (the worst), "" for none."""
    action = worst_action(r.action for r in _node_faults(run))
    return action if action in (RESET_GPU, REBOOT_ACTION) else ""


def _rung(remedy: str, settings: Data, service: bool) -> str | None:
    """The ladder's rung for a fault (node/ladder.py rung_for), None where the ladder has no
    part: settings.remediate off (the default: nothing imported), no remediation asked for,
    or hardware that needs service whatever else its faults ask."""
    if not remedy or service or settings["remediate"] == "off":
        return None
    from slurmhealth.node import ladder  # noqa: PLC0415 - failure path only

    return ladder.rung_for(remedy, settings["remediate"])


def _kmsg_after(side: dict[str, Any], baselines: Baselines) -> Mapping[str, object] | None:
    """Where to resume reading the kernel log: the later of the side state's position and the
    store's baseline on the same boot (either may lag: a store lost or locked, a run killed
    between its two writes)."""
    saved, stored = state.kmsg_position(side), baselines.get("xid")
    if not isinstance(stored, dict) or not isinstance(stored.get("seq"), int):
        return saved
    if saved is None or saved.get("boot_id") != stored.get("boot_id"):
        return saved or stored
    return saved if saved["seq"] >= stored["seq"] else stored


def _pending_result(pending: dict[str, Any], run: runner.Run) -> Result:
    """The pending fault as a failing result; in a job hook, a fault only on GPUs the job does
    not hold (its `gpus`) drains without refusing the job, as when it was first seen."""
    from slurmhealth.core.result import fail  # noqa: PLC0415

    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pending.get("since") or 0))
    asked = pending.get("action")
    action = asked if isinstance(asked, str) and asked in (RESET_GPU, REBOOT_ACTION) else DRAIN
    result = fail(
        f"{pending['message']} (pending since {since}: not yet acted on)",
        {"pending": pending},
        SERVICE_ACTION if pending.get("service") else action,
    )
    result.check = PENDING_CHECK
    gpus, job = pending.get("gpus"), run.job_gpus
    if run.phase in ("prolog", "epilog") and job is not None and isinstance(gpus, list):
        theirs = [g for g in gpus if isinstance(g, int)]
        if theirs and not set(theirs) & set(job):
            return demoted(result, job, theirs)
    return result


def _epilog_reset(
    journal: HookJournal, run: runner.Run, settings: Data, monitor: bool
) -> str:
    """Reset idle GPUs that need it when allowed; otherwise (or if that fails) a drain reason.
    Monitor-only resets nothing: the reason is reported as a would-be drain. With the job's GPUs
    known, only those: another job's GPU, idle between its steps, is its own epilog's."""
    indexes = run.resets
    if run.job_gpus is not None:
        indexes = [i for i in indexes if i in run.job_gpus]
    if not indexes:
        return ""
    if (settings["reset_gpus"] or settings["remediate"] != "off") and not monitor:
        indexes = journal.reset_gpus(indexes, settings)
        if not indexes:
            return ""
    needing = [r.message for r in run.results if r.action == RESET_GPU and r.status != OK]
    return needing[0] if needing else f"GPU {indexes[0]} needs a reset"


def _finish(code: int) -> None:
    """Exit now: a gather thread stuck in a C call (hung NVML) must not hold the process."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with that descriptor closed (`>&-`)
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say there
            pass
    os._exit(code)


HOOK_HELP = """Usage: slurmhealth {mode}

  Slurm's {what}: gather, check, record, and on a failing check drain the node with a
  reason that says what is wrong, then exit 1. Takes no options: settings come from
  /etc/slurmhealth/slurmhealth.toml ($SLURMHEALTH_CONFIG) and slurmd's environment.
  Run `slurmhealth check` to see a node's verdicts without acting.
"""
_HOOK_WHAT = {
    "prolog": "prolog, run by slurmd before each job",
    "epilog": "epilog, run by slurmd after each job",
    "healthcheck": "HealthCheckProgram, run by slurmd every HealthCheckInterval",
}


def run_check(argv: list[str]) -> int:
    """`slurmhealth check ARGS` -> exit code; a user's error is one line on stderr, exit 2."""
    try:
        return check(argv)
    except (UsageError, config.ConfigError, ValueError, OSError) as exc:
        lines = str(exc).splitlines() or [""]
        more = f" (+{counted(len(lines) - 1, 'more problem')})" if len(lines) > 1 else ""
        print(f"slurmhealth: error: {lines[0]}{more}", file=sys.stderr)
        return EXIT_USAGE


def run_hook(mode: str, argv: list[str]) -> int:
    """A hook as slurmd runs it (no arguments). Help never acts; any other argument is a usage
    error, so a typo in slurm.conf never gates jobs by accident."""
    if argv:
        if argv[0] in ("-h", "--help"):
            print(HOOK_HELP.format(mode=mode, what=_HOOK_WHAT[mode]), end="")
            return EXIT_OK
        print(f"slurmhealth: error: {mode} takes no arguments (got {argv[0]!r})", file=sys.stderr)
        return EXIT_USAGE
    clock = Deadline(mode)
    try:
        return hook_status(hook(mode, clock), clock.site)
    except UsageError as exc:  # no node name to go by: nothing checked, nothing gated
        log(f"{exc} ($SLURMD_NODENAME, else the host name): nothing checked", mode)
        return EXIT_USAGE  # the packaged hook logs a status that is no verdict and lets the job run
    except Exception:  # our bug is not the node's fault: fail open, loudly
        import traceback  # noqa: PLC0415

        # ...unless the checks already failed: a bug after the verdict must not let a sick
        # node take the job (clock.code is the verdict's exit code once it is known).
        what = "job refused: the checks had failed" if clock.code else "job not gated"
        log(f"internal error, {what}: {traceback.format_exc()}", mode)
        return hook_status(clock.code, clock.site)
    finally:
        clock.stop()


def main(argv: list[str]) -> None:
    """`check` or a hook, then exit at once (see _finish). The entry point sends only these
    here; every other command goes to the click CLI."""
    mode, rest = argv[0], argv[1:]
    _finish(run_hook(mode, rest) if mode in HOOKS else run_check(rest))


def hook_status(code: int, site: str | None = None) -> int:
    """A hook's exit status: a refusal (EXIT_FAIL) is $SLURMHEALTH_REFUSE_STATUS where the hook
    script asks for one (10: it gives slurmd 1), so that no other failure (a broken install's
    traceback exits 1 too) can pass for a verdict and drain the node.

    Where the run ran the site's own health check (`site`: site_outcome) and the hook script
    asks with $SLURMHEALTH_SITE_STATUS (20), the status says both verdicts: that base, +1 for
    our refusal, +2 when the site's check failed; the script then does not run it again."""
    base = os.environ.get("SLURMHEALTH_SITE_STATUS", "")
    if site is not None and code in (EXIT_OK, EXIT_FAIL) and base.isdigit():
        if 2 < int(base) < 120:
            return int(base) + (code == EXIT_FAIL) + 2 * (site != OK)
    wanted = os.environ.get("SLURMHEALTH_REFUSE_STATUS", "")
    if code == EXIT_FAIL and wanted.isdigit() and 2 < int(wanted) < 126:
        return int(wanted)
    return code
