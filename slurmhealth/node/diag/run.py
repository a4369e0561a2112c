"""One diagnosis of this node: today's checks, then the level's probes; recorded as a `diag` run.

The run's results hold one row per probe (`diag.<probe>`: ok, fail or skip) whose data is every
outcome with its figures, so `history`, export and the report carry them like any run.
"""

from __future__ import annotations

import json
import time

from slurmhealth.core.constants import DIAG
from slurmhealth.core.result import FAIL, OK, SERVICE, SKIP, WARN, Result
from slurmhealth.node import runner
from slurmhealth.node.diag import probes

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.core.store import RunRecords, RunRow
    from slurmhealth.node.config import Data
    from slurmhealth.node.diag.probes import Summary
    from slurmhealth.node.sources import Options

PHASE = DIAG
INCONCLUSIVE = "inconclusive"
_STATUS = {probes.PASS: OK, FAIL: FAIL, SKIP: SKIP}


class Diagnosis:
    """What one diagnosis found: the level, each probe's outcomes, the verdict."""

    def __init__(
        self, node: str, level: str, check: runner.Run, found: list[Summary], seconds: float
    ) -> None:
        self.node, self.level, self.check, self.probes = node, level, check, found
        self.unread = runner.unread(check.sources)  # what today's checks could not read
        self.verdict = probes.verdict(found, self.unread)
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
    ctx = probes.Context(level, settings, check.facts, probes.tool_path(settings))
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
