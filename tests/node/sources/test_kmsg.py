"""sources/kmsg.py: reading /dev/kmsg and saved logs, the seq filter, ring-wrap detection."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile

import conftest
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.node.sources import kmsg

FIX = os.path.join(conftest.FIXTURES, "kmsg")


def fixture(name: str) -> str:
    return os.path.join(FIX, name)


def by_seq(raw: dict) -> dict:
    return {r["seq"]: r for r in raw["records"]}


# --- kmsg-record files ---------------------------------------------------------------------


def test_kmsg_file_records_and_shape():
    raw = kmsg.read(fixture("xid-forms.kmsg"))
    assert set(raw) == {
        "path",
        "boot_id",
        "records",
        "first_seq",
        "lost",
        "missed",
        "after_seq",
        "kernel",
        "nccl",
    }
    assert raw["kernel"] is None and raw["nccl"] is None  # a file: not this host's
    assert raw["boot_id"] is None  # a file has no boot id
    assert [r["seq"] for r in raw["records"]] == list(range(27))
    assert raw["records"][0] == {
        "seq": 0,
        "usec": 0,
        "pri": 5,
        "msg": raw["records"][0]["msg"],
    }
    assert raw["records"][0]["msg"].startswith("Linux version 5.15.0-1063-nvidia")
    assert raw["first_seq"] == 0
    assert raw["lost"] is False and raw["missed"] == 0 and raw["after_seq"] is None


def test_dictionary_lines_are_not_message():
    records = by_seq(kmsg.read(fixture("xid-forms.kmsg")))
    assert records[2]["msg"] == "mlx5_core 0000:1a:00.0: firmware version: 28.39.1002"
    assert not any("SUBSYSTEM=" in r["msg"] or "DEVICE=" in r["msg"] for r in records.values())


def test_pri_keeps_the_level_only():
    records = by_seq(kmsg.read(fixture("healthy.kmsg")))
    assert records[19]["msg"].startswith("systemd[1]: Started nvidia-persistenced")
    assert records[19]["pri"] == 6  # 30 = facility daemon (3) * 8 + level info (6)
    assert records[12]["pri"] == 5


def test_snapshot_replays_exactly():
    raw = kmsg.read(fixture("xid-forms.kmsg"), after_seq=9)
    assert json.loads(json.dumps(raw)) == raw


# --- dmesg-line files ----------------------------------------------------------------------


def test_dmesg_lines_use_line_numbers_and_timestamps():
    raw = kmsg.read(fixture("xid-forms.dmesg"))
    records = by_seq(raw)
    assert 4 not in records  # the blank line
    assert raw["first_seq"] == 1  # a dmesg file starts at line 1
    assert records[1] == {
        "seq": 1,
        "usec": 0,
        "pri": None,
        "msg": records[1]["msg"],
    }
    assert records[5]["usec"] == 86400123456
    assert records[5]["msg"].startswith("NVRM: Xid (PCI:0000:9a:00): 119,")


def test_dmesg_prefixes():
    records = by_seq(kmsg.read(fixture("xid-forms.dmesg")))
    # dmesg -r: <level>[time]
    assert (records[6]["pri"], records[6]["usec"]) == (4, 86401000000)
    assert records[6]["msg"].startswith("NVRM: Xid (PCI:0000:18:00): 79")
    # dmesg -T: wall-clock time, no usec since boot
    assert records[7]["usec"] is None
    assert records[7]["msg"].startswith("NVRM: Xid (PCI:0000:2a:00): 79")
    # syslog: `Mon DD hh:mm:ss host kernel: [time] msg`
    assert records[8]["usec"] == 86402000000
    assert records[8]["msg"].startswith("NVRM: Xid (0000:3a:00): 13")
    # journal short-iso
    assert records[9]["msg"].startswith("NVRM: Xid (PCI:0000:5d:00 GPU-I:05): 94")
    # plain line
    assert records[10]["usec"] is None
    assert records[10]["msg"].startswith("NVRM: Xid (PCI:0018:01:00): 149")


def test_syslog_line_of_another_program_keeps_its_prefix():
    """Only the `kernel:` tag is stripped: a user's syslog line cannot pass for a kernel one."""
    records = by_seq(kmsg.read(fixture("xid-forms.dmesg")))
    spoof = records[15]["msg"]
    assert spoof.startswith("Nov 17 10:22:40 gpu01 systemd[1]: NVRM: Xid")


