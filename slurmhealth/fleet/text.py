"""The plain text of the head-node commands' answers (`history`, `lemons`, `slow`, `trends`,
`job`, `publish`, `collect`, `import`, `prune`, `diagnose --submit`, `rma`): every line a person
reads in a terminal or a cron mail is written here, from the dicts the library returns (their JSON
form is those dicts as they are). Every stored string is untrusted (kernel-log names, check
messages, node names of imported exports): cleaned here.

The nightly report's HTML and Markdown are report/render.py's (jinja2); the text is here, below
the report, because the fleet's own command orchestration (fleet/collect.py, diagnose.py)
writes its lines as it goes, and the fleet never imports the report.
"""

from __future__ import annotations

from slurmhealth.core import timespec
from slurmhealth.core.result import clean, counted
from slurmhealth.fleet import jobs, policy, telemetry

# --- node stores and the fleet store (`history`, `prune`, `import`, `collect`) ----------------


def when(epoch: object) -> str:
    """A stored time as ISO 8601 UTC; a stored value that is no time, as cleaned text."""
    if isinstance(epoch, (int, float)):  # not None: time.gmtime(None) is the current time
        try:
            return timespec.iso(epoch)
        except (ValueError, OverflowError, OSError):  # NaN, past what gmtime takes
            pass
    return clean(epoch, 20)


HISTORY_COUNTERS = 5  # counter increases shown per run in `history` (all in --json)


def history(runs: list, actions: list) -> str:
    """Every stored string is untrusted (imported exports, copied stores): cleaned here."""
    lines = [f"{'TIME':<20}  {'NODE':<10}  {'PHASE':<11}  {'JOB':<8}  {'VERDICT':<7}  PROBLEMS"]
    for run in runs:
        problems = "; ".join(
            f"{clean(p['check'])} {clean(p['status'])}: {clean(p['message'])}"
            for p in run["problems"]
        )
        rising = [c for c in run.get("counters") or () if isinstance(c.get("delta"), (int, float))]
        if rising:
            problems += (
                ("; " if problems else "")
                + "counters: "
                + ", ".join(
                    f"{clean(c['device'], 40)} {clean(c['counter'], 40)} +{c['delta']:g}"
                    for c in rising[:HISTORY_COUNTERS]
                )
            )
            if len(rising) > HISTORY_COUNTERS:
                problems += f" (+{len(rising) - HISTORY_COUNTERS} more)"
        lines.append(
            f"{when(run['started']):<20}  {clean(run['node']):<10}  {clean(run['phase']):<11}  "
            f"{clean(run['job'] or '-'):<8}  {clean(run['verdict']):<7}  {problems}"
        )
    if actions:
        lines += ["", f"{'TIME':<20}  {'NODE':<10}  {'ACTION':<13}  BY / REASON"]
        for act in actions:
            detail = clean(act["detail"]) if act.get("detail") else ""
            failed = f" ({detail})" if detail else ""  # e.g. a reboot: `requested: 1 of 2 ...`
            if not act["ok"]:
                failed = f" (FAILED: {detail})"
            lines.append(
                f"{when(act['time']):<20}  {clean(act['node']):<10}  "
                f"{clean(act['action']):<13}  {clean(act['actor'])}: {clean(act['reason'])}{failed}"
            )
    return "\n".join(lines)


def pruned(path: str, counts: dict, dry_run: bool) -> str:
    """One store's `prune`: the rows of each table deleted (or that would be)."""
    summary = ", ".join(counted(n, row_of(table), table, ",") for table, n in counts.items())
    verb = "would delete" if dry_run else "deleted"
    return f"{path}: {verb} {summary}" + (" (dry run: nothing deleted)" if dry_run else "")


def row_of(table: str) -> str:
    """What one row of a store table is called: `run` of runs; `published` stays."""
    return table[:-1] if table.endswith("s") else table


def added(counts: dict) -> str:
    return ", ".join(counted(n, kind, spec=",") for kind, n in counts.items() if n) or "nothing new"


def skipped_lines(name: str, report: dict) -> list:
    """The lines of an import (records.import_ndjson's report) that were skipped, for standard
    error: the first few each with its line number, the rest counted, a cut last line."""
    name = clean(name, 300)  # a spool's file names are any node's to choose
    lines = [f"{name}:{lineno}: skipped: {clean(why)}" for lineno, why in report["bad"]]
    more = report["bad_count"] - len(report["bad"])
    if more > 0:
        lines.append(f"{name}: {counted(more, 'more line', spec=',')} skipped")
    if report["truncated"]:
        line = report["truncated"]
        lines.append(f"{name}:{line}: skipped: truncated last line (still being written?)")
    return lines


