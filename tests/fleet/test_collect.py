"""fleet/collect.py: spools and node stores merged into the fleet store, and the spool's trust
model (real SQLite files, real processes, a real unprivileged user)."""

from __future__ import annotations

import json
import os
import pathlib
import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import REPO, require_real, run_cli, tmpfs
from stores import (
    DAY,
    HOLD_LOCK,
    KEYS,
    T0,
    add_run,
    dump,
    export_cycle,
    export_text,
    moved_in,
    node_store,
    run_ids,
    spool_ids,
)

from slurmhealth.core import command, store
from slurmhealth.fleet import collect, records

# --- collect --------------------------------------------------------------------------------


def test_a_merged_store_brings_no_row_an_import_would_refuse(tmp_path):
    """The same checks as an NDJSON line's for a node store merged whole: a node name no node
    can have (a node set would reach `scontrol` as 64 nodes; a terminal escape or a bidi
    override would reach the admin's screen), a string where a time belongs. The store's good
    rows come in."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node_store(str(spool / "gpu01.db"), "gpu01").close()
    with sqlite3.connect(spool / "gpu01.db") as raw:
        for i, name in enumerate(["gpu[01-64]", "gpu01\x1b[2J", "gpu\u202e10", "-gpu01"]):
            raw.execute(
                f"INSERT INTO actions SELECT 'x1{i}', ?, time, action, reason, actor, ok, "
                "detail FROM actions LIMIT 1",
                (name,),
            )
            raw.execute(
                f"INSERT INTO events SELECT 'e{i}' || id, run_id, ?, job_id, time, kind, code, "
                "gpu, bus_id, pid, process, class, action, text, repeats FROM events LIMIT 1",
                (name,),
            )
        raw.execute(
            "INSERT INTO runs (id, node, job_id, phase, started, duration, verdict, tool_version,"
            " sources) VALUES ('x2', 'gpu01', NULL, 'check', 'yesterday', 1, 'ok', '0', '{}')"
        )
    conn = store.connect(str(tmp_path / "fleet.db"))
    collect.collect(conn, str(spool))
    for table in ("actions", "events"):
        assert {r[0] for r in conn.execute(f"SELECT node FROM {table}")} == {"gpu01"}  # noqa: S608
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] > 0
    ids = {r[0] for r in conn.execute("SELECT id FROM runs")}
    assert ids and "x2" not in ids


def test_collect_merges_node_stores_and_spools_and_skips_garbage(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    a = node_store(str(spool / "gpu01.db"), "gpu01")
    b = node_store(str(spool / "gpu02.db"), "gpu02")
    c = node_store(str(tmp_path / "gpu03.db"), "gpu03")
    (spool / "gpu03.ndjson").write_text(export_text(c))
    (spool / "garbage.db").write_bytes(b"this is not an SQLite file, just bytes " * 200)
    (spool / "gpu04.ndjson.part").write_text("{")  # an export still being written: not read
    fleet_path = str(spool / "fleet.db")  # the fleet store in the same folder is not a source
    conn = store.connect(fleet_path)
    report = collect.collect(conn, str(spool))
    assert [os.path.basename(p) for p, _ in report["merged"]] == [
        "gpu01.db",
        "gpu02.db",
        "gpu03.ndjson",
    ]
    assert [(os.path.basename(p), why) for p, why in report["skipped"]] == [
        ("garbage.db", "file is not a database")
    ]
    expected = {t: sorted(dump(a)[t] + dump(b)[t] + dump(c)[t]) for t in KEYS}
    assert {t: sorted(rows) for t, rows in dump(conn).items()} == expected
    again = collect.collect(conn, str(spool))
    assert sum(again["added"].values()) == 0 and len(again["skipped"]) == 1


def test_the_collect_command_runs_without_click_and_says_each_step(tmp_path):
    """collect.run, as `slurmhealth collect` calls it, with a console of lists: the skipped
    file on standard error, the merge line on standard output; a bad --rollup-after is said as
    the option's error once the files are merged."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node_store(str(spool / "gpu01.db"), "gpu01")
    (spool / "garbage.db").write_bytes(b"this is not an SQLite file, just bytes " * 200)
    out: list = []
    err: list = []
    console = command.Console(out.append, err.append, out.append)
    conn = store.connect(str(tmp_path / "fleet.db"))
    now = time.time()
    collect.run(conn, "fleet.db", collect.Request(str(spool), now - 86400 * 28, now), console)
    assert err == [f"{spool / 'garbage.db'}: skipped: file is not a database"]
    assert len(out) == 1 and out[0].startswith("1 file merged, 1 skipped: ")
    late = collect.Request(str(spool), now - 86400 * 28, now, rollup_after="soon")
    with pytest.raises(command.CommandError) as raised:
        collect.run(conn, "fleet.db", late, console)
    assert raised.value.option == "--rollup-after"
    assert out[-1] == "1 file merged, 1 skipped: nothing new added"  # merged before it


