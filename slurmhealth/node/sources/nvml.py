"""GPU facts from NVML: the only module that loads a binding (sources/nvml_lib.py, or
nvidia-ml-py's pynvml with SLURMHEALTH_NVML_BINDING=pynvml).

`gather()` sweeps every GPU, in parallel threads, and returns plain JSON-able values, the `gpu`
section of a snapshot (docs/snapshot-format.md). A value NVML cannot give is None and the reason
goes to the device's `errors` map ("NotSupported", "GpuIsLost", ...), so checks can tell
"unsupported" from "broken" and a replayed snapshot gives the same verdicts as the live node.

Sources: NVIDIA's NVML API reference and nvml.h (calls, field ids; docs/sources.md).
"""

from __future__ import annotations

import os
import threading
import time

from slurmhealth.core.result import counted
from slurmhealth.node.counters import bus as pci_address  # one spelling of a sysfs address
from slurmhealth.node.sources import Options, SourceUnavailable

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType
    from typing import Any

# Field ids batched into one nvmlDeviceGetFieldValues call per GPU (nvml.h): fields
# served by the same driver call are fetched once, so this is the cheapest sweep.
FIELDS = {
    "ecc_current": 1,
    "ecc_pending": 2,
    "ecc_sbe_volatile": 3,
    "ecc_dbe_volatile": 4,
    "ecc_sbe_aggregate": 5,  # corrected errors over the GPU's life (gpu.corrected_ecc)
    "ecc_dbe_aggregate": 6,
    "retired_sbe": 29,  # pages retired for single-bit errors (pre-Ampere; gpu.row_remap)
    "retired_dbe": 30,  # ... for double-bit errors
    "retired_pending": 31,
    "nvlink_count": 91,
    "remap_correctable": 142,
    "remap_uncorrectable": 143,
    "remap_pending": 144,
    "remap_failure": 145,
    "recovery_action": 230,
    # Cumulative counters kept over time (node/counters.py, fleet/trends.py):
    "perf_power_ns": 74,  # NVML_FI_DEV_PERF_POLICY_POWER: time held back by the power policy
    "perf_thermal_ns": 75,  # NVML_FI_DEV_PERF_POLICY_THERMAL: ... by the thermal policy
    "pcie_replay": 94,  # NVML_FI_DEV_PCIE_REPLAY_COUNTER (DCGM warns at 8 per minute)
    # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: mJ since the driver loaded; the prolog's and the
    # epilog's readings give the job's energy and mean power per GPU (node/counters.py).
    "energy_mj": 83,
    # NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: ns the SM clock was held below its base clock
    # (nvmlPerfPolicyType_t NVML_PERF_POLICY_TOTAL_BASE_CLOCKS), for any reason; like the
    # energy, the prolog's and the epilog's readings give the job's share (node/counters.py).
    "below_base_ns": 81,
    # NVLink-C2C, the GPU's link to its Grace CPU (GH200, GB200, GB300): the links present
    # (NVML_FI_DEV_C2C_LINK_COUNT) and the error counters with scopeId 0, the call DCGM makes
    # (NVML_FI_DEV_C2C_LINK_ERROR_INTR, "C2C Link CRC Error Counter", _REPLAY, _REPLAY_B2B;
    # R575 on). Whether NVML then sums the links or answers for link 0 is not documented (the
    # driver keeps them per link): docs/sources.md. A GPU without C2C, or an older driver,
    # answers NotSupported: None.
    "c2c_links": 170,
    "c2c_crc": 231,
    "c2c_replay": 232,
    "c2c_replay_b2b": 233,
}
# Each C2C link's status, NVML_FI_DEV_C2C_LINK_GET_STATUS (0 inactive, 1 active), scopeId = link
# as NCCL and UCX read it, in the same batch: the count is not known before the call, so the
# links NVML's GPM C2C metrics name (LINK0..LINK13) are asked for; those past the count and
# those of a GPU without C2C answer an error, read as None and dropped.
C2C_STATUS, C2C_LINKS_MAX = 171, 14
_BATCH: list[int | tuple[int, int]] = [*FIELDS.values()]
_BATCH += [(C2C_STATUS, link) for link in range(C2C_LINKS_MAX)]
# Per-link NVLink error counters (scopeId = link); unsupported on Blackwell+ (NVML 13 header).
LINK_FIELDS = {"replay": 161, "recovery": 162, "crc": 163}

