"""The lemon sweep (head node, cron): fleet history -> scores -> drains with evidence.

`slurmhealth lemons` lists; `--apply` drains through actions.drain, so the sweep obeys the same
etiquette, circuit breaker and probation as the hooks, and records every drain or refusal in
the fleet store. A lemon already out is recorded as skipped once, not by every hourly sweep
(Journal.note(once=True)): the nightly report lists what happened, not the sweep's heartbeat.

A lemon the sweep drained starts afresh: its evidence is what happened after that drain
(fleet/signals.py resets), so an admin who returned it, or a passing diagnosis that did, is
never overruled by the next hourly sweep on the faults they already judged; faults after its
return, enough on their own, make it a lemon again.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3

from slurmhealth.core import slurm
from slurmhealth.core.command import CommandError, Console
from slurmhealth.core.constants import BREAKER, FAILED, HELD, LEMON
from slurmhealth.core.result import clean
from slurmhealth.fleet import policy, queries, signals, text, trends
from slurmhealth.node import actions, config
from slurmhealth.node.journal import Journal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slurmhealth.node.journal import Say

ACTOR = "slurmhealth lemons"


def sweep(
    conn: sqlite3.Connection,
    now: float,
    window: float,
    params: dict | None = None,
    heard: dict | None = None,
) -> list:
    """Every node with history in the window, scored against the fleet, lemons first. heard:
    queries.heard_from(conn, now) when the caller read it in the same read transaction (the
    nodes whose days in service are read; else read here)."""
    with trends.no_gc():
        read = None
        if heard is not None:
            days = signals.service(conn, [(now - window, now)], list(heard))[0]
            read = signals.Read(days=days)
        return policy.score(signals.signals(conn, now - window, now, read), params)


# How long a node may go without a run before the sweep and the report name it as not heard
# from (health checks run every few minutes), and before a store whose newest run is older is
# stale: its calm is no news, not good news.
SILENT_AFTER_S = 6 * 3600.0
# How far back the jobs Slurm ran are looked at for nodes with no run of slurmhealth's at all
# (`unguarded`): a day, so that the nightly report sees every node that took a job since the
# last one; a range of the jobs table's start index.
JOBS_SEEN_S = 86400.0


def jobs_seen(conn: sqlite3.Connection, now: float) -> tuple:
    """({node: jobs started in the JOBS_SEEN_S before now}, {node: its partitions}), for
    freshness."""
    return queries.jobs_started(conn, now - JOBS_SEEN_S, now), queries.partitions(conn)


def freshness(
    heard: dict, now: float, silent_after: float = SILENT_AFTER_S, jobs: tuple | None = None
) -> dict:
    """{"newest": the newest run of any node (None: no run at all), "stale": whether that is
    older than silent_after before now, "silent": [{"node", "last"}] of the nodes whose newest
    run is, oldest first, "unguarded": [{"node", "jobs"}] of the nodes that started jobs
    and have no run at all, the most jobs first}; pure. jobs: jobs_seen.

    An unguarded node took jobs with no prolog or health check of slurmhealth's on record:
    the hooks are not in its slurm.conf, fail before they record, or its exports never reach
    collect. Accounting (`collect --sacct`) is what names it: its own store has nothing. A node
    whose partitions hold no node with a run (a CPU partition the site did not install
    slurmhealth on) is not named; one Slurm puts in no partition known here is."""
    newest = max(heard.values(), default=None)
    silent = sorted(
        ({"node": n, "last": t} for n, t in heard.items() if now - t > silent_after),
        key=lambda e: (e["last"], e["node"]),
    )
    started, parts = jobs or ({}, {})
    watched = {p for node in heard for p in parts.get(node, ())}  # partitions with a recorder
    unguarded = sorted(
        (
            {"node": n, "jobs": k}
            for n, k in started.items()
            if n not in heard and (n not in parts or parts[n] & watched)
        ),
        key=lambda e: (-e["jobs"], e["node"]),
    )
    stale = newest is None or now - newest > silent_after
    return {
        "newest": newest,
        "stale": stale,
        "silent": silent,
        "after": silent_after,
        "unguarded": unguarded,
        "jobs_after": JOBS_SEEN_S,
    }


def apply(
    scored: list, client: slurm.Slurm, settings: dict, conn: sqlite3.Connection, log: Say
) -> list:
    """Drain each lemon, strongest first; stop at the first the breaker refuses, and at the
    first drain Slurm did not take (a controller that times out on one would make each lemon
    after it wait as long: the next sweep tries again)."""
    applied = []
    journal = Journal(conn, ACTOR, log)
    for entry in (e for e in scored if e["lemon"]):
        why = f"{LEMON} {entry['reason']}"
        outcome = actions.drain(client, entry["node"], why, settings, journal, repeat_skip=False)
        applied.append({"node": entry["node"], "outcome": outcome})
        if outcome in (BREAKER, HELD, FAILED):  # past the cap, uncounted, not taken: stop
            break
    return applied


@dataclasses.dataclass(frozen=True)
class Request:
    """What one `slurmhealth lemons` is asked: the time to score as of (--now), the window,
    --silent-after, --apply, --json and the config file (its settings: the breaker,
    probation, slurm_bin)."""

    now: float
    window: float
    silent_after: float = SILENT_AFTER_S
    apply: bool = False
    as_json: bool = False
    config: str | None = None


def run(conn: sqlite3.Connection, request: Request, console: Console) -> int:
    """`slurmhealth lemons`: score, say how fresh the store is, drain with --apply; the exit
    status: 4 when the store is stale (nothing drained), 3 when the breaker or probation held
    a drain, 1 when a drain failed, else 0. CommandError when the config does not load."""
    at = request.now
    # each node's newest run, read once for the freshness and the nodes the sweep reads the
    # days in service of, in the sweep's read transaction
    with queries.snapshot(conn):
        heard = queries.heard_from(conn, at)
        jobs = jobs_seen(conn, at)
        scored = sweep(conn, at, request.window, heard=heard)
    fresh = freshness(heard, at, request.silent_after, jobs)
    applied: list = []
    if request.apply and fresh["stale"]:
        console.err("stale fleet store: nothing drained (collect it, then sweep again)")
    elif request.apply:
        try:
            settings = config.load(request.config).for_node("")["settings"]
        except config.ConfigError as exc:
            raise CommandError(str(exc)) from None
        client = slurm.Slurm(settings["slurm_bin"], settings["drain_timeout"] * 5)
        applied = apply(scored, client, settings, conn, lambda line: console.err(clean(line, 500)))
    if request.as_json:
        doc = {"lemons": [e for e in scored if e["lemon"]], "nodes": scored, "applied": applied}
        console.out(json_lines(dict(doc, freshness=fresh)))
    else:
        # a stale store first, loudly; else when the newest record is, and who went silent, last
        said = text.freshness(fresh, at)
        body = text.lemons(scored, applied, request.window, at)
        console.out("\n".join([*said, body] if fresh["stale"] else [body, *said]))
    return _status(fresh, applied)


def json_lines(doc: dict) -> str:
    """doc as JSON with each item of its top-level lists on a line of its own (a node's
    scores and evidence a line): json.dumps with an indent encodes in Python, at 100,000
    nodes 7.6 s where the C encoder takes 1.2 s for the same document (docs/benchmarks.md)."""
    fields = []
    for key, value in doc.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"  {json.dumps(item)}" for item in value)
            fields.append(f" {json.dumps(key)}: [\n{items}\n ]")
        else:
            fields.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(fields) + "\n}"


def _status(fresh: dict, applied: list) -> int:
    if fresh["stale"]:
        return 4
    if any(a["outcome"] in (BREAKER, HELD) for a in applied):
        return 3
    return 1 if any(a["outcome"] == FAILED for a in applied) else 0