@pytest.mark.parametrize(
    ("line", "facility", "level", "usec", "msg"),
    [
        ("[    0.000000] Linux version", None, None, 0, "Linux version"),
        ("[12345.678901] NVRM: x", None, None, 12345678901, "NVRM: x"),
        ("[    1.5] short fraction", None, None, 1500000, "short fraction"),
        ("<3>[    2.000001] err", 0, 3, 2000001, "err"),
        ("<14>[    2.000001] user info", 1, 6, 2000001, "user info"),  # whole PRI: user.info
        ("[Tue Nov 18 09:01:02 2025] wall", None, None, None, "wall"),
        ("Nov  8 09:01:02 gpu01 kernel: [  7.25] sys", None, None, 7250000, "sys"),
        ("2025-11-18T09:01:02+0100 gpu01 kernel: iso", None, None, None, "iso"),
        ("plain text", None, None, None, "plain text"),
        # journalctl -k -o short-precise, short-iso-precise, short-monotonic (journalctl(1))
        ("Nov 29 12:00:01.123456 gpu01 kernel: NVRM: x", None, None, None, "NVRM: x"),
        ("Nov  9 12:00:01.123456 gpu01 kernel: NVRM: x", None, None, None, "NVRM: x"),
        ("2026-11-29T12:00:01.123456+0000 gpu01 kernel: NVRM: x", None, None, None, "NVRM: x"),
        ("[  123.456789] gpu01 kernel: NVRM: x", None, None, 123456789, "NVRM: x"),
        ("[86400.000001] gpu01.example.org kernel: NVRM: x", None, None, 86400000001, "NVRM: x"),
        # journalctl prints the locale's month: Polish `kwi` (NVIDIA/open-gpu-kernel-modules#1045)
        ("kwi 15 07:56:59 testowy kernel: NVRM: x", None, None, None, "NVRM: x"),
        ("kwi  5 07:56:59.123456 testowy kernel: NVRM: x", None, None, None, "NVRM: x"),
        (
            "kwi 15 07:56:59 testowy systemd[1]: NVRM: x",
            1,
            None,
            None,
            "kwi 15 07:56:59 testowy systemd[1]: NVRM: x",
        ),
        # another program's line keeps its tag: it can never start with `NVRM:`
        (
            "[  123.456789] gpu01 systemd[1]: NVRM: x",
            None,
            None,
            123456789,
            "gpu01 systemd[1]: NVRM: x",
        ),
        (
            "Nov 29 12:00:01.123456 gpu01 logger[77]: NVRM: x",
            1,
            None,
            None,
            "Nov 29 12:00:01.123456 gpu01 logger[77]: NVRM: x",
        ),
    ],
)
def test_dmesg_fields(line, facility, level, usec, msg):
    assert kmsg.dmesg_fields(line) == (facility, level, usec, msg)


# --- journalctl forms, continuation lines, facility ----------------------------------------

SAME_FAULTS = [
    "same-faults.dmesg",
    "same-faults.dmesg-T",
    "same-faults.short-precise",
    "same-faults.short-iso-precise",
    "same-faults.short-monotonic",
]


@pytest.mark.parametrize("name", SAME_FAULTS)
def test_every_form_gives_the_kmsg_messages(name):
    """Each form of tests/fixtures/kmsg/same-faults.*: the same messages as the kmsg records
    (whose one multi-line record the kernel escapes as `\\x0a`, where dmesg and journalctl
    print an indented further line, joined here with a space)."""
    want = [
        r["msg"].replace("\\x0a", " ") for r in kmsg.read(fixture("same-faults.kmsg"))["records"]
    ]
    raw = kmsg.read(fixture(name))
    assert [r["msg"] for r in raw["records"]] == want
    assert len(raw["records"]) == 15 and raw["first_seq"] == 1


