"""Validation across nodes: `slurmhealth diagnose --level pair`, run on a drained node inside the
one Slurm job that `diagnose --submit --level pair` gives it and two known-good peers of its
class (fleet/pairing.py chooses them). docs/diagnose.md, "Across nodes".

This node is the suspect; the job's other two nodes, in name order, are peer 1 and peer 2. Each
measurement runs twice, through srun steps of the job: once between the suspect and peer 1, once
between peer 1 and peer 2, the reference. Peer 1 is in both, so a pair that measures slower
than the reference by more than the margin names the one node that differs, the suspect:

- `pair_nccl`: NCCL's all-reduce (nccl-tests `all_reduce_perf`, one task a node with all its
  GPUs) across each pair; its bus bandwidth at the largest size, and any wrong element;
- `pair_ib`: perftest `ib_write_bw`, bidirectional, for every active port of the suspect: the
  server on peer 1's HCA of the same name, the client on the suspect, then on peer 2 (the
  reference); a slow one names the suspect's HCA link.

A tool that is not installed, a suspect with no active port, a reference pair that did not run
or corrupted data, a run that did not span both nodes: the probe is skipped and says why, and
the level is inconclusive (never a pass, never a fail). Tool output is untrusted text: parsed
(node/diag/parsers.py), never handed to a shell, cleaned in every line.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

from slurmhealth.core import slurm
from slurmhealth.core.hostlist import PatternError, expand, split_terms
from slurmhealth.core.result import FAIL, SKIP, clean
from slurmhealth.node.diag import parsers, tool
from slurmhealth.node.diag.parsers import PASS, outcome

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Protocol

    Outcome = dict[str, Any]

    class Probing(Protocol):
        """What a pair probe reads of node/diag/probes.py Context."""

        @property
        def settings(self) -> Mapping[str, Any]: ...

        @property
        def node(self) -> str: ...

        def tool(self, name: str) -> str | None: ...

        @property
        def gpus(self) -> list[dict[str, Any]]: ...

        @property
        def ports(self) -> dict[str, Any]: ...


PAIR = "pair"
# Slower than the reference pair by more than this share names the suspect: the margin that
# names a slow node against its peers (fleet/peers.py MARGIN, SuperBench's variance rule). One
# run of a pair against one of another: these tools repeat within 1-2% on a quiet fabric.
MARGIN = 0.05
# The all-reduce's sizes: 64 MiB to 8 GiB, doubling; the bus bandwidth has flattened out by
# the largest (NVIDIA's nccl-tests README runs -b 8 -e 8G -f 2; the small sizes measure
# latency, which is no part of the comparison).
NCCL_ARGS = ("-b", "64M", "-e", "8G", "-f", "2")
NCCL_TIMEOUT = 600.0
# ib_write_bw: 5 seconds a run (-D), both directions at once (-b: the suspect's HCA sends and
# receives), Gb/s; -F: no failure on a CPU not at its top frequency.
IB_ARGS = ("-F", "--report_gbits", "-b", "-D", "5")
IB_TIMEOUT = 60.0
SERVER_READY = "Waiting for client to connect"
SERVER_WAIT = 30.0  # seconds the server's step gets to start and listen
CONNECT_TRIES = 3  # perftest's client does not retry a connection the server is not taking yet
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,254}")  # a host name, IPv4 or IPv6


class Job:
    """The pair job as this node sees it: this node (the suspect), its two peers (peer 1 in
    both pairs), srun and its MPI type."""

    def __init__(self, node: str, peers: list[str], srun: str, mpi: str = "") -> None:
        self.node, self.peers, self.srun, self.mpi = node, peers, srun, mpi

    @property
    def suspect_pair(self) -> tuple[str, str]:
        return self.node, self.peers[0]

    @property
    def reference_pair(self) -> tuple[str, str]:
        return self.peers[0], self.peers[1]

    def step(self, nodes: tuple[str, ...], *argv: str, unbuffered: bool = False) -> list[str]:
        """srun of one task on each of `nodes` in this job, overlapping the step this
        diagnosis itself runs in (it holds this node's CPUs and GPUs); `unbuffered`: the task's
        output through a pseudo-terminal, line by line (srun -u)."""
        head = [self.srun, "--overlap", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}"]
        head += ["--ntasks-per-node=1", f"--nodelist={','.join(nodes)}"]
        head += [f"--mpi={self.mpi}"] if self.mpi else []
        return [*head, *(["--unbuffered"] if unbuffered else []), "--", *argv]


def job_of(node: str, settings: Mapping[str, Any], env: Mapping[str, str]) -> Job | str:
    """This node's pair job from Slurm's environment ($SLURM_JOB_NODELIST), or why there is
    none: not inside a job, this node not in it, fewer than two other nodes, no srun."""
    nodes = env.get("SLURM_JOB_NODELIST", "")
    if not nodes:
        return "not inside a Slurm job with two peers (slurmhealth diagnose --submit --level pair)"
    try:
        names = sorted({n for term in split_terms(nodes) for n in expand(term)})
    except PatternError:
        return f"cannot read the job's nodes {clean(nodes, 80)!r}"
    if node not in names:
        return f"{node} is not one of the job's nodes ({clean(nodes, 80)})"
    peers = [n for n in names if n != node]
    if len(peers) < 2:
        return f"the job has {len(peers)} other node(s): the pair level needs two peers"
    try:
        srun = slurm.find_bin("srun", settings.get("slurm_bin") or "")
    except slurm.SlurmError as exc:
        return str(exc)
    return Job(node, peers[:2], srun, str(settings.get("diag_mpi") or ""))


# --- the comparison (pure) ---------------------------------------------------------------------


def deficit(value: float, reference: float) -> float:
    """The share by which a throughput is below its reference (negative: above it)."""
    return 1.0 - value / reference


def _pairs_said(job: Job) -> tuple[str, str]:
    return "+".join(job.suspect_pair), "+".join(job.reference_pair)


def spans(run: Mapping[str, Any], ranks: int) -> str | None:
    """Why one all-reduce run did not span its two nodes as one job of `ranks` ranks (each
    task alone, ranks missing or repeated), or None: it did."""
    if run.get("headers", 0) > 1 or run.get("rank_lines") != run.get("ranks"):
        return (
            f"each task ran alone ({run.get('headers')} headers, {run.get('rank_lines')} rank "
            "lines): nccl-tests built without MPI, or srun's --mpi is not its PMI (diag_mpi)"
        )
    if run.get("ranks") != ranks:
        return f"{run.get('ranks')} ranks where {ranks} were expected"
    return None


def judge_nccl(
    job: Job, suspect: Mapping[str, Any], reference: Mapping[str, Any], ranks: int,
    margin: float = MARGIN,
) -> Outcome:  # fmt: skip
    """The suspect's all-reduce against the reference pair's: pass within the margin; fail
    slower, on wrong elements, or when it did not run where the reference did; skip when the
    reference gives nothing to compare with."""
    mine, theirs = _pairs_said(job)
    if "why" in reference:
        return outcome("node", SKIP, f"the reference pair {theirs} did not run: {reference['why']}")
    if spans(reference, ranks):
        return outcome("node", SKIP, f"the reference pair {theirs}: {spans(reference, ranks)}")
    if reference.get("wrong"):
        why = f"{reference['wrong']} wrong elements: a peer is not known-good"
        return outcome("node", SKIP, f"the reference pair {theirs} corrupted data ({why})")
    ref = float(reference["busbw_gbps"])
    if ref <= 0:
        return outcome("node", SKIP, f"the reference pair {theirs} measured no bandwidth")
    said = f"the reference pair {theirs} ran: {ref:g} GB/s"
    if "why" in suspect:
        why = f"all_reduce_perf across {mine} failed: {suspect['why']}; {said}"
        return outcome("node", FAIL, why)
    if spans(suspect, ranks):
        why = f"the all-reduce across {mine}: {spans(suspect, ranks)}; {said}"
        return outcome("node", FAIL, why)
    busbw = float(suspect["busbw_gbps"])
    figures = {"busbw_gbps": busbw, "reference_busbw_gbps": ref, "max_bytes": suspect["max_bytes"]}
    at = f"busbw {busbw:g} GB/s across {mine} at {parsers.size_text(suspect['max_bytes'])}"
    if suspect.get("wrong"):
        figures["wrong"] = suspect["wrong"]
        why = f"{suspect['wrong']} wrong elements across {mine}: data corruption ({at})"
        return outcome("node", FAIL, why, figures)
    short = deficit(busbw, ref)
    figures["deficit"] = round(short, 4)
    if short > margin:
        why = f"{job.node}: {at}, {short:.0%} below the reference pair {theirs} ({ref:g} GB/s)"
        return outcome("node", FAIL, why, figures)
    return outcome("node", PASS, f"{at}, within {margin:.0%} of {theirs} ({ref:g} GB/s)", figures)


def judge_ib(
    job: Job, unit: str, suspect: Mapping[str, Any], reference: Mapping[str, Any],
    margin: float = MARGIN,
) -> Outcome:  # fmt: skip
    """One port: the suspect's link to peer 1 against peer 2's link to the same HCA of peer 1."""
    server, other = job.peers
    if "why" in reference:
        why = f"the reference link {other}->{server} did not run: {reference['why']}"
        return outcome(unit, SKIP, why)
    ref = float(reference["bw_avg_gbps"])
    if ref <= 0:
        return outcome(unit, SKIP, f"the reference link {other}->{server} measured nothing")
    said = f"{other}'s link to the same HCA of {server}: {ref:g} Gb/s"
    if "server" in suspect:  # peer 1's side, which served the reference: no word on the node
        return outcome(unit, SKIP, f"{suspect['why']} (after {said})")
    if "why" in suspect:
        return outcome(unit, FAIL, f"ib_write_bw to {server} failed: {suspect['why']}; {said}")
    bw = float(suspect["bw_avg_gbps"])
    short = deficit(bw, ref)
    figures = {"bw_avg_gbps": bw, "reference_bw_avg_gbps": ref, "bytes": suspect["bytes"]}
    figures["deficit"] = round(short, 4)
    at = f"RDMA write {bw:g} Gb/s both ways with {server}"
    if short > margin:
        why = f"{job.node} {unit}: {at}, {short:.0%} below {said}"
        return outcome(unit, FAIL, why, figures)
    return outcome(unit, PASS, f"{at}, within {margin:.0%} of {said}", figures)


# --- the probes -------------------------------------------------------------------------------


def probe_nccl(ctx: Probing) -> list[Outcome]:
    path = ctx.tool("all_reduce_perf")
    if path is None:
        return [outcome("node", SKIP, "all_reduce_perf not installed (NVIDIA nccl-tests)")]
    job = job_of(ctx.node, ctx.settings, os.environ)
    if isinstance(job, str):
        return [outcome("node", SKIP, job)]
    gpus = len(ctx.gpus)
    if gpus < 1:
        return [outcome("node", SKIP, "no GPU on this node: nothing to all-reduce")]
    argv = [path, *NCCL_ARGS, "-g", str(gpus)]
    reference = _all_reduce(job, job.reference_pair, argv)
    if "why" in reference or spans(reference, 2 * gpus) or reference.get("wrong"):
        return [judge_nccl(job, {}, reference, 2 * gpus)]  # the suspect's run would say nothing
    suspect = _all_reduce(job, job.suspect_pair, argv)
    return [judge_nccl(job, suspect, reference, 2 * gpus)]


def _all_reduce(job: Job, nodes: tuple[str, str], argv: list[str]) -> dict[str, Any]:
    code, text = tool.run(job.step(nodes, *argv), NCCL_TIMEOUT)
    if code is None:
        return {"why": text}
    return parsers.all_reduce_run(text)


def probe_ib(ctx: Probing) -> list[Outcome]:
    path = ctx.tool("ib_write_bw")
    if path is None:
        return [outcome("node", SKIP, "ib_write_bw not installed (perftest)")]
    if not ctx.ports:
        return [outcome("node", SKIP, "no active InfiniBand port")]
    job = job_of(ctx.node, ctx.settings, os.environ)
    if isinstance(job, str):
        return [outcome("node", SKIP, job)]
    address = node_address(job.peers[0], ctx.settings)
    found = []
    for _key, port in sorted(ctx.ports.items()):
        args = [path, "-d", str(port["device"]), "-i", str(port["port"]), *IB_ARGS]
        unit = clean(f"{port['device']}:{port['port']}", 64)
        reference = _write_bw(job, job.peers[1], args, address)
        suspect = _write_bw(job, job.node, args, address) if "why" not in reference else {}
        found.append(judge_ib(job, unit, suspect, reference))
    return found


def node_address(node: str, settings: Mapping[str, Any]) -> str:
    """Where a client reaches the node: Slurm's NodeAddr for it, else its name."""
    try:
        text = slurm.Slurm(settings.get("slurm_bin") or "", 10.0).run(
            "-o", "show", "node", slurm.one_node(node)
        )
    except slurm.SlurmError:
        return node
    for token in text.split():
        key, _, value = token.partition("=")
        if key == "NodeAddr" and _ADDRESS.fullmatch(value):
            return value
    return node


def _write_bw(job: Job, client: str, args: list[str], address: str) -> dict[str, Any]:
    """One ib_write_bw between a client node and peer 1's server: the client's figures, or
    why there are none."""
    server = _Server(job.step((job.peers[0],), *args, unbuffered=True))
    try:
        if not server.ready(SERVER_WAIT):
            said = f"the server on {job.peers[0]} did not listen: {server.said()}"
            return {"why": said, "server": job.peers[0]}
        for attempt in range(CONNECT_TRIES):
            code, text = tool.run(job.step((client,), *args, address), IB_TIMEOUT)
            if code is None:
                return {"why": text}
            if "Couldn't connect to" not in text or attempt + 1 == CONNECT_TRIES:
                return parsers.ib_write_bw_run(text)
            time.sleep(1.0)
        return {"why": "no connection"}
    finally:
        server.stop()


class _Server:
    """perftest's server in its own srun step (-u: a pseudo-terminal, so its "Waiting for client
    to connect" line arrives when printed, not at exit), read line by line."""

    def __init__(self, argv: list[str]) -> None:
        self.lines: list[str] = []
        self.listening = threading.Event()
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self.proc = None
            self.lines.append(f"cannot run srun ({exc.strerror or exc})")
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw[:400].decode("utf-8", "replace")
            if len(self.lines) < 200:
                self.lines.append(line)
            if SERVER_READY in line:
                self.listening.set()

    def ready(self, seconds: float) -> bool:
        ends = time.monotonic() + seconds
        while self.proc is not None and time.monotonic() < ends:
            if self.listening.wait(0.1):
                time.sleep(0.2)  # the banner is printed just before the socket listens
                return True
            if self.proc.poll() is not None:
                return self.listening.is_set()
        return False

    def said(self) -> str:
        for line in reversed(self.lines):
            if line.strip(" \r\n*-="):
                return clean(line, 120)
        return "nothing"

    def stop(self) -> None:
        """A server whose client ran ends by itself; one still up gets srun's SIGTERM (srun
        passes it to the task), then the whole group SIGKILL."""
        if self.proc is None:
            return
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                tool.kill_group(self.proc)
