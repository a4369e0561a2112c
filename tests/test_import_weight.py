"""The hot path stays import-light: what `check` and the prolog import, measured for real."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import FIXTURES, snapshot_path

HEAVY = {
    "click",
    "jinja2",
    "sqlite_utils",
    "prometheus_client",
    "pynvml",
    "dataclasses",
    "argparse",
    "typing",
    "subprocess",
}


def _modules(argv: list, env: dict | None = None) -> set:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    lines = proc.stderr.splitlines()
    return {
        line.split("|")[-1].strip()
        for line in lines
        if line.startswith("import time:") and "cumulative" not in line
    }


def imported(args: list, env: dict | None = None) -> set:
    """What `python -m slurmhealth ARGS` imports beyond the interpreter's own start-up and the
    `-m` machinery (on Python 3.9, importlib.abc pulls in typing before any of our code)."""
    start = _modules(["-c", "import runpy, importlib.util, importlib.abc"])
    return _modules(["-m", "slurmhealth", *args], env) - start


def test_check_on_a_snapshot_imports_nothing_heavy():
    modules = imported(["check", "--no-db", "--gpu-source", snapshot_path("healthy")])
    assert "slurmhealth.node.runner" in modules  # the measurement works
    assert not modules & HEAVY, modules & HEAVY


def test_a_passing_prolog_imports_nothing_heavy(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[settings]\ngpu_source = "{snapshot_path("healthy")}"\n'
        f'sysfs_root = "{os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr")}"\n'
        f'kmsg = "{os.path.join(FIXTURES, "kmsg", "healthy.kmsg")}"\n'
    )
    env = {
        "SLURMD_NODENAME": "gpu01",
        "SLURMHEALTH_CONFIG": str(cfg),
        "SLURMHEALTH_STATE_DIR": str(tmp_path),
        "SLURM_JOB_ID": "1",
    }
    imported(["prolog"], env)  # the first run parses the config and caches it
    modules = imported(["prolog"], dict(env, SLURM_JOB_ID="2"))
    assert "slurmhealth.core.store" in modules
    assert not modules & (HEAVY | {"tomllib", "tomli", "slurmhealth.node.actions"}), modules & HEAVY
    # the areas a job hook never runs (the health check's alone) are not even imported
    later = {f"slurmhealth.node.checks.{area}" for area in ("nvme", "bmc", "imex", "site")}
    assert "slurmhealth.node.checks.gpu" in modules
    assert not modules & later, modules & later
