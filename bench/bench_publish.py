"""Benchmark: what `publish` costs the head node per job, on a real Slurm with accounting.

`publish` (run by the 5-minute collect timer after collect) writes each ended job's summary into
its AdminComment: one `sacct` read of the jobs' current comments, then one `sacctmgr modify job`
per job whose summary changed (Slurm has no batched form for different comments). A simulated
10,000-node fleet (bench_scale.py's: ~10 job rows per node-day, 3.7 nodes a job) ends about 200
jobs every 5 minutes, so this cost grows with the fleet's job rate, not its history.

This starts the tests' local cluster (tests/slurm/lab.py: munge, MariaDB, slurmdbd, slurmctld,
4 slurmd with the slurmhealth hooks on replayed snapshots; root and Slurm needed), runs JOBS
short jobs, collects their records, and times `slurmhealth publish` as the timer runs it: wall
time, the CPU of publish and its sacct/sacctmgr children, and what slurmdbd and MariaDB spent
(both usually on the head node too). Then a second publish with nothing changed.

Run: `.venv/bin/python bench/bench_publish.py [--jobs 200]` (about 2 minutes for 200 jobs).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from slurm.lab import BIN, Lab, LabError, copy_store  # noqa: E402

from slurmhealth.fleet.jobs import JobError, decode, parse_comments  # noqa: E402

JOBS_PER_CYCLE_10K = 200  # jobs ended per 5 minutes in the simulated 10,000-node month
TICKS = os.sysconf("SC_CLK_TCK")


def daemon_cpu(lab: Lab, name: str) -> float:
    """CPU seconds (user + system) a lab daemon has used so far; 0 when it is not running."""
    try:
        with open(lab.path("run", f"{name}.pid")) as f:
            pid = int(f.read().split()[0])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime after the name


def decodes(comment: str) -> bool:
    try:
        decode(comment)
    except JobError:
        return False
    return True


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(lab: Lab, argv: list) -> dict:
    """Run a slurmhealth command as root; its wall and CPU (its children's included), and
    slurmdbd's and MariaDB's CPU meanwhile."""
    before = {d: daemon_cpu(lab, d) for d in ("slurmdbd", "mariadbd")}
    c, t = children_cpu(), time.perf_counter()
    proc = subprocess.run(
        [lab.bin, *argv],
        env=lab.client_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = {"wall": time.perf_counter() - t, "cpu": children_cpu() - c, "rc": proc.returncode}
    out.update({d: daemon_cpu(lab, d) - v for d, v in before.items()})
    out["text"] = (proc.stdout + proc.stderr).strip().splitlines()[:1]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_publish: needs root (it starts a local Slurm); skipped")
        return
    try:
        lab = Lab(nodes=4, accounting=True, private_data=True, health_check_interval=0).start()
    except LabError as exc:
        print(f"bench_publish: no local Slurm ({exc}); skipped")
        return
    try:
        t = time.perf_counter()
        jobs = [lab.submit("true") for _ in range(opts.jobs)]
        lab.wait_sacct(jobs, timeout=60 + opts.jobs * 2)
        ran = time.perf_counter() - t
        head = tempfile.mkdtemp(prefix="bench-publish-")
        spool, fleet = os.path.join(head, "spool"), os.path.join(head, "fleet.db")
        os.mkdir(spool, 0o700)
        for node in lab.names:
            copy_store(lab.db_path(node), os.path.join(spool, f"{node}.db"))
        collect = timed(lab, ["collect", spool, "--db", fleet, "--sacct", "--since", "1h"])
        first = timed(lab, ["publish", "--db", fleet, "--since", "1h"])
        again = timed(lab, ["publish", "--db", fleet, "--since", "1h"])
        argv = ["-X", "-n", "-P", "-a", "-j", ",".join(jobs), "-o", "JobIDRaw,AdminComment"]
        text = lab._run([os.path.join(BIN, "sacct"), *argv]).stdout
        landed = sum(1 for c in parse_comments(text).values() if decodes(c))
    finally:
        lab.stop()
    n = opts.jobs
    print(f"bench_publish: {n} jobs on a local 4-node Slurm with accounting (ran in {ran:.0f} s)")
    print(f"  summaries in accounting afterwards that decode (sacct): {landed} of {n}")
    print(f"  collect --sacct: {collect['wall']:.2f} s wall, {collect['cpu']:.2f} s CPU")
    for name, r in (("publish", first), ("publish again (nothing changed)", again)):
        print(
            f"  {name}: {r['text'][0] if r['text'] else ''} (exit {r['rc']}); {r['wall']:.2f} s "
            f"wall, {r['cpu']:.2f} s CPU with sacct/sacctmgr, slurmdbd {r['slurmdbd']:.2f} s, "
            f"MariaDB {r['mariadbd']:.2f} s"
        )
    per_job = (first["cpu"] + first["slurmdbd"] + first["mariadbd"]) / n
    wall_ms, cpu_ms = first["wall"] / n * 1000, first["cpu"] / n * 1000
    print(
        f"  per job published: {wall_ms:.1f} ms wall, {cpu_ms:.1f} ms CPU (+ slurmdbd and "
        f"MariaDB: {per_job * 1000:.1f} ms); at 10,000 nodes "
        f"(~{JOBS_PER_CYCLE_10K} jobs a cycle): {per_job * JOBS_PER_CYCLE_10K:.1f} s CPU a cycle"
    )


if __name__ == "__main__":
    main()
