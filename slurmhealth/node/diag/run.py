"""One diagnosis of this node: today's checks, then the level's probes; recorded as a `diag` run.

The run's results hold one row per probe (`diag.<probe>`: ok, fail or skip) whose data is every
outcome with its figures, so `history`, export and the report carry them like any run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from slurmhealth.core.constants import DIAG
from slurmhealth.core.result import FAIL, OK, SERVICE, SKIP, WARN, Result
from slurmhealth.node import runner
from slurmhealth.node.diag import probes

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, Callable

    from slurmhealth.core.command import Console
    from slurmhealth.core.store import RunRecords, RunRow
    from slurmhealth.node.config import Data
    from slurmhealth.node.diag.probes import Summary
    from slurmhealth.node.sources import Options

    # Inside a diagnose job: (diagnosis, settings, store) -> the outcome of returning or
    # draining the node, one line (fleet/diagnose.py finish; the node side cannot import it).
    Finish = Callable[["Diagnosis", Data, Any], "str | None"]

PHASE = DIAG
EXIT_FAILED = 1
EXIT_INCONCLUSIVE = 4  # nothing ran that could pass the node: never 0
INCONCLUSIVE = "inconclusive"
_STATUS = {probes.PASS: OK, FAIL: FAIL, SKIP: SKIP}


class Diagnosis:
    """What one diagnosis found: the level, each probe's outcomes, the verdict."""

    def __init__(
        self, node: str, level: str, check: runner.Run, found: list[Summary], seconds: float
    ) -> None:
        self.node, self.level, self.check, self.probes = node, level, check, found
        self.unread = runner.unread(check.sources)  # what today's checks could not read
        self.verdict = probes.verdict(found, self.unread, level in probes.EVERY_PROBE)
        self.started = check.started
        self.duration = seconds
        # What node/metrics.py reads of a run: the probes as checks, the sources the quick
        # checks read; no Xid events or kernel-log position (the hooks count those).
        self.phase, self.sources = PHASE, check.sources
        self.events: list[dict[str, Any]] = []
        self.baselines: dict[str, Any] = {}
        self.readings = check.readings  # the quick checks' error counters
        self.results = [
            Result(_STATUS[p["status"]], _line(p), check=f"diag.{p['probe']}") for p in found
        ]

    @property
    def inconclusive(self) -> bool:
        """Nothing ran that could pass the node (recorded as a `warn` run): never OK, and a
        node is never returned on it."""
        return self.verdict == WARN

    @property
    def outcome(self) -> str:
        """ok, fail or inconclusive: what the table, --json and the exit code say."""
        return {OK: OK, FAIL: FAIL}.get(self.verdict, INCONCLUSIVE)

    def evidence(self) -> str:
        if self.inconclusive:
            return probes.skipped(self.probes, self.unread)
        return probes.evidence(self.probes)

    def records(self, job_id: str | None = None) -> RunRecords:
        """The run as core/store.record_run writes it (node/agent.py record)."""
        base = self.check.records(job_id)
        sources = json.loads(base["run"]["sources"])
        gpus = (self.check.facts.get("gpu") or {}).get("devices") or []
        models = sorted({str(g.get("name") or "") for g in gpus} - {""})
        sources["diag"] = {
            "level": self.level,
            "seconds": round(self.duration, 3),
            # the hardware class peers are compared within (fleet: slow nodes)
            "gpu_model": models[0] if len(models) == 1 else " + ".join(models),
            "gpus": len(gpus),
        }
        run: RunRow = {
            **base["run"],
            "phase": PHASE,
            "verdict": self.verdict,
            "duration": self.duration,
            "sources": json.dumps(sources),
        }
        results = [
            {
                "check_name": f"diag.{p['probe']}",
                "status": _STATUS[p["status"]],
                "message": _line(p),
                "action": SERVICE if p["status"] == FAIL else "none",
                "data": json.dumps({"level": self.level, "outcomes": p["outcomes"]}),
                "duration": p["seconds"],
            }
            for p in self.probes
        ]
        return {"run": run, "results": results, "events": base["events"], "baselines": {}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "level": self.level,
            "verdict": self.outcome,
            "duration": round(self.duration, 3),
            "probes": self.probes,
            "incomplete": self.unread,  # as `check --json` says it
        }


def _line(probe: Summary) -> str:
    """A probe's one-line message: its failures, else its passes, else why it skipped."""
    for wanted in (FAIL, probes.PASS, SKIP):
        chosen = [o for o in probe["outcomes"] if o["status"] == wanted]
        if chosen:
            head = "; ".join(
                (o["evidence"] if o["unit"] == "node" else f"{o['unit']}: {o['evidence']}")
                for o in chosen[:4]
            )
            more = f" (+{len(chosen) - 4} more)" if len(chosen) > 4 else ""
            return (head + more)[:200]
    return "no outcome"


def diagnose(
    node: str,
    level: str,
    expect: Data,
    options: Options,
    baselines: dict[str, Any] | None = None,
) -> Diagnosis:
    """Run the level on this node. Never raises for the node's state: a probe that breaks
    fails, one whose tool is absent skips."""
    names = probes.probes_of(level)  # ValueError for an unknown level, before anything runs
    started = time.monotonic()
    check = runner.run(node, expect, options, None, PHASE, baselines)
    unread = runner.unread(check.sources)
    checks = probes.checks_outcomes(check.results, unread)
    found = [probes.summary("checks", checks, check.duration)]
    settings = expect["settings"]
    ctx = probes.Context(level, settings, check.facts, probes.tool_path(settings), node)
    found.extend(probes.run_probe(name, ctx) for name in names)
    return Diagnosis(node, level, check, found, time.monotonic() - started)


