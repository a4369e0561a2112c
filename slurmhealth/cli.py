"""The admin and user side of `slurmhealth`: click commands, each a thin veneer over the library.

`check` itself lives in node/agent.py (import-light, it runs before every job; the entry point
sends it there); it is listed here so that `slurmhealth --help` shows it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
from collections.abc import Callable, Iterator

import click

from slurmhealth import __version__
from slurmhealth.core import command, slurm, store, timespec
from slurmhealth.core.hostlist import is_node_name
from slurmhealth.core.result import clean
from slurmhealth.fleet import (
    collect,
    history,
    lemons,
    notify,
    peers,
    pgstore,
    queries,
    records,
    rollup,
    slurmconf,
    text,
)
from slurmhealth.node import agent, config, runner, sources

TYPE_CHECKING = False  # mypy reads the block below; nothing of it is needed at run time
if TYPE_CHECKING:
    import sqlite3
    from typing import Any, TypeVar

    # A command's function, which click's option decorators return as they received it.
    F = TypeVar("F", bound=Callable[..., Any])


def source_options(func: F) -> F:
    """--gpu-source, --sysfs-root, --kmsg, --host-root: where facts come from (shared by several
    commands)."""
    for option in reversed(
        (
            click.option(
                "--gpu-source",
                default="nvml",
                show_default=True,
                help="nvml, or a snapshot file to replay",
            ),
            click.option("--sysfs-root", default=None, help="read DIR/class/infiniband [/sys]"),
            click.option("--kmsg", default=None, help="kernel log path [/dev/kmsg]"),
            click.option(
                "--host-root", default=None, help="read DIR/proc and DIR/sys for the host [/]"
            ),
        )
    ):
        func = option(func)
    return func


node_option = click.option("--node", default=None, help="node name [$SLURMD_NODENAME or host name]")
output_option = click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default="-",
    help="write here instead of standard output",
)


def _options(
    gpu_source: str, sysfs_root: str | None, kmsg: str | None, host_root: str | None = None
) -> sources.Options:
    return sources.Options(
        gpu_source=gpu_source, sysfs_root=sysfs_root, kmsg=kmsg, host_root=host_root
    )


def _load_config(path: str | None, error: type = click.ClickException) -> config.Config:
    try:
        return config.load(path)
    except config.ConfigError as exc:
        raise error(str(exc)) from None


@contextlib.contextmanager
def _progress(length: int, label: str) -> Iterator:
    """A progress bar's update function on a terminal; None (quiet) otherwise."""
    if not length or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


def _console() -> command.Console:
    """Where a command's orchestration writes: click's echo, a progress bar on a terminal."""
    err, write = (lambda line: click.echo(line, err=True)), (lambda t: click.echo(t, nl=False))
    return command.Console(click.echo, err, write, _progress)


def _said(func: Callable[..., None]) -> Callable[..., None]:
    """A command whose orchestration raises command.CommandError: click's own error of the
    same words (a bad value names its option; a usage error exits 2, as click's)."""

    @functools.wraps(func)
    def said(*args: object, **kwargs: object) -> None:
        try:
            func(*args, **kwargs)
        except command.CommandError as exc:
            if exc.option:
                raise click.BadParameter(str(exc), param_hint=exc.option) from None
            if exc.usage:
                raise click.UsageError(str(exc)) from None
            # click's exit status is its exception class's: say the error as click's main
            # would, then exit with the command's own status
            click.ClickException(str(exc)).show()
            raise click.exceptions.Exit(exc.status) from None

    return said


class _UsageLine(click.ClickException):
    """A usage error as one line (click's own prints usage, a hint, a blank line and the error):
    `Error: MESSAGE (see 'slurmhealth CMD --help')`, exit 2 as click gives it."""

    exit_code = 2


class _Group(click.Group):
    """A store that turns out damaged or locked in the middle of any command is one line and
    exit 1, never a traceback (a command's own checks say more where they can); a usage error
    is one line, exit 2."""

    def make_context(
        self, info_name: str | None, args: list, parent: click.Context | None = None, **extra
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:  # the group's own options: `slurmhealth --bogus`
            where = exc.ctx.command_path if exc.ctx is not None else (info_name or "slurmhealth")
            raise _UsageLine(f"{exc.format_message()} (see '{where} --help')") from None

    def invoke(self, ctx: click.Context) -> object:
        import sqlite3  # noqa: PLC0415 - already loaded by the store

        try:
            return super().invoke(ctx)
        except (store.StoreError, sqlite3.Error) as exc:
            raise click.ClickException(f"store: {clean(exc)}") from None
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            raise _UsageLine(f"{exc.format_message()} (see '{where} --help')") from None
        except agent.UsageError as exc:  # no node name to go by ($SLURMD_NODENAME, host name)
            where = f"{ctx.command_path} {ctx.invoked_subcommand}"
            raise _UsageLine(f"{exc} (see '{where} --help')") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="slurmhealth")
def cli() -> None:
    """GPU node health for Slurm: checks, history, lemon detection.

    \b
    Example:
        slurmhealth check --json
    """


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.pass_context
def check(ctx: click.Context) -> None:
    """Run every check the node's expectations call for (see `slurmhealth check --help`).

    \b
    Example:
        slurmhealth check --only gpu,ib --json
    """
    ctx.exit(agent.run_check(list(ctx.args)))


