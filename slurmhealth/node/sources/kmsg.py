"""Kernel log source: raw records from /dev/kmsg or a saved file (kmsg records or dmesg lines).

`read(path, after_seq, boot_id)` returns plain JSON-able raw facts; a snapshot of them replays
exactly (the checks in checks/xid.py only ever see this dict):

    {"path": "/dev/kmsg",
     "boot_id": "c88c3115-...",   this boot's id (/dev/kmsg only; None for a file)
     "records": [{"seq": 1234, "usec": 5678, "pri": 3,
                  "msg": "NVRM: Xid (PCI:0000:9b:00): 79, ..."},
                 {"seq": 1235, "usec": 5679, "pri": 6, "facility": 1, "msg": "..."}],
     "first_seq": 0,               seq of the oldest record still in the buffer (None when empty)
     "lost": False,                records were overwritten before we read them
     "missed": 0,                  how many, where known (0 when only EPIPE told us)
     "after_seq": 1200}            the saved position, as passed in

Only records newer than `after_seq` are returned, unless the saved position no longer applies:
the boot id changed (reboot: sequence numbers restart at 0, so every record since boot is new)
or `after_seq` is beyond every record (a rotated file): then every record is returned.
The caller saves {"seq", "boot_id"} (checks/xid.py `baseline`) and passes them back next run.

Record fields: seq is the kernel's sequence number (the 1-based line number for dmesg lines),
usec the microseconds since boot (None when the line has no timestamp), pri the log level
0-7 (None when unknown), msg the text (the kernel already escapes non-printables as \\xNN).
`facility` (PRI >> 3) is there only when it is known and not 0: the kernel's own records are
LOG_KERN (0); a record written to /dev/kmsg from user space (`echo > /dev/kmsg` is LOG_USER,
systemd's are LOG_DAEMON) has another, so checks can refuse it as a kernel record. journalctl
and syslog lines carry no facility: `logger -t kernel` cannot be told from the kernel there.

File forms (one record a line unless noted): /dev/kmsg records; dmesg `[  123.456789] msg`,
`dmesg -r` `<6>[  123.456789] msg`, `dmesg -T` `[Sat Nov 29 12:00:01 2025] msg`; syslog
`Nov 29 12:00:01 host kernel: msg` (the month as the locale prints it: `kwi 15 ...`);
journalctl -k `-o short`, `-o short-precise`
(`Nov 29 12:00:01.123456 host kernel: msg`), `-o short-iso`/`short-iso-precise`
(`2025-11-29T12:00:01.123456+0000 host kernel: msg`) and `-o short-monotonic`
(`[  123.456789] host kernel: msg`). dmesg and journalctl print the further lines of a
multi-line record indented to the message column (util-linux dmesg(1), journalctl(1)): such an
indented line joins the record above it, after a space. In a file of kmsg records an indented
line is the record's ` KEY=VALUE` dictionary instead, and is skipped.

Errors: a missing or unreadable path raises OSError (errno kept, filename = path, strerror says
"cannot read the kernel log (...)"); the runner turns it into an unavailable source. A garbage
file never raises: lines that are no record are skipped.
"""

from __future__ import annotations

import errno
import os
import re

from slurmhealth.node.sources import Options

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Callable, TypedDict

    # (seq, PRI, usec, message bytes) of one record before decoding; PRI and usec None when
    # the line does not say them (dmesg lines, before dmesg_fields reads their prefixes)
    Entry = tuple[int, int | None, int | None, bytes]

    class _Record(TypedDict):
        seq: int
        usec: int | None
        pri: int | None
        msg: str

    class Record(_Record, total=False):
        """One raw record (the module docstring): `facility` only when known and not 0."""

        facility: int

    class _Facts(TypedDict):
        path: str
        boot_id: str | None
        records: list[Record]
        first_seq: int | None
        lost: bool
        missed: int
        after_seq: int | None

    class KmsgFacts(_Facts, total=False):
        """The raw facts (the module docstring); read() adds the running kernel's release and
        the host's NCCL version (None for a file)."""

        kernel: str | None
        nccl: str | None

KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"

# One read() returns exactly one record; a buffer smaller than the record fails with EINVAL
# (Documentation/ABI/testing/dev-kmsg). A formatted extended record is at most 8 KiB
# (CONSOLE_EXT_LOG_MAX, kernel/printk/internal.h; newer kernels cap lower); 16 KiB leaves room.
READ_SIZE = 16384
# A log flood could keep a non-blocking reader busy forever; the runner's deadline is the real
# bound, this only stops an endless loop (a 16 MiB ring holds ~200k records).
MAX_READS = 1 << 20
# Longest message kept from a file line (binary junk can make one "line" megabytes long).
MSG_MAX = 8192

