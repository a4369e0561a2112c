"""The fmlog source: the Fabric Manager's log file read from a host root, in the forms of
tests/fixtures/fmlog (real files, a real FIFO and symlink)."""

from __future__ import annotations

import os
import time

import pytest
from conftest import FIXTURES

from slurmhealth.node.sources import Options, SourceUnavailable, fmlog

FIX = os.path.join(FIXTURES, "fmlog")


def host(tmp_path, log: str | None = "faults.log", path: str = "var/log/fabricmanager.log"):
    if log is not None:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(os.path.join(FIX, log), "rb") as handle:
            target.write_bytes(handle.read())
    options = Options()
    options.host_root = str(tmp_path)
    return options


def config(tmp_path, text: str) -> None:
    where = tmp_path / fmlog.CONFIG
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(text)


def test_records_above_info_are_kept_with_their_offsets_and_lines():
    with open(os.path.join(FIX, "faults.log"), "rb") as handle:
        data = handle.read()
    raw = fmlog.records(data, 0)
    assert [r["line"][:22] for r in raw] == [
        "[Mar 03 2026 02:11:09]", "[Mar 03 2026 02:14:51]", "[Mar 03 2026 02:14:52]",
        "[Mar 03 2026 02:15:30]", "[Mar 03 2026 02:20:05]", "[Mar 03 2026 02:21:00]",
        "[Mar 03 2026 02:22:00]",
    ]
    for record in raw:  # each offset is where its head starts in the file
        assert data[record["offset"]:].startswith(record["line"].encode())
    block = raw[2]
    assert block["more"][:2] == ["moduleId : 5", "nodeId : 1"] and len(block["more"]) == 11
    assert all(not r["more"] for r in raw if r is not block)  # the INFO payloads are dropped


def test_the_default_path_under_the_host_root(tmp_path):
    raw = fmlog.gather(host(tmp_path))
    assert raw["path"] == "/var/log/fabricmanager.log"
    assert raw["start"] == 0 and raw["size"] == os.path.getsize(os.path.join(FIX, "faults.log"))
    assert raw["inode"] == os.stat(tmp_path / "var/log/fabricmanager.log").st_ino
    assert len(raw["records"]) == 7


def test_the_configs_log_file_name_is_followed(tmp_path):
    config(tmp_path, "LOG_LEVEL=4\n# LOG_FILE_NAME=/nowhere\nLOG_FILE_NAME=/srv/fm/fm.log\n")
    options = host(tmp_path, path="srv/fm/fm.log")
    assert fmlog.gather(options)["path"] == "/srv/fm/fm.log"


def test_no_log_or_a_log_to_the_journal_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable, match="no Fabric Manager log at /var/log/fabricmanager"):
        fmlog.gather(host(tmp_path, log=None))
    config(tmp_path, "LOG_FILE_NAME=\n")
    with pytest.raises(SourceUnavailable, match="journal"):
        fmlog.gather(host(tmp_path))


def test_a_fifo_or_a_symlink_at_the_path_is_refused_not_waited_on(tmp_path):
    options = host(tmp_path, log=None)
    where = tmp_path / "var/log/fabricmanager.log"
    where.parent.mkdir(parents=True)
    os.mkfifo(where)
    began = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        fmlog.gather(options)
    assert time.monotonic() - began < 2
    where.unlink()
    where.symlink_to(os.path.join(FIX, "faults.log"))
    with pytest.raises(OSError, match="is a symbolic link: not followed"):
        fmlog.gather(options)


def test_a_line_still_being_written_is_left_for_the_next_run(tmp_path):
    options = host(tmp_path, log="healthy.log")
    log = tmp_path / "var/log/fabricmanager.log"
    whole = log.stat().st_size
    with open(log, "ab") as handle:
        handle.write(b"[Mar 03 2026 02:14:51] [ERR")
    raw = fmlog.gather(options)
    assert raw["size"] == whole and raw["records"] == []
    with open(log, "ab") as handle:
        handle.write(b"OR] [tid 9] detected NVSwitch fatal error 20034 on fid 0\n")
    raw = fmlog.gather(options)
    assert raw["size"] == log.stat().st_size
    assert [r["offset"] for r in raw["records"]] == [whole]  # judged whole, past the baseline


def test_only_the_tail_is_read_and_its_cut_line_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(fmlog, "TAIL_BYTES", 700)
    options = host(tmp_path)
    raw = fmlog.gather(options)
    size = os.path.getsize(tmp_path / "var/log/fabricmanager.log")
    assert raw["start"] == size - 700 and raw["size"] == size
    data = (tmp_path / "var/log/fabricmanager.log").read_bytes()
    assert raw["records"], "the tail holds records"
    for record in raw["records"]:
        assert record["offset"] >= raw["start"]
        assert data[record["offset"]:].startswith(record["line"].encode())
