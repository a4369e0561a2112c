"""Job health summaries for job owners: what slurmhealth saw on each node of a job, and a plain
conclusion (hardware fault or not, resubmit or exclude a node). Format and access model:
docs/jobs.md.

Admins build a summary straight from the fleet store. Users cannot read that store (it is
root's): the head node publishes each finished job's summary into the job's AdminComment in
Slurm accounting (`publish`), and users read it back through sacct, where slurmdbd's
`PrivateData=jobs` shows a job to its owner and admins only. Slurm is the access control;
nothing here decides who may read what.

Facts travel, sentences do not: a published summary carries the facts only, and the
conclusion is written where it is read, in the reader's local time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import sqlite3
import time
import zlib

from slurmhealth.core import slurm
from slurmhealth.core.constants import ACT_DRAIN, ACT_RESUME, FAILED_STATES, RUNNING_STATES
from slurmhealth.core.result import clean, counted
from slurmhealth.fleet import queries, telemetry

PREFIX = "slurmhealth:v1:"
FORMAT = 1
# slurmdbd cuts AdminComment at 65,535 bytes silently; a quarter of that leaves room.
COMMENT_MAX = 16_384
ITEMS_MAX = 8  # problems and Xids kept per node in a published summary
UNPACKED_MAX = 4 << 20  # a published summary never inflates beyond this (no zip bomb)
PUBLISH_LATENCY_S = 15 * 60  # the documented collect + publish timer period (docs/jobs.md)
# A drain this long after the job's end still counts as the job's: the epilog drains at the
# end, a health check reading the same fault within a few HealthCheckIntervals (a crashed
# node's first health check comes only when its slurmd is back).
DRAIN_SLACK_S = 1800
SACCT_CHUNK = 100  # job ids per sacct call
PUBLISH_AT_ONCE = 8  # sacctmgr writes at once (publish)
PUBLISH_BUDGET_S = 120.0  # for all the writes of one publish: well inside the 5-minute cycle
# publish looks back to the last publish that wrote all it had to, at most this far (a head
# node down for hours must not leave the jobs that ended meanwhile without a summary)
PUBLISH_CATCH_UP_S = 28 * 86400
PUBLISHED_MARK = "publish:AdminComment"  # the watermarks row of the last complete publish

# What a hardware Xid means to a user, in words (the rest: "a hardware fault on GPU n").
_XID_WORDS = {
    79: "lost {gpu}",
    48: "had an uncorrectable memory error on {gpu}",
    94: "had an uncorrectable memory error on {gpu}",
    95: "had an uncorrectable memory error on {gpu}",
    140: "had an uncorrectable memory error on {gpu}",
    74: "had an NVLink error on {gpu}",
    119: "had a GPU firmware (GSP) timeout on {gpu}",
    120: "had a GPU firmware (GSP) error on {gpu}",
}


class JobError(Exception):
    """A summary that cannot be shown (no such job, not yours, not published yet): one line."""


# ---------------------------------------------------------------------------------------------
# the reads of a job's records (the fleet store on the head node)


def job_rows(conn: sqlite3.Connection, job_id: str) -> list:
    """[{node, uid, user, start, end, exit_code, signal, state, slurm_state, gpu_energy}] of
    the job, one per node, by node."""
    return queries.dicts(
        conn.execute(
            "SELECT node, uid, user, start, end, exit_code, signal, state, slurm_state, "
            "gpu_energy "
            "FROM jobs WHERE job_id = ? ORDER BY node",
            (job_id,),
        )
    )


def hook_runs(conn: sqlite3.Connection, job_id: str) -> dict:
    """{(node, phase): run} of the job's prolog and epilog runs; the latest of each wins (a
    requeued job may start twice on one node)."""
    rows = queries.dicts(
        conn.execute(
            "SELECT id, node, phase, started, verdict FROM runs WHERE job_id = ? "
            "AND phase IN ('prolog', 'epilog') ORDER BY started",
            (job_id,),
        )
    )
    return {(r["node"], r["phase"]): r for r in rows}


def health_checks_not_ok(conn: sqlite3.Connection, node: str, start: float, end: float) -> list:
    """[{id, phase, started}] of the health checks on the node in [start, end] that did not
    pass, oldest first."""
    return queries.dicts(
        conn.execute(
            "SELECT id, phase, started FROM runs WHERE node = ? AND started >= ? "
            "AND started <= ? AND verdict != 'ok' AND phase = 'healthcheck' ORDER BY started",
            (node, start, end),
        )
    )


def problems(conn: sqlite3.Connection, runs: list) -> list:
    """[{phase, time, check, status, message}] of the failed, warning and erroring checks of
    each run ({id, phase, started}), run by run."""
    out = []
    for run in runs:
        rows = conn.execute(
            "SELECT check_name, status, message FROM results WHERE run_id = ? "
            "AND status IN ('fail', 'warn', 'error') ORDER BY check_name",
            (run["id"],),
        )
        for check, status, message in rows:
            out.append(
                {
                    "phase": run["phase"],
                    "time": run["started"],
                    "check": check,
                    "status": status,
                    "message": message,
                }
            )
    return out


def job_xids(conn: sqlite3.Connection, node: str, job_id: str) -> list:
    """[{time, gpu, bus_id, code, class, process}] of the Xids the epilog gave the job on the
    node (those on its GPUs, read after its prolog)."""
    return queries.dicts(
        conn.execute(
            "SELECT time, gpu, bus_id, code, class, process FROM events "
            "WHERE node = ? AND job_id = ? "
            "AND kind = 'xid' ORDER BY time, gpu, code",
            (node, job_id),
        )
    )


def drains_and_resumes(conn: sqlite3.Connection, node: str, since: float) -> list:
    """[(time, action, reason)] of slurmhealth's successful drains and resumes of the node
    from `since` on, oldest first."""
    return conn.execute(
        "SELECT time, action, reason FROM actions WHERE node = ? AND time >= ? AND ok = 1 "
        "AND action IN ('drain', 'resume') ORDER BY time",
        (node, since),
    ).fetchall()


def finished_jobs(conn: sqlite3.Connection, start: float, end: float) -> list:
    """Ids of the jobs with a node that ended in [start, end], in numeric order (store
    migration 4 indexes jobs by end)."""
    rows = conn.execute(
        "SELECT DISTINCT job_id FROM jobs WHERE end >= ? AND end <= ?", (start, end)
    ).fetchall()
    return sorted((r[0] for r in rows), key=lambda j: (len(j), j))


def publish_start(conn: sqlite3.Connection, start: float, end: float) -> float:
    """Where a publish over [start, end] (--since) looks back from: `start`, or earlier where
    the last publish that wrote all it had to ended more than that span before `end` (the
    timer did not run, a write failed): its end less the same span, never more than
    PUBLISH_CATCH_UP_S before `end` (a longer --since is taken as given)."""
    from slurmhealth.core import store  # noqa: PLC0415 - the user side never reads it

    mark = store.mark_of(conn, PUBLISHED_MARK)
    if mark is None:
        return start
    return min(start, max(mark - (end - start), end - PUBLISH_CATCH_UP_S))


def published_digest(conn: sqlite3.Connection, job_id: str) -> str | None:
    """The digest of the summary `publish` last wrote for the job, or None."""
    row = conn.execute("SELECT digest FROM published WHERE job_id = ?", (job_id,)).fetchone()
    return row[0] if row else None


# ---------------------------------------------------------------------------------------------
# building a summary from a store (the fleet store on the head node)


def _drain(conn: sqlite3.Connection, node: str, start: float, end: float) -> dict | None:
    """slurmhealth's first drain of the node in [start, end + slack], and whether no resume of
    ours followed it (an admin's `scontrol update State=RESUME` is not recorded)."""
    rows = drains_and_resumes(conn, node, start)
    drains = [r for r in rows if r[1] == ACT_DRAIN and r[0] <= end + DRAIN_SLACK_S]
    if not drains:
        return None
    when, _, reason = drains[0]
    resumed = any(r[1] == ACT_RESUME and r[0] > when for r in rows)
    return {"time": when, "reason": reason, "still": not resumed}


def _node_facts(
    conn: sqlite3.Connection, job_id: str, row: dict, runs: dict, job_end: float | None
) -> dict:
    node = row["node"]
    prolog, epilog = runs.get((node, "prolog")), runs.get((node, "epilog"))
    start = row["start"] if row["start"] is not None else (prolog or {}).get("started", 0.0)
    # A node that crashed has no end of its own: the job ended when its other nodes (or Slurm
    # accounting) say so; what the node's health checks find after that is not the job's.
    end = row["end"] if row["end"] is not None else job_end or time.time()
    unhealthy = health_checks_not_ok(conn, node, start, end)
    checked = [r for r in (prolog, epilog) if r] + unhealthy
    return {
        "node": node,
        "state": row["state"],
        "slurm_state": row["slurm_state"],
        "start": row["start"],
        # Slurm's NODE_FAIL time is when the crashed node's part of the job ended
        "end": row["end"] if row["end"] is not None or row["slurm_state"] != "NODE_FAIL" else end,
        "prolog": prolog["verdict"] if prolog else None,
        "epilog": epilog["verdict"] if epilog else None,
        "problems": problems(conn, sorted(checked, key=lambda r: r["started"])),
        "xids": job_xids(conn, node, job_id),
        "drain": _drain(conn, node, start, end),
    }


def _first(rows: list, key: str) -> object:
    return next((r[key] for r in rows if r[key] is not None), None)


def _job_facts(job_id: str, rows: list, nodes: list) -> dict:
    ran = [r for r in rows if r["state"] != "prolog_failed"] or rows
    starts = [r["start"] for r in rows if r["start"] is not None]
    ends = [r["end"] for r in rows if r["end"] is not None]
    return {
        "format": FORMAT,
        "job": job_id,
        "user": _first(rows, "user"),
        "uid": _first(rows, "uid"),
        "state": _first(rows, "slurm_state"),
        "exit_code": _first(ran, "exit_code"),
        "signal": _first(ran, "signal"),
        "start": min(starts) if starts else None,
        "end": max(ends) if ends else None,
        "nodes": nodes,
        "ok_nodes": [],
        "omitted": 0,
    }


def facts(conn: sqlite3.Connection, job_id: str) -> dict:
    """What the store knows of a job, node by node (no conclusion); JobError if nothing."""
    rows = job_rows(conn, job_id)
    if not rows:
        raise JobError(f"job {clean(job_id, 40)}: not in the fleet store")
    runs = hook_runs(conn, job_id)
    ends = [r["end"] for r in rows if r["end"] is not None]
    nodes = [_node_facts(conn, job_id, row, runs, max(ends, default=None)) for row in rows]
    data = _job_facts(job_id, rows, nodes)
    _add_telemetry(conn, data, {r["node"]: r["gpu_energy"] for r in rows})
    return data


def _add_telemetry(conn: sqlite3.Connection, data: dict, energy: dict) -> None:
    """Each node's GPU slowdown, error-counter increases and mean GPU power during the job
    (`telemetry`) and the node that held it back (`held_back`; fleet/telemetry.py,
    docs/trends.md). The fleet store's view only: a published summary does not carry them. A
    job still running gets its figures so far and no finding: its epilogs' readings, which
    close the job, are not in yet."""
    spans = []
    for node in data["nodes"]:
        if _refused(node) or node.get("start") is None:
            continue
        end = node["end"] if node.get("end") is not None else data.get("end") or time.time()
        spans.append((node["node"], node["start"], max(end, node["start"])))
    figures = queries.job_telemetry(conn, spans)
    clocks = {}
    for node in data["nodes"]:
        node["telemetry"] = figures.get(node["node"])
        if node["telemetry"] is not None:
            node["telemetry"]["power"] = telemetry.power(energy.get(node["node"]))
            node["telemetry"]["clocks"] = telemetry.clock_figures(energy.get(node["node"]))
            clocks[node["node"]] = node["telemetry"]["clocks"]
    data["held_back"] = None
    ran = [n for n in data["nodes"] if not _refused(n)]
    if spans and not _still_running(data, ran):
        duration = max(s[2] for s in spans) - min(s[1] for s in spans)
        found = telemetry.held_back(figures, duration, clocks)
        data["held_back"] = dict(found, evidence=telemetry.words(found)) if found else None


def summary(conn: sqlite3.Connection, job_id: str) -> dict:
    """The job's summary: facts per node plus verdict, conclusion and nodes to exclude."""
    return with_conclusion(facts(conn, job_id))


# ---------------------------------------------------------------------------------------------
# the conclusion (pure: facts in, words out)


def local_time(epoch: float | None) -> str:
    """Local time with the date and zone: a user reads it next to their own job's output."""
    if epoch is None:
        return "an unknown time"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch))
    except (TypeError, ValueError, OverflowError, OSError):  # a damaged summary's time
        return "an unknown time"


