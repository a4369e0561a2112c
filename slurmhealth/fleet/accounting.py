"""Slurm accounting: what sacct knows of jobs (a job whose node died before its epilog), what
`sacctmgr show event` knows of nodes going down, draining or failing (which node of a NODE_FAIL
job failed), and where Slurm puts each node (its topology's leaf switch or block, its
partitions: faults that start together in one place are one incident)."""

from __future__ import annotations

import calendar
import os
import sqlite3
import time

from slurmhealth.core import store
from slurmhealth.core.hostlist import PatternError, expand, split_terms
from slurmhealth.core.result import clean
from slurmhealth.fleet.records import (
    KINDS,
    VALUES,
    FleetError,
    changes,
    merge_node_events,
    merge_places,
)

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
            changed = changes(conn, VALUES["job"], values, many=True)
    except sqlite3.Error as exc:
        raise FleetError(f"accounting records not merged: {clean(exc, 120)}") from None
    return {"jobs": changed, "bad": bad}


def fetch_sacct(start: float, end: float, slurm_bin: str = "", timeout: float = 120.0) -> str:
    """sacct's records of jobs running in [start, end), every user, requeued runs too (-D).

    Runs with TZ=UTC, so its times are UTC: ingest them with `utc=True`. Raises SlurmError with
    one line (e.g. "accounting storage is disabled" without slurmdbd).
    """
    argv = ["-P", "-n", "-X", "-D", "-a", "-o", SACCT_FIELDS]
    argv += ["-S", _stamp(start), "-E", _stamp(end)]
    return _accounting("sacct", argv, slurm_bin, timeout)


# ---------------------------------------------------------------------------------------------
# node events (sacctmgr show event)

# NodeName,Start,End,State,Reason: Reason last, because it is free text and may hold the `|`
# that -P separates fields with (measured: a drain reason "a | b" comes back as is).
EVENT_FIELDS = "NodeName,Start,End,State,Reason"
# The node states whose events are merged. sacctmgr matches them as state bits, so `DOWN*` (slurmd
# not responding: the node failure that ends its jobs NODE_FAIL) and `DRAIN*` (drained while
# down) are in; the `UNK` "cold-start" event every slurmctld start records for every node is out
# (measured on slurmdbd 22.05, tests/slurm/test_lemons.py).
EVENT_STATES = "DOWN,DRAIN,FAIL"


def _node_name(text: str) -> str | None:
    """The one node a node event names, checked as parse_sacct checks a NodeList; None when the
    text is not exactly one printable name."""
    names = _nodes(text)
    return names[0] if names is not None and len(names) == 1 else None


def parse_events(text: str, utc: bool = False) -> tuple:
    """`sacctmgr -P -n show event ... Format=NodeName,Start,End,State,Reason` -> (rows, bad lines).

    One row per node event: {node, start, end, state, reason}; `end` is None while the event is
    open (sacctmgr prints `Unknown`); state as sacctmgr prints it (`DOWN*`), reason cleaned. A
    line without a start, with an unreadable time or not exactly one node name is a bad line.
    """
    rows, bad = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", 4)
        if len(fields) != 5:
            bad.append(clean(line, 120))
            continue
        node, start, end, state, reason = (f.strip() for f in fields)
        try:
            times = _sacct_time(start, utc), _sacct_time(end, utc)
        except (ValueError, OverflowError):
            times = None, None
        name = _node_name(node)
        if name is None or times[0] is None or not clean(state):
            bad.append(clean(line, 120))
            continue
        rows.append(
            {
                "node": name,
                "start": times[0],
                "end": times[1],
                "state": clean(state, 40),
                "reason": clean(reason),
            }
        )
    return rows, bad


def ingest_events(conn: sqlite3.Connection, text: str, utc: bool = False) -> dict:
    """Merge sacctmgr's node events into node_events: {"events": rows changed, "bad": [lines]}.

    Idempotent: an event is keyed by (node, start, state); one seen open gets its end once it
    closes, a known end or reason is never replaced (records.merge_node_events).
    """
    rows, bad = parse_events(text, utc)
    values = [store.row("node_events", r) for r in rows]
    try:
        with store.immediate(conn):
            changed = merge_node_events(conn, values)
    except sqlite3.Error as exc:
        raise FleetError(f"node events not merged: {clean(exc, 120)}") from None
    return {"events": changed, "bad": bad}


def fetch_events(start: float, end: float, slurm_bin: str = "", timeout: float = 120.0) -> str:
    """sacctmgr's node events (DOWN, DRAIN, FAIL) overlapping [start, end]: those that began
    before `start` and were still open then are included (measured), so an event seen open by
    one collect is seen closed by the next. Node events only, not the cluster's own.

    Runs with TZ=UTC, like fetch_sacct: ingest with `utc=True`. SlurmError with one line.
    """
    argv = ["-P", "-n", "show", "event", "Event=Node", f"States={EVENT_STATES}"]
    argv += [f"Start={_stamp(start)}", f"End={_stamp(end)}", f"Format={EVENT_FIELDS}"]
    return _accounting("sacctmgr", argv, slurm_bin, timeout)


