"""A real PostgreSQL server for the fleet store's tests: Debian's postgresql package, started on
127.0.0.1 with its own data directory and socket folder, stopped at the end of the session.
initdb refuses root, so as root the server runs as the package's `postgres` user."""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

BINARIES = "/usr/lib/postgresql/*/bin"
USER = "slurmhealth"


def bin_dir() -> str | None:
    """The newest installed server's bin folder, or None."""
    found = sorted(glob.glob(BINARIES), key=lambda p: [int(x) for x in p.split("/")[-2].split(".")])
    return found[-1] if found and os.path.exists(os.path.join(found[-1], "initdb")) else None


def why_not() -> str | None:
    """Why no server can be started here, or None."""
    if bin_dir() is None:
        return "PostgreSQL's server is not installed (scripts/install-deps installs postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (the test extra installs it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "no postgres user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One server: `url(database)`, `new_database()`, `stop()`, `kill()`."""

    def __init__(self, fsync: bool = False, primary: Server | None = None) -> None:
        """A new server; with `primary`, a hot standby streaming from it (a read replica:
        pg_basebackup -R)."""
        self.folder = tempfile.mkdtemp(prefix="slurmhealth-pg-")
        self.data = os.path.join(self.folder, "data")
        self.port = _free_port()
        self.bin = bin_dir() or ""
        self._names = itertools.count()
        if os.geteuid() == 0:
            os.chown(self.folder, pwd.getpwnam("postgres").pw_uid, -1)
        if primary is None:
            # C collation: names sort by their bytes, as SQLite sorts them (docs/fleet.md)
            initdb = [f"{self.bin}/initdb", "-D", self.data, "-A", "trust", "-U", USER]
            self._as_owner([*initdb, "-E", "UTF8", "--locale=C"])
        else:
            self._as_owner([
                f"{self.bin}/pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port),
                "-U", USER, "-D", self.data, "-R", "-X", "stream", "-c", "fast",
            ])  # fmt: skip
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        options += "" if fsync else " -c fsync=off -c synchronous_commit=off"
        self.start_command = [
            f"{self.bin}/pg_ctl", "-D", self.data, "-l", os.path.join(self.folder, "log"),
            "-w", "-o", options, "start",
        ]  # fmt: skip
        self.start()

    def _as_owner(self, argv: list) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(prefix + argv, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._as_owner(self.start_command)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self, template: str | None = None) -> str:
        """A fresh database's URL: empty, or a copy of the database at the URL `template`
        (which nothing may hold open): a store written once and copied is seconds faster
        than written again."""
        import psycopg

        name = f"t{next(self._names)}"
        like = f" TEMPLATE {template.rsplit('/', 1)[1]}" if template else ""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}{like}")
        return self.url(name)

    def replayed(self, primary: Server) -> bool:
        """Whether this standby has replayed everything `primary` has written."""
        import psycopg

        with psycopg.connect(primary.url(), autocommit=True) as conn:
            written = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            sql = "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"
            return bool(conn.execute(sql, (written,)).fetchone()[0])

    def stop(self, mode: str = "fast") -> None:
        self._as_owner([f"{self.bin}/pg_ctl", "-D", self.data, "-m", mode, "-w", "stop"])

    def remove(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.folder, ignore_errors=True)