def _refused(node: dict) -> bool:
    return node.get("state") == "prolog_failed" or node.get("prolog") == "fail"


def gpu_words(xid: dict) -> str:
    """`GPU 3 (0000:5d:00)`, as the node's checks and Reasons name it (node/checks/xid.where);
    `GPU 0000:5d:00` for a GPU NVML did not list (off the bus); `GPU 3` or `GPU ?` in a
    summary published before it carried the bus id."""
    gpu, bus = xid.get("gpu"), xid.get("bus_id")
    bus = clean(bus, 20) if bus else ""
    if gpu is None:
        return f"GPU {bus or '?'}"
    return f"GPU {clean(gpu, 20)} ({bus})" if bus else f"GPU {clean(gpu, 20)}"


def _xid_words(xid: dict) -> str:
    code, words = xid.get("code"), "had a hardware fault on {gpu}"
    if isinstance(code, int):  # an int or None (_XID_FIELDS)
        words = _XID_WORDS.get(code, words)
    return f"{words.format(gpu=gpu_words(xid))} (Xid {clean(code, 20)})"


def fault(node: dict) -> str:
    """What went wrong on a node during the job, as words, or '' when nothing hardware did."""
    hardware = [x for x in node.get("xids", []) if x.get("class") == "fail"]
    if hardware:
        more = len(hardware) - 1 + node.get("more_xids", 0)
        extra = f" (and {counted(more, 'more hardware Xid')})" if more > 0 else ""
        return f"{_xid_words(hardware[0])} at {local_time(hardware[0].get('time'))}{extra}"
    for problem in node.get("problems", []):
        if problem.get("status") == "fail" and problem.get("phase") != "prolog":
            what = f"{clean(problem.get('check'), 40)} ({clean(problem.get('message'), 120)})"
            return f"failed {what} at {local_time(problem.get('time'))}"
    # Slurm marks every node of a job NODE_FAIL when one of them fails: the one that failed
    # is the one whose epilog never ran (the others ran theirs when the job was killed).
    if node.get("slurm_state") == "NODE_FAIL" and node.get("epilog") is None:
        return f"stopped responding (Slurm: NODE_FAIL) at {local_time(node.get('end'))}"
    return ""


