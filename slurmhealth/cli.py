"""The admin and user side of `slurmhealth`: click commands, each a thin veneer over the library.

`check` itself lives in hook.py (import-light, it runs before every job); it is listed here so
that `slurmhealth --help` shows it.
"""

from __future__ import annotations

import json
import os
import sys

import click

from slurmhealth import __version__, config, history, hook, runner, store, timespec
from slurmhealth.checks import AREAS


def source_options(func: object) -> object:
    """--gpu-source, --sysfs-root, --kmsg: where facts come from (shared by several commands)."""
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
        )
    ):
        func = option(func)  # type: ignore[operator]
    return func


def _options(gpu_source: str, sysfs_root: str | None, kmsg: str | None) -> runner.Options:
    return runner.Options(gpu_source=gpu_source, sysfs_root=sysfs_root, kmsg=kmsg)


def _load_config(path: str | None) -> config.Config:
    try:
        return config.load(path)
    except config.ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmhealth")
def cli() -> None:
    """GPU node health for Slurm: checks, history, lemon detection.

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

    Example:
        slurmhealth check --only gpu,ib --json
    """
    hook.main(["check", *ctx.args])


@cli.command()
@click.option("--node", default=None, help="node name [$SLURMD_NODENAME or host name]")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default="-",
    help="write here instead of standard output",
)
@source_options
def snapshot(
    node: str | None, output: str, gpu_source: str, sysfs_root: str | None, kmsg: str | None
) -> None:
    """Write everything the checks read on this node as one JSON document.

    Replaying it with `check --gpu-source FILE` gives the same verdicts
    (format: docs/snapshot-format.md).

    Example:
        slurmhealth snapshot -o /tmp/gpu01.json
    """
    name = hook.node_name({"--node": [node]} if node else {})
    settings = config.defaults()["settings"]
    timeouts = {s: settings[f"timeout_{s}"] for s in runner.SOURCES}
    try:
        doc = runner.snapshot(
            name, _options(gpu_source, sysfs_root, kmsg), timeouts, settings["deadline"]
        )
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    with click.open_file(output, "w") as handle:
        handle.write(text)


@cli.group(name="config")
def config_group() -> None:
    """Validate, show and generate the expectations file.

    Example:
        slurmhealth config show --node gpu07
    """


@config_group.command()
@click.option("--config", "path", default=None, help="file [$SLURMHEALTH_CONFIG or default]")
def validate(path: str | None) -> None:
    """Check the config file; print each problem as FILE:LINE: message; exit 2 on any.

    Example:
        slurmhealth config validate --config /etc/slurmhealth/slurmhealth.toml
    """
    resolved = config.resolve_path(path)
    if resolved is None:
        click.echo("no config file: built-in defaults apply")
        return
    try:
        config.load(resolved)
    except config.ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    click.echo(f"{resolved}: ok")


@config_group.command()
@click.option("--config", "path", default=None, help="file [$SLURMHEALTH_CONFIG or default]")
@click.option("--node", default=None, help="node name [$SLURMD_NODENAME or host name]")
def show(path: str | None, node: str | None) -> None:
    """Print the effective expectations of a node as JSON.

    Example:
        slurmhealth config show --node gpu07
    """
    name = hook.node_name({"--node": [node]} if node else {})
    effective = _load_config(path).for_node(name)
    click.echo(json.dumps({"node": name, **effective}, indent=1, sort_keys=True))


def genconf_text(node: str, expectations: dict) -> str:
    lines = [
        f"# Written by `slurmhealth config genconf` on {node}: the expectations of a",
        "# known-good node. Review, then widen `match` to the nodes of the same kind.",
        "",
        "[[node]]",
        f"match = {json.dumps(node)}",
    ]
    for area, values in expectations.items():
        for key, value in values.items():
            lines.append(f"{area}.{key} = {config.toml_value(value)}")
    return "\n".join(lines) + "\n"


@config_group.command()
def example() -> None:
    """Print the annotated example config: every key and every check, with its default and why.

    Example:
        slurmhealth config example > /etc/slurmhealth/slurmhealth.toml
    """
    click.echo(config.example_text(), nl=False)


