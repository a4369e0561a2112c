"""Expectations: one TOML file -> the effective expectations of one node.

Layout (packaging/slurmhealth.toml is the annotated catalogue):

    [settings]                  deadlines and behaviour
    [gpu] [nvlink] [ib] [xid]   expectations for every node
    [fs] [hw] [time]            the host: mounts, memory and CPUs, the clock
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
import math
import os
import re

from slurmhealth.core import hostlist
from slurmhealth.core.constants import REMEDIATE_MODES
from slurmhealth.core.result import clean
from slurmhealth.node import checks

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, Callable

    from slurmhealth.core.command import Console
    from slurmhealth.node.checks.base import Schema
    Bound = tuple[Callable[[Any], bool], str]  # (test of a value of the key's type, why)
    Data = dict[str, Any]  # a parsed file, a [[node]] block, or effective expectations

DEFAULT_PATH = "/etc/slurmhealth/slurmhealth.toml"

# the health-check-only sources' deadlines (checks.LATER)
_LATER_TIMEOUTS = ("timeout_nvme", "timeout_bmc", "timeout_imex", "timeout_fmlog")
SETTINGS: Schema = {
    "deadline": (10.0, float, "hard deadline of a whole run, seconds"),
    "timeout_gpu": (5.0, float, "deadline of the NVML sweep (a sick GSP stalls calls ~6 s)"),
    "timeout_ib": (2.0, float, "deadline of the InfiniBand sysfs read"),
    "timeout_kmsg": (2.0, float, "deadline of the kernel log read"),
    "timeout_kernel": (1.0, float, "deadline of the /proc and /sys read (processes, modules, net)"),
    "timeout_fs": (1.0, float, "deadline of mountinfo and the mounts' statvfs (fs.stat_timeout)"),
    "timeout_host": (1.0, float, "deadline of the meminfo, CPU list and clock reads"),
    "timeout_nvme": (5.0, float, "health check: deadline of the NVMe sysfs read and smart-logs"),
    "timeout_bmc": (8.0, float, "health check: deadline of ipmitool sel elist"),
    "timeout_imex": (6.0, float, "health check: deadline of nvidia-imex-ctl -q and -N -j"),
    "timeout_fmlog": (2.0, float, "health check: deadline of the Fabric Manager log's read"),
    "timeout_site": (
        40.0,
        float,
        "health check: deadline of the site's own health check (NHC's own is 30 s; the run's "
        "deadline becomes at least this + 2 s, within slurmd's 60 s)",
    ),
    "site_healthcheck": (
        "",
        str,
        "the site's own health check the health check runs and records as site.program "
        "(absolute path, e.g. /usr/sbin/nhc); empty: $SLURMHEALTH_SITE_HEALTHCHECK, else none",
    ),
    "error_fails": (False, bool, "an exception inside a check fails the node (default: warn)"),
    "gpu_source": ("nvml", str, "hooks: nvml, or a snapshot file (dry runs, fault drills)"),
    "sysfs_root": ("/sys", str, "hooks: where class/infiniband is read"),
    "host_root": ("/", str, "hooks: where the host areas read proc/ and sys/ (mounts, memory)"),
    "kmsg": ("/dev/kmsg", str, "hooks: the kernel log, or a file of kmsg records/dmesg lines"),
    "slurm_bin": ("", str, "directory of scontrol and friends; empty: search the usual places"),
    "drain_timeout": (2.0, float, "bound of each scontrol call on the failure path, seconds"),
    "resume_after": (3, int, "consecutive passing health checks before our drain is resumed"),
    "breaker_share": (0.10, float, "most of the fleet slurmhealth may drain within the window"),
    "breaker_window": (3600.0, float, "circuit breaker window, seconds (any automatic drain)"),
    "probation_days": (7.0, float, "a node we resumed that fails within this many days stays out"),
    "reset_gpus": (False, bool, "epilog resets an idle GPU that needs it, instead of draining"),
    "monitor_only": (
        False,
        bool,
        "record every verdict and the drain it would make, enforce nothing: no drain, reset or "
        "resume, hooks exit 0 (watch a week, then enforce)",
    ),
    "nvidia_smi": ("/usr/bin/nvidia-smi", str, "nvidia-smi used for GPU resets"),
    "remediate": (
        "off",
        str,
        "how far slurmhealth mends a failing node by itself (docs/remediation.md): off; reset "
        "(the GPUs of a reset_gpu fault, once the node is empty); reboot (resets, and scontrol "
        "reboot for a reboot fault); the node returns only after a diagnosis passes",
    ),
    "remediate_max": (
        2,
        int,
        "remediations (GPU resets, reboots) a node gets within remediate_window; past it the "
        "node stays drained for service",
    ),
    "remediate_window": (
        604800.0,
        float,
        "the window of remediate_max, seconds (7d): a node mended that often needs a person",
    ),
    "diag_before_resume": (
        False,
        bool,
        "our drains return only through a passed diagnosis (diagnose --submit), never by "
        "passing health checks",
    ),
    "diag_reservation": (
        "slurmhealth_diag",
        str,
        "maintenance reservation that diagnose jobs run in (docs/diagnose.md)",
    ),
    "diag_tools": ("", str, "directory searched before $PATH for dcgmi, nccl-tests, perftest"),
    "diag_python": ("", str, "python that runs the built-in GPU tests; empty: slurmhealth's own"),
    "diag_allreduce_floor_gbps": (
        0.0,
        float,
        "all-reduce bus bandwidth floor, GB/s; 0: the default for the GPU model, if any",
    ),
    "diag_ib_min_share": (0.9, float, "ib_write_bw must reach this share of the port's rate"),
    "diag_ib_lat_max_usec": (4.5, float, "ib_read_lat typical latency ceiling, microseconds"),
    "diag_mpi": (
        "",
        str,
        "srun --mpi for the pair level's all-reduce (pmix, pmi2: what nccl-tests was built "
        "with); empty: slurm.conf's MpiDefault",
    ),
    "metrics_file": (
        "",
        str,
        "node_exporter textfile the hooks write ({node}: node name; docs/metrics.md); "
        "empty: off, unless $SLURMHEALTH_METRICS_FILE is set",
    ),
}
SEVERITIES = ("warn", "fail")

MOST_SECONDS = 86400.0  # longest deadline or timeout: a day (threading overflows near 1e10 s)


def _finite(value: object) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _number(value: object) -> bool:
    """A finite int or float (not a bool): what a float key takes, in a map's values."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ok and _finite(value)