@cli.command()
@node_option
@output_option
@source_options
@_said
def snapshot(
    node: str | None,
    output: str,
    gpu_source: str,
    sysfs_root: str | None,
    kmsg: str | None,
    host_root: str | None,
) -> None:
    """Write everything the checks read on this node as one JSON document.

    Replaying it with `check --gpu-source FILE` gives the same verdicts
    (format: docs/snapshot-format.md). Exit 0; 4 when a source could not be read (the kernel
    log, not being root): the snapshot is written without it, said in one line on stderr.

    \b
    Example:
        slurmhealth snapshot -o /tmp/gpu01.json
    """
    options = _options(gpu_source, sysfs_root, kmsg, host_root)
    if runner.save_snapshot(agent.node_name(node), options, output, _console()):
        sys.exit(agent.EXIT_INCOMPLETE)


@cli.group(name="config")
def config_group() -> None:
    """Validate, show and generate the expectations file.

    \b
    Example:
        slurmhealth config show --node gpu07
    """


@config_group.command()
@click.argument("file", required=False)
@click.option("--config", "path", default=None, help="file [$SLURMHEALTH_CONFIG or default]")
def validate(file: str | None, path: str | None) -> None:
    """Check a config file (FILE, --config, $SLURMHEALTH_CONFIG or the default); print each
    problem as one line, FILE:LINE: message; exit 2 on any.

    \b
    Example:
        slurmhealth config validate /etc/slurmhealth/slurmhealth.toml
    """
    if file and path and file != path:
        raise click.UsageError("name the file once: FILE or --config")
    status = config.validate_file(file or path, _console())
    if status:
        sys.exit(status)


@config_group.command()
@click.option("--config", "path", default=None, help="file [$SLURMHEALTH_CONFIG or default]")
@node_option
def show(path: str | None, node: str | None) -> None:
    """Print the effective expectations of a node as JSON.

    \b
    Example:
        slurmhealth config show --node gpu07
    """
    name = agent.node_name(node)
    effective = _load_config(path).for_node(name)
    click.echo(json.dumps({"node": name, **effective}, indent=1, sort_keys=True))


@config_group.command()
def example() -> None:
    """Print the annotated example config: every key and every check, with its default and why.

    \b
    Example:
        slurmhealth config example > /etc/slurmhealth/slurmhealth.toml
    """
    click.echo(config.example_text(), nl=False)


@config_group.command()
@node_option
@output_option
@source_options
@_said
def genconf(
    node: str | None,
    output: str,
    gpu_source: str,
    sysfs_root: str | None,
    kmsg: str | None,
    host_root: str | None,
) -> None:
    """Write expectations from this node's facts (run it on a known-good node).

    \b
    Example:
        slurmhealth config genconf -o /etc/slurmhealth/slurmhealth.toml
    """
    from slurmhealth.node import genconf as generate  # noqa: PLC0415 - only this command

    options = _options(gpu_source, sysfs_root, kmsg, host_root)
    generate.write(agent.node_name(node), options, output, _console())


@config_group.command(name="from-nhc")
@click.argument("file", type=click.Path(dir_okay=False))
@output_option
@click.option("--check", is_flag=True, help="exit 1 when a line is not translated in full")
@_said
def from_nhc(file: str, output: str, check: bool) -> None:
    """Translate an LBNL NHC configuration (FILE, e.g. /etc/nhc/nhc.conf) into slurmhealth's
    expectations, and list, line by line, what it cannot translate and why (on stderr, and as
    comments at the top of what it writes). Runs nothing the file names. docs/nhc.md says
    which NHC checks map to what. Exit 0; with --check 1 when a line is not translated in
    full; 2 when FILE cannot be read.

    \b
    Example:
        slurmhealth config from-nhc /etc/nhc/nhc.conf -o /etc/slurmhealth/slurmhealth.toml
    """
    from slurmhealth.node import nhc  # noqa: PLC0415 - only this command needs it

    if nhc.from_file(file, output, _console()) and check:
        sys.exit(1)


@config_group.command(name="slurm-conf")
@click.argument("file", required=False)
@click.option(
    "--hook",
    default=slurmconf.HOOK,
    show_default=True,
    metavar="PATH",
    callback=lambda ctx, param, value: _on_the_nodes(value),
    help="the hook's path on the nodes",
)
@click.option(
    "--conf-dir",
    default=None,
    metavar="DIR",
    callback=lambda ctx, param, value: _on_the_nodes(value),
    help="slurm.conf's directory on the nodes: prolog.d, epilog.d, slurmhealth.env [FILE's]",
)
@click.option(
    "--slurm-version",
    default=None,
    metavar="X.Y",
    callback=lambda ctx, param, value: _slurm_version(value),
    help="the nodes' Slurm (slurmd -V): from 24.05 every Prolog and Epilog line runs",
)
@click.option("--check", is_flag=True, help="exit 1 when a line must change")
def slurm_conf(
    file: str | None, hook: str, conf_dir: str | None, slurm_version: tuple | None, check: bool
) -> None:
    """Print the slurm.conf lines slurmhealth needs, each merged with what FILE sets now
    ($SLURM_CONF, else /etc/slurm/slurm.conf; its Includes read too), the line it replaces
    and why, then the commands to run on every node. Writes nothing.

    A site's Prolog, Epilog and flags keep working beside slurmhealth's; a HealthCheckProgram
    such as NHC runs from slurmhealth's hook. Exit 0; with --check 1 when a line must change;
    2 when FILE cannot be read.

    \b
    Example:
        slurmhealth config slurm-conf /etc/slurm/slurm.conf --check
    """
    path = file or os.environ.get("SLURM_CONF") or slurmconf.DEFAULT_CONF
    try:
        conf = slurmconf.load(path)
    except OSError as exc:
        raise _Refused(f"{clean(path, 300)}: {exc.strerror or exc}") from None
    advice = slurmconf.advise(conf, slurmconf.paths_for(path, hook, conf_dir, slurm_version))
    click.echo(slurmconf.render(advice, path), nl=False)
    if check and advice.changes:
        sys.exit(1)