@pytest.mark.parametrize("name", ["same-faults.dmesg", "same-faults.short-monotonic"])
def test_boot_relative_forms_keep_usec(name):
    records = kmsg.read(fixture(name))["records"]
    assert [r["usec"] for r in records][:3] == [86400000000, 86400512345, 86401123456]


def test_continuation_joins_the_record_above():
    """The driver prints its lost-GPU report as one record of three `NVRM:` lines
    (open-gpu-kernel-modules osapi.c; captured in NVIDIA/NVSentinel#155): dmesg indents the
    further two, which join the record above."""
    raw = kmsg.read(fixture("same-faults.dmesg"))
    joined = raw["records"][-2]
    assert joined["msg"] == (
        "NVRM: The NVIDIA GPU 0000:ba:00.0 NVRM: (PCI ID: 10de:2330) installed in this system "
        "has NVRM: fallen off the bus and is not responding to commands."
    )
    assert joined["seq"] == 14 and raw["records"][-1]["seq"] == 17  # line numbers stay


def test_indented_lines_after_kmsg_records_stay_dictionary():
    entries = kmsg.file_entries([b"6,2,4521301,-;mlx5_core up\n", b" SUBSYSTEM=pci\n"])
    assert [e[3] for e in entries] == [b"mlx5_core up"]


def test_continuation_stops_at_a_blank_line():
    entries = kmsg.file_entries([b"[ 1.0] first\n", b"\n", b"    orphan\n", b"[ 2.0] next\n"])
    assert [kmsg.record(e)["msg"] for e in entries] == ["first", "next"]


def test_continuation_is_bounded():
    lines = [b"[ 1.0] start\n"] + [b"    " + b"x" * 1000 + b"\n"] * 50
    (entry,) = kmsg.file_entries(lines)
    assert len(entry[3]) < kmsg.MSG_MAX + 1100
    assert len(kmsg.record(entry)["msg"]) <= kmsg.MSG_MAX


def test_facility_is_kept_when_not_the_kernels():
    """PRI = facility * 8 + level (dev-kmsg ABI); the kernel's own records are facility 0."""
    records = by_seq(kmsg.read(fixture("foreign.kmsg")))
    assert "facility" not in records[900] and "facility" not in records[905]
    assert (records[901]["pri"], records[901]["facility"]) == (4, 1)  # <12>: user.warning
    assert (records[902]["pri"], records[902]["facility"]) == (6, 3)  # <30>: daemon.info
    assert not any("SUBSYSTEM=" in r["msg"] for r in records.values())


# --- after_seq, reboots, wrapped rings -----------------------------------------------------


def test_after_seq_keeps_only_newer_records():
    raw = kmsg.read(fixture("xid-forms.kmsg"), after_seq=20)
    assert [r["seq"] for r in raw["records"]] == [21, 22, 23, 24, 25, 26]
    assert raw["first_seq"] == 0 and raw["lost"] is False and raw["after_seq"] == 20


def test_nothing_new():
    raw = kmsg.read(fixture("xid-forms.kmsg"), after_seq=26)
    assert raw["records"] == [] and raw["lost"] is False


def test_after_seq_beyond_every_record_keeps_all():
    """A rotated file or a reset ring: the saved position means nothing, read it all."""
    raw = kmsg.read(fixture("xid-forms.kmsg"), after_seq=10**6)
    assert len(raw["records"]) == 27 and raw["lost"] is False


def test_dmesg_file_after_seq_is_a_line_number():
    raw = kmsg.read(fixture("xid-forms.dmesg"), after_seq=13)
    assert [r["seq"] for r in raw["records"]] == [14, 15, 16]
    assert raw["lost"] is False


def test_wrapped_ring_reports_the_gap():
    raw = kmsg.read(fixture("wrapped.kmsg"), after_seq=41000)
    assert raw["first_seq"] == 50000
    assert raw["lost"] is True and raw["missed"] == 8999
    assert len(raw["records"]) == 10  # everything left is newer than the saved seq


