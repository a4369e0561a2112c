"""GPU checks from one NVML sweep per GPU (the `gpu` section of a snapshot).

Sources: NVIDIA's NVML API reference and nvml.h (calls, field ids, recovery actions, clock event
reasons) and NVIDIA's GPU memory error management guide (docs/sources.md).

Absolute thresholds, not only baselines: a node's first run is judged too.
- Corrected (single-bit) ECC total at or above `sbe_total_warn` warns. No published figure
  exists: NVIDIA's memory error management guide leaves correctable HBM errors out of scope (ECC
  corrects them, no RMA threshold), and DCGM's SBE limit is a placeholder
  (DCGM_LIMIT_MAX_SBE_RATE 10, "dummy value until a real one is determined"). The default,
  10,000,000, is ours: a healthy HBM stack counts few or none; tens of millions is one weak cell
  corrected on every read for days (100/s for a day is 8.6 million), a row that should have been
  remapped, whose next worse error is uncorrectable. It warns (lemon evidence), never drains.
  The aggregate count (NVML_FI_DEV_ECC_SBE_AGG_TOTAL, field 5, read as `ecc_sbe_aggregate`) is
  judged where NVML gives it, else the volatile one (since the driver loaded).
- Rows remapped for uncorrectable errors at `remap_rows_max` fail (service) even before NVML
  sets the remap failure flag: the guide's table gives "up to 512 remapping for the frame
  buffer" (A100 and later), and a remap for a correctable error can be taken back for an
  uncorrectable one, so only the uncorrectable count uses spares for good. Spares are per bank,
  so a bank can run out well below 512 in all (the per-bank figure: to confirm; NVML's row
  remapper histogram, nvmlDeviceGetRowRemapperHistogram, would tell): 512 is the point where
  the spares are gone whatever the spread.
- Pre-Ampere (NVML arch < NVML_DEVICE_ARCH_AMPERE, 7; nvml.h nvmlDeviceArchitecture_t: Kepler 2,
  Maxwell 3, Pascal 4, Volta 5, Turing 6, Ampere 7, Ada 8, Hopper 9): retired pages (SBE plus
  DBE causes, NVML_FI_DEV_RETIRED_SBE 29 and _DBE 30, read as `retired_sbe`/`retired_dbe`) at
  `retired_pages_max` fail (service): the table holds at most 64 retirements (the guide's
  comparison table; NVIDIA's dynamic page retirement documentation), and DCGM's memory health
  watch fails at DCGM_LIMIT_MAX_RETIRED_PAGES, 63 ("updated to match the field diag"; 60
  before). Skipped when the source does not read the counts.
- NVLink-C2C (the GPU's link to its Grace CPU on GH200, GB200 and GB300; nvml.h fields 170,
  171, 231-233): a link the GPU reports that is not active fails (drain: the catalogue's answer
  to C2C errors, Xid 121, is to contact support, not a reset). No published limit on the C2C
  error counters exists (DCGM reads them, NVIDIA's health watches do not judge them): their
  increase since the last run is judged like an NVLink's over a job (nvlink.py: CRC errors and
  replays warn at 100 and fail at 10,000, a back-to-back replay, a replay that failed again, like
  a recovery at 1 and 10). A counter lower than its baseline restarted at 0 (GPU reset, driver
  reload): its increase is its value.
"""

from __future__ import annotations

import time

from slurmhealth.core.result import (
    DRAIN,
    FAIL,
    NONE,
    REBOOT,
    RESET_GPU,
    SERVICE,
    WARN,
    Result,
    clean,
    counted,
    fail,
    ok,
    skip,
    warn,
    worst_action,
)
from slurmhealth.node.checks.base import Context, norm_bus_id, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from slurmhealth.node.checks.base import Facts, Keep, Schema

    T = TypeVar("T")

AREA = "gpu"
SOURCE = "gpu"

DEFAULTS: Schema = {
    "count": (None, int, "GPUs expected on the node; unset: as many as NVML reports"),
    "persistence": (True, bool, "persistence mode on: else each job pays 1-3 s per GPU init"),
    "ecc": (True, bool, "ECC enabled on every GPU"),
    "pcie_gen": (None, int, "minimum PCIe max link generation; unset: all GPUs alike"),
    "pcie_width": (None, int, "minimum PCIe max link width; unset: all GPUs alike"),
    "driver_version": (None, str, "golden driver version; drift warns"),
    "vbios_version": (None, str, "golden VBIOS version; unset: all GPUs alike; drift warns"),
    "clock_event_mask": (0xE8, int, "clock event bits that warn: HW slowdown/thermal/power brake"),
    "sbe_warn": (1000, int, "new correctable ECC errors since the last run that warn"),
    "sbe_total_warn": (
        10_000_000,
        int,
        "corrected ECC errors in all that warn, first run included (no published figure: ours)",
    ),
    "remap_rows_max": (
        512,
        int,
        "rows remapped for uncorrectable errors that fail: the spare rows are gone (NVIDIA guide)",
    ),
    "retired_pages_max": (
        63,
        int,
        "pre-Ampere retired pages that fail: the table holds 64 (DCGM's limit, NVIDIA docs)",
    ),
    "model": ("", str, "GPU model every GPU is (NVML name); empty: all GPUs alike (majority)"),
    "mig": ("", str, "MIG mode every GPU is in: off or on (else fail); empty: alike (else warn)"),
    "thermal_share_warn": (
        0.10,
        float,
        "share of a job's wall time a GPU was held back by the thermal policy (NVML field 75) "
        "that warns at its epilog: a cooled GPU spends none; a tenth is minutes per hour",
    ),
    "c2c_crc_warn": (
        100,
        int,
        "C2C CRC errors since the last run that warn (no published C2C limit: NVLink's crc_warn)",
    ),
    "c2c_crc_fail": (10000, int, "C2C CRC errors since the last run that fail (NVLink's)"),
    "c2c_replay_warn": (100, int, "C2C replays since the last run that warn (NVLink's)"),
    "c2c_replay_fail": (10000, int, "C2C replays since the last run that fail (NVLink's)"),
    "c2c_replay_b2b_warn": (
        1,
        int,
        "C2C back-to-back replays (a replay that failed again) since the last run that warn: "
        "rare on a sound link, like an NVLink recovery",
    ),
    "c2c_replay_b2b_fail": (
        10,
        int,
        "C2C back-to-back replays since the last run that fail (NVLink's recovery_fail)",
    ),
    "clique": (
        False,
        bool,
        "every GPU in a multi-node NVLink cluster and clique (GB200/GB300 NVL72); genconf "
        "writes it where it saw one",
    ),
}
# Memory counters kept as baselines: the epilog reports what grew during the job.
_MEMORY = ("ecc_sbe_volatile", "ecc_dbe_volatile", "remap_correctable", "remap_uncorrectable")
# NVLink-C2C error counters (NVML fields 231-233), kept in the same baseline.
_C2C = {"c2c_crc": "CRC errors", "c2c_replay": "replays", "c2c_replay_b2b": "back-to-back replays"}

# nvmlClocksEventReason bits (nvml.h, nvmlClocksEventReason*)
_CLOCK_EVENTS = {
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
}
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvml.h, nvmlDeviceGpuRecoveryAction_t)
# -> (name, our action)
_RECOVERY = {
    1: ("GPU_RESET", RESET_GPU),
    2: ("NODE_REBOOT", REBOOT),
    3: ("DRAIN_P2P", DRAIN),
    4: ("DRAIN_AND_RESET", RESET_GPU),
    5: ("RECOVER_IMEX_DOMAIN", DRAIN),
    6: ("BUS_RESET", REBOOT),
    7: ("SYSTEM_REBOOT", REBOOT),
}
_FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
_FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
_AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE: row remapping replaces page retirement from here on


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return int(value)
    return None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# The device's scalar facts as the NVML source writes them (sources/nvml.py), by type.