def _drain_words(node: dict) -> str:
    drain = node.get("drain")
    if not drain:
        return "the node was not drained"
    if drain.get("still"):
        return "the node is drained"
    return "the node was drained and has since passed its checks and returned to service"


def _refusal(node: dict) -> str:
    fails = [p for p in node.get("problems", []) if p.get("phase") == "prolog"]
    found = fails[0].get("message") if fails else "a failing check"
    return f"the prolog on {node['node']} found {clean(found, 120)} before your job started"


def _refused_sentence(refused: list, ran: list) -> str:
    refusals = "; ".join(_refusal(n) for n in refused)
    if ran:
        return f"{refusals}: the node was refused and Slurm requeued your job and it ran on " + (
            ", ".join(ran)
        )
    return (
        f"{refusals}: the node was refused, so your job never ran there; Slurm requeues such a "
        "job (unless it was submitted with --no-requeue) and resubmitting is safe"
    )


def exit_words(data: dict) -> str:
    if data.get("signal"):
        return f" (killed by signal {clean(data['signal'], 20)})"
    if data.get("exit_code"):
        return f" (exit code {clean(data['exit_code'], 20)})"
    if data.get("state") in FAILED_STATES:
        return f" (Slurm: {data['state']})"
    return ""


def _failed(data: dict) -> bool:
    return bool(data.get("exit_code") or data.get("signal")) or data.get("state") in FAILED_STATES


