"""The check registry: every check of every area, by name (`area.function`).

Each area module is a plain module with the same small interface (no entry-point magic):
  AREA      the area name used by `--only` and in check names ("gpu", "nvlink", "ib", "xid",
            "fs", "hw", "time", "ps", "modules", "net", "edac", "mce", "aer")
  SOURCE    which gathered source it reads ("gpu" = NVML, "ib" = sysfs, "kmsg" = kernel log,
            "fs" = mountinfo and statvfs, "host" = meminfo, CPU lists and the clock,
            "kernel" = the host's /proc and /sys: processes, modules, links, EDAC)
  DEFAULTS  {key: (default, type, one line of why)}: the area's expectations and thresholds
  parse(raw) -> facts          pure, never raises on bad input; runs once per run
  CHECKS    (fn, ...) each fn(facts, ctx) -> Result, small and pure
Optional, each with the default of an area that has none (the callers below):
  baseline(facts, now) -> dict what to remember for the next run (counters, sequence, inventory,
                               and when: `now`, so the next run judges rates over the interval);
                               none: nothing
  expectations(facts) -> dict  the expectations a known-good node implies (config genconf);
                               none: nothing is learned
  expected(expect, raw) -> bool whether an unavailable source fails the area (expected but
                               missing) rather than skipping it; none: never
  PHASES    the phases the area runs in (core/constants.py PHASES names them); none: every
            phase. An area whose source is slow or asks a device (a SMART log, the BMC, the
            site's own health check) leaves the job hooks out: runner.run skips it there, so
            its source is never gathered, nor the source's module imported.
  SCOPED    the checks that judge GPU by GPU, with for_gpus(facts, ctx, keep) -> the facts of
            the GPUs `keep` takes: in a prolog or epilog each is judged on the job's own GPUs
            (base.job_verdict; docs/shared-nodes.md); none: the area judges the node as a whole
"""

from __future__ import annotations

from slurmhealth.core.constants import PHASES
from slurmhealth.node.checks import (
    aer,
    bmc,
    edac,
    fs,
    gpu,
    hw,
    ib,
    mce,
    modules,
    net,
    nvlink,
    nvme,
    ps,
    site,
    time,
    xid,
)

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

AREAS = {
    m.AREA: m
    for m in (gpu, nvlink, ib, xid, mce, aer, fs, hw, time, ps, modules, net, edac, nvme, bmc, site)
}

REGISTRY = {f"{m.AREA}.{fn.__name__}": fn for m in AREAS.values() for fn in m.CHECKS}


def baseline(area: str, facts: Any, now: float | None = None) -> dict[str, Any]:
    """What `area` remembers of this run for the next (its baseline(); none: nothing)."""
    func = getattr(AREAS[area], "baseline", None)
    return func(facts, now) if func else {}


def expectations(area: str, facts: Any) -> dict[str, Any]:
    """The expectations `area`'s facts imply on a known-good node (none: nothing)."""
    func = getattr(AREAS[area], "expectations", None)
    return func(facts) if func else {}


def expected(area: str, expect: dict[str, Any], raw: object = None) -> bool:
    """Whether `area`'s source being unavailable fails it (none: never, it skips)."""
    func = getattr(AREAS[area], "expected", None)
    return bool(func(expect, raw)) if func else False


def runs_in(area: str, phase: str) -> bool:
    """Whether `area` runs in `phase` (its PHASES; absent: every phase)."""
    return phase in getattr(AREAS[area], "PHASES", PHASES)


def describe(name: str) -> str:
    """First line of a check's docstring: the catalogue entry."""
    doc = REGISTRY[name].__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _value(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text.replace("|", "\\|")


def catalogue_markdown() -> str:
    """docs/checks.md's body: per area, every check with its one line, and every setting with
    its default and the line that argues it (the sources behind those are in docs/sources.md
    and beside each threshold in the code). scripts/update-catalogue writes it; a test keeps
    the file equal to the code."""
    out = []
    for area, module in AREAS.items():
        only = getattr(module, "PHASES", None)
        runs = f"; runs in: {', '.join(only)}" if only else ""
        out += [f"## `{area}` (source: {module.SOURCE}{runs})", "", "| check | what it verifies |"]
        out.append("|---|---|")
        out += [f"| `{area}.{fn.__name__}` | {describe(f'{area}.{fn.__name__}')} |"
                for fn in module.CHECKS]
        scoped = [f"`{area}.{fn.__name__}`" for fn in getattr(module, "SCOPED", ())]
        if scoped:
            out += ["", "In a prolog or epilog these judge the job's own GPUs (a fault on another "
                    "GPU drains the node and lets the job run: docs/shared-nodes.md): "
                    + ", ".join(scoped) + "."]
        if module.DEFAULTS:
            out += ["", "| setting | default | why |", "|---|---|---|"]
            out += [f"| `{area}.{key}` | `{_value(spec[0])}` | {spec[2]} |"
                    for key, spec in module.DEFAULTS.items()]
        out.append("")
    return "\n".join(out)
