"""The nightly report (head node, cron): fleet store -> one plain dict -> JSON, HTML or Markdown.

build() gathers every number once, in one read transaction; the HTML and Markdown templates
(templates/) render that dict and compute nothing but layout, so the three formats carry the same
numbers by construction. The dict is the JSON format, documented in docs/report.md.

Three spans: the *period* (`--since`, default 24 h before `--now`) for what happened lately
(drains, check and Xid counts, slurmhealth's own cost); the *window*, the 28 whole UTC days
before the report's day, for what needs weeks (the heatmap, the trend, the failure rate), which
starts later when the store's records do (a fleet 27 days old has a 27-day window), so its days
and its node-days agree; and the lemons' 28 days up to `--now`, as `slurmhealth lemons --now`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Optional

from slurmhealth import __version__
from slurmhealth.core import slurm, timespec
from slurmhealth.core.constants import (
    ACT_BREAKER,
    ACT_DRAIN,
    ACT_REBOOT,
    ACT_RESET_GPU,
    ACT_RESUME,
    ACT_WOULD_DRAIN,
    LEMON,
    PREFIX,
)
from slurmhealth.core.result import clean
from slurmhealth.fleet import drift as drift_of
from slurmhealth.fleet import faults, lemons, peers, policy, queries, signals, telemetry, trends
from slurmhealth.node.checks import xid as xid_catalogue
from slurmhealth.report import reads

FORMAT = "slurmhealth-report/1"
FORMATS = ("html", "md", "json")
DAY = 86400
WINDOW_DAYS = 28  # as `slurmhealth lemons` (Meta scores lemons over 28 days)
HEATMAP_ROWS = 40  # nodes shown in the heatmap, most failures first
LIST_MAX = 100  # rows of a listing (actions, out-of-service nodes); the counts stay complete
NODES_SHOWN = 5  # nodes named per check or Xid row, most affected first; the rest is "+N more"
EPISODE_S = 3600  # a node's second failure record within this is the same failure
# How far back a node's last recorded versions are looked for: runs record them when they change
# and at least every runner.VERSIONS_EVERY (6 h); two days spans a node idle over a weekend's
# missed health checks without reading a node's whole history. The lemon signals' GPU models
# come from the same look-back (read once for both).
VERSIONS_LOOKBACK = queries.MODEL_LOOKBACK
# How far back the drift section looks for what each node ran before (its earliest recorded
# versions in this span): a rollout that moved the class within it is one, and its nodes not yet
# updated are not odd nodes; a week after the rollout, they are (fleet/drift.py).
ROLLOUT_LOOKBACK = 7 * 86400.0
# Hardware failures per 1,000 node-days, Meta's two A100 clusters (arXiv 2410.21680;
# docs/sources.md): the yardstick the fleet's own rate is set against.
PUBLISHED = (("RSC-2", 2.34), ("RSC-1", 6.50))
MTTF_NODES = (1, 32, 128, 1024)
STEPS = 9  # progress ticks of build()
Progress = Optional[Callable[[int], None]]

FAILURE_DEFINITION = (
    "a node-level hardware failure: slurmhealth drained the node for a failed check or Xid "
    "(actions: drain, ok; lemon-sweep drains excluded), or the node crashed under a job (jobs: "
    "slurm_state NODE_FAIL, and the node's epilog never ran: its job's other nodes did not "
    "fail); records of one node within an hour of each other are one failure. Failures that "
    "start on many nodes within an hour (a fleet-wide incident: a switch, a filesystem, a bad "
    "configuration push; the same test as the lemon sweep's, fleet/faults.py) are the fleet's, "
    "not the nodes': listed as incidents, left out of the rate"
)
_XID_CLASSES = (("fail", "hardware"), ("warn", "warning"), ("app", "application"))


class ReportError(Exception):
    """A report that cannot be made or sent (bad input, no MTA, sendmail failed): one line."""


# --- time spans ------------------------------------------------------------------------------


def window(now: float) -> tuple:
    """(start, end) of the 28 whole UTC days before the report's day (ending at `now` when it
    is midnight): whole days, so the heatmap has 28 full columns and node-days are exact."""
    end = math.floor(now / DAY) * DAY
    return end - WINDOW_DAYS * DAY, end


def records_window(conn: sqlite3.Connection, start: float, end: float) -> tuple:
    """The window from the UTC day of its first record (a run or a job start) on: a fleet
    younger than the window is not shown days it did not exist, and a rate per node-day is
    read over the days it counts. (start, end) unchanged when records start on its first day
    or there are none."""
    first = reads.first_record(conn, start, end)
    if first is None:
        return start, end
    return max(start, math.floor(first / DAY) * DAY), end


def _day(t: float) -> str:
    return timespec.iso(t)[:10]


# --- fleet state -----------------------------------------------------------------------------


def _failing_why(conn: sqlite3.Connection, run_id: str) -> str:
    rows = reads.failing_results(conn, run_id)
    return "; ".join(f"{check}: {message}" for check, message in rows) or "failed its last run"


def node_states(conn: sqlite3.Connection, nodes: list, now: float) -> list:
    """node_state of each node, the latest action and run of every node read at once."""
    actions, runs = reads.latest(conn, nodes, now)
    return [node_state(conn, n, now, (actions.get(n), runs.get(n))) for n in nodes]


def node_state(conn: sqlite3.Connection, node: str, now: float, latest: tuple) -> dict:
    """One node as the store sees it: ok, unchecked (no run at all: a node the store knows
    from its jobs only), failing (its last run failed, yet slurmhealth has not drained it: the
    breaker held, or Slurm took it down), draining or drained (our latest drain stands; a job
    still runs), with why and since when. latest: (reads.last_action, reads.last_run) of the
    node."""
    act, run = latest
    if act and act[1] == ACT_DRAIN:
        state = "draining" if reads.busy(conn, node, now) else "drained"
        return _state(node, state, act[2], act[0], act[3])
    if run and run[1] == "fail":
        return _state(node, "failing", _failing_why(conn, run[0]), run[2], "")
    if run is None:  # known from its jobs only: nothing of slurmhealth's ran there
        return _state(node, "unchecked", "no run of slurmhealth's on record", None, "")
    return _state(node, "ok", "", None, "")


def _state(node: str, state: str, why: str, since: float | None, by: str) -> dict:
    when = timespec.iso(since) if since is not None else None
    return {"node": node, "state": state, "reason": clean(why, 200), "since": when, "by": by}


def slurm_state(info: dict) -> dict:
    """A node as sinfo reports it (slurm.parse_sinfo) in the report's terms."""
    word = info["state"].rstrip("*~#!%$@^-").lower()
    if word == "drained":
        state = "drained"
    elif word in ("draining", "drng"):
        state = "draining"
    elif word.startswith(("down", "fail", "maint", "reboot", "power", "unk", "inval")):
        state = "down"
    else:
        state = "ok"
    since = info.get("since")
    return _state(info["name"], state, info.get("reason", ""), since, "")


