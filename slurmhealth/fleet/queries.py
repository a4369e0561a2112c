"""The reads of the fleet and node store tables that more than one head-node consumer makes
(the nightly report, the lemon sweep, `slurmhealth lemons`, `slow`, `trends`, job summaries),
as named functions. A read with one consumer lives beside it: the report's in report/reads.py,
the job summaries' in fleet/jobs.py, `slurmhealth history`'s in fleet/history.py. The lemon
signals (fleet/signals.py), the bulk export and import, collect and the rollup
(fleet/records.py, collect.py, rollup.py) keep their own spec-driven statements; every write of
a node's run lives in core/store.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import sqlite3
from collections.abc import Callable, Iterator
from typing import TypeVar

from slurmhealth.fleet import drift, pgstore

DAY = 86400
T = TypeVar("T")


@contextlib.contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """One read transaction, a consistent snapshot while collect writes: begun and ended here
    unless the caller is in one already (the report's reads, the lemon sweep's). DEFERRED is
    SQLite's plain BEGIN, and a server's repeatable read (fleet/pgstore.py)."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN DEFERRED")
    try:
        yield
    finally:
        if own:
            conn.execute("COMMIT")


@contextlib.contextmanager
def beside(conn: sqlite3.Connection, read: Callable[[sqlite3.Connection], T]) -> Iterator[
    Callable[[], T]
]:
    """`read(connection)` run beside the caller's reads, on a second connection to the server
    that sees the caller's snapshot (pgstore.twin: another server process, while this one
    reads or the caller computes); yields what returns its result, waiting for it. Where no
    such connection is (a SQLite store, a server that refuses one), read runs here, first, on
    conn: the same result. Leaving the block early stops the read."""
    other = pgstore.twin(conn)
    if other is None:
        value = read(conn)
        yield lambda: value
        return
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="beside")
    future = pool.submit(read, other)
    try:
        yield future.result
    finally:
        if not future.done():
            other.cancel()  # type: ignore[attr-defined] # pgstore.Connection's
        pool.shutdown(wait=True)
        other.close()


def halves(
    conn: sqlite3.Connection, read: Callable[[sqlite3.Connection, list], dict], items: list
) -> dict:
    """read(conn, items) in two halves at once on a server, the second beside this one
    (beside): {key: value} of both, in items' order (each half's keys are its own items'). A
    sweep of one index seek per node and day keeps two server processes busy, not one. Fewer
    than two statements' worth of items (BATCH each) are read here in one."""
    half = len(items) // 2 // BATCH * BATCH  # whole statements each
    if not half:
        return read(conn, items)
    with beside(conn, lambda other: read(other, items[half:])) as second:
        out = read(conn, items[:half])
        out.update(second())
    return out


def dicts(cursor: sqlite3.Cursor) -> list:
    """The cursor's rows as dicts keyed by its column names."""
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor]


# --- runs: who was heard from, what did not pass ------------------------------------------------


# Every node of the runs table: a loose scan of the (node, started, verdict) index, one seek per
# node. Joined per node on that index, a window's runs are read from the index alone (no table
# row per run): 10,000 nodes' month of runs is read ~5x faster than through the time index.
_NODES = """WITH RECURSIVE n(node) AS (
    SELECT min(node) FROM runs
    UNION ALL
    SELECT (SELECT min(node) FROM runs WHERE node > n.node) FROM n WHERE n.node IS NOT NULL)"""


def heard_from(conn: sqlite3.Connection, now: float) -> dict:
    """{node: the start of its newest run before `now`} for every node with a run: one seek
    per node on the (node, started, verdict) index (10,000 nodes: one seek each)."""
    sql = (
        f"{_NODES} SELECT node, (SELECT max(started) FROM runs "  # noqa: S608 - constants
        "WHERE runs.node = n.node AND started < ?) FROM n WHERE node IS NOT NULL"
    )
    return {node: t for node, t in conn.execute(sql, (now,)) if t is not None}


def jobs_started(conn: sqlite3.Connection, start: float, end: float) -> dict:
    """{node: jobs started in [start, end)} from the jobs table (the epilogs' rows and
    accounting's, `collect --sacct`): a range of its start index, one row per node."""
    sql = "SELECT node, count(*) FROM jobs WHERE start >= ? AND start < ? GROUP BY node"
    return dict(conn.execute(sql, (start, end)))