# c_nvmlFieldValue_t.valueType -> union member (nvml.h, nvmlDeviceGetFieldValues)
_VALUE_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

# Unavailable: the node has no usable NVML at all (no library, no driver). NoPermission is
# unread instead: the GPUs are there but not open to this user (sweep).
_UNAVAILABLE = {"LibraryNotFound", "DriverNotLoaded", "LibRmVersionMismatch"}


def error_name(exc: BaseException) -> str:
    """`NVMLError_GpuIsLost` -> `GpuIsLost`; anything else -> its class name."""
    return type(exc).__name__.replace("NVMLError_", "") or "NVMLError"


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Sweep:
    """Calls NVML for one device, turning each failure into None plus a recorded reason."""

    def __init__(self, nvml: ModuleType, handle: object, record: dict[str, Any]) -> None:
        self.nvml = nvml
        self.handle = handle
        self.record = record

    def get(self, key: str, func: str, *args: object) -> Any:
        try:
            value = getattr(self.nvml, func)(self.handle, *args)
        except Exception as exc:  # NVMLError subclasses; FunctionNotFound on old drivers
            self.record["errors"][key] = error_name(exc)
            return None
        return value


def _field_values(
    nvml: ModuleType, handle: object, ids: Sequence[int | tuple[int, int]]
) -> list[int | float | None]:
    """Values of one batched call; None where that entry's own nvmlReturn is not success."""
    values = nvml.nvmlDeviceGetFieldValues(handle, ids)
    out: list[int | float | None] = []
    for value in values:
        if value.nvmlReturn != 0:
            out.append(None)
            continue
        member = _VALUE_MEMBER.get(value.valueType, "ullVal")
        out.append(getattr(value.value, member))
    return out


def _fields(sweep: _Sweep) -> dict[str, Any]:
    """The batched field values; the C2C links' status goes to the record's `c2c`."""
    try:
        values = _field_values(sweep.nvml, sweep.handle, _BATCH)
    except Exception as exc:
        sweep.record["errors"]["fields"] = error_name(exc)
        sweep.record["c2c"] = None
        return dict.fromkeys(FIELDS)
    fields = dict(zip(FIELDS, values))
    sweep.record["c2c"] = c2c_links(fields["c2c_links"], values[len(FIELDS) :])
    return fields


def c2c_links(count: object, status: Sequence[int | float | None]) -> list[dict[str, Any]] | None:
    """[{link, active}] of the `count` C2C links the GPU reports, active None where its status
    was not read; None where the GPU reports no C2C link (NotSupported, 0)."""
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return None
    return [
        {"link": link, "active": None if value is None else value == 1}
        for link, value in enumerate(status[: min(count, C2C_LINKS_MAX)])
    ]


def _nvlinks(sweep: _Sweep) -> list[dict[str, Any]] | None:
    """Links 0.. until NotSupported (nvml.h); None when the GPU has no NVLink."""
    nvml = sweep.nvml
    links: list[dict[str, Any]] = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(sweep.handle, link)
        except Exception as exc:
            if link == 0:
                sweep.record["errors"]["nvlink"] = error_name(exc)
            break
        links.append({"link": link, "active": bool(state)})
    if not links:
        return None
    ids = [(fid, entry["link"]) for entry in links for fid in LINK_FIELDS.values()]
    try:
        values = _field_values(nvml, sweep.handle, ids)
    except Exception as exc:
        sweep.record["errors"]["nvlink_counters"] = error_name(exc)
        values = [None] * len(ids)
    width = len(LINK_FIELDS)
    for i, entry in enumerate(links):
        entry.update(zip(LINK_FIELDS, values[i * width : (i + 1) * width]))
    return links