STATES = ("ok", "unchecked", "failing", "draining", "drained", "down")


def fleet_summary(states: list, source: str) -> dict:
    """Counts per state, and the nodes failing or out of service (first LIST_MAX), worst
    first (the unchecked with jobs in the last day are named under freshness)."""
    counts = dict.fromkeys(STATES, 0)
    for s in states:
        counts[s["state"]] += 1
    order = {name: i for i, name in enumerate(reversed(STATES))}
    out = sorted(
        (s for s in states if s["state"] not in ("ok", "unchecked")),
        key=lambda s: (order[s["state"]], s["node"]),
    )
    return {"source": source, "nodes": len(states), "counts": counts, "out": out[:LIST_MAX]}


# --- the period ------------------------------------------------------------------------------


def period_actions(conn: sqlite3.Connection, start: float, end: float) -> dict:
    """Drains, resumes, the remediation ladder's reboots and GPU resets, breaker refusals and
    failed actions in the period, newest first."""
    rows = reads.actions_between(conn, start, end)
    counts = dict.fromkeys((ACT_DRAIN, ACT_RESUME, ACT_REBOOT, ACT_RESET_GPU, ACT_BREAKER), 0)
    counts.update({"failed": 0, ACT_WOULD_DRAIN: 0})
    for _, _, action, _, _, ok, detail in rows:
        refused = action == ACT_REBOOT and str(detail).startswith("refused: circuit breaker")
        if action == ACT_BREAKER or refused:
            counts[ACT_BREAKER] += 1
        elif not ok:
            counts["failed"] += 1
        elif action in counts:
            counts[action] += 1
    listed = [
        {
            "time": timespec.iso(t),
            "node": node,
            "action": action,
            "ok": bool(ok),
            "reason": clean(reason, 200),
            "by": clean(actor, 60),
            "detail": clean(detail, 200),
        }
        for t, node, action, reason, actor, ok, detail in rows[:LIST_MAX]
    ]
    return {"counts": counts, "total": len(rows), "list": listed}


