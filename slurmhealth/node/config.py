"""Expectations: one TOML file -> the effective expectations of one node.

Layout (packaging/slurmhealth.toml is the annotated catalogue):

    [settings]                  deadlines and behaviour
    [gpu] [nvlink] [ib] [xid]   expectations for every node
    [checks."gpu.thermal"]      per-check overrides: enabled = false, severity = "fail"|"warn"
    [[node]]                    later blocks win; `match` is a node-set pattern
    match = "gpu[01-16],!gpu05"
    gpu.count = 8

No file at all: built-in defaults, which expect nothing that is not seen except what every GPU
node needs (persistence mode, ECC). tomllib (or tomli before 3.11) is imported only when a file
is read.
"""

from __future__ import annotations

import json
import os
import re

from slurmhealth.core import hostlist
from slurmhealth.node.checks import AREAS, REGISTRY

DEFAULT_PATH = "/etc/slurmhealth/slurmhealth.toml"

SETTINGS = {
    "deadline": (10.0, float, "hard deadline of a whole run, seconds"),
    "timeout_gpu": (5.0, float, "deadline of the NVML sweep (a sick GSP stalls calls ~6 s)"),
    "timeout_ib": (2.0, float, "deadline of the InfiniBand sysfs read"),
    "timeout_kmsg": (2.0, float, "deadline of the kernel log read"),
    "error_fails": (False, bool, "an exception inside a check fails the node (default: warn)"),
    "gpu_source": ("nvml", str, "hooks: nvml, or a snapshot file (dry runs, fault drills)"),
    "sysfs_root": ("/sys", str, "hooks: where class/infiniband is read"),
    "kmsg": ("/dev/kmsg", str, "hooks: the kernel log, or a file of kmsg records/dmesg lines"),
    "slurm_bin": ("", str, "directory of scontrol and friends; empty: search the usual places"),
    "drain_timeout": (2.0, float, "bound of each scontrol call on the failure path, seconds"),
    "resume_after": (3, int, "consecutive passing health checks before our drain is resumed"),
    "breaker_share": (0.10, float, "most of the fleet slurmhealth may drain within the window"),
    "breaker_window": (3600.0, float, "circuit breaker window, seconds (any automatic drain)"),
    "probation_days": (7.0, float, "a node we resumed that fails within this many days stays out"),
    "reset_gpus": (False, bool, "epilog resets an idle GPU that needs it, instead of draining"),
    "nvidia_smi": ("/usr/bin/nvidia-smi", str, "nvidia-smi used for GPU resets"),
    "metrics_file": (
        "",
        str,
        "node_exporter textfile the hooks write ({node}: node name; docs/metrics.md); "
        "empty: off, unless $SLURMHEALTH_METRICS_FILE is set",
    ),
}
SEVERITIES = ("warn", "fail")


class ConfigError(Exception):
    """A config the user wrote that cannot be used: message names the file and line."""


def defaults() -> dict:
    """Built-in expectations: every area's DEFAULTS plus settings."""
    out: dict = {"settings": {k: v[0] for k, v in SETTINGS.items()}, "checks": {}}
    for name, module in AREAS.items():
        out[name] = {k: _copy(v[0]) for k, v in module.DEFAULTS.items()}
    return out


def _copy(value: object) -> object:
    return (
        dict(value)
        if isinstance(value, dict)
        else list(value)
        if isinstance(value, list)
        else value
    )


def _schema(section: str) -> dict:
    return SETTINGS if section == "settings" else AREAS[section].DEFAULTS


