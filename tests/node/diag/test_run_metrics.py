"""A diagnosis shows in the node's metrics file (docs/metrics.md): its verdict and time as the
`diag` phase, each probe as a check, carried forward past the hooks' runs."""

from __future__ import annotations

from conftest import HEALTHY_SOURCES, diag_config, printing, run_cli, stand_in

from slurmhealth.node import metrics

SOURCES = HEALTHY_SOURCES


def samples(path: str) -> dict:
    with open(path) as handle:
        return metrics.parse_previous(handle.read(), "n1")[0]


def test_a_diagnosis_is_a_phase_of_the_metrics_and_stays_after_a_check(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    stand_in(tools, "dcgmi", printing("dcgmi-3.3-r2-fail.json"))
    config = diag_config(tmp_path, tools)
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
