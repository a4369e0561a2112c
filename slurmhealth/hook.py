"""The `slurmhealth` entry point and its import-light commands.

`slurmhealth check` (and, later, the prolog/epilog/healthcheck hooks) run before every job, so
this module never imports click, jinja2 or sqlite_utils: it parses its few options by hand and
hands every other command to the click CLI (cli.py).
"""

from __future__ import annotations

import json
import os
import sys

from slurmhealth import config, runner
from slurmhealth.checks import AREAS
from slurmhealth.result import FAIL

LIGHT = ("check",)
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

CHECK_HELP = """Usage: slurmhealth check [OPTIONS]

  Gather GPU, NVLink, InfiniBand and kernel-log facts once, run every check the node's
  expectations call for, and print a verdict per check.

  Exit 0 when every check is ok, warn or skip; 1 when any fails; 2 for usage or config errors.

Options:
  --node NAME          node name (default: $SLURMD_NODENAME, else the host name)
  --only AREA          only these areas: gpu, nvlink, ib, xid (repeat or comma-separate)
  --json               print one JSON object instead of a table
  --gpu-source SRC     nvml (default) or a snapshot file to replay
  --sysfs-root DIR     read DIR/class/infiniband (default /sys)
  --kmsg PATH          kernel log: /dev/kmsg (default) or a file of kmsg records/dmesg lines
  --db PATH            node store (default $SLURMHEALTH_DB or /var/lib/slurmhealth/NODE.db)
  --no-db              keep no history and no baselines
  --config PATH        expectations (default $SLURMHEALTH_CONFIG or
                       /etc/slurmhealth/slurmhealth.toml)
  -h, --help           show this message

Example:
  slurmhealth check --only gpu,ib --json
  slurmhealth check --gpu-source node.json --no-db
"""

_VALUED = ("--node", "--only", "--gpu-source", "--sysfs-root", "--kmsg", "--db", "--config")
_FLAGS = ("--json", "--no-db", "-h", "--help")


class UsageError(Exception):
    """A command line that cannot be run: one line for the user, exit 2."""


def parse_args(argv: list, valued: tuple = _VALUED, flags: tuple = _FLAGS) -> dict:
    """`--opt value`, `--opt=value` and flags; repeated options collect into lists."""
    opts: dict = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in flags and not eq:
            opts[name] = True
        elif name in valued:
            if not eq:
                if not args:
                    raise UsageError(f"option {name} needs a value")
                value = args.pop(0)
            opts.setdefault(name, []).append(value)
        else:
            raise UsageError(f"no such option: {arg}")
    return opts


def _one(opts: dict, name: str, default: str | None = None) -> str | None:
    values = opts.get(name)
    return values[-1] if values else default


def node_name(opts: dict) -> str:
    return (
        _one(opts, "--node")
        or os.environ.get("SLURMD_NODENAME")
        or os.uname().nodename.split(".")[0]
    )


def _areas(opts: dict) -> list | None:
    if "--only" not in opts:
        return None
    areas = [a.strip() for v in opts["--only"] for a in v.split(",") if a.strip()]
    unknown = [a for a in areas if a not in AREAS]
    if unknown:
        raise UsageError(f"unknown area {unknown[0]!r} (choose from {', '.join(AREAS)})")
    return areas


def _open_store(opts: dict, node: str) -> object:
    """The node store, or None (with a note) when there is none to keep."""
    if opts.get("--no-db"):
        return None
    from slurmhealth import store  # noqa: PLC0415 - sqlite3 only when a store is used

    explicit = _one(opts, "--db") or os.environ.get("SLURMHEALTH_DB")
    path = explicit or store.default_path(node)
    if not explicit and not os.access(os.path.dirname(path) or ".", os.W_OK):
        print(f"slurmhealth: note: {path} not writable, keeping no history", file=sys.stderr)
        return None
    try:
        return store.connect(path)
    except store.StoreError as exc:
        print(f"slurmhealth: store unusable, verdict stands: {exc}", file=sys.stderr)
        return None


def load_config(path: str | None, conn: object) -> config.Config:
    """The config, parsed from the store's cache while the file is unchanged.

    Parsing TOML costs ~11 ms per run (tomllib import and parse), a quarter of the hot path's
    budget; the cache is keyed on the file's identity and this slurmhealth's version.
    """
    resolved = config.resolve_path(path)
    if resolved is None or conn is None:
        return config.load(resolved)
    from slurmhealth import __version__, store  # noqa: PLC0415

    try:
        st = os.stat(resolved)
    except OSError:
        return config.load(resolved)  # raises the clear error
    stamp = [st.st_mtime_ns, st.st_size, st.st_ino, __version__]
    key = f"config:{os.path.abspath(resolved)}"
    cached = store.get_meta(conn, key)  # type: ignore[arg-type]
    if isinstance(cached, dict) and cached.get("stamp") == stamp:
        return config.Config(cached["data"], resolved)
    loaded = config.load(resolved)
    store.set_meta(conn, key, {"stamp": stamp, "data": loaded.data})  # type: ignore[arg-type]
    return loaded


def _record(conn: object, run: runner.Run) -> None:
    from slurmhealth import store  # noqa: PLC0415

    try:
        store.record_run(conn, run)  # type: ignore[arg-type]
    except store.StoreError as exc:
        print(f"slurmhealth: could not record the run, verdict stands: {exc}", file=sys.stderr)


def format_table(run: runner.Run) -> str:
    width = max([len(r.check) for r in run.results] + [5])
    lines = [f"{'CHECK':<{width}}  STATUS  MESSAGE"]
    for r in run.results:
        lines.append(f"{r.check:<{width}}  {r.status:<6}  {r.message}")
    lines.append(f"node {run.node}: {run.verdict} ({run.duration * 1000:.0f} ms)")
    return "\n".join(lines)


def check(argv: list) -> int:
    opts = parse_args(argv)
    if opts.get("-h") or opts.get("--help"):
        print(CHECK_HELP, end="")
        return EXIT_OK
    areas = _areas(opts)
    node = node_name(opts)
    conn = _open_store(opts, node)
    expect = load_config(_one(opts, "--config"), conn).for_node(node)
    baselines = {}
    if conn is not None:
        from slurmhealth import store  # noqa: PLC0415

        baselines = store.load_baselines(conn, node)  # type: ignore[arg-type]
    options = runner.Options(
        gpu_source=_one(opts, "--gpu-source", "nvml") or "nvml",
        sysfs_root=_one(opts, "--sysfs-root"),
        kmsg=_one(opts, "--kmsg"),
        kmsg_after=baselines.get("xid"),
    )
    run = runner.run(node, expect, options, areas, "check", baselines)
    if conn is not None:
        _record(conn, run)
    if opts.get("--json"):
        print(json.dumps(run.to_dict(), indent=1))
    else:
        print(format_table(run))
    sys.stdout.flush()
    return EXIT_FAIL if run.verdict == FAIL else EXIT_OK


def _finish(code: int) -> None:
    """Exit now: a gather thread stuck in a C call (hung NVML) must not hold the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in LIGHT:
        from slurmhealth.cli import cli  # noqa: PLC0415 - click, for the admin side only

        cli.main(args=argv, prog_name="slurmhealth")
        return
    try:
        code = check(argv[1:])
    except (UsageError, config.ConfigError, ValueError, OSError) as exc:
        print(f"slurmhealth: error: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    _finish(code)