def _xid_number(value: object) -> bool:
    """An Xid as checks/xid.py reads it: 79, or "79" (TOML table keys are strings)."""
    if isinstance(value, str):
        return re.fullmatch(r"\s*[0-9]+\s*", value) is not None
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_SECONDS = (
    lambda v: _finite(v) and 0 < v <= MOST_SECONDS,
    f"must be > 0 and at most {MOST_SECONDS:g} seconds",
)
_AT_LEAST_0 = (lambda v: _finite(v) and v >= 0, "must be >= 0")
_AT_LEAST_1 = (lambda v: v >= 1, "must be >= 1 (at 0 every run would trip it)")
_PERCENT = (lambda v: _finite(v) and 0 <= v <= 100, "must be a percentage from 0 to 100")
_PATHS = (
    lambda v: all(isinstance(e, str) and e.startswith("/") for e in v),
    "must be a list of absolute paths",
)
_XID_CLASSES = checks.HOOKED["xid"].CLASSES  # app, warn, fail, ignore
_FILE_TESTS = checks.HOOKED["fs"].FILE_TESTS  # test(1)'s letters that fs.files judges
_NAMES = (
    lambda v: all(isinstance(e, str) and e.strip() and e == e.strip() for e in v),
    "must be a list of names (strings without surrounding spaces)",
)

