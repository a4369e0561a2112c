"""The nightly report over a simulated fleet in a real SQLite fleet store: its numbers against
independent counts (SQL, the simulator's truth), the same numbers in JSON, HTML and Markdown,
hostile strings shown as text, mail through a sendmail process, and one-line CLI errors."""

from __future__ import annotations

import email
import email.policy
import html
import json
import os
import re
import sqlite3
import stat
import sys
from html.parser import HTMLParser

import pytest
from conftest import SNAPSHOTS, TESTS, diag_records, outcome, record_sources, run_cli, run_on_pty

from sim import simulate
from slurmhealth.core import store, timespec
from slurmhealth.fleet import lemons, policy, queries
from slurmhealth.report import build as report
from slurmhealth.report import reads, render

DAY = simulate.DAY
HOSTILE_PROCESS = "<script>alert(1)</script>"
HOSTILE_NODE = "gpu|07`<b>"
HOSTILE_REASON = "slurmhealth: *bad* | `rm -rf /` <img src=x onerror=alert(1)>\nsecond line"


@pytest.fixture(scope="module")
def sim() -> simulate.History:
    f = simulate.Fleet(nodes=48, days=28, seed=5, healthcheck_interval=3600)
    f.lemons = simulate.pick_lemons(f, 2, 50)
    return simulate.events(f)


@pytest.fixture(scope="module")
def fleet_db(sim, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("report") / "fleet.db")
    conn = store.connect(path)
    simulate.write_store(sim, conn)
    conn.close()
    return path


@pytest.fixture(scope="module")
def conn(fleet_db):
    c = store.connect(fleet_db)
    yield c
    c.close()


def after(h: simulate.History) -> float:
    """A report the morning after the simulated weeks: the window is all of them."""
    return h.fleet.end + 6 * 3600


def during(h: simulate.History) -> float:
    """A report on the last simulated day, at 18:00: the period holds records."""
    return h.fleet.end - 6 * 3600


@pytest.fixture(scope="module")
def doc(conn, sim) -> dict:
    return report.build(conn, during(sim), DAY)


# --- numbers against independent counts ---------------------------------------------------------


def test_verdict_counts_equal_a_plain_count(conn, sim):
    """reads.verdict_counts counts from three indexes; a plain GROUP BY over the table gives
    the same, for the whole month and for one day."""
    end = after(sim)
    for start in (end - 28 * DAY, end - 5 * DAY):
        plain = dict(
            conn.execute(
                "SELECT verdict, count(*) FROM runs WHERE started >= ? AND started < ? "
                "GROUP BY verdict",
                (start, end),
            ).fetchall()
        )
        assert set(plain) == {"ok", "warn", "fail"}
        assert dict(reads.verdict_counts(conn, start, end)) == plain


def test_failures_match_sql_and_the_simulators_truth(conn, sim):
    d = report.build(conn, after(sim), DAY)
    start, end = sim.fleet.start, sim.fleet.end
    assert (d["window"]["start"], d["window"]["end"]) == (
        timespec.iso(start),
        timespec.iso(end),
    )
    drains = conn.execute(
        "SELECT count(*) FROM actions WHERE action = 'drain' AND ok = 1 AND time >= ? AND time < ?",
        (start, end),
    ).fetchone()[0]
    crashed = conn.execute(
        "SELECT count(*) FROM jobs WHERE slurm_state = 'NODE_FAIL' AND state = 'running'"
    ).fetchone()[0]
    shared = d["rate"]["incident_failures"]
    assert d["rate"]["failures"] + shared == drains + crashed
    # The truth: every planted fault, less crashes whose job outlived the simulation (no
    # NODE_FAIL yet); the nodes the incident drained (a fleet-wide fault takes nodes out too)
    # are the incident's, listed apart and not counted as node failures.
    begin, stop = sim.breaker["incident_start"], sim.breaker["incident_end"]
    incident = sum(1 for a in sim.actions if a[3] == "drain" and begin <= a[2] < stop)
    faults = sum(len(times) for times in sim.faults.values())
    unfinished = sum(
        1 for j in sim.jobs if j[5] == "running" and j[6] == "RUNNING" and j[3] is None
    )
    assert incident >= 3 and shared == incident
    assert [(i["nodes"], i["failures"]) for i in d["rate"]["incidents"]] == [(incident, incident)]
    assert begin <= timespec.parse_instant(d["rate"]["incidents"][0]["start"]) < stop
    assert faults - unfinished <= d["rate"]["failures"] <= faults
    node_days = conn.execute(
        "SELECT count(*) FROM (SELECT DISTINCT node, CAST(started / 86400 AS INTEGER) FROM runs "
        "WHERE started >= ? AND started < ?)",
        (start, end),
    ).fetchone()[0]
    assert d["rate"]["node_days"] == node_days == sim.fleet.nodes * sim.fleet.days
    rate = d["rate"]["failures"] / node_days
    assert d["rate"]["per_1000_node_days"] == round(1000 * rate, 2)
    for row in d["rate"]["mttf"]:
        assert row["hours"] == round(24 / (row["nodes"] * rate), 1)
        assert row["RSC-1"] == round(24 / (row["nodes"] * 6.5e-3), 1)


def test_heatmap_and_trend_add_up_to_the_failures(conn, sim):
    d = report.build(conn, after(sim), DAY)
    per_day = [day["failures"] for day in d["trend"]["days"]]
    assert len(per_day) == len(d["heatmap"]["days"]) == report.WINDOW_DAYS
    assert sum(per_day) == d["rate"]["failures"]
    assert sum(day["incident"] for day in d["trend"]["days"]) == d["rate"]["incident_failures"]
    assert d["heatmap"]["nodes"] <= report.HEATMAP_ROWS  # all shown: the sums must agree
    columns = [sum(col) for col in zip(*(r["counts"] for r in d["heatmap"]["rows"]))]
    assert columns == per_day
    assert all(r["total"] == sum(r["counts"]) for r in d["heatmap"]["rows"])
    for row in d["heatmap"]["rows"]:
        for n, why in zip(row["counts"], row["why"]):
            assert bool(n) == bool(why)
    lemon_rows = [r["node"] for r in d["heatmap"]["rows"] if r["lemon"]]
    candidates = {c["node"] for c in d["lemons"]["candidates"]}
    assert set(lemon_rows) == candidates and candidates
    assert lemon_rows == [r["node"] for r in d["heatmap"]["rows"][: len(candidates)]]


def test_lemon_candidates_are_what_the_lemon_sweep_finds(conn, sim, doc):
    """The report at 18:00 scores the lemons as `slurmhealth lemons --now` at 18:00 does: the
    28 days up to then, not the whole days of its heatmap, with the same scores."""
    now = during(sim)
    assert now % DAY != 0
    sweep = lemons.sweep(conn, now, 28 * DAY)
    swept = {e["node"]: e["score"] for e in sweep if e["lemon"]}
    found = {c["node"]: c["score"] for c in doc["lemons"]["candidates"]}
    assert found == {n: round(s, 1) for n, s in swept.items()}
    assert found and set(found) <= set(sim.fleet.lemons)
    for c in doc["lemons"]["candidates"]:
        assert c["explain"][0].startswith("decided by ")
    for c in doc["lemons"]["candidates"]:
        assert c["evidence"] and all(e["count"] > 0 for e in c["evidence"])
    # what makes a lemon here, as `slurmhealth lemons` says it, in every format
    assert doc["lemons"]["bars"] == policy.bars(sweep)
    bar = doc["lemons"]["bars"][0]
    said = (
        f"{bar['pool']}: a node seen throughout the window is a lemon at {bar['needed']} "
        f"separate faults ({bar['expected']} expected) or {bar['needed_day']} within 24 h."
    )
    assert bar["needed"] >= 2 and bar["needed_day"] >= 3
    assert said in render.render(doc, "md") and said in render.render(doc, "html")


