"""core/files.py: files root writes are private from their first byte and never followed through
a planted symlink; files root reads (spools, env and config files) are checked on the opened
descriptor. Real files, a permissive umask, real owners (root only: chown), real FIFOs.

The end-to-end versions, with a real unprivileged user planting the symlinks and forging the
files, are in tests/fleet/test_collect.py (export, collect), tests/node/test_metrics.py and
tests/test_packaging.py (the hook's env file).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading

import pytest
from conftest import require_real

from slurmhealth.core import files, store

NOBODY = 65534


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def no_fchmod(monkeypatch):
    """os.fchmod does nothing: what is left is the mode the file was created with."""
    monkeypatch.setattr(os, "fchmod", lambda fd, m: None)


def need_root() -> None:
    if os.geteuid() != 0:
        require_real("needs root to give files to another owner")


@pytest.fixture
def victim(tmp_path):
    """A root-owned file a planted symlink points at: it must never change."""
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


# --- writing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("wanted", [0o600, 0o640, 0o644])
def test_write_private_gives_the_mode_whatever_the_umask(tmp_path, wanted):
    for mask in (0o000, 0o022, 0o077):
        target = tmp_path / f"out-{mask:o}"
        with umask(mask):
            files.write_private(str(target), "data\n", mode=wanted)
        assert mode(target) == wanted and target.read_text() == "data\n"


def test_the_mode_is_private_from_the_first_byte(tmp_path, no_fchmod):
    """Even with no chmod at all, under umask 0, the temporary file is never wider than asked:
    it is created with its mode, not opened wide and narrowed later."""
    target = tmp_path / "out"
    with umask(0o000), files.open_private(str(target), mode=0o600) as handle:
        assert mode(_temp(tmp_path)) == 0o600
        assert os.fstat(handle.fileno()).st_size == 0 and not target.exists()
        handle.write("x")
    assert mode(target) == 0o600 and target.read_text() == "x"


def _temp(directory) -> str:
    (name,) = [p for p in os.listdir(directory) if p.endswith(".tmp")]
    return os.path.join(directory, name)


def test_the_temporary_file_is_hidden_random_and_gone_after(tmp_path):
    target = tmp_path / "x.ndjson"
    with files.open_private(str(target)) as handle:
        name = os.path.basename(_temp(tmp_path))
        assert name.startswith(".x.ndjson.") and name.endswith(".tmp")
        assert os.path.samefile(_temp(tmp_path), f"/proc/self/fd/{handle.fileno()}")
    assert os.listdir(tmp_path) == ["x.ndjson"]


def test_a_symlink_at_the_target_is_refused_and_nothing_written(tmp_path, victim):
    target = tmp_path / "out.json"
    target.symlink_to(victim)
    with pytest.raises(files.Unsafe, match="a symlink"):
        files.write_private(str(target), "evil")
    assert victim.read_text() == "precious\n" and os.readlink(target) == str(victim)
    assert sorted(os.listdir(tmp_path)) == ["out.json", "victim"], "no temporary left"


def test_a_symlink_planted_while_writing_is_not_replaced(tmp_path, victim):
    target = tmp_path / "out.json"
    with pytest.raises(files.Unsafe):
        with files.open_private(str(target)) as handle:
            handle.write("data")
            target.symlink_to(victim)
    assert victim.read_text() == "precious\n" and target.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["out.json", "victim"]


def test_symlinks_at_the_old_and_the_drawn_temporary_names_are_never_followed(
    tmp_path, victim, monkeypatch
):
    """`.part` (the old export), the old pid-named metrics temp, and the very name drawn first:
    created exclusively (O_EXCL, O_NOFOLLOW), a taken name is skipped for another one."""
    target = tmp_path / "x.ndjson"
    planted = [
        "x.ndjson.part",
        f".x.ndjson.{os.getpid()}.tmp",
        ".x.ndjson.planted.tmp",
    ]
    for name in planted:
        (tmp_path / name).symlink_to(victim)
    drawn = iter(["planted", "fresh"])
    monkeypatch.setattr(files, "_suffix", lambda: next(drawn))
    files.write_private(str(target), "mine\n")
    assert victim.read_text() == "precious\n"
    assert target.read_text() == "mine\n" and not target.is_symlink()
    assert all(os.readlink(tmp_path / name) == str(victim) for name in planted)


def test_every_name_taken_is_an_error_not_a_follow(tmp_path, victim, monkeypatch):
    monkeypatch.setattr(files, "_suffix", lambda: "planted")
    (tmp_path / ".out.planted.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        files.write_private(str(tmp_path / "out"), "x")
    assert victim.read_text() == "precious\n"


def test_an_error_while_writing_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("old")
    with pytest.raises(RuntimeError), files.open_private(str(target)) as handle:
        handle.write("half")
        raise RuntimeError("bug")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["report.html"]


def test_bytes_and_text_and_fsync(tmp_path):
    files.write_private(str(tmp_path / "b"), b"\x00\xff", sync=True)
    files.write_private(str(tmp_path / "t"), "ü", sync=True)
    assert (tmp_path / "b").read_bytes() == b"\x00\xff"
    assert (tmp_path / "t").read_bytes() == "ü".encode()


def test_keep_mode_keeps_an_admins_mode_but_never_write_for_others(tmp_path):
    published = tmp_path / "report.html"
    published.write_text("old")
    published.chmod(0o644)
    files.write_private(str(published), "new", keep_mode=True)
    assert mode(published) == 0o644 and published.read_text() == "new"
    published.chmod(0o666)
    files.write_private(str(published), "newer", keep_mode=True)
    assert mode(published) == 0o644
    files.write_private(str(tmp_path / "fresh.html"), "x", keep_mode=True)
    assert mode(tmp_path / "fresh.html") == 0o600


def test_keep_mode_ignores_a_file_someone_else_planted(tmp_path):
    need_root()
    planted = tmp_path / "report.html"
    planted.write_text("theirs")
    planted.chmod(0o666)
    os.chown(planted, NOBODY, NOBODY)
    files.write_private(str(planted), "ours", keep_mode=True)
    assert mode(planted) == 0o600 and os.stat(planted).st_uid == 0


# --- creating: a new store, a state directory ----------------------------------------------------


def test_create_private_is_exclusive_with_its_mode_from_the_first_byte(tmp_path, no_fchmod):
    path = tmp_path / "node.db"
    with umask(0o000):
        assert files.create_private(str(path), 0o640) is True
        assert files.create_private(str(path), 0o640) is False
    assert mode(path) == 0o640 and path.stat().st_size == 0


def test_create_private_refuses_a_symlink_someone_else_planted(tmp_path, victim):
    need_root()
    planted = tmp_path / "node.db"
    planted.symlink_to(tmp_path / "nowhere")  # dangling: O_CREAT would have made its target
    os.lchown(planted, NOBODY, NOBODY)
    with pytest.raises(files.Unsafe, match="a symlink made by uid 65534"):
        files.create_private(str(planted))
    assert not (tmp_path / "nowhere").exists()


def test_private_dir_is_0700_from_the_start_parents_too_and_leaves_an_existing_one(
    tmp_path, no_fchmod
):
    deep = tmp_path / "a" / "b" / "state"
    with umask(0o000):
        files.private_dir(str(deep))
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/state")] == [0o700] * 3
    existing = tmp_path / "admins"
    existing.mkdir()
    existing.chmod(0o755)
    files.private_dir(str(existing))
    assert mode(existing) == 0o755


def test_private_dir_sets_exactly_0700_under_a_narrow_umask(tmp_path):
    with umask(0o277):
        files.private_dir(str(tmp_path / "state"))
    assert mode(tmp_path / "state") == 0o700


def test_a_new_store_its_directory_and_its_wal_and_shm_are_private_from_the_start(
    tmp_path, monkeypatch, no_fchmod
):
    """Under umask 0, with chmod and fchmod switched off: the store file is created 0640 and
    SQLite gives -wal and -shm the file's mode (it copies it; nothing here widens it)."""
    chmods = []
    monkeypatch.setattr(os, "chmod", lambda *a, **k: chmods.append(a))
    db = tmp_path / "state" / "sub" / "gpu01.db"
    with umask(0o000):
        conn = store.connect(str(db))
        conn.execute("INSERT INTO meta VALUES ('k', '1')")
    assert {mode(db.parent), mode(db.parent.parent)} == {0o700}
    for name in ("gpu01.db", "gpu01.db-wal", "gpu01.db-shm"):
        assert mode(db.parent / name) == 0o640, name
    assert chmods == [], "no chmod after the fact"
    conn.close()


