"""A stand-in for the `pynvml` module, for tests on machines without a GPU.

It serves the devices of a snapshot file named by $FAKE_NVML_SNAPSHOT through the same call
signatures, return shapes and NVMLError_* exception names as nvidia-ml-py, so that
slurmhealth/sources/nvml.py runs its real code path. Faults are injected with $FAKE_NVML_FAULT:
  library_missing | driver_not_loaded   nvmlInit raises like a node without a driver
  hang_init | hang_device:N             nvmlInit or any call on GPU N blocks for an hour
  lost:N                                GPU N raises GpuIsLost from every call after its handle
"""

import json
import os
import time

NVML_NVLINK_MAX_LINKS = 36
_REVERSE_FIELDS = {
    1: "ecc_current",
    2: "ecc_pending",
    3: "ecc_sbe_volatile",
    4: "ecc_dbe_volatile",
    5: "ecc_sbe_aggregate",
    6: "ecc_dbe_aggregate",
    29: "retired_sbe",
    30: "retired_dbe",
    31: "retired_pending",
    91: "nvlink_count",
    142: "remap_correctable",
    143: "remap_uncorrectable",
    144: "remap_pending",
    145: "remap_failure",
    230: "recovery_action",
    74: "perf_power_ns",
    75: "perf_thermal_ns",
    94: "pcie_replay",
    83: "energy_mj",
    81: "below_base_ns",
    170: "c2c_links",
    231: "c2c_crc",
    232: "c2c_replay",
    233: "c2c_replay_b2b",
}
_LINK_FIELDS = {161: "replay", 162: "recovery", 163: "crc"}
_C2C_STATUS = 171  # scopeId = C2C link: 1 active, 0 inactive, from the snapshot's `c2c`


class NVMLError(Exception):
    value = 999


def _error(name, code):
    return type(f"NVMLError_{name}", (NVMLError,), {"value": code})


NVMLError_NotSupported = _error("NotSupported", 3)
NVMLError_NotFound = _error("NotFound", 6)
NVMLError_DriverNotLoaded = _error("DriverNotLoaded", 9)
NVMLError_LibraryNotFound = _error("LibraryNotFound", 12)
NVMLError_FunctionNotFound = _error("FunctionNotFound", 13)
NVMLError_GpuIsLost = _error("GpuIsLost", 15)
NVMLError_ArgumentVersionMismatch = _error("ArgumentVersionMismatch", 25)
NVMLError_Unknown = _error("Unknown", 999)

_state = {}


def _fault():
    return os.environ.get("FAKE_NVML_FAULT", "")


def nvmlInit():
    fault = _fault()
    if fault == "library_missing":
        raise NVMLError_LibraryNotFound()
    if fault == "driver_not_loaded":
        raise NVMLError_DriverNotLoaded()
    if fault == "hang_init":
        time.sleep(3600)
    with open(os.environ["FAKE_NVML_SNAPSHOT"]) as handle:
        _state["gpu"] = json.load(handle)["gpu"]


def nvmlShutdown():
    _state.clear()


def nvmlSystemGetDriverVersion():
    return _state["gpu"]["driver_version"]


def nvmlSystemGetCudaDriverVersion():
    value = _state["gpu"].get("cuda_driver_version")
    if value is None:
        raise NVMLError_NotSupported()
    return value


def nvmlDeviceGetCount():
    return _state["gpu"]["count"]


class _Handle:
    def __init__(self, index):
        self.index = index
        devices = _state["gpu"]["devices"]
        self.dev = devices[index] if index < len(devices) else {"error": "GpuIsLost"}


def _dev(handle, key=None):
    fault = _fault()
    if fault == f"hang_device:{handle.index}":
        time.sleep(3600)
    if fault == f"lost:{handle.index}" or handle.dev.get("error"):
        raise NVMLError_GpuIsLost()
    if key is None:
        return handle.dev
    if handle.dev.get(key) is None:
        raise NVMLError_NotSupported()
    return handle.dev[key]


def nvmlDeviceGetHandleByIndex(index):
    if index >= len(_state["gpu"]["devices"]):
        raise NVMLError_GpuIsLost()
    return _Handle(index)


class _Pci:
    def __init__(self, bus_id):
        self.busId = bus_id.encode()


def nvmlDeviceGetPciInfo(h):
    return _Pci(_dev(h, "bus_id"))


def nvmlDeviceGetUUID(h):
    if isinstance(h, _MigHandle):
        return h.mig["uuid"]
    return _dev(h, "uuid")


def nvmlDeviceGetName(h):
    return _dev(h, "name")


def nvmlDeviceGetSerial(h):
    return _dev(h, "serial")


def nvmlDeviceGetVbiosVersion(h):
    return _dev(h, "vbios")


def nvmlDeviceGetArchitecture(h):
    return _dev(h, "arch")


def nvmlDeviceGetPersistenceMode(h):
    return _dev(h, "persistence")


def nvmlDeviceGetTemperature(h, sensor):
    return _dev(h, "temperature")


def nvmlDeviceGetTemperatureThreshold(h, kind):
    return _dev(h, "temp_slowdown")


def nvmlDeviceGetCurrentClocksEventReasons(h):
    return _dev(h, "clock_event_reasons")


def nvmlDeviceGetMaxPcieLinkGeneration(h):
    return _dev(h, "pcie_max_gen")