# Value constraints beyond the type, by "section.key": (test, why). The test sees a value of the
# key's type; a value failing it is unusable: `config validate` and `check` reject it (FILE:LINE:
# key: why), and a hook runs with the key's default instead (ConfigError.usable). Every numeric
# key has one (tests/node/test_config.py): counts >= 0, seconds > 0 and finite, shares in [0, 1].
BOUNDS: dict[str, Bound] = {
    **{f"settings.{k}": _SECONDS for k in ("deadline", "timeout_gpu", "timeout_ib")},
    **{f"settings.{k}": _SECONDS for k in ("timeout_kmsg", "drain_timeout")},
    "settings.timeout_kernel": _SECONDS,
    **{f"settings.{k}": _SECONDS for k in ("timeout_fs", "timeout_host")},
    "fs.stat_timeout": _SECONDS,
    **{f"fs.{k}": _PERCENT for k in ("free_pct", "inodes_free_pct")},
    "fs.free_mb": _AT_LEAST_0,
    **{f"fs.{k}": _PATHS for k in ("mounts", "rw", "ro", "free_on")},
    "fs.fstype": (
        lambda v: all(k.startswith("/") and isinstance(t, str) and t for k, t in v.items()),
        'must map mount points to filesystem types ({ "/scratch" = "lustre" })',
    ),
    "fs.free_pct_at": (
        lambda v: all(k.startswith("/") and _number(t) and 0 <= t <= 100 for k, t in v.items()),
        'must map mount points to percentages from 0 to 100 ({ "/scratch" = 10.0 })',
    ),
    "fs.free_mb_at": (
        lambda v: all(k.startswith("/") and _number(t) and t >= 0 for k, t in v.items()),
        'must map mount points to MiB, >= 0 ({ "/tmp" = 128.0 })',
    ),
    "fs.files": (
        lambda v: all(
            k.startswith("/") and isinstance(t, str) and t and set(t) <= set(_FILE_TESTS)
            for k, t in v.items()
        ),
        "must map absolute paths to test(1) letters from "
        f'{_FILE_TESTS} ({{ "/etc/slurm" = "dr" }})',
    ),
    **{f"hw.{k}": _AT_LEAST_0 for k in ("memory_gb", "free_memory_gb", "swap_gb", "swap_free_gb")},
    **{f"hw.{k}": _AT_LEAST_0 for k in ("hugepages", "cpus", "sockets", "threads_per_core")},
    "hw.memory_tolerance_pct": _PERCENT,
    "time.max_error_ms": (lambda v: _finite(v) and v > 0, "must be > 0 milliseconds, finite"),
    **{f"settings.{k}": _SECONDS for k in _LATER_TIMEOUTS},
    # slurmd kills a health check after 60 s (slurm.conf(5) HealthCheckProgram)
    "settings.timeout_site": (lambda v: _finite(v) and 0 < v <= 55, "must be > 0 and at most 55 s"),
    "settings.site_healthcheck": (
        lambda v: v == "" or v.startswith("/"),
        "must be an absolute path (slurmd's health check has no PATH), or empty",
    ),
    "nvme.count": _AT_LEAST_0,
    "nvme.wear_warn_pct": (lambda v: 1 <= v <= 255, "must be 1 to 255 (percentage used)"),
    "nvme.temp_warn_c": (lambda v: 0 < v < 200, "must be degrees Celsius, 1 to 199"),
    "settings.resume_after": _AT_LEAST_0,  # 0 acts as 1 (node/actions.py)
    "settings.breaker_share": (
        lambda v: _finite(v) and 0 <= v <= 1,
        "must be a share of the fleet from 0 to 1",
    ),
    "settings.breaker_window": (lambda v: _finite(v) and v > 0, "must be > 0 seconds, finite"),
    "settings.probation_days": _AT_LEAST_0,
    "settings.remediate": (
        lambda v: v in REMEDIATE_MODES,
        f"must be one of {', '.join(REMEDIATE_MODES)}",
    ),
    # 0 would mean never: that is remediate = "off"
    "settings.remediate_max": (lambda v: 1 <= v <= 100, "must be 1 to 100 remediations"),
    "settings.remediate_window": (
        lambda v: _finite(v) and 0 < v <= 366 * 86400,
        "must be > 0 and at most a year, seconds",
    ),
    "settings.diag_allreduce_floor_gbps": _AT_LEAST_0,
    "settings.diag_ib_lat_max_usec": _AT_LEAST_0,
    "settings.diag_ib_min_share": (
        lambda v: _finite(v) and 0 <= v <= 1,
        "must be a share of the port's rate from 0 to 1",
    ),
    "settings.diag_mpi": (
        lambda v: len(v) <= 32 and all(c.isalnum() or c in "_-" for c in v),
        "must be an MPI plugin type srun knows (pmix, pmi2, none) or empty",
    ),
    "settings.diag_reservation": (
        lambda v: 0 < len(v) <= 64 and all(c.isalnum() or c in "_.-" for c in v),
        "must be 1-64 letters, digits, '_', '.' or '-' (a Slurm reservation name)",
    ),
    **{f"gpu.{k}": _AT_LEAST_0 for k in ("count", "pcie_gen", "pcie_width")},
    "gpu.clock_event_mask": (lambda v: 0 <= v < 1 << 64, "must be a 64-bit mask (0 to 2^64-1)"),
    "gpu.sbe_warn": _AT_LEAST_1,
    "gpu.thermal_share_warn": (lambda v: _finite(v) and 0 < v <= 1, "must be a share > 0, <= 1"),
    **{f"gpu.{k}": _AT_LEAST_1 for k in ("sbe_total_warn", "remap_rows_max", "retired_pages_max")},
    "nvlink.crc_fail_per_s": (lambda v: _finite(v) and v > 0, "must be > 0 errors per second"),
    "nvlink.crc_min_interval_s": _SECONDS,
    **{  # rate thresholds per hour: 0 means any rate (the count alone decides)
        f"ib.{k}": _AT_LEAST_0 for k in checks.HOOKED["ib"].DEFAULTS if k.endswith("_per_h")
    },
    "nvlink.links_per_gpu": _AT_LEAST_0,
    "ib.rate": _AT_LEAST_0,
    **{f"ib.{k}": _AT_LEAST_0 for k in ("pcie_gen", "pcie_width")},
    "gpu.mig": (lambda v: v.strip().lower() in ("", "off", "on"), "must be off, on or empty"),
    **{  # counter-delta thresholds: a delta at or above one warns or fails
        f"{area}.{k}": _AT_LEAST_1
        for area in ("nvlink", "ib")
        for k in checks.HOOKED[area].DEFAULTS
        if k.endswith(("_warn", "_fail"))
    },
    **{  # the C2C counter deltas, as NVLink's
        f"gpu.{k}": _AT_LEAST_1 for k in checks.HOOKED["gpu"].DEFAULTS if k.startswith("c2c_")
    },
    "ib.devices": (
        lambda v: all(isinstance(e, str) and e.strip() for e in v),
        "must be a list of HCA names (strings, as mlx5_0)",
    ),
    "ib.ports": (
        lambda v: all(isinstance(e, str) and re.fullmatch(r"[^:\s]+:[0-9]+", e) for e in v),
        "must be a list of ports as HCA:PORT strings (mlx5_0:1)",
    ),
    "xid.app": (lambda v: all(_xid_number(e) for e in v), "must be a list of Xid numbers"),
    "xid.severity": (
        lambda v: all(_xid_number(k) and c in _XID_CLASSES for k, c in v.items()),
        'must map Xid numbers to app, warn, fail or ignore ({ 94 = "warn" })',
    ),
    "xid.unknown": (lambda v: v in ("warn", "fail", "ignore"), "must be warn, fail or ignore"),
    "xid.dedup_s": _AT_LEAST_0,
    # the node's memory (checks/xid.py _escalate): 0 turns a rule off; a year at most, as the
    # agent reads that much of the store on every run
    "xid.repeat_days": (lambda v: 0 <= v <= 366, "must be 0 (off) to 366 days"),
    "xid.burst_max": _AT_LEAST_0,
    "xid.burst_h": (lambda v: 0 < v <= 24 * 366, "must be > 0 and at most 8784 hours"),
    "xid.tpc_jobs": _AT_LEAST_0,
    "xid.sxid_repeat_max": _AT_LEAST_0,
    "xid.hca_unplug_max": _AT_LEAST_0,
    # host areas on the kernel source (checks/ps.py, modules.py, net.py, edac.py) and mce
    **{f"{k}": _NAMES for k in ("ps.daemons", "ps.absent", "modules.loaded", "modules.absent")},
    "net.up": _NAMES,
    "net.mtu": (
        lambda v: all(isinstance(m, int) and not isinstance(m, bool) and 68 <= m <= 65536
                      for m in v.values()),
        "must map interface names to MTUs from 68 to 65536 ({ ib0 = 4092 })",
    ),
    **{f"net.{k}": _AT_LEAST_0 for k in ("flaps_warn", "flaps_fail")},
    "edac.ue_fail": _AT_LEAST_1,
    "edac.ce_warn_per_day": _AT_LEAST_0,
    "mce.corrected_warn": _AT_LEAST_0,
    "aer.corrected_per_h": _AT_LEAST_0,
}