def test_the_fleet_store_is_private_too(tmp_path):
    fleet = tmp_path / "head" / "fleet.db"
    with umask(0o000):
        store.connect(str(fleet)).close()
    assert (mode(fleet.parent), mode(fleet)) == (0o700, 0o640)


def test_an_existing_state_directory_keeps_its_mode(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    store.connect(str(state / "gpu01.db")).close()
    assert mode(state) == 0o755 and mode(state / "gpu01.db") == 0o640


def test_a_store_name_someone_else_symlinked_is_refused(tmp_path):
    need_root()
    planted = tmp_path / "gpu01.db"
    planted.symlink_to(tmp_path / "elsewhere.db")
    os.lchown(planted, NOBODY, NOBODY)
    with pytest.raises(store.StoreError, match="a symlink made by"):
        store.connect(str(planted))
    assert not (tmp_path / "elsewhere.db").exists()


def test_a_directory_on_the_way_that_someone_else_symlinked_is_never_followed(tmp_path, victim):
    """Item: root writes a report into a folder whose path runs through a symlink another user
    made (their own folder, or a name in a shared one): refused, nothing lands at its target."""
    need_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "out").symlink_to(victim.parent)  # -> a root folder holding `victim`
    os.lchown(theirs / "out", NOBODY, NOBODY)
    for write in (
        lambda p: files.write_private(p, "report\n"),
        lambda p: files.create_private(p),
    ):
        with pytest.raises(files.Unsafe, match="out is a symlink made by uid 65534"):
            write(str(theirs / "out" / "victim"))
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in victim.parent.iterdir()) == ["theirs", "victim"]


