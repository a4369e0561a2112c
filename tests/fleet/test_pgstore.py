"""fleet/pgstore.py: the fleet store on a real PostgreSQL server (tests/pgserver.py), against the
same pipeline on SQLite; and the dialect translation, statement by statement."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import open_fleet, run_cli

from slurmhealth.core import store, timespec
from slurmhealth.fleet import pgstore as pg
from slurmhealth.fleet import queries

# --- the dialect ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqlite_sql", "postgresql_sql"),
    [
        ("SELECT * FROM runs WHERE node = ? AND started > ?",
         "SELECT * FROM runs WHERE node = $1 AND started > $2"),
        ("SELECT 1 FROM runs WHERE started < :until AND node = :node",
         "SELECT 1 FROM runs WHERE started < $1 AND node = $2"),
        ("SELECT 1 FROM runs WHERE started < :until AND node = :node AND ended > :until",
         "SELECT 1 FROM runs WHERE started < $1 AND node = $2 AND ended > $1"),
        ("SELECT '?', '50%', 'a '':b' FROM runs WHERE x LIKE 'a%'",
         "SELECT '?', '50%', 'a '':b' FROM runs WHERE x LIKE 'a%'"),
        ("SELECT 5 % 2", "SELECT 5 % 2"),
        ("INSERT OR IGNORE INTO jobs (node, job_id) VALUES (?, ?)",
         "INSERT INTO jobs (node, job_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"),
        ("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
         "INSERT INTO meta (key, value) VALUES ($1, $2) "
         "ON CONFLICT (key) DO UPDATE SET value = excluded.value"),
        ("SELECT end, user, jobs.end FROM jobs WHERE end > :end",
         'SELECT "end", "user", jobs."end" FROM jobs WHERE "end" > $1'),
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
        ("BEGIN DEFERRED", "BEGIN ISOLATION LEVEL REPEATABLE READ"),
        ("SELECT min(t) FROM (SELECT a AS t FROM x UNION ALL SELECT b FROM (SELECT 1 AS b) y)",
         "SELECT min(t) FROM (SELECT a AS t FROM x UNION ALL SELECT b FROM (SELECT 1 AS b) y) "
         "AS _q0"),
        ("SELECT total(e) FILTER (WHERE h < :w0), total(e * e) FROM t LIMIT -1",
         "SELECT coalesce(sum(e) FILTER (WHERE h < $1), 0.0), coalesce(sum(e * e), 0.0) "
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
TABLES = tuple(t.name for t in store.TABLES)


@pytest.fixture(scope="module")
def node_stores(tmp_path_factory):
    """A simulated fleet's node stores (one planted lemon), as each node's hooks left them:
    (their folder, the end of the simulated period, the lemons). Four health checks an hour,
    so the rollup has runs to fold."""
    from sim import simulate

    fleet = simulate.Fleet(nodes=NODES, days=DAYS, seed=3, healthcheck_interval=900)
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
        for table in ("runs", "results", "events", "jobs", "actions", "counters"):
            where = "node = ?"
            if table == "results":
                where = "run_id IN (SELECT id FROM sim.runs WHERE node = ?)"
            target.execute(f"INSERT INTO {table} SELECT * FROM sim.{table} WHERE {where}", (node,))  # noqa: S608
        target.execute("COMMIT")
        target.execute("DETACH DATABASE sim")
        target.close()
    return str(nodes), timespec.iso(fleet.end), sorted(fleet.lemons)


def _rounded(row: tuple) -> tuple:
    """Sums of durations in another order differ in their last bits: to the microsecond."""
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def contents(db: str) -> dict:
    """Every table's rows (the spec's columns), sorted: the same on both backends when the
    same records went in."""
    conn = open_fleet(db)
    try:
        return {
            t.name: sorted(
                (_rounded(r) for r in conn.execute(f"SELECT {', '.join(t.names())} FROM {t.name}")),  # noqa: S608
                key=repr,
            )
            for t in store.TABLES
            if t.name not in ("meta", "watermarks")  # the time a file was read, its path
        }
    finally:
        conn.close()


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = run_cli(*args, env={"SLURMHEALTH_FLEET_DB": ""}, timeout=300)
    assert (proc.returncode == 0) == ok, proc.stderr
    return proc


def said_by(step: tuple, db: str) -> str:
    """What the command `step` prints with --db `db` (the store's name replaced by DB)."""
    return cli(step[0], "--db", db, *step[1:]).stdout.replace(db, "DB")


def test_every_fleet_command_gives_the_same_answers_on_postgresql(node_stores, pg_server, tmp_path):
    """collect (node stores, then the hourly rollup), lemons, report in every format, trends,
    slow, history, prune and an RMA bundle: the same output from a SQLite file and from a real
    server, and the same rows in every table."""
    nodes, end, lemons = node_stores
    lite, server = str(tmp_path / "fleet.db"), pg_server.new_database()
    node = "gpu0001"
    morning = timespec.iso(timespec.parse_instant(end) + 6 * 3600)  # two spans: the lemons' 28 days
    steps = [
        ("collect", nodes, "--now", end, "--since", f"{DAYS}d"),
        ("collect", nodes, "--now", end, "--since", f"{DAYS}d"),  # again: nothing new
        ("lemons", "--now", end, "--window", f"{DAYS}d", "--json"),
        ("lemons", "--now", end, "--window", f"{DAYS}d"),
        ("report", "--now", end, "--since", f"{DAYS}d", "--format", "json"),
        ("report", "--now", end, "--since", f"{DAYS}d", "--format", "md"),
        ("report", "--now", end, "--since", f"{DAYS}d", "--format", "prom"),
        ("report", "--now", end, "--since", f"{DAYS}d", "--format", "html"),
        ("report", "--now", morning, "--since", f"{DAYS}d", "--format", "json"),
        ("trends", "--now", end),
        ("slow", "--now", end),
        ("trends", "--now", end, "--json"),
        ("slow", "--now", end, "--json"),
        ("history", "--node", node, "--now", end, "--since", f"{DAYS}d", "--json"),
        ("collect", nodes, "--now", end, "--since", f"{DAYS}d", "--rollup-after", "2d"),
        ("lemons", "--now", end, "--window", f"{DAYS}d", "--json"),
        ("report", "--now", end, "--since", f"{DAYS}d", "--format", "json"),
        ("prune", "--older-than", "8d", "--now", end, "--dry-run"),
        ("prune", "--older-than", "8d", "--now", end),
        ("lemons", "--now", end, "--window", f"{DAYS}d", "--json"),
    ]
    seen = []
    for step in steps:
        said = [said_by(step, db) for db in (lite, server)]
        assert said[0] == said[1], step
        seen.append(said[0])
        if step[0] == "collect" and "--rollup-after" in step:
            assert contents(lite) == contents(server)
            assert len(contents(server)["run_hours"]) > 1000
    assert sorted(e["node"] for e in json.loads(seen[2])["lemons"]) == lemons
    assert contents(lite) == contents(server)
    bundles = []  # an RMA bundle is the same bytes for the same records and --now
    for db in (lite, server):
        out = tmp_path / f"rma-{len(bundles)}.tar.gz"
        cli("rma", node, "--db", db, "--now", end, "-o", str(out))
        bundles.append(out.read_bytes())
    assert bundles[0] == bundles[1]


def test_an_ndjson_spool_is_collected_alike(node_stores, pg_server, tmp_path):
    nodes, end, _ = node_stores
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    for name in sorted(n for n in os.listdir(nodes) if n.endswith(".db"))[:4]:
        node_db = os.path.join(nodes, name)
        cli("export", "--db", node_db, "-o", str(spool / name.replace(".db", ".ndjson")))
    lite, server = str(tmp_path / "fleet.db"), pg_server.new_database()
    for db in (lite, server):
        copy = tmp_path / f"spool-{len(os.listdir(tmp_path))}"
        shutil.copytree(spool, copy)
        cli("collect", str(copy), "--db", db, "--consume")
        assert os.listdir(copy) == []  # merged, then removed
    assert contents(lite) == contents(server)
    assert len(contents(server)["runs"]) > 1000


# --- a SQLite fleet store moved onto the server -------------------------------------------------


def test_fleet_migrate_copies_every_table_and_the_answers_stay(node_stores, pg_server, tmp_path):
    nodes, end, _ = node_stores
    lite = str(tmp_path / "fleet.db")
    cli("collect", nodes, "--db", lite, "--now", end, "--since", f"{DAYS}d", "--rollup-after", "2d")
    before = os.stat(lite).st_mtime_ns, open(lite, "rb").read()
    server = pg_server.new_database()
    said = cli("fleet", "migrate", lite, server).stdout
    assert said.startswith("copied ") and " runs" in said and "run_hours" in said
    assert (os.stat(lite).st_mtime_ns, open(lite, "rb").read()) == before  # read, not changed
    assert contents(lite) == contents(server)
    sweep = ("lemons", "--now", end, "--window", f"{DAYS}d", "--json")
    assert said_by(sweep, lite) == said_by(sweep, server)
    # the rollup's mark (the last run it saw, by rowid) means the same on the server
    again = ("collect", nodes, "--now", end, "--since", f"{DAYS}d", "--rollup-after", "2d")
    for db in (lite, server):
        cli(again[0], *again[1:2], "--db", db, *again[2:])
    assert contents(lite) == contents(server)
    # a second migrate into a database that holds runs is refused, one line, nothing copied
    proc = cli("fleet", "migrate", lite, server, ok=False)
    assert "holds" in proc.stderr and "empty database" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fleet", "migrate", "/nonexistent/fleet.db", "URL"], "no such file"),
        (["fleet", "migrate", "FILE", "/tmp/not-a-url"], "not a postgresql:// URL"),
        (["fleet", "migrate", "EMPTY", "URL"], "not a slurmhealth store"),
        (["fleet", "migrate", "FILE", "postgresql://slurmhealth@127.0.0.1:1/x"], "127.0.0.1"),
        (["fleet", "migrate", "FILE", "postgresql://u:s3cret@127.0.0.1:1/x"], "~/.pgpass"),
        (["lemons", "--db", "postgresql://u:s3cret@127.0.0.1:1/x"], "$PGPASSWORD"),
    ],
)
def test_fleet_migrate_refusals_are_one_line(pg_server, tmp_path, args, message):
    lite = str(tmp_path / "fleet.db")
    store.connect(lite).close()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).execute("CREATE TABLE x (a)")
    subs = {"FILE": lite, "EMPTY": str(empty), "URL": pg_server.new_database()}
    proc = cli(*[subs.get(a, a) for a in args], ok=False)
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr and "s3cret" not in proc.stderr