def partitions(conn: sqlite3.Connection) -> dict:
    """{node: {partition, ...}} of every node Slurm has put in a partition (the places table,
    `collect --sacct`), whenever seen there."""
    out: dict = {}
    for node, name in conn.execute("SELECT node, name FROM places WHERE kind = 'partition'"):
        out.setdefault(node, set()).add(name)
    return out


def not_ok_runs(conn: sqlite3.Connection, start: float, end: float) -> sqlite3.Cursor:
    """(node, started, verdict) rows of the runs started in [start, end) that did not pass:
    from their partial index alone (store migration 10), never a passing run."""
    return conn.execute(
        "SELECT node, started, verdict FROM runs INDEXED BY runs_not_ok "
        "WHERE verdict != 'ok' AND started >= ? AND started < ?",
        (start, end),
    )


def nodes_with_runs(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[node] of every node with a run started in [start, end): two index seeks per node."""
    rows = conn.execute(
        f"{_NODES} SELECT node FROM n WHERE node IS NOT NULL AND EXISTS (SELECT 1 FROM runs u "  # noqa: S608 - constants
        "WHERE u.node = n.node AND u.started >= ? AND u.started < ?)",
        (start, end),
    )
    return [row[0] for row in rows]


# --- known-good nodes: the peers a drained node is diagnosed against (fleet/pairing.py) -----------


def latest_verdicts(conn: sqlite3.Connection, nodes: list, end: float) -> dict:
    """{node: (started, verdict)} of each node's newest run before `end` (one seek each on the
    (node, started, verdict) index); a node with no run is left out."""
    out = {}
    for node in nodes:
        row = conn.execute(
            "SELECT started, verdict FROM runs WHERE node = ? AND started < ? "
            "ORDER BY started DESC LIMIT 1",
            (node, end),
        ).fetchone()
        if row is not None:
            out[node] = (row[0], row[1])
    return out


# What made a node no known-good reference: a drain, one monitor-only mode would have made, one
# the circuit breaker refused (core/constants.py: what the actions table records).
_TROUBLE_ACTIONS = ("drain", "would-drain", "breaker")


def troubled_nodes(conn: sqlite3.Connection, start: float, end: float) -> set:
    """Nodes with a failed run, or a drain of ours (made, refused by the breaker, or that
    monitor-only mode would have made), in [start, end)."""
    failed = {node for node, _t, verdict in not_ok_runs(conn, start, end) if verdict == "fail"}
    marks = ", ".join("?" for _ in _TROUBLE_ACTIONS)
    rows = conn.execute(
        f"SELECT DISTINCT node FROM actions WHERE time >= ? AND time < ? AND action IN ({marks})",  # noqa: S608 - placeholders
        (start, end, *_TROUBLE_ACTIONS),
    )
    return failed | {row[0] for row in rows}


# --- the figures diagnoses measured (fleet/peers.py) ----------------------------------------

# What a diagnosis's outcome measured (node/diag/probes.py PASS and FAIL): a skipped outcome
# (no tool, no floor to judge against) says nothing about this node against its peers.
_MEASURED = ("pass", "fail")


def diag_figures(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(node, time, gpu_model, probe, unit, figure, value)] of every numeric figure of the
    passed and failed outcomes of the `diag` runs started in [start, end) (node/diag/run.py
    records them), by time. gpu_model is the hardware class the run recorded
    (`sources.diag`): `8x NVIDIA H100 80GB HBM3`, the count first because an all-reduce over 4
    GPUs is no peer of one over 8; the bare model when the count is unknown, "" when neither
    is. A run or result whose JSON cannot be read gives nothing, a pair run (PAIR_LEVEL) neither.
    Text is as stored: untrusted."""
    rows = conn.execute(
        "SELECT u.node, u.started, u.sources, r.check_name, r.data "
        "FROM runs u JOIN results r ON r.run_id = u.id "
        "WHERE u.phase = 'diag' AND u.started >= ? AND u.started < ? "
        "AND r.check_name LIKE 'diag.%' ORDER BY u.started, u.node, r.check_name",
        (start, end),
    )
    out: list = []
    seen, model, level = None, None, None  # a run's results come together: sources read once
    for node, started, sources, check, data in rows:
        if sources != seen:
            seen, (model, level) = sources, _diag_class(sources)
        if model is not None and level != PAIR_LEVEL:
            probe = check[len("diag.") :]
            out.extend(
                (node, started, model, probe, *f)
                for f in _measured_figures(data)
                if not (level == "quick" and f[1] in LENGTH_BOUND)
            )
    return out