def period_runs(conn: sqlite3.Connection, start: float, end: float, total: int) -> dict:
    """Runs in the period by verdict: the denominator of the check counts. total: the runs
    started in it (reads.run_figures)."""
    counts = {"ok": 0, "warn": 0, "fail": 0}
    for verdict, n in reads.verdict_counts(conn, start, end, total):
        counts[verdict] = counts.get(verdict, 0) + n
    return {"total": sum(counts.values()), **counts}


def check_counts(conn: sqlite3.Connection, start: float, end: float) -> list:
    """Fail and warn results per check in the period, most fails first. Only runs that were
    not ok keep results (store.record_run), so the join reads few rows."""
    per_check: dict = {}
    for name, node, fails, warns in reads.check_counts(conn, start, end):
        entry = per_check.setdefault(name, {"fail": 0, "warn": 0, "by_node": {}})
        entry["fail"] += fails or 0
        entry["warn"] += warns or 0
        entry["by_node"][node] = (fails or 0) + (warns or 0)
    out = [
        {"check": clean(name, 80), "fail": e["fail"], "warn": e["warn"], **named(e["by_node"])}
        for name, e in per_check.items()
    ]
    return sorted(out, key=lambda c: (-c["fail"], -c["warn"], c["check"]))


def named(by_node: dict) -> dict:
    """The nodes of one row, most records first: the first NODES_SHOWN by name (cleaned: the
    store's names are untrusted), the count of the rest."""
    ranked = sorted(by_node, key=lambda n: (-by_node[n], str(n)))
    shown = [clean(n, 64) for n in ranked[:NODES_SHOWN]]
    return {"node_names": shown, "more_nodes": len(ranked) - len(shown)}


def xid_counts(conn: sqlite3.Connection, start: float, end: float) -> dict:
    """Xids in the period by class (hardware, warning, application) and code, with the nodes
    and processes seen. Process names come from the kernel log: untrusted, cleaned here, escaped
    by the templates."""
    codes: dict = {}
    for cls, code, node, process in reads.xids_between(conn, start, end):
        entry = codes.setdefault(
            (cls or "unknown", code), {"count": 0, "nodes": {}, "procs": set()}
        )
        entry["count"] += 1
        entry["nodes"][node] = entry["nodes"].get(node, 0) + 1
        if process:
            entry["procs"].add(clean(process, 60))
    names = dict(_XID_CLASSES)
    rank = {c: i for i, (c, _) in enumerate(_XID_CLASSES)}
    rows = [
        {
            "class": names.get(cls, clean(cls, 20)),
            "code": code,
            "title": xid_catalogue.title(code) if isinstance(code, int) else "",
            "count": e["count"],
            "nodes": len(e["nodes"]),
            **named(e["nodes"]),
            "processes": sorted(e["procs"])[:3],
        }
        for (cls, code), e in sorted(
            codes.items(), key=lambda kv: (rank.get(kv[0][0], 9), -kv[1]["count"], kv[0][1] or 0)
        )
    ]
    by_class = {name: 0 for _, name in _XID_CLASSES}
    for row in rows:
        by_class[row["class"]] = by_class.get(row["class"], 0) + row["count"]
    return {"by_class": by_class, "codes": rows}


# The phases whose own wall time the report shows, and the quantiles of it.
COST_PHASES = ("prolog", "epilog")
COST_QUANTILES = (0.50, 0.99)


def own_cost(found: dict) -> list:
    """slurmhealth's own wall time per run of prolog and epilog in the period (runs.duration):
    found, {phase: (runs, [the COST_QUANTILES])} (reads.run_figures)."""
    out = []
    for phase, (runs, (p50, p99)) in found.items():
        out.append(
            {
                "phase": phase,
                "runs": runs,
                "p50_ms": None if p50 is None else round(p50 * 1000, 1),
                "p99_ms": None if p99 is None else round(p99 * 1000, 1),
            }
        )
    return out


# --- the window: lemons, failures, heatmap, trend, rate ---------------------------------------


def lemon_candidates(scored: list, now: float) -> list:
    """The lemons policy.score found, with the evidence behind each (signals seen) and the
    lines that say how the verdict came about (policy.explain)."""
    out = []
    for entry in (e for e in scored if e["lemon"]):
        evidence = [
            {"signal": name, "count": ev["count"], "expected": round(ev["expected"], 2)}
            for name, ev in entry["evidence"].items()
            if ev["count"]
        ]
        out.append(
            {
                "node": entry["node"],
                "score": round(entry["score"], 1),
                "faults": entry["faults"],
                "reason": clean(entry["reason"], 200),
                "evidence": evidence,
                "explain": [clean(line, 300) for line in policy.explain(entry, now)],
            }
        )
    return out


