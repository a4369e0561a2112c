"""Programs a health-check source runs (nvme-cli, ipmitool, the site's own health check).

Only the sources that run a program import this module, and only the health check runs those
sources (their areas' PHASES): a prolog never pays for subprocess. Every program is found by
absolute path at run time (slurmd gives its scripts no PATH), run from an argv list (never a
shell), with no input, in a session of its own, and stopped with its whole process group when
it outlives its time: NHC forks checks and a watchdog of its own, and a child left running
would outlive the hook that slurmd is waiting for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

OUTPUT_MAX = 1 << 20  # bytes of a program's output kept at most (a SEL of thousands of lines)
MARGIN_S = 0.5  # a program is stopped this much before its source's deadline (at most 10%)


class Ran:
    """What became of one program: exit status (None: it did not end), its output, how long
    it took, and why it could not run (`error`) or that it was stopped (`timed_out`)."""

    __slots__ = ("error", "seconds", "status", "stderr", "stdout", "timed_out")

    def __init__(self) -> None:
        self.status: int | None = None
        self.stdout = ""
        self.stderr = ""
        self.seconds = 0.0
        self.timed_out = False
        self.error: str | None = None


def find(paths: tuple[str, ...]) -> str | None:
    """The first of `paths` that is an executable file, else None."""
    for path in paths:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def budget(seconds: float) -> float:
    """The time a program gets within a source deadline of `seconds`: a little less, so the
    program is stopped (and said to be) before the run gives up on the source's thread."""
    return max(0.1, seconds - min(MARGIN_S, seconds * 0.1))


def run(
    argv: list[str], seconds: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> Ran:
    """Run `argv` for at most `seconds` (in the directory `cwd`, else ours); never raises for
    the program's sake."""
    out = Ran()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(  # noqa: S603 - an absolute path and an argv list, no shell
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        out.error = exc.strerror or str(exc)
        return out
    try:
        stdout, stderr = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        out.timed_out = True
        stdout, stderr = _stop(proc)
    except BaseException:  # interrupted (Ctrl-C at `rma`): its own session never hears it
        _stop(proc)
        raise
    out.status = None if out.timed_out else proc.returncode
    out.stdout = stdout[-OUTPUT_MAX:].decode("utf-8", "replace")
    out.stderr = stderr[-OUTPUT_MAX:].decode("utf-8", "replace")
    out.seconds = time.monotonic() - started
    return out


def _stop(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """Kill the program's whole process group (its session: start_new_session) and take what
    it wrote. A grandchild that left the group may hold the pipes open: after a second its
    output is given up, never waited for."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # ended meanwhile
        proc.kill()
    try:
        return proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return b"", b""