# Keys that hold a span of time, by "section.key", with the unit a bare number is in (the key's
# name or description says it; that is how every config file wrote them). A string is a
# duration as the command line takes one (`90s`, `1h`, `7d`, `1d12h`: core/timespec.py), turned
# into the key's unit when the file is read: one grammar everywhere, old files unchanged.
DURATIONS = {
    **{f"settings.{k}": 1 for k in ("deadline", "timeout_gpu", "timeout_ib", "timeout_kmsg")},
    **{f"settings.{k}": 1 for k in ("timeout_fs", "timeout_host")},
    "fs.stat_timeout": 1,
    **{f"settings.{k}": 1 for k in _LATER_TIMEOUTS},
    "settings.timeout_site": 1,
    "settings.drain_timeout": 1,
    "settings.timeout_kernel": 1,
    "settings.breaker_window": 1,
    "settings.probation_days": 86400,
    "settings.remediate_window": 1,
    "xid.dedup_s": 1,
    "xid.repeat_days": 86400,
    "xid.burst_h": 3600,
    "nvlink.crc_min_interval_s": 1,
}
_UNIT_NAMES = {1: "seconds", 3600: "hours", 86400: "days"}


def _in_unit(section: str, key: str, text: str) -> object:
    """A duration string as a number in the key's unit; ValueError says why it is not one."""
    from slurmhealth.core import timespec  # noqa: PLC0415 - only for a file that uses one

    unit = DURATIONS[f"{section}.{key}"]
    value = timespec.parse_duration(text) / unit
    if _schema(section)[key][1] is int:
        if value != int(value):
            raise ValueError(f"{text!r} is not a whole number of {_UNIT_NAMES[unit]}")
        return int(value)
    return value