def failure_records(conn: sqlite3.Connection, start: float, end: float) -> list:
    """Every record of a node failure in [start, end) (see FAILURE_DEFINITION), by time."""
    lemon = f"{PREFIX} {LEMON}"
    rows = [
        (t, node, ACT_DRAIN, reason)
        for t, node, reason in reads.drains_between(conn, start, end)
        if not reason.startswith(lemon)
    ]
    # the node that crashed under a job (reads.node_fails_between says how it is found)
    rows += [
        (t, node, "node_fail", f"crashed under job {job} (NODE_FAIL)")
        for t, node, job in reads.node_fails_between(conn, start, end)
    ]
    return sorted(rows)


def episodes(records: list) -> list:
    """Failures: records of one node less than EPISODE_S after its previous failure are the
    same failure (a drain and the NODE_FAIL of the job it killed). records: (time, node, ...)
    sorted by time."""
    last: dict = {}
    out = []
    for record in records:
        t, node = record[0], record[1]
        if node in last and t - last[node] < EPISODE_S:
            continue
        last[node] = t
        out.append(record)
    return out


def shared_failures(failures: list, span: float, refused: Sequence = ()) -> set:
    """{(node, time)} of the failures that are a fleet-wide incident's: starting on more nodes
    within an hour than the fleet's own failure rate makes likely, with one cause (the lemon
    sweep's test, fleet/faults.py, with its parameters): a drain's reason, or a crash's job.
    `refused`: (time, node, reason) of the drains the circuit breaker refused, failures seen
    though not counted (the breaker caps the drains of an incident at a share of the fleet:
    the drains it let through are the incident's, not node failures)."""
    by_node: dict = {}
    for t, node, kind, why in list(failures) + [(t, n, ACT_DRAIN, w) for t, n, w in refused]:
        if kind == ACT_DRAIN:
            scope = faults.scope_key("reason", faults.own_reason(why))
        else:  # the record names the job it crashed under: one job, one scope
            scope = faults.scope_key("job", why)
        by_node.setdefault(node, []).append((t, 1.0, {}, {scope}))
    found = faults.shared(by_node, span, policy.DEFAULT_PARAMS)
    return {(node, t) for node, t in found} & {(f[1], f[0]) for f in failures}


def incidents(shared: list) -> list:
    """The shared failures (time order) grouped into incidents: a new one after an hour
    without any. Each: start, end, nodes, failures."""
    groups: list = []
    for t, node, *_ in shared:
        if not groups or t - groups[-1]["last"] > policy.DEFAULT_PARAMS["shared_window_s"]:
            groups.append({"first": t, "last": t, "nodes": set(), "failures": 0})
        groups[-1]["last"] = t
        groups[-1]["nodes"].add(node)
        groups[-1]["failures"] += 1
    return [
        {
            "start": timespec.iso(g["first"]),
            "end": timespec.iso(g["last"]),
            "nodes": len(g["nodes"]),
            "failures": g["failures"],
        }
        for g in groups
    ]