# ---------------------------------------------------------------------------------------------
# places (scontrol show topology, sinfo)

# What a place's name may be: Slurm's names are short words; anything else is a bad line.
_PLACE_NAME_MAX = 60


def _fields(line: str) -> dict:
    """`Key=value Key=value` (scontrol's one-line records) -> {key: value}."""
    return dict(tok.partition("=")[::2] for tok in line.split() if "=" in tok)


def _nodes(text: str) -> list | None:
    """A hostlist's node names, each one printable word; None when any is not, or the list
    cannot be read (node events, places)."""
    try:
        names = [n for term in split_terms(text) for n in expand(term)]
    except PatternError:
        return None
    if any(n != clean(n) or " " in n for n in names):
        return None
    return names


def _place(kind: str, name: str, nodes: str, rows: list, bad: list, line: str) -> None:
    names = _nodes(nodes) if nodes not in _NO_NODES else []
    if names is None or not name or name != clean(name, _PLACE_NAME_MAX) or " " in name:
        bad.append(clean(line, 120))
        return
    rows.extend((node, kind, name) for node in names)


def parse_topology(text: str) -> tuple:
    """`scontrol show topology` -> ([(node, kind, name)], bad lines).

    topology/tree prints a line per switch (`SwitchName=s0 Level=0 LinkSpeed=1
    Nodes=gpu[01-16]`): a leaf switch (Level=0) is each of its nodes' place "switch"; a switch
    above it holds every node below it, no place of its own (all of a fleet's faults in an hour
    would share the top switch). topology/block prints a line per block (`BlockName=b1
    BlockIndex=0 Nodes=... BlockSize=...`): place "block". Any other line (no topology plugin:
    scontrol says so in words) is no place and no bad line.
    """
    rows: list = []
    bad: list = []
    for line in text.splitlines():
        fields = _fields(line)
        if "SwitchName" in fields:
            if fields.get("Level", "0") == "0":
                _place("switch", fields["SwitchName"], fields.get("Nodes", ""), rows, bad, line)
        elif "BlockName" in fields:
            _place("block", fields["BlockName"], fields.get("Nodes", ""), rows, bad, line)
    return rows, bad


def parse_partitions(text: str) -> tuple:
    """`sinfo -h -a -o %R|%N` -> ([(node, "partition", name)], bad lines): a line per
    partition (or per partition and state), its name and node list."""
    rows: list = []
    bad: list = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, nodes = line.strip().partition("|")
        if not sep:
            bad.append(clean(line, 120))
            continue
        _place("partition", name, nodes, rows, bad, line)
    return rows, bad


def ingest_places(conn: sqlite3.Connection, rows: list, now: float) -> dict:
    """Merge (node, kind, name) rows seen at `now` into places: {"places": rows new or seen
    again}. A node that moved keeps its old place with the time it was last seen there."""
    values = [(node, kind, name, now, now) for node, kind, name in sorted(set(rows))]
    try:
        with store.immediate(conn):
            merge_places(conn, values)
    except sqlite3.Error as exc:
        raise FleetError(f"places not merged: {clean(exc, 120)}") from None
    return {"places": len(values)}


def fetch_places(slurm_bin: str = "", timeout: float = 120.0) -> tuple:
    """(rows, bad lines) of where Slurm puts each node: its topology and its partitions.
    SlurmError with one line when scontrol or sinfo fails."""
    topology = _accounting("scontrol", ["show", "topology"], slurm_bin, timeout)
    partitions = _accounting("sinfo", ["-h", "-a", "-o", "%R|%N"], slurm_bin, timeout)
    rows, bad = parse_topology(topology)
    more, worse = parse_partitions(partitions)
    return rows + more, bad + worse


# ---------------------------------------------------------------------------------------------
# running sacct, sacctmgr, scontrol and sinfo


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def _accounting(tool: str, args: list, slurm_bin: str, timeout: float) -> str:
    """Run a Slurm command (sacct, sacctmgr, scontrol, sinfo) by absolute path; its stdout, or
    SlurmError with one line.

    TZ=UTC makes the times it reads and prints UTC; SLURM_TIME_FORMAT=standard keeps them
    `2026-05-01T10:00:00` whatever the admin's shell sets (`relative` prints `10:00:00`, `%s`
    epoch seconds: measured, both tools); an admin's SLURM_TOPO_LEN is dropped.
    """
    import subprocess  # noqa: PLC0415 - admin side only

    from slurmhealth.core.slurm import SlurmError, find_bin  # noqa: PLC0415

    argv = [find_bin(tool, slurm_bin), *args]
    env = dict(os.environ, TZ="UTC", SLURM_TIME_FORMAT="standard")
    env.pop("SLURM_TOPO_LEN", None)  # cuts scontrol's topology lines to that many characters
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{tool} timed out after {timeout:g} s") from None
    except OSError as exc:
        raise SlurmError(f"{tool}: {exc}") from None
    if proc.returncode != 0:
        why = clean(proc.stderr or proc.stdout or f"exit {proc.returncode}", 200, words=True)
        prefix = f"{tool}: "
        raise SlurmError(f"{prefix}{why[len(prefix) :] if why.startswith(prefix) else why}")
    return proc.stdout