def test_a_hostile_pool_name_in_the_lemon_bar_renders_as_text(doc):
    """Pools are GPU models read from node stores: untrusted."""
    hostile = dict(doc, lemons=dict(doc["lemons"], bars=[dict(doc["lemons"]["bars"][0])]))
    hostile["lemons"]["bars"][0]["pool"] = "H100 |`<script>x</script>\x1b[31m"
    page = render.render(hostile, "html")
    assert "<script>x" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "\x1b" not in page
    md = render.render(hostile, "md")
    assert "<script>" not in md and "\x1b" not in md and "H100 \\|\\`&lt;script&gt;" in md


def test_period_counts_match_sql(conn, sim, doc):
    end = during(sim)
    start = end - DAY
    rows = conn.execute(
        "SELECT check_name, status, count(*) FROM results WHERE status IN ('fail', 'warn') AND "
        "run_id IN (SELECT id FROM runs WHERE started >= ? AND started < ?) "
        "GROUP BY check_name, status",
        (start, end),
    ).fetchall()
    expected: dict = {}
    for name, status, n in rows:
        expected.setdefault(name, {"fail": 0, "warn": 0})[status] = n
    assert {c["check"]: {"fail": c["fail"], "warn": c["warn"]} for c in doc["checks"]} == expected
    assert expected, "the period must hold failed or warned checks"
    xids = dict(
        conn.execute(
            "SELECT class, count(*) FROM events WHERE time >= ? AND time < ? GROUP BY class",
            (start, end),
        ).fetchall()
    )
    names = {"fail": "hardware", "warn": "warning", "app": "application"}
    assert doc["xids"]["by_class"] == {names[c]: xids.get(c, 0) for c in names}
    acts = dict(
        conn.execute(
            "SELECT action, count(*) FROM actions WHERE ok = 1 AND time >= ? AND time < ? "
            "GROUP BY action",
            (start, end),
        ).fetchall()
    )
    assert doc["actions"]["counts"]["drain"] == acts.get("drain", 0)
    assert doc["actions"]["counts"]["resume"] == acts.get("resume", 0)
    total = conn.execute(
        "SELECT count(*) FROM runs WHERE started >= ? AND started < ?", (start, end)
    ).fetchone()[0]
    assert doc["runs"]["total"] == total


def test_own_cost_percentiles_are_order_statistics(conn, sim, doc):
    end = during(sim)
    for row in doc["cost"]:
        durations = [
            1000 * r[0]
            for r in conn.execute(
                "SELECT duration FROM runs WHERE phase = ? AND started >= ? AND started < ?",
                (row["phase"], end - DAY, end),
            )
        ]
        assert row["runs"] == len(durations) > 10
        for q, key in ((0.5, "p50_ms"), (0.99, "p99_ms")):
            value = row[key]
            at_most = sum(d <= value + 0.05 for d in durations)
            below = sum(d < value - 0.05 for d in durations)
            assert below < q * len(durations) <= at_most, (key, value)
        assert row["p99_ms"] > row["p50_ms"]


def test_drift_names_the_drifted_nodes(doc, sim):
    planted = simulate.drifted_nodes(sim.fleet)
    items = {i["what"]: i for i in doc["drift"]["items"]}
    assert items["driver"]["majority"] == simulate.DRIVER
    assert items["VBIOS"]["majority"] == simulate.VBIOS
    assert items["IB firmware"]["majority"] == simulate.HCA_FW
    for label, kind in (("driver", "driver"), ("VBIOS", "vbios"), ("IB firmware", "ib_fw")):
        odd = {n["node"] for n in items[label]["differ"]}
        assert odd == {n for n, k in planted.items() if k == kind}
        assert items[label]["agree"] + len(odd) == items[label]["nodes"] == sim.fleet.nodes
    assert doc["drift"]["unknown"] == 0


def test_every_query_reads_runs_results_and_jobs_through_an_index(fleet_db, sim):
    """What keeps a 1M-run store within seconds (bench/bench_report.py): no full scan of the big
    tables; actions and events are small and may be scanned."""
    conn = store.connect(fleet_db)
    seen: list = []
    conn.set_trace_callback(seen.append)
    report.build(conn, during(sim), DAY)
    conn.set_trace_callback(None)
    selects = {s for s in seen if s.lstrip().upper().startswith(("SELECT", "WITH"))}
    assert len(selects) > 10
    for sql in selects:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
        scans = [step for step in plan if re.match(r"SCAN (runs|results|jobs|u|r|j)\b", step)]
        assert not scans, (sql, plan)
    conn.close()


def test_the_window_is_whole_utc_days():
    assert report.window(10 * DAY) == (10 * DAY - 28 * DAY, 10 * DAY)
    assert report.window(10 * DAY + 1) == (10 * DAY - 28 * DAY, 10 * DAY)
    assert report.window(11 * DAY - 1) == (10 * DAY - 28 * DAY, 10 * DAY)


def test_records_of_one_failure_count_once():
    records = [(0, "a", "drain", ""), (600, "a", "node_fail", ""), (700, "b", "drain", "")]
    records.append((4000, "a", "drain", ""))
    assert report.episodes(records) == [records[0], records[2], records[3]]


# --- node states from the store -----------------------------------------------------------------


def _run(conn, node: str, when: float, verdict: str, message: str = "") -> None:
    run_id = f"{node}:{when}"
    conn.execute(
        "INSERT INTO runs VALUES (?, ?, NULL, 'healthcheck', ?, 0.05, ?, 't', '{}')",
        (run_id, node, when, verdict),
    )
    if verdict != "ok":
        conn.execute(
            "INSERT INTO results VALUES (?, 'gpu.count', ?, ?, 'drain', '{}', 0)",
            (run_id, verdict, message),
        )