def imported(name: str, report: dict) -> str:
    """One file's `import` (records.import_ndjson's report)."""
    return (
        f"{clean(name, 300)}: {counted(report['records'], 'record', spec=',')}: "
        f"{added(report['added'])} "
        f"added, {report['unchanged']:,} unchanged"
    )


def collect_skipped(report: dict) -> list:
    """The files `collect` skipped or kept, and the lines of its imports skipped (collect.collect's
    report), for standard error."""
    lines = [f"{clean(path, 300)}: skipped: {clean(why)}" for path, why in report["skipped"]]
    lines += [f"{clean(path, 300)}: kept: {clean(why)}" for path, why in report["kept"]]
    for path, result in report["imports"]:
        lines += skipped_lines(path, result)
    return lines


def collected(report: dict) -> str:
    """`collect`'s files: how many merged and skipped, and what they added."""
    merged, skipped = len(report["merged"]), len(report["skipped"])
    unchanged = f", {len(report['unchanged'])} unchanged" if report["unchanged"] else ""
    return (
        f"{counted(merged, 'file')} merged, {skipped} skipped{unchanged}: "
        f"{added(report['added'])} added"
    )


RMA_STORES = {
    "fleet": "the fleet store",
    "node": "the node's own store",
    "named": "the store --db names",
}


def rma(output: str, manifest: dict) -> list:
    """`rma`'s lines (fleet/rma.py's manifest): where the bundle went, of which node, period
    and store, what it holds, and each member left out and why."""
    counts = manifest["counts"]
    period = manifest["period"]
    held = ", ".join(
        (
            counted(counts["runs_not_passed"], "run", "runs", ",") + " that did not pass",
            counted(counts["actions"], "action", spec=","),
            counted(counts["xid_events"], "Xid event", spec=","),
            counted(counts["counter_readings"], "counter reading", spec=","),
            counted(counts["diagnoses"], "diagnosis", "diagnoses", ","),
        )
    )
    lines = [
        f"{clean(output, 300)}: {clean(manifest['node'])}, {period['since']} to "
        f"{period['until']}, from {RMA_STORES[manifest['store']]}: {held}"
    ]
    lines += [f"  without {m['name']}: {clean(m['why'], 300)}" for m in manifest["missing"]]
    return lines


def rolled_up(done: dict, behind: int) -> list:
    """`collect --rollup-after` (rollup.rollup's result): the runs counted per node-hour, and
    the hours still due when more than `behind` are."""
    lines = []
    if done["runs"]:
        runs = counted(done["runs"], "passing run", spec=",")
        lines.append(f"rollup: {runs} counted in {counted(done['hours'], 'node-hour', spec=',')}")
    if done["behind"] > behind:
        lines.append(
            f"rollup: {counted(done['behind'], 'hour', spec=',')} behind --rollup-after, rolled "
            "up over the next "
            "cycles (--rollup-max 0 rolls them all up at once)"
        )
    return lines


def places(result: dict, rows: list) -> str:
    """`collect --sacct`: the places of nodes Slurm gave (accounting.ingest_places), by kind."""
    kinds = sorted({kind for _, kind, _ in rows})
    merged = counted(result["places"], "node place", spec=",")
    return f"places: {merged} ({', '.join(kinds) or 'none'})"


# --- the fleet's nodes (`lemons`, `slow`, `trends`) ------------------------------------------

SILENT_SHOWN = 20


def freshness(fresh: dict, now: float) -> list:
    """The store's newest record, first; a stale store loudly; the nodes not heard from."""
    after = f"{fresh['after'] / 3600:g} h"
    if fresh["newest"] is None:
        return [f"STALE fleet store: no run recorded before {timespec.iso(now)}: nothing collected"]
    age = (now - fresh["newest"]) / 3600
    when = f"{timespec.iso(fresh['newest'])} ({age:.1f} h before {timespec.iso(now)})"
    lines = [
        f"STALE fleet store: its newest record is from {when}: collect is not running, and "
        "a quiet store is no news"
        if fresh["stale"]
        else f"newest record {when}"
    ]
    silent = fresh["silent"]
    if silent and not fresh["stale"]:
        named = ", ".join(
            f"{clean(e['node'], 64)} (last {timespec.iso(e['last'])})"
            for e in silent[:SILENT_SHOWN]
        )
        more = f" (+{len(silent) - SILENT_SHOWN} more)" if len(silent) > SILENT_SHOWN else ""
        lines.append(f"{counted(len(silent), 'node')} not heard from within {after}: {named}{more}")
    unguarded = fresh.get("unguarded") or []
    if unguarded and not fresh["stale"]:
        named = ", ".join(
            f"{clean(e['node'], 64)} ({counted(e['jobs'], 'job')})"
            for e in unguarded[:SILENT_SHOWN]
        )
        more = f" (+{len(unguarded) - SILENT_SHOWN} more)" if len(unguarded) > SILENT_SHOWN else ""
        lines.append(
            f"{counted(len(unguarded), 'node')} ran jobs within {fresh['jobs_after'] / 3600:g} h "
            f"with no run of slurmhealth's on record (hooks not running there, or its exports "
            f"not collected): {named}{more}"
        )
    return lines