# `PRI,SEQ,USEC,FLAGS[,...];MESSAGE` (dev-kmsg ABI): FLAGS is "-" or "c", more fields may
# follow (caller=T123); the header ends well within this many bytes.
HEAD_MAX = 128
# dmesg forms: `[  123.456789] msg`, `dmesg -r`: `<6>[  123.456789] msg`, `dmesg -T`:
# `[Mon Nov 17 10:22:33 2025] msg`, syslog/journal: `Nov 17 10:22:33 host kernel: [ 1.2] msg`,
# journalctl's short-precise `Nov 17 10:22:33.123456 host kernel: msg`, short-iso(-precise)
# `2025-11-17T10:22:33.123456+0000 host kernel: msg`, short-monotonic
# `[  123.456789] host kernel: msg`. Only files need them: kept as strings for re's own cache,
# so the /dev/kmsg path never pays their compile time. Only the `kernel:` tag is
# stripped: another program's syslog line keeps its prefix and so never starts with `NVRM:`.
# journalctl prints the month in the reader's locale (strftime's %b): `kwi 15 07:56:59 host
# kernel:` from a Polish node (captured in NVIDIA/open-gpu-kernel-modules#1045), so the month
# is any short word, not only English `Apr`.
_SYSLOG = (
    r"(?:[^\s\[<]\S{0,11} [ 0-9][0-9] [0-9:]{8}(?:\.[0-9]{1,9})?"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T\S+) \S+ kernel: "
)
_LEVEL = r"<([0-9]{1,3})>"
_MONO = r"\[ *([0-9]{1,12})\.([0-9]{1,9})\] ?"
_JOURNAL_MONO = r"\[ *([0-9]{1,12})\.([0-9]{1,9})\] \S+ kernel: "
_WALL = r"\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} [0-9]{4}\] ?"


