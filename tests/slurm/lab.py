"""A real Slurm on this machine: munge, slurmctld and N slurmd (gpu01..gpuNN) under one temp dir;
with accounting=True also a private MariaDB and slurmdbd (sacct, sacctmgr).

Prolog, Epilog and HealthCheckProgram are the project's own hook scripts, so every job runs
through the real slurmhealth prolog/epilog. Each node replays GPU facts from a snapshot file
(`gpu_source`), an InfiniBand sysfs tree and a kmsg file; `inject(node, ...)` swaps one node's
sources for a faulty one, `clear(node)` swaps them back. Used by tests/slurm and `make demo`.

Measured facts behind the settings (Debian 12, Slurm 22.05): jobs need char devices for GRES to
set CUDA_VISIBLE_DEVICES; slurmd silently skips the prolog of a job id it remembers from its
spool (slurmctld -c restarts ids at 1), so every bring-up starts from empty spool dirs; daemons
are stopped by the pids in their pid files, never by name. Needs root (slurmd runs jobs as their
owner; munged and slurmd insist on root-owned files).

Accounting (measured here, MariaDB 10.11, slurmdbd 22.05): mariadb-install-db ~0.5 s, mariadbd
answers within ~0.2 s, slurmdbd creates its tables ~1-2 s. mariadbd runs as root (--user=root:
it accepts that, and the data dir stays root-owned in the root-only lab); root reaches it over
the socket by unix_socket auth, slurmdbd over TCP on 127.0.0.1 as user `slurm`. slurmdbd reads
slurmdbd.conf beside slurm.conf and refuses it unless it is mode 600; its link from slurmctld
ignores AuthInfo, so AccountingStoragePass names the munge socket.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

SBIN, BIN = "/usr/sbin", "/usr/bin"
SBIN_TOOLS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("scontrol", "sinfo", "sbatch", "squeue", "srun", "scancel")
# accounting=True: slurmdbd and a private MariaDB (apt-get install slurmdbd mariadb-server)
ACCOUNTING_TOOLS = (
    "/usr/sbin/slurmdbd",
    "/usr/sbin/mariadbd",
    "/usr/bin/mariadb-install-db",
    "/usr/bin/mariadb",
    "/usr/bin/sacct",
    "/usr/bin/sacctmgr",
)
SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Start", "End", "User")
DB_USER, DB_NAME = "slurm", "slurm_acct_db"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
SNAPSHOTS = os.path.join(FIXTURES, "snapshots")
HEALTHY = {
    "gpu_source": os.path.join(SNAPSHOTS, "h100-hgx-healthy.json"),
    "sysfs_root": os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
    "kmsg": os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
}
GPUS_PER_NODE = 8
# slurmctld sends the health check from its 1 s background loop, to every node at once. Measured:
# 1 s runs it every second, but a node resumed by scontrol then stays idle* (NOT_RESPONDING) for
# more than 30 s, and four Python hooks a second (~70 ms CPU each) load a 2-core CI machine.
# 2 s: resumed nodes are idle again within ~2 s, a drain of ours is resumed ~resume_after * 2 s
# after the fault goes, and Lab.sync_health_check leaves a job ~1-2 s to reach its prolog first.
HEALTH_CHECK_INTERVAL = 2
TERMINAL_JOB_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


# The lab's RebootProgram (`scontrol reboot` needs one; slurmd runs it through system(3), in
# slurmd's environment): the node whose slurmd runs it "reboots": that slurmd is stopped and
# started again with -b, which reports a reboot (slurmd(8)), so slurmctld sees the reboot it
# issued complete. It finds its slurmd by walking up its parents, the node in that one's `-N`.
# slurmctld ends the reboot only when the node's boot time (its registration less its uptime,
# in whole seconds; 0 with -b) is not before the reboot it issued: a slurmd back within the same
# second left the node rebooting until ResumeTimeout (seen 1 run in 5), so it waits a second.
REBOOT_PROGRAM = r"""#!/bin/sh
pid=$PPID
while [ "$pid" -gt 1 ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != slurmd ]; do
  pid=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f2)
done
[ "$pid" -gt 1 ] || { echo "lab reboot: no slurmd above $$" >&2; exit 1; }
node=$(tr '\000' '\n' < "/proc/$pid/cmdline" | sed -n '/^-N$/{n;p;}')
case $node in gpu[0-9]*) ;; *) echo "lab reboot: no node name" >&2; exit 1 ;; esac
# detached, in the background: slurmd waits for this script to end before it can stop
/usr/bin/setsid /bin/sh -c '
  kill -TERM "$1"
  while [ -e "/proc/$1" ] && [ "$(sed "s/.*) //" "/proc/$1/stat" | cut -d" " -f1)" != Z ]; do
    sleep 0.05
  done
  sleep 1
  exec /usr/sbin/slurmd -N "$2" -b