def _app_xids(nodes: list) -> str:
    seen = [(n["node"], x) for n in nodes for x in n.get("xids", []) if x.get("class") == "app"]
    if not seen:
        return ""
    node, xid = seen[0]
    return (
        f"; {gpu_words(xid)} on {node} reported Xid {clean(xid.get('code'), 20)} at "
        f"{local_time(xid.get('time'))}, which is usually the application's own error"
    )


def _hardware(faulty: list) -> tuple:
    """(sentence, nodes to exclude) for the nodes with a fault during the job."""
    parts = [
        f"node {n['node']} {fault(n)} during your job: a hardware fault, not your code; "
        f"{_drain_words(n)}"
        for n in faulty
    ]
    exclude = [n["node"] for n in faulty if not n.get("drain")]
    if exclude:
        them = "it" if len(exclude) == 1 else "them"
        advice = f"resubmit excluding {them} with --exclude={','.join(exclude)}"
    else:
        advice = "resubmitting is safe"
    return "; ".join(parts) + f"; {advice}", exclude


def _still_running(data: dict, ran: list) -> bool:
    if data.get("state") in RUNNING_STATES:
        return True
    return data.get("state") is None and all(n.get("state") == "running" for n in ran)


def conclude(data: dict) -> dict:
    """{verdict, conclusion, exclude}: hardware (a fault during the job), refused (the prolog
    refused every node it got: it never ran), running, incomplete (a node's epilog is
    missing), failed (no fault seen, the job failed) or ok."""
    nodes = data.get("nodes", [])
    refused = [n for n in nodes if _refused(n)]
    ran = [n for n in nodes if not _refused(n)]
    ran_names = sorted([n["node"] for n in ran] + list(data.get("ok_nodes", [])))
    lead = _refused_sentence(refused, ran_names) + ". " if refused else ""
    faulty = [n for n in ran if fault(n)]
    if faulty:
        sentence, exclude = _hardware(faulty)
        return {"verdict": "hardware", "conclusion": lead + sentence, "exclude": exclude}
    if refused and not ran_names:
        return {"verdict": "refused", "conclusion": lead[:-2], "exclude": []}
    if _still_running(data, ran) and ran:
        text = "your job is still running: its summary is final once it has ended"
        return {"verdict": "running", "conclusion": lead + text, "exclude": []}
    missing = [n["node"] for n in ran if n.get("epilog") is None]
    if missing:
        text = (
            f"summary incomplete: no epilog recorded on {', '.join(missing)} (the node may "
            "have crashed, or its records are not collected yet); no hardware fault seen so far"
        )
        return {"verdict": "incomplete", "conclusion": lead + text, "exclude": []}
    if data.get("state") == "NODE_FAIL":
        text = (
            "Slurm ended your job with NODE_FAIL, but every node ran its epilog and slurmhealth "
            "saw no fault on them: the failure was outside what it checks (the network, Slurm "
            "itself); not your code; resubmitting is likely safe"
        )
        return {"verdict": "node_fail", "conclusion": lead + text, "exclude": []}
    if _failed(data) or not ran_names:
        text = "no hardware fault seen: look at your application's output" + exit_words(data)
        return {"verdict": "failed", "conclusion": lead + text + _app_xids(ran), "exclude": []}
    text = "no hardware fault seen; your job ended normally"
    return {"verdict": "ok", "conclusion": lead + text + _app_xids(ran), "exclude": []}


