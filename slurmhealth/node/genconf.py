"""`slurmhealth config genconf`: a known-good node's facts as the expectations file that nodes
of its kind are then held to (NHC's nhc-genconf, for slurmhealth). Never on the hook path."""

from __future__ import annotations

import json

from slurmhealth.core.command import CommandError, Console, emit
from slurmhealth.core.result import clean
from slurmhealth.node import checks, config, runner
from slurmhealth.node.sources import Options


def text(node: str, expectations: dict[str, dict[str, object]]) -> str:
    """The config file of one `[[node]]` block matching `node`: each area's expectations."""
    lines = [
        f"# Written by `slurmhealth config genconf` on {clean(node, 80)}: the expectations of a",
        "# known-good node. Review, then widen `match` to the nodes of the same kind.",
        "",
        "[[node]]",
        f"match = {json.dumps(node)}",
    ]
    for area, values in expectations.items():
        for key, value in values.items():
            lines.append(f"{area}.{key} = {config.toml_value(value)}")
    return "\n".join(lines) + "\n"


def write(node: str, options: Options, output: str, console: Console) -> None:
    """Run the checks' gather on this node (or a replay), keep what each area expects of it,
    and write the config to standard output ("-") or `output` (0644, as admins install
    configs). CommandError with one line when a source's options or the file refuse."""
    try:
        run = runner.run(node, config.defaults(), options, phase="check")
    except (OSError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    learned = {}
    for area, facts in run.facts.items():
        values = checks.expectations(area, facts)
        if values:
            learned[area] = values
    out = text(node, learned)
    config.parse(out, "<genconf>")  # what we write must validate
    emit(out, output, console, 0o644)