def _read_durations(data: Data) -> None:
    """Duration strings of time keys -> numbers in the keys' units, in place (top level and
    [[node]] blocks); a string that is no duration stays for value_problem to name."""
    blocks = data.get("node")
    tables = [b for b in blocks if isinstance(b, dict)] if isinstance(blocks, list) else []
    for layer in [data, *tables]:
        for section, table in layer.items():
            if not isinstance(table, dict):
                continue
            for key, value in table.items():
                if f"{section}.{key}" in DURATIONS and isinstance(value, str):
                    try:
                        table[key] = _in_unit(section, key, value)
                    except ValueError:
                        pass


def value_problem(section: str, key: str, value: object) -> str | None:
    """Why a value of a known key is unusable (wrong type or out of bounds), else None."""
    if f"{section}.{key}" in DURATIONS and isinstance(value, str):
        try:
            _in_unit(section, key, value)
        except ValueError as exc:
            return str(exc)
    kind = _schema(section)[key][1]
    if not _type_ok(value, kind):
        return f"must be {kind.__name__}, not {value!r}"
    test, why = BOUNDS.get(f"{section}.{key}", (None, ""))
    if test is not None and not test(value):
        return f"{why}, not {value!r}"
    return None


class ConfigError(Exception):
    """A config the user wrote that cannot be used: message names the file and line.

    `usable`: when the only problems are unusable values of known keys (wrong type, out of
    bounds), the config without those values, so their defaults apply (what a hook runs with);
    otherwise None (the file cannot be read, or a section, key, check or pattern is wrong).
    """

    def __init__(self, message: str | list[str], usable: Config | None = None) -> None:
        # one printable line per problem (a list: several): keys, sections and values are the
        # file's own text, which TOML's escapes let hold newlines and terminal controls
        problems = message if isinstance(message, list) else [message]
        super().__init__("\n".join(clean(line, 300) for line in problems))
        self.usable = usable