' lab-reboot "$pid" "$node" </dev/null >/dev/null 2>&1 &
"""


class LabError(Exception):
    """The lab could not be brought up or a wait timed out; the message says what and where."""


def snapshot(name: str) -> str:
    """A bundled snapshot: snapshot('gpu-lost') -> .../h100-hgx-gpu-lost.json, built from the
    healthy one by tests/fixtures/snapshots/faults.py into a temp dir that root's slurmd and hooks
    can read (conftest.snapshot_path: once per process, removed at exit)."""
    from conftest import snapshot_path  # tests/ is on sys.path: pytest's rootdir, demo-slurm's

    return snapshot_path(name)


def missing(accounting: bool = False) -> str | None:
    """Why a lab cannot run here (not root, Slurm or munge not installed; with accounting, no
    slurmdbd or MariaDB), or None."""
    if os.geteuid() != 0:
        return "the Slurm lab needs root (slurmd runs jobs as their owners)"
    absent = [d for d in SBIN_TOOLS if not os.access(os.path.join(SBIN, d), os.X_OK)]
    absent += [c for c in CLIENTS if not os.access(os.path.join(BIN, c), os.X_OK)]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    if accounting:
        absent = [os.path.basename(t) for t in ACCOUNTING_TOOLS if not os.access(t, os.X_OK)]
        if absent:
            return f"not installed: {', '.join(absent)} (apt-get install slurmdbd mariadb-server)"
    return None


def _free_ports(count: int) -> list:
    """Ports the kernel just handed out on 127.0.0.1 (free now; nothing else races us in CI)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return _toml_str(str(value))


def kmsg_record(seq: int, message: str, pri: int = 3) -> str:
    """One /dev/kmsg-format record line: `PRI,SEQ,USEC,-;MESSAGE`. USEC is seq x 100 s: records
    are never close enough in time for the Xid check to merge two identical lines."""
    return f"{pri},{seq},{seq * 100_000_000},-;{message}\n"


XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Illegal Address",
    48: "DBE (double bit error) ECC error",
    79: "GPU has fallen off the bus.",
}


def xid_message(xid: int, bus: str = "0000:18:00", text: str = "", pid: int = 4242) -> str:
    """The NVIDIA driver's Xid line (bus 0000:18:00 is GPU 0 of the bundled snapshots)."""
    text = text or XID_TEXT.get(xid, "injected by the lab")
    return f"NVRM: Xid (PCI:{bus}): {xid}, pid={pid}, name=python3, {text}"


def _last_seq(text: str) -> int:
    last = 0
    for line in text.splitlines():
        head = line.split(";", 1)[0].split(",")
        if len(head) >= 3 and head[1].isdigit():
            last = max(last, int(head[1]))
    return last


def _pid_alive(pid: int) -> bool:
    """Running and not a zombie: stopped daemons stay zombies until someone reaps them."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def copy_store(source: str, target: str) -> None:
    """A consistent copy of a live node store (the hooks keep writing it): the backup API."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


