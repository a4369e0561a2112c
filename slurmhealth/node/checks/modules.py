"""Kernel modules: the drivers a node needs are loaded and live, the ones it must not have are
not (the `modules` part of the kernel source: /proc/modules, proc(5)).

A module's state is Live, Loading or Unloading (kernel/module/procfs.c). Loading or Unloading
seen by a check is a module stuck in its init or exit (a driver that hung probing its device):
it does not come back on its own, a reboot clears it. A missing expected module (nvidia,
nvidia_uvm, nvidia_peermem, mlx5_ib) means a driver that failed to load or was removed: jobs
that need it fail. Both fail; the hint is a reboot.

Nothing is required without a config or a known-good run (learned.py). `config genconf` writes
the GPU and InfiniBand modules of KNOWN it finds loaded, and `absent = ["nouveau"]` where the
NVIDIA driver is loaded (NVIDIA's driver installation guide: nouveau must not be loaded beside
it).
"""

from __future__ import annotations

from slurmhealth.core.result import REBOOT, Result, counted, fail, ok
from slurmhealth.node.checks.base import Context, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "modules"
SOURCE = "kernel"

DEFAULTS: Schema = {
    "loaded": (
        None,
        list,
        "modules that must be loaded and live (nvidia, nvidia_uvm, nvidia_peermem, ib_core, "
        "mlx5_ib); unset: none, or the node's known-good runs'",
    ),
    "absent": (None, list, "modules that must not be loaded (nouveau beside the NVIDIA driver)"),
}

# GPU and InfiniBand modules genconf writes where it finds them loaded: the NVIDIA driver's
# (nvidia, nvidia_uvm, nvidia_modeset, nvidia_drm, nvidia_peermem for GPUDirect RDMA); the RDMA
# stack (ib_core, ib_uverbs, rdma_ucm, rdma_cm, ib_umad), the ConnectX drivers (mlx5_core,
# mlx5_ib) and IPoIB (ib_ipoib).
KNOWN = (
    "nvidia",
    "nvidia_uvm",
    "nvidia_modeset",
    "nvidia_drm",
    "nvidia_peermem",
    "ib_core",
    "ib_uverbs",
    "ib_umad",
    "rdma_cm",
    "rdma_ucm",
    "ib_ipoib",
    "mlx5_core",
    "mlx5_ib",
)
LIVE = "Live"
_NAME_MAX = 64


def parse(raw: object) -> Facts:
    """The kernel source's raw facts -> {"modules": {name: state} or None (unreadable)}."""
    part = raw.get("modules") if isinstance(raw, dict) else None
    if not isinstance(part, dict):
        return {"modules": None}
    return {"modules": {str(k)[:_NAME_MAX]: str(v)[:_NAME_MAX] for k, v in part.items()}}


def _listed(ctx: Context, key: str) -> list[str]:
    value = ctx.expect.get(key)
    return [str(v) for v in value] if isinstance(value, list) else []


def loaded(facts: Facts, ctx: Context) -> Result:
    """Every expected module is loaded and Live (missing or stuck Loading/Unloading: reboot)."""
    wanted = _listed(ctx, "loaded")
    if not wanted:
        return ok("no modules expected: not judged")
    mods = facts["modules"]
    if mods is None:
        return fail("/proc/modules not readable", {}, REBOOT)
    problems = []
    for name in wanted:
        state = mods.get(name)
        if state is None:
            problems.append(f"{name} not loaded")
        elif state != LIVE:
            problems.append(f"{name} stuck {state}")
    data = {"expected": wanted, "states": {n: mods.get(n) for n in wanted}}
    if problems:
        return fail(summarize(problems, " module"), data, REBOOT)
    return ok(f"{counted(len(wanted), 'module')} loaded", data)


def absent(facts: Facts, ctx: Context) -> Result:
    """No module that must not be loaded (`absent`, e.g. nouveau) is loaded."""
    banned = _listed(ctx, "absent")
    if not banned:
        return ok("no modules forbidden: not judged")
    mods = facts["modules"] or {}
    present = [name for name in banned if name in mods]
    data = {"forbidden": banned, "loaded": present}
    if present:
        return fail(summarize([f"{n} loaded" for n in present], " module"), data, REBOOT)
    return ok(f"none of {counted(len(banned), 'forbidden module')} loaded", data)


CHECKS = (loaded, absent)


def expectations(facts: Facts) -> dict[str, Any]:
    """The known GPU and InfiniBand modules this (known-good) node has live; nouveau forbidden
    where the NVIDIA driver is loaded."""
    mods = facts["modules"] or {}
    out: dict[str, Any] = {}
    seen = [name for name in KNOWN if mods.get(name) == LIVE]
    if seen:
        out["loaded"] = seen
    if "nvidia" in mods and "nouveau" not in mods:
        out["absent"] = ["nouveau"]
    return out


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The modules are expected readable when some are listed."""
    return bool(expect.get("loaded"))
