"""The NVIDIA Fabric Manager's own log, where the node runs the Fabric Manager: health check only.

Which nodes: an HGX/DGX board whose GPUs meet through NVSwitches on the board (A100, H100, H200,
B200) runs `nv-fabricmanager` on the node itself, and it logs to a file. A GB200/GB300 NVL72
compute tray does not: its Fabric Manager runs on the NVSwitch trays' controller, whose log is
not on the node (the GPU side is read through NVML's fabric state, checks/gpu.py, and IMEX).

Where: `LOG_FILE_NAME` in the Fabric Manager's config (`/usr/share/nvidia/nvswitch/
fabricmanager.cfg`), else its shipped default `/var/log/fabricmanager.log` (NVIDIA's config
reference, as NVIDIA's NetQ documentation prints it: "Logs will be redirected to console(stderr)
if the specified log file can't be opened or the path is empty", i.e. to the journal under
systemd, which this source does not read). A config naming no file, or no log: SourceUnavailable
(the area skips unless `fmlog.expected`).

What: the last TAIL_BYTES of the file, up to its last whole line. Each record starts
`[Mon DD YYYY HH:MM:SS] [LEVEL] [tid N] text` (the Fabric Manager's own format, e.g.
leptonai/gpud's components/accelerator/nvidia/fabric-manager/testdata/fabricmanager.log); some
run on over the lines after it (an inband message's payload, a GPU NVL error's `key : value`
lines). Records at INFO and DEBUG (multicast team setups for every job) are dropped here, at the
cost of one bytes test per line; the rest are kept with their byte offset in the file, so the
next run judges only what is new (the area's baseline keeps the file's inode and size). The
`fmlog` section of a snapshot:

    {"path": "/var/log/fabricmanager.log", "inode": 1312, "size": 10238, "start": 0,
     "records": [{"offset": 10077, "line": "[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected"
                  " NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id"
                  " 00000000:86:00.0 physical id 3 port 61", "more": []}]}

The file is opened without following a last-component symlink, non-blocking, and read only when
it is a regular file: a FIFO or a device planted at the path is refused (OSError), never waited
on.
"""

from __future__ import annotations

import errno
import os
import stat

from slurmhealth.node.sources import Options, SourceUnavailable

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    Tree = dict[str, object]

CONFIG = "usr/share/nvidia/nvswitch/fabricmanager.cfg"
DEFAULT_LOG = "/var/log/fabricmanager.log"
TAIL_BYTES = 1 << 20  # ~8,000 records: days of an 8-GPU board's log at INFO
CONFIG_MAX = 1 << 16
RECORDS_MAX = 512  # the newest kept
MORE_MAX = 16  # continuation lines kept per record
LINE_MAX = 400
_QUIET = (b"] [INFO] ", b"] [DEBUG] ")


def gather(options: Options) -> Tree:
    """The registry's entry: the log the Fabric Manager's config names, under the host root."""
    root = options.host_root or "/"
    path = log_path(_config_text(os.path.join(root, CONFIG)))
    if path is None:
        raise SourceUnavailable("the Fabric Manager logs to the journal (LOG_FILE_NAME empty)")
    full = os.path.join(root, path.lstrip("/"))
    if not os.path.lexists(full):
        raise SourceUnavailable(f"no Fabric Manager log at {path}")
    return dict(read(full), path=path)


def _config_text(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(CONFIG_MAX).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OSError(f"cannot read the Fabric Manager's config: {exc.strerror}") from None


def log_path(config: str | None) -> str | None:
    """The log file a config's LOG_FILE_NAME names: the default where the config or the key is
    absent, None where it is empty (the log goes to stderr: the journal)."""
    if config is None:
        return DEFAULT_LOG
    found = DEFAULT_LOG
    for line in config.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "LOG_FILE_NAME":
            found = value.strip()
    return found or None


def read(path: str) -> Tree:
    """The file's inode, size, and the records of its last TAIL_BYTES above INFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(f"{path} is a symbolic link: not followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        start = max(0, info.st_size - TAIL_BYTES)
        data = os.pread(fd, info.st_size - start, start)
    finally:
        os.close(fd)
    # up to the last whole line: a line the Fabric Manager is still writing is read whole by
    # the next run (the baseline's size ends before it), never judged half
    whole = data.rfind(b"\n") + 1
    data = data[:whole] if whole else data
    return {"inode": info.st_ino, "size": start + len(data), "start": start,
            "records": records(data, start)}


def records(data: bytes, start: int) -> list[dict[str, object]]:
    """Records above INFO, each with its offset and its continuation lines; a partial first
    line (the tail cut it) is skipped."""
    out: list[dict[str, object]] = []
    offset = start
    keep: dict[str, object] | None = None
    more: list[str] = []
    lines = data.split(b"\n")
    if start and lines:
        offset += len(lines[0]) + 1
        lines = lines[1:]
    for raw in lines:
        here, offset = offset, offset + len(raw) + 1
        if raw.startswith(b"[") and b"] [tid " in raw[:80]:
            keep = None
            if not any(quiet in raw[:40] for quiet in _QUIET):
                more = []
                keep = {"offset": here, "line": _text(raw), "more": more}
                out.append(keep)
        elif keep is not None and raw.strip() and len(more) < MORE_MAX:
            more.append(_text(raw))
    return out[-RECORDS_MAX:]


def _text(raw: bytes) -> str:
    return raw[:LINE_MAX].decode("utf-8", "replace").rstrip("\r")