def _open(path: str) -> sqlite3.Connection:
    """command.open_store, its one line click's error."""
    try:
        return pgstore.open_store(path, str(click.get_current_context().info_name))
    except command.CommandError as exc:
        raise click.ClickException(str(exc)) from None


def _one_node(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--node NAME of a command that opens NAME's store: one node's name, never a path."""
    if value is not None and not is_node_name(value):
        raise click.BadParameter(f"not a node name: {clean(repr(value), 80)}")
    return value


def _store_paths(db: str | None, node: str | None) -> list:
    """history.store_paths, a state directory this user may not list said as such."""
    try:
        return history.store_paths(db, node)
    except PermissionError as exc:
        raise _denied(os.path.join(str(exc.filename), "*.db")) from None


def _denied(path: str) -> click.ClickException:
    """command.denied as click's error."""
    return click.ClickException(command.denied(path, str(click.get_current_context().info_name)))


def _on_the_nodes(path: str | None) -> str | None:
    """A path on the nodes that slurm.conf and the printed links name: absolute (a relative
    one would be read from slurm.conf's directory by slurmd, from the shell's by `ln`)."""
    if path is not None and not path.startswith("/"):
        raise click.BadParameter(f"not an absolute path: {clean(repr(path), 200)}")
    return path


def _slurm_version(text: str | None) -> tuple | None:
    """--slurm-version X.Y as (major, minor)."""
    if text is None:
        return None
    version = slurmconf.slurm_version(text)
    if version is None:
        raise click.BadParameter(f"not a Slurm version (e.g. 24.05): {clean(repr(text), 80)}")
    return version


def _a_number(value: float) -> float:
    """A FloatRange's value, NaN refused (it compares false with both bounds, so passes)."""
    if math.isnan(value):
        raise click.BadParameter("nan is not a number")
    return value


def _instant(text: str | None, hint: str = "--now") -> float:
    try:
        return timespec.parse_instant(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=_named(hint)) from None


def _duration(text: str, hint: str = "--window") -> float:
    try:
        return timespec.parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=_named(hint)) from None


def _named(option: str) -> str:
    """How the error names the option: its environment variable where the value came from
    there (cron's periodic.env), so an admin who never typed the option knows what to fix."""
    ctx = click.get_current_context(silent=True)
    param = next((p for p in ctx.command.params if option in p.opts), None) if ctx else None
    if ctx and param and param.envvar and param.name:
        if ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT:
            return f"${param.envvar} ({option})"
    return option


def _start(text: str, end: float, hint: str = "--since") -> float:
    """--since / --older-than: a duration back from `end` (7d, 1d12h) or a time (2024-01-01,
    now-7d). `hint`: the option, for the error."""
    try:
        return timespec.parse_start(text, end)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=_named(hint)) from None


