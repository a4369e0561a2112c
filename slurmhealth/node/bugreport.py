"""NVIDIA's nvidia-bug-report.sh, run for an RMA bundle on the node itself (`slurmhealth rma`).

The NVIDIA driver installs the script (`/usr/bin/nvidia-bug-report.sh`), and a GPU vendor's
ticket asks for what it writes. Its usage (the script's own `--help`): `--output-file FILE`
writes `FILE.gz` where gzip is installed (".gz" appended; the log is a series of gzip members)
and `FILE`, plain text, where it is not; it must run as root (else it prints `ERROR: Please run
nvidia-bug-report.sh as root.` and exits 1); on a sick GPU it may hang while the driver
answers nothing, and what it wrote until then "may still contain enough data to diagnose your
problem" (its start message).

So it is run: found on PATH and only when its file is one root may trust (files.trusted: not
a symlink someone else made, not writable by others); from an argv list, never a shell, with
no input, in a session of its own (sources/tools.py); in a private temporary directory (0700)
with its output named relative to it, so its "command line flags" line names no path of this
machine; stopped with its whole process group at the timeout, what it wrote by then kept and
called partial. Never on the hook path: only `rma` imports this module.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import stat
import tempfile

from slurmhealth.core import files
from slurmhealth.core.result import clean
from slurmhealth.node.sources import tools

TYPE_CHECKING = False  # mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import BinaryIO

TOOL = "nvidia-bug-report.sh"
NAME = "nvidia-bug-report.log"  # what it is told to write; it adds ".gz" where gzip is
# It "may take several seconds to run" (its start message), longer with many GPUs; a driver
# call that hangs on a sick GPU never returns.
TIMEOUT_S = 300.0


class Report:
    """What one run of the tool left (or why it was not run): `path`, its output as gzip in
    the private directory (None: none), `note`, one line on what went wrong or why it was not
    run (empty when all went well), `partial` (stopped at the timeout, its output kept) and
    `failed` (it was run and did not end well: stopped, could not start, exited non-zero,
    wrote nothing; or it was refused: a bundle without it is incomplete)."""

    __slots__ = ("failed", "note", "partial", "path")

    def __init__(
        self, path: str | None, note: str = "", partial: bool = False, failed: bool | None = None
    ) -> None:
        self.path, self.note, self.partial = path, note, partial
        self.failed = bool(note) if failed is None else failed


def find() -> str | None:
    """The tool's path on PATH, or None."""
    return shutil.which(TOOL)


def refused(tool: str) -> str | None:
    """Why root must not run the file at `tool` (files.trusted), or None."""
    return files.trusted(tool)


@contextlib.contextmanager
def collected(tool: str, timeout: float = TIMEOUT_S) -> Iterator[Report]:
    """Run `tool` for at most `timeout` seconds in a private temporary directory; the Report
    of what it left, whose file lives until the block ends (the directory is removed then)."""
    with tempfile.TemporaryDirectory(prefix="slurmhealth-rma-") as folder:
        ran = tools.run([tool, "--output-file", NAME], timeout, cwd=folder)
        yield _report(folder, ran, timeout)


def _report(folder: str, ran: tools.Ran, timeout: float) -> Report:
    if ran.error is not None:
        return Report(None, f"could not run: {clean(ran.error, 200)}")
    path = _output(folder)
    if ran.timed_out:
        kept = "what it wrote by then is kept" if path else "it wrote nothing"
        return Report(path, f"stopped after {timeout:g} s: {kept}", partial=path is not None)
    if ran.status != 0:
        said = _last_line(ran)
        return Report(path, f"exited {ran.status}" + (f": {said}" if said else ""))
    if path is None:
        return Report(None, "it ended without writing its log")
    return Report(path)


def _output(folder: str) -> str | None:
    """The tool's log as gzip: FILE.gz as it wrote it, or FILE (no gzip on the node)
    compressed here; None when it wrote neither. Only a regular file is read."""
    for name, packed in ((NAME + ".gz", True), (NAME, False)):
        path = os.path.join(folder, name)
        try:
            plain = open_log(path)
        except OSError:
            continue
        with plain:
            if packed:
                return path
            out = os.path.join(folder, "plain.log.gz")
            # mtime 0 and no name: the same log gives the same bytes
            with open(out, "xb") as handle, gzip.GzipFile("", "wb", 9, handle, 0) as squeezed:
                shutil.copyfileobj(plain, squeezed)
            return out
    return None


def open_log(path: str) -> BinaryIO:
    """The file at `path` in the tool's private directory, for reading: never through a
    symlink, a regular file only (its mode is the tool's umask's: only we could write there)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise files.Unsafe(path, "not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _last_line(ran: tools.Ran) -> str:
    """The last line the tool printed, cleaned (it may say anything): on standard error where
    it wrote any (the shell's own error), else on standard output (the script's `ERROR: ...`)."""
    for text in (ran.stderr, ran.stdout):
        said = [line for line in text.splitlines() if line.strip()]
        if said:
            return clean(said[-1], 200, words=True)
    return ""
