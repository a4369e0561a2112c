"""node/state.py: the side state and the spool of unrecorded runs, on real files with real owners
and FIFOs. What someone else made where ours should be is never written to, never read back into
the store, and never blocks a run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from conftest import require_real

from slurmhealth.core import files
from slurmhealth.node import state

NOBODY = 65534
ENTRY = {"records": {"run": {"node": "gpu01"}}, "kw": {}}


def need_root() -> None:
    if os.geteuid() != 0:
        require_real("needs root to give files to another owner")


def test_spool_and_take_round_trip_private(tmp_path):
    spool = str(tmp_path / "gpu01.db.unrecorded.ndjson")
    old = os.umask(0)
    try:
        state.spool(spool, ENTRY)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(spool).st_mode) == 0o600
    entries, taken = state.take_spool(spool)
    assert entries == [ENTRY] and len(taken) == 1 and not os.path.exists(spool)


def test_a_spool_someone_else_made_is_never_appended_to_nor_replayed(tmp_path):
    need_root()
    spool = tmp_path / "gpu01.db.unrecorded.ndjson"
    forged = {"records": {"run": {"node": "forged"}}, "kw": {}}
    spool.write_text(json.dumps(forged) + "\n")
    os.chown(spool, NOBODY, NOBODY)
    with pytest.raises(files.Unsafe, match="owned by uid 65534"):
        state.spool(str(spool), ENTRY)
    assert spool.read_text() == json.dumps(forged) + "\n"  # nothing of ours leaked into it
    entries, taken = state.take_spool(str(spool))
    assert entries == [] and taken == []  # left there, unread


def test_a_fifo_where_the_spool_should_be_fails_at_once(tmp_path):
    spool = tmp_path / "gpu01.db.unrecorded.ndjson"
    os.mkfifo(spool)
    code = (
        "import sys; from slurmhealth.node import state\n"
        "try:\n    state.spool(sys.argv[1], {'records': {}})\n"
        "except OSError as exc:\n    print('refused', exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(spool)], capture_output=True, text=True, timeout=20
    )
    assert proc.stdout.startswith("refused"), proc.stderr


def test_a_spool_taken_by_a_live_process_is_left_and_a_dead_ones_is_taken(tmp_path):
    spool = str(tmp_path / "gpu01.db.unrecorded.ndjson")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    line = json.dumps(ENTRY) + "\n"
    (tmp_path / f"gpu01.db.unrecorded.ndjson.{dead}.0.taking").write_text(line)
    (tmp_path / f"gpu01.db.unrecorded.ndjson.{os.getppid()}.0.taking").write_text(line)
    entries, taken = state.take_spool(spool)
    assert entries == [ENTRY] and len(taken) == 1
    assert (tmp_path / f"gpu01.db.unrecorded.ndjson.{os.getppid()}.0.taking").exists()


def test_side_state_someone_else_wrote_is_not_believed(tmp_path):
    need_root()
    path = state.path_for(str(tmp_path), "gpu01")
    state.save(path, {"pending": {"message": "GPU 3 GpuIsLost"}})
    assert state.pending(state.load(path))["message"] == "GPU 3 GpuIsLost"
    os.chown(path, NOBODY, NOBODY)  # as if another user had forged or cleared the fault
    assert state.load(path) == {}


def test_side_state_parents_are_made_private(tmp_path):
    old = os.umask(0)
    try:
        state.save(state.path_for(str(tmp_path / "a" / "b"), "gpu01"), {})
    finally:
        os.umask(old)
    assert [stat.S_IMODE(os.stat(tmp_path / d).st_mode) for d in ("a", "a/b")] == [0o700] * 2