def boot_id(path: str = BOOT_ID) -> str | None:
    """This boot's random id (a new one at every boot), or None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip() or None
    except (OSError, ValueError):
        return None


_this_boot = boot_id  # gather's parameter of the same name shadows the function


def read_records(read: Callable[[], bytes]) -> tuple[list[bytes], bool]:
    """Call `read()` (one os.read of /dev/kmsg) until EAGAIN: returns (chunks, epipe_seen).

    EPIPE means the ring wrapped past our position: records were overwritten; the next read
    returns the oldest record still there, so note it and keep reading (dev-kmsg ABI).
    """
    chunks: list[bytes] = []
    epipe = False
    for _ in range(MAX_READS):
        try:
            chunk = read()
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                epipe = True
                continue
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                break
            raise
        if not chunk:
            break
        chunks.append(chunk)
    return chunks, epipe


def kmsg_entry(data: bytes) -> Entry | None:
    """(seq, PRI, usec, message bytes) of one kmsg record, or None when it is not one. PRI is
    the whole field, facility * 8 + level (`record` splits it).

    Continuation lines (` KEY=VALUE` after the first newline) are dictionary data, not message.
    Split by hand, not by regex: this runs for every record in the ring.
    """
    end = data.find(b";", 0, HEAD_MAX)
    fields = data[:end].split(b",", 3) if end > 0 else ()
    if len(fields) != 4:
        return None
    pri, seq, usec = fields[0], fields[1], fields[2]
    if not (pri.isdigit() and seq.isdigit() and usec.isdigit()):
        return None
    stop = data.find(b"\n", end)
    body = data[end + 1 : stop if stop >= 0 else len(data)].rstrip(b"\r")
    return int(seq), int(pri), int(usec), body


def device_entries(chunks: list[bytes], after_seq: int | None = None) -> list[Entry]:
    """Entries of the records read from /dev/kmsg (malformed ones skipped).

    The device hands records out in sequence order, so with `after_seq` only the new tail is
    parsed, from the newest back to the first record at or before `after_seq`, plus the oldest
    record (the loss check needs its seq): a full ring holds thousands of records and this runs
    before every job. A saved seq beyond the newest record cannot be trusted: parse them all.
    """
    tail: list[Entry] = []
    if after_seq is not None:
        for entry in filter(None, map(kmsg_entry, reversed(chunks))):
            tail.append(entry)
            if entry[0] <= after_seq:
                break
    # (a tail is read only with an after_seq: the second test says so to the type checker)
    if not tail or after_seq is None or tail[0][0] < after_seq:
        return [e for e in map(kmsg_entry, chunks) if e is not None]
    oldest = next(filter(None, map(kmsg_entry, chunks)))
    if oldest[0] < tail[-1][0]:
        tail.append(oldest)
    tail.reverse()
    return tail


def file_entries(lines: Iterable[bytes]) -> list[Entry]:
    """Entries of a file's lines: kmsg records where a line is one, else dmesg lines.

    A dmesg line has no sequence number: its 1-based line number stands in. Blank lines and
    lines with NUL bytes (binary junk) are skipped. A line with leading space continues the
    dmesg/journal line above it (dmesg and journalctl indent a multi-line record's further
    lines); after a kmsg record it is dictionary data (` SUBSYSTEM=pci`) and is skipped.
    """
    out: list[Entry] = []
    joins = False  # the last entry is a dmesg line that an indented line may continue
    for number, line in enumerate(lines, 1):
        first = line[:1]
        if first in (b"", b"\n", b"\r") or b"\0" in line:
            joins = False
            continue
        if first in (b" ", b"\t"):
            more = line.strip()
            if joins and more and len(out[-1][3]) < MSG_MAX:
                seq, pri, usec, body = out[-1]
                out[-1] = (seq, pri, usec, body + b" " + more)
            joins = joins and bool(more)
            continue
        entry = kmsg_entry(line)
        joins = entry is None
        if entry is None:
            entry = (number, None, None, line.rstrip(b"\r\n"))
        out.append(entry)
    return out


def dmesg_fields(text: str) -> tuple[int | None, int | None, str]:
    """(PRI, usec, message) of one dmesg/syslog/journal line; prefixes that are not there are
    None. PRI is as printed by `dmesg -r` (facility * 8 + level)."""
    journal = re.match(_JOURNAL_MONO, text, re.A)
    if journal:  # journalctl -o short-monotonic: the boot-relative time, then `host kernel:`
        return None, _usec(journal), text[journal.end() :]
    prefix = re.match(_SYSLOG, text, re.A)
    if prefix:
        text = text[prefix.end() :]
    pri = None
    level = re.match(_LEVEL, text, re.A)
    if level:
        pri, text = int(level.group(1)), text[level.end() :]
    usec = None
    mono = re.match(_MONO, text, re.A)
    if mono:
        usec = _usec(mono)
        text = text[mono.end() :]
    else:
        wall = re.match(_WALL, text, re.A)
        text = text[wall.end() :] if wall else text
    return pri, usec, text


def _usec(found: re.Match[str]) -> int:
    """Microseconds of a `[seconds.fraction]` time matched by _MONO or _JOURNAL_MONO."""
    return int(found.group(1)) * 1000000 + int(found.group(2)[:6].ljust(6, "0"))


def record(entry: Entry) -> Record:
    """The raw record of one entry: decoding (errors replaced) happens only for kept records."""
    seq, pri, usec, body = entry
    text = body[:MSG_MAX].decode("utf-8", "replace")
    if usec is None and pri is None:
        pri, usec, text = dmesg_fields(text)
    if pri is None:
        return {"seq": seq, "usec": usec, "pri": None, "msg": text}
    out: Record = {"seq": seq, "usec": usec, "pri": pri & 7, "msg": text}
    if pri >> 3:
        out["facility"] = pri >> 3
    return out


def rebooted(saved_boot: str | None, boot: str | None) -> bool:
    """Did the machine boot since the saved position? Unknown ids (a file) compare as same."""
    return saved_boot is not None and boot is not None and saved_boot != boot


def since(
    entries: list[Entry], after_seq: int | None, saved_boot: str | None, boot: str | None
) -> int | None:
    """The sequence number to read after: None = keep everything and detect no loss.

    After a reboot every record since boot is new: -1, so a wrapped ring (first seq > 0)
    still counts as loss. A saved position beyond every record (the file was rotated, the
    ring was reset) cannot be trusted: keep everything.
    """
    if rebooted(saved_boot, boot):
        return -1
    if after_seq is None or not entries:
        return after_seq
    if after_seq > max(e[0] for e in entries):
        return None
    return after_seq


def first_seq(entries: list[Entry]) -> int | None:
    """The oldest sequence number the buffer still holds: a file of dmesg lines starts at 1."""
    if not entries:
        return None
    seq, pri, usec, _ = entries[0]
    return 1 if pri is None and usec is None else seq


def select(
    entries: list[Entry],
    path: str,
    after_seq: int | None,
    *,
    saved_boot: str | None = None,
    boot: str | None = None,
    epipe: bool = False,
) -> KmsgFacts:
    """The raw dict: records newer than the saved position, and whether records were lost."""
    start = since(entries, after_seq, saved_boot, boot)
    first = first_seq(entries)
    kept = entries if start is None else [e for e in entries if e[0] > start]
    missed = 0
    if start is not None and first is not None and first > start + 1:
        missed = first - start - 1
    return {
        "path": path,
        "boot_id": boot,
        "records": [record(e) for e in kept],
        "first_seq": first,
        "lost": bool(epipe or missed),
        "missed": missed,
        "after_seq": after_seq,
    }


def _is_char_device(mode: int) -> bool:
    return (mode & 0o170000) == 0o020000  # S_IFMT / S_IFCHR, without importing stat


def _read(
    fd: int, after_seq: int | None, saved_boot: str | None
) -> tuple[list[Entry], bool, str | None]:
    """(entries, epipe, boot id) of an open kernel log: the device, or a file."""
    if _is_char_device(os.fstat(fd).st_mode):
        chunks, epipe = read_records(lambda: os.read(fd, READ_SIZE))
        boot = _this_boot()
        known = None if rebooted(saved_boot, boot) else after_seq
        return device_entries(chunks, known), epipe, boot
    with os.fdopen(fd, "rb", closefd=False) as handle:
        return file_entries(handle), False, None


def gather(options: Options) -> KmsgFacts:
    """The registry's entry: the configured log, after the saved position."""
    after = options.kmsg_after
    return read(options.kmsg or KMSG, after.get("seq"), after.get("boot_id"), options.costly)