def test_contiguous_ring_is_not_lost():
    raw = kmsg.read(fixture("wrapped.kmsg"), after_seq=49999)
    assert raw["lost"] is False and raw["missed"] == 0 and len(raw["records"]) == 10


def entries(*seqs: int) -> list:
    return kmsg.device_entries([f"6,{s},{s * 1000},-;line {s}\n".encode() for s in seqs])


def test_same_boot_filters_on_seq():
    raw = kmsg.select(entries(5, 6, 7), "/dev/kmsg", 6, saved_boot="b1", boot="b1")
    assert [r["seq"] for r in raw["records"]] == [7]
    assert raw["boot_id"] == "b1"


def test_reboot_keeps_every_record_since_boot():
    """Sequence numbers restart at boot: a saved seq of the old boot must not hide new records."""
    raw = kmsg.select(entries(0, 1, 2), "/dev/kmsg", 1500, saved_boot="old", boot="new")
    assert [r["seq"] for r in raw["records"]] == [0, 1, 2]
    assert raw["lost"] is False and raw["after_seq"] == 1500


def test_reboot_with_wrapped_ring_counts_loss_since_boot():
    raw = kmsg.select(entries(120, 121), "/dev/kmsg", 5, saved_boot="old", boot="new")
    assert len(raw["records"]) == 2
    assert raw["lost"] is True and raw["missed"] == 120


def test_reboot_with_small_saved_seq_still_reads_all():
    raw = kmsg.select(entries(0, 1, 2, 3), "/dev/kmsg", 2, saved_boot="old", boot="new")
    assert [r["seq"] for r in raw["records"]] == [0, 1, 2, 3]


def test_unknown_boot_ids_are_not_compared():
    raw = kmsg.select(entries(5, 6, 7), "/dev/kmsg", 6, saved_boot=None, boot="b1")
    assert [r["seq"] for r in raw["records"]] == [7]
    raw = kmsg.read(fixture("xid-forms.kmsg"), after_seq=25, boot_id="whatever")
    assert [r["seq"] for r in raw["records"]] == [26]


@pytest.mark.parametrize("saved", ["12", 12.0, True, [12]])
def test_damaged_saved_position_reads_everything(saved):
    raw = kmsg.read(fixture("xid-forms.kmsg"), after_seq=saved, boot_id=["not", "a", "str"])
    assert len(raw["records"]) == 27 and raw["after_seq"] is None


def test_first_run_reads_everything_and_reports_no_loss():
    raw = kmsg.select(entries(300, 301), "/dev/kmsg", None, saved_boot=None, boot="b1")
    assert len(raw["records"]) == 2 and raw["lost"] is False


# --- the non-blocking read loop ------------------------------------------------------------