def test_node_states_from_the_store(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 100 * DAY
    for node in ("ok1", "resumed", "failing", "drained", "draining"):
        _run(conn, node, now - 3600, "ok")
    _run(conn, "failing", now - 60, "fail", "7 GPUs visible, 8 expected")
    store.record_action(conn, "resumed", "drain", "slurmhealth: x", "hc", when=now - 7200)
    store.record_action(conn, "resumed", "resume", "passing", "hc", when=now - 600)
    store.record_action(conn, "drained", "drain", "slurmhealth: GPU 3 lost", "hc", when=now - 900)
    store.record_action(conn, "draining", "drain", "slurmhealth: IB down", "hc", when=now - 900)
    store.record_action(conn, "later", "drain", "slurmhealth: future", "hc", when=now + 60)
    conn.execute(
        "INSERT INTO jobs (node, job_id, start, state) VALUES ('draining', '9', ?, 'running')",
        (now - 3 * 3600,),
    )
    d = report.build(conn, now, DAY)
    by_node = {n["node"]: n for n in d["fleet"]["out"]}
    assert d["fleet"]["counts"] == {
        "ok": 2, "unchecked": 0, "failing": 1, "draining": 1, "drained": 1, "down": 0
    }
    # read for every node at once (a statement per 400 nodes) as a node at a time; two runs
    # that started at the same instant are the one last_run reads
    conn.execute(
        "INSERT INTO runs VALUES ('tied:b', 'tied', NULL, 'prolog', ?, 0.05, 'ok', 't', '{}')",
        (now - 3600,),
    )
    _run(conn, "tied", now - 3600, "fail", "3 GPUs hot")
    nodes = ["ok1", "resumed", "failing", "drained", "draining", "later", "unknown", "tied"]
    read = [(n, reads.last_action(conn, n, now), reads.last_run(conn, n, now)) for n in nodes]
    alone = [report.node_state(conn, n, now, (act, run)) for n, act, run in read]
    assert report.node_states(conn, nodes, now) == alone and alone[2]["state"] == "failing"
    assert by_node["drained"]["reason"] == "slurmhealth: GPU 3 lost"
    assert by_node["drained"]["since"] == timespec.iso(now - 900)
    assert by_node["failing"]["reason"] == "gpu.count: 7 GPUs visible, 8 expected"
    assert by_node["draining"]["state"] == "draining"
    assert d["actions"]["counts"] == {
        "drain": 3,
        "resume": 1,
        "reboot": 0,
        "reset_gpu": 0,
        "breaker": 0,
        "failed": 0,
        "would-drain": 0,
    }


def test_an_empty_store_reports_without_numbers(tmp_path):
    conn = store.connect(str(tmp_path / "empty.db"))
    d = report.build(conn, 100 * DAY, DAY)
    assert d["fleet"]["nodes"] == 0 and d["rate"]["per_1000_node_days"] is None
    for fmt in report.FORMATS:
        assert "slurmhealth" in render.render(d, fmt)


# --- the three formats carry the same numbers -------------------------------------------------


class Tables(HTMLParser):
    """{table id: [[cell text]]} of an HTML page; the text of <title> and <script> apart."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict = {}
        self.rows: list | None = None
        self.cell: list | None = None
        self.scripts = 0
        self.text: list = []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts += 1
        if tag == "table":
            self.rows = self.tables.setdefault(dict(attrs).get("id", f"t{len(self.tables)}"), [])
        elif tag == "tr" and self.rows is not None:
            self.rows.append([])
        elif tag in ("td", "th") and self.rows is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None and self.rows is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "table":
            self.rows = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def html_tables(text: str) -> Tables:
    parser = Tables()
    parser.feed(text)
    return parser


def md_tables(text: str) -> list:
    """Every Markdown table as rows of unescaped cells (the separator row left out)."""
    tables, current = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        if current is None:
            current = []
            tables.append(current)
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        if all(re.fullmatch(r"\s*-*:?-+:?\s*", c) for c in cells):
            continue
        current.append([html.unescape(re.sub(r"\\(.)", r"\1", c)).strip() for c in cells])
    return tables


def md_table(tables: list, *headers: str) -> list:
    """The rows (header first) of the table whose header starts with these cells."""
    found = [t for t in tables if t and tuple(t[0][: len(headers)]) == headers]
    assert found, headers
    return found[0]


def value(text: str):
    """A cell back to a number: 1,234 -> 1234; 4.5 -> 4.5; n/a -> None."""
    if text == "n/a":
        return None
    plain = text.replace(",", "")
    try:
        return int(plain)
    except ValueError:
        return float(plain)


def numbers(rows: list) -> list:
    return [[value(c) for c in row] for row in rows[1:]]


def expected_tables(d: dict) -> dict:
    """What each shared table must hold, from the JSON alone: {html id: (md header, rows)}."""
    published = [p["cluster"] for p in d["rate"]["published"]]
    return {
        "rate-table": (
            ("failures", "node-days"),
            [
                [d["rate"]["failures"], d["rate"]["node_days"], d["rate"]["per_1000_node_days"]]
                + [p["per_1000_node_days"] for p in d["rate"]["published"]]
            ],
        ),
        "mttf": (
            ("job nodes",),
            [[m["nodes"], m["hours"], *(m[c] for c in published)] for m in d["rate"]["mttf"]],
        ),
        "cost-table": (
            ("phase",),
            [[c["phase"], c["runs"], c["p50_ms"], c["p99_ms"]] for c in d["cost"]],
        ),
        "checks": (
            ("check",),
            [[c["check"], c["fail"], c["warn"], names(c)] for c in d["checks"]],
        ),
        "xids": (
            ("class", "Xid"),
            [
                [x["class"], x["code"], x["title"], x["count"], names(x), ", ".join(x["processes"])]
                for x in d["xids"]["codes"]
            ],
        ),
        "drift-table": (
            ("hardware", "what", "fleet majority"),
            [
                [
                    i["class"],
                    i["what"],
                    i["majority"],
                    i["nodes"],
                    i["agree"],
                    i["differ_count"],
                    "; ".join(f"{r['value']} on {r['nodes']}" for r in i["rolling"]),
                ]
                for i in d["drift"]["items"]
            ],
        ),
        "lemons-table": (
            ("node", "score"),
            [
                [c["node"], c["score"], c["faults"], c["reason"], "; ".join(c["explain"])]
                for c in d["lemons"]["candidates"]
            ],
        ),
    }


def names(row: dict) -> str:
    """A row's nodes as the tables show them: the first few, then `+N more`."""
    more = f" +{row['more_nodes']} more" if row["more_nodes"] else ""
    return ", ".join(row["node_names"]) + more


def typed(rows: list) -> list:
    """Cells back to numbers where they are numbers."""
    out = []
    for row in rows:
        cells = []
        for cell in row:
            try:
                cells.append(value(cell))
            except ValueError:
                cells.append(cell)
        out.append(cells)
    return out


def test_json_html_and_markdown_carry_the_same_numbers(doc):
    d = json.loads(render.render(doc, "json"))
    assert d == json.loads(json.dumps(doc))
    page = html_tables(render.render(doc, "html"))
    md = md_tables(render.render(doc, "md"))
    for table_id, (header, want) in expected_tables(d).items():
        if not want:
            continue
        got_html = typed(page.tables[table_id][1:])
        got_md = typed(md_table(md, *header)[1:])
        width = len(want[0])
        assert [r[:width] for r in got_html] == want, table_id
        assert [r[:width] for r in got_md] == want, table_id
    states = {r[0]: r[1] for r in typed(page.tables["fleet-states"][1:])}
    md_states = {r[0]: r[1] for r in typed(md_table(md, "state")[1:])}
    for state, n in d["fleet"]["counts"].items():
        assert states[state] == md_states[state] == n
    assert md_states["all"] == d["fleet"]["nodes"]
    acts = typed(page.tables["action-counts"][1:])[0]
    md_acts = typed(md_table(md, "drains")[1:])[0]
    c = d["actions"]["counts"]
    keys = ("drain", "resume", "reboot", "reset_gpu", "breaker", "failed", "would-drain")
    assert acts == md_acts == [c[k] for k in keys]
    trend = {r[0]: r[1:] for r in typed(md_table(md, "day")[1:])}
    assert trend == {x["day"]: [x["failures"], x["incident"]] for x in d["trend"]["days"]}


def test_heatmap_and_trend_are_inline_svg_without_script(doc):
    text = render.render(doc, "html")
    page = html_tables(text)
    assert page.scripts == 0 and "<script" not in text.lower()
    assert 'id="heatmap"' in text and 'id="trend"' in text and 'id="heatmap-legend"' in text
    cells = re.findall(r'<rect class="c(\d)"[^>]*><title>([^<]*)</title>', text)
    shown = doc["heatmap"]["rows"]
    days = doc["window"]["days"]  # 27: the report's day is the simulation's last
    assert len(cells) == len(shown) * days + 5  # + the legend's five
    lit = [t for level, t in cells if level != "0" and "failure" in t]
    assert len(lit) == sum(1 for r in shown for n in r["counts"] if n)
    bars = re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', text)
    assert len(bars) == days


# --- hostile strings ---------------------------------------------------------------------------


@pytest.fixture
def hostile(tmp_path) -> dict:
    conn = store.connect(str(tmp_path / "hostile.db"))
    now = 100 * DAY + 3600
    _run(conn, HOSTILE_NODE, now - 600, "fail", HOSTILE_REASON)
    store.record_action(conn, HOSTILE_NODE, "drain", HOSTILE_REASON, "hc", when=now - 500)
    conn.execute(
        "INSERT INTO events (id, run_id, node, time, kind, code, gpu, process, class) "
        "VALUES ('x1', ?, ?, ?, 'xid', 79, 3, ?, 'fail')",
        (f"{HOSTILE_NODE}:{now - 600}", HOSTILE_NODE, now - 600, HOSTILE_PROCESS),
    )
    versions = {"gpu": {"versions": {"driver": "550 | <i>x</i>", "vbios": ["`v`"]}}}
    conn.execute("UPDATE runs SET sources = ?", (json.dumps(versions),))
    return report.build(conn, now, DAY)


def test_hostile_strings_render_as_text(hostile):
    page_text = render.render(hostile, "html")
    assert "<script>alert" not in page_text and "<img" not in page_text and "<i>x" not in page_text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page_text
    page = html_tables(page_text)
    assert page.scripts == 0
    assert page.tables["xids"][1][5] == HOSTILE_PROCESS
    assert page.tables["xids"][1][4] == HOSTILE_NODE and page.tables["checks"][1][3] == HOSTILE_NODE
    out = {r[0]: r for r in page.tables["out-of-service"][1:]}
    assert out[HOSTILE_NODE][3] == " ".join(HOSTILE_REASON.split())
    md_text = render.render(hostile, "md")
    assert "<script>" not in md_text and "<img" not in md_text
    tables = md_tables(md_text)
    for table in tables:
        assert len({len(row) for row in table}) == 1, table  # no cell split by a `|`
    rows = {r[0]: r for r in md_table(tables, "node")[1:] if len(r) == 5}
    assert rows[HOSTILE_NODE][3] == " ".join(HOSTILE_REASON.split())
    assert md_table(tables, "class", "Xid")[1][5] == HOSTILE_PROCESS
    assert json.loads(render.render(hostile, "json"))["xids"]["codes"][0]["processes"] == [
        HOSTILE_PROCESS
    ]


TERMINAL = "gpu07\x1b[31m\x1b]0;pwn\x07\r\u202e\x9b31m\x85\u2028"


def test_terminal_controls_in_any_field_reach_no_page(tmp_path):
    """Node names, actors, actions, versions and Xid codes written into a store by any means (an
    import refuses such node names; a store edited by hand does not): the HTML, the Markdown
    (both mailed, both printed to a terminal by default) and the prom text hold no control,
    bidi or line-separator character."""
    conn = store.connect(str(tmp_path / "hostile.db"))
    now = 100 * DAY + 3600
    _run(conn, TERMINAL, now - 600, "fail", f"lost {TERMINAL}")
    store.record_action(conn, TERMINAL, "drain" + TERMINAL, "why", TERMINAL, when=now - 500)
    conn.execute(
        "INSERT INTO events (id, run_id, node, time, kind, code, gpu, process, class) "
        "VALUES ('x1', ?, ?, ?, 'xid', 79, 3, ?, 'fail')",
        (f"{TERMINAL}:{now - 600}", TERMINAL, now - 600, TERMINAL),
    )
    versions = {"gpu": {"versions": {"driver": TERMINAL, "vbios": [TERMINAL]}}}
    conn.execute("UPDATE runs SET sources = ?", (json.dumps(versions),))
    doc = report.build(conn, now, DAY)
    for fmt in ("html", "md", "prom"):
        text = render.render(doc, fmt)
        bad = {ch for ch in text.replace("\n", "") if not ch.isprintable()}
        assert not bad, (fmt, bad)
    assert "gpu07?\\[31m" in render.render(doc, "md")  # shown, made inert


def test_markdown_cells_are_one_line_and_inert():
    assert render.md_escape("a|b\nc`d`<e>") == "a\\|b c\\`d\\`&lt;e&gt;"
    assert render.md_escape(None) == ""


# --- the command ---------------------------------------------------------------------------------


def cli(fleet_db: str, *args: str, env: dict | None = None):
    return run_cli("report", "--db", fleet_db, *args, env=env)


def test_cli_writes_each_format(fleet_db, sim, tmp_path):
    now = str(int(during(sim)))
    for fmt in report.FORMATS:
        out = tmp_path / f"r.{fmt}"
        proc = cli(fleet_db, "--now", now, "--format", fmt, "-o", str(out))
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # quiet off a terminal
        assert out.stat().st_size > 1000
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["generated"] == timespec.iso(float(now))
    proc = cli(fleet_db, "--now", now, "--format", "md")
    assert proc.returncode == 0 and proc.stdout == (tmp_path / "r.md").read_text()


@pytest.mark.parametrize(
    "args",
    [
        ("--now", "yesterday"),
        ("--since", "soon"),
        ("--format", "pdf"),
        ("-o", "/nonexistent-dir/r.html"),
        ("--mail-to", "root\nBcc: everyone@example.org", "-o", "{tmp}/r.html"),
        ("--mail-to", "", "-o", "{tmp}/r.html"),  # was: no mail, exit 0
        ("--mail-to", "not an address", "-o", "{tmp}/r.html"),  # was: mailed the user `not`
    ],
)
def test_cli_errors_are_one_line(fleet_db, tmp_path, args):
    args = tuple(a.replace("{tmp}", str(tmp_path)) for a in args)
    proc = cli(fleet_db, *args, env={"SLURMHEALTH_SENDMAIL": "/nonexistent/sendmail"})
    assert proc.returncode not in (0, None)
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, proc.stderr


def test_cli_without_a_store_says_so(tmp_path):
    proc = run_cli("report", "--db", str(tmp_path / "none.db"))
    assert proc.returncode == 1 and proc.stderr.strip() == f"Error: no store at {tmp_path}/none.db"


def fake_sendmail(directory, exit_code: int = 0) -> str:
    """A sendmail on PATH that records its argv and stdin (a real process, as the MTA's is)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "sendmail")
    with open(path, "w") as handle:
        handle.write(
            f"#!{sys.executable}\n"
            "import json, os, sys\n"
            "here = os.path.dirname(os.path.abspath(__file__))\n"
            "data = sys.stdin.buffer.read()\n"
            "open(os.path.join(here, 'mail.eml'), 'wb').write(data)\n"
            "json.dump(sys.argv[1:], open(os.path.join(here, 'argv.json'), 'w'))\n"
            f"sys.stderr.write('sendmail: queue full' if {exit_code} else '')\n"
            f"sys.exit({exit_code})\n"
        )
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return directory


def test_mail_goes_through_sendmail_as_html(fleet_db, sim, tmp_path):
    bin_dir = fake_sendmail(str(tmp_path / "bin"))
    out = tmp_path / "r.html"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env_args = ("--now", str(int(during(sim))), "-o", str(out), "--mail-to", "hpc@example.org")
    proc = cli(fleet_db, *env_args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.load(open(os.path.join(bin_dir, "argv.json"))) == ["-t", "-oi"]
    with open(os.path.join(bin_dir, "mail.eml"), "rb") as handle:
        msg = email.message_from_binary_file(handle, policy=email.policy.default)
    assert msg["To"] == "hpc@example.org" and msg["Subject"].startswith("slurmhealth report 20")
    assert msg.get_content_type() == "multipart/alternative"
    html_part = msg.get_body(("html",))
    text_part = msg.get_body(("plain",))
    assert html_part.get_content() == out.read_text()
    assert text_part.get_content().startswith("# slurmhealth nightly report")


def test_no_mta_still_writes_the_file(fleet_db, sim, tmp_path):
    out = tmp_path / "r.md"
    args = ("--now", str(int(during(sim))), "--format", "md", "-o", str(out), "--mail-to", "root")
    proc = cli(fleet_db, *args, env={"SLURMHEALTH_SENDMAIL": str(tmp_path / "no-sendmail")})
    assert proc.returncode == 4
    assert proc.stderr.strip().splitlines() == [
        "slurmhealth report: no local MTA (sendmail not found on PATH or in /usr/sbin): "
        "report not mailed"
    ]
    assert out.read_text().startswith("# slurmhealth nightly report")


def test_a_failing_sendmail_is_reported(fleet_db, sim, tmp_path):
    bin_dir = fake_sendmail(str(tmp_path / "bin"), exit_code=75)
    out = tmp_path / "r.json"
    args = ("--now", str(int(during(sim))), "--format", "json", "-o", str(out))
    env = {"SLURMHEALTH_SENDMAIL": os.path.join(bin_dir, "sendmail")}
    proc = cli(fleet_db, *args, "--mail-to", "root", env=env)
    assert proc.returncode == 4 and "sendmail failed (sendmail: queue full)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    with open(os.path.join(bin_dir, "mail.eml"), "rb") as handle:
        msg = email.message_from_binary_file(handle, policy=email.policy.default)
    assert msg.get_content_type() == "text/plain"
    assert json.loads(msg.get_content()) == json.loads(out.read_text())


@pytest.mark.slow  # a real sinfo without a config retries for 60 s: the report gives up at 30
def test_node_states_from_sinfo(fleet_db, sim, tmp_path):
    state = tmp_path / "slurm.json"
    nodes = {
        "gpu0001": {"state": "IDLE", "reason": ""},
        "gpu0002": {"state": "IDLE+DRAIN", "reason": "slurmhealth: GPU 3 lost", "since": 1},
        "gpu0003": {"state": "DOWN", "reason": "Not responding", "since": 1},
    }
    state.write_text(json.dumps(nodes))
    env = {
        "FAKE_SLURM_STATE": str(state),
        "SLURMHEALTH_SLURM_BIN": os.path.join(TESTS, "fakeslurm"),
    }
    args = ("--now", str(int(during(sim))), "--format", "json", "--sinfo")
    proc = cli(fleet_db, *args, env=env)
    assert proc.returncode == 0, proc.stderr
    fleet = json.loads(proc.stdout)["fleet"]
    assert fleet["source"] == "sinfo" and fleet["nodes"] == 3
    assert fleet["counts"] == {
        "ok": 1, "unchecked": 0, "failing": 0, "draining": 0, "drained": 1, "down": 1
    }
    assert {n["node"]: n["reason"] for n in fleet["out"]} == {
        "gpu0002": "slurmhealth: GPU 3 lost",
        "gpu0003": "Not responding",
    }
    # No Slurm here (or none answering): one line, nothing written.
    env = {"SLURMHEALTH_SLURM_BIN": str(tmp_path), "PATH": str(tmp_path), "SLURM_CONF": "/none"}
    proc = cli(fleet_db, "--sinfo", "-o", str(tmp_path / "r.html"), env=env)
    assert proc.returncode == 1 and "sinfo" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


# --- progress on a terminal -------------------------------------------------------------------


@pytest.fixture(scope="module")
def large_db(tmp_path_factory) -> str:
    """A fleet store past reads.large_store()'s threshold (100k runs)."""
    path = str(tmp_path_factory.mktemp("large") / "fleet.db")
    conn = store.connect(path)
    simulate.write_store(
        simulate.Fleet(nodes=100, days=28, seed=3, healthcheck_interval=1800), conn
    )
    assert reads.large_store(conn)
    conn.close()
    return path


def test_a_large_store_shows_progress_on_a_terminal_only(large_db, tmp_path):
    args = ["report", "--db", large_db, "--now", "2024-01-29", "-o", str(tmp_path / "r.html")]
    code, _, shown = run_on_pty(args)
    assert code == 0, shown
    assert "report" in shown and "100%" in shown, shown
    proc = run_cli(*args)
    assert proc.returncode == 0 and proc.stderr == ""


def test_monitor_only_would_be_drains_are_counted_and_shown(tmp_path):
    """Monitor-only mode records `would-drain` actions: the report counts them apart from
    real drains, in all three formats."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 1_800_000_000.0
    why = "slurmhealth: GPU 3 GpuIsLost"
    store.record_action(conn, "gpu07", "would-drain", why, "slurmhealth prolog", when=now - 60)
    d = report.build(conn, now, 86400)
    assert d["actions"]["counts"]["would-drain"] == 1 and d["actions"]["counts"]["drain"] == 0
    assert [a["action"] for a in d["actions"]["list"]] == ["would-drain"]
    assert "would drain (monitor-only)" in render.render(d, "html")
    assert "would drain (monitor-only)" in render.render(d, "md")


def test_the_remediation_ladders_steps_are_counted_and_listed(tmp_path):
    """A reboot asked of Slurm, one the breaker refused, a GPU reset, the node back awaiting
    a diagnosis and returned (node/ladder.py): counted apart and listed with their details."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 1_800_000_000.0
    why = "slurmhealth: reboot: GPU 0 (0000:18:00) Xid 79 GPU has fallen off the bus"
    hc = "slurmhealth healthcheck"
    steps = [
        ("gpu07", "drain", why, True, ""),
        ("gpu07", "reboot", why, True, "requested: 1 of 2 remediations in 7 d"),
        ("gpu07", "remediated", "slurmhealth: awaiting diagnosis after a reboot: x", True, ""),
        ("gpu07", "resume", "a diagnosis passed after a reboot: x", True, ""),
        ("gpu08", "reboot", why, False, "refused: circuit breaker: 2 of 20 nodes drained"),
        ("gpu09", "reset_gpu", "slurmhealth: reset: GPU 2 Xid 48", True, "GPU 2 reset"),
    ]
    for n, (node, action, reason, ok, detail) in enumerate(steps):
        store.record_action(conn, node, action, reason, hc, ok, detail, when=now - 600 + n)
    d = report.build(conn, now, 86400)
    c = d["actions"]["counts"]
    assert (c["reboot"], c["reset_gpu"], c["breaker"], c["failed"]) == (1, 1, 1, 0)
    listed = {(a["node"], a["action"]): a for a in d["actions"]["list"]}
    assert listed[("gpu07", "reboot")]["detail"] == "requested: 1 of 2 remediations in 7 d"
    assert ("gpu07", "remediated") in listed
    for fmt in ("html", "md"):
        page = render.render(d, fmt)
        assert "requested: 1 of 2 remediations in 7 d" in page and "GPU resets" in page


def test_slow_nodes_are_shown_alike_in_every_format(tmp_path):
    """The week's slow nodes (fleet/peers.py): the same numbers in JSON, HTML and Markdown, and a
    hostile node name shown as text."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 100 * DAY + 3600
    for day in range(3):
        for i in range(10):
            node = HOSTILE_NODE if i == 0 else f"gpu{i:02d}"
            busbw = 420.0 if i == 0 else 460.0 + i * 0.2
            found = {"nccl": [outcome("node", {"busbw_gbps": busbw, "wrong": 0})]}
            store.record_run(conn, diag_records(node, now - (day + 1) * DAY, found))
    store.record_run(conn, diag_records("old", now - 8 * DAY, found))  # before the week
    d = report.build(conn, now, DAY)
    assert (d["slow"]["days"], d["slow"]["nodes"], d["slow"]["total"]) == (7, 10, 1)
    [s] = d["slow"]["list"]
    assert (s["node"], s["gpu_model"], s["unit"]) == (
        HOSTILE_NODE,
        "8x NVIDIA H100 80GB HBM3",
        "node",
    )
    want = [s["node"], s["gpu_model"], "nccl", "busbw_gbps", "node", 420.0, 461.0]
    want += [round(s["deficit"] * 100, 1), 9, 3, 3]
    assert json.loads(render.render(d, "json"))["slow"] == d["slow"]
    text = render.render(d, "html")
    assert "<b>" not in text
    assert typed(html_tables(text).tables["slow-table"][1:]) == [want]
    assert typed(md_table(md_tables(render.render(d, "md")), "node", "hardware")[1:]) == [want]
    assert "No node slower than its peers." in render.render(
        report.build(conn, now + 30 * DAY, DAY), "md"
    )
    # `slurmhealth slow` at the same moment names the same node with the same figures
    proc = run_cli("slow", "--db", str(tmp_path / "fleet.db"), "--now", str(now), "--json")
    assert proc.returncode == 0, proc.stderr
    [f] = json.loads(proc.stdout)["slow"]
    assert {k: f[k] for k in s if k not in ("node", "evidence")} == {
        k: v for k, v in s.items() if k not in ("node", "evidence")
    }
    assert f["node"] == HOSTILE_NODE


def test_rising_counters_are_shown_alike_in_every_format(tmp_path):
    """A GPU whose PCIe replays rose tenfold in the last day (fleet/trends.py): the same numbers
    in JSON, HTML and Markdown, and a hostile node name shown as text."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 100 * DAY
    rows = []
    for i in range(1, 8 * 24 + 1):  # one replay episode of 2 every hour for 8 days ...
        rows.append((now - 8 * DAY + i * 3600 - 1800, 2.0))
    for i in range(1, 24 * 6 + 1):  # ... and the last day, six an hour
        rows.append((now - DAY + i * 600 - 300, 4.0))
    value = 0.0
    for t, delta in sorted(rows):
        value += delta
        conn.execute(
            "INSERT INTO counters (node, device, counter, time, value, delta, label) "
            "VALUES (?, 'gpu:0000:9b:00.0', 'pcie_replay', ?, ?, ?, 'GPU 5')",
            (HOSTILE_NODE, t, value, delta),
        )
    for i in range(10):
        _run(conn, f"gpu{i:02d}", now - 3600, "ok")
    conn.commit()
    d = report.build(conn, now, DAY)
    assert (d["rising"]["nodes"], d["rising"]["total"]) == (11, 1)
    [s] = d["rising"]["list"]
    assert (s["node"], s["device"], s["counter"], s["basis"]) == (
        HOSTILE_NODE,
        "GPU 5",
        "PCIe replays",
        "trend",
    )
    assert s["window_h"] in (6.0, 24.0) and s["ratio"] > 5
    assert json.loads(render.render(d, "json"))["rising"] == d["rising"]
    text = render.render(d, "html")
    assert "<b>" not in text
    [row] = html_tables(text).tables["rising-table"][1:]
    assert row[:3] == [HOSTILE_NODE, "GPU 5", "PCIe replays"]
    md = md_table(md_tables(render.render(d, "md")), "node", "device")
    assert md[1][:3] == [HOSTILE_NODE, "GPU 5", "PCIe replays"]
    assert "No error counter rising." in render.render(
        report.build(conn, now + 30 * DAY, DAY), "md"
    )


# --- the window, incidents, node names, Xid titles, axis ticks (issue 16) ----------------------


def test_the_window_starts_with_the_records_so_days_and_node_days_agree(conn, sim, doc):
    """A report on the simulation's last day: its 28 whole days would begin the day before
    the fleet's first record; the window says 27 days, and so do the node-days."""
    assert doc["window"]["start"] == timespec.iso(sim.fleet.start)
    assert doc["window"]["days"] == sim.fleet.days - 1 == len(doc["heatmap"]["days"])
    assert len(doc["trend"]["days"]) == doc["window"]["days"]
    assert doc["rate"]["node_days"] == sim.fleet.nodes * doc["window"]["days"]
    for fmt in ("html", "md"):
        assert f"({doc['window']['days']} whole days)" in render.render(doc, fmt)


def test_a_fleet_wide_incident_is_listed_apart_and_sounds_no_alarm(tmp_path):
    """Ten nodes drained within minutes (a switch died) and one node failing alone: the rate
    counts the one, the incident is listed with its ten, and the card is not red."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    day0 = 1_700_000_000 // DAY * DAY
    for n in range(40):  # 40 nodes x 28 days of health checks: 1,120 node-days
        for d in range(28):
            _run(conn, f"gpu{n:02d}", day0 + d * DAY + 3600, "ok")
    for n in range(10):
        store.record_action(
            conn,
            f"gpu{n:02d}",
            "drain",
            "slurmhealth: ib down",
            "hc",
            when=day0 + 10 * DAY + 7200 + 60 * n,
        )
    store.record_action(conn, "gpu30", "drain", "slurmhealth: Xid 79", "hc", when=day0 + 5 * DAY)
    d = report.build(conn, day0 + 28 * DAY + 3600, DAY)
    assert d["rate"]["failures"] == 1 and d["rate"]["incident_failures"] == 10
    assert d["rate"]["per_1000_node_days"] == round(1000 / 1120, 2)
    assert not d["rate"]["above_published"]
    (incident,) = d["rate"]["incidents"]
    assert (incident["nodes"], incident["failures"]) == (10, 10)
    assert [x["incident"] for x in d["trend"]["days"]][10] == 10
    page = render.render(d, "html")
    assert "card bad" not in re.search(r'<div class="card[^"]*"><span class="value">0.89', page)[0]
    assert "10 in 1 fleet-wide incident not counted" in page and 'id="incidents"' in page
    assert "Fleet-wide incidents, not counted above" in render.render(d, "md")


def test_check_and_xid_rows_name_their_nodes_capped_and_xids_their_meaning(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 1_700_000_000.0
    for n in range(8):
        for i in range(n + 1):  # gpu07 fails most
            _run(conn, f"gpu{n:02d}", now - 600 - i, "fail", "slurmhealth: GPU lost")
    for n in range(7):
        conn.execute(
            "INSERT INTO events (id, run_id, node, time, kind, code, gpu, process, class) "
            "VALUES (?, ?, ?, ?, 'xid', 79, 3, '', 'fail')",
            (f"x{n}", f"gpu{n:02d}:{now - 600}", f"gpu{n:02d}", now - 300),
        )
    d = report.build(conn, now, DAY)
    (row,) = [c for c in d["checks"] if c["fail"]]
    assert row["node_names"] == [f"gpu{n:02d}" for n in (7, 6, 5, 4, 3)]
    assert row["more_nodes"] == 3
    (xid,) = d["xids"]["codes"]
    assert xid["code"] == 79 and xid["title"] == "GPU has fallen off the bus"
    assert (len(xid["node_names"]), xid["more_nodes"], xid["nodes"]) == (5, 2, 7)
    page, md = render.render(d, "html"), render.render(d, "md")
    for text in (page, md):
        assert "gpu07, gpu06, gpu05, gpu04, gpu03 +3 more" in text
        assert "GPU has fallen off the bus" in text and "+2 more" in text


@pytest.mark.parametrize(
    ("peak", "ticks"),
    [
        (1, [0, 1]),
        (1.25, [0, 1, 2]),
        (3, [0, 1, 2, 3]),
        (7, [0, 2, 4, 6, 8]),
        (12, [0, 5, 10, 15]),
        (41, [0, 10, 20, 30, 40, 50]),
        (230, [0, 50, 100, 150, 200, 250]),
    ],
)
def test_count_axis_ticks_are_whole_numbers(peak, ticks):
    assert report.count_ticks(peak) == ticks


def test_the_trend_chart_labels_only_whole_counts(doc):
    text = render.render(doc, "html")
    chart = text[
        text.index('<svg id="trend"') : text.index("</svg>", text.index('<svg id="trend"'))
    ]
    labels = re.findall(r'text-anchor="end">([^<]*)</text>', chart)
    assert labels == [str(t) for t in doc["trend"]["ticks"]] and all(x.isdigit() for x in labels)


def test_the_prom_format_carries_the_signals_for_node_exporter(tmp_path):
    """`report --format prom`: lemons, rising counters, slow and odd nodes as gauges that
    Prometheus' own parser reads back, hostile names included; written 0644 for node_exporter."""
    from prometheus_client.parser import text_string_to_metric_families

    doc = {
        "lemons": {"candidates": [{"node": HOSTILE_NODE, "score": 12.5}]},
        "rising": {
            "list": [
                {
                    "node": "gpu03",
                    "device": "GPU 5",
                    "counter": "PCIe replays",
                    "basis": "trend",
                    "rate_per_h": 40.0,
                }
            ]
        },
        "slow": {
            "list": [
                {
                    "node": "gpu04",
                    "probe": "nccl",
                    "figure": "busbw_gbps",
                    "unit": "node",
                    "deficit": 0.087,
                }
            ]
        },
        "held_back": {"list": [{"node": "gpu05", "jobs": 3}]},
        "freshness": {"unguarded": [{"node": "gpu09", "jobs": 7}]},
        "drift": {
            "items": [
                {
                    "what": "driver",
                    "majority": "550.90.07",
                    "differ": [{"node": "gpu07", "value": 'x"\\\n'}],
                }
            ]
        },
    }
    text = render.render(doc, "prom")
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert found[("slurmhealth_fleet_lemon_score", (("node", HOSTILE_NODE),))] == 12.5
    rising = (
        ("basis", "trend"),
        ("counter", "PCIe replays"),
        ("device", "GPU 5"),
        ("node", "gpu03"),
    )
    assert found[("slurmhealth_fleet_rising_counter_per_hour", rising)] == 40.0
    assert [v for (n, _), v in found.items() if n == "slurmhealth_fleet_slow_deficit_ratio"] == [
        0.087
    ]
    odd = [dict(k) for n, k in found if n == "slurmhealth_fleet_odd_node"]
    # quote and backslash escaped; a newline (or any control) printed as no line of its own
    odd_value = 'x"\\ '
    assert odd == [{"node": "gpu07", "what": "driver", "value": odd_value, "majority": "550.90.07"}]
    assert "\x1b" not in text and "\r" not in text
    assert found[("slurmhealth_fleet_held_back_jobs", (("node", "gpu05"),))] == 3
    assert found[("slurmhealth_fleet_unguarded_jobs", (("node", "gpu09"),))] == 7
    empty = render.render({}, "prom")
    assert empty.count("# TYPE") == 6 and "{" not in empty
    conn = store.connect(str(tmp_path / "fleet.db"))
    conn.close()
    out = tmp_path / "fleet.prom"
    proc = run_cli("report", "--db", str(tmp_path / "fleet.db"), "--format", "prom", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (
        oct(out.stat().st_mode & 0o777) == "0o644"
        and "# TYPE slurmhealth_fleet_odd_node" in out.read_text()
    )
    refused = run_cli(
        "report", "--db", str(tmp_path / "fleet.db"), "--format", "prom", "--mail-to", "root"
    )
    assert refused.returncode == 2 and "--mail-to" in refused.stderr


def test_a_run_without_gpu_facts_keeps_the_node_in_its_hardware_class(tmp_path):
    """The newest run's GPU source failed, so it recorded only IB and kernel versions: the
    node's model and GPU versions come from the run before, and the node is compared with its
    class, not put in an "unknown GPUs" class of its own (bench/validate_drift.py --gpuless)."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    gpu = {"versions": {"model": ["NVIDIA H100 80GB HBM3"], "driver": "550.90.07"}}
    ib = {"versions": {"fw_ver": {"mlx5_0": "28.39.1002"}, "rate": [400.0]}}
    for started, sources in ((100.0, {"gpu": gpu, "ib": ib}), (200.0, {"ib": ib})):
        record_sources(conn, "gpu01", started, sources)
    found = queries.recorded_versions(conn, "gpu01", 300.0, report.VERSIONS_LOOKBACK)
    assert found["model"] == "NVIDIA H100 80GB HBM3" and found["driver"] == "550.90.07"
    assert found["ib_fw"] == "28.39.1002"


def test_every_nodes_versions_read_together_are_each_nodes_read_alone(tmp_path, monkeypatch):
    """queries.versions_of reads the newest (or oldest) version run of many nodes a statement
    at a time; a node whose run does not decide (its GPU source failed, its JSON is damaged) is
    read again alone: the answers are recorded_versions' for every node."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    gpu = {"versions": {"model": ["NVIDIA H100 80GB HBM3"], "driver": "550.90.07"}}
    ib = {"versions": {"fw_ver": {"mlx5_0": "28.39.1002"}, "rate": [400.0]}}
    record_sources(conn, "gpu01", 100.0, {"gpu": gpu, "ib": ib})
    record_sources(conn, "gpu01", 200.0, {"ib": ib})  # newest lacks the GPU: read alone
    record_sources(conn, "gpu02", 150.0, {"gpu": gpu})
    record_sources(conn, "gpu03", 150.0, {"ib": ib})
    conn.execute("""UPDATE runs SET sources = '{"versions": [' WHERE node = 'gpu03'""")  # damaged
    record_sources(conn, "gpu04", 50.0, {"gpu": gpu})  # before the look-back
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]  # gpu05: no run at all
    monkeypatch.setattr(queries, "BATCH", 2)
    for oldest in (False, True):
        together = queries.versions_of(conn, nodes, 300.0, 200.0, oldest)
        alone = {n: queries.recorded_versions(conn, n, 300.0, 200.0, oldest) for n in nodes}
        assert together == alone
    assert together["gpu01"]["model"] == "NVIDIA H100 80GB HBM3" and together["gpu04"] is None


def test_nodes_a_rollout_has_not_reached_yet_are_not_odd_nodes(tmp_path):
    """Through the store: 9 of 10 nodes moved from driver 550 to 560 within the week; the one
    still on 550 is the rollout's old end, not an odd node. Each node's earliest version record
    in the 7-day look-back says what it ran before."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 10 * 86400.0

    def record(node: str, started: float, driver: str) -> None:
        gpu = {"versions": {"model": ["NVIDIA H100 80GB HBM3"], "driver": driver}}
        record_sources(conn, node, started, {"gpu": gpu})

    for i in range(10):
        record(f"gpu{i:02d}", now - 5 * 86400.0, "550.90.07")
        record(f"gpu{i:02d}", now - 86400.0 + i * 600.0, "560.35.03" if i < 9 else "550.90.07")
    doc = report.build(conn, now, 86400.0)
    (item,) = [i for i in doc["drift"]["items"] if i["what"] == "driver"]
    assert item["majority"] == "560.35.03" and doc["drift"]["odd"] == []
    assert item["rolling"] == [{"value": "550.90.07", "nodes": 1, "stage": "old"}]
    # Eight days on, the rollout is out of the look-back: the node left behind is odd.
    later = now + 8 * 86400.0
    for i in range(10):
        record(f"gpu{i:02d}", later - 3600.0, "560.35.03" if i < 9 else "550.90.07")
    odd = report.build(conn, later, 86400.0)["drift"]["odd"]
    assert odd == ["gpu09: driver 550.90.07 vs 560.35.03 on 9 of 9 peers (NVIDIA H100 80GB HBM3)"]


def held_job(conn, job: str, end: float, slow: str, nodes: tuple) -> None:
    """A 6-hour job on `nodes` as the hooks record it: prolog and epilog runs with the job
    columns, each epilog's figures with `slow`'s GPU 3 below base clocks 41% of the job."""
    span = 6 * 3600.0
    for node in nodes:
        below = {str(i): 0.02 * span for i in range(8)}
        below["3"] = (0.41 if node == slow else 0.03) * span
        figures = json.dumps({"s": span, "j": {}, "b": below})
        share = max(below.values()) / span
        for phase, when in (("prolog", end - span), ("epilog", end)):
            run = {
                "node": node, "job_id": job, "phase": phase, "started": when, "duration": 0.04,
                "verdict": "ok", "tool_version": "t", "sources": "{}",
            }
            columns = {"uid": 1000, "user": "u", "start": when, "state": "running"}
            columns["num_nodes"] = len(nodes)
            if phase == "epilog":
                columns = {"end": when, "state": "ended", "gpu_energy": figures}
                columns["below_base"] = share
            records = {"run": run, "results": [], "events": [], "baselines": {}, "counters": []}
            store.record_run(conn, records, columns)


def test_nodes_that_held_jobs_back_are_shown_alike_in_every_format(tmp_path):
    """The lemon window's last week of held-back jobs (fleet/telemetry.py): per node, how many,
    the newest's evidence, and whether they make it a warning; a hostile node name as text."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 100 * DAY + 3600
    nodes = (HOSTILE_NODE, "gpu02", "gpu03", "gpu04")
    held_job(conn, "71", now - 3 * DAY, HOSTILE_NODE, nodes)
    held_job(conn, "72", now - 2 * DAY, HOSTILE_NODE, nodes)
    held_job(conn, "73", now - 2 * DAY, "gpu03", nodes)
    held_job(conn, "70", now - 9 * DAY, "gpu04", nodes)  # before the week
    d = report.build(conn, now, DAY)
    held = d["held_back"]
    assert (held["jobs"], held["total"], held["repeat"]) == (3, 2, 2)
    first, second = held["list"]
    assert (first["node"], first["jobs"], first["warning"], first["job"]) == (
        HOSTILE_NODE, 2, True, "72"
    )
    assert (second["node"], second["jobs"], second["warning"]) == ("gpu03", 1, False)
    assert first["evidence"] == (
        f"{HOSTILE_NODE} held the job back: GPU 3 below base clocks 41% of the job's 6.0 h, "
        "others' median 3%"
    )
    # the lemon sweep reads the same jobs: a warning for that node, none for the others
    from slurmhealth.fleet import signals  # noqa: PLC0415

    counts = signals.signals(conn, *report.window(now))
    assert [kind for _, kind, _, _ in counts[HOSTILE_NODE]["warnings"]] == ["warn"]
    assert counts["gpu03"]["warnings"] == []
    assert json.loads(render.render(d, "json"))["held_back"] == held
    text = render.render(d, "html")
    assert "<b>" not in text
    rows = html_tables(text).tables["held-table"][1:]
    want = [HOSTILE_NODE, 2, "yes", first["last"], 72, "below base clocks", first["evidence"]]
    assert typed(rows)[0] == want
    md = md_table(md_tables(render.render(d, "md")), "node", "jobs held back")
    assert typed(md[1:])[0] == want
    assert "No node held a job back." in render.render(
        report.build(conn, now + 30 * DAY, DAY), "md"
    )


def test_a_node_whose_evidence_started_afresh_is_said_in_every_format(doc):
    """A node the sweep drained as a lemon, or whose GPU was replaced, is no lemon now; the
    report says where its evidence started afresh. Node names are untrusted: escaped."""
    line = "evidence starts afresh at 2024-01-20T00:00:00Z: GPU replaced"
    node = "gpu<b>07</b>"
    afresh = dict(doc, lemons=dict(doc["lemons"], afresh=[{"node": node, "lines": [line]}]))
    md, page = render.render(afresh, "md"), render.render(afresh, "html")
    assert line in md and line in page
    assert "gpu&lt;b&gt;07&lt;/b&gt;" in page and "<b>07</b>" not in page


def test_a_diagnosis_that_ran_nothing_is_inconclusive_in_the_report_never_a_pass(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = 30 * DAY
    skipped = {"status": "skip", "unit": "node", "figures": {}, "evidence": "dcgmi not installed"}
    held = diag_records("gpu01", now - DAY, {"dcgm": [skipped]})
    held["run"]["verdict"] = "warn"  # what node/diag/run.py records for an inconclusive one
    store.record_run(conn, held)
    store.record_run(conn, diag_records("gpu02", now - DAY, {"dcgm": [outcome("gpu0", {})]}))
    shown = {d["node"]: d["outcome"] for d in report.diagnosed(conn, now - 2 * DAY, now)}
    assert shown == {"gpu01": "inconclusive", "gpu02": "pass"}


def test_a_stale_store_is_said_first_in_the_report_and_the_mail(conn, sim, doc):
    """Weeks after the last collect, the report leads with the store's newest record, in
    every format and in the mail's subject; on time, it says when the newest record is."""
    from slurmhealth.report import mail

    assert doc["freshness"]["stale"] is False and doc["freshness"]["silent_count"] == 0
    assert doc["freshness"]["newest"] <= timespec.iso(during(sim))
    late = report.build(conn, sim.fleet.end + 21 * DAY, DAY)
    fresh = late["freshness"]
    assert fresh["stale"] and fresh["hours"] >= 21 * 24 and fresh["silent_count"] == 48
    text = render.render(late, "md")
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[lines.index("# slurmhealth nightly report") + 1]
    assert first.startswith("**STALE fleet store: its newest record is from ")
    page = render.render(late, "html")
    assert page.index("STALE fleet store") < page.index('id="summary"')
    assert mail.subject(late).startswith(f"slurmhealth report {late['generated'][:10]}: STALE")
    assert "STALE" not in mail.subject(doc)


def test_nodes_that_ran_jobs_with_no_run_on_record_lead_the_report(fleet_db, sim, tmp_path):
    """Jobs accounting knows on nodes with no run of slurmhealth's (hooks not running there):
    named near the top in every format and counted in the mail's subject; none in a fleet
    whose every node records."""
    from slurmhealth.report import mail

    path = str(tmp_path / "fleet.db")
    with sqlite3.connect(fleet_db) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
    conn = store.connect(path)
    now = during(sim)
    assert report.build(conn, now, DAY)["freshness"]["unguarded_count"] == 0
    with store.immediate(conn):
        conn.executemany(
            "INSERT INTO jobs (node, job_id, start) VALUES (?, ?, ?)",
            [("gpu-x<1>", "7", now - 3600), ("gpu-x<1>", "8", now - 60), ("gpu-y", "9", now - 5)],
        )
    doc = report.build(conn, now, DAY)
    conn.close()
    fresh = doc["freshness"]
    assert fresh["unguarded_count"] == 2 and fresh["jobs_hours"] == 24
    assert fresh["unguarded"] == [{"node": "gpu-x<1>", "jobs": 2}, {"node": "gpu-y", "jobs": 1}]
    # counted as unchecked, not ok, and not listed among the nodes out of service
    assert doc["fleet"]["counts"]["unchecked"] == 2
    assert not {"gpu-x<1>", "gpu-y"} & {n["node"] for n in doc["fleet"]["out"]}
    said = "2 nodes ran jobs within 24.0 h with no run of slurmhealth's on record"
    text = render.render(doc, "md")
    assert f"\n\n**{said}**" in text and text.index(said) < text.index("\n\n## Fleet")
    assert "gpu-x&lt;1&gt; (2 jobs), gpu-y (1 job)\n" in text
    page = render.render(doc, "html")
    assert said in page and page.index(said) < page.index('id="summary"')
    assert "gpu-x&lt;1&gt; (2 jobs)" in page and "gpu-x<1>" not in page
    assert "2 with jobs and no runs, " in mail.subject(doc)
    assert re.search(r"<td>unchecked</td><td class=\"num\">2</td>", page)
    assert "| unchecked | 2 |" in text


def test_a_report_file_is_private_unless_mode_says_otherwise(fleet_db, sim, tmp_path):
    """The docs serve reports from a web server: --mode 0644 makes the file readable to it;
    without it the file is 0600 (an existing one keeps its mode); a mode with other bits is
    a usage error that writes nothing."""
    now = str(during(sim))
    private, served = tmp_path / "private.html", tmp_path / "www" / "report.html"
    served.parent.mkdir()
    args = ["report", "--db", fleet_db, "--now", now]
    assert run_cli(*args, "-o", str(private)).returncode == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    done = run_cli(*args, "-o", str(served), "--mode", "0644")
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(served.stat().st_mode) == 0o644
    for bad in ("4755", "0755", "rw"):
        wrong = run_cli(*args, "-o", str(tmp_path / "x.html"), "--mode", bad)
        assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
        assert "--mode" in wrong.stderr and not (tmp_path / "x.html").exists()


def test_a_fleet_one_day_old_is_counted_in_the_singular(tmp_path):
    """An admin's first report: one node, one health check, one day of records. Every count
    of one reads in the singular ("1 whole day", "Failures over 1 day", "1 node scored"),
    in HTML and Markdown, through check, collect and report as the admin runs them."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    node_db = spool / "gpu01.db"
    proc = run_cli(
        "check", "--record", "--node", "gpu01", "--db", str(node_db),
        "--gpu-source", os.path.join(SNAPSHOTS, "h100-hgx-healthy.json"),
        "--sysfs-root", str(tmp_path), "--kmsg", os.devnull,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    node_db.chmod(0o600)
    fleet = str(tmp_path / "fleet.db")
    proc = run_cli("collect", str(spool), "--db", fleet)
    assert proc.returncode == 0 and "1 file merged" in proc.stdout, proc.stderr
    conn = store.connect(fleet)
    (ran,) = conn.execute("SELECT started FROM runs").fetchone()
    conn.close()
    # the next day, less than 24 h after the run: its window is 1 whole day and its period
    # holds the run, at any hour the test runs (a fixed 10:00 missed runs made before 10:00)
    day, hour = divmod(int(ran), int(DAY))
    now = str((day + 1) * int(DAY) + hour // 2)
    for fmt in ("md", "html"):
        proc = cli(fleet, "--now", now, "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        text = re.sub(r"<[^>]+>", "", proc.stdout)
        assert "(1 whole day)" in text and "Failures over 1 day\n" in text, fmt
        assert "1 node scored" in text and "1 run in the period" in text, fmt
        plural = re.findall(r"\b1 (?:whole )?(?:days|nodes|runs|jobs)\b|node\(s\)", text)
        assert plural == [], (fmt, plural)