@cli.command(name="history")
@click.option("--node", default=None, callback=_one_node, help="only this node (and its store)")
@click.option("--job", default=None, help="only runs of this job")
@click.option(
    "--since",
    default="7d",
    show_default=True,
    help="how far back (24h, 1d12h) or since when (2024-01-01, now-7d)",
)
@click.option("--now", default=None, help="replay: the time to count back from")
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000_000),
    default=200,
    show_default=True,
    help="at most this many runs",
)
@click.option("--db", default=None, help="a store file [$SLURMHEALTH_DB or the state dir]")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("-q", "--quiet", is_flag=True, help="only runs that did not pass, drains and resumes")
@_said
def history_cmd(
    node: str | None,
    job: str | None,
    since: str,
    now: str | None,
    limit: int,
    db: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Show recorded runs (prolog, epilog, health check, check), drains and resumes.

    \b
    Example:
        slurmhealth history --node gpu07 --since 24h
    """
    start = _start(since, _instant(now))
    request = history.Request(db, node, job, start, limit, quiet, as_json)
    history.show(request, _console())


@cli.command()
@click.option(
    "--older-than",
    "older",
    required=True,
    help="delete records older than this, with a unit: 90d (s, m, h, d, w; a bare number "
    "is refused)",
)
@click.option("--dry-run", is_flag=True, help="say how many records would go; delete nothing")
@click.option("--node", default=None, callback=_one_node, help="only this node's store")
@click.option("--db", default=None, help="a store file [$SLURMHEALTH_DB or the state dir]")
@click.option("--now", default=None, help="replay: the time to count back from")
def prune(older: str, dry_run: bool, node: str | None, db: str | None, now: str | None) -> None:
    """Delete old records and VACUUM (admin side: never run from a prolog).

    \b
    Example:
        slurmhealth prune --older-than 90d --dry-run
        slurmhealth prune --older-than 90d
    """
    before = _start(older, _instant(now), "--older-than")
    for path in _store_paths(db, node):
        try:
            counts = store.prune(_open(path), before, dry_run)
        except store.StoreError as exc:
            raise click.ClickException(f"{path}: {exc}") from None
        click.echo(text.pruned(path, counts, dry_run))


# --- the fleet store: export on nodes, import and collect on the head node (docs/fleet.md) ---


def _fleet_path(db: str | None) -> str:
    return store.fleet_path(db)


def _open_fleet(db: str | None) -> sqlite3.Connection:
    path = _fleet_path(db)
    try:
        if path.startswith(store.SERVER_PREFIXES):
            return pgstore.connect(path)
        return store.connect(path)
    except store.StoreError as exc:
        raise click.ClickException(str(exc)) from None


def _since(since: str | None, now: str | None) -> float | None:
    return None if since is None else _start(since, _instant(now))


fleet_db_option = click.option(
    "--db",
    default=None,
    help="the fleet store [$SLURMHEALTH_FLEET_DB or /var/lib/slurmhealth/fleet.db]",
)


@cli.group(name="fleet")
def fleet_group() -> None:
    """The fleet store itself: move it onto a PostgreSQL server (docs/fleet.md).

    \b
    Example:
        slurmhealth fleet migrate /var/lib/slurmhealth/fleet.db postgresql://slurmhealth@db1/fleet
    """


@fleet_group.command(name="migrate")
@click.argument("sqlite_file", type=click.Path(dir_okay=False))
@click.argument("url")
@_said
def fleet_migrate(sqlite_file: str, url: str) -> None:
    """Copy the SQLite fleet store SQLITE_FILE, every table, into the empty PostgreSQL
    database at URL (postgresql://USER@HOST/DB; a password from ~/.pgpass or $PGPASSWORD, never
    on the command line), in one transaction: nothing is copied unless all is. The file is
    read, never changed. Point $SLURMHEALTH_FLEET_DB (or --db) at URL afterwards.

    \b
    Example:
        slurmhealth fleet migrate /var/lib/slurmhealth/fleet.db postgresql://slurmhealth@db1/fleet
    """
    if not url.startswith(store.SERVER_PREFIXES):
        raise _Refused(f"{clean(url, 200)}: not a postgresql:// URL")
    if not os.path.isfile(sqlite_file):
        raise _Refused(f"{clean(sqlite_file, 300)}: no such file")
    try:
        conn = pgstore.connect(url)
        counts = pgstore.copy_from(sqlite_file, conn)
    except store.StoreError as exc:
        raise _Refused(str(exc)) from None
    rows = ", ".join(f"{n} {t}" for t, n in counts.items() if n)
    click.echo(f"copied {rows or 'nothing (an empty store)'} into {pgstore.shown(url)}")


@cli.command(name="export")
@click.option("--db", default=None, help="the store [$SLURMHEALTH_DB or this node's store]")
@click.option("--since", default=None, help="only records newer than this, e.g. 7d [all]")
@click.option("--now", default=None, help="replay: the time to count back from")
@click.option(
    "--incremental",
    is_flag=True,
    help="only what is new since the last export to FILE (with an overlap; never before --since)",
)
@output_option
@_said
def export_cmd(
    db: str | None, since: str | None, now: str | None, incremental: bool, output: str
) -> None:
    """Write the store's records as NDJSON with stable ids (format: docs/fleet.md).

    A file is written as a private (0600) temporary file beside it and renamed when complete,
    so `collect` never reads half an export; a symlink at FILE is refused. Baselines and cached
    config stay on the node. --incremental (the spool, every 5 minutes): what is new since the
    previous export to FILE, or since where that one started while it is still there unread.
    A node no hook has run on yet has no store: said, nothing written, exit 0 (--db names a
    store that must exist).

    \b
    Example:
        slurmhealth export --since 7d -o /shared/slurmhealth/spool/gpu07.ndjson
        slurmhealth export --incremental --since 2d -o /shared/slurmhealth/spool/gpu07.ndjson
    """
    path = db or store.default_path(agent.node_name())
    if db is None and _not_yet(path):
        # a node no hook has run on yet (the first health check makes its store): nothing to
        # export, no failure every 5 minutes; a node whose hooks never run is named by the head
        # node from its jobs (`lemons`, the report)
        click.echo(f"no run recorded on this node yet (no store at {path}): nothing exported")
        return
    records.export_to(_open(path), output, _since(since, now), incremental, _console())


def _not_yet(path: str) -> bool:
    """Whether the node store at `path` does not exist (not: cannot be seen by this user)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # said by _open, as for any store
    return False


@cli.command(name="import")
@click.argument("files", nargs=-1, required=True)
@fleet_db_option
def import_cmd(files: tuple, db: str | None) -> None:
    """Merge NDJSON exports (FILE or - for standard input) into the fleet store.

    Idempotent: importing a file again changes nothing. A line that is not a record (the cut
    last line of an export still being written) is reported and skipped, never half-imported.

    \b
    Example:
        slurmhealth import /shared/slurmhealth/spool/*.ndjson
    """
    conn = _open_fleet(db)
    for name in files:
        source = sys.stdin.buffer if name == "-" else name
        try:
            size = 0 if name == "-" else os.path.getsize(name)
            with _progress(size, f"import {clean(name, 80)}") as tick:  # any node's name
                report = records.import_ndjson(conn, source, tick)
        except (records.FleetError, OSError) as exc:
            raise click.ClickException(f"{clean(name, 300)}: {clean(exc, 300)}") from None
        click.echo(text.imported(name, report))
        for line in text.skipped_lines(name, report):
            click.echo(line, err=True)


@cli.command(name="collect")
@click.argument("directory")
@fleet_db_option
@click.option(
    "--since",
    default="28d",
    show_default=True,
    help="merge records newer than this; the window asked of sacct",
)
@click.option("--now", default=None, help="replay: the time to count back from")
@click.option(
    "--sacct",
    "use_sacct",
    is_flag=True,
    help="also merge job outcomes and node events from Slurm accounting",
)
@click.option(
    "--slurm-bin",
    default="",
    help="directory of sacct, sacctmgr, scontrol, sinfo [$SLURMHEALTH_SLURM_BIN, PATH]",
)
@click.option(
    "--spool-owner",
    "spool_owners",
    multiple=True,
    envvar="SLURMHEALTH_SPOOL_OWNER",
    metavar="USER",
    help="also trust files owned by USER (nodes writing as nobody over root-squashed NFS) "
    "[$SLURMHEALTH_SPOOL_OWNER; default: root's files only]",
)
@click.option(
    "--consume", is_flag=True, help="remove each NDJSON spool file once merged (the 5-minute cycle)"
)
@click.option("--full", is_flag=True, help="ignore watermarks: read all of --since again")
@click.option(
    "--rollup-after",
    default=None,
    help="count passing runs older than this per node-hour (e.g. 2d) [keep every run]",
)
@click.option(
    "--rollup-max",
    type=click.IntRange(min=0),
    default=rollup.ROLLUP_MAX,
    envvar="SLURMHEALTH_ROLLUP_MAX",
    metavar="NODE_HOURS",
    help="roll up at most this many node-hours per collect, the rest next time; 0: all due "
    f"[$SLURMHEALTH_ROLLUP_MAX; default: {rollup.ROLLUP_MAX:,}]",
)
@_said
def collect_cmd(
    directory: str,
    db: str | None,
    since: str,
    now: str | None,
    use_sacct: bool,
    slurm_bin: str,
    spool_owners: tuple,
    consume: bool,
    full: bool,
    rollup_after: str | None,
    rollup_max: int,
) -> None:
    """Merge node stores (copied *.db files) and NDJSON spools (*.ndjson) into the fleet store.

    A file that cannot be read (not a database, still being copied) is reported and skipped,
    and so is one anyone could have forged: a symlink, not owned by root (or --spool-owner), or
    writable by group or others (docs/fleet.md). --sacct adds what Slurm accounting knows of
    each job (final state, NODE_FAIL: a job whose node died before its epilog still counts) and
    of nodes going down, draining or failing (which node of a NODE_FAIL job failed), and where
    Slurm puts each node (leaf switch or block, partitions: one incident's place). Collecting
    again adds nothing. Incremental: each file, and accounting, is read from where the last
    collect left it (less an overlap), never before --since; --full reads all of --since.
    --rollup-after keeps the fleet store small (docs/fleet.md); --rollup-max bounds what one
    cycle rolls up (a 10,000-node fleet adds 10,000 node-hours an hour, 834 per 5-minute cycle).

    \b
    Example:
        slurmhealth collect /shared/slurmhealth/spool --sacct --since 2d
        slurmhealth collect /shared/slurmhealth/spool --sacct --consume --rollup-after 2d
    """
    owners = collect.owner_ids(spool_owners)
    conn = _open_fleet(db)
    end = _instant(now)
    request = collect.Request(
        directory, _start(since, end), end, owners, consume, full, rollup_after, rollup_max or None,
        use_sacct, slurm_bin,
    )  # fmt: skip
    collect.run(conn, _fleet_path(db), request, _console())


# --- validate and return (docs/diagnose.md) ---------------------------------------------------

@cli.command(name="diagnose")
@click.option(
    "--level",
    type=click.Choice(["quick", "medium", "long", "pair"]),
    default="medium",
    show_default=True,
    help="quick: seconds; medium: about 2-5 minutes; long: about 15-30 minutes; pair: "
    "against two known-good peers, in one job with them (--submit)",
)
@click.option("--node", default=None, help="this node's name [Slurm's or the host name]")
@click.option("--db", default=None, help="the store [$SLURMHEALTH_DB or this node's store]")
@click.option("--config", "path", default=None, help="settings and thresholds")
@click.option("--gpu-source", default=None, help="nvml or a snapshot file [settings.gpu_source]")
@click.option("--sysfs-root", default=None, help="where class/infiniband is read [settings]")
@click.option("--kmsg", default=None, help="the kernel log, or a file of records [settings]")
@click.option("--host-root", default=None, help="where the host's proc and sys are read [/]")
@click.option(
    "--time-limit",
    default=None,
    help="with --submit: the job's limit in minutes [quick 10, medium 20, long 60, pair 30]",
)
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="inside a diagnose job: return the node on pass, drain it for service on fail",
)
@click.option(
    "--submit",
    "do_submit",
    is_flag=True,
    help="head node: diagnose drained nodes as Slurm jobs in the maintenance reservation",
)
@click.option("--nodes", "named", default="", help="with --submit: these nodes too (hostlist)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@_said
def diagnose_cmd(
    level: str,
    node: str | None,
    db: str | None,
    path: str | None,
    gpu_source: str | None,
    sysfs_root: str | None,
    kmsg: str | None,
    host_root: str | None,
    time_limit: str | None,
    do_apply: bool,
    do_submit: bool,
    named: str,
    as_json: bool,
) -> None:
    """Diagnose this node deeply: today's checks, then DCGM's diagnostic, NCCL's all-reduce,
    perftest and the built-in GPU tests, as far as they are installed (the rest is skipped and
    says so). Records a `diag` run; exit 0 on pass, 1 on fail, 4 when inconclusive (no probe
    of the level could run: the checks alone never pass a diagnosis; or a source the checks
    need, such as the kernel log to a user who is not root, could not be read). A replay
    (--gpu-source FILE, --sysfs-root, --kmsg, --host-root) records nothing unless --db names a
    store.

    With --submit (head node, cron): every node slurmhealth drained, and those named with
    --nodes, is diagnosed by one exclusive Slurm job in the maintenance reservation
    (settings.diag_reservation); the job returns the node on pass and marks it for service on
    fail. An admin's drain is never lifted. With --level pair, each job also holds two
    known-good peers of the node's class: NCCL's all-reduce and RDMA bandwidth of the node with
    one peer are compared with the two peers' own, and a node (or HCA link) slower by more than
    5% is named.

    \b
    Example:
        slurmhealth diagnose --level quick
        slurmhealth diagnose --submit --level medium
        slurmhealth diagnose --submit --level pair --nodes gpu07
        slurmhealth diagnose --submit --nodes 'gpu[03,07]'
    """
    from slurmhealth.fleet import diagnose as orchestration  # noqa: PLC0415
    from slurmhealth.node.diag import run as diag_run  # noqa: PLC0415

    orchestration.refuse_mixed(do_apply, do_submit, named, time_limit)
    if do_submit:
        _diagnose_submit(level, db, path, named, time_limit, as_json)
        return
    request = diag_run.Request(
        agent.node_name(node), level, db, path, gpu_source, sysfs_root, kmsg, host_root,
        do_apply, as_json,
    )  # fmt: skip
    status = diag_run.local(request, _console(), orchestration.finisher(_console()))
    if status:
        sys.exit(status)


class _Refused(click.ClickException):
    """diagnose exits 1 for a node that failed: what it refuses to start with exits 2."""

    exit_code = 2


def _diagnose_submit(
    level: str, db: str | None, path: str | None, named: str, limit: str | None, as_json: bool
) -> None:
    from slurmhealth.fleet import diagnose as orchestration  # noqa: PLC0415

    wanted = orchestration.wanted_nodes(named)
    asked = (level, wanted, orchestration.job_minutes(level, limit), path)
    settings = _load_config(path, _Refused).for_node("")["settings"]
    conn = _open_fleet(db)
    status = orchestration.submit_all(conn, settings, asked, _console(), as_json)
    if status:
        sys.exit(status)


# --- an RMA bundle (docs/rma.md) --------------------------------------------------------------


def _node_arg(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """NODE: one node's name (it names the archive and its folder), never a path or a set."""
    if not is_node_name(value):
        raise click.BadParameter(f"not a node name: {clean(repr(value), 80)}")
    return value


@cli.command(name="rma")
@click.argument("node", callback=_node_arg)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="the archive [slurmhealth-rma-NODE-TIME.tar.gz here]",
)
@click.option(
    "--since",
    default="90d",
    show_default=True,
    help="the history to include: how far back (30d) or since when (2026-01-01)",
)
@click.option("--now", default=None, help="replay: the time to count back from")
@click.option(
    "--db",
    default=None,
    help="the store to read [$SLURMHEALTH_FLEET_DB; on NODE itself its own store; else the "
    "fleet store]",
)
@click.option("--no-bug-report", is_flag=True, help="do not run nvidia-bug-report.sh")
@click.option(
    "--bug-report-timeout",
    type=click.FloatRange(1, 3600),
    default=300,
    show_default=True,
    metavar="SECONDS",
    callback=lambda _ctx, _param, value: _a_number(value),
    help="stop nvidia-bug-report.sh after this long, keeping what it wrote",
)
@source_options
@_said
def rma_cmd(
    node: str,
    output: str | None,
    since: str,
    now: str | None,
    db: str | None,
    no_bug_report: bool,
    bug_report_timeout: float,
    gpu_source: str,
    sysfs_root: str | None,
    kmsg: str | None,
    host_root: str | None,
) -> None:
    """Write one archive (.tar.gz, private: 0600) of what a vendor's RMA ticket for NODE needs.

    From the store: the node's runs that did not pass with their results, its drains and
    resumes, its Xid events with their kernel-log lines, its error counters, its diagnoses
    and the versions it ran; only NODE's records, never another node's. On NODE itself, also
    a snapshot taken now and nvidia-bug-report.sh's log where it is on PATH; elsewhere (the
    head node, reading the fleet store) the manifest says they are not there, and why.
    Format: docs/rma.md. Exit 0; 4 when it was written but a part taken on the node did not
    all come (nvidia-bug-report.sh failed or outran its time, a source unread), said on stderr.

    \b
    Example:
        slurmhealth rma gpu07 -o /root/gpu07-rma.tar.gz
        slurmhealth rma gpu07 --since 30d --db /var/lib/slurmhealth/fleet.db
    """
    from slurmhealth.fleet import rma  # noqa: PLC0415 - tarfile and gzip for this command only

    replayed = gpu_source != "nvml" or any(p is not None for p in (sysfs_root, kmsg, host_root))
    request = rma.Request(
        node, output, since, now, db, not no_bug_report, bug_report_timeout,
        _options(gpu_source, sysfs_root, kmsg, host_root), replayed,
    )  # fmt: skip
    status = rma.run(request, _console())
    if status:
        sys.exit(status)


@cli.command(name="lemons")
@fleet_db_option
@click.option("--window", default="28d", show_default=True, help="history to score, e.g. 28d")
@click.option("--now", default=None, help="replay: score as of this time")
@click.option("--config", "path", default=None, help="settings: breaker, probation, slurm_bin")
@click.option("--apply", "do_apply", is_flag=True, help="drain the lemons (else change nothing)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option(
    "--silent-after",
    default="6h",
    show_default=True,
    envvar="SLURMHEALTH_SILENT_AFTER",
    help="name nodes with no run for this long; past it the store is stale "
    "[$SLURMHEALTH_SILENT_AFTER]",
)
@_said
def lemons_cmd(
    db: str | None,
    window: str,
    now: str | None,
    path: str | None,
    do_apply: bool,
    as_json: bool,
    silent_after: str,
) -> None:
    """Score every node against the fleet; list the lemons with their evidence.

    With --apply, drain them (reason `slurmhealth: lemon: ...`), strongest first, behind the
    circuit breaker: past settings.breaker_share of the fleet it stops, says so, exits 3. A
    drain Slurm did not take stops the sweep too, exit 1 (the next sweep tries again).

    Says when the newest record is, names the nodes not heard from within --silent-after,
    and those that ran jobs in the last day (accounting, `collect --sacct`) with no run of
    slurmhealth's on record: their hooks are not running, or their exports not collected. A
    store whose newest run is older than --silent-after is stale (collect is not running):
    the sweep says so first, drains nothing, and exits 4, so cron mails it.

    \b
    Example:
        slurmhealth lemons --window 28d
        slurmhealth lemons --apply
    """
    span = _duration(window)
    quiet = _duration(silent_after, "--silent-after")
    conn = _open(_fleet_path(db))
    request = lemons.Request(_instant(now), span, quiet, do_apply, as_json, path)
    status = lemons.run(conn, request, _console())
    if status:
        sys.exit(status)


def _file_mode(text: str | None) -> int | None:
    """--mode: read and write bits only (a report is never executable, setuid or sticky)."""
    if text is None:
        return None
    try:
        mode = int(text, 8)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an octal mode (e.g. 0644)") from None
    if mode & ~0o666:
        raise click.BadParameter(f"{text}: read and write bits only (e.g. 0644 or 0640)")
    return mode


def _share(_ctx: object, _param: object, value: float) -> float:
    if not 0 < value < 1:  # NaN too
        raise click.BadParameter(f"{value:g} is not a share between 0 and 1 (e.g. 0.05 for 5%)")
    return value


@cli.command(name="slow")
@fleet_db_option
@click.option("--window", default="7d", show_default=True, help="diagnoses to compare, e.g. 7d")
@click.option("--now", default=None, help="replay: compare as of this time")
@click.option(
    "--margin",
    type=float,
    callback=_share,
    default=peers.MARGIN,
    show_default=True,
    help="the share below the peers' median that counts as slow",
)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def slow_cmd(db: str | None, window: str, now: str | None, margin: float, as_json: bool) -> None:
    """List the nodes that run slower than their peers of the same hardware.

    From the figures `slurmhealth diagnose` recorded in the window (all-reduce and RDMA
    bandwidth, RDMA latency, the GPU tests): each node's worst GPU or port against the median
    of the other nodes with the same GPU model and count (of its peer group, where the
    class's nodes fall into well-separated groups: a slower variant under the same name),
    each day's readings on that day's class level, slow when worse by more than the margin
    and by more than 4 robust spreads on its latest days: three in a row at least (or all
    but one of four or more), more than the class's or the node's own one-off lows make
    likely (docs/diagnose.md). Changes nothing; exits 0.

    \b
    Example:
        slurmhealth slow --window 7d
        slurmhealth slow --margin 0.1 --json
    """
    span, end = _duration(window), _instant(now)
    conn = _open(_fleet_path(db))
    rows = queries.diag_figures(conn, end - span, end)
    found = peers.slow(rows, margin=margin)
    nodes = len({row[0] for row in rows})
    if as_json:
        doc = {"window_days": span / 86400, "margin": margin, "nodes": nodes, "slow": found}
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(text.slow(found, nodes, span, margin))


@cli.command(name="notify")
@fleet_db_option
@click.option(
    "--url",
    envvar="SLURMHEALTH_WEBHOOK_URL",
    required=True,
    help="the webhook to post to (http or https) [$SLURMHEALTH_WEBHOOK_URL]",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "slack"]),
    default="json",
    show_default=True,
    help="json: {source, events, more}; slack: an incoming webhook's {text}",
)
@click.option("--now", default=None, help="replay: as of this time")
@click.option(
    "--silent-after",
    default="6h",
    show_default=True,
    envvar="SLURMHEALTH_SILENT_AFTER",
    help="say a node silent after no run for this long [$SLURMHEALTH_SILENT_AFTER]",
)
@click.option("--dry-run", is_flag=True, help="print what would be posted; post and mark nothing")
@_said
def notify_cmd(
    db: str | None, url: str, fmt: str, now: str | None, silent_after: str, dry_run: bool
) -> None:
    """Post the drains, lemons, breaker trips and silent nodes since the last post to a webhook.

    Runs on the head node after collect and the lemon sweep (the periodic jobs do, when
    SLURMHEALTH_WEBHOOK_URL is set). What was posted is remembered in the fleet store only once
    the receiver took it (HTTP 2xx; tried 3 times on a 5xx, a 429 or no connection), so nothing
    is lost while it is down: exit 1, and the next run posts it. At most 20 events a post and
    6 posts an hour; the rest waits for the next (docs/alerts.md).

    \b
    Example:
        slurmhealth notify --url http://alerts.example.org:9000/slurm --dry-run
        slurmhealth notify --format slack   # $SLURMHEALTH_WEBHOOK_URL: Slack's webhook
    """
    notify.check_url(url)
    request = notify.Request(
        url, fmt, _instant(now) if now else None, dry_run, _duration(silent_after, "--silent-after")
    )
    status = notify.run(_open(_fleet_path(db)), request, _console())
    if status:
        sys.exit(status)