def test_a_store_still_being_copied_is_skipped(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    conn = node_store(str(tmp_path / "gpu01.db"), "gpu01")
    conn.executemany(
        "INSERT INTO runs VALUES (?, 'gpu01', NULL, 'check', 1.0, 1, 'ok', 'v', ?)",
        [(f"x{i}", "{}" * 200) for i in range(300)],
    )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = (tmp_path / "gpu01.db").read_bytes()
    for share in (0.3, 0.6, 0.99):  # an scp or rsync --inplace not finished yet
        (spool / f"copy{share}.db").write_bytes(data[: int(len(data) * share)])
    fleet_conn = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(fleet_conn, str(spool))
    assert report["merged"] == [] and len(report["skipped"]) == 3
    assert all("malformed" in why or "damaged" in why for _, why in report["skipped"])
    assert fleet_conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_collect_reads_an_older_schema_and_refuses_a_newer_one(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    old = sqlite3.connect(str(spool / "v1.db"), isolation_level=None)
    for statement in store.migration(1):
        old.execute(statement)
    old.execute("INSERT INTO jobs (node, job_id, uid, start) VALUES ('gpu09', '5', 0, ?)", (T0,))
    old.execute("PRAGMA user_version = 1")
    old.close()
    new = store.connect(str(spool / "v99.db"))
    new.execute("PRAGMA user_version = 99")
    new.close()
    conn = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(conn, str(spool))
    assert conn.execute("SELECT node, job_id, num_nodes FROM jobs").fetchall() == [
        ("gpu09", "5", None)
    ]
    assert len(report["skipped"]) == 1 and "newer" in report["skipped"][0][1]


WRITER = """
import sys, time
from slurmhealth.core import store
conn = store.connect(sys.argv[1])
print("ready", flush=True)
for i in range(int(sys.argv[2])):
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO runs VALUES (?, 'gpu01', ?, 'prolog', ?, 0.1, 'fail', 'v', '{}')",
                 (f"r{i}", str(i), 1000.0 + i))
    conn.execute("INSERT INTO results VALUES (?, 'gpu.ecc', 'fail', 'm', 'reset_gpu', '{}', 0)",
                 (f"r{i}",))
    conn.execute("INSERT INTO jobs (node, job_id, start, state) VALUES ('gpu01', ?, ?, 'running')",
                 (str(i), 1000.0 + i))
    conn.execute("COMMIT")
    time.sleep(0.001)
"""


def test_collect_while_a_node_store_is_written_is_consistent(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node_db = str(spool / "gpu01.db")
    store.connect(node_db).close()
    total = 1500
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, node_db, str(total)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "ready"
    conn = store.connect(str(tmp_path / "fleet.db"))
    during = []
    while writer.poll() is None:
        report = collect.collect(conn, str(spool))
        assert report["skipped"] == []
        counts = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in KEYS]
        runs, results, events, jobs, actions, _counters = counts
        assert runs == results == jobs and events == actions == 0  # whole transactions only
        during.append(runs)
    assert writer.wait() == 0
    collect.collect(conn, str(spool))
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == total
    assert dump(conn) == dump(store.connect(node_db))
    assert any(0 < n < total for n in during), during  # some collects ran mid-write


# --- the commands -----------------------------------------------------------------------------


def test_export_import_collect_commands(tmp_path):
    node_db = str(tmp_path / "gpu01.db")
    node_store(node_db, "gpu01").close()
    spool = tmp_path / "spool"
    spool.mkdir()
    out = spool / "gpu01.ndjson"
    exported = run_cli("export", "--db", node_db, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    assert f"{out}: " in exported.stdout and not (spool / "gpu01.ndjson.part").exists()
    env = {"SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db")}
    first = run_cli("import", str(out), env=env)
    assert first.returncode == 0 and "0 unchanged" in first.stdout, first.stderr
    again = run_cli("import", str(out), env=env)
    assert "nothing new added" in again.stdout
    with open(out, "a") as handle:
        handle.write('{"type": "run", "id": "cut')
    collected = run_cli("collect", str(spool), "--since", "3650d", env=env)
    assert collected.returncode == 0 and "1 file merged, 0 skipped" in collected.stdout
    assert "truncated last line" in collected.stderr
    stdout = run_cli("export", "--db", node_db, "--since", "7d", "--now", str(T0 + DAY))
    assert json.loads(stdout.stdout.splitlines()[0])["type"] == "header"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["import", "/nonexistent.ndjson"], "/nonexistent.ndjson: [Errno 2]"),
        (["collect", "/nonexistent"], "/nonexistent: not a directory"),
        (["export", "--db", "/nonexistent.db"], "no store at /nonexistent.db"),
        (["collect", ".", "--since", "forever"], "not a duration"),
    ],
)
def test_user_errors_are_one_line(tmp_path, args, message):
    proc = run_cli(*args, env={"SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db")})
    assert proc.returncode != 0 and message in proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "Error" in line]
    assert len(errors) == 1, proc.stderr