# Figures that depend on how long their test ran (a GPU warms and lowers its clocks within
# seconds): the quick level's 2-second tests are no peers of the medium level's 20. Copy
# bandwidths do the same work at every level and are compared from any level.
LENGTH_BOUND = ("matmul_tflops", "memory_write_gbps")
# A pair diagnosis (node/diag/pairs.py) measures two nodes and the fabric between them, on a
# node that was drained: no sample of its class's own speed, so `slow` leaves it out.
PAIR_LEVEL = "pair"


def _diag_class(sources: str) -> tuple:
    """(hardware class, level) of a diag run (diag_figures); (None, None) when its JSON is
    unreadable."""
    try:
        diag = json.loads(sources).get("diag") or {}
        model, gpus, level = diag.get("gpu_model") or "", diag.get("gpus"), diag.get("level")
    except (ValueError, TypeError, AttributeError):
        return None, None
    if not isinstance(model, str):
        return None, None
    counted = isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0
    return (f"{gpus}x {model}" if model and counted else model), level


def _measured_figures(data: str) -> list:
    """[(unit, figure, value)] of a diag result's data: finite numbers of measured outcomes."""
    try:
        outcomes = json.loads(data).get("outcomes")
    except (ValueError, TypeError, AttributeError):
        return []
    out: list[tuple[str, str, float]] = []
    for o in outcomes if isinstance(outcomes, list) else ():
        if not isinstance(o, dict) or o.get("status") not in _MEASURED:
            continue
        figures, unit = o.get("figures"), o.get("unit")
        if not isinstance(figures, dict) or not isinstance(unit, str):
            continue
        out.extend(
            (unit, name, float(value))
            for name, value in figures.items()
            if isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
        )
    return out


# --- the versions each node recorded (the report's drift section, the peers' classes) -----------


def version_sources(
    conn: sqlite3.Connection,
    node: str,
    start: float,
    end: float,
    oldest: bool,
    limit: int,
) -> sqlite3.Cursor:
    """(sources JSON text,) rows of the node's runs started in [start, end) that recorded
    versions, newest first (oldest first with `oldest`); the first `limit`."""
    sql = _VERSIONS_OLDEST if oldest else _VERSIONS_NEWEST
    return conn.execute(sql, (node, start, end, limit))


_VERSIONS = (
    "SELECT sources FROM runs WHERE node = ? AND started >= ? AND started < ?"
    " AND instr(sources, '\"versions\"') ORDER BY started "
)
_VERSIONS_NEWEST = _VERSIONS + "DESC LIMIT ?"
_VERSIONS_OLDEST = _VERSIONS + "ASC LIMIT ?"


def recorded_versions(
    conn: sqlite3.Connection, node: str, end: float, lookback: float, oldest: bool = False
) -> dict | None:
    """The versions the node's latest run recorded (runner.Gathered.versions, as
    drift.versions reads them) within `lookback` before `end` (with `oldest`, its earliest run
    there: what it ran before); None when it recorded none (no run, or no facts parsed).

    A run whose GPU source failed (NVML did not answer that once) records its other sources'
    versions alone: taken as they are, the node would fall into a class of its own, "unknown
    GPUs", and be compared across hardware. So the newest run decides each key it has, and
    older runs fill in the keys it lacks, until one names the GPU model or its GPU source
    answered (at most VERSIONS_MERGE runs)."""
    merged: dict = {}
    # the newest run first alone (it decides nearly always: a row, not a node's days of them,
    # read from the table), then up to VERSIONS_MERGE runs from the newest again
    for limit in (1, VERSIONS_MERGE):
        merged = {}
        rows = version_sources(conn, node, end - lookback, end, oldest, limit).fetchall()
        for count, (text,) in enumerate(rows):
            try:
                sources = json.loads(text)
                found = drift.versions(sources)
            except (ValueError, RecursionError):
                continue
            for key, value in found.items():
                merged.setdefault(key, value)
            if merged.get("model") or drift.gpu_answered(sources) or count + 1 >= VERSIONS_MERGE:
                return merged or None
        if len(rows) < limit:
            break  # every run there was read
    return merged or None