def read(
    path: str = KMSG,
    after_seq: object = None,
    boot_id: object = None,
    costly: bool = True,
) -> KmsgFacts:
    """Read the kernel log at `path`: records after `after_seq` (see the module docstring).

    `boot_id` is the id saved with `after_seq`; a saved position of the wrong type (a damaged
    store) counts as none: read everything. costly=False (the job hooks, sources.Options)
    leaves out the host's NCCL: the runner carries the health check's reading forward.
    Raises OSError when `path` cannot be read.
    """
    if not isinstance(after_seq, int) or isinstance(after_seq, bool):
        after_seq = None
    if not isinstance(boot_id, str):
        boot_id = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            entries, epipe, boot = _read(fd, after_seq, boot_id)
            live = _is_char_device(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
    except OSError as exc:
        reason = f"cannot read the kernel log ({exc.strerror or exc})"
        raise OSError(exc.errno, reason, path) from exc
    out = select(entries, path, after_seq, saved_boot=boot_id, boot=boot, epipe=epipe)
    # The running kernel's release (uname -r) and the host's NCCL, for the odd node out: only
    # when the log read is this kernel's own (a saved file is some other machine's, some other
    # day's).
    out["kernel"] = os.uname().release if live else None
    out["nccl"] = host_nccl() if live and costly else None
    return out


# Where a system-wide NCCL is installed: NVIDIA's libnccl2 packages put `libnccl.so.2`, a link to
# `libnccl.so.2.<minor>.<patch>`, in the distribution's library directory (Debian and Ubuntu
# multiarch, RHEL lib64); CUDA and HPC-X trees elsewhere. The first found is the host's.
NCCL_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/cuda/lib64",
)
# A string for re's own cache: compiled only on a node that has the library.
_NCCL_FILE = r"libnccl\.so\.([0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4})"


def host_nccl(dirs: tuple[str, ...] = NCCL_DIRS) -> str | None:
    """The version of the NCCL installed on the host (the file `libnccl.so.2` resolves to), or
    None: none installed, or a file without its version in its name. No library is loaded; a
    few stat and readlink calls. Applications that bring their own NCCL (wheels, containers)
    run that one instead: this is only the host's."""
    for folder in dirs:
        path = os.path.join(folder, "libnccl.so.2")
        if not os.path.lexists(path):
            continue
        found = re.fullmatch(_NCCL_FILE, os.path.basename(os.path.realpath(path)), re.A)
        return found.group(1) if found else None
    return None