@cli.command(name="trends")
@fleet_db_option
@click.option("--now", default=None, help="replay: judge as of this time")
@click.option(
    "--factor",
    type=click.FloatRange(1.0, 1000.0),
    default=2.0,
    show_default=True,
    callback=lambda _ctx, _param, value: _a_number(value),
    help="how many times its own and its peers' rate a counter must reach",
)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def trends_cmd(db: str | None, now: str | None, factor: float, as_json: bool) -> None:
    """List the GPUs, NVLinks and InfiniBand ports whose error counters are rising.

    From the counter readings the hooks and health checks recorded (PCIe replays and AER
    errors, ECC errors, remapped rows, retired pages, NVLink and IB error counters): errors in
    the last 6 h, 24 h and 3 days against the device's own 7 days before and the median of the
    same devices on nodes of the same GPU model; rising when at least `--factor` times both and
    beyond chance, or over a published limit (docs/trends.md). Changes nothing; exits 0.

    \b
    Example:
        slurmhealth trends
        slurmhealth trends --now 2026-11-30T06:00:00 --json
    """
    end = _instant(now)
    conn = _open(_fleet_path(db))
    found, nodes = queries.rising_counters(conn, end, factor=factor)
    if as_json:
        doc = {"now": end, "nodes": nodes, "factor": factor, "rising": found}
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(text.trends(found, nodes))