VERSIONS_MERGE = 20  # runs read back for keys the newest run lacks (recorded_versions)

# Each node's newest (or oldest) run that recorded versions in a span, BATCH nodes a statement
# (one seek of the partial index each, store migration 13): a statement per node cost a
# 10,000-node sweep on a server thousands of round trips. {0}: the VALUES rows' placeholders;
# {1}: the order.
_FIRST_VERSIONS = """WITH q(node) AS (VALUES {0}) SELECT q.node, (SELECT sources FROM runs
    WHERE runs.node = q.node AND started >= ? AND started < ?
    AND instr(sources, '"versions"') ORDER BY started {1} LIMIT 1) FROM q"""
BATCH = 400  # nodes or items a statement: 801 parameters at most, under SQLite's oldest 999


def versions_of(
    conn: sqlite3.Connection, nodes: list, end: float, lookback: float, oldest: bool = False
) -> dict:
    """{node: recorded_versions(conn, node, end, lookback, oldest)} of each node: the newest
    (oldest) run of every node read BATCH nodes at a time, each half of the nodes on its own
    server process (halves); a node whose run does not decide (recorded_versions) is read
    again alone."""
    return halves(conn, lambda c, some: _versions_of(c, some, end, lookback, oldest), nodes)


def _versions_of(
    conn: sqlite3.Connection, nodes: list, end: float, lookback: float, oldest: bool
) -> dict:
    out: dict = {}
    order = "ASC" if oldest else "DESC"
    for i in range(0, len(nodes), BATCH):
        chunk = nodes[i : i + BATCH]
        sql = _FIRST_VERSIONS.format(", ".join("(?)" for _ in chunk), order)  # placeholders
        for node, text in conn.execute(sql, (*chunk, end - lookback, end)).fetchall():
            out[node] = None if text is None else _deciding(text)
            if text is not None and out[node] is None:
                out[node] = recorded_versions(conn, node, end, lookback, oldest)
    return out


def _deciding(text: str) -> dict | None:
    """The versions one run recorded when they decide alone (recorded_versions), else None."""
    try:
        sources = json.loads(text)
        found = drift.versions(sources)
    except (ValueError, RecursionError):
        return None
    return found if found and (found.get("model") or drift.gpu_answered(sources)) else None


def node_models(
    conn: sqlite3.Connection, nodes: list, end: float, lookback: float, known: dict | None = None
) -> dict:
    """{node: GPU model} from each node's recorded versions in [end - lookback, end) ("" when
    none named one): the hardware class peers are compared in. known: {node: model} already
    read (the report's drift section), taken as they are."""
    known = known or {}
    read = versions_of(conn, [n for n in nodes if n not in known], end, lookback)
    return {
        node: known[node] if node in known else str((read[node] or {}).get("model") or "")
        for node in nodes
    }


MODEL_LOOKBACK = 2 * DAY  # versions are recorded at least every 6 h (node/runner.py)


# --- error counters over time (fleet/trends.py) ------------------------------------------------


def counter_rows(conn: sqlite3.Connection, start: float, end: float, skip: tuple = ()) -> list:
    """[(node, device, counter, time, delta, label)] of the counter readings recorded in
    (start, end] with an increase (node/counters.py records a reading only when it changed;
    a first reading or a reset has no delta), by time, but those of the counters in `skip`."""
    marks = ", ".join("?" * len(skip))  # placeholders only: the names are parameters
    sql = f"SELECT node, device, counter, time, delta, label FROM counters WHERE time > ? AND time <= ? AND delta > 0 AND counter NOT IN ({marks}) ORDER BY time"  # noqa: S608, E501
    return conn.execute(
        sql,
        (start, end, *skip),
    ).fetchall()


