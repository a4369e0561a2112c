"""What every check receives besides its area's facts: the node, the phase, expectations, baselines.

A check is `fn(facts, ctx) -> Result`: a small pure function. Facts come from the area's
`parse(raw)` (run once per run, so each source is read and parsed once: gather once, check many).
"""

from __future__ import annotations

from slurmhealth.core.result import FAIL, WARN, Result, counted

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, Callable

    # An area's facts as its parse(raw) returns them: JSON-able, keyed as that parse writes.
    Facts = dict[str, Any]
    # An area's DEFAULTS (and config.SETTINGS): key -> (default, type, one line of why). The
    # default is Any: its type is the second item, which config checks each value against.
    Schema = dict[str, tuple[Any, type[Any], str]]
    # Which GPU indexes a narrowed copy of the facts keeps (None: a GPU not known by index).
    Keep = Callable[[int | None], bool]


class Context:
    """Read-only inputs of a check other than its facts.

    expect:   the node's effective expectations for this area (a plain dict, see config.py).
    baseline: what this area's `baseline(facts)` returned on the previous run on this node
              (counters for deltas, the GPU inventory, the kernel-log sequence), or {}. The
              xid area's also holds "recent": the node's recent Xid events from its store
              (agent.py _with_history), absent without a store.
    gpus:     normalised PCI bus id ("0000:9b:00") -> GPU index, from the GPU facts when known,
              so other areas (XID lines) can name the GPU.
    job_gpus: the current job's GPUs (prolog/epilog) as NVML indexes of physical GPUs (the
              runner maps slurmd's names to them, MIG devices to their GPUs: checks/gpu.py
              job_scope), or None: no job, or its GPUs not known.
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


# --- shared nodes: a job hook judges the job's own GPUs -------------------------------------
#
# An area whose checks judge GPU by GPU names them in SCOPED and gives for_gpus(facts, ctx,
# keep): its facts narrowed to the GPUs `keep` takes (pure list filtering). In a prolog or an
# epilog whose job's GPUs are known, such a check that fails the node is judged again on the
# job's GPUs (job_verdict): the job is refused only for a fault on its own GPUs, or on a GPU
# whose index is not known (the safe side). A fault only on GPUs the job does not hold is kept
# as a warning that names them (`scope`), and still drains the node (fails_node): no further
# job lands on the faulty GPU, while the jobs running there go on under the drain (Slurm drains
# a node, never one GPU). Nothing of this runs unless a check failed.

JOB_PHASES = ("prolog", "epilog")


def other_gpus(result: Result) -> list[int] | None:
    """The GPUs a job hook's warning is about when it stands for a fault on GPUs the job does
    not hold (job_verdict), else None."""
    scope = result.data.get("scope") if result.status == WARN else None
    gpus = scope.get("other_gpus") if isinstance(scope, dict) else None
    return gpus if isinstance(gpus, list) and gpus else None


def fails_node(result: Result) -> bool:
    """Whether `result` takes the node out of service: a failing check, or a job hook's fault
    on GPUs its job does not hold, which drains the node without refusing the job."""
    return result.status == FAIL or other_gpus(result) is not None


def demoted(result: Result, job_gpus: list[int], gpus: list[int]) -> Result:
    """`result`, a fault on `gpus` only, as a job hook whose job holds `job_gpus` keeps it: a
    warning with the same words and action, and `scope` saying whose GPUs they are."""
    scope = {"job_gpus": list(job_gpus), "other_gpus": list(gpus), "node_verdict": FAIL}
    out = Result(WARN, result.message, dict(result.data, scope=scope), result.action)
    out.check, out.duration = result.check, result.duration
    return out


def job_verdict(
    result: Result,
    judge: Callable[[Facts], Result],
    narrow: Callable[[Keep], Facts],
    ctx: Context,
    known: list[int],
) -> Result:
    """A scoped check's verdict for a job hook, from `result`, its verdict on every GPU.

    judge(facts) runs the check (with the config's overrides) on a narrowed copy of the facts,
    narrow(keep) makes that copy, `known` is every GPU index the facts may name. Only a failed
    `result` in a prolog or epilog with the job's GPUs known is judged again: on the job's GPUs
    and those not known by index (a fail refuses the job, naming its GPU), then on each other
    GPU alone; a fault found there only is demoted. A fault no single GPU shows stays a fail."""
    job = ctx.job_gpus
    if result.status != FAIL or job is None or ctx.phase not in JOB_PHASES:
        return result
    mine = judge(narrow(lambda index: index is None or index in job))
    if mine.status == FAIL:
        if mine.message != result.message:
            mine.data = dict(mine.data, scope={"job_gpus": list(job), "node": result.message})
        return mine
    others = sorted(set(known) - set(job))
    faulty = [g for g in others if judge(narrow(_only(g))).status == FAIL]
    return demoted(result, job, faulty) if faulty else result


def _only(gpu: int) -> Keep:
    """Keeps GPU `gpu` alone."""
    return lambda index: index == gpu
