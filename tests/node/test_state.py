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


HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_taken_spool_its_owner_holds_is_left_and_one_nobody_holds_is_taken(tmp_path):
    """Ownership is the taken file's lock, not a pid (one reused would strand the file while
    another process has that pid): a file whose lock a live process holds is left; one nobody
    holds (its taker was killed) is replayed, before the spool itself."""
    spool = str(tmp_path / "gpu01.db.unrecorded.ndjson")
    held = tmp_path / "gpu01.db.unrecorded.ndjson.01764000000000000000.aaaaaaaa.taking"
    left = tmp_path / "gpu01.db.unrecorded.ndjson.01764000000000000001.bbbbbbbb.taking"
    first = {"records": {"run": {"node": "gpu01", "id": "left"}}, "kw": {}}
    held.write_text(json.dumps(ENTRY) + "\n")
    left.write_text(json.dumps(first) + "\n")
    state.spool(spool, ENTRY)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(held)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        entries, taken = state.take_spool(spool)
        assert entries == [first, ENTRY] and len(taken) == 2 and held.exists()
        state.finish(taken)
        assert sorted(p.name for p in tmp_path.iterdir()) == [held.name]
    finally:
        holder.kill()
        holder.wait()
    entries, taken = state.take_spool(spool)  # its holder is gone: now it is taken
    assert entries == [ENTRY] and taken == [str(held)]
    state.finish(taken)


def test_a_replay_given_back_stays_first_in_line(tmp_path):
    """A replay the store stopped gives its rest back in place, not after newer runs: a
    prolog must never be replayed after its epilog."""
    spool = str(tmp_path / "gpu01.db.unrecorded.ndjson")
    runs = [{"records": {"run": {"node": "gpu01", "id": str(n)}}, "kw": {}} for n in range(4)]
    state.spool(spool, runs[0])
    state.spool(spool, runs[1])
    entries, taken = state.take_spool(spool)
    assert entries == runs[:2]
    state.spool(spool, runs[2])  # a concurrent run spools meanwhile
    state.release(taken, entries[1:])  # the first was recorded, then the store was locked
    state.spool(spool, runs[3])
    entries, taken = state.take_spool(spool)
    assert entries == runs[1:]
    state.finish(taken)
    assert os.listdir(tmp_path) == []


WRITER = (
    "import sys\n"
    "from slurmhealth.node import state\n"
    "for n in range(int(sys.argv[3])):\n"
    "    state.spool(sys.argv[1], {'records': {'run': {'id': sys.argv[2] + '-' + str(n)}}})\n"
)


def test_runs_spooled_while_other_runs_take_the_spool_are_all_replayed_once(tmp_path):
    """Four processes append 150 runs each while this one keeps taking the spool: every run
    is taken exactly once (an append that raced a take lands in the new spool, or in the taken
    file before it is read, never in a file already read)."""
    spool = str(tmp_path / "gpu01.db.unrecorded.ndjson")
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, spool, f"w{w}", "150"]) for w in range(4)
    ]
    seen: list = []
    while any(w.poll() is None for w in writers):
        entries, taken = state.take_spool(spool)
        seen += [e["records"]["run"]["id"] for e in entries]
        state.finish(taken)
    entries, taken = state.take_spool(spool)
    seen += [e["records"]["run"]["id"] for e in entries]
    state.finish(taken)
    assert all(w.returncode == 0 for w in writers)
    assert sorted(seen) == sorted(f"w{w}-{n}" for w in range(4) for n in range(150))


def test_a_side_state_saved_meanwhile_keeps_its_fault_and_its_later_kmsg_position(tmp_path):
    """A slow health check loaded the side state before a prolog found a fault (its drain
    failed: pending) and read the kernel log further: the health check's save must neither
    drop that fault nor move the kernel-log position back (the old Xid would drain again)."""
    path = state.path_for(str(tmp_path), "gpu01")
    state.save(path, {"kmsg": {"seq": 20, "boot_id": "b1"}})
    slow = state.load(path)
    fault = {"message": "GPU 3 GpuIsLost", "since": 1.0, "phase": "prolog"}
    state.save(path, {"kmsg": {"seq": 23, "boot_id": "b1"}, "pending": fault})
    saved = state.update(path, slow, {"kmsg": {"seq": 22, "boot_id": "b1"}})
    assert saved == state.load(path) == {
        "kmsg": {"seq": 23, "boot_id": "b1"},
        "pending": fault,
        "format": state.FORMAT,
    } or saved == {"kmsg": {"seq": 23, "boot_id": "b1"}, "pending": fault}
    assert state.pending(state.load(path)) == fault
    assert state.kmsg_position(state.load(path)) == {"seq": 23, "boot_id": "b1"}
    # a run that knew the fault and acted on it clears it; another boot's position is replaced
    state.update(path, state.load(path), {"kmsg": {"seq": 5, "boot_id": "b2"}})
    assert state.pending(state.load(path)) is None
    assert state.kmsg_position(state.load(path)) == {"seq": 5, "boot_id": "b2"}


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


def test_a_save_killed_before_its_rename_leaves_no_temporary_file_for_good(tmp_path):
    path = state.path_for(str(tmp_path), "gpu01")
    stale = tmp_path / ".gpu01.state.json.0123456789ab.tmp"
    fresh = tmp_path / ".gpu01.state.json.ba9876543210.tmp"  # a save under way right now
    for temp in (stale, fresh):
        temp.write_text("{")
    os.utime(stale, (1, 1))
    state.update(path, {}, {"kmsg": {"seq": 1, "boot_id": "b"}})
    assert not stale.exists() and fresh.exists()