# Each series' hourly summary (trends.summaries, which documents the columns), read in one
# pass: the window's rows by time, summed per series and hour, then per series. The hour is
# the floor of (now - time) / 3600 as Python's // takes it: a quotient rounded up to a whole
# hour is taken back. A series' last label is its newest row's, read by its key.
_SERIES = """WITH rows AS (
        SELECT node, device, counter, time, delta,
            CAST((:now - time) / 3600 AS INTEGER) AS q FROM counters
        WHERE time > :start AND time <= :now AND delta > 0 AND counter NOT IN ({skip})),
    hours AS (
        SELECT node, device, counter,
            q - CASE WHEN :now - time < q * 3600.0 THEN 1 ELSE 0 END AS hour,
            sum(delta) AS e, count(*) AS r, max(time) AS last
        FROM rows GROUP BY node, device, counter, hour),
    series AS (
        SELECT node, device, counter, max(last) AS last, {windows},
            total(e) FILTER (WHERE hour >= :first AND hour < :end),
            coalesce(sum(r) FILTER (WHERE hour >= :first AND hour < :end), 0),
            total(e) FILTER (WHERE hour >= :newer AND hour < :end),
            coalesce(sum(r) FILTER (WHERE hour >= :newer AND hour < :end), 0),
            total(e * e) FILTER (WHERE hour >= :first AND hour < :end),
            coalesce(sum(r * r) FILTER (WHERE hour >= :first AND hour < :end), 0),
            total(e * e) FILTER (WHERE hour >= :newer AND hour < :end),
            coalesce(sum(r * r) FILTER (WHERE hour >= :newer AND hour < :end), 0), {days}
        FROM hours GROUP BY node, device, counter)
    SELECT series.*, (SELECT label FROM counters AS c WHERE c.node = series.node
        AND c.device = series.device AND c.counter = series.counter AND c.time = series.last)
    FROM series"""
_WINDOW = """coalesce(sum(r) FILTER (WHERE hour < :w{0}), 0), total(e) FILTER (WHERE hour < :w{0}),
    coalesce(max(e) FILTER (WHERE hour < :w{0}), 0.0)"""
_DAY = "total(e) FILTER (WHERE hour >= :d{0} AND hour < :d{1})"


def counter_series(conn: sqlite3.Connection, now: float, hours: tuple, skip: tuple = ()) -> list:
    """[(node, device, counter, last time, last label, recent, past)]: trends.summaries of
    the counter rows in (now - the baseline's end, now] with an increase, but those of the
    counters in `skip`, summed in SQL (hours: trends.hours_of): a series is one row here, where
    the rows it sums are a million at 10,000 nodes (docs/benchmarks.md)."""
    ends, first, end, newer, days = hours
    params: dict = {"now": now, "start": now - end * 3600.0, "first": first, "end": end}
    params.update({"newer": newer, **{f"s{i}": name for i, name in enumerate(skip)}})
    params.update({f"w{i}": h for i, h in enumerate(ends)})
    params.update({f"d{i}": h for i, h in enumerate(days)})
    sql = _SERIES.format(  # placeholders only: the names and hours are parameters
        skip=", ".join(f":s{i}" for i in range(len(skip))),
        windows=", ".join(_WINDOW.format(i) for i in range(len(ends))),
        days=", ".join(_DAY.format(i, i + 1) for i in range(len(days) - 1)),
    )
    out = []
    width = 3 * len(ends)
    for row in conn.execute(sql, params):
        got = row[4 : 4 + width]
        recent = tuple(tuple(got[i : i + 3]) for i in range(0, width, 3))
        past = row[4 + width : 12 + width] + (tuple(row[12 + width : -1]),)
        out.append(row[:4] + (row[-1], recent, past))
    return out