class FakeDevice:
    """Plays /dev/kmsg: one record per read, OSError for EPIPE/EAGAIN as the kernel does."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.reads = 0

    def read(self) -> bytes:
        self.reads += 1
        step = self.script.pop(0)
        if isinstance(step, int):
            raise OSError(step, os.strerror(step))
        return step


def test_read_loop_epipe_then_eagain():
    device = FakeDevice(
        [
            b"6,10,100,-;before the wrap\n",
            errno.EPIPE,  # records 11..19 were overwritten while we read
            b"6,20,200,-;after the wrap\n SUBSYSTEM=pci\n",
            b"4,21,300,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n",
            errno.EAGAIN,
            b"6,22,400,-;never read\n",
        ]
    )
    chunks, epipe = kmsg.read_records(device.read)
    assert epipe is True
    assert len(chunks) == 3 and device.reads == 5
    raw = kmsg.select(
        kmsg.device_entries(chunks), "/dev/kmsg", 10, saved_boot="b", boot="b", epipe=epipe
    )
    assert [r["seq"] for r in raw["records"]] == [20, 21]
    assert raw["records"][0]["msg"] == "after the wrap"
    assert raw["lost"] is True and raw["missed"] == 0  # EPIPE says lost, not how many


def test_read_loop_stops_on_empty_read():
    chunks, epipe = kmsg.read_records(FakeDevice([b"6,1,1,-;a\n", b""]).read)
    assert chunks == [b"6,1,1,-;a\n"] and epipe is False


def test_read_loop_raises_other_errors():
    with pytest.raises(OSError) as info:
        kmsg.read_records(FakeDevice([b"6,1,1,-;a\n", errno.EINVAL]).read)
    assert info.value.errno == errno.EINVAL


def chunks_of(seqs: list) -> list:
    return [f"6,{s},{s * 10},-;record {s}\n K=V\n".encode() for s in seqs]


def test_device_parses_only_the_new_tail(monkeypatch):
    """A full ring before every job: records at or before the saved seq are not parsed."""
    parsed = []
    real = kmsg.kmsg_entry
    monkeypatch.setattr(kmsg, "kmsg_entry", lambda c: parsed.append(c) or real(c))
    entries = kmsg.device_entries(chunks_of(list(range(100, 5100))), after_seq=5096)
    assert [e[0] for e in entries] == [100, 5096, 5097, 5098, 5099]  # oldest, boundary, new
    assert len(parsed) == 5
    raw = kmsg.select(entries, "/dev/kmsg", 5096, saved_boot="b", boot="b")
    assert [r["seq"] for r in raw["records"]] == [5097, 5098, 5099]
    assert raw["first_seq"] == 100 and raw["lost"] is False


def test_device_saved_seq_beyond_the_ring_parses_everything():
    entries = kmsg.device_entries(chunks_of([7, 8, 9]), after_seq=500)
    assert [e[0] for e in entries] == [7, 8, 9]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 5), max_size=30),
    st.integers(0, 200),
    st.one_of(st.none(), st.integers(-1, 260)),
    st.lists(st.integers(0, 40), max_size=3),
)
def test_device_tail_parse_equals_full_parse(steps, start, after, junk):
    """Whatever the saved seq, gaps or malformed records: the same raw dict as parsing all."""
    seqs = [start]
    for step in steps:
        seqs.append(seqs[-1] + step)
    chunks = chunks_of(seqs)
    for index in junk:
        chunks.insert(min(index, len(chunks)), b"garbage without a header\n")
    full = kmsg.select(kmsg.device_entries(chunks), "/dev/kmsg", after, saved_boot="b", boot="b")
    tail = kmsg.select(
        kmsg.device_entries(chunks, after), "/dev/kmsg", after, saved_boot="b", boot="b"
    )
    assert tail == full


@pytest.mark.parametrize(
    "line",
    [
        b"4,2\n",
        b"4,3,12\n",
        b"x,y,z,-;msg\n",
        b"4,,3,-;msg\n",
        b"4,1,2;msg\n",
        b"-4,1,2,-;m\n",
        b"4,1,2,-" + b"-" * 200 + b";too long a header\n",
        b";\n",
        b"",
    ],
)
def test_malformed_headers_are_not_records(line):
    assert kmsg.kmsg_entry(line) is None


def test_device_record_with_escapes_and_extra_header_fields():
    chunk = b"4,7,99,-,caller=T12;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a\\x1bb, x\n K=V\n"
    ((seq, pri, usec, body),) = kmsg.device_entries([chunk])
    assert (seq, pri, usec) == (7, 4, 99)
    assert kmsg.record((seq, pri, usec, body))["msg"].endswith("name=a\\x1bb, x")


@pytest.mark.real
def test_real_dev_kmsg():
    """The real non-blocking path: open, read record by record until EAGAIN."""
    try:
        raw = kmsg.read()
    except OSError as exc:
        conftest.require_real(f"/dev/kmsg not readable here: {exc}")
    seqs = [r["seq"] for r in raw["records"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert raw["boot_id"] == kmsg.boot_id()
    assert all(isinstance(r["usec"], int) and 0 <= r["pri"] <= 7 for r in raw["records"])
    if seqs:
        again = kmsg.read(after_seq=seqs[-1], boot_id=raw["boot_id"])
        assert all(r["seq"] > seqs[-1] for r in again["records"])
        assert again["lost"] is False
        rebooted = kmsg.read(after_seq=seqs[-1], boot_id="a-previous-boot")
        assert [r["seq"] for r in rebooted["records"]][: len(seqs)] == seqs


# --- bad paths and garbage -----------------------------------------------------------------


def test_missing_path_raises_a_clear_oserror():
    with pytest.raises(OSError) as info:
        kmsg.read("/nonexistent/kmsg")
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == "/nonexistent/kmsg"
    assert "cannot read the kernel log" in str(info.value)


def test_directory_raises_oserror():
    with pytest.raises(OSError) as info:
        kmsg.read(FIX)
    assert "cannot read the kernel log" in str(info.value)


def test_garbage_file_never_raises():
    raw = kmsg.read(fixture("non-utf8.kmsg"))
    records = by_seq(raw)
    assert "caf\ufffd\ufffd\ufffd" in records[1]["msg"]  # bad bytes replaced, record kept
    assert all(len(r["msg"]) <= kmsg.MSG_MAX for r in raw["records"])
    assert not any("binary" in r["msg"] for r in raw["records"])  # NUL line skipped
    assert records[11]["msg"].endswith("GPU has fallen off the bus.")  # no final newline
    assert json.loads(json.dumps(raw)) == raw


def test_boot_id_helper(tmp_path):
    path = tmp_path / "boot_id"
    path.write_text("c88c3115-67cf-4ae7-8a58-7766da1ee22f\n")
    assert kmsg.boot_id(str(path)) == "c88c3115-67cf-4ae7-8a58-7766da1ee22f"
    assert kmsg.boot_id(str(tmp_path / "missing")) is None
    path.write_bytes(b"\xff\xfe")
    assert kmsg.boot_id(str(path)) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=20))
def test_any_file_content_never_raises(lines):
    with tempfile.NamedTemporaryFile("wb", suffix=".log") as handle:
        handle.write(b"\n".join(lines))
        handle.flush()
        raw = kmsg.read(handle.name, after_seq=3)
    for rec in raw["records"]:
        assert isinstance(rec["seq"], int) and isinstance(rec["msg"], str)
        assert rec["pri"] is None or 0 <= rec["pri"] <= 7
    json.dumps(raw)


# text a kernel record can hold: no newline, NUL or lone surrogate
LINE_TEXT = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\n\0"), max_size=300
)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**40),
    st.integers(0, 255),
    st.integers(0, 2**50),
    LINE_TEXT,
)
def test_kmsg_record_roundtrip(seq, pri, usec, msg):
    line = f"{pri},{seq},{usec},-;{msg}\n".encode()
    (entry,) = kmsg.device_entries([line])
    want = {"seq": seq, "usec": usec, "pri": pri & 7, "msg": msg.rstrip("\r")}
    if pri >> 3:
        want["facility"] = pri >> 3
    assert kmsg.record(entry) == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"6,1,1,-;a\n", errno.EPIPE, b"6,2,2,-;b\n"]), max_size=12))
def test_read_loop_any_sequence_of_epipe(script):
    chunks, epipe = kmsg.read_records(FakeDevice([*script, errno.EAGAIN]).read)
    assert epipe == (errno.EPIPE in script)
    assert chunks == [s for s in script if isinstance(s, bytes)]


# --- the hot path --------------------------------------------------------------------------


def test_import_pulls_no_heavy_module():
    """`re` brings enum with it; typing, dataclasses and pathlib must not come along."""
    root = conftest.REPO
    code = (
        f"import sys; sys.path.insert(0, {root!r}); import slurmhealth.node.sources.kmsg; "
        "print(sorted({'typing', 'dataclasses', 'pathlib'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-E", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# journalctl -k -o short-precise / short-iso-precise / short-monotonic and dmesg prefixes
PREFIX = st.one_of(
    st.builds(
        lambda d, s, u: f"Nov {d:2d} 12:00:{s:02d}.{u:06d} gpu01 kernel: ",
        st.integers(1, 30),
        st.integers(0, 59),
        st.integers(0, 999999),
    ),
    st.builds(
        lambda s, u: f"2026-11-29T12:00:{s:02d}.{u:06d}+0000 gpu01 kernel: ",
        st.integers(0, 59),
        st.integers(0, 999999),
    ),
    st.builds(
        lambda t, u: f"[{t:5d}.{u:06d}] gpu01 kernel: ",
        st.integers(0, 10**7),
        st.integers(0, 999999),
    ),
    st.builds(lambda t, u: f"[{t:5d}.{u:06d}] ", st.integers(0, 10**7), st.integers(0, 999999)),
    st.just("[Sat Nov 29 12:00:01 2025] "),
)
MESSAGE = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\n\r\0"), max_size=120
).filter(lambda m: m[:1] not in ("[", "<", " ", "\t") and m.strip() == m)


@settings(max_examples=300, deadline=None)
@given(PREFIX, MESSAGE)
def test_every_prefix_is_stripped_exactly(prefix, msg):
    facility, level, usec, text = kmsg.dmesg_fields(prefix + "NVRM: " + msg)
    assert text == "NVRM: " + msg and facility is None and level is None
    assert usec is None or usec >= 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(PREFIX, MESSAGE, st.lists(MESSAGE, max_size=2)), max_size=12))
def test_multi_line_records_join_in_any_form(records):
    """Whatever the form, a record printed over several lines reads back as one message."""
    lines = []
    for prefix, msg, more in records:
        lines.append((prefix + "NVRM: " + msg + "\n").encode())
        lines += [(" " * len(prefix) + m + "\n").encode() for m in more if m]
    with tempfile.NamedTemporaryFile("wb", suffix=".log") as handle:
        handle.write(b"".join(lines))
        handle.flush()
        raw = kmsg.read(handle.name)
    want = [" ".join(["NVRM: " + msg] + [m for m in more if m]) for _, msg, more in records]
    assert [r["msg"] for r in raw["records"]] == want
    json.dumps(raw)


def test_host_nccl_is_the_version_libnccl_so_2_resolves_to(tmp_path):
    """Issue 13: the host's NCCL as NVIDIA's libnccl2 packages install it (`libnccl.so.2` a link
    to `libnccl.so.2.<minor>.<patch>`), from the first library folder that has it; none, or a
    file without its version in its name, is None. Nothing is loaded."""
    first, second, bare = tmp_path / "lib64", tmp_path / "lib", tmp_path / "conda"
    for folder in (first, second, bare):
        folder.mkdir()
    (second / "libnccl.so.2.21.5").write_bytes(b"\x7fELF")
    (second / "libnccl.so.2").symlink_to("libnccl.so.2.21.5")
    assert kmsg.host_nccl((str(first), str(second))) == "2.21.5"
    (first / "libnccl.so.2.18.3").write_bytes(b"\x7fELF")
    (first / "libnccl.so.2").symlink_to(first / "libnccl.so.2.18.3")
    assert kmsg.host_nccl((str(first), str(second))) == "2.18.3"
    (bare / "libnccl.so.2").write_bytes(b"\x7fELF")
    assert kmsg.host_nccl((str(bare), str(second))) is None
    (bare / "libnccl.so.2").unlink()
    (bare / "libnccl.so.2").symlink_to("libnccl.so.2.99.1")  # dangling: the name still says
    assert kmsg.host_nccl((str(bare),)) == "2.99.1"
    assert kmsg.host_nccl((str(tmp_path / "none"),)) is None


def test_only_a_costly_read_of_the_live_log_reads_the_hosts_nccl(tmp_path, monkeypatch):
    """The host's NCCL is read with the live log (a saved file is another machine's) and only
    when the read is costly (the health check, check, snapshot): the job hooks leave it."""
    saved = tmp_path / "dmesg.txt"
    saved.write_text("[    1.0] hello\n")
    monkeypatch.setattr(kmsg, "host_nccl", lambda: "2.21.5")
    assert kmsg.read(str(saved))["nccl"] is None  # a file
    monkeypatch.setattr(kmsg, "_is_char_device", lambda _mode: True)  # as /dev/kmsg
    assert kmsg.read(str(saved))["nccl"] == "2.21.5"
    assert kmsg.read(str(saved), costly=False)["nccl"] is None
    options = kmsg.Options(kmsg=str(saved), costly=False)
    assert kmsg.gather(options)["nccl"] is None