def heatmap(failures: list, start: float, scored: list, days: int = WINDOW_DAYS) -> dict:
    """Failures per node and UTC day over the window's `days`: the HEATMAP_ROWS nodes with the
    most (lemon candidates always), each cell with its count and why."""
    cells: dict = {}
    for t, node, kind, why in failures:
        row = cells.setdefault(node, [[0, []] for _ in range(days)])
        cell = row[int((t - start) // DAY)]
        cell[0] += 1
        cell[1].append(f"{kind}: {clean(why, 100)}")
    lemons = {e["node"] for e in scored if e["lemon"]}
    failed = len(cells)
    for node in lemons:  # a lemon's row, even a blank one, belongs next to the others
        cells.setdefault(node, [[0, []] for _ in range(days)])
    ranked = sorted(cells, key=lambda n: (n not in lemons, -sum(c[0] for c in cells[n]), n))
    rows = [
        {
            "node": node,
            "total": sum(c[0] for c in cells[node]),
            "lemon": node in lemons,
            "counts": [c[0] for c in cells[node]],
            "why": ["; ".join(c[1])[:300] for c in cells[node]],
        }
        for node in ranked[:HEATMAP_ROWS]
    ]
    labels = [_day(start + d * DAY) for d in range(days)]
    most = max((max(r["counts"]) for r in rows), default=0)
    return {"days": labels, "rows": rows, "nodes": failed, "max": most}


def trend(
    failures: list, start: float, node_days: int, days: int = WINDOW_DAYS, shared: Sequence = ()
) -> dict:
    """Node failures and an incident's failures per UTC day over the window, the published
    range for this fleet's size (nodes: node-days over the window's days), and the whole-number
    ticks of the chart's count axis."""
    per_day, per_day_shared = [0] * days, [0] * days
    for counts, records in ((per_day, failures), (per_day_shared, shared)):
        for t, *_ in records:
            counts[int((t - start) // DAY)] += 1
    nodes = node_days / days if days else 0
    low, high = (rate * nodes / 1000 for _, rate in PUBLISHED)
    listed = [
        {"day": _day(start + d * DAY), "failures": n, "incident": m}
        for d, (n, m) in enumerate(zip(per_day, per_day_shared))
    ]
    peak = max([n + m for n, m in zip(per_day, per_day_shared)] + [high * 1.25, 1])
    return {
        "days": listed,
        "expected_low": round(low, 3),
        "expected_high": round(high, 3),
        "ticks": count_ticks(peak),
    }


def count_ticks(peak: float) -> list:
    """Whole-number ticks from 0 for a count axis that reaches at least `peak`: steps of 1, 2,
    5, 10, 20, 50... so that there are at most five intervals; the last tick is the top."""
    step = 1
    while math.ceil(peak / step) > 5:
        step = step * 5 // 2 if str(step).startswith("2") else step * 2
    return list(range(0, step * math.ceil(peak / step) + 1, step))


def rate(failures: list, node_days: int, shared: list | None = None) -> dict:
    """The failure rate per 1,000 node-days, and what it means for jobs: a job on N nodes
    meets a failure on average every 1 / (N x rate) days (Meta's MTTF model). A fleet-wide
    incident's failures (`shared`) are listed apart and counted in neither; `above_published`
    (the alarm) compares the nodes' own rate with the highest published one."""
    per_node_day = len(failures) / node_days if node_days else None
    mttf = []
    for n in MTTF_NODES:
        row = {"nodes": n, "hours": _mttf_hours(per_node_day, n)}
        for name, published in PUBLISHED:
            row[name] = _mttf_hours(published / 1000, n)
        mttf.append(row)
    per_1000 = None if per_node_day is None else round(1000 * per_node_day, 2)
    return {
        "definition": FAILURE_DEFINITION,
        "failures": len(failures),
        "node_days": node_days,
        "per_1000_node_days": per_1000,
        "above_published": per_1000 is not None and per_1000 > max(r for _, r in PUBLISHED),
        "incident_failures": len(shared or []),
        "incidents": incidents(shared or []),
        "published": [{"cluster": name, "per_1000_node_days": r} for name, r in PUBLISHED],
        "mttf": mttf,
    }


def _mttf_hours(per_node_day: float | None, nodes: int) -> float | None:
    if not per_node_day:
        return None
    return round(24 / (nodes * per_node_day), 1)


# --- configuration drift ---------------------------------------------------------------------


def _earliest(conn: sqlite3.Connection, nodes: list, now: float) -> Callable[[str], dict | None]:
    """Each node's earliest recorded versions in the rollout look-back, for drift.odd_nodes:
    read for every node at once (queries.BATCH a statement) when the first node is asked for,
    so a unanimous fleet costs no read and a fleet mid-rollout no statement per node."""
    read: list = []  # the nodes' versions, once read

    def before(node: str) -> dict | None:
        if not read:
            read.append(queries.versions_of(conn, nodes, now, ROLLOUT_LOOKBACK, oldest=True))
        return read[0].get(node)

    return before


# --- the report ------------------------------------------------------------------------------


def build(
    conn: sqlite3.Connection,
    now: float,
    since: float,
    sinfo: list | None = None,
    progress: Progress = None,
) -> dict:
    """Every number of the report, as one JSON-able dict (docs/report.md).

    now: the report's time (`--now` replays history); since: the period's length in seconds;
    sinfo: nodes as slurm.Slurm.nodes() lists them, to take live states instead of the
    store's. One read transaction: a consistent snapshot while collect writes.
    """
    tick = progress or (lambda _n: None)
    start, (w_start, w_end) = now - since, window(now)
    with queries.snapshot(conn), trends.no_gc():
        # the period's runs, checks and Xids, read beside the rest on a server
        # (queries.beside): the run figures read every run of the period, the largest read
        # of a 100,000-node report (docs/benchmarks.md)
        with queries.beside(conn, lambda c: _period(c, start, now)) as period:
            return _build(conn, now, start, w_start, w_end, sinfo, tick, period)


def _held_from(w_start: float, w_end: float) -> float:
    """The start of the held-back jobs' span of the window: its last telemetry.LOOKBACK."""
    return max(w_start, w_end - telemetry.LOOKBACK)


def _window_reads(
    conn: sqlite3.Connection, now: float, w_start: float, w_end: float, heard: dict
) -> tuple:
    """(the window's counts, the lemons' signals, the window's held-back findings, each node's
    newest versions, the rising counters as of now): the lemons as `slurmhealth lemons --now
    NOW` scores them, the 28 days up to now (the window when the report runs at midnight), and
    the window's node-days. heard: queries.heard_from(conn, now), each node's newest run."""
    lemon_start = now - WINDOW_DAYS * DAY
    # the held-back jobs the lemon sweeps' warnings read, for both spans in one read (each job
    # is judged alone, in the span its last end falls in): the window's are shown too
    lemon_held_from = max(lemon_start, now - telemetry.LOOKBACK)
    spans = ((_held_from(w_start, w_end), w_end), (lemon_held_from, now))
    read = queries.held_back_findings(conn, min(s for s, _ in spans), max(e for _, e in spans))
    findings, lemon_held = ([f for f in read if s <= f["time"] < e] for s, e in spans)
    # each node's newest recorded versions, read once: the GPU models the lemons and rising
    # counters pool nodes by, and the drift section's versions (a node with no run in the
    # look-back has none); the rising counters as of now, found once for the lemons' warnings
    # and their own section
    ran = _ran_since(heard, now - VERSIONS_LOOKBACK)
    recent = queries.versions_of(conn, ran, now, VERSIONS_LOOKBACK)
    models = {n: str((v or {}).get("model") or "") for n, v in recent.items()}
    rising = queries.rising_counters(conn, now, models, ran=ran)
    known = signals.Read([(f["node"], f["time"]) for f in lemon_held], models, rising)
    # the lemons' days in service, and the window's when it differs, in one sweep
    windows = [(lemon_start, now)]
    windows += [(w_start, w_end)] if (w_start, w_end) != windows[0] else []
    days = signals.service(conn, windows, list(heard))
    known.days = days[0]
    lemon_counts = counts = signals.signals(conn, lemon_start, now, known)
    if len(days) > 1:  # the window's node-days alone
        counts = signals.counts(conn, w_start, w_end, days[1])
    return counts, lemon_counts, findings, recent, rising


def _ran_since(heard: dict, start: float) -> list:
    """[node] of every node with a run from `start` on (before the `now` heard was read at),
    in heard's order: queries.nodes_with_runs(conn, start, now), from each node's newest run."""
    return [node for node, newest in heard.items() if newest >= start]


def _period(conn: sqlite3.Connection, start: float, end: float) -> tuple:
    """(runs by verdict, checks, Xids, own cost) of the period [start, end): the period's runs
    counted with the phases' own wall time in one read (reads.run_figures); and the jobs of
    the day before `end` (lemons.jobs_seen, for freshness)."""
    total, cost = reads.run_figures(conn, start, end, COST_PHASES, COST_QUANTILES)
    runs = period_runs(conn, start, end, total)
    checks, xids = check_counts(conn, start, end), xid_counts(conn, start, end)
    return runs, checks, xids, own_cost(cost), lemons.jobs_seen(conn, end)


def _build(
    conn: sqlite3.Connection,
    now: float,
    start: float,
    w_start: float,
    w_end: float,
    sinfo: list | None,
    tick: Callable[[int], None],
    period: Callable[[], tuple],
) -> dict:
    w_start, w_end = records_window(conn, w_start, w_end)
    # each node's newest run, read once: who has been silent (freshness), who ran lately, and
    # the nodes whose days in service are read (a loose scan of the runs' index each, before)
    heard = queries.heard_from(conn, now)
    counts, lemon_counts, findings, recent, rising = _window_reads(
        conn, now, w_start, w_end, heard
    )
    scored = policy.score(lemon_counts)
    tick(1)
    # the nodes of either window, and those with runs in the period but none in the windows:
    # none when the period is within the lemons' 28 days up to now (every node that ran in
    # them has their counts), else new nodes
    seen = set(counts) | set(lemon_counts)
    if start < now - WINDOW_DAYS * DAY:
        seen.update(_ran_since(heard, start))
    nodes = sorted(seen)
    if sinfo is None:
        states = fleet_summary(node_states(conn, nodes, now), "store")
    else:
        states = fleet_summary([slurm_state(info) for info in sinfo], "sinfo")
    tick(1)
    everything = episodes(failure_records(conn, w_start, w_end))
    refused = list(reads.refused_between(conn, w_start, w_end))
    common = shared_failures(everything, w_end - w_start, refused)
    failures = [f for f in everything if (f[1], f[0]) not in common]
    shared = [f for f in everything if (f[1], f[0]) in common]
    node_days = sum(s["node_days"] for s in counts.values())
    days = round((w_end - w_start) / DAY)
    tick(1)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "tool_version": __version__,
        "generated": timespec.iso(now),
        "period": {
            "start": timespec.iso(start),
            "end": timespec.iso(now),
            "hours": round((now - start) / 3600, 2),
        },
        "window": {"start": timespec.iso(w_start), "end": timespec.iso(w_end), "days": days},
        "fleet": states,
        "actions": period_actions(conn, start, now),
        "freshness": None,  # below, with the jobs read beside
    }
    tick(1)
    doc["runs"], doc["checks"], doc["xids"], cost, jobs = period()
    doc["freshness"] = freshness(heard, now, jobs)
    tick(2)
    doc["lemons"] = {
        "nodes_scored": len(scored),
        "bars": policy.bars(scored),
        "candidates": lemon_candidates(scored, now),
        "afresh": [
            {"node": e["node"], "lines": [clean(x, 300) for x in policy.explain(e, now)]}
            for e in scored
            if not e["lemon"] and e["evidence"]["faults"].get("reset")
        ],
    }
    doc["heatmap"] = heatmap(failures, w_start, scored, days)
    doc["trend"] = trend(failures, w_start, node_days, days, shared)
    doc["rate"] = rate(failures, node_days, shared)
    tick(1)
    found = {n: recent.get(n) for n in nodes}
    doc["drift"] = drift_of.odd_nodes(found, before=_earliest(conn, nodes, now))
    doc["diagnosed"] = diagnosed(conn, start, now)
    doc["slow"] = slow_nodes(conn, now)
    doc["held_back"] = held_back_nodes(findings, _held_from(w_start, w_end), w_end)
    doc["rising"] = rising_counters(rising)
    tick(1)
    doc["cost"] = cost
    tick(1)
    return doc


DIAG_SHOWN = 200  # diagnoses listed at most (the newest)
SILENT_SHOWN = 100  # nodes not heard from, listed at most (the longest silent)


def freshness(heard: dict, now: float, jobs: tuple | None = None) -> dict:
    """When the store's newest run is, whether that makes it stale, the nodes not heard from
    within lemons.SILENT_AFTER_S and those that ran jobs with no run on record (as `slurmhealth
    lemons` says them): first in the report and the mail, since a store nobody collects looks
    like a calm fleet, and so does a node whose hooks never ran. heard:
    queries.heard_from(conn, now); jobs: lemons.jobs_seen(conn, now)."""
    fresh = lemons.freshness(heard, now, jobs=jobs)
    return {
        "newest": timespec.iso(fresh["newest"]) if fresh["newest"] is not None else None,
        "hours": round((now - fresh["newest"]) / 3600, 1) if fresh["newest"] is not None else None,
        "stale": fresh["stale"],
        "after_hours": round(fresh["after"] / 3600, 2),
        "silent": [
            {"node": clean(e["node"], 64), "last": timespec.iso(e["last"])}
            for e in fresh["silent"][:SILENT_SHOWN]
        ],
        "silent_count": len(fresh["silent"]),
        "unguarded": [
            {"node": clean(e["node"], 64), "jobs": e["jobs"]}
            for e in fresh["unguarded"][:SILENT_SHOWN]
        ],
        "unguarded_count": len(fresh["unguarded"]),
        "jobs_hours": round(fresh["jobs_after"] / 3600, 2),
    }


def _key_figures(results: list) -> str:
    """A few figures of a diagnosis, e.g. `nccl busbw_gbps 462; ib_write_bw mlx5_0:1 392`."""
    parts = []
    for result in results:
        try:
            outcomes = json.loads(result["data"]).get("outcomes") or []
        except (ValueError, TypeError, AttributeError):
            continue
        probe = str(result["check_name"]).removeprefix("diag.")
        for o in outcomes[:2]:
            figures = (o.get("figures") or {}) if isinstance(o, dict) else {}
            for name, value in list(figures.items())[:1]:
                if isinstance(value, (int, float)):
                    unit = "" if o.get("unit") in (None, "node") else f" {o['unit']}"
                    parts.append(f"{probe}{unit} {name} {value:g}")
    return clean("; ".join(parts), 200)


def diagnosed(conn: sqlite3.Connection, start: float, end: float) -> list:
    """The period's diagnoses: node, level, outcome, key figures, duration, failures."""
    out = []
    for run in reads.diagnoses(conn, start, end)[-DIAG_SHOWN:]:
        try:
            level = json.loads(run["sources"]).get("diag", {}).get("level", "")
        except (ValueError, TypeError, AttributeError):
            level = ""
        failed = [r for r in run["results"] if r["status"] == "fail"]
        out.append(
            {
                "node": clean(run["node"], 64),
                "time": timespec.iso(run["started"]),
                "level": clean(level, 16),
                # a `warn` diag run is an inconclusive one (no probe of the level could run)
                "outcome": {"ok": "pass", "fail": "fail"}.get(run["verdict"], "inconclusive"),
                "figures": _key_figures(run["results"]),
                "failures": clean(
                    "; ".join(f"{r['check_name']}: {r['message']}" for r in failed), 300
                ),
                "minutes": round((run["duration"] or 0) / 60, 1),
            }
        )
    return out


SLOW_DAYS = 7  # as `slurmhealth slow`: a week of diagnoses
_SLOW_NUMBERS = (
    "value", "peer_median", "peers", "deficit", "peer_group", "peer_groups", "samples",
    "slow_samples",
)  # fmt: skip


def slow_nodes(conn: sqlite3.Connection, now: float) -> dict:
    """The nodes slower than their peers of the same hardware over the SLOW_DAYS before `now`
    (peers.slow at its defaults, as `slurmhealth slow`), worst first; the first LIST_MAX."""
    rows = queries.diag_figures(conn, now - SLOW_DAYS * DAY, now)
    found = peers.slow(rows)
    listed = [
        {
            "node": clean(f["node"], 64),
            "gpu_model": clean(f["gpu_model"], 80),
            "probe": clean(f["probe"], 32),
            "figure": clean(f["figure"], 32),
            "unit": clean(f["unit"], 32),
            **{k: f[k] for k in _SLOW_NUMBERS},
            "evidence": f["evidence"],
        }
        for f in found[:LIST_MAX]
    ]
    return {
        "days": SLOW_DAYS,
        "margin": peers.MARGIN,
        "nodes": len({row[0] for row in rows}),
        "total": len(found),
        "list": listed,
    }


def held_back_nodes(findings: list, start: float, end: float) -> dict:
    """The nodes that held back multi-node jobs ended in [start, end) (the week before the
    lemon window's end, as the lemon sweep reads them; queries.held_back_findings), most jobs
    first: how many, the newest's end, job and evidence, and whether they make the node a
    lemon warning (telemetry.REPEAT jobs or more); the first LIST_MAX."""
    per: dict = {}
    for f in findings:
        row = per.setdefault(f["node"], {"jobs": 0, "newest": f})
        row["jobs"] += 1
        if f["time"] >= row["newest"]["time"]:
            row["newest"] = f
    ranked = sorted(per.items(), key=lambda item: (-item[1]["jobs"], -item[1]["newest"]["time"]))
    listed = [
        {
            "node": clean(node, 64),
            "jobs": row["jobs"],
            "warning": row["jobs"] >= telemetry.REPEAT,
            "last": timespec.iso(row["newest"]["time"]),
            "job": clean(row["newest"]["job"], 40),
            "cause": clean(row["newest"]["finding"]["cause"], 32),
            "evidence": telemetry.words(row["newest"]["finding"]),
        }
        for node, row in ranked[:LIST_MAX]
    ]
    return {
        "start": timespec.iso(start),
        "end": timespec.iso(end),
        "repeat": telemetry.REPEAT,
        "jobs": len(findings),
        "total": len(per),
        "list": listed,
    }


def live_nodes(slurm_bin: str = "", timeout: float = 30.0) -> list:
    """Every node's state as Slurm has it now (one sinfo call); ReportError with one line."""
    try:
        return slurm.Slurm(slurm_bin, timeout).nodes()
    except slurm.SlurmError as exc:
        raise ReportError(f"{exc} (node states from Slurm)") from None


_RISING_NUMBERS = (
    "window_h",
    "episodes",
    "errors",
    "rate_per_h",
    "own_per_h",
    "fleet_per_h",
    "ratio",
)


def rising_counters(rising: tuple) -> dict:
    """The devices whose error counters are rising as of the report's time (trends.rising at
    its defaults, as `slurmhealth trends`), strongest first; the first LIST_MAX. rising:
    queries.rising_counters as of then."""
    found, nodes = rising
    listed = [
        {
            "node": clean(f["node"], 64),
            "device": clean(f["label"], 64),
            "counter": clean(trends.LABELS.get(f["counter"], f["counter"]), 64),
            "basis": f["basis"],
            **{k: f[k] for k in _RISING_NUMBERS},
            "evidence": f["evidence"],
        }
        for f in found[:LIST_MAX]
    ]
    return {
        "nodes": nodes,
        "windows_h": [w / 3600 for w in trends.WINDOWS],
        "factor": trends.FACTOR,
        "total": len(found),
        "list": listed,
    }
