"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import os
import subprocess
import time


def timed(argv: list, env: dict) -> float:
    """Wall time of one process, in ms, started from / with only `env`."""
    started = time.perf_counter()
    subprocess.run(
        argv, env=env, cwd=os.sep, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )
    return (time.perf_counter() - started) * 1000


def pct(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
