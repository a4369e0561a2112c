"""Benchmark: `slurmhealth check` on a replayed 8-GPU / 8-IB-port snapshot vs `python -c pass`.

Run with the venv's real interpreter (never a pyenv shim): `make bench`, or
`.venv/bin/python bench/bench_check.py [--runs 50]`. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from common import pct, timed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(REPO, "tests", "fixtures", "snapshots", "h100-hgx-healthy.json")
HEAVY = ("click", "jinja2", "sqlite_utils", "prometheus_client", "pynvml")


def importtime(python: str, args: list, env: dict) -> tuple:
    proc = subprocess.run(
        [python, "-X", "importtime", "-m", "slurmhealth", *args],
        env=env,
        cwd=os.sep,
        capture_output=True,
        text=True,
        check=False,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative, name = line[len("import time:") :].split("|")
        rows.append((name.rstrip()[1:], int(self_us), int(cumulative)))
    names = {name.strip() for name, _, _ in rows}
    top = sorted((r for r in rows if not r[0].startswith(" ")), key=lambda r: -r[2])[:8]
    return names, top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--snapshot", default=SNAPSHOT)
    opts = parser.parse_args()
    python = sys.executable
    script = os.path.join(os.path.dirname(python), "slurmhealth")
    entry = [script] if os.path.exists(script) else [python, "-m", "slurmhealth"]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "gpu01.db")
        check = [*entry, "check", "--node", "gpu01", "--gpu-source", opts.snapshot]
        cfg = os.path.join(tmp, "slurmhealth.toml")
        subprocess.run(
            [
                *entry,
                "config",
                "genconf",
                "--node",
                "gpu01",
                "--gpu-source",
                opts.snapshot,
                "-o",
                cfg,
            ],
            env=env,
            check=True,
        )
        timed([*check, "--db", db], env)  # create the store once, as a node's first prolog
        commands = {
            "python -c pass": [python, "-c", "pass"],
            "check --no-db": [*check, "--no-db"],
            "check --db": [*check, "--db", db],
            "check --db --config": [*check, "--db", db, "--config", cfg],
        }
        series: dict = {name: [] for name in commands}
        for _ in range(opts.runs):  # interleaved, so machine noise hits all alike
            for name, argv in commands.items():
                series[name].append(timed(argv, env))
        names, top = importtime(python, ["check", "--no-db", "--gpu-source", opts.snapshot], env)
    base = statistics.median(series["python -c pass"])
    print(f"interpreter: {python} (Python {sys.version.split()[0]}), runs: {opts.runs}")
    print(f"{'command':<20} {'p50 ms':>8} {'p99 ms':>8} {'x pass':>7}")
    for name, values in series.items():
        p50 = statistics.median(values)
        print(f"{name:<20} {p50:8.1f} {pct(values, 0.99):8.1f} {p50 / base:7.2f}")
    print("heavy modules imported by check:", [m for m in HEAVY if m in names] or "none")
    print("largest imports (cumulative us):", ", ".join(f"{n.strip()} {c}" for n, _, c in top))


if __name__ == "__main__":
    main()
