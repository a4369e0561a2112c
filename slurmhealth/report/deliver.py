"""`slurmhealth report`: build the nightly report, render it in one format, write it (standard
output or a file of the mode asked) and mail it; what the command does beyond its options."""

from __future__ import annotations

import dataclasses
import sqlite3

from slurmhealth.core import command, files
from slurmhealth.core.command import CommandError, Console
from slurmhealth.report import build, mail, reads, render

MAIL_FAILED = 4  # the report was written, but not mailed


@dataclasses.dataclass(frozen=True)
class Request:
    """One `slurmhealth report`: --now and --since as given, the format, where it goes (-o,
    "-" for standard output), --mail-to, node states from sinfo (--sinfo, --slurm-bin), and
    the file's mode (--mode; None: private)."""

    now: str | None
    since: str
    fmt: str
    output: str = "-"
    mail_to: str | None = None
    sinfo: bool = False
    slurm_bin: str = ""
    mode: int | None = None


def check_mail(mail_to: str | None, fmt: str) -> None:
    """--mail-to: an address (`--mail-to ''` is an error, never a silent no-mail), and a
    format a mail carries."""
    try:
        if mail_to is not None:
            mail.check_address(mail_to)
    except build.ReportError as exc:
        raise CommandError(str(exc), option="--mail-to") from None
    if mail_to and fmt == "prom":
        raise CommandError("mail the html, md or json report", option="--mail-to")


def run(conn: sqlite3.Connection, request: Request, console: Console) -> int:
    """Make, write and mail the report: the exit status (0, or MAIL_FAILED when it was written
    but not mailed, said on standard error); CommandError when nothing was written."""
    try:
        nodes = build.live_nodes(request.slurm_bin) if request.sinfo else None
        with console.progress(build.STEPS if reads.large_store(conn) else 0, "report") as tick:
            end = command.instant(request.now)
            since = end - command.start(request.since, end)
            doc = build.build(conn, end, since, nodes, tick)
        text = render.render(doc, request.fmt)
    except build.ReportError as exc:
        raise CommandError(str(exc)) from None
    _write(text, request, console)
    if request.mail_to:
        try:
            mail.mail(doc, request.fmt, text, request.mail_to)
        except build.ReportError as exc:
            console.err(f"slurmhealth report: {exc}")
            return MAIL_FAILED
    return 0


def _write(text: str, request: Request, console: Console) -> None:
    output = request.output
    try:
        if output == "-":
            console.write(text)
        elif request.mode is not None:  # the admin's choice (a web server's to read), as asked
            files.write_private(output, text, mode=request.mode)
        elif request.fmt == "prom":  # node_exporter (its own user) reads it: 0644, whole or none
            files.write_private(output, text, mode=0o644)
        else:  # 0600 (an existing report keeps its mode), never through a planted symlink
            files.write_private(output, text, keep_mode=True)
    except OSError as exc:
        raise CommandError(f"{output}: {exc.strerror or exc}") from None
