"""Shared test helpers: fixture paths and a runner for the real `slurmhealth` command."""

from __future__ import annotations

import contextlib
import os
import pathlib
import pty
import select
import shlex
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
FIXTURES = os.path.join(TESTS, "fixtures")
SNAPSHOTS = os.path.join(FIXTURES, "snapshots")
FAKE_NVML = os.path.join(TESTS, "fakenvml")
# Only the healthy snapshot is a file in SNAPSHOTS; every fault is built from it by faults.py
_generated: list = []


def faults_module():
    """tests/fixtures/snapshots/faults.py: the healthy snapshot plus its table of fault patches."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("faults", os.path.join(SNAPSHOTS, "faults.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snapshot_path(name: str) -> str:
    """The path of h100-hgx-<name>.json. faults.py writes every snapshot once per process, on first
    use, into a fresh temp dir (mode 0755, removed at exit) that hook processes can read too."""
    if not _generated:
        import atexit
        import shutil
        import tempfile

        directory = tempfile.mkdtemp(prefix="slurmhealth-snapshots-")
        os.chmod(directory, 0o755)
        atexit.register(shutil.rmtree, directory, True)
        faults_module().write_all(directory)
        _generated.append(directory)
    return os.path.join(_generated[0], f"h100-hgx-{name}.json")


def _absolute_pythonpath(env: dict) -> dict:
    """`env` with its PYTHONPATH made absolute: `PYTHONPATH=.` names this checkout, also for a
    command run from another directory."""
    if env.get("PYTHONPATH"):
        paths = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths)
    return env


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 60, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m slurmhealth ARGS` in a fresh process (in the directory `cwd`, else
    ours), as an admin would."""
    full_env = _absolute_pythonpath(dict(os.environ, **(env or {})))
    return subprocess.run(
        [sys.executable, "-m", "slurmhealth", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "node.db")


def run_on_pty(args: list, env: dict | None = None, timeout: float = 120) -> tuple:
    """Run `python -m slurmhealth ARGS` with stderr on a pseudo-terminal, as an admin at a
    terminal would: (exit code, stdout, what the terminal showed)."""
    main, side = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", *args],
        stdout=subprocess.PIPE,
        stderr=side,
        env=dict(os.environ, COLUMNS="100", **(env or {})),
    )
    os.close(side)
    shown = b""
    while select.select([main], [], [], timeout)[0]:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    out = proc.stdout.read() if proc.stdout else b""
    os.close(main)
    return proc.wait(timeout=60), out.decode(), shown.decode(errors="replace")


def require_real(reason: str) -> None:
    """The one way a test that needs a real service or privilege gives up: skip on a laptop
    without it, fail under CI (.ci/run sets SLURMHEALTH_REQUIRE_REAL=1), so CI never passes by
    skipping what it must run. Call it with why the test cannot run; it does not return."""
    if os.environ.get("SLURMHEALTH_REQUIRE_REAL") == "1":
        pytest.fail(f"SLURMHEALTH_REQUIRE_REAL=1 but this test cannot run: {reason}")
    pytest.skip(reason)


# Tests that need real services or root, by where they live or what they use: marked `real`, so
# `make test-fast` can leave them out (they still call require_real when the service is absent).
REAL_PATHS = ("slurm/", "report/test_browser.py", "test_packaging.py")
REAL_FIXTURES = ("small_fs", "node_exporter", "lab", "promtool", "pg_server")
# What these build does not depend on the Python the suite runs on (the .deb and .rpm from the
# system's own tools, a Debian 12 root, EL9's Python 3.9 and libraries): `make test` builds
# them in the 3.11 suite only.
BUILT_ONCE = ("packages", "debian_root", "el9")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        where = os.path.relpath(str(item.fspath), TESTS).replace(os.sep, "/")
        params = item.callspec.params.values() if hasattr(item, "callspec") else ()
        on_server = "postgresql" if "postgresql" in params else None
        if where.startswith(REAL_PATHS) or set(REAL_FIXTURES) & set(item.fixturenames):
            item.add_marker(pytest.mark.real)
        elif on_server == "postgresql":
            item.add_marker(pytest.mark.real)
        if on_server == "postgresql":
            item.add_marker(pytest.mark.twin)
        if set(BUILT_ONCE) & set(item.fixturenames):
            item.add_marker(pytest.mark.once)