def nvmlDeviceGetMaxPcieLinkWidth(h):
    return _dev(h, "pcie_max_width")


def nvmlDeviceGetCurrPcieLinkGeneration(h):
    return _dev(h, "pcie_gen")


def nvmlDeviceGetCurrPcieLinkWidth(h):
    return _dev(h, "pcie_width")


class c_nvmlMemory_t:
    def __init__(self, total):
        self.total = total
        self.used = 0
        self.free = total


def nvmlDeviceGetMemoryInfo(h, version=None):
    return c_nvmlMemory_t(_dev(h, "memory_total"))


def nvmlDeviceGetApplicationsClock(h, clock):
    """MHz; clock 1 (SM) and 2 (memory). NotSupported where the snapshot has no value."""
    return _dev(h, {1: "app_clock_sm", 2: "app_clock_mem"}.get(clock, "-"))


def nvmlDeviceGetClockInfo(h, clock):
    """MHz now; only the SM clock (1) is served, from the snapshot's `sm_clock`."""
    return _dev(h, "sm_clock" if clock == 1 else "-")


class c_nvmlUtilization_t:
    def __init__(self, gpu):
        self.gpu = gpu
        self.memory = 0


def nvmlDeviceGetUtilizationRates(h):
    return c_nvmlUtilization_t(_dev(h, "util_gpu"))


def nvmlDeviceGetMigMode(h):
    """[current, pending] as nvidia-ml-py returns them; NotSupported on a GPU without MIG."""
    current = _dev(h, "mig_current")
    pending = _dev(h, "mig_pending")
    return [current, pending]


class _MigHandle:
    """A MIG device of a GPU in MIG mode: an entry of the snapshot's `mig_devices`."""

    def __init__(self, mig):
        self.mig = mig


def nvmlDeviceGetMaxMigDeviceCount(h):
    _dev(h, "mig_devices")  # NotSupported where the snapshot lists none
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(h, index):
    found = [m for m in _dev(h, "mig_devices") if m["index"] == index]
    if not found:
        raise NVMLError_NotFound()
    return _MigHandle(found[0])


def nvmlDeviceGetGpuInstanceId(h):
    return h.mig["gi"]


def nvmlDeviceGetComputeInstanceId(h):
    return h.mig["ci"]


class _Proc:
    def __init__(self, entry):
        self.pid = entry["pid"]
        self.usedGpuMemory = entry.get("used_memory")


def nvmlDeviceGetComputeRunningProcesses(h):
    return [_Proc(p) for p in _dev(h, "processes")]


class _Ref:
    def __init__(self, obj):
        self._obj = obj


def byref(obj):
    return _Ref(obj)


class c_nvmlGpuFabricInfo_t:
    state = status = cliqueId = 0
    clusterUuid = bytes(16)


class c_nvmlGpuFabricInfo_v2_t(c_nvmlGpuFabricInfo_t):
    version = 2
    healthMask = 0


class c_nvmlGpuFabricInfo_v3_t(c_nvmlGpuFabricInfo_v2_t):
    version = 3
    healthSummary = 0


def _fill_fabric(info, fabric):
    info.state, info.status = fabric["state"], fabric["status"]
    info.cliqueId = fabric.get("clique_id") or 0
    info.clusterUuid = bytes.fromhex((fabric.get("cluster_uuid") or "0" * 32).replace("-", ""))


def nvmlDeviceGetGpuFabricInfo(h, ref):
    _fill_fabric(ref._obj, _dev(h, "fabric"))


def nvmlDeviceGetGpuFabricInfoV(h, ref):
    """As a driver of the snapshot's kind: no versioned call where the snapshot has no health
    mask (before R550), v2 only where it has no health summary (before R580)."""
    fabric, info = _dev(h, "fabric"), ref._obj
    if fabric.get("health_mask") is None:
        raise NVMLError_FunctionNotFound()
    if info.version == 3 and fabric.get("health_summary") is None:
        raise NVMLError_ArgumentVersionMismatch()
    _fill_fabric(info, fabric)
    info.healthMask = fabric["health_mask"]
    if info.version == 3:
        info.healthSummary = fabric["health_summary"]


def nvmlDeviceGetNvLinkState(h, link):
    links = _dev(h, "nvlink")
    if link >= len(links):
        raise NVMLError_NotSupported()
    return 1 if links[link]["active"] else 0


class _Value:
    def __init__(self, value, value_type):
        self.ullVal = self.uiVal = self.dVal = value
        self.valueType = value_type


class _Field:
    def __init__(self, value):
        self.nvmlReturn = 3 if value is None else 0
        self.valueType = 3
        self.value = _Value(value or 0, 3)


def nvmlDeviceGetFieldValues(h, ids):
    dev = _dev(h)
    out = []
    for fid in ids:
        if isinstance(fid, tuple) and fid[0] == _C2C_STATUS:
            links = dev.get("c2c") or []
            active = links[fid[1]].get("active") if fid[1] < len(links) else None
            value = None if active is None else int(active)
        elif isinstance(fid, tuple):
            fid, link = fid
            links = dev.get("nvlink") or []
            value = links[link].get(_LINK_FIELDS[fid]) if link < len(links) else None
        else:
            value = (dev.get("fields") or {}).get(_REVERSE_FIELDS.get(fid))
        out.append(_Field(value))
    return out
