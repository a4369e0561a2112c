"""Processes: the daemons a node needs run, the ones it must not run do not (the `processes`
part of the kernel source, sources/kernel.py).

Names are matched as the kernel keeps them: a process's comm is its executable's name cut to 15
bytes (TASK_COMM_LEN 16 with its NUL; proc(5) /proc/PID/comm), so `nvidia-persistenced` runs as
`nvidia-persiste` and `nv-fabricmanager` as `nv-fabricmanage`. A configured name is compared by
its first 15 bytes; write the daemon's full name.

Nothing is required without a config or a known-good run (learned.py): a container running no
munge passes. `config genconf` (and a node's own known-good runs) writes the daemons of KNOWN it
saw, so the node kind decides: nvidia-persistenced on GPU nodes, nv-fabricmanager on NVSwitch
(HGX) nodes, nvidia-imex on multi-node NVLink nodes (NVIDIA's Fabric Manager and IMEX guides),
sssd or nslcd where accounts come from a directory.

The job hooks read PID 1's children first (sources/kernel.py, `scope` "init"): every daemon
systemd starts, and every daemon that forked away from its parent, is one. Where a name the
checks look for (`daemons`, `absent`) is not among them, a daemon run in the foreground under a
supervisor that is not PID 1, or a forbidden process, the read goes on to every process (`scope`
"all") before the checks judge: a daemon is never called missing for where it sits in the tree.
"""

from __future__ import annotations

from slurmhealth.core.result import DRAIN, Result, counted, fail, ok
from slurmhealth.node.checks.base import Context, summarize
from slurmhealth.node.checks.gpu import multinode
from slurmhealth.node.sources.kernel import comm

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "ps"
SOURCE = "kernel"

DEFAULTS: Schema = {
    "daemons": (
        None,
        list,
        "process names that must run (munged, nvidia-persistenced, nv-fabricmanager, "
        "nvidia-imex, sssd); unset: none, or the node's known-good runs'",
    ),
    "absent": (None, list, "process names that must not run; unset: none"),
    "imex": (
        True,
        bool,
        "nvidia-imex must run where the GPUs' fabric is multi-node NVLink (a cluster UUID: "
        "GB200/GB300 NVL72); false: never required",
    ),
}

# Daemons genconf writes where it sees them, by their executable names: MUNGE's munged, Slurm's
# slurmd, NVIDIA's nvidia-persistenced (driver persistence daemon), nv-fabricmanager (Fabric
# Manager, NVSwitch systems), nvidia-imex (IMEX, multi-node NVLink), nv-hostengine (DCGM), and
# the directory clients sssd and nslcd.
KNOWN = (
    "munged",
    "slurmd",
    "nvidia-persistenced",
    "nv-fabricmanager",
    "nvidia-imex",
    "nv-hostengine",
    "sssd",
    "nslcd",
)
_NAME_MAX = 64


def parse(raw: object) -> Facts:
    """The kernel source's raw facts -> {"names": {comm: count}, "scope": "all"|"init"|None}.
    Pure and total: anything unreadable is no names and scope None."""
    got = raw.get("processes") if isinstance(raw, dict) else None
    part: dict[str, Any] = got if isinstance(got, dict) else {}
    names = part["names"] if isinstance(part.get("names"), dict) else {}
    counts = {
        str(k)[:_NAME_MAX]: v
        for k, v in names.items()
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
    }
    scope = part.get("scope") if part.get("scope") in ("all", "init") else None
    return {"names": counts, "scope": scope}


def _listed(expect: dict[str, Any], key: str) -> list[str]:
    value = expect.get(key)
    return [str(v) for v in value] if isinstance(value, list) else []


def names(expect: dict[str, Any]) -> list[str]:
    """Every process name the checks look for (daemons, then absent): runner.run hands them to
    the kernel source, whose job-hook read widens to every process when one is not among PID
    1's children."""
    return list(dict.fromkeys(_listed(expect, "daemons") + _listed(expect, "absent")))


def running(facts: Facts, name: str) -> int:
    """How many processes run as `name` (compared by its first 15 bytes, as the kernel keeps it)."""
    return int(facts["names"].get(comm(name), 0))


def daemons(facts: Facts, ctx: Context) -> Result:
    """Every expected daemon runs (munged, nvidia-persistenced, ...): a dead one fails jobs."""
    wanted = _listed(ctx.expect, "daemons")
    if not wanted:
        return ok("no daemons expected: not judged")
    if facts["scope"] is None:
        return fail("processes not readable", {}, DRAIN)
    missing = [name for name in wanted if not running(facts, name)]
    data = {"expected": wanted, "missing": missing, "scope": facts["scope"]}
    if missing:
        return fail(summarize([f"{n} not running" for n in missing], " daemon"), data, DRAIN)
    return ok(f"{counted(len(wanted), 'daemon')} running", data)


def absent(facts: Facts, ctx: Context) -> Result:
    """No process the node must not run (`absent`) is running."""
    banned = _listed(ctx.expect, "absent")
    if not banned:
        return ok("no processes forbidden: not judged")
    found = {name: running(facts, name) for name in banned}
    present = [f"{n} running ({v})" for n, v in found.items() if v]
    data = {"forbidden": banned, "running": {n: v for n, v in found.items() if v},
            "scope": facts["scope"]}
    if present:
        return fail(summarize(present, " process"), data, DRAIN)
    return ok(f"none of {counted(len(banned), 'forbidden process', 'forbidden processes')} "
              "running", data)


IMEX = "nvidia-imex"


def imex(facts: Facts, ctx: Context) -> Result:
    """nvidia-imex runs where the GPUs are in a multi-node NVLink fabric (GB200/GB300 NVL72).

    The IMEX daemon exports and imports GPU memory between the nodes of the NVLink domain
    (NVIDIA's IMEX guide); without it a job's memory shared over NVLink across nodes fails, so
    a node whose GPUs show a cluster UUID (gpu.multinode, from this run's GPU facts) needs it,
    whatever the config lists. A job hook reads PID 1's children, where the systemd service
    runs: one not found there is left to the health check, which reads every process (a daemon
    is never called missing for where it sits); listed in `daemons` (genconf, a node's own
    known-good runs), the job hooks judge it too."""
    if not ctx.expect.get("imex", True):
        return ok("nvidia-imex not required by config")
    gpus = ctx.facts.get("gpu")
    if not isinstance(gpus, dict) or not multinode(gpus):
        why = "no multi-node NVLink fabric" if isinstance(gpus, dict) else "GPUs not read"
        return ok(f"not judged: {why}")
    data = {"scope": facts["scope"], "running": running(facts, IMEX)}
    if data["running"]:
        return ok("nvidia-imex running (multi-node NVLink fabric)", data)
    if facts["scope"] is None:
        return fail("processes not readable", data, DRAIN)
    if facts["scope"] == "init":
        return ok("not judged: nvidia-imex not among PID 1's children (the health check reads "
                  "every process)", data)
    return fail("nvidia-imex not running on a multi-node NVLink node", data, DRAIN)


CHECKS = (daemons, absent, imex)


def expectations(facts: Facts) -> dict[str, Any]:
    """The known daemons this (known-good) node runs."""
    seen = [name for name in KNOWN if running(facts, name)]
    return {"daemons": seen} if seen else {}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The processes are expected readable when daemons are listed."""
    return bool(expect.get("daemons"))