# --- the nightly report (docs/report.md) ----------------------------------------------------


@cli.command(name="report")
@fleet_db_option
@click.option("--since", default="24h", show_default=True, help="the period: drains, counts, cost")
@click.option("--now", default=None, help="replay: report as of this time")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["html", "md", "json", "prom"]),
    default="html",
    show_default=True,
    help="prom: the before-failure signals for node_exporter's textfile collector",
)
@output_option
@click.option("--mail-to", default=None, help="also mail it through the local MTA (sendmail)")
@click.option("--sinfo", "use_sinfo", is_flag=True, help="node states from Slurm, not the store")
@click.option("--slurm-bin", default="", help="directory of sinfo [$SLURMHEALTH_SLURM_BIN, PATH]")
@click.option(
    "--mode",
    "file_mode",
    default=None,
    callback=lambda _c, _p, v: _file_mode(v),
    metavar="OCTAL",
    help="the -o file's mode, e.g. 0644 for a web server [0600; an existing file keeps its "
    "mode; prom: 0644]",
)
@_said
def report_cmd(
    db: str | None,
    since: str,
    now: str | None,
    fmt: str,
    output: str,
    mail_to: str | None,
    use_sinfo: bool,
    slurm_bin: str,
    file_mode: int | None,
) -> None:
    """The nightly report of the fleet: node states, drains, lemons, failures, drift, own cost.

    -o writes the file private (0600) unless --mode says otherwise: a report a web server
    serves needs --mode 0644 (node stores and state stay private whatever this says).

    HTML, Markdown and JSON carry the same numbers (format: docs/report.md). Exits 0; 1 on an
    error (nothing written); 4 when the report was written but could not be mailed (no MTA,
    sendmail failed), said in one line on stderr.

    \b
    Example:
        slurmhealth report -o /var/www/html/slurmhealth.html --mail-to hpc-admins@example.org
        slurmhealth report --format md --since 7d --now 2026-11-29
    """
    from slurmhealth.report import deliver  # noqa: PLC0415 - jinja2 here only

    deliver.check_mail(mail_to, fmt)
    conn = _open(_fleet_path(db))
    request = deliver.Request(now, since, fmt, output, mail_to, use_sinfo, slurm_bin, file_mode)
    status = deliver.run(conn, request, _console())
    if status:
        sys.exit(status)