def table(diag: Diagnosis) -> str:
    """Human-readable: one line per probe, then each failure."""
    lines = [f"{diag.node}: diagnose {diag.level}: {diag.outcome.upper()} ({diag.duration:.1f} s)"]
    for p in diag.probes:
        lines.append(f"  {p['probe']:<12} {p['status']:<5} {p['seconds']:7.1f} s  {_line(p)}")
    if diag.unread and diag.verdict != FAIL:
        said = " and ".join(u["source"] for u in diag.unread)
        lines.append(f"  inconclusive: {said} not read, some of today's checks did not run")
    elif diag.inconclusive:
        lines.append("  inconclusive: no probe of the level ran (install one: docs/diagnose.md)")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Request:
    """What one `slurmhealth diagnose` on a node is asked: the node, --level, --db, --config,
    where facts come from (None: the config's settings; any given makes a replay), --apply
    and --json."""

    node: str
    level: str = "medium"
    db: str | None = None
    config: str | None = None
    gpu_source: str | None = None
    sysfs_root: str | None = None
    kmsg: str | None = None
    host_root: str | None = None
    apply: bool = False
    as_json: bool = False

    @property
    def replay(self) -> bool:
        """Facts named on the command line rather than read from this node."""
        named = (self.sysfs_root, self.kmsg, self.host_root)
        return self.gpu_source not in (None, "nvml") or any(p is not None for p in named)


def local(request: Request, console: Console, finish: Finish | None = None) -> int:
    """`slurmhealth diagnose` on this node: diagnose, say each source not read, record the run
    (not for a replay unless --db names a store), write the metrics, with --apply `finish` it,
    print the table or JSON. The exit status: EXIT_FAILED, EXIT_INCONCLUSIVE or 0.
    CommandError with one line for what it refuses to start with (exit 2)."""
    from slurmhealth.core import store  # noqa: PLC0415
    from slurmhealth.core.command import CommandError  # noqa: PLC0415
    from slurmhealth.core.result import clean  # noqa: PLC0415
    from slurmhealth.node import agent, config  # noqa: PLC0415

    try:
        expect = config.load(request.config).for_node(request.node)
    except config.ConfigError as exc:
        raise CommandError(str(exc), status=2) from None
    options = _options(request, expect["settings"])
    if request.replay and request.apply:
        raise CommandError(
            "--apply acts on this node's own facts: not with --gpu-source FILE, --sysfs-root, "
            "--kmsg or --host-root (a replay)",
            usage=True,
        )
    store_path = request.db or store.default_path(request.node)
    conn, stored = _store(store_path, request, console)
    diagnosis = diagnose(request.node, request.level, expect, options)
    for source in diagnosis.unread:  # its message names the path: not trusted, cleaned
        said = clean(probes.not_read(source), 500)
        console.err(f"slurmhealth diagnose: {said}: the answer is incomplete")
    if stored:
        conn = agent.record(conn, diagnosis, "diagnose", path=store_path)
    settings = expect["settings"]
    agent.write_metrics(agent.metrics_path(settings) or None, diagnosis, None, "diagnose")
    applied = finish(diagnosis, settings, conn) if request.apply and finish else None
    if request.as_json:
        console.out(json.dumps(dict(diagnosis.to_dict(), applied=applied), indent=1))
    else:
        console.out(table(diagnosis))
        if applied:
            console.out(f"  -> {applied}")
    if diagnosis.verdict == "fail":
        return EXIT_FAILED
    return EXIT_INCONCLUSIVE if diagnosis.inconclusive else 0


def _options(request: Request, settings: Data) -> Options:
    """Where the facts come from: the command line's, else the config's settings. Paths named
    on the command line must exist and a snapshot must be one, as for `check`
    (node/agent.py): a typo must not read as "no InfiniBand, no Xids" and pass, nor end in a
    traceback. CommandError naming the option."""
    from slurmhealth.core.command import CommandError  # noqa: PLC0415
    from slurmhealth.node.sources import Options  # noqa: PLC0415

    options = Options(
        gpu_source=request.gpu_source or settings["gpu_source"],
        sysfs_root=request.sysfs_root or settings["sysfs_root"],
        kmsg=request.kmsg or settings["kmsg"],
        host_root=request.host_root,
    )
    for option, path in (("--sysfs-root", request.sysfs_root), ("--host-root", request.host_root)):
        if path is not None and not os.path.isdir(path):
            raise CommandError(f"{path}: no such directory", option=option)
    if request.kmsg is not None and not os.path.exists(request.kmsg):
        raise CommandError(f"{request.kmsg}: no such file", option="--kmsg")
    if options.gpu_source not in ("nvml", "", None):
        try:
            runner.load_snapshot(options.gpu_source)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc), option="--gpu-source") from None
    return options


def _store(path: str, request: Request, console: Console) -> tuple[Any, bool]:
    """(connection or None, whether to record) for a diagnosis: a replay keeps none unless a
    store is named (as for `check`: never the node's history or evidence); a user who may not
    write the node's store is told once and the run goes on unrecorded."""
    from slurmhealth.core.command import CommandError  # noqa: PLC0415
    from slurmhealth.node import agent  # noqa: PLC0415

    named = request.db is not None
    if request.replay and not named:
        console.err(
            "slurmhealth diagnose: a replay: nothing written to the node's store (--db FILE "
            "records it there)"
        )
        return None, False
    try:
        if not agent.store_writable(path, named, "diagnose"):
            return None, False
    except agent.UsageError as exc:  # a permission, not a usage: no "see --help"
        raise CommandError(str(exc), status=2) from None
    try:
        return agent.open_store(path, "diagnose", named=named), True
    except agent.UsageError as exc:
        raise CommandError(str(exc), usage=True) from None
