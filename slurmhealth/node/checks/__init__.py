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
            its source is never gathered, nor the source's module imported; listed in LATER,
            the area's own module is not imported by a job hook either.
  SCOPED    the checks that judge GPU by GPU, with for_gpus(facts, ctx, keep) -> the facts of
            the GPUs `keep` takes: in a prolog or epilog each is judged on the job's own GPUs
            (base.job_verdict; docs/shared-nodes.md); none: the area judges the node as a whole
"""

from __future__ import annotations

import importlib

from slurmhealth.core.constants import EPILOG, PHASES, PROLOG
from slurmhealth.node.checks import (
    aer,
    edac,
    fs,
    gpu,
    hw,
    ib,
    mce,
    modules,
    net,
    nvlink,
    ps,
    time,
    xid,
)

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

# The areas every phase may run, imported with this module: all that the job hooks load.
HOOKED = {
    m.AREA: m
    for m in (gpu, nvlink, ib, xid, mce, aer, fs, hw, time, ps, modules, net, edac)
}
# The areas whose PHASES leave the job hooks out (a SMART log, the BMC, the site's own health
# check): imported on first use, so that a prolog loads neither them nor their settings
# (docs/benchmarks.md). tests/test_layout.py keeps this equal to their PHASES.
LATER = ("nvme", "bmc", "imex", "fmlog", "site")
NAMES = (*HOOKED, *LATER)  # every area, in the catalogue's order
_JOB_HOOKS = (PROLOG, EPILOG)


def module(area: str) -> Any:
    """The module of `area` (KeyError: no such area); one of LATER is imported here."""
    found = HOOKED.get(area)
    if found is not None:
        return found
    if area not in LATER:
        raise KeyError(area)
    return importlib.import_module(f"{__name__}.{area}")


def areas(phase: str | None = None) -> dict[str, Any]:
    """{name: module} of the areas `phase` may run (None: every area), in catalogue order. A
    job hook's are HOOKED (the LATER ones never run there); any other phase imports them all."""
    if phase in _JOB_HOOKS:
        return HOOKED
    return {name: module(name) for name in NAMES}


def check(name: str) -> Any:
    """The check `name` (`area.function`), importing only its own area; None: no such check."""
    area, _, func = name.partition(".")
    if area not in NAMES:
        return None
    return next((fn for fn in module(area).CHECKS if fn.__name__ == func), None)


def known(name: str) -> bool:
    """Whether `name` is a check (`area.function`)."""
    return check(name) is not None


def __getattr__(name: str) -> Any:
    """AREAS ({name: module}, every area) and REGISTRY ({`area.function`: check}, every check)
    for the commands that want them all; built on first use, never by a job hook."""
    if name == "AREAS":
        value: Any = areas()
    elif name == "REGISTRY":
        value = {f"{m.AREA}.{fn.__name__}": fn for m in areas().values() for fn in m.CHECKS}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def baseline(area: str, facts: Any, now: float | None = None) -> dict[str, Any]:
    """What `area` remembers of this run for the next (its baseline(); none: nothing)."""
    func = getattr(module(area), "baseline", None)
    return func(facts, now) if func else {}


def expectations(area: str, facts: Any) -> dict[str, Any]:
    """The expectations `area`'s facts imply on a known-good node (none: nothing)."""
    func = getattr(module(area), "expectations", None)
    return func(facts) if func else {}


def expected(area: str, expect: dict[str, Any], raw: object = None) -> bool:
    """Whether `area`'s source being unavailable fails it (none: never, it skips)."""
    func = getattr(module(area), "expected", None)
    return bool(func(expect, raw)) if func else False


def runs_in(area: str, phase: str) -> bool:
    """Whether `area` runs in `phase` (its PHASES; absent: every phase). A job hook never
    runs one of LATER, and so never imports it."""
    if area in LATER and phase in _JOB_HOOKS:
        return False
    return phase in getattr(module(area), "PHASES", PHASES)


def describe(name: str) -> str:
    """First line of a check's docstring: the catalogue entry."""
    doc = check(name).__doc__ or ""
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
    for area, found in areas().items():
        only = getattr(found, "PHASES", None)
        runs = f"; runs in: {', '.join(only)}" if only else ""
        out += [f"## `{area}` (source: {found.SOURCE}{runs})", "", "| check | what it verifies |"]
        out.append("|---|---|")
        out += [f"| `{area}.{fn.__name__}` | {describe(f'{area}.{fn.__name__}')} |"
                for fn in found.CHECKS]
        scoped = [f"`{area}.{fn.__name__}`" for fn in getattr(found, "SCOPED", ())]
        if scoped:
            out += ["", "In a prolog or epilog these judge the job's own GPUs (a fault on another "
                    "GPU drains the node and lets the job run: docs/shared-nodes.md): "
                    + ", ".join(scoped) + "."]
        if found.DEFAULTS:
            out += ["", "| setting | default | why |", "|---|---|---|"]
            out += [f"| `{area}.{key}` | `{_value(spec[0])}` | {spec[2]} |"
                    for key, spec in found.DEFAULTS.items()]
        out.append("")
    return "\n".join(out)
