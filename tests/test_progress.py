"""Long admin commands show a progress bar on a terminal and stay quiet otherwise (real pty)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import run_on_pty

from sim import simulate
from slurmhealth.core import store
from slurmhealth.fleet import records

pytestmark = pytest.mark.slow  # a real pty and a store large enough for a bar


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    """A simulated fleet's records as one NDJSON export (about 20,000 records)."""
    tmp = tmp_path_factory.mktemp("progress")
    conn = store.connect(str(tmp / "source.db"))
    simulate.write_store(simulate.Fleet(nodes=32, days=14, seed=5, incident_day=None), conn)
    path = tmp / "fleet.ndjson"
    with open(path, "w", encoding="utf-8") as out:
        records.export(conn, out)
    conn.close()
    return path


def test_import_shows_a_bar_on_a_terminal(tmp_path, spool):
    env = {"SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db")}
    code, out, shown = run_on_pty(["import", str(spool)], env)
    assert code == 0, shown
    assert "records" in out and "added" in out
    assert f"import {spool}" in shown and "100%" in shown, shown


def test_import_is_quiet_when_stderr_is_not_a_terminal(tmp_path, spool):
    env = dict(os.environ, SLURMHEALTH_FLEET_DB=str(tmp_path / "fleet.db"))
    proc = subprocess.run(
        [sys.executable, "-m", "slurmhealth", "import", str(spool)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "added" in proc.stdout