@config_group.command()
@click.option("--node", default=None, help="node name [$SLURMD_NODENAME or host name]")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="-")
@source_options
def genconf(
    node: str | None, output: str, gpu_source: str, sysfs_root: str | None, kmsg: str | None
) -> None:
    """Write expectations from this node's facts (run it on a known-good node).

    Example:
        slurmhealth config genconf -o /etc/slurmhealth/slurmhealth.toml
    """
    name = hook.node_name({"--node": [node]} if node else {})
    expect = config.defaults()
    try:
        run = runner.run(name, expect, _options(gpu_source, sysfs_root, kmsg), phase="check")
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    learned = {}
    for area, facts in run.facts.items():
        values = AREAS[area].expectations(facts)
        if values:
            learned[area] = values
    text = genconf_text(name, learned)
    config.parse(text, "<genconf>")  # what we write must validate
    with click.open_file(output, "w") as handle:
        handle.write(text)


def _open(path: str) -> object:
    if not os.path.exists(path):
        raise click.ClickException(f"no store at {path}")
    try:
        return store.connect(path)
    except store.StoreError as exc:
        raise click.ClickException(str(exc)) from None


def _instant(text: str | None) -> float:
    try:
        return timespec.parse_instant(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _duration(text: str) -> float:
    try:
        return timespec.parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _history_text(runs: list, actions: list) -> str:
    lines = [f"{'TIME':<20}  {'NODE':<10}  {'PHASE':<11}  {'JOB':<8}  {'VERDICT':<7}  PROBLEMS"]
    for run in runs:
        problems = "; ".join(f"{p['check']} {p['status']}: {p['message']}" for p in run["problems"])
        lines.append(
            f"{timespec.iso(run['started']):<20}  {run['node']:<10}  {run['phase']:<11}  "
            f"{run['job'] or '-':<8}  {run['verdict']:<7}  {problems}"
        )
    if actions:
        lines += ["", f"{'TIME':<20}  {'NODE':<10}  {'ACTION':<13}  BY / REASON"]
        for act in actions:
            failed = "" if act["ok"] else f" (FAILED: {act['detail']})"
            lines.append(
                f"{timespec.iso(act['time']):<20}  {act['node']:<10}  "
                f"{act['action']:<13}  {act['actor']}: {act['reason']}{failed}"
            )
    return "\n".join(lines)


@cli.command(name="history")
@click.option("--node", default=None, help="only this node (and its store)")
@click.option("--job", default=None, help="only runs of this job")
@click.option("--since", default="7d", show_default=True, help="how far back, e.g. 24h, 28d")
@click.option("--now", default=None, help="replay: the time to count back from")
@click.option("--limit", default=200, show_default=True, help="at most this many runs")
@click.option("--db", default=None, help="a store file [$SLURMHEALTH_DB or the state dir]")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def history_cmd(
    node: str | None,
    job: str | None,
    since: str,
    now: str | None,
    limit: int,
    db: str | None,
    as_json: bool,
) -> None:
    """Show recorded runs (prolog, epilog, health check, check), drains and resumes.

    Example:
        slurmhealth history --node gpu07 --since 24h
    """
    start = _instant(now) - _duration(since)
    runs, actions, jobs = [], [], []
    for path in history.store_paths(db, node):
        conn = _open(path)
        runs += history.runs(conn, node, job, start, limit)  # type: ignore[arg-type]
        actions += history.actions(conn, node, start)  # type: ignore[arg-type]
        if job:
            jobs += history.jobs(conn, job)  # type: ignore[arg-type]
    runs.sort(key=lambda r: r["started"], reverse=True)
    actions.sort(key=lambda a: a["time"], reverse=True)
    if as_json:
        click.echo(json.dumps({"runs": runs[:limit], "actions": actions, "jobs": jobs}, indent=1))
    else:
        click.echo(_history_text(runs[:limit], [] if job else actions))


@cli.command()
@click.option(
    "--older-than", "older", required=True, help="delete records older than this, e.g. 90d"
)
@click.option("--node", default=None, help="only this node's store")
@click.option("--db", default=None, help="a store file [$SLURMHEALTH_DB or the state dir]")
@click.option("--now", default=None, help="replay: the time to count back from")
def prune(older: str, node: str | None, db: str | None, now: str | None) -> None:
    """Delete old records and VACUUM (admin side: never run from a prolog).

    Example:
        slurmhealth prune --older-than 90d
    """
    before = _instant(now) - _duration(older)
    for path in history.store_paths(db, node):
        counts = history.prune(_open(path), before)  # type: ignore[arg-type]
        summary = ", ".join(f"{n} {table}" for table, n in counts.items())
        click.echo(f"{path}: deleted {summary}")
