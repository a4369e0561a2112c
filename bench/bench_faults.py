"""Benchmark: the whole hook's wall time under each fault it must survive (docs/reliability.md).

Each scenario runs the real hook process (`python -m slurmhealth prolog|healthcheck`) with the
environment slurmd gives it, a replayed snapshot, the scontrol/sinfo stand-ins of tests/fakeslurm
and, where named, the NVML stand-in of tests/fakenvml; the fault is injected into the real
processes and files. Prints per scenario: runs, exit codes, p50 and worst wall time, and what
the side state and the store kept. The deadline is the default (10 s) unless the scenario says.

Run: `make bench` or `.venv-bench/bin/python bench/bench_faults.py [--runs 5]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
FAKE_SLURM = os.path.join(TESTS, "fakeslurm")
FAKE_NVML = os.path.join(TESTS, "fakenvml")
SNAPSHOTS = os.path.join(TESTS, "fixtures", "snapshots")
HEALTHY_KMSG = os.path.join(TESTS, "fixtures", "kmsg", "healthy.kmsg")
NODE = "gpu01"


def faults_module():
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("faults", os.path.join(SNAPSHOTS, "faults.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Node:
    """One node's config, state dir and Slurm stand-in state in a fresh directory."""

    def __init__(self, snapshots: str, snapshot: str = "gpu-lost", **settings) -> None:
        self.dir = tempfile.mkdtemp(prefix="slurmhealth-fault-")
        self.state = os.path.join(self.dir, "state")
        self.slurm = os.path.join(self.dir, "slurm.json")
        nodes = {f"gpu{i:02d}": {"state": "IDLE", "reason": "", "since": 0} for i in range(1, 21)}
        with open(self.slurm, "w") as handle:
            json.dump(nodes, handle)
        values = {
            "gpu_source": os.path.join(snapshots, f"h100-hgx-{snapshot}.json"),
            "slurm_bin": FAKE_SLURM,
            **settings,
        }
        with open(os.path.join(self.dir, "slurmhealth.toml"), "w") as handle:
            handle.write("[settings]\n")
            handle.writelines(f"{k} = {json.dumps(v)}\n" for k, v in values.items())

    def env(self, job: str, **extra: str) -> dict:
        return {
            "SLURMD_NODENAME": NODE,
            "SLURMHEALTH_CONFIG": os.path.join(self.dir, "slurmhealth.toml"),
            "SLURMHEALTH_STATE_DIR": self.state,
            "FAKE_SLURM_STATE": self.slurm,
            "PYTHONPATH": REPO,
            "SLURM_JOB_ID": job,
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
            **extra,
        }

    def run(self, mode: str, job: str, **extra: str) -> tuple:
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "slurmhealth", mode],
            env=self.env(job, **extra),
            cwd=os.sep,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return proc.returncode, (time.perf_counter() - started) * 1000, proc.stderr

    def kept(self) -> str:
        """What the side state and the store hold after the runs."""
        side_path = os.path.join(self.state, f"{NODE}.state.json")
        pending = "no side state"
        if os.path.exists(side_path):
            with open(side_path) as handle:
                pending = "pending" if "pending" in json.load(handle) else "nothing pending"
        db = os.path.join(self.state, f"{NODE}.db")
        spooled = os.path.join(self.state, f"{NODE}.db.unrecorded.ndjson")
        if os.path.exists(spooled):
            with open(spooled) as handle:
                pending += f", {sum(1 for _ in handle)} runs spooled"
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1)
            runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
            acts = conn.execute("SELECT group_concat(action) FROM actions").fetchone()[0]
            stored = f"{runs} runs, actions: {acts or '-'}"
        except sqlite3.Error as exc:
            stored = f"store: {exc}"
        with open(self.slurm) as handle:
            reason = json.load(handle)[NODE]["reason"] or "in service"
        return f"{pending}; {stored}; node: {reason[:50]}"