# --- job summaries for job owners (docs/jobs.md) ---------------------------------------------


def _job_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """JOB_ID as Slurm takes it (jobs.job_id_arg); anything else is a usage error."""
    from slurmhealth.fleet import jobs  # noqa: PLC0415

    try:
        return jobs.job_id_arg(value)
    except jobs.JobError as exc:
        raise click.BadParameter(str(exc)) from None


@cli.command(name="job")
@click.argument("job_id", callback=_job_id)
@fleet_db_option
@click.option("--slurm-bin", default="", help="directory of sacct [$SLURMHEALTH_SLURM_BIN, PATH]")
@click.option("--json", "as_json", is_flag=True, help="print JSON (docs/jobs.md)")
def job_cmd(job_id: str, db: str | None, slurm_bin: str, as_json: bool) -> None:
    """What slurmhealth saw during one of your jobs, and whether resubmitting is safe.

    Admins read the fleet store; everyone else reads the summary the head node published into
    the job's Slurm accounting record, which Slurm shows to the job's owner only.

    \b
    Example:
        slurmhealth job 123456
        slurmhealth job 123456 --json
    """
    from slurmhealth.fleet import jobs  # noqa: PLC0415

    try:
        found = jobs.lookup(job_id, _fleet_path(db), slurm_bin)
    except jobs.JobError as exc:
        raise click.ClickException(clean(exc, 500)) from None
    if as_json:  # json.dumps escapes control characters
        click.echo(json.dumps(found, indent=1, sort_keys=True, ensure_ascii=True, default=str))
    else:
        click.echo(text.job(found))