def lemons(scored: list, applied: list, window: float, now: float) -> str:
    found = [e for e in scored if e["lemon"]]
    among = f"among {counted(len(scored), 'node')} over {counted(window / 86400, 'day')}"
    lines = [f"{counted(len(found), 'lemon')} {among}"]
    for bar in policy.bars(scored):  # pools name GPU models from the store: cleaned
        day = f" or {bar['needed_day']} within {bar['hours']:g} h" if bar["needed_day"] else ""
        lines.append(
            f"  {clean(bar['pool'])}: a node seen throughout is a lemon at {bar['needed']} "
            f"separate faults ({bar['expected']:.2g} expected){day}"
        )
        if bar["dispersion"] > 1:
            lines.append(
                f"    faults vary between its nodes more than chance (dispersion "
                f"{bar['dispersion']:.2g}): nodes are still judged one by one against the pool"
            )
    for entry in found:  # node names come from the store: untrusted, cleaned
        node, reason = clean(entry["node"]), clean(entry["reason"])
        lines.append(f"  {node:<12} score {entry['score']:.1f}  {reason}")
        lines.extend(f"      {clean(line)}" for line in policy.explain(entry, now))
        for name, ev in entry["evidence"].items():
            if ev.get("count"):
                lines.append(f"      {name}: {ev['count']} (fleet expects {ev['expected']:.2f})")
    for entry in scored:
        if not entry["lemon"] and entry["evidence"]["faults"].get("reset"):
            lines.append(f"  {clean(entry['node']):<12} not a lemon")
            lines.extend(f"      {clean(line)}" for line in policy.explain(entry, now))
    for item in applied:
        lines.append(f"  {clean(item['node'])}: {clean(item['outcome'])}")
    return "\n".join(lines)


def slow(found: list, nodes: int, window: float, margin: float) -> str:
    head = (
        f"{counted(len({f['node'] for f in found}), 'slow node')} among {nodes} diagnosed over "
        f"{counted(window / 86400, 'day')} (margin {margin:.0%})"
    )
    return "\n".join([head, *(f"  {f['evidence']}" for f in found)])  # evidence: cleaned


def trends(found: list, nodes: int) -> str:
    rising = counted(len({f["node"] for f in found}), "node")
    lines = [f"{rising} with rising error counters among {nodes}"]
    lines.extend(f["evidence"] for f in found)
    return "\n".join(lines)


# --- `diagnose --submit` ------------------------------------------------------------------------


def diagnose_submitted(done: list) -> list:
    """What a `diagnose --submit` pass did (diagnose.sweep's items), one line a node."""
    lines = [f"{clean(item['node'])}: {item['what']}: {clean(item['detail'])}" for item in done]
    return lines or ["nothing to diagnose"]


# --- job summaries (`job`, `publish`) -------------------------------------------------------


def _node_line(node: dict) -> str:
    drain = node.get("drain")
    drained = "-" if not drain else ("yes" if drain.get("still") else "resumed")
    prolog, epilog = clean(node.get("prolog") or "-", 12), clean(node.get("epilog") or "-", 12)
    return f"  {clean(node.get('node'), 20):<12} {prolog:<7} {epilog:<7} {drained}"


def _problem_lines(nodes: list) -> list:
    lines = []
    for node in nodes:
        problems = node.get("problems", [])
        for p in problems[:jobs.ITEMS_MAX]:
            lines.append(
                f"  {clean(node['node'], 20):<12} {jobs.local_time(p.get('time'))}  "
                f"{clean(p.get('phase'), 12):<11} {clean(p.get('check'), 40)} "
                f"{clean(p.get('status'), 6)}: {clean(p.get('message'), 160)}"
            )
        more = len(problems[jobs.ITEMS_MAX:]) + int(node.get("more_problems", 0))
        if more:
            lines.append(f"  {clean(node['node'], 20):<12} ... {more} more")
    return lines


def _xid_lines(nodes: list) -> list:
    lines = []
    for node in nodes:
        for x in node.get("xids", []):
            process = clean(x.get("process") or "-", 40)
            lines.append(
                f"  {clean(node['node'], 20):<12} {jobs.local_time(x.get('time'))}  "
                f"{jobs.gpu_words(x)}  Xid {clean(x.get('code'), 20)} "
                f"({clean(x.get('class'), 8)})  process {process}"
            )
        if node.get("more_xids"):
            lines.append(f"  {clean(node['node'], 20):<12} ... {clean(node['more_xids'])} more")
    return lines