def defaults(phase: str | None = None) -> Data:
    """Built-in expectations: the DEFAULTS of every area `phase` runs (None: every area; a job
    hook's leave out the areas it never runs, checks.LATER) plus settings."""
    out: Data = {"settings": {k: v[0] for k, v in SETTINGS.items()}, "checks": {}}
    for name, module in checks.areas(phase).items():
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


def _schema(section: str) -> Schema:
    return SETTINGS if section == "settings" else checks.module(section).DEFAULTS


def _type_ok(value: object, kind: type[object]) -> bool:
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


_BLOCK = re.compile(r'^\s*\[\[\s*(node|"node")\s*\]\]')


def _block_lines(text: str) -> list[int]:
    """The line of each `[[node]]` header, in order: block i of the parsed array is header i
    (the inline form `node = [{...}]` has none: _line_of's line of `node` then)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if _BLOCK.match(line)]


def _value_line(text: str, key: str, value: object) -> int:
    """Line of the `key = value` that reads as `value` (a key set at the top and again in a
    [[node]] block has several); else _line_of's first line of the key."""
    pattern = re.compile(r"(^|[\s.\[\"])" + re.escape(key) + r"\"?\s*=(.*)$")
    for number, line in enumerate(text.splitlines(), 1):
        found = pattern.search(line)
        if not found or "#" in line[: found.start()]:
            continue
        try:
            read = _toml_loads("v =" + found.group(2))["v"]
        except ValueError:  # a multi-line array, an inline table: no better guess
            continue
        if repr(read) == repr(value):
            return number
    return _line_of(text, key)


class Config:
    """A parsed, validated config file (or the built-in defaults when path is None)."""

    def __init__(self, data: Data | None = None, path: str | None = None) -> None:
        self.data = data or {}
        self.path = path

    def for_node(self, node: str, phase: str | None = None) -> Data:
        """Effective expectations: defaults <- top-level tables <- matching [[node]] blocks.
        `phase`: the areas of defaults(phase) (a section the file sets is kept whole)."""
        out = defaults(phase)
        _merge(out, self.data)
        for block in self.data.get("node", []):
            if hostlist.matches(block["match"], node):
                _merge(out, block)
        return out