def _processes(sweep: _Sweep) -> list[dict[str, Any]] | None:
    procs = sweep.get("processes", "nvmlDeviceGetComputeRunningProcesses")
    if procs is None:
        return None
    return [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in procs]


# The versioned fabric structs, newest first (nvml.h nvmlGpuFabricInfo_v3_t: R580 on, v2: R550
# on): a driver that does not know one answers ArgumentVersionMismatch and the next is tried;
# one without the versioned call at all (FunctionNotFound) gets the old call.
_FABRIC_STRUCTS = ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")


def _fabric_facts(info: Any) -> dict[str, Any]:
    """A fabric struct as plain values: the cluster UUID in the 8-4-4-4-12 form nvidia-smi
    prints (all zeros: no multi-node NVLink cluster); the health mask and summary, None where
    the struct has none."""
    digits = bytes(info.clusterUuid).hex()
    uuid = "-".join((digits[:8], digits[8:12], digits[12:16], digits[16:20], digits[20:]))
    mask, summary = getattr(info, "healthMask", None), getattr(info, "healthSummary", None)
    return {
        "state": int(info.state),
        "status": int(info.status),
        "clique_id": int(info.cliqueId),
        "cluster_uuid": uuid,
        "health_mask": int(mask) if mask is not None else None,
        "health_summary": int(summary) if summary is not None else None,
    }


def _fabric(sweep: _Sweep) -> dict[str, Any] | None:
    """NVLink fabric registration (Hopper+; NVSwitch, and multi-node NVLink on GB200/GB300):
    state, status, clique, cluster UUID and health. nvidia-ml-py's binding, like ours, wants
    a struct argument (its version set when built)."""
    nvml = sweep.nvml
    for name in _FABRIC_STRUCTS:
        struct = getattr(nvml, name, None)
        if struct is None:  # an older nvidia-ml-py
            continue
        info = struct()
        try:
            nvml.nvmlDeviceGetGpuFabricInfoV(sweep.handle, nvml.byref(info))
        except Exception as exc:  # NVMLError_*, AttributeError: no versioned call in the binding
            reason = error_name(exc)
            if reason == "ArgumentVersionMismatch":
                continue
            if reason in ("FunctionNotFound", "AttributeError"):
                break
            sweep.record["errors"]["fabric"] = reason
            return None
        return _fabric_facts(info)
    try:
        info = nvml.c_nvmlGpuFabricInfo_t()
        nvml.nvmlDeviceGetGpuFabricInfo(sweep.handle, nvml.byref(info))
    except Exception as exc:
        sweep.record["errors"]["fabric"] = error_name(exc)
        return None
    return _fabric_facts(info)


def _identity(sweep: _Sweep) -> None:
    record = sweep.record
    pci = sweep.get("bus_id", "nvmlDeviceGetPciInfo")
    record["bus_id"] = _text(pci.busId) if pci is not None else None
    for key, func in (
        ("uuid", "nvmlDeviceGetUUID"),
        ("name", "nvmlDeviceGetName"),
        ("serial", "nvmlDeviceGetSerial"),
        ("vbios", "nvmlDeviceGetVbiosVersion"),
    ):
        value = sweep.get(key, func)
        record[key] = _text(value) if value is not None else None
    record["arch"] = sweep.get("arch", "nvmlDeviceGetArchitecture")
    # Total installed memory in bytes (nvmlMemory_t.total): a part of the wrong size shows here
    memory = sweep.get("memory_total", "nvmlDeviceGetMemoryInfo")
    total = getattr(memory, "total", None)
    record["memory_total"] = int(total) if total is not None else None


def _mig(sweep: _Sweep) -> None:
    """MIG mode now and after the next GPU reset: nvmlDeviceGetMigMode -> (current, pending),
    NVML_DEVICE_MIG_DISABLE 0 / ENABLE 1; NotSupported on GPUs without MIG (both None, the
    reason in errors["mig"])."""
    modes = sweep.get("mig", "nvmlDeviceGetMigMode")
    current = pending = None
    if isinstance(modes, (list, tuple)) and len(modes) == 2:
        current, pending = int(modes[0]), int(modes[1])
    sweep.record["mig_current"], sweep.record["mig_pending"] = current, pending
    if current == 1:
        sweep.record["mig_devices"] = _mig_devices(sweep)


