"""What every check receives besides its area's facts: the node, the phase, expectations, baselines.

A check is `fn(facts, ctx) -> Result`: a small pure function. Facts come from the area's
`parse(raw)` (run once per run, so each source is read and parsed once: gather once, check many).
"""

from __future__ import annotations

from slurmhealth.core.result import counted

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    # An area's facts as its parse(raw) returns them: JSON-able, keyed as that parse writes.
    Facts = dict[str, Any]
    # An area's DEFAULTS (and config.SETTINGS): key -> (default, type, one line of why). The
    # default is Any: its type is the second item, which config checks each value against.
    Schema = dict[str, tuple[Any, type[Any], str]]


class Context:
    """Read-only inputs of a check other than its facts.

    expect:   the node's effective expectations for this area (a plain dict, see config.py).
    baseline: what this area's `baseline(facts)` returned on the previous run on this node
              (counters for deltas, the GPU inventory, the kernel-log sequence), or {}. The
              xid area's also holds "recent": the node's recent Xid events from its store
              (agent.py _with_history), absent without a store.
    gpus:     normalised PCI bus id ("0000:9b:00") -> GPU index, from the GPU facts when known,
              so other areas (XID lines) can name the GPU.
    job_gpus: GPU indexes allocated to the current job (prolog/epilog), or None.
    facts:    the facts of the areas parsed before this one in the run ({area: facts}, in
              catalogue order: gpu first), for a check that joins two sources (ps.imex reads
              the GPUs' fabric); an area not run, or whose source gave none, is absent.
    """

    __slots__ = ("baseline", "expect", "facts", "gpus", "job_gpus", "node", "now", "phase")

    def __init__(
        self,
        node: str = "localhost",
        phase: str = "check",
        expect: dict[str, Any] | None = None,
        baseline: dict[str, Any] | None = None,
        gpus: dict[str, int | None] | None = None,
        job_gpus: list[int] | None = None,
        now: float = 0.0,
        facts: dict[str, Any] | None = None,
    ) -> None:
        self.node = node
        self.phase = phase
        self.expect = expect if expect is not None else {}
        self.baseline = baseline if baseline is not None else {}
        self.gpus = gpus if gpus is not None else {}
        self.job_gpus = job_gpus
        self.now = now
        self.facts = facts if facts is not None else {}


DIGITS_MAX = 20  # a u64 counter has at most 20 decimal digits


def uint(text: object) -> int | None:
    """A kernel file's unsigned number: "123" -> 123; "-1", "N/A (no PMA)", garbage, None ->
    None. ASCII digits only, at most DIGITS_MAX of them (sysfs and procfs counters)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > DIGITS_MAX or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def norm_bus_id(bus_id: str) -> str:
    """Normalise a PCI address to the kernel log's form: 4-hex domain, bus, device, lower case.

    NVML says `00000000:9B:00.0`, the kernel log `0000:9b:00` (nvml.h; the driver's NVRM
    lines): join on this form.
    """
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    text = text.split(".")[0]
    parts = text.split(":")
    if len(parts) == 3:
        domain = parts[0][-4:].rjust(4, "0")
        return f"{domain}:{parts[1].rjust(2, '0')}:{parts[2].rjust(2, '0')}"
    if len(parts) == 2:
        return f"0000:{parts[0].rjust(2, '0')}:{parts[1].rjust(2, '0')}"
    return text


def summarize(problems: list[str], noun: str = "") -> str:
    """First problem, plus how many more (`(+1 more GPU)`, `(+7 more GPUs)`): one line that
    fits a Slurm Reason."""
    if not problems:
        return ""
    more = len(problems) - 1
    if not more:
        return problems[0]
    return f"{problems[0]} (+{counted(more, 'more' + noun) if noun else f'{more} more'})"