def test_a_root_symlink_someone_else_could_replace_is_not_followed_either(tmp_path):
    need_root()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone may swap the link for their own
    (tmp_path / "real").mkdir()
    (shared / "link").symlink_to(tmp_path / "real")
    with pytest.raises(files.Unsafe, match="link is a symlink in a directory others can change"):
        files.write_private(str(shared / "link" / "report.html"), "x")


def test_a_device_or_fifo_at_the_target_is_refused_never_replaced(tmp_path):
    """`report -o /dev/null` as root used to rename a regular file over the system's
    /dev/null: a target that is there and is not a regular file is refused."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    targets = [fifo]
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(tmp_path / "null")
    for target in targets:
        with pytest.raises(files.Unsafe, match="not a regular file: not replaced"):
            files.write_private(str(target), "x")
        assert not stat.S_ISREG(os.lstat(target).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(t.name for t in targets)


def test_an_admins_own_symlinks_are_followed(tmp_path):
    """A root folder linked elsewhere by root (/var/lib/slurmhealth -> /data/...), relative and
    absolute, and /tmp's sticky folder: all fine."""
    (tmp_path / "data" / "reports").mkdir(parents=True)
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "rel").symlink_to("../data/reports")
    (tmp_path / "var" / "abs").symlink_to(tmp_path / "data")
    files.write_private(str(tmp_path / "var" / "rel" / "a.html"), "a")
    files.write_private(str(tmp_path / "var" / "abs" / "reports" / "b.html"), "b")
    assert sorted(p.name for p in (tmp_path / "data" / "reports").iterdir()) == ["a.html", "b.html"]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OSError):
        files.write_private(str(loop / "c"), "c")


def test_create_private_refuses_a_file_someone_else_made_or_may_write(tmp_path):
    need_root()
    theirs = tmp_path / "gpu01.db"
    theirs.write_bytes(b"")
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(files.Unsafe, match="owned by uid 65534"):
        files.create_private(str(theirs))
    open_to_all = tmp_path / "gpu02.db"
    open_to_all.write_bytes(b"")
    open_to_all.chmod(0o666)
    with pytest.raises(files.Unsafe, match="writable by group or others"):
        files.create_private(str(open_to_all))


def test_a_store_others_may_change_is_refused_with_one_line(tmp_path):
    """SQLite opens the store, its -wal and -shm by name: in a folder someone else may write, a
    name can be swapped between our checks and SQLite's open, and files they made there are
    theirs to read. Refused, whatever exists there yet."""
    need_root()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o1777)  # sticky or not: anyone may add -wal and -shm
    with pytest.raises(store.StoreError, match="refused: .*open is writable by group or others"):
        store.connect(str(open_dir / "gpu01.db"))
    assert list(open_dir.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "gpu01.db-wal").write_bytes(b"")
    os.chown(mine / "gpu01.db-wal", NOBODY, NOBODY)
    with pytest.raises(store.StoreError, match="gpu01.db-wal: owned by uid 65534"):
        store.connect(str(mine / "gpu01.db"))


# --- reading: open_trusted (collect) -----------------------------------------------------------


def test_open_trusted_reads_a_root_file(tmp_path):
    path = tmp_path / "gpu01.ndjson"
    path.write_text("{}\n")
    path.chmod(0o644)
    fd = files.open_trusted(str(path))
    assert os.get_blocking(fd), "O_NONBLOCK (against FIFOs) is cleared again"
    with os.fdopen(fd, "rb") as handle:
        assert handle.read() == b"{}\n"