MIG_DEVICES_MAX = 16  # MIG devices looked for per GPU: NVML's most is 7 (A100, H100, H200)
_MIG_IDS = (
    ("uuid", "nvmlDeviceGetUUID"),
    ("gi", "nvmlDeviceGetGpuInstanceId"),
    ("ci", "nvmlDeviceGetComputeInstanceId"),
)


def _mig_devices(sweep: _Sweep) -> list[dict[str, Any]] | None:
    """A GPU in MIG mode: its MIG devices, by their index under it
    (nvmlDeviceGetMigDeviceHandleByIndex from 0 below nvmlDeviceGetMaxMigDeviceCount; NotFound
    where there is none), each with its UUID (`MIG-...`) and its GPU and compute instance ids:
    what slurmd names a job's MIG devices by, so a job hook knows their GPU (checks/gpu.py
    job_scope). None where NVML does not say how many there may be."""
    nvml, errors = sweep.nvml, sweep.record["errors"]
    most = sweep.get("mig_devices", "nvmlDeviceGetMaxMigDeviceCount")
    if not isinstance(most, int):
        return None
    out: list[dict[str, Any]] = []
    for index in range(min(most, MIG_DEVICES_MAX)):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(sweep.handle, index)
        except Exception as exc:
            if error_name(exc) != "NotFound":
                errors["mig_devices"] = error_name(exc)
            continue
        entry: dict[str, Any] = {"index": index}
        for key, func in _MIG_IDS:
            try:
                value = getattr(nvml, func)(handle)
            except Exception as exc:
                errors["mig_devices"] = error_name(exc)
                value = None
            entry[key] = _text(value) if key == "uuid" and value is not None else value
        out.append(entry)
    return out


def _settings(sweep: _Sweep) -> None:
    """Settings that are dear on first use in a fresh process (docs/benchmarks.md): application
    clocks in MHz, which the odd-node comparison reads. nvmlClockType_t NVML_CLOCK_SM 1,
    NVML_CLOCK_MEM 2."""
    get = sweep.get
    sweep.record["app_clock_sm"] = get("app_clock_sm", "nvmlDeviceGetApplicationsClock", 1)
    sweep.record["app_clock_mem"] = get("app_clock_mem", "nvmlDeviceGetApplicationsClock", 2)


def _sample(sweep: _Sweep) -> None:
    """On a GPU running processes, the SM clock now (nvmlDeviceGetClockInfo, NVML_CLOCK_SM 1,
    MHz) and its utilisation over the last sample period (nvmlDeviceGetUtilizationRates().gpu,
    percent of the time a kernel ran): the health checks during a job add them up into the
    job's means (node/counters.py). An idle GPU is not sampled: no call."""
    if not sweep.record.get("processes"):
        return
    sweep.record["sm_clock"] = sweep.get("sm_clock", "nvmlDeviceGetClockInfo", 1)
    rates = sweep.get("util_gpu", "nvmlDeviceGetUtilizationRates")
    sweep.record["util_gpu"] = int(rates.gpu) if rates is not None else None