def _type_ok(value: object, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _line_of(text: str, key: str) -> int:
    """Best-effort line of a key in the file, for error messages (TOML parsers drop positions)."""
    pattern = re.compile(r"(^|[\s.\[\"])" + re.escape(key) + r"([\s.\]\"=]|$)")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.search(line.split("#", 1)[0]):
            return number
    return 0


class Config:
    """A parsed, validated config file (or the built-in defaults when path is None)."""

    def __init__(self, data: dict | None = None, path: str | None = None) -> None:
        self.data = data or {}
        self.path = path

    def for_node(self, node: str) -> dict:
        """Effective expectations: defaults <- top-level tables <- matching [[node]] blocks."""
        out = defaults()
        _merge(out, self.data)
        for block in self.data.get("node", []):
            if hostlist.matches(block["match"], node):
                _merge(out, block)
        return out


def _merge(out: dict, layer: dict) -> None:
    for section, values in layer.items():
        if section in ("node", "match") or not isinstance(values, dict):
            continue
        target = out.setdefault(section, {})
        for key, value in values.items():
            if section == "checks":
                target.setdefault(key, {}).update(value)
            else:
                target[key] = _copy(value)


def _check_section(section: str, values: object, where: str, text: str) -> list[str]:
    if section == "checks":
        return _check_overrides(values, where, text)
    if section not in AREAS and section != "settings":
        known = ", ".join(["settings", "checks", "node", *AREAS])
        return [f"{where}:{_line_of(text, section)}: unknown section [{section}] (known: {known})"]
    if not isinstance(values, dict):
        return [f"{where}:{_line_of(text, section)}: [{section}] must be a table"]
    errors = []
    schema = _schema(section)
    for key, value in values.items():
        line = _line_of(text, key)
        if key not in schema:
            errors.append(f"{where}:{line}: unknown key {section}.{key}")
        elif not _type_ok(value, schema[key][1]):
            want = schema[key][1].__name__
            errors.append(f"{where}:{line}: {section}.{key} must be {want}, not {value!r}")
    return errors


def _check_overrides(values: object, where: str, text: str) -> list[str]:
    if not isinstance(values, dict):
        return [f"{where}:{_line_of(text, 'checks')}: [checks] must be a table"]
    errors = []
    for name, override in values.items():
        line = _line_of(text, name)
        if name not in REGISTRY:
            errors.append(f"{where}:{line}: unknown check {name!r}")
            continue
        if not isinstance(override, dict):
            errors.append(f"{where}:{line}: checks.{name} must be a table")
            continue
        for key, value in override.items():
            if key == "enabled" and isinstance(value, bool):
                continue
            if key == "severity" and value in SEVERITIES:
                continue
            errors.append(f"{where}:{line}: checks.{name}.{key} = {value!r} is not valid")
    return errors


def _check_nodes(blocks: object, where: str, text: str) -> list[str]:
    if not isinstance(blocks, list):
        return [f"{where}:{_line_of(text, 'node')}: node must be an array of tables [[node]]"]
    errors = []
    for block in blocks:
        pattern = block.get("match")
        line = _line_of(text, "match")
        if not isinstance(pattern, str):
            errors.append(f'{where}:{line}: every [[node]] needs match = "pattern"')
            continue
        try:
            hostlist.validate(pattern)
        except hostlist.PatternError as exc:
            errors.append(f"{where}:{_line_of(text, pattern) or line}: {exc}")
        for section, values in block.items():
            if section != "match":
                errors.extend(_check_section(section, values, where, text))
    return errors


def validate(data: dict, where: str, text: str) -> list[str]:
    """Every problem of a parsed file, each `file:line: message`."""
    errors = []
    for section, values in data.items():
        if section == "node":
            errors.extend(_check_nodes(values, where, text))
        else:
            errors.extend(_check_section(section, values, where, text))
    return errors


def _toml_loads(text: str) -> dict:
    try:
        import tomllib  # noqa: PLC0415 - ~15 ms, only when a file is read
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # noqa: PLC0415
    return tomllib.loads(text)


def parse(text: str, where: str = "<config>") -> dict:
    """TOML text -> validated data; ConfigError with `file:line: message` lines."""
    try:
        data = _toml_loads(text)
    except ValueError as exc:  # TOMLDecodeError: "... (at line 3, column 7)"
        found = re.search(r"at line (\d+)", str(exc))
        line = found.group(1) if found else "0"
        raise ConfigError(f"{where}:{line}: {exc}") from None
    errors = validate(data, where, text)
    if errors:
        raise ConfigError("\n".join(errors))
    return data


def toml_value(value: object) -> str:
    """A Python value as TOML (the few types expectations use)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def _example_section(name: str, schema: dict) -> list[str]:
    lines = [f"[{name}]"]
    for key, (default, kind, why) in schema.items():
        lines.append(f"# {why} ({kind.__name__})")
        shown = f"{key} = {toml_value(default)}" if default is not None else f"{key} = ..."
        lines.append(f"# {shown}")
    return [*lines, ""]


def example_text() -> str:
    """The annotated example config: the catalogue of every setting and check, all commented."""
    from slurmhealth.node.checks import describe  # noqa: PLC0415

    lines = [
        "# slurmhealth expectations: /etc/slurmhealth/slurmhealth.toml",
        "# Every key is shown commented with its built-in default; unset keys expect nothing",
        "# that the node does not report. `slurmhealth config genconf` writes the values of a",
        "# known-good node; `slurmhealth config validate` checks this file.",
        "",
        *_example_section("settings", SETTINGS),
    ]
    for name, module in AREAS.items():
        lines.extend(_example_section(name, module.DEFAULTS))
    lines.append('# Per-check overrides: enabled = false, or severity = "warn" | "fail".')
    for check in REGISTRY:
        lines.append(f'# [checks."{check}"]  # {describe(check)}')
    lines += [
        "",
        "# Node-set blocks (later ones win): patterns like gpu[01-16], globs, !negation.",
        "# [[node]]",
        '# match = "gpu[01-16],!gpu05"',
        "# gpu.count = 8",
        "",
    ]
    return "\n".join(lines)


def resolve_path(path: str | None) -> str | None:
    """--config, then SLURMHEALTH_CONFIG, then the default path if it exists."""
    if path:
        return path
    env = os.environ.get("SLURMHEALTH_CONFIG")
    if env:
        return env
    return DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None


def load(path: str | None) -> Config:
    """Read and validate a config file; None means built-in defaults.

    A path given explicitly that does not exist is an error (a typo must not silently run
    with defaults).
    """
    path = resolve_path(path)
    if path is None:
        return Config()
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    return Config(parse(text, path), path)
