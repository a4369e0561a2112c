"""The site's own health check (LBNL NHC, typically) as one check: its verdict in the history.

Facts from sources/site.py: the program's exit status and its last lines. The health check
runs it (PHASES), never a job hook, once per health check, in place of the packaged hook
running it beside slurmhealth (packaging/slurmhealth-hook).

NHC drains and resumes its nodes itself, with its own `NHC:` reasons (its README, "Slurm
Integration"), and goes on doing so when slurmhealth runs it. So its failure is `warn` here:
recorded, shown in the report, counted for lemons, and never a second drain by slurmhealth. A
program that could not be run or did not end within settings.timeout_site is `error`: the
site's check did not judge the node. The message is NHC's own failure line, `ERROR:  nhc:
Health check failed:  <check>:  <what>` (nhc's die()), else the program's last line.
"""

from __future__ import annotations

from slurmhealth.core.constants import CHECK, DIAG, HEALTHCHECK
from slurmhealth.core.result import ERROR, Result, ok, warn

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from slurmhealth.node.checks.base import Context, Facts, Schema

AREA = "site"
SOURCE = "site"
PHASES = (HEALTHCHECK, CHECK, DIAG)

DEFAULTS: Schema = {}

_FAILED = "Health check failed:"
_LINE_MAX = 300
_LINES_KEPT = 20


def parse(raw: object) -> Facts:
    """The source's record -> {program, name, status, timed_out, error, lines}."""
    raw = raw if isinstance(raw, dict) else {}
    path, status, given = raw.get("program"), raw.get("status"), raw.get("lines")
    program = path if isinstance(path, str) else ""
    lines = given if isinstance(given, list) else []
    return {
        "program": program[:_LINE_MAX],
        "name": program.rstrip("/").rsplit("/", 1)[-1][:40] or "program",
        "status": status if isinstance(status, int) and not isinstance(status, bool) else None,
        "timed_out": raw.get("timed_out") is True,
        "error": str(raw["error"])[:_LINE_MAX] if raw.get("error") else None,
        "lines": [str(x)[:_LINE_MAX] for x in lines[-_LINES_KEPT:]],
        "seconds": raw.get("seconds"),
    }


def failure_line(lines: list[str]) -> str:
    """What the program said was wrong: the text after NHC's "Health check failed:" on its
    last such line, else its last line."""
    for line in reversed(lines):
        if _FAILED in line:
            return line.split(_FAILED, 1)[1].strip()
    return lines[-1].strip() if lines else ""


def program(facts: Facts, ctx: Context) -> Result:
    """The site's health check (settings.site_healthcheck, e.g. NHC): a failure warns."""
    name, data = facts["name"], {k: facts[k] for k in ("program", "status", "lines")}
    if facts["error"]:
        return Result(ERROR, f"{name} could not run: {facts['error']}", data)
    if facts["timed_out"] or facts["status"] is None:
        return Result(ERROR, f"{name} did not end within settings.timeout_site: stopped", data)
    if facts["status"] == 0:
        return ok(f"{name} passed", data)
    said = failure_line(facts["lines"])
    return warn(f"{name} failed (exit {facts['status']})" + (f": {said}" if said else ""), data)


CHECKS = (program,)