def _telemetry_lines(data: dict) -> list:
    """Per node: its worst GPU's slowdown share and the error counters that grew; then the node
    that held the job back, if one did (fleet store only: published summaries carry none)."""
    nodes = [n for n in data.get("nodes", []) if n.get("telemetry")]
    if not nodes:
        return []
    if not any(n["telemetry"]["share"] or n["telemetry"]["errors"] for n in nodes):
        lines = ["GPU slowdown (power or thermal policy) and error counters during the job: none"]
    else:
        lines = [
            "GPU slowdown (power or thermal policy, worst GPU) and error counters during the job:"
        ]
        for node in nodes:
            figures = node["telemetry"]
            worst = figures.get("worst_gpu")
            why = f" ({clean(worst, 20)} {clean(figures.get('cause'), 20)})" if worst else ""
            lines.append(
                f"  {clean(node['node'], 20):<12} slowdown {telemetry.percent(figures['share']):>4}"
                f"{why}  errors: {telemetry.error_words(figures['errors'])}"
            )
    if data.get("held_back"):
        lines.append(f"held back: {clean(data['held_back']['evidence'], 300)}")
    return lines + _figure_lines(nodes)


# The per-node figure sections after the slowdown lines: (telemetry key, title, words).
_FIGURE_LINES = (
    (
        "clocks",
        "GPU clocks during the job (worst GPU; means of the health checks' samples):",
        telemetry.clock_words,
    ),
    (
        "power",
        "GPU power, mean over the job (NVML energy counter, prolog to epilog):",
        telemetry.power_words,
    ),
)


def _figure_lines(nodes: list) -> list:
    """Per node, its GPUs' time below base clocks and the health checks' samples, then their
    mean power over the job (prolog to epilog): each section only where recorded."""
    lines = []
    for key, title, words in _FIGURE_LINES:
        known = [n for n in nodes if n["telemetry"].get(key)]
        if known:
            lines.append(title)
            for node in known:
                lines.append(f"  {clean(node['node'], 20):<12} {words(node['telemetry'][key])}")
    return lines


def _header(data: dict) -> str:
    state = clean(data.get("state") or "", 20)
    span = f"{jobs.local_time(data.get('start'))} to {jobs.local_time(data.get('end'))}"
    who = clean(data.get("user") or "?", 40)
    ended = f"{state or 'ended'}{jobs.exit_words(data)}"
    return f"job {clean(data.get('job'), 40)} of {who}: {ended}, {span}"


def _ok_line(data: dict) -> list:
    names = [clean(n, 20) for n in data.get("ok_nodes", [])]
    count = len(names) + int(data.get("ok_count", 0))
    if not count:
        return []
    shown = ", ".join(names[:20]) + (f" and {count - 20} more" if count > 20 else "")
    more = counted(count, "more node")
    return [f"  prolog ok, epilog ok, nothing seen on {more}: {shown or '-'}"]


def job(data: dict) -> str:
    """The summary as a user reads it: nodes, problems, Xids, and the conclusion last."""
    nodes = data.get("nodes", [])
    lines = [_header(data), f"  {'NODE':<12} {'PROLOG':<7} {'EPILOG':<7} DRAINED"]
    lines += [_node_line(n) for n in nodes] + _ok_line(data)
    if data.get("omitted"):
        lines.append(f"  ({counted(data['omitted'], 'node')} left out of the published summary)")
    lines += _telemetry_lines(data)
    problems, xids = _problem_lines(nodes), _xid_lines(nodes)
    if problems:
        lines += ["checks that did not pass:", *problems]
    if xids:
        lines += ["Xids during the job:", *xids]
    lines.append(f"conclusion: {clean(data.get('conclusion'), 2000)}")
    return "\n".join(lines)


def published(report: dict) -> str:
    """What `publish` did (jobs.publish's report): the counts, then each job left alone or not
    written."""
    lines = [
        f"{counted(len(report['published']), 'summary', 'summaries')} published, "
        f"{report['unchanged']} unchanged, "
        f"{len(report['foreign'])} left alone, {len(report['unknown'])} not in accounting, "
        f"{len(report['failed'])} failed"
    ]
    for job_id, theirs in report["foreign"]:
        lines.append(f"job {job_id}: AdminComment set by another tool, left alone: {theirs}")
    for job_id, why in report["failed"]:
        lines.append(f"job {job_id}: not published: {why}")
    return "\n".join(lines)
