"""core/pgstore.py: the fleet store on a real PostgreSQL server (tests/pgserver.py), against the
same pipeline on SQLite; and the dialect translation, statement by statement."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import run_cli

from slurmhealth.core import pgstore as pg
from slurmhealth.core import store, timespec

# --- the dialect ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqlite_sql", "postgresql_sql"),
    [
        ("SELECT * FROM runs WHERE node = ? AND started > ?",
         "SELECT * FROM runs WHERE node = %s AND started > %s"),
        ("SELECT 1 FROM runs WHERE started < :until AND node = :node",
         "SELECT 1 FROM runs WHERE started < %(until)s AND node = %(node)s"),
        ("SELECT '?', '50%', 'a '':b' FROM runs WHERE x LIKE 'a%'",
         "SELECT '?', '50%%', 'a '':b' FROM runs WHERE x LIKE 'a%%'"),
        ("SELECT 5 % 2", "SELECT 5 %% 2"),
        ("INSERT OR IGNORE INTO jobs (node, job_id) VALUES (?, ?)",
         "INSERT INTO jobs (node, job_id) VALUES (%s, %s) ON CONFLICT DO NOTHING"),
        ("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
         "INSERT INTO meta (key, value) VALUES (%s, %s) "
         "ON CONFLICT (key) DO UPDATE SET value = excluded.value"),
        ("SELECT end, user, jobs.end FROM jobs WHERE end > :end",
         'SELECT "end", "user", jobs."end" FROM jobs WHERE "end" > %(end)s'),
        ("SELECT CASE WHEN a THEN 1 END FROM t", "SELECT CASE WHEN a THEN 1 END FROM t"),
        ("SELECT a IS NOT b, a IS b, a IS NOT NULL, a IS NULL FROM t",
         "SELECT a IS DISTINCT FROM b, a IS NOT DISTINCT FROM b, a IS NOT NULL, a IS NULL FROM t"),
        ("SELECT max(a), max(a, b), min(max(c), 3) FROM t",
         "SELECT max(a), GREATEST(a, b), LEAST(max(c), 3) FROM t"),
        ("SELECT group_concat(DISTINCT CAST(start / 86400 AS INTEGER)) FROM jobs",
         "SELECT string_agg(DISTINCT (CAST(trunc(start / 86400) AS BIGINT))::text, ',') FROM jobs"),
        ("SELECT instr(sources, '\"versions\"') FROM temp.roll",
         "SELECT (strpos(sources, '\"versions\"') > 0) FROM pg_temp.roll"),
        ("SELECT sum(a = 1), sum(x), sum(CASE WHEN a > 1 THEN x END), sum(f(a = 1)) FROM t",
         "SELECT sum(CAST(a = 1 AS INT)), sum(x), sum(CASE WHEN a > 1 THEN x END), "
         "sum(f(a = 1)) FROM t"),
        ("SELECT a FROM runs INDEXED BY runs_not_ok WHERE b", "SELECT a FROM runs WHERE b"),
        ("CREATE TABLE x (a REAL, b INTEGER NOT NULL)",
         "CREATE TABLE x (a DOUBLE PRECISION, b BIGINT NOT NULL)"),
        ("BEGIN IMMEDIATE", "BEGIN"),
        ("SELECT total(e) FILTER (WHERE h < :w0), total(e * e) FROM t LIMIT -1",
         "SELECT coalesce(sum(e) FILTER (WHERE h < %(w0)s), 0.0), coalesce(sum(e * e), 0.0) "
         "FROM t LIMIT ALL"),
    ],
)  # fmt: skip
def test_a_statement_is_translated_outside_its_literals(sqlite_sql, postgresql_sql):
    assert pg.translate(sqlite_sql) == postgresql_sql


def test_a_password_is_never_shown():
    assert pg.shown("postgresql://u:s3cret@db:5432/fleet") == "postgresql://u:***@db:5432/fleet"
    assert pg.shown("postgresql://u@db/fleet") == "postgresql://u@db/fleet"


# --- the pipeline on both backends -----------------------------------------------------------

NODES, DAYS = 12, 10
TABLES = ("runs", "results", "events", "jobs", "actions", "counters")


@pytest.fixture(scope="module")
def node_stores(tmp_path_factory):
    """A simulated fleet's node stores (one planted lemon), as each node's hooks left them."""
    from sim import simulate

    fleet = simulate.Fleet(nodes=NODES, days=DAYS, seed=3, healthcheck_interval=3600)
    fleet.lemons = simulate.pick_lemons(fleet, 1, 40.0)
    history = simulate.events(fleet)
    folder = tmp_path_factory.mktemp("fleet")
    whole = str(folder / "all.db")
    conn = store.connect(whole)
    simulate.write_store(history, conn)
    conn.close()
    nodes = folder / "nodes"
    nodes.mkdir(mode=0o700)
    for node in history.names:
        target = store.connect(str(nodes / f"{node}.db"))
        target.execute("ATTACH DATABASE ? AS sim", (whole,))
        target.execute("BEGIN IMMEDIATE")
        for table in TABLES:
            where = "node = ?"
            if table == "results":
                where = "run_id IN (SELECT id FROM sim.runs WHERE node = ?)"
            target.execute(f"INSERT INTO {table} SELECT * FROM sim.{table} WHERE {where}", (node,))  # noqa: S608
        target.execute("COMMIT")
        target.execute("DETACH DATABASE sim")
        target.close()
    return str(nodes), timespec.iso(fleet.end), sorted(fleet.lemons)


def _counts(conn) -> dict:
    return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}  # noqa: S608


def _cli(*args: str) -> str:
    proc = run_cli(*args, env={"SLURMHEALTH_FLEET_DB": ""}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_collect_and_lemons_give_the_same_answers_on_postgresql(node_stores, pg_server, tmp_path):
    nodes, end, lemons = node_stores
    lite, server = str(tmp_path / "fleet.db"), pg_server.new_database()
    window = ("--now", end, "--since", f"{DAYS}d")
    answers = {}
    for db in (lite, server):
        first = _cli("collect", nodes, "--db", db, *window)
        again = _cli("collect", nodes, "--db", db, *window)  # nothing new: nothing added
        conn = pg.connect(db) if pg.is_url(db) else sqlite3.connect(db)
        counts = _counts(conn)
        conn.close()
        sweep = _cli("lemons", "--db", db, "--now", end, "--window", f"{DAYS}d", "--json")
        sweep = json.loads(sweep)
        answers[db] = (counts, sweep, "added" in first, again)
    assert answers[lite][0] == answers[server][0]
    assert all(n for t, n in answers[lite][0].items() if t != "counters")  # none simulated
    assert answers[lite][1] == answers[server][1]
    assert sorted(e["node"] for e in answers[server][1]["lemons"]) == lemons