_STR_KEYS = ("uuid", "bus_id", "serial", "vbios", "name")
_INT_KEYS = (
    "arch",
    "persistence",
    "temperature",
    "temp_slowdown",
    "clock_event_reasons",
    "pcie_max_gen",
    "pcie_max_width",
    "pcie_gen",
    "pcie_width",
    "memory_total",
    "mig_current",
    "mig_pending",
    "app_clock_sm",
    "app_clock_mem",
    "sm_clock",
    "util_gpu",
)


_UUID_DIGITS = frozenset("0123456789abcdef-")


def _fabric_facts(raw: dict[str, Any]) -> dict[str, Any]:
    """The fabric facts typed: numbers or None, the cluster UUID lower case or None where it is
    all zeros (no multi-node NVLink cluster) or not a UUID (a hand-edited snapshot)."""
    out: dict[str, Any] = {
        k: _int(raw.get(k)) for k in ("state", "status", "clique_id", "health_mask",
                                      "health_summary")
    }
    uuid = raw.get("cluster_uuid")
    uuid = uuid.strip().lower() if isinstance(uuid, str) else ""
    well_formed = 0 < len(uuid) <= 36 and set(uuid) <= _UUID_DIGITS
    out["cluster_uuid"] = uuid if well_formed and uuid.strip("0-") else None
    return out


def _c2c_facts(raw: object) -> list[dict[str, Any]] | None:
    """The C2C links typed: [{link, active: True, False or None (not read)}]; None: no C2C."""
    if not isinstance(raw, list):
        return None
    out = []
    for entry in raw:
        if isinstance(entry, dict) and isinstance(entry.get("link"), int):
            active = entry.get("active")
            state = active if isinstance(active, bool) else None
            out.append({"link": entry["link"], "active": state})
    return out or None


