"""`slurmhealth diagnose` on a node: a level's probes, run one after the other, each bounded.

A probe is today's checks, one external tool (DCGM's diagnostic, NCCL's all-reduce test,
perftest's bandwidth and latency tests) or the built-in GPU tests (through CuPy, which the extra
slurmhealth[cuda] installs, or PyTorch). Each gives outcomes per GPU, port or node: pass, fail
with evidence, or skip with the reason (a tool that is not installed, a GPU model without a
threshold). slurmhealth installs nothing on its own: what is absent is skipped, and the outcome
says so. docs/diagnose.md lists the
probes, their levels, timeouts and thresholds with their sources.

Tool output is untrusted text: it is parsed (node/diag/parsers.py), never passed to a shell,
and every line that reaches a record is cleaned.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from slurmhealth.core.result import FAIL, OK, SKIP, WARN, clean, counted
from slurmhealth.node.diag import cuda, pairs, parsers
from slurmhealth.node.diag.tool import kill_group
from slurmhealth.node.diag.tool import run as run_tool

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, Callable

    from slurmhealth.core.result import Result
    from slurmhealth.node.checks.base import Facts
    from slurmhealth.node.config import Data

    Outcome = dict[str, Any]  # one unit's finding: unit, status, evidence, figures (outcome())
    Summary = dict[str, Any]  # one probe's: probe, status, seconds, outcomes (summary())
    Unread = dict[str, Any]  # a source the checks could not read (runner.unread)

LEVELS = ("quick", "medium", "long")  # one node's levels, after DCGM's run levels
PAIR = pairs.PAIR  # across nodes: a drained node against two known-good peers, in one job
# Levels that pass only when every probe of theirs ran and passed: a pair level that measured
# the all-reduce but had no port to test (or no ib_write_bw) has not validated the node.
EVERY_PROBE = (PAIR,)
PASS = "pass"  # noqa: S105 - an outcome, not a password

# DCGM's run levels (dcgmi diag -r): 1 quick (seconds), 2 medium (about 2 minutes), 3 long
# (about 15 minutes), per NVIDIA's DCGM user guide; the timeouts leave room above each.
DCGM_LEVEL = {"quick": ("1", 120.0), "medium": ("2", 600.0), "long": ("3", 2400.0)}
# Seconds each built-in GPU test runs (medium: the whole level about 2-5 minutes). Quick runs
# them briefly, as micro-benchmarks for the comparison with peers (docs/diagnose.md): 2 s of
# products and of memory passes, then the fixed-size host and peer copies; with the library's
# start, under a minute on an 8-GPU node.
CUDA_SECONDS = {"quick": 2.0, "medium": 20.0, "long": 180.0}
NCCL_TIMEOUT = {"medium": 600.0, "long": 1200.0}
IB_TIMEOUT = 120.0


class Context:
    """What the probes of one diagnosis share: the level, settings, what the quick checks
    found (GPU model and count, IB ports and rates), where tools are looked for, the node's
    name (the pair level's suspect)."""

    def __init__(
        self, level: str, settings: Data, facts: dict[str, Facts], path: str, node: str = ""
    ) -> None:
        self.level, self.settings, self.facts, self.path = level, settings, facts, path
        self.node = node

    def tool(self, name: str) -> str | None:
        return shutil.which(name, path=self.path)

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return list((self.facts.get("gpu") or {}).get("devices") or [])

    @property
    def ports(self) -> dict[str, Any]:
        ports = (self.facts.get("ib") or {}).get("ports") or {}
        return {k: v for k, v in ports.items() if v.get("state_name") == "ACTIVE"}


def tool_path(settings: Data) -> str:
    """settings.diag_tools (a directory) first, then $PATH."""
    first = settings.get("diag_tools") or ""
    rest = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return f"{first}{os.pathsep}{rest}" if first else rest


def outcome(
    unit: str, status: str, evidence: str, figures: dict[str, Any] | None = None
) -> Outcome:
    return {"unit": unit, "status": status, "figures": figures or {}, "evidence": clean(evidence)}


# --- the probes -------------------------------------------------------------------------------


def probe_dcgm(ctx: Context) -> list[Outcome]:
    path = ctx.tool("dcgmi")
    if path is None:
        return [outcome("node", SKIP, "dcgmi not installed (NVIDIA DCGM)")]
    level, timeout = DCGM_LEVEL[ctx.level]
    code, text = run_tool([path, "diag", "-r", level, "-j"], timeout)
    if code is None:
        return [outcome("node", FAIL, text)]
    return parsers.dcgm_diag(text)


def _model(ctx: Context) -> str:
    names = sorted({str(g.get("name") or "") for g in ctx.gpus})
    return names[0] if len(names) == 1 else ""


def allreduce_floor(ctx: Context) -> float | None:
    """The bus-bandwidth floor: settings.diag_allreduce_floor_gbps, else the default for this
    GPU model (8-GPU SXM nodes only: parsers.allreduce_floor), else None."""
    chosen = ctx.settings.get("diag_allreduce_floor_gbps") or 0.0
    if chosen > 0:
        return float(chosen)
    if len(ctx.gpus) != 8:
        return None
    model = _model(ctx)
    return parsers.allreduce_floor(model) if model else None


def probe_nccl(ctx: Context) -> list[Outcome]:
    path = ctx.tool("all_reduce_perf")
    if path is None:
        return [outcome("node", SKIP, "all_reduce_perf not installed (NVIDIA nccl-tests)")]
    if len(ctx.gpus) < 2:
        why = f"{counted(len(ctx.gpus), 'GPU')}: no all-reduce within the node"
        return [outcome("node", SKIP, why)]
    argv = [path, "-b", "8", "-e", "8G", "-f", "2", "-g", str(len(ctx.gpus))]
    code, text = run_tool(argv, NCCL_TIMEOUT[ctx.level])
    if code is None:
        return [outcome("node", FAIL, text)]
    return parsers.all_reduce(text, allreduce_floor(ctx))


def _perftest(
    ctx: Context, name: str, judge: Callable[[str, dict[str, Any]], list[Outcome]]
) -> list[Outcome]:
    path = ctx.tool(name)
    if path is None:
        return [outcome("node", SKIP, f"{name} not installed (perftest)")]
    if not ctx.ports:
        return [outcome("node", SKIP, "no active InfiniBand port")]
    out: list[Outcome] = []
    for key, port in sorted(ctx.ports.items()):
        args = ["-d", str(port["device"]), "-i", str(port["port"]), "-F"]
        if name == "ib_write_bw":
            args.append("--report_gbits")
        server = subprocess.Popen(
            [path, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            time.sleep(0.5)  # the server listens before the client connects
            code, text = run_tool([path, *args, "localhost"], IB_TIMEOUT)
        finally:
            if server.poll() is None:
                kill_group(server)
        if code is None:
            out.append(outcome(key, FAIL, text))
            continue
        out.extend(judge(text, port))
    return out


def probe_ib_bw(ctx: Context) -> list[Outcome]:
    share = ctx.settings.get("diag_ib_min_share", parsers.IB_WRITE_BW_MIN_SHARE)
    return _perftest(
        ctx,
        "ib_write_bw",
        lambda text, port: parsers.ib_write_bw(text, port["rate"], share, _port(port)),
    )


def probe_ib_lat(ctx: Context) -> list[Outcome]:
    most = ctx.settings.get("diag_ib_lat_max_usec", parsers.IB_READ_LAT_MAX_USEC)
    return _perftest(
        ctx, "ib_read_lat", lambda text, port: parsers.ib_read_lat(text, most, _port(port))
    )


def _port(port: dict[str, Any]) -> int:
    text = str(port.get("port", "1"))
    return int(text) if text.isdigit() else 1


def probe_cuda(ctx: Context) -> list[Outcome]:
    seconds = CUDA_SECONDS[ctx.level]
    python = ctx.settings.get("diag_python") or None
    kwargs = {"python": python} if python else {}
    return cuda.run(list(cuda.TESTS), seconds, seconds * 6 + 120, **kwargs)


# name -> (levels, function); "checks" (today's quick checks) is run by diagnose() itself.
PROBES: dict[str, tuple[tuple[str, ...], Callable[[Context], list[Outcome]]]] = {
    "dcgm": (LEVELS, probe_dcgm),
    "nccl": (("medium", "long"), probe_nccl),
    "ib_write_bw": (("medium", "long"), probe_ib_bw),
    "ib_read_lat": (("long",), probe_ib_lat),
    "cuda": (LEVELS, probe_cuda),
    "pair_nccl": ((PAIR,), pairs.probe_nccl),
    "pair_ib": ((PAIR,), pairs.probe_ib),
}


def probes_of(level: str) -> list[str]:
    if level not in (*LEVELS, PAIR):
        raise ValueError(f"unknown level {level!r} (one of {', '.join((*LEVELS, PAIR))})")
    return [name for name, (levels, _fn) in PROBES.items() if level in levels]


def checks_outcomes(results: list[Result], unread: list[Unread] | None = None) -> list[Outcome]:
    """Today's checks as outcomes: each that failed, or one pass. `unread`: the sources they
    could not read (runner.unread: the kernel log, to a user who is not root), said with the
    pass, whose checks did not run: "none failed" alone would claim them."""
    failed = [r for r in results if r.status == FAIL]
    if failed:
        return [outcome("node", FAIL, f"{r.check}: {r.message}") for r in failed]
    said = f"{counted(len(results), 'check')}, none failed"
    if unread:
        said += "; " + "; ".join(not_read(u) for u in unread)
    return [outcome("node", PASS, said)]


def not_read(source: Unread) -> str:
    """One source the checks could not read, and its checks that did not run (runner.unread)."""
    areas = ", ".join(source["areas"]) or "its"
    return f"{source['source']} not read, the {areas} checks did not run: {source['message']}"


def run_probe(name: str, ctx: Context) -> Summary:
    """One probe: its outcomes, worst status and seconds; a probe that raises fails."""
    started = time.monotonic()
    try:
        found = PROBES[name][1](ctx)
    except Exception as exc:  # noqa: BLE001 - a broken probe is a failed probe, never a crash
        found = [outcome("node", FAIL, f"probe {name} failed: {type(exc).__name__}: {exc}")]
    return summary(name, found, time.monotonic() - started)


def summary(name: str, found: list[Outcome], seconds: float) -> Summary:
    statuses = {o["status"] for o in found}
    status = FAIL if FAIL in statuses else PASS if PASS in statuses else SKIP
    return {"probe": name, "status": status, "seconds": round(seconds, 3), "outcomes": found}


def verdict(
    probes: list[Summary], unread: list[Unread] | None = None, every: bool = False
) -> str:
    """fail if any probe failed; ok if a probe of the level ran and passed; else warn: the
    diagnosis is inconclusive (every probe of the level skipped: its tool is missing or the
    node has no GPU it can test). Today's checks passing alone never pass a diagnosis: they
    are what the hooks already ran. `unread`: sources today's checks could not read
    (runner.unread): some checks did not run, so a diagnosis that found nothing wrong is
    inconclusive too, never ok. `every` (EVERY_PROBE levels): a probe of the level that
    skipped makes it inconclusive too."""
    if any(p["status"] == FAIL for p in probes):
        return FAIL
    if unread:
        return WARN
    if every and any(p["status"] == SKIP and p["probe"] != "checks" for p in probes):
        return WARN
    if any(p["status"] == PASS and p["probe"] != "checks" for p in probes):
        return OK
    return WARN


def skipped(probes: list[Summary], unread: list[Unread] | None = None) -> str:
    """Why each probe of the level skipped, and what today's checks could not read, in one
    line: what an inconclusive diagnosis says."""
    parts = [f"checks: {not_read(u)}" for u in unread or ()]
    parts += [
        f"{p['probe']}: {o['evidence']}"
        for p in probes
        if p["probe"] != "checks" and p["status"] == SKIP
        for o in p["outcomes"][:1]
    ]
    return clean("; ".join(parts) or "no probe ran", 160)


def evidence(probes: list[Summary]) -> str:
    """The failures in one line, for a drain reason."""
    parts = []
    for p in probes:
        for o in p["outcomes"]:
            if o["status"] == FAIL:
                # the built-in GPU tests name their GPU ("matmul on gpu1: ..."): once is enough
                named = {word.strip(":,;()") for word in o["evidence"].split()}
                unit = "" if o["unit"] in ("node", *named) else f"{o['unit']} "
                parts.append(f"{p['probe']}: {unit}{o['evidence']}")
    return clean("; ".join(parts) or "no failure", 160)