def with_conclusion(data: dict) -> dict:
    out = dict(data)
    out.update(conclude(data))
    return out


# ---------------------------------------------------------------------------------------------
# the AdminComment form: one line, no `|`, no quotes, bounded


def _quiet(node: dict) -> bool:
    """Nothing to say about this node: published as a name only."""
    return (
        node.get("prolog") == "ok"
        and node.get("epilog") == "ok"
        and not node.get("problems")
        and not node.get("xids")
        and not node.get("drain")
        and node.get("slurm_state") != "NODE_FAIL"
    )


def _bounded_node(node: dict) -> dict:
    out = {k: node.get(k) for k in ("node", "state", "slurm_state", "start", "end")}
    out.update(prolog=node.get("prolog"), epilog=node.get("epilog"))
    problems, xids = node.get("problems", []), node.get("xids", [])
    out["problems"] = [
        dict(p, message=clean(p.get("message"), 160), check=clean(p.get("check"), 40))
        for p in problems[:ITEMS_MAX]
    ]
    out["xids"] = [dict(x, process=clean(x.get("process") or "", 40)) for x in xids[:ITEMS_MAX]]
    out["more_problems"] = max(0, len(problems) - ITEMS_MAX) + node.get("more_problems", 0)
    out["more_xids"] = max(0, len(xids) - ITEMS_MAX) + node.get("more_xids", 0)
    drain = node.get("drain")
    out["drain"] = dict(drain, reason=clean(drain.get("reason"), 160)) if drain else None
    return out


def _priority(node: dict) -> tuple:
    """Nodes that decide the conclusion first: undrained faults, faults, refusals."""
    has_fault = bool(fault(node)) and not _refused(node)
    return (not (has_fault and not node.get("drain")), not has_fault, not _refused(node))


def compact(data: dict) -> dict:
    """The facts to publish: quiet nodes as names, lists bounded, no conclusion (written where
    it is read, in the reader's time zone)."""
    keys = ("format", "job", "user", "uid", "state", "exit_code", "signal", "start", "end")
    out = {k: data.get(k) for k in keys}
    nodes = data.get("nodes", [])
    out["ok_nodes"] = sorted([n["node"] for n in nodes if _quiet(n)] + data.get("ok_nodes", []))
    out["nodes"] = sorted(
        (_bounded_node(n) for n in nodes if not _quiet(n)),
        key=lambda n: (_priority(n), n["node"]),
    )
    out["omitted"] = data.get("omitted", 0)
    return out


def _encoded(data: dict) -> str:
    """`slurmhealth:v1:` + base32 of zlib'd JSON, lower case, no padding. Measured on Slurm
    22.05: sacctmgr lower-cases an AdminComment, turns both quote characters into backticks and
    strips a leading one, and `sacct -P` does not escape `|`. JSON would not survive that; this
    alphabet (a-z, 2-7) does, and compression more than pays for base32's 60%."""
    body = json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
    packed = base64.b32encode(zlib.compress(body.encode("ascii"), 9)).decode("ascii")
    return PREFIX + packed.rstrip("=").lower()