@cli.command(name="publish")
@fleet_db_option
@click.option(
    "--since",
    default="2h",
    show_default=True,
    help="jobs that ended this recently, and since the last publish that wrote all it had to "
    "(at most 28 days)",
)
@click.option("--now", default=None, help="replay: the time to count back from")
@click.option("--slurm-bin", default="", help="directory of sacct and sacctmgr")
@click.option("--public", is_flag=True, help="publish even without PrivateData=jobs in slurmdbd")
def publish_cmd(db: str | None, since: str, now: str | None, slurm_bin: str, public: bool) -> None:
    """Write each recently ended job's summary into its AdminComment (head node, as root).

    Run by a timer after `collect`. Writes only summaries that changed since the last run and
    never touches an AdminComment another tool wrote; exits 1 if a write failed. Looks back
    past --since to the last publish that wrote all it had to (the timer stopped, a write
    failed), at most 28 days.

    \b
    Example:
        slurmhealth publish --since 2h
    """
    from slurmhealth.fleet import jobs  # noqa: PLC0415

    end = _instant(now)
    conn = _open(_fleet_path(db))
    start = jobs.publish_start(conn, _start(since, end), end)
    client = slurm.Slurm(slurm_bin, timeout=30.0)
    try:
        report = jobs.publish(conn, client, start, end, check_privacy=not public)
    except (jobs.JobError, slurm.SlurmError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(text.published(report))
    if report["failed"]:
        sys.exit(1)