def test_help_acts_not(pg_server):
    url = pg_server.new_database()
    assert cli("fleet", "migrate", "--help").stdout.startswith("Usage:")
    assert "slurmhealth_schema" not in str(_tables(url))


def _tables(url: str) -> list:
    import psycopg

    with psycopg.connect(url) as conn:
        sql = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        return conn.execute(sql).fetchall()


# --- several collectors, a server lost mid-collect, a read replica -------------------------------


def _spools(nodes: str, folder: pathlib.Path, names: list) -> pathlib.Path:
    folder.mkdir(mode=0o700)
    for name in names:
        ndjson = str(folder / name.replace(".db", ".ndjson"))
        cli("export", "--db", os.path.join(nodes, name), "-o", ndjson)
    return folder


def test_two_collectors_at_once_count_every_record_once(node_stores, pg_server, tmp_path):
    """Two collect processes (one per rack), started together on one server, their spools
    overlapping by two nodes: every record once, the same store as one collect of all."""
    nodes, end, _ = node_stores
    names = sorted(n for n in os.listdir(nodes) if n.endswith(".db"))
    racks = [
        _spools(nodes, tmp_path / "rack1", names[:7]),
        _spools(nodes, tmp_path / "rack2", names[5:]),
    ]
    server = pg_server.new_database()
    open_fleet(server).close()  # created once, before both start
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "slurmhealth", "collect", str(rack), "--db", server, "--consume",
             "--rollup-after", "2d", "--now", end],
            env=dict(os.environ, SLURMHEALTH_FLEET_DB=""), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        for rack in racks
    ]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    lite = str(tmp_path / "fleet.db")
    cli("collect", nodes, "--db", lite, "--rollup-after", "2d", "--now", end)
    together, alone = contents(server), contents(lite)
    # The rollup is exact: each node-hour's passing health checks, as rows and as counts,
    # are as many as one collect of everything leaves. Which hours are folded may differ (a
    # node whose records came after its hours were rolled up keeps them whole).
    assert passes_per_hour(together) == passes_per_hour(alone)
    assert sum(h[3] for h in together["run_hours"]) > 1000
    passing = ("healthcheck", "ok")
    for name in together:
        if name == "runs":
            assert [r for r in together[name] if (r[3], r[6]) != passing] == [
                r for r in alone[name] if (r[3], r[6]) != passing
            ]
        elif name not in ("run_hours", "results"):  # results: the skips of folded runs
            assert together[name] == alone[name], name
    assert [os.listdir(r) for r in racks] == [[], []]


