"""Running one diagnostic tool: its own process group, bounded in time, no shell, no stdin.

The probes of one node (node/diag/probes.py) and those across nodes (node/diag/pairs.py) run
their tools through here; what a tool prints is untrusted text, parsed by node/diag/parsers.py.
"""

from __future__ import annotations

import os
import signal
import subprocess

OUTPUT_MAX = 4 << 20  # bytes of a tool's output parsed at most


def run(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit code, stdout and stderr) of a tool, or (None, why) when it did not finish. Its own
    process group, killed whole at the timeout; no shell, no stdin."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return None, f"cannot run {os.path.basename(argv[0])} ({exc.strerror or exc})"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return None, f"{os.path.basename(argv[0])} did not finish within {timeout:g} s"
    return proc.returncode, out[:OUTPUT_MAX].decode("utf-8", "replace")


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the tool's whole process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.communicate()
