"""`slurmhealth lemons` over a simulated fleet store: scores, evidence, --apply through the
breaker. Slurm is tests/fakeslurm here; tests/slurm/test_lemons.py runs it on a real Slurm."""

from __future__ import annotations

import json
import os

import pytest
from conftest import TESTS, run_cli

from slurmhealth.core import store
from slurmhealth.fleet import simulate

FAKE_SLURM = os.path.join(TESTS, "fakeslurm")


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory):
    fleet = simulate.Fleet(nodes=64, days=28, seed=3, incident_day=None)
    fleet.lemons = simulate.pick_lemons(fleet, 2, 100)
    path = str(tmp_path_factory.mktemp("fleet") / "fleet.db")
    simulate.write_store(fleet, store.connect(path))
    return path, fleet


def test_lemons_are_named_with_their_evidence(fleet_db):
    path, fleet = fleet_db
    proc = run_cli("lemons", "--db", path, "--now", str(fleet.end), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(e["node"] for e in doc["lemons"]) == sorted(fleet.lemons)
    assert len(doc["nodes"]) == 64 and doc["applied"] == []
    for entry in doc["lemons"]:
        assert entry["reason"] and entry["evidence"]
    text = run_cli("lemons", "--db", path, "--now", str(fleet.end)).stdout
    assert text.startswith("2 lemon(s) among 64 nodes over 28 days")


def slurm_env(tmp_path, fleet, share):
    state = tmp_path / "slurm.json"
    state.write_text(json.dumps({n: {"state": "IDLE", "reason": ""} for n in fleet.names()}))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[settings]\nslurm_bin = "{FAKE_SLURM}"\nbreaker_share = {share}\n')
    return state, cfg, {"FAKE_SLURM_STATE": str(state)}


def test_apply_drains_the_lemons_with_reasons(fleet_db, tmp_path):
    path, fleet = fleet_db
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
        store.connect(path)
        .execute(
            "SELECT count(*) FROM actions WHERE actor = 'slurmhealth lemons' AND action = 'drain'"
        )
        .fetchone()
    )
    assert rows == (2,)


def test_the_breaker_stops_the_sweep_loudly(fleet_db, tmp_path):
    path, fleet = fleet_db
    state, cfg, env = slurm_env(tmp_path, fleet, 0.01)  # cap: 1 node of 64
    proc = run_cli(
        "lemons", "--db", path, "--now", str(fleet.end), "--apply", "--config", str(cfg), env=env
    )
    assert proc.returncode == 3
    assert "CIRCUIT BREAKER OPEN" in proc.stderr
    nodes = json.loads(state.read_text())
    assert sum(1 for v in nodes.values() if v["reason"]) == 1


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
