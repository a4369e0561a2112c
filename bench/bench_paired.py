"""Benchmark: the prolog of two installs of slurmhealth, alternated, as slurmd runs it.

A change to the hook path costs a millisecond or less, below the spread of two separate runs of
bench_hook.py on a shared machine. Pairs find it: each round runs one prolog of each install
(order alternating), on the same replayed 8-GPU / 8-IB-port node, each with its own store and
config; the figure is the median of the per-round differences.

Run (two non-editable installs, e.g. of the previous release and of this tree):
    python3.11 -m venv /tmp/vold && /tmp/vold/bin/pip install <old tree>
    python3.11 -m venv /tmp/vnew && /tmp/vnew/bin/pip install .
    .venv/bin/python bench/bench_paired.py --old /tmp/vold --new /tmp/vnew [--runs 80]
A new install with host areas the old lacks: --new-host-root /. makes its prologs read them live
from this host, as a GPU node's prolog does (beside a snapshot they would replay it); where both
have them, --old-host-root /. too. --metrics: both write node_exporter metrics, to a file a
health check wrote first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from bench_hook import SNAPSHOT, node_env, write_config
from common import timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="a venv with the old install")
    parser.add_argument("--new", required=True, help="a venv with the new install")
    parser.add_argument("--runs", type=int, default=80)
    parser.add_argument("--snapshot", default=SNAPSHOT)
    parser.add_argument(
        "--new-host-root",
        default="",
        help='the new install reads its host areas live under this root ("/." for this host)',
    )
    parser.add_argument(
        "--old-host-root",
        default="",
        help="the old install too, where it has host areas (two installs that both have them)",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="both write node_exporter metrics (settings.metrics_file), a health check's first",
    )
    opts = parser.parse_args()
    hooks = {
        k: [os.path.join(v, "bin", "slurmhealth"), "prolog"]
        for k, v in vars(opts).items()
        if k in ("old", "new")
    }
    for hook in hooks.values():
        if not os.access(hook[0], os.X_OK):
            sys.exit(f"{hook[0]}: not an installed slurmhealth")
    walls: dict = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as old, tempfile.TemporaryDirectory() as new:
        dirs = {"old": old, "new": new}
        for key, tmp in dirs.items():
            root = opts.new_host_root if key == "new" else opts.old_host_root
            prom = os.path.join(tmp, "slurmhealth.prom") if opts.metrics else ""
            write_config(tmp, opts.snapshot, metrics_file=prom, host_root=root)
            if opts.metrics:  # the file a node's prologs find: its health checks' series too
                timed([hooks[key][0], "healthcheck"], node_env(tmp, "0"))
            timed(hooks[key], node_env(tmp, "0"))  # the store created, the config cached
        for n in range(opts.runs):
            for key in ("old", "new") if n % 2 else ("new", "old"):
                walls[key].append(timed(hooks[key], node_env(dirs[key], str(n + 1))))
    diffs = [b - a for a, b in zip(walls["old"], walls["new"])]
    print(
        f"paired prologs ({opts.runs} rounds): old p50 {statistics.median(walls['old']):.1f} ms, "
        f"new p50 {statistics.median(walls['new']):.1f} ms; new - old, median of the rounds: "
        f"{statistics.median(diffs):+.2f} ms"
    )


if __name__ == "__main__":
    main()