# --- the spool's trust model (docs/fleet.md): a real unprivileged user plants and forges --------


@pytest.fixture
def user():
    """A real unprivileged account (useradd), gone again after the test; root only."""
    if os.geteuid() != 0:
        require_real("needs root to create a user and to act as root against it")
    tools = [shutil.which(t) for t in ("useradd", "userdel", "runuser")]
    if None in tools:
        require_real("useradd, userdel and runuser are needed (passwd, util-linux)")
    name = f"shtest-{os.urandom(3).hex()}"
    subprocess.run(
        [tools[0], "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run([tools[1], name], check=False, capture_output=True)


def as_user(user, *argv: str, stdin: str | None = None) -> None:
    """Run argv as `user` (runuser: a real setuid to the account, nothing of root's kept)."""
    done = subprocess.run(
        ["runuser", "-u", user.pw_name, "--", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def shared():
    """A directory every user can reach (tmp_path's parents are root's alone), removed after."""
    base = tempfile.mkdtemp(prefix="slurmhealth-shared-")
    os.chmod(base, 0o755)
    yield pathlib.Path(base)
    shutil.rmtree(base, ignore_errors=True)


def a_spool(shared, mode: int = 0o1777) -> pathlib.Path:
    spool = shared / "spool"
    spool.mkdir()
    spool.chmod(mode)  # the shared spool every node's root writes (sticky, like /tmp)
    return spool


@pytest.mark.parametrize("spool_mode", [0o1777, 0o777], ids=["sticky", "world-writable"])
def test_export_never_follows_a_users_symlink_and_is_private(shared, user, spool_mode):
    victim = shared / "victim"  # a root-owned file the user cannot write
    victim.write_text("precious\n")
    spool = a_spool(shared, spool_mode)
    node_db = str(shared / "gpu07.db")
    node_store(node_db, "gpu07").close()
    out = spool / "gpu07.ndjson"
    as_user(user, "ln", "-s", str(victim), f"{out}.part")  # where the export used to write first
    old = os.umask(0)  # not cron's 022: the mode is the export's own, whatever the umask
    try:
        done = run_cli("export", "--db", node_db, "-o", str(out))
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert '"node":"gpu07"' in out.read_text()
    # A symlink at the target itself: refused in one line, nothing written through it or over it.
    other = spool / "gpu08.ndjson"
    as_user(user, "ln", "-s", str(victim), str(other))
    done = run_cli("export", "--db", node_db, "-o", str(other))
    assert done.returncode == 1 and f"{other}: a symlink" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert victim.read_text() == "precious\n" and os.readlink(other) == str(victim)
    assert not [n for n in os.listdir(spool) if n.endswith(".tmp")], "no temporary left"


def test_collect_refuses_what_a_user_could_have_forged_and_says_which(shared, user):
    spool = a_spool(shared)
    node_store(str(shared / "gpu01.db"), "gpu01").close()
    exported = run_cli(
        "export", "--db", str(shared / "gpu01.db"), "-o", str(spool / "gpu01.ndjson")
    )
    assert exported.returncode == 0, exported.stderr
    moved_in(spool, "gpu03.db", "gpu03")  # root's store in the shared spool
    moved_in(spool, "gpu02.db", "gpu02")
    forged = export_text(node_store(str(shared / "forge.db"), "gpu66"))  # drains, failed runs
    (shared / "forge.db").chmod(0o644)
    # What the user can do in a sticky spool: write files, link, make FIFOs, add a -wal beside
    # root's store (SQLite would replay its frames).
    as_user(user, "sh", "-c", f"cat > {spool}/gpu66.ndjson", stdin=forged)
    as_user(user, "ln", "-s", str(spool / "gpu01.ndjson"), str(spool / "gpu67.ndjson"))
    as_user(user, "mkfifo", str(spool / "gpu68.ndjson"))
    as_user(user, "cp", str(shared / "forge.db"), str(spool / "gpu69.db"))
    as_user(user, "sh", "-c", f"echo junk > {spool}/gpu02.db-wal")
    (spool / "gpu70.ndjson").write_text(forged.replace("gpu66", "gpu70"))
    (spool / "gpu70.ndjson").chmod(0o666)  # root's, but anyone may have rewritten it
    fleet = str(shared / "fleet.db")
    done = run_cli("collect", str(spool), "--db", fleet, "--since", "3650d", timeout=60)
    assert done.returncode == 0, done.stderr
    skipped = dict(
        line.split(": skipped: ") for line in done.stderr.splitlines() if ": skipped: " in line
    )
    who = f"uid {user.pw_uid} ({user.pw_name})"
    assert skipped == {
        f"{spool}/gpu02.db": f"its gpu02.db-wal is owned by {who}, not root",
        f"{spool}/gpu69.db": f"owned by {who}, not root",
        f"{spool}/gpu66.ndjson": f"owned by {who}, not root",
        f"{spool}/gpu67.ndjson": "a symlink",
        f"{spool}/gpu68.ndjson": "not a regular file",
        f"{spool}/gpu70.ndjson": "writable by group or others (mode 0666)",
    }, done.stderr
    assert "2 files merged, 6 skipped" in done.stdout
    conn = sqlite3.connect(fleet)
    assert {r[0] for r in conn.execute("SELECT DISTINCT node FROM runs")} == {"gpu01", "gpu03"}
    assert {r[0] for r in conn.execute("SELECT DISTINCT node FROM actions")} == {"gpu01", "gpu03"}


def test_a_store_in_a_shared_spool_is_read_from_a_private_copy(shared, monkeypatch):
    """SQLite never opens a name in a directory others can write (a -wal could appear there
    between the check and the open): it reads a copy made through the checked descriptors."""
    spool = a_spool(shared)
    moved_in(spool, "gpu03.db", "gpu03")
    live = moved_in(spool, "gpu04.db", "gpu04", live=True)  # open: its records are in its -wal
    store.record_action(live, "gpu04", "drain", "only in the wal", "test")
    assert os.path.getsize(spool / "gpu04.db-wal") > 0
    opened = []
    real = collect._checked_copy
    monkeypatch.setattr(
        collect, "_checked_copy", lambda src, copy: (opened.append(src), real(src, copy))
    )
    conn = store.connect(str(shared / "fleet.db"))
    report = collect.collect(conn, str(spool))
    assert [os.path.basename(p) for p, _ in report["merged"]] == ["gpu03.db", "gpu04.db"]
    assert len(opened) == 2 and not [p for p in opened if p.startswith(str(spool))], opened
    reasons = conn.execute("SELECT reason FROM actions WHERE node = 'gpu04'").fetchall()
    assert ("only in the wal",) in reasons, "the -wal was copied too"
    spool.chmod(0o755)  # root's alone: the store is read in place, under SQLite's locking
    opened.clear()
    collect.collect(conn, str(spool))
    assert opened == [str(spool / "gpu03.db"), str(spool / "gpu04.db")]
    live.close()


def test_spool_owner_trusts_the_files_of_a_named_user(shared, user):
    spool = a_spool(shared)
    forged = export_text(node_store(str(shared / "n.db"), "gpu66"))
    as_user(user, "sh", "-c", f"umask 022; cat > {spool}/gpu66.ndjson", stdin=forged)
    fleet = str(shared / "fleet.db")
    args = ("collect", str(spool), "--db", fleet, "--since", "3650d")
    refused = run_cli(*args)
    assert "0 files merged, 1 skipped" in refused.stdout, refused.stderr
    named = run_cli(*args, "--spool-owner", user.pw_name)
    assert "1 file merged, 0 skipped" in named.stdout, named.stderr
    by_env = run_cli(*args, "--full", env={"SLURMHEALTH_SPOOL_OWNER": str(user.pw_uid)})
    assert "1 file merged, 0 skipped" in by_env.stdout, by_env.stderr
    unknown = run_cli(*args, "--spool-owner", "no-such-user-here")
    assert unknown.returncode == 2 and "no user no-such-user-here" in unknown.stderr


def test_collect_reads_a_store_from_its_watermark_less_the_overlap(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(spool / "gpu01.db"))
    add_run(node, "first", T0)
    add_run(node, "newest", T0 + 300)
    fleet = store.connect(str(tmp_path / "fleet.db"))
    collect.collect(fleet, str(spool))
    assert fleet.execute("SELECT source, mark FROM watermarks").fetchall() == [
        (str(spool / "gpu01.db"), T0 + 300)
    ]
    # Committed after that collect: one dated within the overlap (a run still running then),
    # one older than it (the watermark says it was read), one new.
    add_run(node, "late", T0 + 300 - records.OVERLAP + 1)
    add_run(node, "before-the-overlap", T0 + 300 - records.OVERLAP - 1)
    add_run(node, "new", T0 + 600)
    report = collect.collect(fleet, str(spool))
    assert report["added"]["run"] == 2
    assert run_ids(fleet) == {"first", "newest", "late", "new"}
    collect.collect(fleet, str(spool), full=True)  # --full: all of --since again
    assert run_ids(fleet) == run_ids(node)


def test_an_xid_the_epilog_attributes_after_the_watermark_still_travels(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(spool / "gpu01.db"))
    add_run(node, "hc", T0)
    event = {"id": "xid:gpu01:b:1:79", "run_id": "hc", "node": "gpu01", "time": T0}
    node.execute(store.insert_sql("events"), store.row("events", {**event, "kind": "xid"}))
    node.execute("INSERT INTO jobs (node, job_id, start) VALUES ('gpu01', '41', ?)", (T0 - 60,))
    fleet = store.connect(str(tmp_path / "fleet.db"))
    collect.collect(fleet, str(spool))
    add_run(node, "epilog", T0 + DAY)  # the job ends a day later: its epilog claims the Xid
    node.execute("UPDATE jobs SET end = ? WHERE job_id = '41'", (T0 + DAY,))
    assert store.attribute_events(node, "gpu01", "41", None) == 1
    collect.collect(fleet, str(spool))
    assert fleet.execute("SELECT job_id FROM events").fetchall() == [("41",)]


def test_an_export_carries_what_is_new_and_a_lost_collect_loses_nothing(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(tmp_path / "gpu01.db"))
    target = str(spool / "gpu01.ndjson")
    fleet = store.connect(str(tmp_path / "fleet.db"))
    add_run(node, "a", T0 - 1000)
    assert export_cycle(node, target, T0)["run"] == 1
    collect.collect(fleet, str(spool), consume=True)
    assert os.listdir(spool) == []  # merged, then removed
    add_run(node, "b", T0 + 1000)
    export_cycle(node, target, T0 + 1001)
    assert spool_ids(target) == {"b"}  # only what is new (the overlap reaches back 120 s)
    # The collect of this cycle never comes; the next export replaces the file unread...
    add_run(node, "c", T0 + 1500)
    export_cycle(node, target, T0 + 2001)
    assert spool_ids(target) == {"b", "c"}  # ...so it starts where the unread one did
    report = collect.collect(fleet, str(spool), consume=True)
    assert report["added"]["run"] == 2 and report["skipped"] == []
    assert run_ids(fleet) == {"a", "b", "c"} and os.listdir(spool) == []
    add_run(node, "d", T0 + 3000)
    export_cycle(node, target, T0 + 3001)
    assert spool_ids(target) == {"d"}


def test_a_refused_spool_goes_back_under_its_name_and_nothing_piles_up(tmp_path):
    """A node upgraded before the head node exports a newer record format, which collect
    --consume refuses: the file goes back under its own name, so the node's next export finds
    it unread, starts where it did and replaces it. Each run left another claimed copy (one
    more file per node every five minutes); once the head node reads the format, nothing was
    lost."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(tmp_path / "gpu01.db"))
    target = str(spool / "gpu01.ndjson")
    fleet = store.connect(str(tmp_path / "fleet.db"))

    def newer() -> None:  # the header of a later format, rewritten in place (same file)
        with open(target, "r+", encoding="utf-8") as handle:
            text = handle.read()
            handle.seek(0)
            handle.write(text.replace(f'"format":{records.FORMAT}', '"format":9', 1))

    add_run(node, "a", T0)
    export_cycle(node, target, T0 + 1)
    newer()
    for n, run_id in enumerate(("b", "c")):
        report = collect.collect(fleet, str(spool), consume=True)
        assert [p for p, _ in report["skipped"]] == [target], report["skipped"]
        assert os.listdir(spool) == ["gpu01.ndjson"]
        add_run(node, run_id, T0 + 1000 * (n + 1))
        export_cycle(node, target, T0 + 1000 * (n + 1) + 1)
        newer()
    assert spool_ids(target) == {"a", "b", "c"} and run_ids(fleet) == set()
    export_cycle(node, target, T0 + 5000)  # the head node upgraded: the format it reads
    report = collect.collect(fleet, str(spool), consume=True)
    assert report["skipped"] == [] and run_ids(fleet) == {"a", "b", "c"}
    assert os.listdir(spool) == []


def test_a_spool_still_being_copied_in_place_is_kept_until_it_is_whole(tmp_path):
    """A spool copied in place (scp, cp) and claimed halfway: its cut last line says it is
    still being written, so it is merged and kept, not removed with the rest of its records
    still to come; the next collect reads it whole and removes it."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node = store.connect(str(tmp_path / "gpu01.db"))
    for n in range(6):
        add_run(node, f"r{n}", T0 + n)
    text = export_text(node)
    cut = text.index("\n", len(text) // 2) + 10  # mid-line
    target = spool / "gpu01.ndjson"
    with open(target, "w") as writer:
        writer.write(text[:cut])
        writer.flush()
        fleet = store.connect(str(tmp_path / "fleet.db"))
        report = collect.collect(fleet, str(spool), consume=True)
        assert report["imports"][0][1]["truncated"] and len(report["kept"]) == 1
        writer.write(text[cut:])  # the copy goes on into the claimed file
    assert run_ids(fleet) < {f"r{n}" for n in range(6)}
    report = collect.collect(fleet, str(spool), consume=True)
    assert run_ids(fleet) == {f"r{n}" for n in range(6)} and os.listdir(spool) == []


def test_a_fleet_store_that_stops_taking_writes_stops_collect_and_loses_nothing(tmp_path):
    """The fleet store locked by another process (or full) is not one file's fault: collect
    stops at the first write with StoreFault, instead of skipping every file after a busy
    timeout each; the claimed files stay and the next collect merges them all."""
    spool = tmp_path / "spool"
    spool.mkdir()
    for n in range(3):
        node = store.connect(str(tmp_path / f"gpu0{n}.db"))
        add_run(node, f"r{n}", T0 + n)
        (spool / f"gpu0{n}.ndjson").write_text(export_text(node))
    path = str(tmp_path / "fleet.db")
    store.connect(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, path], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        fleet = store.connect(path, busy_timeout=0.2)
        with pytest.raises(records.StoreFault, match="database is locked"):
            collect.collect(fleet, str(spool), consume=True)
    finally:
        holder.kill()
        holder.wait()
    assert len(os.listdir(spool)) == 3
    report = collect.collect(fleet, str(spool), consume=True)
    assert run_ids(fleet) == {"r0", "r1", "r2"} and os.listdir(spool) == []
    assert report["skipped"] == []


def test_an_unchanged_spool_is_not_read_again_and_collecting_again_adds_nothing(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "gpu03.ndjson").write_text(export_text(node_store(str(tmp_path / "n.db"), "gpu03")))
    fleet = store.connect(str(tmp_path / "fleet.db"))
    first = collect.collect(fleet, str(spool))
    before = dump(fleet)
    assert first["added"]["run"] == 3
    second = collect.collect(fleet, str(spool))
    assert second["unchanged"] == [str(spool / "gpu03.ndjson")] and second["merged"] == []
    third = collect.collect(fleet, str(spool), full=True)  # read again: idempotent
    assert sum(third["added"].values()) == 0 and dump(fleet) == before


def test_partial_files_are_never_read_and_stale_ones_are_cleaned(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    text = export_text(node_store(str(tmp_path / "n.db"), "gpu05"))
    partial = spool / ".gpu05.ndjson.0123456789ab.tmp"  # an export being written
    partial.write_text(text[: len(text) // 2])
    stale = spool / ".gpu06.ndjson.ba9876543210.tmp"  # its writer died two hours ago
    stale.write_text(text[:100])
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    leftover = spool / "gpu05.ndjson.dead.collecting"  # claimed by a collect that stopped
    leftover.write_text(text)
    fleet = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(fleet, str(spool), consume=True)
    assert [os.path.basename(p) for p, _ in report["merged"]] == [leftover.name]
    assert report["skipped"] == [] and report["cleaned"] == 1
    assert sorted(os.listdir(spool)) == [partial.name]
    assert fleet.execute("SELECT count(*) FROM runs").fetchone()[0] == 3


def test_a_spool_collect_cannot_remove_is_read_in_place_and_said(tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "gpu07.ndjson").write_text(export_text(node_store(str(tmp_path / "n.db"), "gpu07")))

    def read_only(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(collect.os, "rename", read_only)
    fleet = store.connect(str(tmp_path / "fleet.db"))
    report = collect.collect(fleet, str(spool), consume=True)
    assert report["kept"] == [(str(spool / "gpu07.ndjson"), "Permission denied")]
    assert report["added"]["run"] == 3 and os.path.exists(spool / "gpu07.ndjson")


SPOOL_WRITER = """
import os, random, sys, time
from slurmhealth.core import files, store
from slurmhealth.fleet import collect, records, rollup
spool, node, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = store.connect(os.path.join(sys.argv[4], node + ".db"))
target = os.path.join(spool, node + ".ndjson")
rng = random.Random(node)
for cycle in range(cycles):
    for n in range(rng.randrange(1, 4)):
        conn.execute(store.insert_sql("runs"), (f"{node}-{cycle}-{n}", node, None,
                     "healthcheck", time.time(), 0.05, "ok", "v", '{"pad": "' + "x" * 3000 + '"}'))
    time.sleep(rng.random() * 0.02)  # the splay: each node at its own moment of the cycle
    mark = time.time()
    since = records.incremental_since(conn, target, None)
    with files.open_private(target) as out:
        records.export(conn, out, since)
    records.exported(conn, target, since, mark)
"""


def test_many_nodes_exporting_while_collect_consumes_lose_and_tear_nothing(tmp_path):
    spool, stores = tmp_path / "spool", tmp_path / "nodes"
    spool.mkdir()
    stores.mkdir()
    nodes, cycles = [f"gpu{i:02d}" for i in range(12)], 25
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", SPOOL_WRITER, str(spool), n, str(cycles), str(stores)]
        )
        for n in nodes
    ]
    fleet = store.connect(str(tmp_path / "fleet.db"))
    collects = 0
    while any(w.poll() is None for w in writers) or collects == 0:
        report = collect.collect(fleet, str(spool), consume=True)
        assert report["skipped"] == [] and report["kept"] == []
        for _path, result in report["imports"]:
            assert result["bad_count"] == 0 and result["truncated"] is None
        collects += 1
    assert [w.wait() for w in writers] == [0] * len(nodes)
    collect.collect(fleet, str(spool), consume=True)
    expected = set()
    for n in nodes:
        expected |= run_ids(store.connect(str(stores / f"{n}.db")))
    assert run_ids(fleet) == expected and len(expected) >= len(nodes) * cycles
    assert [n for n in os.listdir(spool) if not n.startswith(".")] == []
    assert collects > 1


@pytest.mark.real
def test_collect_into_a_store_it_cannot_write_fails_once_not_per_file(tmp_path):
    """The fleet store on a filesystem gone read-only: every file used to be `skipped: attempt
    to write a readonly database`, and collect exited 0 as if the spool were bad."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node_store(str(spool / "gpu01.db"), "gpu01").close()
    with tmpfs(tmp_path / "head", "size=4m,mode=0700") as head:
        fleet = head / "fleet.db"
        store.connect(str(fleet)).close()
        subprocess.run(["mount", "-o", "remount,ro", str(head)], check=True)
        done = run_cli("collect", str(spool), "--db", str(fleet))
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "skipped" not in done.stderr
    assert str(fleet) in done.stderr


def test_a_collect_stopped_with_sigterm_leaves_no_copy_of_a_node_store(tmp_path):
    """systemd stops a collect with SIGTERM (stop, TimeoutStartSec): it ends as an exit, so its
    private copy of the node store it was merging is removed (exit 143)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    node_store(str(spool / "gpu01.db"), "gpu01").close()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal, time\nimport slurmhealth.fleet.collect as s\nreal = s._checked_copy\n"
        "def copy(*a, **k):\n    real(*a, **k)\n    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "s._checked_copy = copy\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join([str(hook), REPO]),
        "TMPDIR": str(tmp),
        "SLURMHEALTH_FLEET_DB": str(tmp_path / "fleet.db"),
    }
    proc = run_cli("collect", str(spool), env=env)
    assert proc.returncode == 143, proc.stderr
    assert os.listdir(tmp) == []


def test_copies_a_killed_collect_left_are_removed_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old, fresh = tmp_path / f"{collect.COPY_PREFIX}old", tmp_path / f"{collect.COPY_PREFIX}now"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "node.db").write_bytes(b"x" * 100)
    os.utime(old, (1, 1))
    collect._clean_copies()
    assert not old.exists() and fresh.exists()