def rising_counters(
    conn: sqlite3.Connection,
    now: float,
    models: dict | None = None,
    factor: float | None = None,
    ran: list | None = None,
) -> tuple:
    """(findings of trends.rising as of `now`, nodes compared): the series' hourly summaries of
    the longest window and the 7 days before it, and the GPU model of every node that ran in
    the last two days (models: {node: model} already known, not read again); factor: the
    finder's, its default when None; ran: nodes_with_runs over those two days, already read."""
    from slurmhealth.fleet import trends  # noqa: PLC0415

    hours = trends.hours_of(trends.WINDOWS, trends.BASELINE)
    series = counter_series(conn, now, hours, trends.NOT_TRENDS)
    if ran is None:
        ran = nodes_with_runs(conn, now - MODEL_LOOKBACK, now)
    nodes = set(ran) | {s[0] for s in series}
    found = node_models(conn, sorted(nodes), now, MODEL_LOOKBACK, models)
    limits = (factor or trends.FACTOR, trends.MIN_EPISODES, trends.ALPHA)
    return trends.judged(series, found, trends.WINDOWS, limits, trends.BASELINE), len(nodes)


# --- per-job GPU telemetry (fleet/telemetry.py) --------------------------------------------------

# A node's devices with a counter row in [low, high): a loose scan of the counters key (node,
# device, counter, time), one seek per device, however long the node's history.
_DEVICES = """WITH RECURSIVE d(device) AS (
    SELECT min(device) FROM counters WHERE node = :node AND device >= :low AND device < :high
    UNION ALL
    SELECT (SELECT min(device) FROM counters
            WHERE node = :node AND device > d.device AND device < :high)
    FROM d WHERE d.device IS NOT NULL)
    SELECT device FROM d WHERE device IS NOT NULL"""


# Every node with a counter row: a loose scan of the counters key, one seek per such node.
_COUNTER_NODES = """WITH RECURSIVE n(node) AS (
    SELECT min(node) FROM counters
    UNION ALL
    SELECT (SELECT min(node) FROM counters WHERE node > n.node) FROM n WHERE n.node IS NOT NULL)
    SELECT node FROM n WHERE node IS NOT NULL"""


def counter_nodes(conn: sqlite3.Connection) -> set:
    """{node} of every node with any counter row."""
    return {row[0] for row in conn.execute(_COUNTER_NODES)}


def counter_devices(conn: sqlite3.Connection, node: str, kind: str = "") -> list:
    """[device] of the node with any counter row (of the kind: "gpu", ...), by name."""
    low, high = (f"{kind}:", f"{kind};") if kind else ("", "\U0010ffff")
    return [r[0] for r in conn.execute(_DEVICES, {"node": node, "low": low, "high": high})]


# Per device and counter of a node in (start, end]: the rows with an increase and their sum (a
# first reading's unknown increase counts 0); the label its readings gave (a reading of 0 after a
# reset is labelled by the device's name). Only placeholders are formatted in.
_JOB_SUMS = """SELECT device, coalesce(max(nullif(label, device)), device), counter,
    sum(coalesce(delta, 0) > 0), sum(max(coalesce(delta, 0), 0)) FROM counters
    WHERE node = ? AND device IN ({}) AND counter IN ({}) AND time > ? AND time <= ?
    GROUP BY device, counter ORDER BY device, counter"""


def job_counter_sums(
    conn: sqlite3.Connection,
    node: str,
    start: float,
    end: float,
    kinds: tuple = (),
    known: dict | None = None,
) -> list:
    """[(device, label, counter, episodes, total)] of the node's counter rows in (start, end]:
    episodes the rows with an increase, total the sum of the increases (a first reading's
    unknown one counts 0). kinds: the device kinds to read (telemetry.COUNTERS), all by
    default. Each kind's devices and counters are exact ranges of the counters key. known:
    {(node, kind): devices} read before in the same read transaction, filled in here (a sweep
    reads each node's devices once, not once per job: most nodes have none)."""
    from slurmhealth.fleet import telemetry, trends  # noqa: PLC0415

    devices: dict = {}
    for kind in kinds or ("",):
        found = None if known is None else known.get((node, kind))
        if found is None:
            found = counter_devices(conn, node, kind)
            if known is not None:
                known[(node, kind)] = found
        for device in found:
            devices.setdefault(trends.kind_of(device), []).append(device)
    out: list = []
    for kind, names in devices.items():
        counters = telemetry.COUNTERS.get(kind)
        if not names or not counters:
            continue
        sql = _JOB_SUMS.format(", ".join("?" * len(names)), ", ".join("?" * len(counters)))
        out += conn.execute(sql, (node, *names, *counters, start, end)).fetchall()
    return out


