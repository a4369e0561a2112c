"""IMEX, the daemon that shares GPU memory across the nodes of a multi-node NVLink domain
(GB200/GB300 NVL72): its state through `nvidia-imex-ctl`, health check only.

The `imex` section of a snapshot, each command's outcome as printed (checks/imex.py parse()
judges them):

    {"tool": "/usr/bin/nvidia-imex-ctl",
     "query": {"status": 0, "timed_out": false, "error": null, "lines": ["READY"], "stderr": ""},
     "domain": {"status": 0, "timed_out": false, "error": null,
                "lines": ["{\"nodes\":{\"0\":{\"status\":\"READY\",...}},...,\"status\":\"UP\"}"],
                "stderr": ""}}

NVIDIA's IMEX guide ("IMEX Service Command Service"): `nvidia-imex-ctl -q` asks this node's
daemon for its state, `-N` the whole domain's, `-j` in JSON; both reach the daemon's command
service, which its config may leave off. NVIDIA's DCGM reads the same two (dcgmlib/src/
DcgmImexManager.cpp): `-q` prints one word (INITIALIZING, STARTING_AUTH_SERVER,
WAITING_FOR_PEERS, WAITING_FOR_RECOVERY, INIT_GPU, READY, SHUTTING_DOWN, UNAVAILABLE), or
"Failed to read node configuration file" on a node without IMEX's node list; `-N -j` a JSON
object whose top-level "status" is UP, DEGRADED or DOWN. The tool is looked for where DCGM
looks (absolute paths: slurmd gives its health check no PATH). No tool: SourceUnavailable (the
checks skip unless IMEX is expected); a command that fails or outlives its time is recorded as
such, not raised: the checks judge it.
"""

from __future__ import annotations

from slurmhealth.node.sources import Options, SourceUnavailable

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from slurmhealth.node.sources.tools import Ran

    Tree = dict[str, object]

TOOL_PATHS = (
    "/usr/bin/nvidia-imex-ctl",
    "/usr/local/bin/nvidia-imex-ctl",
    "/opt/nvidia/imex/bin/nvidia-imex-ctl",
    "/usr/local/nvidia/imex/bin/nvidia-imex-ctl",
    "/usr/sbin/nvidia-imex-ctl",
)
DEFAULT_TIMEOUT_S = 6.0
LINES_MAX = 4096  # -N -j of an 18-tray domain, each node with its 18 connections: a few KB
QUERY_SHARE = 0.3  # -q asks this node's daemon only; -N -j waits on every peer: most of the time


def gather(options: Options) -> Tree:
    """The registry's entry: `-q`, then `-N -j`, within the source's deadline."""
    from slurmhealth.node.sources import tools  # noqa: PLC0415 - health check only

    tool = tools.find(TOOL_PATHS)
    if tool is None:
        raise SourceUnavailable("nvidia-imex-ctl is not installed")
    seconds = tools.budget(options.timeouts.get("imex", DEFAULT_TIMEOUT_S))
    return read(tool, seconds)


def read(tool: str, seconds: float) -> Tree:
    """Both commands' outcomes: `-q` gets QUERY_SHARE of `seconds`, `-N -j` what is left."""
    from slurmhealth.node.sources import tools  # noqa: PLC0415

    query = tools.run([tool, "-q"], seconds * QUERY_SHARE)
    domain = tools.run([tool, "-N", "-j"], max(0.1, seconds - query.seconds))
    return {"tool": tool, "query": _outcome(query), "domain": _outcome(domain)}


def _outcome(ran: Ran) -> Tree:
    stderr = ran.stderr.strip().splitlines()
    return {
        "status": ran.status,
        "timed_out": ran.timed_out,
        "error": ran.error,
        "lines": ran.stdout.splitlines()[:LINES_MAX],
        "stderr": stderr[-1][:200] if stderr else "",
    }