@contextlib.contextmanager
def tmpfs(path, options: str):
    """A real tmpfs mounted at `path` (root only: skipped otherwise, a failure in CI)."""
    if os.geteuid() != 0:
        require_real("mounting a tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def planted_bug(tmp_path, module: str, function: str) -> str:
    """A PYTHONPATH entry whose sitecustomize makes `module.function` raise RuntimeError('bug'):
    our own bug, planted in a real hook process."""
    boom = tmp_path / "boom"
    boom.mkdir()
    (boom / "sitecustomize.py").write_text(
        f"import {module} as m\n"
        "def broken(*a, **k):\n    raise RuntimeError('bug')\n"
        f"m.{function} = broken\n"
    )
    return str(boom)


def store_at_version(db: str, version: int):
    """A store as an older slurmhealth left it: the first `version` migrations applied."""
    import sqlite3  # noqa: PLC0415

    from slurmhealth.core import store  # noqa: PLC0415

    old = sqlite3.connect(db, isolation_level=None)
    for number in range(1, version + 1):
        for statement in store.migration(number):
            old.execute(statement)
    old.execute(f"PRAGMA user_version = {version}")
    return old


def diag_records(
    node: str, when: float, probes: dict, model: str = "NVIDIA H100 80GB HBM3", gpus: int = 8
) -> dict:
    """A `diag` run as node/diag/run.py Diagnosis.records() gives it to store.record_run.
    probes: {probe: [outcome]}, each outcome {unit, status, figures, evidence}."""
    import json  # noqa: PLC0415

    sources = {"diag": {"level": "medium", "seconds": 300.0, "gpu_model": model, "gpus": gpus}}
    results = [
        {
            "check_name": f"diag.{probe}",
            "status": "fail" if any(_failed(o) for o in found) else "ok",
            "message": "",
            "action": "none",
            "data": json.dumps({"level": "medium", "outcomes": found}),
            "duration": 1.0,
        }
        for probe, found in probes.items()
    ]
    run = {
        "node": node,
        "job_id": None,
        "phase": "diag",
        "started": when,
        "duration": 300.0,
        "verdict": "fail" if any(r["status"] == "fail" for r in results) else "ok",
        "tool_version": "test",
        "sources": json.dumps(sources),
    }
    return {"run": run, "results": results, "events": [], "baselines": {}}


def _failed(outcome: object) -> bool:
    return isinstance(outcome, dict) and outcome.get("status") == "fail"


def outcome(unit: str, figures: dict, status: str = "pass") -> dict:
    """One outcome of a diag probe, as node/diag/probes.py outcome() shapes it."""
    return {"unit": unit, "status": status, "figures": figures, "evidence": ""}


# --- stand-in tools for `slurmhealth diagnose` (tests/node/diag, tests/fleet/test_diagnose.py) ---

DIAG = os.path.join(FIXTURES, "diag")
CAT = shutil.which("cat")
# The node's sources as the fixtures give them: a healthy 8x H100 node.
HEALTHY_SOURCES = (
    "--gpu-source",
    os.path.join(FIXTURES, "snapshots", "h100-hgx-healthy.json"),
    "--sysfs-root",
    os.path.join(FIXTURES, "sysfs", "healthy-8x-ndr"),
    "--kmsg",
    os.path.join(FIXTURES, "kmsg", "healthy.kmsg"),
)


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """settings.diag_tools, empty until a test writes a stand-in into it; PATH holds nothing,
    so a machine's own dcgmi or perftest never stands in for ours."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    folder = tmp_path / "tools"
    folder.mkdir()
    return folder


def stand_in(tools, name: str, body: str) -> str:
    """tools/NAME, a shell script (ours, fixed text) that appends `$$ argv` to tools/../NAME.argv
    and then runs `body`. Returns the argv file's path (read it with stand_in_calls)."""
    calls = tools.parent / f"{name}.argv"
    script = tools / name
    script.write_text(f'#!/bin/sh\necho "$$ $*" >> {shlex.quote(str(calls))}\n{body}\n')
    script.chmod(0o755)
    return str(calls)


def printing(fixture: str) -> str:
    """A stand-in's body that prints a fixture of tests/fixtures/diag."""
    return f"{CAT} {shlex.quote(os.path.join(DIAG, fixture))}"


def stand_in_calls(path: str) -> list:
    """[(pid, argv string)] of every call a stand-in recorded, in order."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [tuple(line.rstrip("\n").split(" ", 1)) for line in handle]


def diag_config(tmp_path, tools) -> str:
    """A root-only config naming `tools` as settings.diag_tools (a config others could write is
    refused)."""
    path = tmp_path / "diag.toml"
    path.write_text(f'[settings]\ndiag_tools = "{tools}"\n')
    path.chmod(0o600)
    return str(path)


def record_sources(conn, node: str, started: float, sources: dict) -> None:
    """A passing health check of `node` whose sources JSON is `sources` (versions and the
    like), recorded through store.record_run."""
    import json

    from slurmhealth.core import store

    run = {
        "node": node,
        "job_id": None,
        "phase": "healthcheck",
        "started": started,
        "duration": 0.04,
        "verdict": "ok",
        "tool_version": "x",
        "sources": json.dumps(sources),
    }
    store.record_run(conn, {"run": run, "results": [], "events": [], "baselines": {}})


# --- a user who is not root: `nobody`, through setpriv (util-linux) -------------------------

NOBODY = 65534


def run_as_nobody(*args: str, env: dict | None = None, timeout: float = 60, before: str = ""):
    """`python -m slurmhealth ARGS` as the user nobody (no groups), as a user on a node runs it.
    `before`: Python run in that process first (a fixed path, such as the default config's,
    pointed into the test's directory). Needs root to switch user: skipped otherwise, a failure
    in CI (require_real)."""
    if os.geteuid() != 0:
        require_real("running a command as another user needs root")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        require_real("setpriv (util-linux) is not installed")
    user = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    python, extra = _python_for_nobody(user)
    argv = [*user, python]
    full_env = dict(_absolute_pythonpath(dict(os.environ)), PYTHONDONTWRITEBYTECODE="1")
    full_env.update(**extra, **(env or {}))
    main = "import sys\nfrom slurmhealth.__main__ import main\nmain(sys.argv[1:])"
    start = ["-c", f"{before}\n{main}"] if before else ["-m", "slurmhealth"]
    return subprocess.run(
        [*argv, *start, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd="/",  # pytest's own directories are root's, 0700
    )


_NOBODY_PYTHON: list = []


def _python_for_nobody(user: list) -> tuple:
    """(interpreter, environment) that the user nobody can start: this test's own, unless it
    lives where nobody may not go (a pyenv build under /root, 0700, whose libpython the loader
    cannot open); then the system's python3 with this tree on its path (it has click:
    scripts/install-deps) and a readable copy of this tree's package. What these tests judge,
    the messages, is the same on any Python."""
    if not _NOBODY_PYTHON:
        probe = subprocess.run(
            [*user, sys.executable, "-c", "import click"], capture_output=True, cwd="/", check=False
        )
        if probe.returncode == 0:
            _NOBODY_PYTHON.append((sys.executable, {}))
        else:
            _NOBODY_PYTHON.append(("/usr/bin/python3", {"PYTHONPATH": _public_copy()}))
    return _NOBODY_PYTHON[0]


def _public_copy() -> str:
    """This tree's package copied where anyone may read it (the checkout may sit in a 0700
    home), removed at exit."""
    import atexit
    import tempfile

    folder = tempfile.mkdtemp(prefix="slurmhealth-pkg-")
    atexit.register(shutil.rmtree, folder, True)
    shutil.copytree(os.path.join(REPO, "slurmhealth"), os.path.join(folder, "slurmhealth"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for root, _dirs, names in os.walk(folder):
        os.chmod(root, 0o755)
        for name in names:
            os.chmod(os.path.join(root, name), 0o644)
    return folder


@pytest.fixture
def public_dir():
    """A fresh directory anyone may enter (0755, root's), removed after the test: pytest's
    tmp_path sits in a 0700 directory nobody else can reach."""
    import tempfile

    path = tempfile.mkdtemp(prefix="slurmhealth-user-")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def host_tree(
    root,
    comms: dict | None = None,
    kthreads: tuple = (),
    init_children: tuple | None = None,
    modules: str | None = "",
    net: dict | None = None,
    edac: dict | None = None,
    boot_id: str = "3b1f6c0e-5c1d-4f6a-9d7e-1f2e3d4c5b6a",
) -> str:
    """A host tree as sources/kernel.py reads it, in the kernel's formats (proc(5),
    sysfs-class-net, sysfs-devices-edac): `comms` {pid: comm} (pid 1 "systemd", pid 2
    "kthreadd" when `kthreads` are given); `modules` the text of /proc/modules (None: no file);
    `net` {iface: {file: text, "device": bool}}; `edac` {mcN: {file: text, "dimms": {dimmN:
    {file: text}}}} (None: no EDAC tree). Returns the root."""
    root = str(root)
    proc = os.path.join(root, "proc")
    comms = dict(comms or {})
    comms.setdefault(1, "systemd")
    if kthreads:
        comms[2] = "kthreadd"
    for pid, comm in comms.items():
        os.makedirs(os.path.join(proc, str(pid), "task", str(pid)), exist_ok=True)
        pathlib.Path(proc, str(pid), "comm").write_text(comm + "\n")
    if kthreads:
        pathlib.Path(proc, "2", "task", "2", "children").write_text(
            "".join(f"{p} " for p in kthreads)
        )
    if init_children is not None:
        pathlib.Path(proc, "1", "task", "1", "children").write_text(
            "".join(f"{p} " for p in init_children)
        )
    os.makedirs(os.path.join(proc, "sys", "kernel", "random"), exist_ok=True)
    pathlib.Path(proc, "sys", "kernel", "random", "boot_id").write_text(boot_id + "\n")
    if modules is not None:
        pathlib.Path(proc, "modules").write_text(modules)
    for name, files in (net or {}).items():
        folder = os.path.join(root, "sys", "class", "net", name)
        os.makedirs(folder, exist_ok=True)
        for key, text in files.items():
            if key == "device":
                if text:
                    os.makedirs(os.path.join(folder, "device"), exist_ok=True)
                continue
            pathlib.Path(folder, key).write_text(f"{text}\n")
    os.makedirs(os.path.join(root, "sys", "class", "net"), exist_ok=True)
    for mc, files in (edac or {}).items():
        folder = os.path.join(root, "sys", "devices", "system", "edac", "mc", mc)
        os.makedirs(folder, exist_ok=True)
        for key, text in files.items():
            if key != "dimms":
                pathlib.Path(folder, key).write_text(f"{text}\n")
        for dimm, dimm_files in files.get("dimms", {}).items():
            os.makedirs(os.path.join(folder, dimm), exist_ok=True)
            for key, text in dimm_files.items():
                pathlib.Path(folder, dimm, key).write_text(f"{text}\n")
    return root


# /proc/modules lines as the kernel prints them (kernel/module/procfs.c m_show): name, size, use
# count, users ("-" for none, else "a,b,"), state, load address (0 to a user without it).
MODULES_TEXT = (
    "nvidia_uvm 4956160 8 - Live 0x0000000000000000 (POE)\n"
    "nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)\n"
    "nvidia_drm 126976 0 - Live 0x0000000000000000 (POE)\n"
    "nvidia_modeset 1343488 1 nvidia_drm, Live 0x0000000000000000 (POE)\n"
    "nvidia 56807424 120 nvidia_uvm,nvidia_peermem,nvidia_modeset, Live 0x0000000000000000 (POE)\n"
    "mlx5_ib 491520 0 - Live 0x0000000000000000\n"
    "ib_uverbs 200704 2 nvidia_peermem,mlx5_ib, Live 0x0000000000000000\n"
    "ib_core 507904 3 mlx5_ib,ib_uverbs,ib_ipoib, Live 0x0000000000000000\n"
    "mlx5_core 2351104 1 mlx5_ib, Live 0x0000000000000000\n"
    "ib_ipoib 143360 0 - Live 0x0000000000000000\n"
    "ext4 1028096 2 - Live 0x0000000000000000\n"
)


def hw_tree(root, meminfo: str | None, online="0-7", present="0-7", smt="on", threads=2,
            sockets=2) -> str:
    """A host root with proc/meminfo (the text of `meminfo`; None: no file) and
    sys/devices/system/cpu as sources/host.py reads them (sysfs-devices-system-cpu,
    cputopology.rst): `present` CPUs, `sockets` packages of consecutive CPUs and `threads`
    siblings per core (cpuN and cpuN+half). Returns the root."""
    from slurmhealth.node.sources import host  # noqa: PLC0415 - only the tests that build one

    root = pathlib.Path(root)
    (root / "proc").mkdir(parents=True, exist_ok=True)
    if meminfo is not None:
        (root / "proc" / "meminfo").write_text(meminfo)
    cpu = root / "sys" / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    for name, text in (("online", online), ("present", present), ("possible", present)):
        (cpu / name).write_text(text + "\n")
    if smt is not None:
        (cpu / "smt").mkdir(exist_ok=True)
        (cpu / "smt" / "control").write_text(smt + "\n")
    count = len(host.cpulist(present) or [])
    cores = count // threads
    per_package = cores // sockets
    for n in host.cpulist(online) or []:
        core = n % cores
        first = core // per_package * per_package
        topo = cpu / f"cpu{n}" / "topology"
        topo.mkdir(parents=True, exist_ok=True)
        siblings = [core + t * cores for t in range(threads)]
        packaged = [f"{first + t * cores}-{first + per_package - 1 + t * cores}"
                    for t in range(threads)]
        (topo / "thread_siblings_list").write_text(",".join(map(str, siblings)) + "\n")
        (topo / "core_siblings_list").write_text(",".join(packaged) + "\n")
    return str(root)


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server for the session (tests/pgserver.py), or require_real."""
    import pgserver

    why = pgserver.why_not()
    if why:
        require_real(why)
    server = pgserver.Server()
    yield server
    server.remove()


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_store(request, tmp_path):
    """A fleet store to create, on each backend: a SQLite file's path, then a fresh PostgreSQL
    database's URL on the session's server."""
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    return request.getfixturevalue("pg_server").new_database()


def open_fleet(db: str):
    """The fleet store `db` names: a SQLite file's path or a PostgreSQL URL (fleet/pgstore.py),
    as the fleet commands open it."""
    from slurmhealth.core import store
    from slurmhealth.fleet import pgstore

    return pgstore.connect(db) if db.startswith(store.SERVER_PREFIXES) else store.connect(db)