def _merge(out: Data, layer: Data) -> None:
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
    if section not in checks.NAMES and section != "settings":
        known = ", ".join(["settings", "checks", "node", *checks.NAMES])
        return [f"{where}:{_line_of(text, section)}: unknown section [{section}] (known: {known})"]
    if not isinstance(values, dict):
        return [f"{where}:{_line_of(text, section)}: [{section}] must be a table"]
    errors = []
    schema = _schema(section)
    for key, value in values.items():
        if key not in schema:
            errors.append(f"{where}:{_line_of(text, key)}: unknown key {section}.{key}")
            continue
        why = value_problem(section, key, value)
        if why is None:
            continue
        line = _value_line(text, key, value)
        spelt = isinstance(value, str) and f"{section}.{key}" in DURATIONS
        if not _type_ok(value, schema[key][1]) and not spelt:
            want = schema[key][1].__name__
            errors.append(f"{where}:{line}: {section}.{key} must be {want}, not {value!r}")
        else:
            errors.append(f"{where}:{line}: {section}.{key}: {why}")
    return errors


def _drop_unusable(data: Data) -> Data:
    """The parsed file without the values value_problem rejects, in [[node]] blocks too."""

    def layer(values: Data) -> Data:
        out = dict(values)
        for section, table in values.items():
            if (section in checks.NAMES or section == "settings") and isinstance(table, dict):
                schema = _schema(section)
                out[section] = {
                    k: v
                    for k, v in table.items()
                    if k not in schema or value_problem(section, k, v) is None
                }
        return out

    blocks = data.get("node")
    out = layer(data)
    if isinstance(blocks, list):
        out["node"] = [layer(b) if isinstance(b, dict) else b for b in blocks]
    return out


def _check_overrides(values: object, where: str, text: str) -> list[str]:
    if not isinstance(values, dict):
        return [f"{where}:{_line_of(text, 'checks')}: [checks] must be a table"]
    errors = []
    for name, override in values.items():
        line = _line_of(text, name)
        if not checks.known(name):
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
    headers = _block_lines(text)
    for index, block in enumerate(blocks):
        line = headers[index] if index < len(headers) else _line_of(text, "node")
        if not isinstance(block, dict):
            errors.append(f"{where}:{_line_of(text, 'node')}: node must be an array of tables")
            continue
        pattern = block.get("match")
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


def validate(data: Data, where: str, text: str) -> list[str]:
    """Every problem of a parsed file, each `file:line: message`."""
    errors = []
    for section, values in data.items():
        if section == "node":
            errors.extend(_check_nodes(values, where, text))
        else:
            errors.extend(_check_section(section, values, where, text))
    return errors


def _toml_loads(text: str) -> Data:
    try:
        import tomllib  # noqa: PLC0415 - costly (docs/benchmarks.md), only when a file is read
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # noqa: PLC0415
    data: Data = tomllib.loads(text)
    return data


def parse(text: str, where: str = "<config>") -> Data:
    """TOML text -> validated data; ConfigError with `file:line: message` lines (and, when
    only values were unusable, `usable`: the config with their defaults, see ConfigError)."""
    try:
        data = _toml_loads(text)
    except ValueError as exc:  # TOMLDecodeError: "... (at line 3, column 7)"
        found = re.search(r"at line (\d+)", str(exc))
        line = found.group(1) if found else "0"
        raise ConfigError(f"{where}:{line}: {exc}") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise ConfigError(f"{where}: nested too deep to be a config") from None
    try:
        _read_durations(data)
        errors = validate(data, where, text)
    except RecursionError:
        raise ConfigError(f"{where}: nested too deep to be a config") from None
    if errors:
        usable = _drop_unusable(data)
        salvaged = None if validate(usable, where, text) else Config(usable, where)
        raise ConfigError(errors, salvaged)
    return data


