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
import threading
import time

OUTPUT_MAX = 1 << 20  # bytes of a program's output kept at most (a SEL of thousands of lines)

TYPE_CHECKING = False  # typing stays unimported where a health check runs this; mypy reads it
if TYPE_CHECKING:
    from typing import IO
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
    the program's sake. Of its output only the last OUTPUT_MAX bytes of each stream are ever
    held: a program that floods its output for all its time (gigabytes at a pipe's speed)
    costs no more memory than that."""
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
    kept = (bytearray(), bytearray())
    readers = [
        threading.Thread(target=_keep_tail, args=(pipe, tail), daemon=True)
        for pipe, tail in zip((proc.stdout, proc.stderr), kept)
    ]
    try:
        # the readers' start inside: Thread.start waits for the thread to run, and on a loaded
        # machine a Ctrl-C came there, before the wait, and left the program running
        for reader in readers:
            reader.start()
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        out.timed_out = True
        _stop(proc)
    except BaseException:  # interrupted (Ctrl-C at `rma`): its own session never hears it
        _stop(proc)
        raise
    # the pipes end when the program does, unless a grandchild that left its group holds
    # them: its output is given up after a second, never waited for
    end = time.monotonic() + 1.0
    for reader in readers:
        reader.join(max(0.0, end - time.monotonic()))
    out.status = None if out.timed_out else proc.returncode
    out.stdout = bytes(kept[0][-OUTPUT_MAX:]).decode("utf-8", "replace")
    out.stderr = bytes(kept[1][-OUTPUT_MAX:]).decode("utf-8", "replace")
    out.seconds = time.monotonic() - started
    return out


def _keep_tail(pipe: IO[bytes] | None, tail: bytearray) -> None:
    """Read `pipe` to its end into `tail`, keeping at most its last 2 x OUTPUT_MAX bytes."""
    if pipe is None:
        return
    try:
        while True:
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                return
            tail += chunk
            if len(tail) > 2 * OUTPUT_MAX:
                del tail[: len(tail) - OUTPUT_MAX]
    except (OSError, ValueError):  # closed under it
        return


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the program's whole process group (its session: start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # ended meanwhile
        proc.kill()
    proc.wait()
