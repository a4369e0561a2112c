"""IMEX checks: this node's IMEX daemon ready, and its domain up (GB200/GB300 NVL72).

Facts from sources/imex.py (`nvidia-imex-ctl -q` and `-N -j`, health check only: PHASES).
Judged where IMEX is needed: this run's GPUs are in a multi-node NVLink fabric
(gpu.multinode: a cluster UUID), or `expected` (genconf writes it where the daemon answered
READY). Elsewhere the checks say so and judge nothing.

- imex.daemon: the word `-q` prints. READY passes. Another of the states NVIDIA's DCGM names
  (INITIALIZING, STARTING_AUTH_SERVER, WAITING_FOR_PEERS, WAITING_FOR_RECOVERY, INIT_GPU,
  SHUTTING_DOWN, UNAVAILABLE), or "Failed to read node configuration file" (IMEX without its
  node list), fails (drain): a job sharing GPU memory across nodes cannot import or export it
  through this node. The command failing, or an answer that is none of those, is not judged
  unless `expected`: IMEX's command service is optional (IMEX guide), and ps.imex judges that
  the daemon runs. A `-q` that hangs warns.
- imex.domain: the top-level "status" of `-N -j`. UP passes; DEGRADED and DOWN warn, naming the
  nodes not READY by the address IMEX knows them by: the domain is every tray of the rack, and
  each tray's own daemon is judged on that tray (imex.daemon there), so a domain state never
  drains this one (it would drain every tray at once, past the circuit breaker).
"""

from __future__ import annotations

import json

from slurmhealth.core.constants import CHECK, DIAG, HEALTHCHECK
from slurmhealth.core.result import DRAIN, Result, clean, counted, fail, ok, warn
from slurmhealth.node.checks.base import summarize
from slurmhealth.node.checks.gpu import multinode

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Context, Facts, Schema

AREA = "imex"
SOURCE = "imex"
PHASES = (HEALTHCHECK, CHECK, DIAG)

DEFAULTS: Schema = {
    "expected": (
        False,
        bool,
        "IMEX's command service answers on this node: nvidia-imex-ctl missing or failing fails "
        "it; genconf writes it where the daemon answered READY",
    ),
}

READY = "READY"
# `nvidia-imex-ctl -q`'s answers other than READY (NVIDIA DCGM, DcgmImexManager.cpp)
NOT_READY = (
    "INITIALIZING",
    "STARTING_AUTH_SERVER",
    "WAITING_FOR_PEERS",
    "WAITING_FOR_RECOVERY",
    "INIT_GPU",
    "SHUTTING_DOWN",
    "UNAVAILABLE",
)
NOT_CONFIGURED = "Failed to read node configuration file"
DOMAIN_STATES = ("UP", "DEGRADED", "DOWN")
_TEXT_MAX = 80
_JSON_MAX = 1 << 20
_NODES_MAX = 1024


# ---------------------------------------------------------------- parse (pure, never raises)


def _outcome(raw: object) -> dict[str, Any]:
    """One command's outcome: ran (exit 0), timed_out, why it failed, its lines."""
    r = raw if isinstance(raw, dict) else {}
    listed = r.get("lines")
    lines = [x for x in listed if isinstance(x, str)] if isinstance(listed, list) else []
    status = r.get("status")
    timed_out = r.get("timed_out") is True
    why = ""
    if timed_out:
        why = "timed out"
    elif isinstance(r.get("error"), str):
        why = clean(r["error"], _TEXT_MAX)
    elif status != 0:
        said = clean(r.get("stderr") or "", _TEXT_MAX) if isinstance(r.get("stderr"), str) else ""
        why = f"exit {status}" + (f": {said}" if said else "")
    return {"ran": not why, "timed_out": timed_out, "why": why, "lines": lines}


def _word(lines: list[str]) -> str | None:
    """`-q`'s answer: READY, another known state, NOT_CONFIGURED, or None (anything else)."""
    text = " ".join(line.strip() for line in lines if line.strip())
    if NOT_CONFIGURED in text:
        return NOT_CONFIGURED
    word = text.upper()
    return word if word == READY or word in NOT_READY else None