def toml_value(value: object) -> str:
    """A Python value as TOML (the few types expectations use)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        pairs = (f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(pairs) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def _toml_key(key: object) -> str:
    """A table key as TOML: bare where it may be (94, gpu01), quoted otherwise ("/scratch")."""
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else json.dumps(text)


def _example_section(name: str, schema: Schema) -> list[str]:
    lines = [f"[{name}]"]
    for key, (default, kind, why) in schema.items():
        lines.append(f"# {why} ({kind.__name__})")
        shown = f"{key} = {toml_value(default)}" if default is not None else f"{key} = ..."
        lines.append(f"# {shown}")
    return [*lines, ""]


def example_text() -> str:
    """The annotated example config: the catalogue of every setting and check, all commented."""
    lines = [
        "# slurmhealth expectations: /etc/slurmhealth/slurmhealth.toml",
        "# Every key is shown commented with its built-in default; unset keys expect nothing",
        "# that the node does not report. `slurmhealth config genconf` writes the values of a",
        "# known-good node; `slurmhealth config validate` checks this file. A time is a number",
        '# in the unit its key names (seconds unless it says days or hours) or a duration as the',
        '# command line takes one: "90s", "10m", "1h", "7d", "1d12h".',
        "",
        *_example_section("settings", SETTINGS),
    ]
    for name, module in checks.areas().items():
        lines.extend(_example_section(name, module.DEFAULTS))
    lines.append('# Per-check overrides: enabled = false, or severity = "warn" | "fail".')
    for check in checks.REGISTRY:
        lines.append(f'# [checks."{check}"]  # {checks.describe(check)}')
    lines += [
        "",
        "# Node-set blocks (later ones win): patterns like gpu[01-16], globs, !negation.",
        "# [[node]]",
        '# match = "gpu[01-16],!gpu05"',
        "# gpu.count = 8",
        "",
    ]
    return "\n".join(lines)


def chosen_path(path: str | None) -> str | None:
    """The config file named (--config, then SLURMHEALTH_CONFIG) or the default path if it
    exists; None: no config file at all. Not yet judged trusted (resolve_path)."""
    chosen = path or os.environ.get("SLURMHEALTH_CONFIG")
    if chosen:
        return chosen
    try:
        os.stat(DEFAULT_PATH)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:  # there, in a directory this user may not enter: said where it is read
        pass
    return DEFAULT_PATH


def resolve_path(path: str | None) -> str | None:
    """--config, then SLURMHEALTH_CONFIG, then the default path if it exists.

    A config someone other than root could have written (group- or world-writable, another
    owner, a symlink, in a directory others can write) is refused: it decides what drains a
    node and which programs run as root. ConfigError, so the hooks run with built-in defaults,
    loudly, and `check` or `config validate` say why."""
    chosen = chosen_path(path)
    if chosen is None:
        return None
    from slurmhealth.core import files  # noqa: PLC0415

    why = files.trusted(chosen)
    if why and _hidden(chosen):
        raise ConfigError(f"{chosen}: {DENIED}")
    if why:
        raise ConfigError(f"{chosen}: not trusted: {why}")
    return chosen


# A config this user may not read (root's, read by a user who is not root).
DENIED = "cannot read config (permission denied): run as root"


def _hidden(path: str) -> bool:
    """Whether this user may not even look at `path` (a directory on its way is root's)."""
    try:
        os.lstat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


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
    except PermissionError:
        raise ConfigError(f"{path}: {DENIED}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    return Config(parse(text, path), path)


# What `config validate` says when no file is named and none is at the default path.
NO_FILE = (
    "no config file: built-in defaults apply, and each node's own known-good runs set its"
    " expectations (GPUs, NVLinks, InfiniBand ports, PCIe links, daemons, modules, network"
    " links)"
)


def validate_file(path: str | None, console: Console) -> int:
    """`slurmhealth config validate`: the file `path` names (or $SLURMHEALTH_CONFIG, or the
    default) loads: `PATH: ok`, 0; no file at all is said as such, 0; else each problem as one
    line on standard error, FILE:LINE: message (a file not trusted too), 2."""
    try:
        resolved = resolve_path(path)
        if resolved is not None:
            load(resolved)
    except ConfigError as exc:
        console.err(str(exc))
        return 2
    console.out(NO_FILE if resolved is None else f"{resolved}: ok")
    return 0