class Lab:
    """munge + slurmctld + `nodes` slurmd under a temp dir; a context manager.

    keep=True leaves everything running (and on disk) after the `with` block, for a demo to
    poke at; stop() tears it down. Node gpuNN gets Weight NN*10 (the lowest weight is chosen
    first), so with no other steering the first job lands on gpu01.

    accounting=True adds a private MariaDB and slurmdbd before slurmctld starts (sacct and
    sacctmgr work; `sacct()` returns parsed rows). health_check_interval=0 runs no health check.
    `startup` is the bring-up time in seconds, per step in `timings`.
    """

    def __init__(
        self,
        nodes: int = 4,
        *,
        keep: bool = False,
        base: str | None = None,
        resume_after: int = 2,
        health_check_interval: int = HEALTH_CHECK_INTERVAL,
        bin: str | None = None,
        accounting: bool = False,
        private_data: bool = False,
        topology: dict | None = None,
        backfill_interval: int | None = None,
    ) -> None:
        self.names = [f"gpu{i:02d}" for i in range(1, nodes + 1)]
        self.accounting = accounting
        # {switch: "Nodes=..." or "Switches=..."}: topology.conf for topology/tree, or none
        self.topology = topology
        # seconds between backfill passes (slurm.conf bf_interval, 30 by default): a job that
        # runs on nodes outside its FLEX reservation is started by backfill only (measured:
        # ~25 s at the default), never by the main scheduler
        self.backfill_interval = backfill_interval
        self.private_data = private_data
        self.keep = keep
        self.base = base
        self.resume_after = resume_after
        self.health_check_interval = health_check_interval
        self.bin = bin or os.path.join(os.path.dirname(sys.executable), "slurmhealth")
        self.dir = ""
        self.faults: dict = {}
        self.node_lines: dict = {}  # node -> extra TOML lines of its [[node]] block
        self.settings: dict = {}  # extra [settings] for every node
        self.timings: dict = {}
        self._children: list = []  # daemons that do not daemonise (mariadbd): reaped in stop()
        self.startup = 0.0
        self.started_at = 0.0

    # ---- paths -------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def conf(self) -> str:
        return self.path("etc", "slurm.conf")

    @property
    def out(self) -> str:
        """Jobs' working dir and output files (world-writable, sticky: users' jobs write here)."""
        return self.path("out")

    def db_path(self, node: str) -> str:
        return self.path("state", f"{node}.db")

    def log(self, daemon: str) -> str:
        """Log file text: 'slurmctld', 'gpu01' (that slurmd), 'munged', 'slurmdbd', 'mariadbd'."""
        own = ("slurmctld", "munged", "slurmdbd", "mariadbd")
        name = daemon if daemon in own else f"slurmd-{daemon}"
        try:
            with open(self.path("log", f"{name}.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of slurmctld's and every slurmd's log, for a failure report."""
        out = []
        extra = ["slurmdbd", "mariadbd"] if self.accounting else []
        for daemon in [*extra, "slurmctld", *self.names]:
            out.append(f"---- {daemon} log (tail) ----")
            out += self.log(daemon).splitlines()[-lines:]
        return "\n".join(out)

    # ---- bring-up ----------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.keep:
            self.stop()

    def start(self) -> Lab:
        reason = missing(self.accounting)
        if reason:
            raise LabError(reason)
        t0 = self.started_at = time.time()
        self._make_dirs()
        try:
            self._write_files()
            steps = [("munge", self._start_munge)]
            if self.accounting:
                steps += [("mariadb", self._start_mariadb), ("slurmdbd", self._start_slurmdbd)]
            steps += [("slurmctld", self._start_slurmctld), ("slurmd", self._start_slurmds)]
            for name, step in steps:
                t = time.time()
                step()
                self.timings[name] = time.time() - t
            self.startup = time.time() - t0
        except LabError as exc:
            tails = self.log_tails()
            self.stop()
            raise LabError(f"{exc}\n{tails}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def _make_dirs(self) -> None:
        if self.base:
            # A fixed place (demo): stop a lab kept running there, and never reuse its spool:
            # slurmd would skip the prolog of every job id it remembers.
            self.dir = os.path.abspath(self.base)
            self._stop_daemons()
            shutil.rmtree(self.dir, ignore_errors=True)
            os.makedirs(self.dir)
        else:
            self.dir = tempfile.mkdtemp(prefix="slurmhealth-lab-")
        os.chmod(self.dir, 0o755)  # users' jobs must reach out/ and the munge socket
        for sub in ("etc", "run", "log", "spool", "state", "dev", "munge/run", "kmsg"):
            os.makedirs(self.path(sub), mode=0o755, exist_ok=True)
        for sub in ("munge/etc", "munge/lib"):
            os.makedirs(self.path(sub), mode=0o700, exist_ok=True)
        if self.accounting:
            os.makedirs(self.path("mysql", "run"), mode=0o700)  # datadir: mariadb-install-db
        for name in ["ctld", *self.names]:
            os.makedirs(self.path("spool", name))  # slurmd does not create its spool dir
        os.makedirs(self.out)
        os.chmod(self.out, 0o1777)
        for i in range(GPUS_PER_NODE):
            # GRES needs character devices (plain files are rejected); 1,3 is /dev/null's.
            os.mknod(self.path("dev", f"nvidia{i}"), 0o666 | 0o020000, os.makedev(1, 3))

    def _write_files(self) -> None:
        # slurmctld, one per slurmd, then (accounting) MariaDB and slurmdbd
        self.ports = _free_ports(len(self.names) + 1 + (2 if self.accounting else 0))
        if self.accounting:
            self.db_password = os.urandom(12).hex()
            self._write_slurmdbd_conf()
        with open(self.conf, "w") as f:
            f.write(self.slurm_conf())
        nodelist = f"gpu[01-{len(self.names):02d}]"
        if self.topology:
            with open(self.path("etc", "topology.conf"), "w") as f:
                f.writelines(f"SwitchName={k} {v}\n" for k, v in self.topology.items())
        with open(self.path("etc", "gres.conf"), "w") as f:
            f.write("AutoDetect=off\n")
            devices = f"{self.path('dev')}/nvidia[0-{GPUS_PER_NODE - 1}]"
            f.write(f"NodeName={nodelist} Name=gpu File={devices}\n")
        # Read by packaging/slurmhealth-hook only when root-owned (it is: we are root).
        with open(self.path("etc", "slurmhealth.env"), "w") as f:
            f.write(f"SLURMHEALTH_BIN={self.bin}\n")
            f.write(f"SLURMHEALTH_CONFIG={self.path('etc', 'slurmhealth.toml')}\n")
            f.write(f"SLURMHEALTH_STATE_DIR={self.path('state')}\n")  # <node>.db each
            # the hooks run this checkout's slurmhealth, the one under test, even where the
            # venv's own is installed from another (a git worktree beside the main checkout)
            f.write(f"PYTHONPATH={REPO}\n")
        with open(self.path("etc", "reboot"), "w") as f:
            f.write(REBOOT_PROGRAM)
        os.chmod(self.path("etc", "reboot"), 0o755)
        self._write_config()

    def slurm_conf(self) -> str:
        ctld_port, node_ports = self.ports[0], self.ports[1 : len(self.names) + 1]
        p = self.path
        lines = [
            "ClusterName=lab",
            # slurmd and srun bind 127.0.0.1 (NodeAddr), not every address (slurmctld ignores it)
            "CommunicationParameters=NoInAddrAny",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={p('munge', 'run', 'munge.socket')},cred_expire=5",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={p('spool', 'ctld')}",
            f"SlurmdSpoolDir={p('spool')}/%n",
            f"SlurmctldPidFile={p('run', 'slurmctld.pid')}",
            f"SlurmdPidFile={p('run')}/slurmd-%n.pid",
            f"SlurmctldLogFile={p('log', 'slurmctld.log')}",
            f"SlurmdLogFile={p('log')}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "SlurmdTimeout=10",
            "KillWait=2",
            "GresTypes=gpu",
            "PrologFlags=Alloc",
            "PrologEpilogTimeout=20",
            # A job requeued by a failing prolog waits cred_expire (AuthInfo; 5 s is the least
            # accepted, default 120) and then the next full scheduling pass (sched_interval,
            # default 60 s): 1 s here. batch_sched_delay=0: no 3 s batching of submissions.
            "SchedulerParameters=nohold_on_prolog_fail,batch_sched_delay=0,sched_interval=1"
            + (f",bf_interval={self.backfill_interval}" if self.backfill_interval else ""),
            # The documented admin setup: every script in prolog.d/epilog.d (a glob).
            f"Prolog={REPO}/prolog.d/*",
            f"Epilog={REPO}/epilog.d/*",
            f"HealthCheckProgram={REPO}/packaging/slurmhealth-hook",
            f"HealthCheckInterval={self.health_check_interval}",
            "HealthCheckNodeState=ANY",
            f"RebootProgram={p('etc', 'reboot')}",  # REBOOT_PROGRAM
        ]
        if self.accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.dbd_port}",
                # the slurmctld <-> slurmdbd link ignores AuthInfo: name the socket here
                f"AccountingStoragePass={p('munge', 'run', 'munge.socket')}",
                "JobCompType=jobcomp/none",
            ]
        if self.private_data:
            lines.append("PrivateData=jobs")  # squeue and scontrol
        if self.topology:
            lines.append("TopologyPlugin=topology/tree")  # topology.conf beside slurm.conf
        for name, port in zip(self.names, node_ports):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                "CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 "
                f"RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} Weight={int(name[3:]) * 10} "
                "State=UNKNOWN"
            )
        lines.append(
            f"PartitionName=gpu Nodes=gpu[01-{len(self.names):02d}] Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        return "\n".join(lines) + "\n"

    @property
    def dbd_port(self) -> int:
        return self.ports[-1]

    @property
    def mysql_port(self) -> int:
        return self.ports[-2]

    def _write_slurmdbd_conf(self) -> None:
        p = self.path
        lines = [
            "AuthType=auth/munge",
            f"AuthInfo=socket={p('munge', 'run', 'munge.socket')}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.dbd_port}",
            "SlurmUser=root",
            f"PidFile={p('run', 'slurmdbd.pid')}",
            f"LogFile={p('log', 'slurmdbd.log')}",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.mysql_port}",
            f"StorageUser={DB_USER}",
            f"StoragePass={self.db_password}",
            f"StorageLoc={DB_NAME}",
        ]
        if self.private_data:
            lines.append("PrivateData=jobs")  # sacct obeys this one, not slurm.conf's
        target = self.path("etc", "slurmdbd.conf")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:  # slurmdbd refuses a conf others can read (the password)
            f.write("\n".join(lines) + "\n")
        os.chmod(target, 0o600)

    def _write_config(self) -> None:
        """slurmhealth.toml: healthy fixtures for all, extra [settings], one [[node]] block per
        node with an injected fault or extra lines (node_config)."""
        out = ["[settings]"]
        for key, value in HEALTHY.items():
            out.append(f"{key} = {_toml_str(value)}")
        out += [f"resume_after = {self.resume_after}"]
        out += [f"{k} = {_toml_value(v)}" for k, v in sorted(self.settings.items())]
        out.append("")
        for node in sorted(set(self.faults) | set(self.node_lines)):
            settings = self.faults.get(node, {})
            out += ["[[node]]", f"match = {_toml_str(node)}"]
            out += [f"settings.{k} = {_toml_str(v)}" for k, v in sorted(settings.items())]
            out += self.node_lines.get(node, [])
            out.append("")
        target = self.path("etc", "slurmhealth.toml")
        with open(target + ".tmp", "w") as f:
            f.write("\n".join(out))
        os.replace(target + ".tmp", target)  # a hook never reads half a file

    def _start_munge(self) -> None:
        key = self.path("munge", "etc", "munge.key")
        self._run([f"{SBIN}/mungekey", "-c", "-k", key])
        self._run(
            [
                f"{SBIN}/munged",
                f"--socket={self.path('munge', 'run', 'munge.socket')}",
                f"--pid-file={self.path('run', 'munged.pid')}",
                f"--log-file={self.path('log', 'munged.log')}",
                f"--seed-file={self.path('munge', 'lib', 'munged.seed')}",
                f"--key-file={key}",
            ]
        )

    def _mariadb(self, sql: str) -> None:
        """Run SQL as MariaDB's root (unix_socket auth over the lab's private socket)."""
        sock = self.path("mysql", "run", "mysqld.sock")
        self._run([f"{BIN}/mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e", sql])

    def _start_mariadb(self) -> None:
        """A private MariaDB on a free 127.0.0.1 port: its own datadir, socket and pid file.

        mariadbd does not daemonise: it is started in its own session, its pid file is what
        stop() reads. Small buffers: a test database of a few hundred rows.
        """
        data, run = self.path("mysql", "data"), self.path("mysql", "run")
        self._run(
            [
                f"{BIN}/mariadb-install-db",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--skip-test-db",
            ],
            timeout=60,
        )
        log = open(self.path("log", "mariadbd.log"), "ab")  # the daemon keeps its own copy
        try:
            child = subprocess.Popen(
                [
                    f"{SBIN}/mariadbd",
                    "--no-defaults",
                    f"--datadir={data}",
                    "--user=root",
                    f"--port={self.mysql_port}",
                    "--bind-address=127.0.0.1",
                    f"--socket={run}/mysqld.sock",
                    f"--pid-file={self.path('run', 'mariadbd.pid')}",
                    f"--log-error={self.path('log', 'mariadbd.log')}",
                    "--skip-name-resolve",
                    "--skip-log-bin",
                    "--innodb-buffer-pool-size=32M",
                    "--innodb-log-file-size=16M",
                    "--performance-schema=OFF",
                    f"--tmpdir={run}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env=self.daemon_env(),
                cwd=run,
            )
            self._children.append(child)
        finally:
            log.close()

        def answers() -> bool:
            try:
                self._mariadb("SELECT 1")
                return True
            except LabError:
                return False

        self._poll(answers, 30, "MariaDB to accept connections")
        self._mariadb(
            f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{self.db_password}'; "
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1'; FLUSH PRIVILEGES;"
        )

    def _start_slurmdbd(self) -> None:
        self._run([f"{SBIN}/slurmdbd"], env=self.daemon_env())
        # slurmdbd creates its tables first (~1-2 s); sacctmgr answers once it listens.
        self._poll(
            lambda: self.sacctmgr("-n", "-P", "list", "cluster", check=False).returncode == 0,
            30,
            "slurmdbd to answer sacctmgr",
        )
        self.sacctmgr("-i", "add", "cluster", "lab")

    def _start_slurmctld(self) -> None:
        self._run([f"{SBIN}/slurmctld", "-c"], env=self.daemon_env())
        self._poll(
            lambda: "is UP" in self.scontrol("ping", check=False).stdout,
            10,
            "slurmctld to answer ping",
        )

    def _start_slurmds(self) -> None:
        for name in self.names:
            self.start_slurmd(name)
        self.wait_idle(self.names, timeout=20)

    def start_slurmd(self, node: str, *args: str) -> None:
        """Start one node's slurmd (`args`: more options, e.g. "-b": report a reboot). slurmd
        daemonises before it runs the health check, so this returns while that runs."""
        self._run([f"{SBIN}/slurmd", "-N", node, *args], env=self.daemon_env())

    def stop_daemon(self, name: str, timeout: float = 10) -> None:
        """TERM one daemon ('slurmctld', 'slurmd-gpu03') by its pid file and wait until it is
        gone (KILL after `timeout`): a node's "reboot" is stop_daemon + start_slurmd."""
        pid = self._daemons().get(name)
        if pid is None:
            raise LabError(f"{name} is not running")
        os.kill(pid, 15)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid_alive(pid):
            os.kill(pid, 9)

    def start_slurmctld(self) -> None:
        """Start slurmctld again after stop_daemon('slurmctld'): it recovers its saved state
        (jobs, node states and reasons), as a controller restarted in production does."""
        self._run([f"{SBIN}/slurmctld"], env=self.daemon_env())
        self._poll(
            lambda: "is UP" in self.scontrol("ping", check=False).stdout,
            10,
            "slurmctld to answer ping",
        )

    def start_stopped(self) -> None:
        """Start slurmctld and every slurmd that is not running (after a test that stopped
        some, whether it got to start them again or not)."""
        running = self._daemons()
        if "slurmctld" not in running:
            self.start_slurmctld()
        for name in self.names:
            if f"slurmd-{name}" not in running:
                self.start_slurmd(name)

    def daemon_env(self) -> dict:
        """What an init system gives a daemon: PATH and our SLURM_CONF, nothing of the caller's."""
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": self.conf}

    def client_env(self, extra: dict | None = None) -> dict:
        """The caller's env minus any Slurm job context (tests may run inside a job)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SLURMHEALTH_"))
        }
        env["SLURM_CONF"] = self.conf
        env.update(extra or {})
        return env

    # ---- teardown ----------------------------------------------------------------------------
    def stop(self, remove: bool = True) -> None:
        """Cancel jobs, TERM every daemon we started (by pid file), wait, remove the dir."""
        if not self.dir:
            return
        self.cancel_all()
        self._stop_daemons()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = ""

    def _stop_daemons(self) -> None:
        """In stages: Slurm's daemons, then slurmdbd (it flushes to the database), then MariaDB
        and munged (the others need munge to say goodbye)."""
        running = self._daemons()
        stages = (
            [n for n in running if n.startswith(("slurmd-", "slurmctld"))],
            [n for n in running if n == "slurmdbd"],
            [n for n in running if n in ("mariadbd", "munged")],
        )
        for stage in stages:
            pids = [running[n] for n in stage]
            for pid in pids:
                os.kill(pid, 15)
            deadline = time.monotonic() + 10
            while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in pids:
                if _pid_alive(pid):
                    os.kill(pid, 9)
        for child in self._children:
            child.poll()  # reap it (it is stopped by now, by its pid file)
        self._children = [c for c in self._children if c.returncode is None]

    def _daemons(self) -> dict:
        """{pid file: pid} of our daemons still running: slurmds first, munged last (the others
        need it to say goodbye). A pid is trusted only while its process has the daemon's name."""
        names = [f"slurmd-{n}" for n in self.names] + ["slurmctld", "slurmdbd", "mariadbd"]
        names.append("munged")
        found = {}
        for name in names:
            try:
                with open(self.path("run", f"{name}.pid")) as f:
                    pid = int(f.read().split()[0])
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except (OSError, ValueError, IndexError):
                continue
            if comm == name.split("-")[0] and _pid_alive(pid):
                found[name] = pid
        return found

    def cancel_all(self) -> None:
        """scancel every job and wait (10 s at most) until none is running or completing."""
        if "slurmctld" not in self._daemons():
            return
        try:
            ids = self.squeue("-h", "-o", "%i", check=False).stdout.split()
            if ids:
                self.scancel(*ids, check=False)
                self._poll(lambda: not self.squeue("-h", "-t", "R,CG").stdout.strip(), 10)
        except (LabError, subprocess.TimeoutExpired):
            pass  # stop anyway; a stuck job step dies with its node's processes

    # ---- commands ----------------------------------------------------------------------------
    def _run(
        self,
        argv: list,
        *,
        env: dict | None = None,
        check: bool = True,
        timeout: float = 20,
        user: str | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        kwargs: dict = {}
        if user is not None:
            import pwd  # noqa: PLC0415

            entry = pwd.getpwnam(user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            env = dict(env or self.client_env(), HOME=entry.pw_dir, USER=user, LOGNAME=user)
        proc = subprocess.run(
            argv,
            env=env if env is not None else self.client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.out if os.path.isdir(self.out) else None,
            input=input,
            **kwargs,
        )
        if check and proc.returncode != 0:
            raise LabError(
                f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
            )
        return proc

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run([f"{BIN}/scontrol", *args], check=check)

    def sinfo(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run([f"{BIN}/sinfo", *args], check=check)

    def squeue(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run([f"{BIN}/squeue", *args], check=check)

    def scancel(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run([f"{BIN}/scancel", *args], check=check)

    def sacctmgr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self._run([f"{BIN}/sacctmgr", *args], check=check)

    # ---- accounting ----------------------------------------------------------------------------
    def add_user(self, name: str, account: str = "lab") -> None:
        """An association for `name` (and its account, once): with PrivateData=jobs a user sees
        in sacct only jobs submitted after this, so call it before they submit."""
        listed = self.sacctmgr("-n", "-P", "list", "account", account, "format=Account").stdout
        if account not in listed.split():
            self.sacctmgr("-i", "add", "account", account, "Cluster=lab")
        self.sacctmgr("-i", "add", "user", name, f"Account={account}", "Cluster=lab")

    def sacct(self, *jobs: str, since: float | None = None) -> list:
        """Job records from slurmdbd (`sacct -P -n -X`, one per job, requeued ones too with -D)
        as dicts of SACCT_FIELDS, since the lab started (sacct's default is today's midnight)."""
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime((since or self.started_at) - 60))
        argv = [f"{BIN}/sacct", "-P", "-n", "-X", "-D", "-S", start, "-o", ",".join(SACCT_FIELDS)]
        if jobs:
            argv += ["-j", ",".join(str(j) for j in jobs)]
        out = self._run(argv).stdout
        return [dict(zip(SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line]

    def wait_sacct(self, jobs: list, timeout: float = 30) -> dict:
        """Poll until slurmdbd has a finished record (State terminal, End set) of every job;
        {job id: record} (the last record of a requeued job)."""
        found: dict = {}
        wanted = {str(j) for j in jobs}

        def done() -> bool:
            for row in self.sacct(*wanted):
                if row["State"].split()[0] in TERMINAL_JOB_STATES and row["End"] != "Unknown":
                    found[row["JobID"]] = row
            return wanted <= set(found)

        self._poll(done, timeout, lambda: f"sacct to show {sorted(wanted - set(found))} ended")
        return found

    def sbatch(
        self, *args: str, script: str | None = None, user: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        return self._run([f"{BIN}/sbatch", *args], input=script, user=user, check=check)

    def srun(
        self, *args: str, user: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        return self._run([f"{BIN}/srun", *args], user=user, check=check, timeout=timeout)

    # ---- jobs --------------------------------------------------------------------------------
    def submit(self, script: str = "true", *args: str, user: str | None = None) -> str:
        """sbatch a shell script body (with `#!/bin/sh` added); returns the job id.

        Output goes to out/JOBID.out; args are extra sbatch options, e.g. '-N2', '--gres=gpu:8'.
        """
        body = script if script.startswith("#!") else "#!/bin/sh\n" + script + "\n"
        proc = self.sbatch(
            "--parsable",
            f"--output={self.out}/%j.out",
            f"--chdir={self.out}",
            *args,
            script=body,
            user=user,
        )
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        """`scontrol -o show job` as a dict (JobState, NodeList, Restarts, ExitCode, ...)."""
        text = self.scontrol("-o", "show", "job", str(job_id)).stdout.strip()
        fields = {}
        for token in text.split():
            key, eq, value = token.partition("=")
            if eq and key not in fields:
                fields[key] = value
        return fields

    def output(self, job_id: str) -> str:
        try:
            with open(os.path.join(self.out, f"{job_id}.out"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_job(
        self, job_id: str, states: tuple = TERMINAL_JOB_STATES, timeout: float = 30
    ) -> dict:
        """Poll until the job's state is one of `states`; its fields, or LabError on timeout."""
        found: dict = {}

        def done() -> bool:
            found.update(self.job(job_id))
            return found.get("JobState") in states

        self._poll(done, timeout, lambda: f"job {job_id} to reach {states} (now {found})")
        return found

    # ---- nodes -------------------------------------------------------------------------------
    def node(self, name: str) -> dict:
        """{'state': 'IDLE+DRAIN', 'reason': 'slurmhealth: ...', 'reason_by': 'root'} of a node.

        `scontrol -o` prints `Reason=<text> [<user>@<time>]` with spaces inside <text>.
        """
        text = self.scontrol("-o", "show", "node", name).stdout.strip()
        state = re.search(r"\bState=(\S+)", text)
        reason = re.search(r"\bReason=(.*) \[([^\]@]*)@[^\]]*\]", text)
        return {
            "state": state.group(1) if state else "",
            "reason": reason.group(1) if reason else "",
            "reason_by": reason.group(2) if reason else "",
        }

    def wait_node(self, name: str, predicate, timeout: float = 30, what: str = "") -> dict:
        """Poll node(name) until predicate(node) is true; the node's dict."""
        seen: dict = {}

        def done() -> bool:
            seen.clear()
            seen.update(self.node(name))
            return bool(predicate(seen))

        self._poll(done, timeout, lambda: f"{name} {what or 'to change'} (now {seen})")
        return seen

    def wait_node_state(self, name: str, state: str, timeout: float = 30) -> dict:
        """Poll until the node's state is exactly `state` ('IDLE', 'IDLE+DRAIN', ...)."""
        return self.wait_node(name, lambda n: n["state"] == state, timeout, f"to be {state}")

    def wait_idle(self, names: list | None = None, timeout: float = 30) -> None:
        """Every named node plain idle (after a resume a node shows idle* for a second or two)."""
        names = names or self.names
        states: dict = {}

        def done() -> bool:
            out = self.sinfo("-h", "-N", "-o", "%N %T", check=False).stdout.split("\n")
            states.clear()
            states.update(line.split() for line in out if line.strip())
            return all(states.get(n) == "idle" for n in names)

        self._poll(done, timeout, lambda: f"nodes to be idle (now {states})")

    def drain(self, name: str, reason: str) -> None:
        self.scontrol("update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> None:
        self.scontrol("update", f"NodeName={name}", "State=RESUME")

    def set_weight(self, name: str, weight: int) -> None:
        self.scontrol("update", f"NodeName={name}", f"Weight={weight}")

    # ---- fault injection -----------------------------------------------------------------------
    def inject(self, node: str, **settings: str) -> None:
        """Replace node's sources: inject('gpu03', gpu_source=snapshot('gpu-lost'))."""
        unknown = set(settings) - set(HEALTHY)
        if unknown:
            raise ValueError(f"inject: unknown source {sorted(unknown)} (one of {sorted(HEALTHY)})")
        self.faults.setdefault(node, {}).update(settings)
        self._write_config()

    def clear(self, node: str) -> None:
        """The node's sources back to the healthy fixtures, its extra config lines dropped."""
        self.faults.pop(node, None)
        self.node_lines.pop(node, None)
        self._write_config()

    def node_config(self, node: str, *lines: str) -> None:
        """Extra TOML lines in the node's [[node]] block (dotted keys), e.g.
        node_config('gpu02', 'checks."xid.hardware".severity = "warn"')."""
        self.node_lines.setdefault(node, []).extend(lines)
        self._write_config()

    def set_settings(self, **settings: object) -> None:
        """Extra [settings] for every node: set_settings(breaker_share=0.25)."""
        self.settings.update(settings)
        self._write_config()

    def kmsg(self, node: str) -> str:
        """A writable kernel log for the node (a copy of the healthy one, injected): append
        records with append_kmsg() or from a job (kmsg_record() gives the line)."""
        path = self.path("kmsg", f"{node}.kmsg")
        if not os.path.exists(path):
            shutil.copyfile(HEALTHY["kmsg"], path)
        if self.faults.get(node, {}).get("kmsg") != path:
            self.inject(node, kmsg=path)
        return path

    def kmsg_command(self, node: str, message: str, pri: int = 3) -> str:
        """A shell command that appends one record (next sequence number) to the node's kernel
        log: for a job script, so the record appears while the job runs (between its prolog and
        its epilog). Jobs that use it must not share the node (--exclusive or all its GPUs)."""
        path = shlex.quote(self.kmsg(node))
        last = "awk -F'[,;]' '$2 ~ /^[0-9]+$/ && $2 + 0 > m {m = $2 + 0} END {print m + 0}'"
        return (
            f"s=$(( $({last} {path}) + 1 )); "
            f'printf \'{pri},%d,%d00000000,-;%s\\n\' "$s" "$s" {shlex.quote(message)} >> {path}'
        )

    def fail_node(self, node: str, job_id: str, timeout: float = 30) -> dict:
        """A node failure under a running job: the node is set DOWN, slurmctld ends the job
        NODE_FAIL at once; slurmd still answers, so the node is back (ReturnToService=2) within
        a second. The job's fields once it has ended."""
        self.wait_job(job_id, states=("RUNNING",), timeout=timeout)
        self.scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=lab: node failure")
        done = self.wait_job(job_id, timeout=timeout)
        self.wait_idle([node], timeout=timeout)
        return done

    def append_kmsg(self, node: str, message: str, pri: int = 3) -> int:
        """Append one kmsg record (next sequence number) to the node's kernel log; its seq."""
        path = self.kmsg(node)
        with open(path, "a+") as f:
            f.seek(0)
            seq = _last_seq(f.read()) + 1
            f.write(kmsg_record(seq, message, pri))
        return seq

    # ---- node stores -----------------------------------------------------------------------
    def db(self, node: str) -> sqlite3.Connection:
        """The node's slurmhealth store (read it; the hooks write it)."""
        conn = sqlite3.connect(self.db_path(node), timeout=30)
        conn.row_factory = sqlite3.Row
        return conn

    def query(self, node: str, sql: str, args: tuple = ()) -> list:
        """Rows of the node's store as dicts ([] while it has no store or no schema yet)."""
        if not os.path.exists(self.db_path(node)):
            return []
        conn = self.db(node)
        try:
            return [dict(r) for r in conn.execute(sql, args)]
        except sqlite3.OperationalError:
            return []  # no schema yet: the first hook is creating it
        finally:
            conn.close()

    def runs(self, node: str, phase: str | None = None, job_id: str | None = None) -> list:
        """The node's recorded runs, oldest first, as dicts."""
        sql, args = "SELECT * FROM runs WHERE 1", []
        if phase:
            sql, args = sql + " AND phase = ?", [*args, phase]
        if job_id is not None:
            sql, args = sql + " AND job_id = ?", [*args, str(job_id)]
        return self.query(node, sql + " ORDER BY started", tuple(args))

    def wait_runs(
        self, node: str, phase: str, count: int = 1, after: float = 0, timeout: float = 30, **where
    ) -> list:
        """Poll until the node recorded `count` runs of `phase` started after `after` (epoch s)."""
        found: list = []

        def done() -> bool:
            found[:] = [
                r
                for r in self.runs(node, phase, where.get("job_id"))
                if r["started"] >= after
                and all(r.get(k) == v for k, v in where.items() if k != "job_id")
            ]
            return len(found) >= count

        self._poll(done, timeout, lambda: f"{count} {phase} run(s) on {node} (have {len(found)})")
        return found

    def sync_health_check(self, node: str, timeout: float = 15) -> None:
        """Return right after `node` recorded a health check: the next is an interval away."""
        self.wait_runs(node, "healthcheck", after=time.time(), timeout=timeout)

    # ---- polling -------------------------------------------------------------------------------
    def _poll(self, done, timeout: float, what: object = "a condition") -> None:
        """Call `done` every 0.1 s, every 0.5 s once 5 s have gone by: a wait for a job's time
        limit (a minute and more) would otherwise cost a thousand scontrol calls, CPU that the
        other suites of `make test` need."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            if done():
                return
            now = time.monotonic()
            if now > deadline:
                text = what() if callable(what) else what
                raise LabError(
                    f"timed out after {timeout:.0f} s waiting for {text}; logs: {self.dir}/log"
                )
            time.sleep(0.1 if now - start < 5 else 0.5)
