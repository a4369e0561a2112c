"""A diagnosis shows in the node's metrics file (docs/metrics.md): its verdict and time as the
`diag` phase, each probe as a check, carried forward past the hooks' runs."""

from __future__ import annotations

import os

from conftest import TESTS, run_cli

from slurmhealth.node import metrics

FIXTURES = os.path.join(TESTS, "fixtures")
SOURCES = (
    "--gpu-source",
    os.path.join(FIXTURES, "snapshots", "h100-hgx-healthy.json"),
    "--sysfs-root",
    os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
    "--kmsg",
    os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
)


def samples(path: str) -> dict:
    with open(path) as handle:
        return metrics.parse_previous(handle.read(), "n1")[0]


def test_a_diagnosis_is_a_phase_of_the_metrics_and_stays_after_a_check(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    dcgmi = tools / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\ncat {FIXTURES}/diag/dcgmi-3.3-r2-fail.json\n")
    dcgmi.chmod(0o755)
    config = tmp_path / "c.toml"
    config.write_text(f'[settings]\ndiag_tools = "{tools}"\n')
    config.chmod(0o600)
    prom = str(tmp_path / "m.prom")
    env = {"SLURMHEALTH_METRICS_FILE": prom}
    db = str(tmp_path / "n1.db")
    args = ("--node", "n1", "--db", db, "--config", str(config), *SOURCES)
    proc = run_cli("diagnose", "--level", "quick", *args, env=env)
    assert proc.returncode == 1, proc.stderr
    got = samples(prom)
    diag = (("node", "n1"), ("phase", "diag"))
    assert got[("slurmhealth_run_verdict", (*diag, ("verdict", "fail")))] == 1
    with open(prom) as handle:  # the latest run's checks: the probes
        assert 'slurmhealth_check_status{node="n1",check="diag.dcgm",status="fail"} 1' in (
            handle.read()
        )
    proc = run_cli("check", "--node", "n1", "--db", db, *SOURCES, "--metrics-file", prom, env=env)
    assert proc.returncode == 0, proc.stderr
    after = samples(prom)
    assert after[("slurmhealth_run_verdict", (*diag, ("verdict", "fail")))] == 1
    runs = ("slurmhealth_runs_total", (*diag, ("verdict", "fail")))
    assert after[runs] == 1