def encode(data: dict, limit: int = COMMENT_MAX) -> str:
    """The AdminComment, at most `limit` bytes. Too big, it sheds the quiet nodes' names (their
    count stays), then the least telling nodes, a quarter at a time (each one counted)."""
    out = compact(data)
    text = _encoded(out)
    if len(text) > limit:
        out["ok_count"] = len(out.pop("ok_nodes")) + int(out.get("ok_count", 0))
        out["ok_nodes"] = []
        text = _encoded(out)
    while len(text) > limit and out["nodes"]:
        drop = max(1, len(out["nodes"]) // 4)
        del out["nodes"][-drop:]
        out["omitted"] += drop
        text = _encoded(out)
    return text


def ours(comment: str) -> bool:
    return comment.startswith(PREFIX)


def _unpacked(comment: str) -> object:
    packed = comment[len(PREFIX) :].strip().upper()
    raw = base64.b32decode(packed + "=" * (-len(packed) % 8))
    inflate = zlib.decompressobj()
    body = inflate.decompress(raw, UNPACKED_MAX)
    if inflate.unconsumed_tail:
        raise ValueError("too big")
    if not inflate.eof:
        raise ValueError("cut")
    return json.loads(body)  # deep nesting: RecursionError


def decode(comment: str) -> dict:
    """The published facts back, with the conclusion written here; JobError when the comment
    is not a summary this slurmhealth can read."""
    if not ours(comment):
        raise JobError("not a slurmhealth summary")
    try:
        data = _unpacked(comment)
    except (ValueError, zlib.error, RecursionError):
        raise JobError("the published summary is damaged (cut or edited)") from None
    version = data.get("format") if isinstance(data, dict) else None
    if not isinstance(data, dict) or type(version) is not int or version != FORMAT:  # not True
        raise JobError("the published summary has a format this slurmhealth cannot read")
    if not _sane(data):
        raise JobError("the published summary is damaged (unexpected structure)")
    data.pop("held_back", None)  # never published (_add_telemetry): a forged one is dropped
    for node in data["nodes"]:
        node.pop("telemetry", None)
    return with_conclusion(data)


# What conclude() and the summary's text (fleet/text.py) rely on, field by field: a comment is
# admin-written, but a damaged or forged one must give a message, not a traceback. A kind:
# "text" (str), "int", "time" (a finite number), "count" (an int >= 0, never null), "scalar"
# (any JSON scalar: cleaned where printed); null or missing is allowed but for counts
# (missing: 0).
_SUMMARY_FIELDS = {
    "job": "scalar", "user": "scalar", "uid": "scalar", "state": "text", "exit_code": "int",
    "signal": "int", "start": "time", "end": "time", "omitted": "count", "ok_count": "count",
}  # fmt: skip
_NODE_FIELDS = {
    "state": "text", "slurm_state": "text", "prolog": "text", "epilog": "text",
    "start": "time", "end": "time", "more_problems": "count", "more_xids": "count",
}  # fmt: skip
_PROBLEM_FIELDS = {
    "phase": "text", "time": "time", "check": "scalar", "status": "scalar", "message": "scalar"
}  # fmt: skip
_XID_FIELDS = {
    "time": "time", "gpu": "int", "bus_id": "scalar", "code": "int", "class": "text",
    "process": "scalar",
}  # fmt: skip
_DRAIN_FIELDS = {"time": "time", "reason": "scalar", "still": "scalar"}


def _fits(value: object, kind: str) -> bool:
    if value is None:
        return kind != "count"
    if kind == "text":
        return isinstance(value, str)
    if kind == "scalar":
        return isinstance(value, (str, int, float))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "time":
        return math.isfinite(value)
    return isinstance(value, int) and (kind == "int" or value >= 0)


def _fields(record: object, spec: dict) -> bool:
    if not isinstance(record, dict):
        return False
    return all(k not in record or _fits(record[k], kind) for k, kind in spec.items())


def _records(node: dict, key: str, spec: dict) -> bool:
    items = node.setdefault(key, [])
    return isinstance(items, list) and all(_fields(i, spec) for i in items)


def _sane(data: dict) -> bool:
    """Every field conclude() and the summary's text (fleet/text.py) read has the type they
    expect."""
    nodes, names = data.get("nodes"), data.setdefault("ok_nodes", [])
    if not isinstance(nodes, list) or not isinstance(names, list):
        return False
    if not _fields(data, _SUMMARY_FIELDS) or not all(isinstance(n, str) for n in names):
        return False
    for node in nodes:
        if not _fields(node, _NODE_FIELDS) or not isinstance(node.get("node"), str):
            return False
        if not _records(node, "problems", _PROBLEM_FIELDS):
            return False
        if not _records(node, "xids", _XID_FIELDS):
            return False
        drain = node.get("drain")
        if drain is not None and not _fields(drain, _DRAIN_FIELDS):
            return False
    return True


def digest(comment: str) -> str:
    return hashlib.sha256(comment.encode("utf-8")).hexdigest()[:32]


# ---------------------------------------------------------------------------------------------
# publishing (head node, as an admin) and reading back (login node, as the job's owner)


def _recorded(data: dict) -> bool:
    """Did a slurmhealth hook run for the job anywhere (not only accounting rows)?"""
    return any(n.get("prolog") or n.get("epilog") for n in data["nodes"])


def pending(conn: sqlite3.Connection, job_ids: list) -> tuple:
    """([(job, comment, digest)] to write, unchanged count, [jobs without hook records])."""
    todo, unchanged, unrecorded = [], 0, []
    for job_id in job_ids:
        data = facts(conn, job_id)
        if not _recorded(data):
            unrecorded.append(job_id)
            continue
        comment = encode(data)
        sign = digest(comment)
        if published_digest(conn, job_id) == sign:
            unchanged += 1
        else:
            todo.append((job_id, comment, sign))
    return todo, unchanged, unrecorded


def parse_comments(text: str) -> dict:
    """`sacct -P -o JobIDRaw,AdminComment` -> {job: comment}. sacct -P escapes nothing: a
    foreign comment may hold `|` (kept: split once) or newlines (continuation lines)."""
    out: dict = {}
    last = None
    for line in text.split("\n"):
        head, bar, rest = line.partition("|")
        if bar and head.isdigit():
            last = head
            out[last] = rest
        elif last is not None and line:
            out[last] += "\n" + line
    return out


def read_comments(client: slurm.Slurm, job_ids: list) -> dict:
    """The current AdminComment of each job that accounting knows (every user's: -a)."""
    found: dict = {}
    for i in range(0, len(job_ids), SACCT_CHUNK):
        ids = ",".join(job_ids[i : i + SACCT_CHUNK])
        text = client.run(
            "-X", "-n", "-P", "-a", "-j", ids, "-o", "JobIDRaw,AdminComment", command="sacct"
        )
        found.update(parse_comments(text))
    return found


def write_comment(client: slurm.Slurm, job_id: str, comment: str) -> None:
    if not job_id.isdigit() or "|" in comment or "\n" in comment:
        raise slurm.SlurmError(f"refusing to write job {clean(job_id, 40)}'s comment")
    where = ["-i", "modify", "job", "where", f"jobid={job_id}"]
    client.run(*where, "set", f"AdminComment={comment}", command="sacctmgr")


def private(client: slurm.Slurm) -> bool:
    """Does slurmdbd hide jobs from other users (PrivateData=jobs in slurmdbd.conf)? sacct obeys
    only slurmdbd's setting, which `sacctmgr show configuration` prints in its second part."""
    text = client.run("-n", "show", "configuration", command="sacctmgr")
    _, _, dbd = text.partition("SlurmDBD configuration:")
    for line in dbd.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PrivateData":
            return "jobs" in value.lower()
    return False


def _remember(conn: sqlite3.Connection, job_id: str, sign: str, comment: str) -> None:
    from slurmhealth.core import store  # noqa: PLC0415 - the user side never writes

    store.record_published(conn, job_id, sign, len(comment))


def _write_one(client: slurm.Slurm, job_id: str, comment: str, ends: float = math.inf) -> str:
    """Write one job's comment: "" when written, else why not (one line). Not begun once the
    publish's budget (`ends`, monotonic) is spent."""
    if time.monotonic() >= ends:
        return f"not written: publish's {PUBLISH_BUDGET_S:g} s for Slurm spent (the next publish)"
    try:
        write_comment(client, job_id, comment)
    except slurm.SlurmError as exc:
        return clean(exc, 160)
    return ""


def publish(
    conn: sqlite3.Connection,
    client: slurm.Slurm,
    start: float,
    end: float,
    check_privacy: bool = True,
) -> dict:
    """Write the summary of every job that ended in [start, end] into its AdminComment, once.

    Only changed summaries are written (their digest is kept in `published`); an AdminComment
    another tool wrote is never touched, only reported. Returns {published, unchanged,
    foreign [(job, their comment)], unknown (not in accounting), unrecorded (no slurmhealth
    records), failed [(job, why)]}.
    """
    if check_privacy and not private(client):
        raise JobError(
            "slurmdbd.conf lacks PrivateData=jobs: every user could read every job's summary "
            "with sacct; set it and restart slurmdbd (or pass --public; the periodic collect "
            "job: SLURMHEALTH_PUBLISH=no in /etc/slurmhealth/periodic.env)"
        )
    todo, unchanged, unrecorded = pending(conn, finished_jobs(conn, start, end))
    report: dict = {"published": [], "unchanged": unchanged, "foreign": [], "unknown": []}
    report.update(unrecorded=unrecorded, failed=[])
    current = read_comments(client, [job for job, _, _ in todo]) if todo else {}
    ours_now = []
    writes: list[tuple[str, str]] = []  # (job, comment)
    for job_id, comment, sign in todo:
        existing = current.get(job_id)
        if job_id not in current:
            report["unknown"].append(job_id)
        elif existing and not ours(existing):
            report["foreign"].append((job_id, clean(existing, 60)))
        else:
            ours_now.append((job_id, comment, sign))
            if existing != comment:
                writes.append((job_id, comment))
    # Each sacctmgr waits on slurmdbd far longer than it spends on its own CPU (measured by
    # bench/bench_publish.py: docs/benchmarks.md), so one at a time a busy fleet's publish
    # crowds the 5-minute cycle. A few at once keep it well inside. The store is written on
    # this thread once they are done.
    # All the writes together get PUBLISH_BUDGET_S: a slurmdbd that hangs on writes (reads
    # answering) made each batch wait out its timeout, past the collect timer's cycle; the jobs
    # not written are reported and written by the next publish.
    failed = {}
    if writes:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - admin side only

        ends = time.monotonic() + PUBLISH_BUDGET_S
        with ThreadPoolExecutor(min(PUBLISH_AT_ONCE, len(writes))) as pool:
            outcomes = pool.map(lambda w: _write_one(client, w[0], w[1], ends=ends), writes)
            failed = {job_id: why for (job_id, _), why in zip(writes, outcomes) if why}
    for job_id, comment, sign in ours_now:
        if job_id in failed:
            report["failed"].append((job_id, failed[job_id]))
            continue
        _remember(conn, job_id, sign, comment)
        report["published"].append(job_id)
    if not report["failed"]:
        from slurmhealth.core import store  # noqa: PLC0415 - the user side never writes

        store.record_mark(conn, PUBLISHED_MARK, end)
    return report


def job_id_arg(text: str) -> str:
    """A job id as sacct takes it: 123, an array task 123_4 or a heterogeneous job's
    component 123+1."""
    head, mark, part = text.partition("_") if "_" in text else text.partition("+")
    digits = text.isascii() and head.isdigit() and (not mark or part.isdigit())
    if not digits or len(text) > 32:
        raise JobError(f"not a job id: {clean(text, 40)!r} (e.g. 12345, 12345_7, 12345+1)")
    return text


def _sacct_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _not_published(job_id: str, state: str, ended: str, now: float) -> str:
    if (state.split(maxsplit=1) or ["?"])[0] in RUNNING_STATES:
        said = clean(state.lower(), 40)
        return f"job {job_id} is {said}: its health summary is published after it ends"
    end = _sacct_time(ended)
    if end is not None and now < end + 2 * PUBLISH_LATENCY_S:
        by = local_time(end + PUBLISH_LATENCY_S)
        return (
            f"no health summary for job {job_id} yet: summaries are published within about "
            f"{PUBLISH_LATENCY_S // 60} minutes of a job's end (expect it by {by})"
        )
    return (
        f"no health summary was published for job {job_id} (ended {local_time(end)}): "
        "slurmhealth may not run on its nodes; ask your admins"
    )


def from_accounting(client: slurm.Slurm, job_id: str, now: float | None = None) -> dict:
    """The published summary, read through sacct as the caller: slurmdbd's PrivateData=jobs
    shows the job to its owner and admins only."""
    fields = "JobID,User,State,End,AdminComment"
    text = client.run("-X", "-n", "-P", "-j", job_id, "-o", fields, command="sacct")
    line = text.split("\n", 1)[0]
    if not line.strip():
        raise JobError(f"job {job_id} not found, or not yours (Slurm shows you only your own jobs)")
    _, user, state, ended, comment = (line.split("|", 4) + ["", "", "", ""])[:5]
    if not comment.strip():
        raise JobError(_not_published(job_id, state.strip() or "?", ended, now or time.time()))
    if not ours(comment):
        raise JobError(f"job {job_id} has no slurmhealth summary (another tool's comment)")
    data = decode(comment)
    return dict(data, source="accounting")


def _from_fleet(path: str, job_id: str) -> dict | None:
    """The summary from the fleet store when this caller may read it (admins), else None."""
    from slurmhealth.core import store  # noqa: PLC0415

    if path.startswith(store.SERVER_PREFIXES):  # PostgreSQL: readable if this user may log in
        return _from_server(path, job_id)
    if not _readable(path):
        return None
    try:
        conn = store.connect(path)
    except store.StoreError as exc:  # readable, but refused (unsafe, not a store...): say why
        why = store.kept_out(path)  # or SQLite may not write beside it (read by its group)
        if why is not None:
            where = f"fleet store {clean(path, 200)} cannot be used: {clean(why, 300)}"
            raise JobError(f"{where}: run as root, or --db a copy you own") from None
        raise JobError(f"fleet store cannot be used: {clean(exc, 300)}") from None
    try:
        return dict(summary(conn, job_id), source="fleet store")
    except JobError:
        return None
    except sqlite3.Error as exc:  # readable but damaged: say so rather than guess
        raise JobError(f"fleet store {clean(path, 200)}: {clean(exc, 200)}") from None
    finally:
        conn.close()


def _from_server(url: str, job_id: str) -> dict | None:
    """_from_fleet on a PostgreSQL server: None when this user may not connect (the published
    summary then), JobError when the store lacks the job."""
    from slurmhealth.core import store  # noqa: PLC0415
    from slurmhealth.fleet import pgstore  # noqa: PLC0415

    try:
        conn = pgstore.connect(url, existing=True)
    except store.StoreError:
        return None
    try:
        return dict(summary(conn, job_id), source="fleet store")
    except JobError:
        raise JobError(_missing(job_id, pgstore.shown(url))) from None
    except sqlite3.Error as exc:
        raise JobError(f"fleet store {clean(pgstore.shown(url), 200)}: {clean(exc, 200)}") from None
    finally:
        conn.close()


def _missing(job_id: str, where: str) -> str:
    return (
        f"job {job_id} is not in the fleet store {clean(where, 200)} "
        "(not collected yet, or no job of these nodes)"
    )


def lookup(job_id: str, fleet_path: str, slurm_bin: str = "") -> dict:
    """`slurmhealth job`: from the fleet store if readable (JobError when it lacks the job),
    else from the job's AdminComment through sacct. JobError with one line for the user."""
    job_id = job_id_arg(job_id)
    found = _from_fleet(fleet_path, job_id)
    if found is not None:
        return found
    if _readable(fleet_path):
        # The admin's store lacks the job: sacct can show no more (`publish` writes summaries
        # from this store), and on a head node without slurm.conf it fails with a DNS error.
        raise JobError(_missing(job_id, fleet_path))
    try:
        return from_accounting(slurm.Slurm(slurm_bin, timeout=30.0), job_id)
    except slurm.SlurmError as exc:
        why = clean(exc, 300)
        raise JobError(f"cannot read job {job_id} from Slurm accounting: {why}") from None


def _readable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.R_OK)
