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
systemd's are LOG_DAEMON) has another, so checks can refuse it as a kernel record. A journal
or syslog line whose program tag is not `kernel` (a user's `logger "NVRM: ..."`) gets its own
PRI's facility, else LOG_USER (1), and keeps its whole line as the message; a journal JSON
entry whose _TRANSPORT is not `kernel` likewise. A short journal or syslog line tagged `kernel`
has no facility: `logger -t kernel` cannot be told from the kernel there (JSON can).

File forms (one record a line unless noted; dmesg_fields, the patterns' comments cite each):
/dev/kmsg records `PRI,SEQ,USEC,FLAGS;MSG`; util-linux dmesg in every --time-format: raw
`[  123.456789] msg` (with -d `[  123.456789 <    0.000123>] msg`), ctime `dmesg -T`
`[Sat Nov 29 12:00:01 2025] msg`, delta `[<    0.000123>] msg`, reltime `[Nov29 12:00] msg` /
`[  +0.000123] msg`, iso `2025-11-29T12:00:01,123456+00:00 msg`, notime `msg`; each after
`dmesg -r`'s `<6>` or `dmesg -x`'s `kern  :warn  : `; journalctl -k `-o short` and syslog
`Nov 29 12:00:01 host kernel: msg` (the month as the locale prints it: `kwi 15 ...`),
`-o short-precise`, `-o short-iso`/`short-iso-precise`
(`2025-11-29T12:00:01.123456+0000 host kernel: msg`, also rsyslog's RFC 3339 file format),
`-o short-full`, `-o short-unix`, `-o short-monotonic`/`short-delta`
(`[  123.456789] host kernel: msg`), `-o cat` (the message), `-o json`/`json-seq` (one entry a
line); RFC 3164 lines with their `<PRI>`, and RFC 5424 `<PRI>1 TIME HOST kernel - - - msg`.
dmesg and journalctl print the further lines of a
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
    # (facility, level, usec, message) of a line read by dmesg_fields; None where not said
    Fields = tuple[int | None, int | None, int | None, str]

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
# Longest journal JSON line decoded: its other fields come with the message (a few KiB).
JSON_MAX = 65536

# `PRI,SEQ,USEC,FLAGS[,...];MESSAGE` (dev-kmsg ABI): FLAGS is "-" or "c", more fields may
# follow (caller=T123); the header ends well within this many bytes.
HEAD_MAX = 128
# The forms of a saved log (file_entries, dmesg_fields), each anchored at the line's start.
# They stay strings for re's own cache: the /dev/kmsg path never pays their compile time.
#
# util-linux dmesg(1) (sys-utils/dmesg.c, print_record): `-r` prints the raw `<PRI>`; `-x` /
# `--decode` prints facility and level names, `"%-6s:%-6s: "` (`kern  :warn  : `); then the
# time as --time-format says: raw `[%5ld.%06ld] ` (the default), with `-d` `[%5ld.%06ld
# <%12.06f>] `, ctime (`-T`) `[%a %b %e %H:%M:%S %Y] ` (+ ` <delta>` with -d), delta
# `[<%12.06f>] `, reltime `[%b%e %H:%M] ` when the minute changes else `[%+8.06f] `, iso
# `2025-01-02T03:04:05,123456+00:00 ` (a comma before the microseconds), notime nothing.
_DECODE = r"([a-z0-9]{3,8}) {0,5}:([a-z]{3,6}) {0,5}: "
_LEVEL = r"<([0-9]{1,3})>"
_TIME = (
    r"(?:\[ *([0-9]{1,12})\.([0-9]{1,9})(?: <[ 0-9.]{1,24}>)?\]"
    r"|\[\S{2,12} \S{2,12} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4}(?: <[ 0-9.]{1,24}>)?\]"
    r"|\[< *[0-9]{1,12}\.[0-9]{6}>\]"
    r"|\[\S{2,12}?[ 0-9][0-9] [0-9]{2}:[0-9]{2}\]|\[ *[+-][0-9]{1,12}\.[0-9]{6}\]"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{6}[+-][0-9]{2}:?[0-9]{2}) ?"
)
# util-linux's facility_names and level_names, in number order (syslog(3) / RFC 5424 6.2.1).
FACILITIES = (
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron",
    "authpriv", "ftp", "res0", "res1", "res2", "res3",
    "local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7",
)  # fmt: skip
LEVELS = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")
LOG_USER = 1
# Journal and syslog lines: a wall-clock stamp, the host, the program's tag, `: `, the message.
# journalctl(1) output modes: short (`Jan 02 03:04:05`, also syslog's RFC 3164 stamp `Jan  2`),
# short-precise (`.123456`), short-iso / short-iso-precise (`2025-01-02T03:04:05[.123456]+0000`,
# newer systemd `+00:00`, the RFC 3339 stamp of rsyslog's RSYSLOG_FileFormat), short-full
# (`Thu 2025-01-02 03:04:05 UTC`), short-unix (`1735787045.123456`); a forwarded RFC 3164 line
# starts with `<PRI>`. journalctl prints the month in the reader's locale (strftime's %b):
# `kwi 15 07:56:59 host kernel:` from a Polish node (captured in
# NVIDIA/open-gpu-kernel-modules#1045), so the month is any short word. The journal names the
# kernel's own records `kernel` (SYSLOG_IDENTIFIER, systemd.journal-fields(7)); rsyslog's
# imklog and syslog-ng tag them `kernel:` too, and without a `[pid]`.
_SYSLOG = (
    r"(?:<([0-9]{1,3})>)?"
    r"(?:[^\s\[<0-9]\S{0,11} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})?"
    r"|\S{2,12} [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})? \S{1,12}"
    r"|[0-9]{9,12}\.[0-9]{6})"
    r" \S{1,255} ([^\s:\[]{1,64})(\[[0-9]{1,10}\])?: "
)
# journalctl -o short-monotonic `[  123.456789] host kernel: ` (and short-delta, `[ 123.456789
# <    0.000123>] `): stripped only for the `kernel` tag, since a dmesg line has the same time
# and then any message (`usb 1-1: new device` reads like `host tag: `).
_JOURNAL_MONO = r"\[ *([0-9]{1,12})\.([0-9]{1,9})(?: <[ 0-9.]{1,24}>)?\] \S+ kernel: "
# RFC 5424 6: `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA [MSG]`, as
# rsyslog's RSYSLOG_SyslogProtocol23Format writes it; the MSG may start with a UTF-8 BOM.
_RFC5424 = (
    r"<([0-9]{1,3})>1 \S+ \S+ (\S+) \S+ \S+ (?:-|(?:\[(?:[^\]\\]|\\.)*\])+)(?: \ufeff?|$)"
)


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


def dmesg_fields(text: str) -> Fields:
    """(facility, level, usec, message) of one dmesg, journal or syslog line; what the line
    does not say is None. A journal or syslog line of another program than the kernel keeps
    its whole text as the message and gets the facility its own PRI gives, else LOG_USER (1):
    what the kernel gives a write to /dev/kmsg that names none; checks refuse it."""
    if text.startswith(('{"', '\x1e{"')):
        fields = journal_json(text)
        if fields is not None:
            return fields
    journal = re.match(_JOURNAL_MONO, text, re.A)
    if journal:  # journalctl -o short-monotonic: the boot-relative time, then `host kernel:`
        return None, None, _usec(journal), text[journal.end() :]
    found = re.match(_SYSLOG, text, re.A) or re.match(_RFC5424, text, re.A)
    if found:
        return _syslog_fields(found, text)
    return _dmesg_prefix(text)


def _syslog_fields(found: re.Match[str], text: str) -> Fields:
    """Fields of a line matched by _SYSLOG (PRI, tag, pid) or _RFC5424 (PRI, APP-NAME)."""
    pri = int(found.group(1)) if found.group(1) else None
    facility, level = (pri >> 3, pri & 7) if pri is not None else (None, None)
    if found.group(2) != "kernel" or found.re.groups > 2 and found.group(3) or facility:
        return facility or LOG_USER, level, None, text
    if pri is not None:  # the header's PRI: a `<PRI>` after the tag is not the kernel's then
        _, _, usec, rest = _dmesg_prefix(text[found.end() :])
        return 0, level, usec, rest
    return _dmesg_prefix(text[found.end() :])


def _dmesg_prefix(text: str) -> Fields:
    """Fields of a dmesg line: `<PRI>` (-r) or `kern  :warn  : ` (-x), then the time."""
    facility = level = None
    raw = re.match(_LEVEL, text, re.A)
    decoded = None if raw else re.match(_DECODE, text, re.A)
    if raw:
        pri = int(raw.group(1))
        facility, level, text = pri >> 3, pri & 7, text[raw.end() :]
    elif decoded and decoded.group(1) in FACILITIES and decoded.group(2) in LEVELS:
        facility = FACILITIES.index(decoded.group(1))
        level, text = LEVELS.index(decoded.group(2)), text[decoded.end() :]
    usec = None
    time = re.match(_TIME, text, re.A)
    if time:
        usec = _usec(time) if time.group(1) else None
        text = text[time.end() :]
    return facility, level, usec, text


def journal_json(text: str) -> Fields | None:
    """Fields of one `journalctl -o json` (or json-seq) line, or None when it is not one.

    systemd.journal-fields(7): MESSAGE (a string, or an array of bytes when not UTF-8),
    PRIORITY (the level), SYSLOG_FACILITY, _TRANSPORT (`kernel` for what journald read from
    /dev/kmsg: the underscore fields are journald's own, a client cannot set them) and the
    kernel's time since boot, _SOURCE_MONOTONIC_TIMESTAMP (else journald's own reception time,
    __MONOTONIC_TIMESTAMP), in microseconds. A record that user space wrote to /dev/kmsg
    comes with _TRANSPORT=kernel and its own facility; any other transport is not the kernel.
    A multi-line message's lines join with a space, as file_entries joins them."""
    import json  # noqa: PLC0415 - only a file of journal JSON pays for it

    try:
        entry = json.loads(text.lstrip("\x1e"))
    except (ValueError, RecursionError):
        return None
    message = entry.get("MESSAGE") if isinstance(entry, dict) else None
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        message = bytes(message).decode("utf-8", "replace")
    if not isinstance(message, str):
        return None
    facility = _digits(entry.get("SYSLOG_FACILITY"))
    if entry.get("_TRANSPORT") != "kernel":
        facility = facility or LOG_USER
    usec = _digits(entry.get("_SOURCE_MONOTONIC_TIMESTAMP"))
    if usec is None:
        usec = _digits(entry.get("__MONOTONIC_TIMESTAMP"))
    level = _digits(entry.get("PRIORITY"))
    text = " ".join(line.strip() for line in message[:MSG_MAX].splitlines() if line.strip())
    return facility, level if level is not None and level < 8 else None, usec, text


def _digits(value: object) -> int | None:
    """A journal field's number (fields are strings), or None."""
    if isinstance(value, str) and value.isdigit() and value.isascii() and len(value) <= 20:
        return int(value)
    return None


def _usec(found: re.Match[str]) -> int:
    """Microseconds of a `[seconds.fraction]` time matched by _TIME or _JOURNAL_MONO."""
    return int(found.group(1)) * 1000000 + int(found.group(2)[:6].ljust(6, "0"))


def record(entry: Entry) -> Record:
    """The raw record of one entry: decoding (errors replaced) happens only for kept records.
    A journal JSON line may be longer than MSG_MAX before its message is."""
    seq, pri, usec, body = entry
    limit = JSON_MAX if body.startswith((b'{"', b'\x1e{"')) else MSG_MAX
    text = body[:limit].decode("utf-8", "replace")
    facility = level = None
    if pri is not None:
        facility, level = pri >> 3, pri & 7
    elif usec is None:
        facility, level, usec, text = dmesg_fields(text)
    out: Record = {"seq": seq, "usec": usec, "pri": level, "msg": text[:MSG_MAX]}
    if facility:
        out["facility"] = facility
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