def lock_store(node: Node) -> subprocess.Popen:
    """A second process holding the store's write lock (an admin's sqlite3 shell)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(600)\n",
            os.path.join(node.state, f"{NODE}.db"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    holder.stdout.readline()  # type: ignore[union-attr]
    return holder


def hang_store_writes(node: Node) -> str:
    """A PYTHONPATH entry whose sitecustomize makes every run record hang (a stuck disk)."""
    path = os.path.join(node.dir, "hang")
    os.mkdir(path)
    with open(os.path.join(path, "sitecustomize.py"), "w") as handle:
        handle.write(
            "import time\nimport slurmhealth.core.store as s\n"
            "def slow(*a, **k):\n    time.sleep(600)\n"
            "s.record_run = slow\n"
        )
    return f"{path}{os.pathsep}{REPO}"


def scenarios(snapshots: str) -> list:
    """(name, node factory, mode, extra env, setup) per fault."""
    nvml = {"PYTHONPATH": f"{FAKE_NVML}{os.pathsep}{REPO}", "SLURMHEALTH_NVML_BINDING": "pynvml"}
    healthy = os.path.join(snapshots, "h100-hgx-healthy.json")
    return [
        ("healthy prolog (baseline)", dict(snapshot="healthy"), "prolog", {}, None),
        ("failing prolog, controller answers", {}, "prolog", {}, None),
        ("controller hung (every Slurm call)", {}, "prolog", {"FAKE_SLURM_HANG": "1"}, None),
        ("controller slow, 0.7 s per call", {}, "healthcheck", {"FAKE_SLURM_DELAY": "0.7"}, None),
        ("scontrol update fails", {}, "healthcheck", {"FAKE_SLURM_UPDATE_FAILS": "1"}, None),
        (
            "sinfo fails: fleet not countable",
            {},
            "healthcheck",
            {"FAKE_SLURM_SINFO_FAILS": "1"},
            None,
        ),
        ("store locked by another process", {}, "prolog", {}, "lock"),
        ("store write hangs (deadline 3 s)", dict(deadline=3.0), "prolog", {}, "hang"),
        (
            "NVML init hangs (timeout_gpu 5 s)",
            dict(snapshot="healthy", gpu_source="nvml", sysfs_root="/nonexistent"),
            "prolog",
            dict(nvml, FAKE_NVML_FAULT="hang_init", FAKE_NVML_SNAPSHOT=healthy),
            None,
        ),
        ("corrupt store (moved aside)", {}, "prolog", {}, "corrupt"),
        ("config unreadable TOML (none cached: monitor-only)", {}, "prolog", {}, "badconfig"),
        ("config out-of-range deadline = 0", dict(deadline=0), "prolog", {}, None),
        ("config world-writable (refused)", {}, "prolog", {}, "writable"),
        ("node pattern gpu[0-99999][0-99999]", {}, "prolog", {}, "pattern"),
        ("monitor-only, failing node", dict(monitor_only=True), "prolog", {}, None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    snapshots = tempfile.mkdtemp(prefix="slurmhealth-snapshots-")
    faults_module().write_all(snapshots)
    print(f"interpreter: {sys.executable}; {args.runs} runs per scenario; deadline 10 s")
    print(f"{'scenario':<40} {'exit':<6} {'p50 ms':>8} {'worst ms':>9}  kept")
    for name, settings, mode, env, setup in scenarios(snapshots):
        extra = dict(env)
        node = Node(snapshots, **settings)
        sys.path.insert(0, REPO)
        from slurmhealth.core import store  # noqa: PLC0415

        store.connect(os.path.join(node.state, f"{NODE}.db")).close()  # the node's store exists
        holder = lock_store(node) if setup == "lock" else None
        if setup == "hang":
            extra = dict(extra, PYTHONPATH=hang_store_writes(node))
        if setup == "corrupt":
            with open(os.path.join(node.state, f"{NODE}.db"), "r+b") as handle:
                handle.write(b"not a database" * 100)
        config_path = os.path.join(node.dir, "slurmhealth.toml")
        if setup == "badconfig":
            with open(config_path, "a") as handle:
                handle.write("[[[broken\n")
        if setup == "writable":
            os.chmod(config_path, 0o666)  # noqa: S103 - the fault this scenario injects
        if setup == "pattern":
            with open(config_path, "a") as handle:
                handle.write('[[node]]\nmatch = "gpu[0-99999][0-99999]"\ngpu.count = 8\n')
        runs = 1 if setup == "hang" else args.runs
        results = [node.run(mode, str(n + 1), **extra) for n in range(runs)]
        if holder is not None:
            holder.kill()
            holder.wait()
        walls = [r[1] for r in results]
        codes = ",".join(sorted({str(r[0]) for r in results}))
        print(
            f"{name:<40} {codes:<6} {statistics.median(walls):8.0f} {max(walls):9.0f}  "
            f"{node.kept()}"
        )


if __name__ == "__main__":
    main()
