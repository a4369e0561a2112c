"""The site's own health check (LBNL NHC, typically), run once per health check, its verdict kept.

The `site` section of a snapshot (checks/site.py parse() judges it):

    {"program": "/usr/sbin/nhc", "status": 1, "timed_out": false, "error": null,
     "lines": ["ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted"],
     "seconds": 2.4}

The program comes from settings.site_healthcheck, or SLURMHEALTH_SITE_HEALTHCHECK, which the
packaged hook reads from its env file (packaging/slurmhealth-hook): an absolute path to an
executable file, run from an argv list with no arguments (never a shell), with the environment
this process has (slurmd's: NHC finds its resource manager and node name there, and keeps
draining and resuming with its own `NHC:` reasons), for at most settings.timeout_site seconds.
`status` is its exit status (None: it did not end or did not start), `lines` the last lines it
wrote, stdout then stderr; `error` says why it could not be run. None configured: the source
is unavailable and its check skips.
"""

from __future__ import annotations

import os

from slurmhealth.node.sources import Options, SourceUnavailable

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    Tree = dict[str, object]

DEFAULT_TIMEOUT_S = 40.0
LINES_KEPT = 20  # NHC's failure is its last line; the lines before it say what led there


def gather(options: Options) -> Tree:
    """The registry's entry: run the configured program within settings.timeout_site."""
    program = options.site_program
    if not program:
        raise SourceUnavailable("no site health check configured (settings.site_healthcheck)")
    from slurmhealth.node.sources import tools  # noqa: PLC0415 - health check only

    return run(program, tools.budget(options.timeouts.get("site", DEFAULT_TIMEOUT_S)))


def run(program: str, seconds: float) -> Tree:
    """Run `program` for at most `seconds`; never raises for the program's sake."""
    from slurmhealth.node.sources import tools  # noqa: PLC0415

    out: Tree = {"program": program, "status": None, "timed_out": False, "lines": []}
    out["error"] = unusable(program)
    if out["error"] is not None:
        return out
    ran = tools.run([program], seconds)
    lines = [ln for ln in (ran.stdout + "\n" + ran.stderr).splitlines() if ln.strip()]
    out.update(
        status=ran.status,
        timed_out=ran.timed_out,
        error=ran.error,
        lines=lines[-LINES_KEPT:],
        seconds=round(ran.seconds, 3),
    )
    return out


def unusable(program: str) -> str | None:
    """Why `program` cannot be run as the site's health check, else None."""
    if not os.path.isabs(program):
        return "not an absolute path"
    if not os.path.isfile(program) or not os.access(program, os.X_OK):
        return "not an executable file"
    return None