def _device(raw: object, position: int) -> dict[str, Any]:
    """One GPU record with every key present and typed; garbage becomes None."""
    d = raw if isinstance(raw, dict) else {}
    fields = d["fields"] if isinstance(d.get("fields"), dict) else {}
    procs = d.get("processes")
    links = d.get("nvlink")
    fabric = d.get("fabric") if isinstance(d.get("fabric"), dict) else None
    out = {
        "index": _int(d.get("index")) if _int(d.get("index")) is not None else position,
        "error": _str(d.get("error")),
        "errors": d.get("errors") if isinstance(d.get("errors"), dict) else {},
        "fields": {k: _int(v) for k, v in fields.items()},
        "processes": [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else None,
        "fabric": _fabric_facts(fabric) if fabric else None,
        "nvlink": [x for x in links if isinstance(x, dict)] if isinstance(links, list) else None,
        "c2c": _c2c_facts(d.get("c2c")),
    }
    out.update({k: _str(d.get(k)) for k in _STR_KEYS})
    out.update({k: _int(d.get(k)) for k in _INT_KEYS})
    return out


def parse(raw: object) -> dict[str, Any]:
    """Normalise the gathered (or replayed) NVML facts; never raises."""
    r = raw if isinstance(raw, dict) else {}
    devices = r["devices"] if isinstance(r.get("devices"), list) else []
    parsed = [_device(d, i) for i, d in enumerate(devices)]
    count = _int(r.get("count"))
    cuda = _int(r.get("cuda_driver_version"))
    pci = r.get("pci_gpus")
    return {
        "driver_version": _str(r.get("driver_version")),
        # nvmlSystemGetCudaDriverVersion: 1000 x major + 10 x minor (12040 is CUDA 12.4)
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda and cuda > 0 else None,
        "count": count if count is not None else len(parsed),
        "devices": parsed,
        # the GPUs the nvidia driver holds on the PCI bus (sources/nvml.py bound_gpus); None:
        # not read (an older snapshot, no sysfs)
        "pci_gpus": [a.lower() for a in pci if isinstance(a, str)]
        if isinstance(pci, list)
        else None,
    }


def label(dev: dict[str, Any]) -> str:
    """`GPU 3 (0000:9b:00)`: how every message names a GPU, its bus id in the kernel log's form
    (norm_bus_id), so the Xid lines' messages (xid.where) name the same GPU the same way."""
    bus = dev["bus_id"]
    return f"GPU {dev['index']} ({norm_bus_id(bus)})" if bus else f"GPU {dev['index']}"


def _alive(facts: Facts) -> list[Any]:
    return [d for d in facts["devices"] if not d["error"]]


def _peers(facts: Facts) -> list[Any]:
    """Every GPU that answers, also where the facts are narrowed to some (for_gpus): the
    reference of the checks that judge a GPU against the others (model, pcie)."""
    return [d for d in facts.get("peers") or facts["devices"] if not d["error"]]


def _unlisted(facts: Facts) -> list[Any]:
    """PCI addresses of GPUs the nvidia driver holds that NVML does not list (fell off)."""
    listed = {norm_bus_id(d["bus_id"]) for d in facts["devices"] if d["bus_id"]}
    return [a for a in facts.get("pci_gpus") or [] if norm_bus_id(a) not in listed]


def count(facts: Facts, ctx: Context) -> Result:
    """GPU count as expected, every GPU answers NVML and NVML lists every GPU the driver holds.

    The last holds with no config: a GPU bound to the nvidia driver on the PCI bus that NVML
    does not enumerate has fallen off (sources/nvml.py bound_gpus)."""
    expected = ctx.expect.get("count")
    lost = [f"{label(d)} {d['error']}" for d in facts["devices"] if d["error"]]
    unlisted = _unlisted(facts)
    data = {"expected": expected, "found": facts["count"], "lost": lost, "unlisted": unlisted}
    if lost:
        return fail(summarize(lost, " GPU"), data, REBOOT)
    if unlisted:
        bus = counted(len(facts["pci_gpus"]), "GPU")
        what = f"{len(unlisted)} of {bus} on the PCI bus not seen by NVML"
        return fail(f"{what}: {', '.join(unlisted)}", data, REBOOT)
    if expected is not None and facts["count"] != expected:
        return fail(f"{counted(facts['count'], 'GPU')} visible, {expected} expected", data, REBOOT)
    if expected is None and facts["count"] == 0:
        return skip("no GPUs on this node", data)
    return ok(counted(facts["count"], "GPU answers", "GPUs answer"), data)


def inventory(facts: Facts, ctx: Context) -> Result:
    """A GPU whose UUID, bus id or serial changed since the last known inventory is reported.

    A new serial is a board replaced: the fleet's lemon sweep starts the node's evidence afresh
    at this warning (docs/lemons.md)."""
    known = ctx.baseline.get("inventory") or {}
    changes = []
    for dev in _alive(facts):
        before = known.get(str(dev["index"]))
        if not before:
            continue
        for key in ("uuid", "bus_id", "serial"):
            if before.get(key) and dev.get(key) and before[key] != dev[key]:
                changes.append(f"{label(dev)} {key} {before[key]} -> {dev[key]}")
    data = {"changes": changes}
    if not known:
        return ok("inventory recorded", data)
    if changes:
        return warn(summarize(changes, " change"), data)
    return ok("inventory unchanged", data)


def ecc(facts: Facts, ctx: Context) -> Result:
    """No uncorrectable volatile ECC errors; ECC enabled where expected."""
    errors, disabled, going = [], [], []
    wanted = ctx.expect.get("ecc", True)
    for dev in _alive(facts):
        fields = dev["fields"]
        dbe = fields.get("ecc_dbe_volatile")
        if dbe:
            errors.append(f"{label(dev)} {dbe} uncorrectable volatile ECC errors")
        mode = (fields.get("ecc_current"), fields.get("ecc_pending"))
        if wanted and mode[0] == 0:
            disabled.append(f"{label(dev)} ECC disabled")
        elif wanted and mode == (1, 0):  # on now, off after the next reboot
            going.append(f"{label(dev)} ECC will be disabled at the next reboot")
    data = {"uncorrectable": errors, "disabled": disabled, "pending_disabled": going}
    if errors:
        return fail(summarize(errors + disabled), data, RESET_GPU)
    if disabled:
        return fail(summarize(disabled), data, DRAIN)
    if going:
        return warn(summarize(going, " GPU"), data)
    if not any(d["fields"].get("ecc_current") is not None for d in _alive(facts)):
        return skip("ECC not reported", data)
    return ok("no uncorrectable ECC errors", data)


def _majority(values: list[T]) -> T:
    """Most common value; a tie goes to the value of the first GPU."""
    return max(values, key=lambda v: (values.count(v), -values.index(v)))


def _mib(value: int) -> str:
    return f"{value // 2**20} MiB"  # as nvidia-smi shows nvmlMemory_t.total


# Two GPUs of one name whose total memory differs by more than this share are different parts.
# Parts sold under one name in two sizes differ by far more (A100 40/80 GB, V100 16/32 GB); the
# total of one part moves by less (the ECC reservation of GDDR parts, 1/16 on Kepler: to confirm
# for later GDDR parts; HBM parts keep ECC out of band).
_MEMORY_SLACK = 0.10


def _odd_memory(devices: list[Any], name: object, peers: list[Any]) -> list[Any]:
    """Messages for GPUs of `name` whose total memory is off the majority of that name's among
    `peers`."""
    sizes = [d["memory_total"] for d in peers if d["name"] == name and d["memory_total"]]
    if not sizes:
        return []
    ref = _majority(sizes)
    odd = [
        (d, size)
        for d in devices
        for size in (d["memory_total"],)
        if d["name"] == name and size and abs(size - ref) > _MEMORY_SLACK * ref
    ]
    same = sum(1 for size in sizes if abs(size - ref) <= _MEMORY_SLACK * ref)
    others = counted(same, "other")
    return [f"{label(d)} {name} {_mib(size)}, {others} {_mib(ref)}" for d, size in odd]


def model(facts: Facts, ctx: Context) -> Result:
    """Every GPU the same part: name as `model` (unset: the majority's), memory as its peers'.

    A wrong part swapped in (another model, another memory size) fails (service)."""
    devices = [d for d in _alive(facts) if d["name"]]
    if not devices:
        return skip("GPU names not reported")
    peers = [d for d in _peers(facts) if d["name"]]
    names = [d["name"] for d in peers]
    wanted = (ctx.expect.get("model") or "").strip()
    ref = wanted or _majority(names)
    if wanted:
        odd = [f"{label(d)} {d['name']}, expected {ref}" for d in devices if d["name"] != ref]
    else:
        others = counted(names.count(ref), "other")
        odd = [f"{label(d)} {d['name']}, {others} {ref}" for d in devices if d["name"] != ref]
    odd += _odd_memory(devices, ref, peers)
    data = {"model": ref, "names": sorted({d["name"] for d in devices}), "odd": odd}
    if odd:
        return fail(summarize(odd, " GPU"), data, SERVICE)
    return ok(f"{counted(len(devices), 'GPU')} {ref}", data)


_MIG_MODES = {0: "off", 1: "on"}  # NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE (nvml.h)


def _mig_name(value: int) -> str:
    return _MIG_MODES.get(value, str(value))


# A node whose GPUs disagree on MIG mode with no `mig` expectation: warn, drain as the hint.
# Most often it is one GPU left in (or put in) MIG mode by mistake, and a job handed it as a
# whole GPU finds no CUDA device on it (in MIG mode CUDA sees only the instances created on
# it). But a split node can be meant (NVIDIA's "mixed" MIG strategy in its Kubernetes device
# plugin serves whole GPUs and MIG instances from one node), and an admin reconfiguring a node
# flips one GPU at a time: a fail would drain nodes nobody said were wrong, so the split warns
# (recorded, in the report, lemon evidence) and names the fewer GPUs. A split that the pending
# mode changes will close is a reconfiguration under way: only the pending changes warn.
# `mig = "off"` or `"on"` makes a GPU in the other mode a fail (drain).
def _lone_mig(modes: dict[int, list[Any]]) -> list[str]:
    """The GPUs whose MIG mode differs from the rest of the node's, as messages; [] when all
    agree. modes: {0 or 1: GPUs}. The fewer are named; a tie names the GPUs in MIG mode (the
    special case)."""
    if not modes.get(0) or not modes.get(1):
        return []
    lone = 1 if len(modes[1]) <= len(modes[0]) else 0
    rest = f"{counted(len(modes[1 - lone]), 'other')} {_mig_name(1 - lone)}"
    return [f"{label(dev)} MIG {_mig_name(lone)}, {rest}" for dev in modes[lone]]


def mig(facts: Facts, ctx: Context) -> Result:
    """MIG mode as `mig` expects (off or on); unset: all GPUs alike; a pending change warns.

    A GPU in the wrong mode serves the wrong jobs (drain). With no expectation a node whose
    GPUs disagree warns, naming the odd ones, with drain as the hint (argued at _lone_mig)."""
    wanted = str(ctx.expect.get("mig") or "").strip().lower()
    want = {"off": 0, "on": 1}.get(wanted)
    wrong, pending, seen = [], [], 0
    modes: dict[int, list[Any]] = {0: [], 1: []}
    going: dict[int, list[Any]] = {0: [], 1: []}  # by the mode each GPU goes to: the pending one
    for dev in _alive(facts):
        now, later = dev["mig_current"], dev["mig_pending"]
        if now is None:  # NotSupported: a GPU without MIG is never in MIG mode
            if want == 1:
                wrong.append(f"{label(dev)} MIG not reported, expected on")
            modes[0].append(dev)
            going[0].append(dev)
            continue
        seen += 1
        if want is not None and now != want:
            wrong.append(f"{label(dev)} MIG {_mig_name(now)}, expected {wanted}")
        if later is not None and later != now:
            pending.append(f"{label(dev)} MIG {_mig_name(later)} pending (now {_mig_name(now)})")
        modes.setdefault(now, []).append(dev)
        going.setdefault(later if later in _MIG_MODES else now, []).append(dev)
    split = want is None and bool(going[0]) and bool(going[1])  # not alike even after resets
    mixed = _lone_mig(modes) if split else []
    data = {"expected": wanted or None, "wrong": wrong, "pending": pending, "mixed": mixed}
    if wrong:
        return fail(summarize(wrong + pending, " GPU"), data, DRAIN)
    if mixed:
        return warn(summarize(mixed + pending, " GPU"), data, DRAIN)
    if pending:
        return warn(summarize(pending, " GPU"), data)
    if not seen:
        return skip("MIG not supported", data)
    return ok(f"MIG {wanted} as expected" if wanted else "MIG mode steady", data)


def _limit(ctx: Context, key: str) -> int:
    value = ctx.expect.get(key)
    limit: int = DEFAULTS[key][0] if value is None else value
    return limit


def _spares_gone(dev: dict[str, Any], ctx: Context) -> str | None:
    """The GPU's spare memory is used up: uncorrectable remaps at the spare-row limit (Ampere+),
    or the retired-page table at its limit (pre-Ampere); None otherwise or when not reported."""
    fields = dev["fields"]
    if dev["arch"] is not None and dev["arch"] < _AMPERE:
        counts = [fields.get(k) for k in ("retired_sbe", "retired_dbe")]
        pages = sum(c for c in counts if c is not None)
        most = _limit(ctx, "retired_pages_max")
        if any(c is not None for c in counts) and pages >= most:
            return f"{label(dev)} {counted(pages, 'retired page')}, table limit {most}"
        return None
    rows, most = fields.get("remap_uncorrectable"), _limit(ctx, "remap_rows_max")
    if rows is not None and rows >= most:
        remapped = counted(rows, "row")
        return f"{label(dev)} {remapped} remapped for uncorrectable errors, spare-row limit {most}"
    return None


def row_remap(facts: Facts, ctx: Context) -> Result:
    """Row-remap failure or spare rows used up fail (service); pending remap warns (reset_gpu).

    Spare rows used up: uncorrectable remaps at `remap_rows_max`; pre-Ampere, retired pages at
    `retired_pages_max`. A legacy pending retirement fails (reset_gpu)."""
    failed, pending, retired = [], [], []
    for dev in _alive(facts):
        fields = dev["fields"]
        if fields.get("remap_failure"):
            failed.append(f"{label(dev)} row remapping failed")
        gone = _spares_gone(dev, ctx)
        if gone:
            failed.append(gone)
        if fields.get("remap_pending"):
            pending.append(f"{label(dev)} row remap pending, reset needed")
        legacy = dev["arch"] is not None and dev["arch"] < _AMPERE
        if legacy and fields.get("retired_pending"):
            retired.append(f"{label(dev)} retired pages pending")
    data = {"failed": failed, "pending": pending, "retired_pending": retired}
    if failed:
        return fail(summarize(failed + pending + retired), data, SERVICE)
    if retired:
        return fail(summarize(retired + pending), data, RESET_GPU)
    if pending:
        return warn(summarize(pending), data, RESET_GPU)
    return ok("no row remap pending or failed", data)


def recovery_action(facts: Facts, ctx: Context) -> Result:
    """The driver's required recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) is none."""
    needed = []
    for dev in _alive(facts):
        value = dev["fields"].get("recovery_action")
        if value:
            name, action = _RECOVERY.get(value, (f"action {value}", DRAIN))
            needed.append((f"{label(dev)} driver requires {name}", action))
    data = {"required": [text for text, _ in needed]}
    if needed:
        worst = REBOOT if any(a == REBOOT for _, a in needed) else needed[0][1]
        return fail(summarize([text for text, _ in needed]), data, worst)
    if not any(d["fields"].get("recovery_action") is not None for d in _alive(facts)):
        return skip("recovery action not reported by this driver", data)
    return ok("no recovery action required", data)


def persistence(facts: Facts, ctx: Context) -> Result:
    """Persistence mode is on (else each job pays 1-3 s per GPU and volatile counters reset)."""
    if not ctx.expect.get("persistence", True):
        return skip("persistence not required by config")
    off = [f"{label(d)} persistence mode off" for d in _alive(facts) if d["persistence"] == 0]
    if off:
        return fail(summarize(off, " GPU"), {"off": off}, DRAIN)
    return ok("persistence mode on", {"off": off})


def processes(facts: Facts, ctx: Context) -> Result:
    """No compute processes left on the GPUs before or after a job; running jobs' not judged.

    A GPU another job holds is not judged. The job hooks judge the job's own GPUs when slurmd
    names them (SLURM_JOB_GPUS; MIG devices: their GPUs), else every GPU unless other jobs run
    on the node (a shared node). A GPU in MIG mode is shared: its other instances run other
    jobs, so a job hook judges it only when no other job runs on the node. The health check
    runs on busy nodes too (HealthCheckNodeState=ANY): it judges the GPUs only when no job runs
    on the node, and not at all when that is not known (no store). `check` judges them when it
    is not known: it only reports.
    """
    devices = _alive(facts)
    running = ctx.baseline.get("open_jobs") if isinstance(ctx.baseline, dict) else None
    job_hook = ctx.phase in ("prolog", "epilog")
    shared: list[str] = []
    if job_hook and ctx.job_gpus is not None:
        devices = [d for d in devices if d["index"] in ctx.job_gpus]
        if running != []:  # other jobs may run on the other instances of a MIG GPU
            shared = [label(d) for d in devices if d["mig_current"] == 1]
            devices = [d for d in devices if d["mig_current"] != 1]
    elif running or (running is None and ctx.phase == "healthcheck"):
        busy = [label(d) for d in devices if d["processes"]]
        why = "jobs running here" if running else "not known whether jobs run here"
        return ok(f"not judged: {why}", {"left": [], "running_jobs": running, "busy": busy})
    left = []
    for dev in devices:
        pids = [p.get("pid") for p in dev["processes"] or []]
        if pids:
            procs = counted(len(pids), "compute process", "compute processes")
            left.append(f"{label(dev)} has {procs}, pid {pids[0]}")
    data: dict[str, Any] = {"left": left}
    if shared:
        data["shared"] = shared
    if left:
        return fail(summarize(left, " GPU"), data, DRAIN)
    also = f" ({summarize(shared, ' GPU')} in MIG mode shared with other jobs: not judged)"
    return ok("no compute processes left" + (also if shared else ""), data)


def thermal(facts: Facts, ctx: Context) -> Result:
    """Temperature below the slowdown threshold; no HW slowdown, thermal or power-brake events."""
    mask = ctx.expect.get("clock_event_mask", 0xE8)
    hot = []
    for dev in _alive(facts):
        temp, limit = dev["temperature"], dev["temp_slowdown"]
        if temp is not None and limit and temp >= limit:
            hot.append(f"{label(dev)} at {temp} C, slowdown at {limit} C")
        reasons = (dev["clock_event_reasons"] or 0) & mask
        names = [name for bit, name in _CLOCK_EVENTS.items() if reasons & bit]
        if names:
            hot.append(f"{label(dev)} clocks cut: {', '.join(names)}")
    if hot:
        return warn(summarize(hot), {"problems": hot})
    return ok("no thermal or power slowdown", {"problems": hot})


# A GPU held back by the thermal policy for less than this, over a whole job, never warns: a
# job of seconds would otherwise warn on a share made of one brief slowdown.
THERMAL_MIN_S = 60.0


def _job_devices(facts: Facts, ctx: Context, start: dict[str, Any]) -> list[Any]:
    """The job's GPUs that are the same GPUs as at its prolog (UUID as the prolog saw it)."""
    inventory = start.get("inventory")
    known: dict[str, Any] = inventory if isinstance(inventory, dict) else {}
    out = []
    for dev in _alive(facts):
        if ctx.job_gpus is not None and dev["index"] not in ctx.job_gpus:
            continue
        then = known.get(str(dev["index"]))
        if isinstance(then, dict) and then.get("uuid") not in (None, dev["uuid"]):
            continue
        out.append(dev)
    return out


def thermal_share(facts: Facts, ctx: Context) -> Result:
    """At a job's epilog, no GPU of the job thermally slowed over `thermal_share_warn` of it.

    More warns on the node, naming the GPUs and their shares of the job's wall time.

    NVML's thermal-policy counter (NVML_FI_DEV_PERF_POLICY_THERMAL, field 75: ns the clocks
    were held back to keep the GPU under its thermal limits, as nvmlDeviceGetViolationStatus
    reports it) read at the job's prolog and at its epilog gives the time the job's GPU ran
    slowed for heat; over the job's wall time, its share. A GPU whose cooling works spends
    none there: a share that high is airflow, fans or the heatsink, and a synchronous job runs
    at its slowest GPU's pace. The power policy (field 74) is not judged: a loaded GPU at its
    power limit is normal. Less than THERMAL_MIN_S slowed in all never warns."""
    found = ctx.baseline.get("job_start") if isinstance(ctx.baseline, dict) else None
    start: dict[str, Any] = found if isinstance(found, dict) else {}
    taken = start.get("taken_at")
    if ctx.phase != "epilog" or not isinstance(taken, (int, float)) or ctx.now <= taken:
        return ok("not judged: only a job's epilog has its prolog's reading")
    span = float(ctx.now) - float(taken)
    readings = start.get("thermal")
    before: dict[str, Any] = readings if isinstance(readings, dict) else {}
    setting = ctx.expect.get("thermal_share_warn")
    limit = float(DEFAULTS["thermal_share_warn"][0] if setting is None else setting)
    shares, hot = {}, []
    for dev in _job_devices(facts, ctx, start):
        first, last = before.get(str(dev["index"])), dev["fields"].get("perf_thermal_ns")
        if not isinstance(first, int) or not isinstance(last, int) or last < first:
            continue  # not read, or the driver reloaded during the job: unknown
        slowed = (last - first) / 1e9
        shares[str(dev["index"])] = round(min(1.0, slowed / span), 4)
        if slowed >= THERMAL_MIN_S and slowed > limit * span:
            hot.append(
                f"{label(dev)} thermally slowed {min(1.0, slowed / span):.0%} of the job "
                f"({slowed:.0f} s of {span:.0f} s)"
            )
    data = {"share": shares, "seconds": round(span, 1), "hot": hot}
    if hot:
        return warn(summarize(hot, " GPU"), data)
    if not shares:
        # ok, not skip: a skip is a store row every epilog on a node whose driver lacks it
        return ok("not judged: thermal policy counter not read at the prolog and epilog", data)
    return ok(f"thermal slowdown under {limit:.0%} of the job on every GPU", data)


def _below_or_odd(
    devices: list[Any], key: str, expected: int | None, what: str, peers: list[Any]
) -> list[Any]:
    values = [d[key] for d in peers if d[key] is not None]
    if expected is None:
        if not values:
            return []
        expected = max(set(values), key=values.count)  # the node's majority
    return [
        f"{label(d)} PCIe {what} {d[key]} < {expected}"
        for d in devices
        if d[key] is not None and d[key] < expected
    ]


def pcie(facts: Facts, ctx: Context) -> Result:
    """PCIe max link generation and width at least the expected (current values drop at idle)."""
    devices, peers = _alive(facts), _peers(facts)
    low = _below_or_odd(devices, "pcie_max_gen", ctx.expect.get("pcie_gen"), "gen", peers)
    low += _below_or_odd(devices, "pcie_max_width", ctx.expect.get("pcie_width"), "width x", peers)
    data = {"below": low}
    if low:
        return fail(summarize(low), data, DRAIN)
    if not any(d["pcie_max_gen"] is not None for d in devices):
        return skip("PCIe link not reported", data)
    return ok("PCIe links at expected generation and width", data)


def _link(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def pcie_link(facts: Facts, ctx: Context) -> Result:
    """Under load, the current PCIe link at full generation and width; downtrained warns.

    Full: `pcie_gen`/`pcie_width` when set, else the GPU's own max link. An idle GPU lowers its
    link to save power: NVIDIA's nvidia-smi documents the current link generation and width
    alike as "may be reduced when the GPU is not in use". So only a GPU running compute
    processes is judged (a process holds a context: the GPU is in use), and it only warns."""
    busy = [d for d in _alive(facts) if d["processes"]]
    low, judged = [], 0
    for dev in busy:
        gen, width = dev["pcie_gen"], dev["pcie_width"]
        if gen is None and width is None:
            continue
        judged += 1
        want_gen = ctx.expect.get("pcie_gen") or dev["pcie_max_gen"]
        want_width = ctx.expect.get("pcie_width") or dev["pcie_max_width"]
        short_gen = gen is not None and want_gen is not None and gen < want_gen
        short_width = width is not None and want_width is not None and width < want_width
        if short_gen or short_width:
            low.append(
                f"{label(dev)} PCIe link {_link(gen, width)} under load, "
                f"expected {_link(want_gen, want_width)}"
            )
    data = {"busy": [d["index"] for d in busy], "below": low}
    if low:
        return warn(summarize(low, " GPU"), data)
    if not busy:  # nothing to judge, and nothing wrong: ok (a skip would be kept every run)
        return ok("no GPU under load: current PCIe link not judged (drops at idle)", data)
    if not judged:
        return skip("current PCIe link not reported", data)
    judged_words = counted(judged, "GPU under load at its", "GPUs under load at their")
    return ok(f"{judged_words} PCIe link", data)


def fabric(facts: Facts, ctx: Context) -> Result:
    """NVSwitch fabric (Hopper+): state COMPLETED with status success."""
    bad, seen = [], 0
    for dev in _alive(facts):
        info = dev["fabric"]
        if not info or not info.get("state"):  # None or NOT_SUPPORTED: no NVSwitch fabric
            continue
        seen += 1
        state, status = info.get("state"), info.get("status")
        if state != _FABRIC_COMPLETED or status != 0:
            name = _FABRIC_STATES.get(state, str(state))
            bad.append(f"{label(dev)} fabric {name}, status {status}")
    data = {"problems": bad}
    if bad:
        return fail(summarize(bad, " GPU"), data, DRAIN)
    if not seen:
        return skip("no NVSwitch fabric", data)
    return ok("fabric registration completed", data)


# The fabric health mask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*, NVML_GPU_FABRIC_HEALTH_GET: a
# field is (mask >> shift) & width): each condition is NOT_SUPPORTED 0, TRUE 1, FALSE 2.
# (shift, width, what TRUE means, status, action). The severities, argued:
# - route unhealthy: routes to some peers are broken, traffic over them fails: fail, drain.
# - bandwidth degraded: the fabric lost links and routes around them; every job still runs
#   correctly, slower. The cause is often the fabric's (a switch tray), which every node of the
#   rack reports at once: draining them all for a slowdown would empty the rack (and trip the
#   breaker). It warns, like the other slowdowns (gpu.thermal, gpu.pcie_link), and feeds the
#   lemon and slow-node scoring; `[checks."gpu.fabric_health"] severity = "fail"` drains on it.
#   NVIDIA's DCGM health watch counts it a failure (its MonitorFabricFields tests).
# - route recovery, access timeout recovery in progress: the fabric is mending itself: warn.
# - the global fabric manager disconnected (newest drivers): routes stand, none can change: warn.
_HEALTH_TRUE = (
    (4, 0x3, "route unhealthy", FAIL, DRAIN),
    (0, 0x3, "bandwidth degraded", WARN, NONE),
    (2, 0x3, "route recovery in progress", WARN, NONE),
    (6, 0x3, "access timeout recovery in progress", WARN, NONE),
)
_GFM = (14, 0x3)  # ..._GFM_STATE: NOT_SUPPORTED 0, CONNECTED 1, DISCONNECTED 2
_PARTITION = (12, 0x3)  # ..._PARTITION_ASSIGNED: NOT_SUPPORTED 0, TRUE 1, FALSE 2
# ..._INCORRECT_CONFIGURATION (shift 8, width 0xf): NOT_SUPPORTED 0, NONE 1, else the error.
# The GPU is not where, or not what, the fabric expects: it cannot take part, fail. A tray
# that lacks NVLinks needs hardware service; the rest are set by an admin or firmware: drain.
_CONFIG = (8, 0xF)
_CONFIG_ERRORS = {
    2: ("wrong system GUID", DRAIN),
    3: ("wrong chassis serial number", DRAIN),
    4: ("no partition", DRAIN),
    5: ("insufficient NVLinks", SERVICE),
    6: ("incompatible GPU firmware", DRAIN),
    7: ("invalid location", DRAIN),
    8: ("GPU state invalid", DRAIN),
}
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*: the driver's own verdict (v3 struct, R580 on)
_SUMMARY_UNHEALTHY, _SUMMARY_LIMITED = 2, 3


def _field(mask: int, spec: tuple[int, int]) -> int:
    return (mask >> spec[0]) & spec[1]


def _health_problems(info: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, status, action) of each condition the health mask and summary report."""
    mask, summary = info.get("health_mask"), info.get("health_summary")
    found = []
    if mask is not None:
        found += [(what, st, act) for sh, w, what, st, act in _HEALTH_TRUE
                  if _field(mask, (sh, w)) == 1]
        config = _field(mask, _CONFIG)
        if config > 1:
            what, act = _CONFIG_ERRORS.get(config, (f"configuration error {config}", DRAIN))
            found.append((f"incorrect configuration: {what}", FAIL, act))
        if _field(mask, _PARTITION) == 2:
            found.append(("not assigned to an NVLink partition", FAIL, DRAIN))
        if _field(mask, _GFM) == 2:
            found.append(("global fabric manager disconnected", WARN, NONE))
    if summary == _SUMMARY_UNHEALTHY and not any(st == FAIL for _, st, _ in found):
        found.append(("unhealthy (driver's summary)", FAIL, DRAIN))
    elif summary == _SUMMARY_LIMITED and not found:
        found.append(("limited capacity (driver's summary)", WARN, NONE))
    return found


def fabric_health(facts: Facts, ctx: Context) -> Result:
    """NVLink fabric health clear: route unhealthy or misconfigured fails, degraded bandwidth warns.

    From nvmlDeviceGetGpuFabricInfoV (R550+): the health mask's conditions and the driver's
    health summary, judged as _HEALTH_TRUE argues; a recovery in progress warns."""
    problems, seen = [], 0
    for dev in _alive(facts):
        info = dev["fabric"]
        if not info or (info.get("health_mask") is None and info.get("health_summary") is None):
            continue
        seen += 1
        problems += [(f"{label(dev)} fabric {what}", st, act)
                     for what, st, act in _health_problems(info)]
    failed = [p for p in problems if p[1] == FAIL]
    data = {"problems": [p[0] for p in problems]}
    if failed:
        lines = [p[0] for p in failed] + [p[0] for p in problems if p[1] != FAIL]
        return fail(summarize(lines), data, worst_action([p[2] for p in failed]))
    if problems:
        return warn(summarize(data["problems"]), data)
    if not seen:  # most nodes: nothing to judge, and nothing wrong (a skip is kept every run)
        return ok("not judged: fabric health not reported", data)
    return ok("fabric health clear", data)


def attached(dev: dict[str, Any]) -> bool:
    """The GPU is registered with a multi-node NVLink fabric: registration COMPLETED with
    success and a cluster UUID that is not zero, as NVIDIA's go-nvlib IsFabricAttached reads
    nvmlGpuFabricInfo (the test behind the nvidia.com/gpu.clique label and IMEX)."""
    info = dev.get("fabric") or {}
    return bool(
        info.get("state") == _FABRIC_COMPLETED and info.get("status") == 0
        and info.get("cluster_uuid")
    )


def multinode(facts: Facts) -> bool:
    """Whether any GPU of the node is attached to a multi-node NVLink fabric (GB200/GB300
    NVL72 class): then IMEX is needed (ps.imex, the imex area)."""
    devices = facts.get("devices") if isinstance(facts, dict) else None
    return any(attached(d) for d in devices or [] if isinstance(d, dict) and not d.get("error"))


def _registered(facts: Facts) -> list[Any]:
    return [
        d for d in _alive(facts)
        if d["fabric"] and d["fabric"].get("state") == _FABRIC_COMPLETED
        and d["fabric"].get("status") == 0
    ]


def _odd_ones(devices: list[Any], key: str, what: str) -> list[str]:
    """Messages for GPUs whose fabric `key` is off the majority of those that have one: a
    GPU without one (a zero cluster UUID) where others have one is always odd."""
    values = [d["fabric"].get(key) for d in devices]
    ref = _majority([v for v in values if v is not None])
    others = counted(values.count(ref), "other")
    return [
        f"{label(d)} {what} {v if v is not None else 'none'}, {others} {ref}"
        for d, v in zip(devices, values)
        if v != ref
    ]


def clique(facts: Facts, ctx: Context) -> Result:
    """All GPUs of a multi-node NVLink node in one cluster and clique (GB200/GB300 NVL72).

    `clique` expected (genconf, a node's own known-good runs): a GPU in none fails. A GPU in
    another clique (NVLink partition), or with no cluster UUID where the others have one,
    cannot reach its node's peers over NVLink: a job across them fails (drain). NVIDIA's GPU
    feature discovery refuses to label such a node's clique (non-unique cluster UUIDs)."""
    expect = bool(ctx.expect.get("clique"))
    alive = _alive(facts)
    devices = _registered(facts)
    missing = [f"{label(d)} in no multi-node NVLink cluster, expected one"
               for d in alive if expect and not attached(d)]
    clustered = [d for d in devices if d["fabric"].get("cluster_uuid")]
    odd = _odd_ones(devices, "cluster_uuid", "cluster") if clustered else []
    # a GPU that reports no fabric at all beside GPUs in a cluster (one still registering is
    # gpu.fabric's)
    odd += [f"{label(d)} reports no NVLink fabric, {counted(len(clustered), 'other')} in a "
            "cluster" for d in alive if clustered and not (d["fabric"] or {}).get("state")]
    if clustered and not odd:
        odd = _odd_ones(clustered, "clique_id", "clique")
    data = {"missing": missing, "odd": odd,
            "cluster": clustered[0]["fabric"]["cluster_uuid"] if clustered else None}
    if odd or missing:
        return fail(summarize(odd or missing, " GPU"), data, DRAIN)
    if not clustered:  # most nodes: ok, not a skip kept every run
        return ok("not judged: no multi-node NVLink cluster", data)
    first = clustered[0]["fabric"]
    gpus = counted(len(clustered), "GPU")
    return ok(f"{gpus} in clique {first['clique_id']} of cluster {first['cluster_uuid']}", data)


def versions(facts: Facts, ctx: Context) -> Result:
    """Driver and VBIOS versions against the golden values (GPUs of one model alike when unset).

    A VBIOS is compared only with GPUs of the same model (NVML name): each part has its own
    VBIOS line. `vbios_version` is the main model's: `model` when set, else the most GPUs'."""
    drift = []
    driver, want = facts["driver_version"], ctx.expect.get("driver_version")
    if want and driver and driver != want:
        drift.append(f"driver {driver}, expected {want}")
    named = [d for d in _alive(facts) if d["vbios"]]
    vbioses = [d["vbios"] for d in named]
    models: dict[str, list[str]] = {}
    for dev in named:
        models.setdefault(dev["name"] or "", []).append(dev["vbios"])
    main = (ctx.expect.get("model") or "").strip()
    if not main and models:
        names = [d["name"] or "" for d in named]
        main = names[0] if len(models) == 1 else _majority(names)
    golden = ctx.expect.get("vbios_version")
    refs = {
        m: golden if golden and m == main else v[0] if len(set(v)) == 1 else _majority(v)
        for m, v in models.items()
    }
    for dev in named:
        ref = refs[dev["name"] or ""]
        if dev["vbios"] != ref:
            drift.append(f"{label(dev)} VBIOS {dev['vbios']}, expected {ref}")
    data = {"driver": driver, "vbios": sorted(set(vbioses)), "drift": drift}
    if drift:
        return warn(summarize(drift), data)
    return ok(f"driver {driver}" if driver else "versions as expected", data)


def memory_errors(facts: Facts, ctx: Context) -> Result:
    """Correctable ECC errors and remapped rows that grew since the last run (memory wearing).

    A counter lower than its baseline (driver reload, GPU reset) starts a new baseline."""
    before = ctx.baseline.get("counters") or {}
    if not before:
        return ok("baseline recorded")
    deltas: dict[str, dict[str, int]]
    grew, deltas, resets = [], {}, []
    for dev in _alive(facts):
        old = before.get(str(dev["index"])) or {}
        for key in _MEMORY:
            now, then = dev["fields"].get(key), old.get(key)
            if now is not None and then is not None and now > then:
                deltas.setdefault(str(dev["index"]), {})[key] = now - then
            elif now is not None and then is not None and now < then:
                resets.append(f"{label(dev)} {key}")
        delta = deltas.get(str(dev["index"]), {})
        rows = delta.get("remap_correctable", 0) + delta.get("remap_uncorrectable", 0)
        if rows:
            grew.append(f"{label(dev)} {counted(rows, 'new remapped row')}")
        if delta.get("ecc_sbe_volatile", 0) >= ctx.expect.get("sbe_warn", 1000):
            sbe = counted(delta["ecc_sbe_volatile"], "new correctable ECC error")
            grew.append(f"{label(dev)} {sbe}")
    data = {"deltas": deltas, "reset": resets}
    if grew:
        return warn(summarize(grew), data)
    if resets:
        return ok(f"counter reset: new baseline ({summarize(resets)})", data)
    return ok("memory error counters steady", data)


def cpu_links(facts: Facts, ctx: Context) -> Result:
    """Every NVLink-C2C link a GPU reports (to its Grace CPU: GH200, GB200, GB300) is active.

    A link down fails (drain), naming the GPU and the link; a GPU without C2C is not judged."""
    down, unread, seen = [], [], 0
    for dev in _alive(facts):
        links = dev.get("c2c")
        if not links:
            continue
        seen += 1
        off = [str(x["link"]) for x in links if x["active"] is False]
        if off:
            which = "links" if len(off) > 1 else "link"
            up = f"{len(links) - len(off)}/{len(links)} active"
            down.append(f"{label(dev)} C2C {which} {', '.join(off)} down ({up})")
        unread += [f"{label(dev)} C2C link {x['link']}" for x in links if x["active"] is None]
    data = {"down": down, "unread": unread}
    if down:
        return fail(summarize(down, " GPU"), data, DRAIN)
    if not seen:
        # ok, not skip: a skip is a store row every run on every node without C2C
        return ok("not judged: no C2C links reported (no Grace-coupled GPU)", data)
    if unread:
        return ok(f"C2C links active; status not read: {summarize(unread)}", data)
    return ok(f"all C2C links active on {counted(seen, 'GPU')}", data)


def cpu_link_errors(facts: Facts, ctx: Context) -> Result:
    """NVLink-C2C CRC errors, replays and back-to-back replays since the last run below limits.

    `c2c_*_warn` warns, `c2c_*_fail` fails (drain). A counter lower than its baseline
    restarted at 0 (GPU reset, driver reload): its increase is its value."""
    before = ctx.baseline.get("counters") or {}
    devices = [d for d in _alive(facts) if any(d["fields"].get(k) is not None for k in _C2C)]
    if not devices:
        why = "no Grace-coupled GPU, or a driver before R575"
        return ok(f"not judged: C2C error counters not reported ({why})")
    if not before:
        return ok("baseline recorded")
    deltas: dict[str, dict[str, int]]
    fails, warns, deltas, resets = [], [], {}, []
    for dev in devices:
        old = before.get(str(dev["index"])) or {}
        for key, what in _C2C.items():
            now, then = dev["fields"].get(key), old.get(key)
            if now is None or not isinstance(then, int) or now == then:
                continue
            if now < then:
                resets.append(f"{label(dev)} {key}")
            grew = now - then if now > then else now
            if not grew:
                continue
            deltas.setdefault(str(dev["index"]), {})[key] = grew
            text = f"{label(dev)} C2C +{grew} {what}"
            if grew >= _limit(ctx, f"{key}_fail"):
                fails.append(text)
            elif grew >= _limit(ctx, f"{key}_warn"):
                warns.append(text)
    data = {"deltas": deltas, "reset": resets}
    if fails:
        return fail(summarize(fails + warns), data, DRAIN)
    if warns:
        return warn(summarize(warns), data)
    if deltas:
        return ok("C2C errors below the warning limits", data)
    return ok("C2C error counters steady", data)


def corrected_ecc(facts: Facts, ctx: Context) -> Result:
    """Corrected ECC errors in all below `sbe_total_warn` (10 million), first run included.

    The aggregate count when the source reads it, else the volatile one; tens of millions is a
    weak cell corrected on every read."""
    most = _limit(ctx, "sbe_total_warn")
    high, seen = [], 0
    for dev in _alive(facts):
        fields = dev["fields"]
        aggregate = fields.get("ecc_sbe_aggregate") is not None
        key = "ecc_sbe_aggregate" if aggregate else "ecc_sbe_volatile"
        total = fields.get(key)
        if total is None:
            continue
        seen += 1
        if total >= most:
            kind = "aggregate" if aggregate else "volatile"
            high.append(f"{label(dev)} {total} corrected ECC errors ({kind}), warn at {most}")
    data = {"high": high}
    if high:
        return warn(summarize(high, " GPU"), data)
    if not seen:
        return skip("corrected ECC counts not reported", data)
    return ok("corrected ECC totals low", data)


CHECKS = (
    count,
    inventory,
    model,
    ecc,
    memory_errors,
    corrected_ecc,
    row_remap,
    recovery_action,
    persistence,
    cpu_links,
    cpu_link_errors,
    processes,
    thermal,
    thermal_share,
    pcie,
    pcie_link,
    mig,
    fabric,
    fabric_health,
    clique,
    versions,
)


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """The inventory and memory counters to compare the next run against, keyed by index, the
    energy, below-base-clock and thermal-policy counters (the prolog's, for the job's figures
    and thermal_share at its epilog)
    and the time they were read (`now`, else the clock: the run's time). The runner adds the
    SM clock and utilisation samples summed so far (node/counters.py add_samples)."""
    alive = _alive(facts)
    return {
        "taken_at": time.time() if now is None else now,
        "inventory": {
            str(d["index"]): {"uuid": d["uuid"], "bus_id": d["bus_id"], "serial": d["serial"]}
            for d in alive
        },
        "counters": {
            str(d["index"]): {
                k: d["fields"].get(k)
                for k in (*_MEMORY, *_C2C)
                if d["fields"].get(k) is not None
            }
            for d in alive
        },
        "energy": {
            str(d["index"]): d["fields"]["energy_mj"]
            for d in alive
            if isinstance(d["fields"].get("energy_mj"), int)
        },
        "below_base": {
            str(d["index"]): d["fields"]["below_base_ns"]
            for d in alive
            if isinstance(d["fields"].get("below_base_ns"), int)
        },
        "thermal": {
            str(d["index"]): d["fields"]["perf_thermal_ns"]
            for d in alive
            if isinstance(d["fields"].get("perf_thermal_ns"), int)
        },
    }


def _clocks(device: dict[str, Any]) -> str | None:
    """ "SM/memory MHz" of the application clocks, or None where NVML does not give both."""
    sm, mem = device.get("app_clock_sm"), device.get("app_clock_mem")
    return f"{sm}/{mem} MHz" if sm is not None and mem is not None else None


def versions_of(facts: Facts) -> dict[str, Any]:
    """The versions and settings each run records (the nightly report's odd node out): the
    driver, and of the GPUs that answer the sets of VBIOS versions, models, persistence modes,
    current ECC modes, current MIG modes and application clocks (a set of two is a node that
    disagrees with itself)."""
    alive = _alive(facts)
    out = {
        "driver": facts["driver_version"],
        "vbios": sorted({d["vbios"] for d in alive if d["vbios"]}),
    }
    if facts.get("cuda_version"):
        out["cuda"] = facts["cuda_version"]
    settings = {
        "model": {d.get("name") for d in alive},
        "persistence": {d.get("persistence") for d in alive},
        "ecc": {(d.get("fields") or {}).get("ecc_current") for d in alive},
        "mig": {d.get("mig_current") for d in alive},
        "app_clocks": {_clocks(d) for d in alive},
    }
    out.update({k: sorted(v - {None, ""}) for k, v in settings.items() if v - {None, ""}})
    return out


def expectations(facts: Facts) -> dict[str, Any]:
    """What a known-good node implies: its count, model, PCIe links, MIG mode, versions, and a
    multi-node NVLink clique where every GPU had one."""
    devices = _alive(facts)
    out: dict[str, Any] = {"count": facts["count"]}
    gens = [d["pcie_max_gen"] for d in devices if d["pcie_max_gen"]]
    widths = [d["pcie_max_width"] for d in devices if d["pcie_max_width"]]
    names = {d["name"] for d in devices if d["name"]}
    if len(names) == 1:
        out["model"] = names.pop()
    if gens:
        out["pcie_gen"] = min(gens)
    if widths:
        out["pcie_width"] = min(widths)
    modes = {d["mig_current"] for d in devices}
    if len(modes) == 1 and None not in modes:
        out["mig"] = _mig_name(modes.pop())
    if facts["driver_version"]:
        out["driver_version"] = facts["driver_version"]
    vbioses = {d["vbios"] for d in devices if d["vbios"]}
    if len(vbioses) == 1:
        out["vbios_version"] = vbioses.pop()
    if devices and all(attached(d) for d in devices):
        out["clique"] = True
    return out


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """GPUs are expected when the config names a count, or when NVIDIA GPUs sit on the PCI bus
    while NVML cannot see them (`found`, from the source): then no NVML is a fail, not a skip,
    so a node with no config still catches a dead driver or a GPU that fell off."""
    pci = found.get("pci_gpus") if isinstance(found, dict) else None
    return bool(expect.get("count")) or bool(pci)


# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values that a GPU reset clears: GPU_RESET (1) and
# DRAIN_AND_RESET (4) (nvml.h, nvmlDeviceGpuRecoveryAction_t).
RESET_ACTIONS = (1, 4)


def resets_of(facts: Facts) -> list[Any]:
    """Idle GPUs whose pending row remap or recovery action a GPU reset would clear: the epilog
    resets them (settings.reset_gpus) or drains the node until someone does."""
    out = []
    for dev in facts.get("devices", []):
        fields = dev["fields"]
        wants = fields.get("remap_pending") or fields.get("recovery_action") in RESET_ACTIONS
        if wants and not dev["error"] and not dev["processes"]:
            out.append(dev["index"])
    return out


# --- shared nodes: the job's own GPUs (checks/base.py job_verdict) ---------------------------

# Judged GPU by GPU: in a job hook, a fault on a GPU the job does not hold drains the node and
# does not refuse the job. count, inventory, versions and fabric judge the node as a whole (a
# GPU NVML cannot reach asks for a reboot; the fabric is the NVSwitches'); processes scopes
# itself (another job's processes are no fault at all).
SCOPED = (
    ecc,
    memory_errors,
    corrected_ecc,
    row_remap,
    recovery_action,
    persistence,
    cpu_links,
    cpu_link_errors,
    thermal,
    pcie,
    pcie_link,
    model,
    mig,
)


def for_gpus(facts: Facts, ctx: Context, keep: Keep) -> Facts:
    """The facts of the GPUs `keep` takes; `peers` keeps them all, the reference of the checks
    that judge a GPU against the others (model, pcie)."""
    devices = [d for d in facts["devices"] if keep(d["index"])]
    return dict(facts, devices=devices, peers=facts.get("peers") or facts["devices"])


MIG_PREFIX = "MIG-"


def _mig_parents(devices: list[Any]) -> dict[str, int]:
    """MIG device id -> its GPU's index, in both forms slurmd gives a job's MIG devices: the
    MIG device's own UUID (`MIG-<uuid>`, drivers from 470.42.01) and, before, `MIG-<GPU
    UUID>/<GPU instance>/<compute instance>` (Slurm's gpu_nvml.c _handle_mig)."""
    out: dict[str, int] = {}
    for dev in devices:
        index, uuid = dev.get("index"), dev.get("uuid")
        if not isinstance(index, int):
            continue
        for mig_dev in dev.get("mig_devices") or []:
            if not isinstance(mig_dev, dict):
                continue
            if isinstance(mig_dev.get("uuid"), str):
                out[mig_dev["uuid"]] = index
            if isinstance(uuid, str):
                out[f"{MIG_PREFIX}{uuid}/{mig_dev.get('gi')}/{mig_dev.get('ci')}"] = index
    return out


def job_scope(
    raw: object, indexes: list[int] | None, visible: list[str] | None
) -> tuple[list[int] | None, str]:
    """The job's GPUs as NVML indexes of physical GPUs, and why they are not known (None, why).

    `indexes`: SLURM_JOB_GPUS, Slurm's GRES indexes; `visible`: the ids slurmd gave in the
    hook's CUDA_VISIBLE_DEVICES; `raw`: the GPU source's facts (sources/nvml.py). With no GPU
    in MIG mode, Slurm's indexes are NVML's (AutoDetect=nvml orders the GPUs as NVML
    enumerates them, by PCI bus id: Slurm's gres_gpu.c). With MIG, Slurm's indexes count MIG
    devices in an order of its own, so only the MIG device ids (in CUDA_VISIBLE_DEVICES, as
    Slurm's gres_common.c gives a prolog's) name the GPUs, through the MIG devices the sweep
    lists (`mig_devices`). Not known: every GPU is judged (the safe side)."""
    devices = raw.get("devices") if isinstance(raw, dict) else None
    migs = [v for v in visible or [] if v.startswith(MIG_PREFIX)]
    if not isinstance(devices, list):
        if migs:
            return None, "MIG devices named, and no GPU facts to find their GPUs"
        return indexes, ""
    devices = [d for d in devices if isinstance(d, dict)]
    if migs:
        parents = _mig_parents(devices)
        unknown = [v for v in migs if v not in parents]
        if unknown:
            more = f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""
            return None, f"MIG device {clean(unknown[0], 80)}{more} not found on any GPU"
        return sorted({parents[v] for v in migs}), ""
    if any(d.get("mig_current") == 1 for d in devices):
        return None, "MIG mode on: slurmd named no MIG device, and its indexes count MIG devices"
    if indexes is None:
        return None, ""
    known = {d.get("index") for d in devices}
    missing = [i for i in indexes if i not in known]
    if missing:
        return None, f"GPU index {missing[0]} from slurmd not among the GPUs NVML lists"
    return sorted(set(indexes)), ""
