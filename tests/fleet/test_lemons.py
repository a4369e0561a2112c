"""`slurmhealth lemons` over a simulated fleet store: scores, evidence, --apply through the
breaker. Slurm is tests/fakeslurm here; tests/slurm/test_lemons.py runs it on a real Slurm."""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest
from conftest import TESTS, open_fleet, run_cli

from sim import simulate
from slurmhealth.core import store
from slurmhealth.fleet import lemons, policy

FAKE_SLURM = os.path.join(TESTS, "fakeslurm")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fleet_db(request, tmp_path_factory):
    """(the store, the fleet, a function that makes another store like it): 64 nodes over 28
    days with two planted lemons, on each backend. Written once, then copied (a file, or a
    database made from it as a template)."""
    fleet = simulate.Fleet(nodes=64, days=28, seed=3, incident_day=None)
    fleet.lemons = simulate.pick_lemons(fleet, 2, 100)
    folder = tmp_path_factory.mktemp("fleet")
    server = request.getfixturevalue("pg_server") if request.param == "postgresql" else None
    pristine = server.new_database() if server else str(folder / "pristine.db")
    conn = open_fleet(pristine)
    simulate.write_store(fleet, conn)
    if server:
        conn.execute("ANALYZE")  # the planner's figures, as autovacuum leaves them in time
    conn.close()

    def another() -> str:
        if server:
            return server.new_database(template=pristine)
        path = str(folder / f"fleet-{len(os.listdir(folder))}.db")
        with sqlite3.connect(pristine) as source, sqlite3.connect(path) as copy:
            source.backup(copy)
        return path

    return another(), fleet, another