def _health(sweep: _Sweep) -> None:
    record, get = sweep.record, sweep.get
    record["persistence"] = get("persistence", "nvmlDeviceGetPersistenceMode")
    record["fields"] = _fields(sweep)
    record["temperature"] = get("temperature", "nvmlDeviceGetTemperature", 0)
    record["temp_slowdown"] = get("temp_slowdown", "nvmlDeviceGetTemperatureThreshold", 1)
    record["clock_event_reasons"] = get(
        "clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons"
    )
    record["pcie_max_gen"] = get("pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration")
    record["pcie_max_width"] = get("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth")
    # The link now: drops at idle ("may be reduced when the GPU is not in use", nvidia-smi)
    record["pcie_gen"] = get("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
    record["pcie_width"] = get("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
    _mig(sweep)
    record["processes"] = _processes(sweep)
    record["fabric"] = _fabric(sweep)
    record["nvlink"] = _nvlinks(sweep)


def sweep_device(nvml: ModuleType, index: int, costly: bool = True) -> dict[str, Any]:
    """Everything the checks read about one GPU; a lost GPU yields its error, not an exception."""
    record: dict[str, Any] = {"index": index, "error": None, "errors": {}}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        record["error"] = error_name(exc)
        return record
    sweep = _Sweep(nvml, handle, record)
    _identity(sweep)
    _health(sweep)
    if costly:
        _settings(sweep)
        _sample(sweep)
    if any(reason in ("GpuIsLost", "Unknown") for reason in record["errors"].values()):
        record["error"] = "GpuIsLost" if "GpuIsLost" in record["errors"].values() else "Unknown"
    return record


BINDINGS = ("builtin", "pynvml")


def sweep_devices(nvml: ModuleType, count: int, costly: bool = True) -> list[dict[str, Any]]:
    """Every GPU's sweep, one thread per GPU: NVML is thread-safe (API reference) and both
    bindings release the GIL inside each call, so an 8-GPU node may cost little more than one
    GPU's time (not measured: the machine lent had one GPU, and the driver serialises the calls
    to one GPU). A GPU whose calls hang holds its thread; the runner's deadline ends the gather."""
    if count <= 1:
        return [sweep_device(nvml, i, costly) for i in range(count)]
    out: list[Any] = [None] * count

    def one(index: int) -> None:
        try:
            out[index] = sweep_device(nvml, index, costly)
        except Exception as exc:  # sweep_device records NVML's errors; anything else is ours
            out[index] = {"index": index, "error": "Unknown", "errors": {"sweep": error_name(exc)}}

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def _load() -> ModuleType:
    """The binding: our own (the default, the cheaper import: docs/benchmarks.md) or
    nvidia-ml-py's, chosen by $SLURMHEALTH_NVML_BINDING."""
    which = os.environ.get("SLURMHEALTH_NVML_BINDING") or "builtin"
    if which not in BINDINGS:
        raise SourceUnavailable(
            f"SLURMHEALTH_NVML_BINDING must be builtin or pynvml, not {which!r}"
        )
    if which == "builtin":
        from slurmhealth.node.sources import nvml_lib  # noqa: PLC0415 - only when live

        return nvml_lib
    try:
        import pynvml  # noqa: PLC0415 - heavy: only when asked for, and live
    except ImportError as exc:
        raise SourceUnavailable("pynvml is not installed (pip install nvidia-ml-py)") from exc
    return pynvml


def gather(options: Options) -> dict[str, Any]:
    """The registry's entry: the live sweep (a snapshot replays without this module), with each
    GPU's PCIe AER counters from sysfs. When NVML cannot start, say which NVIDIA GPUs the PCI bus
    still shows."""
    try:
        raw = sweep(shutdown=not options.exiting, costly=options.costly)
    except SourceUnavailable as exc:
        gpus = pci_gpus(options.sysfs_root or "/sys")
        if not gpus:
            raise
        held = counted(len(gpus), "NVIDIA GPU is", "NVIDIA GPUs are")
        why = f"{exc} while {held} on the PCI bus ({gpus[0]}...)"
        raise SourceUnavailable(why, {"pci_gpus": gpus}, exc.errno) from exc
    add_aer(raw, options.sysfs_root or "/sys")
    raw["pci_gpus"] = bound_gpus(options.sysfs_root or "/sys", raw.get("devices") or [])
    return raw


def add_aer(raw: dict[str, Any], root: str) -> None:
    """Each GPU's `aer`: its PCI function's AER counter files as read (sources/sysfs.py aer),
    None where the kernel has none (no AER capability, a kernel before 4.19)."""
    from slurmhealth.node.sources import sysfs  # noqa: PLC0415 - light, and only live

    for dev in raw.get("devices") or []:
        bus = dev.get("bus_id")
        if isinstance(bus, str) and bus:
            pci = f"{root}/bus/pci/devices/{pci_address(bus)}"
            dev["aer"] = sysfs.aer(pci, f"gpu{dev.get('index')}", dev["errors"])


# PCI vendor id of NVIDIA, and the PCI class codes of a GPU: VGA-compatible display controller
# (0x0300) and 3D controller (0x0302), as the kernel shows them in
# /sys/bus/pci/devices/*/{vendor,class} (Documentation/ABI/testing/sysfs-bus-pci). NVSwitches
# are bridges (0x0680) and are not counted.
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")


def pci_gpus(root: str) -> list[str]:
    """PCI addresses of NVIDIA GPUs under root/bus/pci/devices; [] when unreadable."""
    base = os.path.join(root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    return [
        name
        for name in names
        if _pci_word(base, name, "vendor") == NVIDIA_VENDOR and _is_gpu(base, name)
    ]


def bound_gpus(root: str, devices: list[dict[str, Any]]) -> list[str] | None:
    """PCI addresses of the GPUs the nvidia driver holds (root/bus/pci/drivers/nvidia), so a
    GPU the driver has but NVML does not list is seen, with or without a config. One directory
    listing; a class file is read only for an address NVML did not list (a function bound there
    that is no GPU, such as a bridge, is left out). A GPU bound to another driver (vfio-pci:
    passed to a VM) is not ours. None when the directory cannot be listed (no driver loaded, a
    sysfs tree without it)."""
    base = os.path.join(root, "bus", "pci", "drivers", "nvidia")
    try:
        names = os.listdir(base)
    except OSError:
        return None
    listed = {pci_address(d["bus_id"]) for d in devices if isinstance(d.get("bus_id"), str)}
    return [
        name.lower()
        for name in sorted(n for n in names if n.count(":") == 2)
        if name.lower() in listed or _is_gpu(base, name)
    ]


def _is_gpu(base: str, name: str) -> bool:
    return _pci_word(base, name, "class").startswith(GPU_CLASSES)


def _pci_word(base: str, name: str, attribute: str) -> str:
    """A PCI device's sysfs attribute (vendor, class) as the kernel prints it, lower case; ''
    when unreadable."""
    try:
        with open(os.path.join(base, name, attribute), encoding="ascii") as handle:
            return handle.read(16).strip().lower()
    except (OSError, ValueError):
        return ""


def _cuda_version(nvml: ModuleType) -> int | None:
    """The CUDA version the driver supports (nvmlSystemGetCudaDriverVersion: 1000 x major +
    10 x minor, 12040 for 12.4); None where the binding or driver lacks the call."""
    try:
        value = nvml.nvmlSystemGetCudaDriverVersion()
    except Exception:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def sweep(shutdown: bool = True, costly: bool = True) -> dict[str, Any]:
    """One NVML sweep of every GPU. Raises SourceUnavailable when NVML cannot start at all.
    shutdown=False leaves NVML initialised, for a process that ends right after (a hook);
    costly=False leaves out the settings that are dear to read (sources.Options.costly)."""
    nvml = _load()
    started = time.perf_counter()
    try:
        nvml.nvmlInit()
    except Exception as exc:
        name = error_name(exc)
        if name == "NoPermission" and os.geteuid() != 0:  # the GPUs are there, not this user's
            import errno  # noqa: PLC0415 - a builtin module, only on this path

            why = "NVML unavailable: NoPermission (the GPU device files are not open to this user)"
            raise SourceUnavailable(why, errno=errno.EACCES) from exc
        if name == "NoPermission":  # root refused: a broken driver or device, judged as one
            raise SourceUnavailable(f"NVML unavailable: {name}") from exc
        if name in _UNAVAILABLE:
            raise SourceUnavailable(f"NVML unavailable: {name}") from exc
        raise
    init_ms = (time.perf_counter() - started) * 1000
    try:
        raw = {
            "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": _cuda_version(nvml),
            "count": nvml.nvmlDeviceGetCount(),
        }
        raw["devices"] = sweep_devices(nvml, raw["count"], costly)
    finally:
        if shutdown:
            nvml.nvmlShutdown()
    raw["timing_ms"] = {
        "init": round(init_ms, 3),
        "total": round((time.perf_counter() - started) * 1000, 3),
    }
    return raw
