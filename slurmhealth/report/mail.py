"""Mailing the nightly report through the local MTA (sendmail), never through a shell."""

from __future__ import annotations

import os
import re
import subprocess

from slurmhealth.core.result import clean, counted
from slurmhealth.report.build import ReportError
from slurmhealth.report.render import render

MTA_PATHS = ("/usr/sbin/sendmail", "/usr/lib/sendmail")


def find_sendmail() -> str:
    """The local MTA's sendmail: $SLURMHEALTH_SENDMAIL when set (and only it), else on PATH,
    else where MTAs put it; ReportError when there is none."""
    import shutil  # noqa: PLC0415

    chosen = os.environ.get("SLURMHEALTH_SENDMAIL")
    candidates = (chosen,) if chosen else (shutil.which("sendmail"), *MTA_PATHS)
    for path in candidates:
        if path and os.path.isabs(path) and os.access(path, os.X_OK):
            return path
    raise ReportError(
        "no local MTA (sendmail not found on PATH or in /usr/sbin): report not mailed"
    )


def subject(doc: dict) -> str:
    """Numbers only: nothing untrusted reaches a mail header."""
    counts = doc["fleet"]["counts"]
    out = counts["drained"] + counts["draining"] + counts["down"]
    fresh = doc.get("freshness") or {}
    stale = "STALE store, " if fresh.get("stale") else ""
    silent = f"{fresh['silent_count']} not heard from, " if fresh.get("silent_count") else ""
    if fresh.get("unguarded_count"):
        silent += f"{fresh['unguarded_count']} with jobs and no runs, "
    return (
        f"slurmhealth report {doc['generated'][:10]}: {stale}"
        f"{counted(doc['fleet']['nodes'], 'node')}, {silent}{out} out of service, "
        f"{counted(len(doc['lemons']['candidates']), 'lemon candidate')}"
    )


# One recipient: `user`, `user@host`, or `Name <user@host>`; nothing else on its part of the
# list (getaddresses reads "not an address" as the local user `not` and drops the rest).
_ADDRESS = re.compile(r"\s*(?:[^<>,]*<[^<>\s,]+>|[^<>\s,]+)\s*")


def check_address(to: str) -> None:
    """Mail addresses, comma-separated: printable, no line breaks (no header injection), each
    part one address, at least one."""
    parts = to.split(",")
    if any(not ch.isprintable() for ch in to) or not all(map(_ADDRESS.fullmatch, parts)):
        raise ReportError(f"not a mail address: {clean(to, 80)!r}")


def message(doc: dict, fmt: str, text: str, to: str) -> bytes:
    """A MIME message: HTML as text/html with the Markdown as its plain-text alternative;
    Markdown and JSON as text/plain."""
    import email.policy  # noqa: PLC0415
    from email.message import EmailMessage  # noqa: PLC0415

    check_address(to)
    # Long enough lines that the subject is never folded (some MUAs show a folded one badly).
    msg = EmailMessage(policy=email.policy.default.clone(max_line_length=200))
    msg["To"] = to
    msg["Subject"] = subject(doc)
    if fmt == "html":
        msg.set_content(render(doc, "md"))
        msg.add_alternative(text, subtype="html")
    else:
        msg.set_content(text)
    return msg.as_bytes()


def mail(doc: dict, fmt: str, text: str, to: str, timeout: float = 60.0) -> None:
    """Send the report through the local MTA (`sendmail -t -oi`, an argv list, no shell)."""
    payload = message(doc, fmt, text, to)
    argv = [find_sendmail(), "-t", "-oi"]
    try:
        proc = subprocess.run(
            argv, input=payload, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ReportError(f"sendmail timed out after {timeout:g} s: report not mailed") from None
    except OSError as exc:
        raise ReportError(f"sendmail: {clean(exc, 120)}: report not mailed") from None
    if proc.returncode != 0:
        why = clean(proc.stderr.decode("utf-8", "replace") or f"exit {proc.returncode}", 160)
        raise ReportError(f"sendmail failed ({why}): report not mailed")