def job_telemetry(
    conn: sqlite3.Connection, spans: list, kinds: tuple = (), known: dict | None = None
) -> dict:
    """{node: telemetry.node_figures} of each (node, start, end) a job ran, from the node's
    counter rows in (start, end + the epilog's slack]. known: as job_counter_sums."""
    from slurmhealth.fleet import telemetry  # noqa: PLC0415

    out = {}
    for node, start, end in spans:
        slack = end + telemetry.EPILOG_SLACK_S
        rows = job_counter_sums(conn, node, start, slack, kinds, known)
        out[node] = telemetry.node_figures(rows, end - start)
    return out


# The nodes of one job end within this of each other (slurmd runs their epilogs together;
# accounting gives them one End): the rows read around a window to see each job whole.
JOB_END_SPREAD = 3600.0


def job_figures(conn: sqlite3.Connection, node: str, job_id: str) -> str | None:
    """The job's GPU figures the node's epilog recorded (jobs.gpu_energy), or None."""
    row = conn.execute(
        "SELECT gpu_energy FROM jobs WHERE node = ? AND job_id = ?", (node, job_id)
    ).fetchone()
    return row[0] if row else None


def held_back_jobs(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[(node, time)] of held_back_findings: the node that held back each job, at its end."""
    return [(f["node"], f["time"]) for f in held_back_findings(conn, start, end)]


def held_back_findings(conn: sqlite3.Connection, start: float, end: float) -> list:
    """[{node, time, job, finding}] of the node that held back each multi-node job whose last
    node ended in [start, end) (telemetry.held_back), at the job's end (time); nodes the prolog
    refused never ran it. A job is judged whole, in the one window its last end falls in: a
    window edge between its nodes' epilogs must not leave some of them out. Only the GPUs'
    policy counters and the job rows' `below_base` are read: a few key seeks per node of each
    job; the figures of a job with a finding are read to name its GPU and utilisation."""
    from slurmhealth.fleet import telemetry  # noqa: PLC0415

    jobs: dict = {}
    shares: dict = {}  # job -> {node: its worst GPU's share below base clocks}
    rows = conn.execute(
        "SELECT job_id, node, start, end, below_base FROM jobs WHERE end >= ? AND end < ? "
        "AND num_nodes > 1 AND start IS NOT NULL AND end > start "
        "AND coalesce(state, '') != 'prolog_failed'",
        (start - JOB_END_SPREAD, end + JOB_END_SPREAD),
    )
    for job_id, node, begin, finish, below in rows:
        jobs.setdefault(job_id, []).append((node, begin, finish))
        share = None if below is None else telemetry.share_of(below)
        if share is not None:
            shares.setdefault(job_id, {})[node] = {"share": share}
    out = []
    # each node's GPU devices, read once for all its jobs; none for a node without a counter
    # row (one seek per node that has them, not a scan of its devices per node of every job),
    # noted only for the jobs judged (at 100,000 nodes, noting every node of every job cost
    # seconds)
    having = counter_nodes(conn)
    known: dict = {}
    for job_id, spans in jobs.items():
        if len(spans) <= telemetry.MIN_OTHERS or not start <= max(s[2] for s in spans) < end:
            continue
        if job_id not in shares and not any(n in having for n, _, _ in spans):
            continue  # no node of it recorded a GPU counter or a share below base: nothing held
        known.update(((n, "gpu"), []) for n, _, _ in spans if n not in having)
        duration = max(s[2] for s in spans) - min(s[1] for s in spans)
        figures = job_telemetry(conn, spans, ("gpu",), known)
        found = telemetry.held_back(figures, duration, shares.get(job_id))
        if found:  # judged again on the nodes' whole figures, for the GPU and utilisation
            clocks = {n: telemetry.clock_figures(job_figures(conn, n, job_id)) for n, _, _ in spans}
            found = telemetry.held_back(figures, duration, clocks) or found
            ended = max(s[2] for s in spans)
            out.append({"node": found["node"], "time": ended, "job": job_id, "finding": found})
    return out