def test_open_trusted_refuses_a_symlink_even_to_a_good_file(tmp_path):
    good = tmp_path / "good.ndjson"
    good.write_text("{}\n")
    (tmp_path / "link.ndjson").symlink_to(good)
    with pytest.raises(files.Unsafe) as caught:
        files.open_trusted(str(tmp_path / "link.ndjson"))
    assert caught.value.strerror == "a symlink"
    assert str(caught.value) == f"{tmp_path / 'link.ndjson'}: a symlink"


def test_open_trusted_refuses_a_fifo_at_once_instead_of_blocking(tmp_path):
    fifo = tmp_path / "gpu01.ndjson"
    os.mkfifo(fifo)
    outcome = []

    def attempt():
        try:
            files.open_trusted(str(fifo))
        except files.Unsafe as exc:
            outcome.append(exc.strerror)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10)
    assert outcome == ["not a regular file"]


def test_open_trusted_refuses_group_or_world_writable(tmp_path):
    path = tmp_path / "gpu01.ndjson"
    path.write_text("{}\n")
    for bits in (0o666, 0o620, 0o602):
        path.chmod(bits)
        with pytest.raises(files.Unsafe, match=f"writable by group or others \\(mode 0{bits:o}\\)"):
            files.open_trusted(str(path))


def test_open_trusted_refuses_another_owner_unless_named(tmp_path):
    need_root()
    path = tmp_path / "gpu01.ndjson"
    path.write_text("{}\n")
    path.chmod(0o644)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(files.Unsafe, match=f"owned by uid {NOBODY}"):
        files.open_trusted(str(path))
    os.close(files.open_trusted(str(path), owners=(NOBODY,)))


def test_the_check_is_on_the_opened_file_not_on_the_name(tmp_path):
    """What is read is what was checked: swapping the name afterwards changes nothing."""
    path = tmp_path / "gpu01.ndjson"
    path.write_text("checked\n")
    fd = files.open_trusted(str(path))
    os.rename(path, tmp_path / "moved")
    path.write_text("swapped in\n")
    with os.fdopen(fd, "rb") as handle:
        assert handle.read() == b"checked\n"


def test_others_may_write(tmp_path):
    assert files.others_may_write(str(tmp_path)) is None
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o1777)
    assert "writable by group or others (mode 1777)" in files.others_may_write(str(spool))
    spool.chmod(0o755)
    assert files.others_may_write(str(spool)) is None


# --- trusted(): env and config files ------------------------------------------------------------


def test_trusted_accepts_a_root_file_in_a_root_directory(tmp_path):
    path = tmp_path / "slurmhealth.toml"
    path.write_text("")
    path.chmod(0o644)
    assert files.trusted(str(path)) is None
    assert files.trusted(str(tmp_path / "missing.toml")) is None, "missing: opening it says so"


def test_trusted_refuses_a_symlink_a_writable_file_or_directory(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text("")
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert files.trusted(str(link)) == "a symlink"
    real.chmod(0o666)
    assert files.trusted(str(real)) == "writable by group or others (mode 0666)"
    real.chmod(0o644)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "c.toml").write_text("")
    shared.chmod(0o777)
    assert files.trusted(str(shared / "c.toml")) == (
        f"in a directory others can change: {shared} is writable by group or others (mode 0777)"
    )
    shared.chmod(0o1777)  # sticky (/tmp): no one else can replace root's file in it
    assert files.trusted(str(shared / "c.toml")) is None


def test_trusted_refuses_a_file_or_directory_of_another_owner(tmp_path):
    need_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "c.toml").write_text("")
    os.chown(theirs, NOBODY, NOBODY)
    assert f"{theirs} is owned by uid {NOBODY}" in files.trusted(str(theirs / "c.toml"))
    mine = tmp_path / "c.toml"
    mine.write_text("")
    os.chown(mine, NOBODY, NOBODY)
    assert files.trusted(str(mine)).startswith(f"owned by uid {NOBODY}")
    assert files.trusted(str(mine), owners=(NOBODY,)) is None


def test_files_stays_import_light():
    """The prolog imports it (the store, the metrics): stdlib os, stat and errno only."""
    import json
    import subprocess
    import sys

    code = (
        "import sys, json; before = set(sys.modules); import slurmhealth.core.files; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    added = set(json.loads(out.stdout)) - {"slurmhealth", "slurmhealth.core"}
    assert added == {"slurmhealth.core.files"}, added
