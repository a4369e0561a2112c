"""Shared test helpers: fixture paths and a runner for the real `slurmhealth` command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(TESTS, "fixtures")
SNAPSHOTS = os.path.join(FIXTURES, "snapshots")
FAKE_NVML = os.path.join(TESTS, "fakenvml")


def snapshot_path(name: str) -> str:
    return os.path.join(SNAPSHOTS, f"h100-hgx-{name}.json")


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """Run `python -m slurmhealth ARGS` in a fresh process, as an admin would."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "slurmhealth", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "node.db")