def test_lemons_are_named_with_their_evidence(fleet_db):
    path, fleet, _ = fleet_db
    proc = run_cli("lemons", "--db", path, "--now", str(fleet.end), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(e["node"] for e in doc["lemons"]) == sorted(fleet.lemons)
    assert len(doc["nodes"]) == 64 and doc["applied"] == []
    for entry in doc["lemons"]:
        assert entry["reason"] and entry["evidence"]
    text = run_cli("lemons", "--db", path, "--now", str(fleet.end)).stdout
    assert text.startswith("2 lemons among 64 nodes over 28 days")
    # each node carries the verdict's boundary, and the text says it for the fleet's pool
    least = policy.DEFAULT_PARAMS["min_faults"]
    for entry in doc["nodes"]:
        faults = entry["evidence"]["faults"]
        assert faults["needed"] >= least and faults["needed_day"] >= 3
        if faults["count"] >= faults["needed"] or faults["worst_day"] >= faults["needed_day"]:
            assert entry["lemon"], entry["node"]
    bar = max(doc["nodes"], key=lambda e: e["evidence"]["faults"]["expected"])["evidence"]
    line = text.splitlines()[1]
    assert line == (
        f"  fleet: a node seen throughout is a lemon at {bar['faults']['needed']} separate "
        f"faults ({bar['faults']['expected']:.2g} expected) or "
        f"{bar['faults']['needed_day']} within 24 h"
    )


def slurm_env(tmp_path, fleet, share):
    state = tmp_path / "slurm.json"
    state.write_text(json.dumps({n: {"state": "IDLE", "reason": ""} for n in fleet.names()}))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[settings]\nslurm_bin = "{FAKE_SLURM}"\nbreaker_share = {share}\n')
    return state, cfg, {"FAKE_SLURM_STATE": str(state)}


def test_apply_drains_the_lemons_with_reasons(fleet_db, tmp_path):
    path, fleet, _ = fleet_db
    state, cfg, env = slurm_env(tmp_path, fleet, 0.10)
    proc = run_cli(
        "lemons",
        "--db",
        path,
        "--now",
        str(fleet.end),
        "--apply",
        "--json",
        "--config",
        str(cfg),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    nodes = json.loads(state.read_text())
    drained = {n: v["reason"] for n, v in nodes.items() if v["reason"]}
    assert sorted(drained) == sorted(fleet.lemons)
    assert all(r.startswith("slurmhealth: lemon: ") for r in drained.values())
    rows = (
        open_fleet(path)
        .execute(
            "SELECT count(*) FROM actions WHERE actor = 'slurmhealth lemons' AND action = 'drain'"
        )
        .fetchone()
    )
    assert rows == (2,)


def test_a_lemon_slurm_does_not_know_is_skipped_and_the_sweep_goes_on(fleet_db, tmp_path):
    """A lemon removed from slurm.conf (the store still scores its month): scontrol answers
    "Node X not found", the controller is up, so it is skipped, said once, and the next lemon
    is drained; it was taken for an unreachable Slurm, which stopped the sweep every hour."""
    _, fleet, another = fleet_db
    path = another()
    state, cfg, env = slurm_env(tmp_path, fleet, 0.10)
    nodes = json.loads(state.read_text())
    gone = sorted(fleet.lemons)[0]
    del nodes[gone]
    state.write_text(json.dumps(nodes))
    args = ("lemons", "--db", path, "--now", str(fleet.end), "--apply", "--json")
    for _ in range(2):  # the hourly sweep again: one skip recorded, not one an hour
        proc = run_cli(*args, "--config", str(cfg), env=env)
        assert proc.returncode == 0, proc.stderr
    outcomes = {a["node"]: a["outcome"] for a in json.loads(proc.stdout)["applied"]}
    assert outcomes[gone] == "skipped"
    assert f"{gone} not drained: Slurm has no such node" in proc.stderr
    drained = {n for n, v in json.loads(state.read_text()).items() if v["reason"]}
    assert drained == set(fleet.lemons) - {gone}
    rows = open_fleet(path).execute(
        "SELECT action, detail FROM actions WHERE node = ? AND actor = 'slurmhealth lemons'",
        (gone,),
    ).fetchall()
    assert len(rows) == 1 and rows[0][0] == "drain-skipped" and "not found" in rows[0][1]


def test_a_lemon_the_sweep_drained_starts_afresh_and_an_admins_return_stands(fleet_db, tmp_path):
    """The sweep drains a lemon once; an admin resumes it (they decided on that evidence, or
    repaired it): its evidence starts afresh at the drain, so the hourly sweeps after leave it
    in service, ask nothing of Slurm and say why. One new fault is not enough on its own;
    faults after the return that suffice on their own make it a lemon to drain again."""
    _, fleet, another = fleet_db
    path = another()  # its own store: the module's has other tests' drains
    state, cfg, env = slurm_env(tmp_path, fleet, 0.10)
    now = time.time() + 60  # past the drains this test makes, over the whole simulated month

    args = ["lemons", "--db", path, "--now", f"{now:.3f}", "--window", f"{now - fleet.start:.0f}s"]
    args += ["--silent-after", f"{now - fleet.start:.0f}s"]  # the month is old: not stale here

    def sweep() -> dict:
        proc = run_cli(*args, "--apply", "--json", "--config", str(cfg), env=env)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    first = sweep()
    assert sorted(a["node"] for a in first["applied"] if a["outcome"] == "drained") == sorted(
        fleet.lemons
    )
    nodes = json.loads(state.read_text())
    for name in fleet.lemons:  # the admin returns them
        nodes[name] = {"state": "IDLE", "reason": ""}
    state.write_text(json.dumps(nodes))
    calls = len(open(f"{state}.calls").readlines())
    second = sweep()
    assert not set(fleet.lemons) & {e["node"] for e in second["lemons"]}
    assert not set(fleet.lemons) & {a["node"] for a in second["applied"]}
    assert not any(v["reason"] for v in json.loads(state.read_text()).values())
    assert len(open(f"{state}.calls").readlines()) == calls, "Slurm was asked"
    entry = {e["node"]: e for e in second["nodes"]}[sorted(fleet.lemons)[0]]
    reset = entry["evidence"]["faults"]["reset"]
    assert reset["why"] == "drained as a lemon" and entry["evidence"]["faults"]["count"] == 0
    text = run_cli(*args).stdout
    assert "evidence starts afresh at" in text and "drained as a lemon" in text

    lemon = sorted(fleet.lemons)[0]
    conn = open_fleet(path)

    def record(verdict: str, at: float) -> None:
        run = {
            "node": lemon,
            "job_id": None,
            "phase": "healthcheck",
            "started": at,
            "duration": 0.1,
            "verdict": verdict,
            "tool_version": "test",
        }
        store.record_run(conn, {"run": run, "results": [], "events": [], "baselines": {}})

    record("fail", time.time())
    assert lemon not in {e["node"] for e in sweep()["lemons"]}, "one new fault sufficed"
    record("ok", time.time())
    record("fail", time.time())
    conn.close()
    third = sweep()
    outcomes = {a["node"]: a["outcome"] for a in third["applied"]}
    assert outcomes[lemon] == "drained"
    assert json.loads(state.read_text())[lemon]["reason"].startswith("slurmhealth: lemon: ")


def test_the_breaker_stops_the_sweep_loudly(fleet_db, tmp_path):
    path, fleet, _ = fleet_db
    state, cfg, env = slurm_env(tmp_path, fleet, 0.01)  # cap: 1 node of 64
    proc = run_cli(
        "lemons", "--db", path, "--now", str(fleet.end), "--apply", "--config", str(cfg), env=env
    )
    assert proc.returncode == 3
    assert "CIRCUIT BREAKER OPEN" in proc.stderr
    nodes = json.loads(state.read_text())
    assert sum(1 for v in nodes.values() if v["reason"]) == 1


def test_a_drain_slurm_does_not_take_stops_the_sweep_and_exits_1(fleet_db, tmp_path):
    """An hourly cron sweep that drained nothing must not report success; and a controller
    that fails one update is not asked again for each lemon after it."""
    path, fleet, _ = fleet_db
    state, cfg, env = slurm_env(tmp_path, fleet, 0.10)
    env["FAKE_SLURM_UPDATE_FAILS"] = "1"
    args = ["lemons", "--db", path, "--now", str(fleet.end), "--apply", "--config", str(cfg)]
    proc = run_cli(*args, "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    assert [a["outcome"] for a in json.loads(proc.stdout)["applied"]] == ["failed"]
    assert not any(v["reason"] for v in json.loads(state.read_text()).values())


def test_lemons_on_a_fleet_store_damaged_past_its_header_is_one_line(tmp_path):
    """A damaged fleet store met in the middle of a command: one line, exit 1, no traceback."""
    from slurmhealth.core import store as store_module

    db = str(tmp_path / "fleet.db")
    conn = store_module.connect(db)
    rows = [(f"r{i}", "gpu01", None, "check", float(i), 0.1, "ok", "t", "{}") for i in range(3000)]
    conn.executemany(store_module.insert_sql("runs"), rows)
    conn.close()
    with open(db, "r+b") as handle:
        handle.seek(8192)
        handle.write(b"\xff" * 65536)
    proc = run_cli("lemons", "--db", db, "--now", "4000", "--window", "1d")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- the documented pipeline: node stores + accounting -> collect --sacct -> lemons -----------


def _utc(t: float | None) -> str:
    return "Unknown" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def accounting_text(h: simulate.History) -> tuple:
    """What `sacct -P -n -X ... -o JobIDRaw,State,ExitCode,NodeList,Start,End,User` and
    `sacctmgr -P -n show event ... Format=NodeName,Start,End,State,Reason` would print of the
    simulated fleet (UTC, as collect asks for)."""
    jobs: dict = {}
    for row in h.jobs:
        jobs.setdefault(row[1], []).append(row)
    sacct = []
    for job_id, rows in jobs.items():
        state = rows[0][6]
        ends = [r[3] for r in rows if r[3] is not None]
        code = "1:0" if state == "FAILED" else "0:0"
        nodes = ",".join(r[0] for r in rows)
        end = max(ends) if ends and state != "RUNNING" else None
        sacct.append(f"{job_id}|{state}|{code}|{nodes}|{_utc(rows[0][2])}|{_utc(end)}|{rows[0][8]}")
    events = [
        f"{node}|{_utc(start)}|{_utc(end)}|{state}|{reason}"
        for node, start, end, state, reason in h.node_events
    ]
    return "\n".join(sacct) + "\n", "\n".join(events) + "\n"


def test_the_pipeline_gives_the_in_memory_verdicts(tmp_path):
    """Node stores that know only what the hooks know (no Slurm state, no end for a node that
    crashed), accounting's jobs and node events as sacct and sacctmgr print them: collect
    --sacct and lemons find, node by node, the faults and the lemons the in-memory signals do."""
    fleet = simulate.Fleet(nodes=48, days=28, seed=11, healthcheck_interval=3600, warn_factor=1.0)
    fleet.lemons = simulate.pick_lemons(fleet, 2, 100)
    h = simulate.events(fleet)
    assert any(r[6] == "NODE_FAIL" and r[4] > 1 for r in h.jobs), "a multi-node NODE_FAIL"
    nodes = tmp_path / "spool"
    nodes.mkdir()
    conn = store.connect(str(nodes / "nodes.db"))
    simulate.write_store(h, conn)
    with conn:  # what accounting alone knows
        conn.execute("UPDATE jobs SET slurm_state = NULL")
        conn.execute("UPDATE jobs SET end = NULL WHERE state = 'running'")
        conn.execute("DELETE FROM node_events")
    conn.close()
    sacct, events = accounting_text(h)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # no topology plugin (scontrol prints nothing on stdout), one partition of every node
    partitions = f"gpu|{','.join(fleet.names())}\n"
    tools = {"sacct": sacct, "sacctmgr": events, "scontrol": "", "sinfo": partitions}
    for tool, text in tools.items():
        (tmp_path / f"{tool}.txt").write_text(text)
        script = bin_dir / tool
        script.write_text(f"#!/bin/sh\ncat {tmp_path / f'{tool}.txt'}\n")
        script.chmod(0o755)
    fleet_db = str(tmp_path / "fleet.db")
    end = str(fleet.end)
    proc = run_cli(
        "collect",
        str(nodes),
        "--db",
        fleet_db,
        "--sacct",
        "--slurm-bin",
        str(bin_dir),
        "--since",
        "30d",
        "--now",
        end,
    )
    assert proc.returncode == 0, proc.stderr
    assert "sacctmgr: " in proc.stdout and "node events added" in proc.stdout
    assert "places: 48 node places (partition)" in proc.stdout
    proc = run_cli("lemons", "--db", fleet_db, "--now", end, "--json")
    assert proc.returncode == 0, proc.stderr
    piped = {e["node"]: e for e in json.loads(proc.stdout)["nodes"]}
    in_memory = {e["node"]: e for e in policy.score(simulate.signals(h, fleet.start, fleet.end))}
    assert {n: e["faults"] for n, e in piped.items()} == {
        n: e["faults"] for n, e in in_memory.items()
    }
    assert {n for n, e in piped.items() if e["lemon"]} == set(fleet.lemons)


def test_a_stale_store_is_said_first_drains_nothing_and_exits_4(fleet_db, tmp_path):
    """A store collected last weeks ago is no calm fleet: the sweep says when its newest
    record is, drains nothing and exits 4 for cron; a fresh one names the nodes gone silent."""
    path, fleet, _ = fleet_db
    state, cfg, env = slurm_env(tmp_path, fleet, 0.10)
    late = str(fleet.end + 21 * 86400)
    proc = run_cli("lemons", "--db", path, "--now", late, "--apply", "--config", str(cfg), env=env)
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout.startswith("STALE fleet store: its newest record is from ")
    assert "nothing drained" in proc.stderr
    assert not any(v["reason"] for v in json.loads(state.read_text()).values())
    doc = json.loads(run_cli("lemons", "--db", path, "--now", late, "--json").stdout)
    assert doc["freshness"]["stale"] and len(doc["freshness"]["silent"]) == 64
    # fresh as of its end; every node ran within the hour, so none is named
    fresh = run_cli("lemons", "--db", path, "--now", str(fleet.end))
    assert fresh.returncode == 0 and "newest record " in fresh.stdout.splitlines()[-1]
    # a node whose runs stop a day before the end is named, the rest is not (on a copy)
    path = fleet_db[2]()
    conn = open_fleet(path)
    with store.immediate(conn):
        conn.execute("UPDATE runs SET node = 'gone' WHERE node = ?", (fleet.names()[0],))
        conn.execute("DELETE FROM runs WHERE node = 'gone' AND started > ?", (fleet.end - 86400,))
    conn.close()
    quiet = run_cli("lemons", "--db", path, "--now", str(fleet.end), "--json")
    silent = json.loads(quiet.stdout)["freshness"]["silent"]
    assert [e["node"] for e in silent] == ["gone"] and quiet.returncode == 0
    text = run_cli("lemons", "--db", path, "--now", str(fleet.end)).stdout
    assert "1 node not heard from within 6 h: gone (last " in text


def test_a_node_that_ran_jobs_with_no_run_on_record_is_named(fleet_db):
    """Accounting's jobs on a node whose hooks never recorded anything (not in its slurm.conf,
    or its exports never collected): named with its jobs of the last day, on both backends;
    jobs older than a day, and a node with runs, are not."""
    path, fleet, another = fleet_db
    path = another()
    conn = open_fleet(path)
    with store.immediate(conn):
        jobs = [("ghost", f"g{i}", fleet.end - 3600 * (i + 1)) for i in range(3)]
        jobs += [("old", "o1", fleet.end - 2 * 86400), ("late", "l1", fleet.end + 60)]
        jobs.append((fleet.names()[0], "n1", fleet.end - 60))  # a node with runs
        conn.executemany(
            "INSERT INTO jobs (node, job_id, start, slurm_state) VALUES (?, ?, ?, 'COMPLETED')",
            jobs,
        )
    conn.close()
    doc = json.loads(run_cli("lemons", "--db", path, "--now", str(fleet.end), "--json").stdout)
    assert doc["freshness"]["unguarded"] == [{"node": "ghost", "jobs": 3}]
    proc = run_cli("lemons", "--db", path, "--now", str(fleet.end))
    assert proc.returncode == 0, proc.stderr
    assert (
        "1 node ran jobs within 24 h with no run of slurmhealth's on record (hooks not running "
        "there, or its exports not collected): ghost (3 jobs)"
    ) in proc.stdout.splitlines()


def test_freshness_names_the_nodes_with_jobs_and_no_runs_most_jobs_first():
    """Nodes with jobs and no run, most jobs first; a node whose every partition has no node
    with a run (a CPU partition slurmhealth is not installed on) is left out, one sharing a
    partition with a node that records is not, nor one in no partition known."""
    heard = {"a": 100.0, "b": 90.0}
    jobs = {"a": 5, "x": 1, "y": 4, "z": 4, "cpu1": 9, "cpu2": 3}
    parts = {"a": {"gpu"}, "y": {"gpu", "cpu"}, "cpu1": {"cpu"}, "cpu2": {"cpu", "debug"}}
    fresh = lemons.freshness(heard, 110.0, jobs=(jobs, parts))
    assert fresh["unguarded"] == [
        {"node": "y", "jobs": 4},
        {"node": "z", "jobs": 4},
        {"node": "x", "jobs": 1},
    ]
    assert lemons.freshness(heard, 110.0)["unguarded"] == []


def test_the_json_holds_a_node_a_line_and_reads_back_whole():
    doc = {"lemons": [], "nodes": [{"node": "gpu01", "evidence": {"days": [1, 2]}}, {"node": "b"}]}
    text = lemons.json_lines(dict(doc, freshness={"stale": False}, applied=None))
    assert json.loads(text) == dict(doc, freshness={"stale": False}, applied=None)
    assert '  {"node": "gpu01", "evidence": {"days": [1, 2]}},' in text.splitlines()