def _nodes(value: object) -> list[dict[str, Any]]:
    """The domain's nodes: [{"index", "status", "host"}], strings bounded and cleaned."""
    if not isinstance(value, dict):
        return []
    out = []
    for key, node in list(value.items())[:_NODES_MAX]:
        if not isinstance(node, dict):
            continue
        status, host = node.get("status"), node.get("host")
        out.append({
            "index": clean(str(key), 8),
            "status": clean(status, 32).upper() if isinstance(status, str) else None,
            "host": clean(host, 64) if isinstance(host, str) and host else None,
        })
    return out


def _domain(lines: list[str]) -> dict[str, Any] | None:
    """`-N -j`'s object: {"status": UP|DEGRADED|DOWN|other, "nodes": [...]}; None when it is
    not JSON with a top-level status."""
    text = "\n".join(lines)
    if len(text) > _JSON_MAX:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    status = doc.get("status") if isinstance(doc, dict) else None
    if not isinstance(status, str):
        return None
    return {"status": clean(status, 32).upper(), "nodes": _nodes(doc.get("nodes"))}


def parse(raw: object) -> Facts:
    """The source's raw facts -> {"query": outcome + "word", "domain": outcome + "state"}."""
    r = raw if isinstance(raw, dict) else {}
    query, domain = _outcome(r.get("query")), _outcome(r.get("domain"))
    query["word"] = _word(query["lines"]) if query["ran"] else None
    query["text"] = clean(" ".join(query["lines"]), _TEXT_MAX)
    domain["state"] = _domain(domain["lines"]) if domain["ran"] else None
    return {"query": query, "domain": domain}


# ---------------------------------------------------------------- checks


def _needed(ctx: Context) -> str:
    """Why IMEX is judged here ("" when it is not): a multi-node NVLink fabric, or config."""
    gpus = ctx.facts.get("gpu")
    if isinstance(gpus, dict) and multinode(gpus):
        return "multi-node NVLink"
    return "expected" if ctx.expect.get("expected") else ""


def daemon(facts: Facts, ctx: Context) -> Result:
    """This node's IMEX daemon READY (nvidia-imex-ctl -q) where multi-node NVLink needs it."""
    if not _needed(ctx):
        return ok("not judged: no multi-node NVLink fabric")
    query = facts["query"]
    data = {"word": query["word"], "why": query["why"]}
    if query["word"] == READY:
        return ok("IMEX daemon READY", data)
    if query["word"] == NOT_CONFIGURED:
        return fail("IMEX not configured: no node configuration file", data, DRAIN)
    if query["word"] in NOT_READY:
        return fail(f"IMEX daemon {query['word']}, not READY", data, DRAIN)
    said = query["why"] or f"answered {query['text'] or 'nothing'}"
    if ctx.expect.get("expected"):
        return fail(f"nvidia-imex-ctl -q {said}", data, DRAIN)
    if query["timed_out"]:
        return warn("nvidia-imex-ctl -q timed out", data)
    return ok(f"not judged: nvidia-imex-ctl -q {said} (command service off?)", data)


def domain(facts: Facts, ctx: Context) -> Result:
    """The IMEX domain UP (nvidia-imex-ctl -N -j); DEGRADED or DOWN warns, naming its nodes."""
    if not _needed(ctx):
        return ok("not judged: no multi-node NVLink fabric")
    state = facts["domain"]["state"]
    if state is None:
        why = facts["domain"]["why"] or "no JSON status"
        return ok(f"not judged: nvidia-imex-ctl -N -j {why}", {"why": why})
    nodes = state["nodes"]
    down = [f"node {n['host'] or n['index']} {n['status'] or 'no status'}"
            for n in nodes if n["status"] != READY]
    data = {"status": state["status"], "nodes": len(nodes), "not_ready": down}
    if state["status"] == "UP":
        return ok(f"IMEX domain UP, {counted(len(nodes), 'node')}", data)
    what = state["status"] if state["status"] in DOMAIN_STATES else f"status {state['status']}"
    return warn(f"IMEX domain {what}" + (f": {summarize(down)}" if down else ""), data)


CHECKS = (daemon, domain)


def expectations(facts: Facts) -> dict[str, Any]:
    """A node whose IMEX daemon answered READY keeps expecting it to."""
    return {"expected": True} if facts["query"]["word"] == READY else {}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """nvidia-imex-ctl missing fails the node only where IMEX is expected by config."""
    return bool(expect.get("expected"))
