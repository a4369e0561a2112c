"""Slurm accounting: what sacct knows of jobs (a job whose node died before its epilog)."""

from __future__ import annotations

import calendar
import os
import sqlite3
import time

from slurmhealth.core import store
from slurmhealth.core.hostlist import PatternError, expand, split_terms
from slurmhealth.core.result import clean
from slurmhealth.fleet.sync import _VALUES, KINDS, FleetError, _changes

SACCT_FIELDS = "JobIDRaw,State,ExitCode,NodeList,Start,End,User"
# The job-level ExitCode is 0:0 whatever happened for these (the signal is on the step line):
# it says nothing of the job's exit (sacct(1); measured in tests/slurm).
_NO_EXIT = {"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
_NO_NODES = {"", "None assigned", "(null)", "None"}


def _sacct_time(text: str, utc: bool) -> float | None:
    """sacct's `2026-05-01T10:00:00` (local time, or UTC when sacct ran with TZ=UTC)."""
    if text in ("", "Unknown", "None"):
        return None
    parsed = time.strptime(text, "%Y-%m-%dT%H:%M:%S")
    return float(calendar.timegm(parsed)) if utc else time.mktime(parsed)


def _exit(state: str, text: str) -> tuple:
    code, _, signal = text.partition(":")
    if state in _NO_EXIT or not code.isdigit():
        return None, None
    return int(code), int(signal) if signal.isdigit() else None


def parse_sacct(text: str, utc: bool = False) -> tuple:
    """`sacct -P -n -X -o JobID,State,ExitCode,NodeList,Start,End,User` -> (job rows, bad lines).

    One row per node of each job: {node, job_id, user, start, end, exit_code, signal,
    num_nodes, slurm_state}. State keeps its first word (`CANCELLED by 0` -> CANCELLED); a job
    with no node (pending, cancelled before start) has no row; step lines (`8.batch`) are
    ignored.
    """
    rows, bad = [], []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if fields == [""]:
            continue
        if len(fields) != 7:
            bad.append(clean(line, 120))
            continue
        job_id, state, exit_text, nodelist, start, end, user = (f.strip() for f in fields)
        if "." in job_id or nodelist in _NO_NODES:
            continue
        try:
            nodes = [n for term in split_terms(nodelist) for n in expand(term)]
            times = _sacct_time(start, utc), _sacct_time(end, utc)
        except (PatternError, ValueError):
            bad.append(clean(line, 120))
            continue
        word = state.split()[0] if state.split() else ""
        exit_code, signal = _exit(word, exit_text)
        for node in nodes:
            rows.append(
                {
                    "node": node,
                    "job_id": job_id,
                    "user": user or None,
                    "start": times[0],
                    "end": times[1],
                    "exit_code": exit_code,
                    "signal": signal,
                    "num_nodes": len(nodes),
                    "slurm_state": word or None,
                }
            )
    return rows, bad


def ingest_sacct(conn: sqlite3.Connection, text: str, utc: bool = False) -> dict:
    """Merge sacct's job records into the jobs table: {"jobs": rows changed, "bad": [lines]}.

    Accounting fills what the hooks could not know (the final state, a job whose node crashed
    before its epilog: NODE_FAIL); it never replaces a hook's value with a null.
    """
    rows, bad = parse_sacct(text, utc)
    columns = KINDS["job"].columns
    values = [tuple(row.get(c) for c in columns) for row in rows]
    try:
        with store.immediate(conn):
            changed = _changes(conn, _VALUES["job"], values, many=True)
    except sqlite3.Error as exc:
        raise FleetError(f"accounting records not merged: {clean(exc, 120)}") from None
    return {"jobs": changed, "bad": bad}


def fetch_sacct(start: float, end: float, slurm_bin: str = "", timeout: float = 120.0) -> str:
    """sacct's records of jobs running in [start, end), every user, requeued runs too (-D).

    Runs with TZ=UTC, so its times are UTC: ingest them with `utc=True`. Raises SlurmError with
    one line (e.g. "accounting storage is disabled" without slurmdbd).
    """
    import subprocess  # noqa: PLC0415 - admin side only

    from slurmhealth.core.slurm import SlurmError, find_bin  # noqa: PLC0415

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))

    argv = [find_bin("sacct", slurm_bin), "-P", "-n", "-X", "-D", "-a", "-o", SACCT_FIELDS]
    argv += ["-S", stamp(start), "-E", stamp(end)]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=dict(os.environ, TZ="UTC"),
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"sacct timed out after {timeout:g} s") from None
    except OSError as exc:
        raise SlurmError(f"sacct: {exc}") from None
    if proc.returncode != 0:
        why = clean(proc.stderr or proc.stdout or f"exit {proc.returncode}", 200)
        raise SlurmError(f"sacct: {why[7:] if why.startswith('sacct: ') else why}")
    return proc.stdout


