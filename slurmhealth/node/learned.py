"""A node's own known-good runs as its expectations when no config file exists (pure).

With no config the checks expect only what every GPU node needs, so a node that came up with 7
of its 8 GPUs, an NVLink down or an HCA missing would pass as long as nothing else is wrong.
Instead each stored run on a node without a config file keeps, per area, what the node showed
on a run where that area passed (no fail, no error): its GPU count, model and PCIe links,
its GPUs' multi-node NVLink clique where they had one (GB200/GB300 NVL72),
NVLinks up per GPU, its HCAs, InfiniBand ports, their rate, link layer and PCIe links, its
memory, CPUs online and sockets, the known daemons it runs (munged, nvidia-persistenced, ...),
the known GPU and InfiniBand modules it has loaded, its physical network interfaces up with
carrier, and its EDAC tree. Later
runs expect at least that: a drop fails, and the message says that the expectation is the
node's own and how to write a config. Versions (driver, VBIOS, firmware) and MIG mode are never
learned: an admin changes those on purpose.

Kept in the node store as the baseline `expect` (read with the other baselines, no extra
query), rewritten only when a value changes. A config file replaces all of it; a replay
(`check --gpu-source FILE`) neither learns nor uses it.
"""

from __future__ import annotations

import time

from slurmhealth.core.result import ERROR, FAIL
from slurmhealth.node import checks

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, TypedDict

    from slurmhealth.core.result import Result

    class Applied(TypedDict):
        """What apply() put into one area's expectations: the keys, and since when (epoch
        seconds; None when the stored document lacks it)."""

        keys: list[str]
        since: float | None

BASELINE = "expect"

# area -> key learned -> the checks that judge it (their failures say where it came from)
LEARNED: dict[str, dict[str, tuple[str, ...]]] = {
    "gpu": {
        "count": ("count",),
        "model": ("model",),
        "pcie_gen": ("pcie", "pcie_link"),
        "pcie_width": ("pcie", "pcie_link"),
        "clique": ("clique",),
    },
    "nvlink": {"links_per_gpu": ("link_state",)},
    "ib": {
        "devices": ("devices_present",),
        "ports": ("port_state",),
        "rate": ("port_rate",),
        "link_layer": ("link_layer",),
        "pcie_gen": ("pcie_link",),
        "pcie_width": ("pcie_link",),
    },
    # Memory lost (a DIMM) or CPUs lost (a socket, cores disabled after machine checks); not
    # SMT, nor the mounts: an admin changes those on purpose, an automounter every hour.
    "hw": {"memory_gb": ("memory",), "cpus": ("cpu_count",), "sockets": ("topology",)},
    "ps": {"daemons": ("daemons",)},
    "modules": {"loaded": ("loaded",)},
    "net": {"up": ("link_up",)},
    "edac": {"expected": ("uncorrected",)},
}

HINT = "no config: slurmhealth config genconf writes one"


def _values(area: str, facts: object) -> dict[str, Any]:
    """The learned keys of an area's genconf expectations, without the empty ones (no GPUs,
    no ports: nothing to expect)."""
    found = checks.expectations(area, facts)
    out = {k: v for k, v in found.items() if k in LEARNED[area] and v not in (None, "", [], 0)}
    if area == "ib" and not out.get("ports"):
        out.pop("link_layer", None)  # a layer means something only for the ports it names
    return out


def learn(
    facts: dict[str, Any], results: list[Result], before: object, now: float
) -> dict[str, Any] | None:
    """The `expect` baseline after a run: each area that passed gives its values anew (with
    the time they were first shown), the others keep theirs. None when nothing changed."""
    areas = before.get("areas") if isinstance(before, dict) else None
    known: dict[str, Any] = dict(areas) if isinstance(areas, dict) else {}
    broken = {r.check.split(".")[0] for r in results if r.status in (FAIL, ERROR)}
    changed = False
    for area in LEARNED:
        if area not in facts or area in broken:
            continue
        values = _values(area, facts[area])
        entry = known.get(area)
        if not values or values == (entry.get("values") if isinstance(entry, dict) else None):
            continue
        known[area] = {"values": values, "since": now}
        changed = True
    return {"areas": known} if changed else None


def apply(expect: dict[str, dict[str, Any]], doc: object) -> dict[str, Applied]:
    """The learned values over the built-in defaults (no config: nothing else sets them), and
    {area: {"keys": [...], "since": epoch}} of what was applied."""
    known = doc.get("areas") if isinstance(doc, dict) else None
    applied: dict[str, Applied] = {}
    if not isinstance(known, dict):
        return applied
    for area, entry in known.items():
        values = entry.get("values") if isinstance(entry, dict) else None
        if area not in LEARNED or area not in expect or not isinstance(values, dict):
            continue
        keys = sorted(k for k in values if k in LEARNED[area])
        expect[area].update({k: values[k] for k in keys})
        applied[area] = {"keys": keys, "since": entry.get("since")}
    return applied


def annotate(results: list[Result], applied: dict[str, Applied]) -> None:
    """A failing check that judged a learned value says so: `(as this node showed since
    DATE; no config: slurmhealth config genconf writes one)`."""
    for result in results:
        area, _, name = result.check.partition(".")
        entry = applied.get(area)
        if result.status != FAIL or not entry:
            continue
        if any(name in LEARNED[area].get(k, ()) for k in entry["keys"]):
            since = entry.get("since")
            day = time.strftime("%Y-%m-%d", time.gmtime(since)) if since else "an earlier run"
            result.message += f" (as this node showed since {day}; {HINT})"