def passes_per_hour(tables: dict) -> dict:
    """{(node, hour): passing health checks}, whether a run is a row or folded into a count."""
    out: dict = {}
    for run in tables["runs"]:
        if (run[3], run[6]) == ("healthcheck", "ok"):
            key = (run[1], int(run[4] // 3600) * 3600)
            out[key] = out.get(key, 0) + 1
    for node, hour, _phase, runs, _duration in tables["run_hours"]:
        out[(node, int(hour))] = out.get((node, int(hour)), 0) + runs
    return out


def _until(ready, seconds: float = 120.0) -> bool:
    """Whether ready() came true within `seconds` (generous: a loaded CI machine is slow to
    start a server or replay its log)."""
    ends = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > ends:
            return False
        time.sleep(0.05)
    return True


def test_a_server_lost_mid_collect_loses_nothing(node_stores, tmp_path):
    """The server stopped (immediate: as a crash) while collect waits to write: collect says so
    in one line and exits 1, every spool file stays, and the next collect, with the server
    back, merges them all (durable writes: fsync on)."""
    import pgserver
    import psycopg

    nodes, _, _ = node_stores
    names = sorted(n for n in os.listdir(nodes) if n.endswith(".db"))[:3]
    spool = _spools(nodes, tmp_path / "spool", names)
    untouched = tmp_path / "untouched"
    shutil.copytree(spool, untouched)
    server = pgserver.Server(fsync=True)
    try:
        url = server.new_database()
        open_fleet(url).close()
        holder = psycopg.connect(url)
        holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")  # collect waits on it
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurmhealth", "collect", str(spool), "--db", url, "--consume"],
            env=dict(os.environ, SLURMHEALTH_FLEET_DB=""), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        watch = psycopg.connect(url, autocommit=True)  # its own view of the activity
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        assert _until(lambda: watch.execute(waiting).fetchone()[0]), "collect never wrote"
        server.stop("immediate")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
        kept = sorted(os.listdir(spool))
        assert len(kept) == len(names), kept  # every file stays, claimed or not
        server.start()
        cli("collect", str(spool), "--db", url, "--consume")
        assert os.listdir(spool) == []
        lite = str(tmp_path / "fleet.db")
        cli("collect", str(untouched), "--db", lite)
        assert contents(url) == contents(lite)
        assert len(contents(url)["runs"]) > 1000
    finally:
        server.remove()


def _collected(node_stores: tuple, pg_server) -> tuple:
    """(a new database on the server `pg_server` with the simulated fleet collected into it,
    the fleet's end)."""
    nodes, end, _ = node_stores
    db = pg_server.new_database()
    cli("collect", nodes, "--db", db, "--now", end, "--since", f"{DAYS}d")
    return db, end


def test_a_read_replica_serves_report_and_lemons_and_refuses_writes(
    node_stores, pg_server, tmp_path
):
    """The primary is a server of its own: the session's server holds every database the
    other tests made, and copying them all for the standby took minutes on a slow machine."""
    import pgserver

    source = pgserver.Server()  # pg_server above: the one check that a server can run
    replica = None
    try:
        primary, end = _collected(node_stores, source)
        replica = pgserver.Server(primary=source)
        assert _until(lambda: replica.replayed(source)), "the replica never caught up"
        mirror = primary.replace(f":{source.port}/", f":{replica.port}/")
        for step in (
            ("lemons", "--now", end, "--window", f"{DAYS}d", "--json"),
            ("report", "--now", end, "--since", f"{DAYS}d", "--format", "json"),
            ("trends", "--now", end, "--json"),
        ):
            said = [said_by(step, db) for db in (primary, mirror)]
            assert said[0] == said[1], step
        proc = cli("collect", node_stores[0], "--db", mirror, "--now", end, ok=False)
        assert "read-only" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    finally:
        if replica is not None:
            replica.remove()
        source.remove()


# --- one snapshot for a whole read, and reads beside it ----------------------------------------


def _runs(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM runs").fetchone()[0]


def _write_run(db: str, run_id: str) -> None:
    """A run written and committed by another connection, as collect writes while a report
    reads."""
    writer = open_fleet(db)
    try:
        with store.immediate(writer):
            writer.execute(
                "INSERT INTO runs (id, node, phase, started, duration, verdict, tool_version) "
                "VALUES (?, 'gpu01', 'healthcheck', 100.0, 0.1, 'ok', 'test')",
                (run_id,),
            )
    finally:
        writer.close()


def test_a_read_transaction_sees_one_snapshot_while_collect_writes(fleet_store):
    conn = open_fleet(fleet_store)
    _write_run(fleet_store, "r1")
    with queries.snapshot(conn):
        before = _runs(conn)
        _write_run(fleet_store, "r2")
        assert _runs(conn) == before == 1  # a server's READ COMMITTED would say 2
    assert _runs(conn) == 2
    conn.close()


def _backend(conn: sqlite3.Connection) -> tuple:
    """(runs counted, the server process that counted them: None on SQLite)."""
    pid = None if isinstance(conn, sqlite3.Connection) else conn.execute(
        "SELECT pg_backend_pid()"
    ).fetchone()[0]
    return _runs(conn), pid


def test_a_read_beside_sees_the_callers_snapshot_on_another_server_process(fleet_store):
    conn = open_fleet(fleet_store)
    _write_run(fleet_store, "r1")
    with queries.snapshot(conn):
        mine = _backend(conn)
        _write_run(fleet_store, "r2")  # after the snapshot: neither read sees it
        with queries.beside(conn, _backend) as result:
            assert _backend(conn) == mine
            counted, pid = result()
    assert counted == mine[0] == 1
    if isinstance(conn, sqlite3.Connection):
        assert pid is None  # read here, on conn
    else:
        assert pid is not None and pid != mine[1]
    conn.close()


def test_a_read_beside_is_read_here_where_the_server_refuses_a_second_connection(pg_server):
    db = pg_server.new_database()
    open_fleet(db).close()  # the schema, by the store's owner
    admin = open_fleet(db)
    admin.execute("DROP ROLE IF EXISTS solo")
    admin.execute("CREATE ROLE solo LOGIN CONNECTION LIMIT 1")
    admin.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO solo")
    admin.execute("GRANT USAGE, CREATE ON SCHEMA public TO solo")  # its IF NOT EXISTS
    admin.close()
    _write_run(db, "r1")
    import pgserver

    conn = open_fleet(db.replace(f"{pgserver.USER}@", "solo@"))
    mine = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with queries.snapshot(conn):
        assert pg.twin(conn) is None
        with queries.beside(conn, _backend) as result:
            assert result() == (1, mine)
    conn.close()


def test_no_twin_outside_a_repeatable_read(pg_server):
    conn = open_fleet(pg_server.new_database())
    assert pg.twin(conn) is None  # no transaction
    conn.execute("BEGIN")  # READ COMMITTED: each statement its own snapshot
    assert pg.twin(conn) is None
    conn.rollback()
    conn.close()


def test_leaving_early_stops_the_read_beside(pg_server):
    conn = open_fleet(pg_server.new_database())
    said: list = []

    def sleep(other: sqlite3.Connection) -> None:
        try:
            other.execute("SELECT pg_sleep(600)")
        except sqlite3.Error as exc:
            said.append(str(exc))

    with pytest.raises(KeyError), queries.snapshot(conn), queries.beside(conn, sleep):
        time.sleep(0.5)  # the sleep under way on the other connection
        raise KeyError("the caller fails")
    assert len(said) == 1 and "cancel" in said[0], said
    conn.close()


def test_halves_read_each_half_on_its_own_process_in_the_items_order(fleet_store, monkeypatch):
    monkeypatch.setattr(queries, "BATCH", 2)
    conn = open_fleet(fleet_store)
    items = [f"n{i}" for i in range(9, 0, -1)]  # not in name order: the merge keeps theirs

    def read(c: sqlite3.Connection, some: list) -> dict:
        return {item: _backend(c)[1] for item in some}

    with queries.snapshot(conn):
        found = queries.halves(conn, read, items)
        small = queries.halves(conn, read, items[:3])  # under two statements: one read, here
    assert list(found) == items and list(small) == items[:3]
    first, second = set(found[i] for i in items[:4]), set(found[i] for i in items[4:])
    assert len(first) == len(second) == 1 and set(small.values()) == first
    if isinstance(conn, sqlite3.Connection):
        assert first == second == {None}
    else:
        assert first != second  # the second half on the twin
    conn.close()


def test_the_days_in_service_read_in_halves_are_those_read_in_one(
    node_stores, pg_server, monkeypatch
):
    from slurmhealth.fleet import signals

    db, end = _collected(node_stores, pg_server)
    conn = open_fleet(db)
    at = timespec.parse_instant(end)
    windows = [(at - 7 * 86400 - 3600, at), (at - 86400, at)]

    def read() -> list:
        with queries.snapshot(conn):
            return [(w.runs, w.jobs) for w in signals.service(conn, windows)]

    whole = read()
    monkeypatch.setattr(queries, "BATCH", 2)  # 12 nodes: 6 on each process
    halved = read()
    assert halved == whole and [list(r) for r, _ in halved] == [list(r) for r, _ in whole]
    assert any(runs for runs, _ in whole) and any(jobs for _, jobs in whole)
    conn.close()
