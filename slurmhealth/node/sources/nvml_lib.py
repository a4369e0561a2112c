"""A small ctypes binding over libnvidia-ml.so.1: only the calls the GPU sweep makes.

Why not nvidia-ml-py: importing it costs several times this module's import (it defines every
struct and constant of NVML at import; figures: docs/benchmarks.md), on the prolog's path,
and the sweep needs about twenty calls. This module keeps nvidia-ml-py's names and shapes for
those calls (function names, `NVMLError_<Name>` exceptions, structs with the same fields), so
sources/nvml.py runs unchanged over either binding and tests can stand in for both. Set
SLURMHEALTH_NVML_BINDING=pynvml to use nvidia-ml-py instead (docs/packaging.md).

Everything here is from NVIDIA's nvml.h and the NVML API reference: function names and
versions, struct layouts, return codes. NVML is thread-safe (the API reference's introduction),
and a ctypes CDLL call releases the GIL, so GPUs can be swept in parallel threads.
"""

from __future__ import annotations

import ctypes
import threading

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Callable, NoReturn

    # A symbol of the library: ctypes' default return type, c_int, carries nvmlReturn_t.
    Function = Callable[..., int]

# nvmlReturn_t (nvml.h) -> the name nvidia-ml-py gives its exception class, NVMLError_<name>.
RETURN_NAMES = {
    1: "Uninitialized",
    2: "InvalidArgument",
    3: "NotSupported",
    4: "NoPermission",
    5: "AlreadyInitialized",
    6: "NotFound",
    7: "InsufficientSize",
    8: "InsufficientPower",
    9: "DriverNotLoaded",
    10: "Timeout",
    11: "IrqIssue",
    12: "LibraryNotFound",
    13: "FunctionNotFound",
    14: "CorruptedInforom",
    15: "GpuIsLost",
    16: "ResetRequired",
    17: "OperatingSystem",
    18: "LibRmVersionMismatch",
    19: "InUse",
    20: "Memory",
    21: "NoData",
    22: "VgpuEccNotSupported",
    23: "InsufficientResources",
    24: "FreqNotSupported",
    25: "ArgumentVersionMismatch",
    26: "Deprecated",
    27: "NotReady",
    28: "GpuNotFound",
    29: "InvalidState",
    30: "ResetTypeNotSupported",
    999: "Unknown",
}
NOT_SUPPORTED, INSUFFICIENT_SIZE, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND = 3, 7, 12, 13

# Buffer sizes (nvml.h): NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
# NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_SERIAL_BUFFER_SIZE,
# NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE.
DRIVER_VERSION_SIZE, UUID_SIZE, NAME_SIZE, SERIAL_SIZE, VBIOS_SIZE = 80, 96, 96, 30, 32
NVML_NVLINK_MAX_LINKS = 36  # nvml.h of NVML 13; the sweep stops at the first link that errs
NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
# NVML_STRUCT_VERSION(GpuFabricInfo, N): sizeof(nvmlGpuFabricInfo_vN_t) | N << 24 (nvml.h)
nvmlGpuFabricInfo_v2, nvmlGpuFabricInfo_v3 = 36 | 2 << 24, 40 | 3 << 24


class NVMLError(Exception):
    """A failed NVML call; subclasses NVMLError_<Name> per return code, as nvidia-ml-py's."""

    value = 999

    def __str__(self) -> str:
        return f"NVML error {self.value} ({RETURN_NAMES.get(self.value, 'Unknown')})"


_CLASSES = {
    code: type(f"NVMLError_{name}", (NVMLError,), {"value": code})
    for code, name in RETURN_NAMES.items()
}
globals().update({cls.__name__: cls for cls in _CLASSES.values()})


def _raise(code: int) -> NoReturn:
    raise _CLASSES.get(code, _CLASSES[999])()


class c_nvmlPciInfo_t(ctypes.Structure):  # noqa: N801 - nvml.h's name, as nvidia-ml-py's
    """nvmlPciInfo_t (v3): busId is the extended "00000000:18:00.0" form."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class c_nvmlMemory_t(ctypes.Structure):  # noqa: N801
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlValue_t(ctypes.Union):  # noqa: N801
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlUtilization_t(ctypes.Structure):  # noqa: N801
    """nvmlUtilization_t: percent of the last sample period a kernel ran (gpu) and device
    memory was read or written (memory)."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlFieldValue_t(ctypes.Structure):  # noqa: N801
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),  # nvmlValueType_t
        ("nvmlReturn", ctypes.c_uint),  # nvmlReturn_t
        ("value", c_nvmlValue_t),
    ]


class c_nvmlProcessInfo_t(ctypes.Structure):  # noqa: N801
    """nvmlProcessInfo_t as nvmlDeviceGetComputeRunningProcesses_v3 fills it."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # noqa: N801
    """nvmlGpuFabricInfo_t, for nvmlDeviceGetGpuFabricInfo (drivers before the versioned call)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),  # nvmlGpuFabricState_t, an unsigned char
    ]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):  # noqa: N801
    """nvmlGpuFabricInfo_v2_t (R550 on): the version first, the health mask last. Its version
    word is NVML_STRUCT_VERSION(GpuFabricInfo, 2): the struct's size, 36, | 2 << 24."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),
        ("healthMask", ctypes.c_uint),  # NVML_GPU_FABRIC_HEALTH_MASK_*
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):  # noqa: N801
    """nvmlGpuFabricInfo_v3_t (R580 on, nvmlGpuFabricInfoV_t of NVML 13): v2 and a health
    summary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*); 40 bytes."""

    _fields_ = [*c_nvmlGpuFabricInfo_v2_t._fields_, ("healthSummary", ctypes.c_uint8)]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v3)


class Process:
    """One compute process: the two attributes the sweep reads, as nvidia-ml-py gives them."""

    __slots__ = ("pid", "usedGpuMemory")

    def __init__(self, pid: int, used: int | None) -> None:
        self.pid = pid
        self.usedGpuMemory = used  # noqa: N815 - nvidia-ml-py's name


byref = ctypes.byref
_loaded: list[ctypes.CDLL] = []  # the CDLL, once loaded
_lock = threading.Lock()
_functions: dict[str, Function] = {}


def _function(name: str, *fallbacks: str) -> Function:
    """The library's symbol (or the first fallback it has); NVMLError_FunctionNotFound if none."""
    found = _functions.get(name)
    if found is None:
        if not _loaded:
            _raise(1)
        for symbol in (name, *fallbacks):
            try:
                found = getattr(_loaded[0], symbol)
                break
            except AttributeError:
                continue
        else:
            _raise(FUNCTION_NOT_FOUND)
        _functions[name] = found
    return found


def _call(name: str, *args: object, fallbacks: tuple[str, ...] = ()) -> None:
    code = _function(name, *fallbacks)(*args)
    if code != 0:
        _raise(code)


def _uint(name: str, *args: object) -> int:
    out = ctypes.c_uint()
    _call(name, *args, ctypes.byref(out))
    return out.value


def _text(name: str, size: int, *args: object) -> str:
    buf = ctypes.create_string_buffer(size)
    _call(name, *args, buf, ctypes.c_uint(size))
    return buf.value.decode("utf-8", "replace")


# --- the calls, under nvidia-ml-py's names -----------------------------------------------------


def nvmlInit() -> None:
    """Load the library (once) and initialise NVML (nvmlInit_v2)."""
    with _lock:
        if not _loaded:
            try:
                _loaded.append(ctypes.CDLL("libnvidia-ml.so.1"))
            except OSError:
                _raise(LIBRARY_NOT_FOUND)
    _call("nvmlInit_v2")


def nvmlShutdown() -> None:
    _call("nvmlShutdown")


def nvmlSystemGetDriverVersion() -> str:
    return _text("nvmlSystemGetDriverVersion", DRIVER_VERSION_SIZE)


def nvmlSystemGetCudaDriverVersion() -> int:
    out = ctypes.c_int()
    _call("nvmlSystemGetCudaDriverVersion", ctypes.byref(out))
    return out.value


def nvmlDeviceGetCount() -> int:
    return _uint("nvmlDeviceGetCount_v2")


def nvmlDeviceGetHandleByIndex(index: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()  # nvmlDevice_t: an opaque pointer, passed back as is
    _call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
    return handle


def nvmlDeviceGetPciInfo(handle: object) -> c_nvmlPciInfo_t:
    info = c_nvmlPciInfo_t()
    _call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(info))
    return info


def nvmlDeviceGetUUID(handle: object) -> str:
    return _text("nvmlDeviceGetUUID", UUID_SIZE, handle)


def nvmlDeviceGetName(handle: object) -> str:
    return _text("nvmlDeviceGetName", NAME_SIZE, handle)


def nvmlDeviceGetSerial(handle: object) -> str:
    return _text("nvmlDeviceGetSerial", SERIAL_SIZE, handle)


def nvmlDeviceGetVbiosVersion(handle: object) -> str:
    return _text("nvmlDeviceGetVbiosVersion", VBIOS_SIZE, handle)


def nvmlDeviceGetArchitecture(handle: object) -> int:
    return _uint("nvmlDeviceGetArchitecture", handle)


def nvmlDeviceGetMemoryInfo(handle: object) -> c_nvmlMemory_t:
    memory = c_nvmlMemory_t()
    _call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
    return memory


def nvmlDeviceGetPersistenceMode(handle: object) -> int:
    return _uint("nvmlDeviceGetPersistenceMode", handle)


def nvmlDeviceGetFieldValues(
    handle: object, ids: list[int | tuple[int, int]]
) -> ctypes.Array[c_nvmlFieldValue_t]:
    """One batched call; each entry is a field id or a (field id, scope id) pair."""
    values = (c_nvmlFieldValue_t * len(ids))()
    for slot, wanted in zip(values, ids):
        slot.fieldId, slot.scopeId = wanted if isinstance(wanted, tuple) else (wanted, 0)
    _call("nvmlDeviceGetFieldValues", handle, ctypes.c_int(len(ids)), values)
    return values


def nvmlDeviceGetTemperature(handle: object, sensor: int) -> int:
    return _uint("nvmlDeviceGetTemperature", handle, ctypes.c_uint(sensor))


def nvmlDeviceGetTemperatureThreshold(handle: object, kind: int) -> int:
    return _uint("nvmlDeviceGetTemperatureThreshold", handle, ctypes.c_uint(kind))


def nvmlDeviceGetCurrentClocksEventReasons(handle: object) -> int:
    """The reasons bitmask; drivers before R535 name the call ...ThrottleReasons (same value)."""
    out = ctypes.c_ulonglong()
    _call(
        "nvmlDeviceGetCurrentClocksEventReasons",
        handle,
        ctypes.byref(out),
        fallbacks=("nvmlDeviceGetCurrentClocksThrottleReasons",),
    )
    return out.value


def nvmlDeviceGetMaxPcieLinkGeneration(handle: object) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkGeneration", handle)


def nvmlDeviceGetMaxPcieLinkWidth(handle: object) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkWidth", handle)


def nvmlDeviceGetCurrPcieLinkGeneration(handle: object) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkGeneration", handle)


def nvmlDeviceGetCurrPcieLinkWidth(handle: object) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkWidth", handle)


def nvmlDeviceGetApplicationsClock(handle: object, clock: int) -> int:
    return _uint("nvmlDeviceGetApplicationsClock", handle, ctypes.c_uint(clock))


def nvmlDeviceGetClockInfo(handle: object, clock: int) -> int:
    return _uint("nvmlDeviceGetClockInfo", handle, ctypes.c_uint(clock))


def nvmlDeviceGetUtilizationRates(handle: object) -> c_nvmlUtilization_t:
    out = c_nvmlUtilization_t()
    _call("nvmlDeviceGetUtilizationRates", handle, ctypes.byref(out))
    return out


def nvmlDeviceGetMigMode(handle: object) -> list[int]:
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    _call("nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending))
    return [current.value, pending.value]


def nvmlDeviceGetMaxMigDeviceCount(handle: object) -> int:
    return _uint("nvmlDeviceGetMaxMigDeviceCount", handle)


def nvmlDeviceGetMigDeviceHandleByIndex(handle: object, index: int) -> ctypes.c_void_p:
    """The MIG device at `index` under a GPU in MIG mode; NVMLError_NotFound where none is."""
    mig = ctypes.c_void_p()
    _call("nvmlDeviceGetMigDeviceHandleByIndex", handle, ctypes.c_uint(index), ctypes.byref(mig))
    return mig


def nvmlDeviceGetGpuInstanceId(handle: object) -> int:
    return _uint("nvmlDeviceGetGpuInstanceId", handle)


def nvmlDeviceGetComputeInstanceId(handle: object) -> int:
    return _uint("nvmlDeviceGetComputeInstanceId", handle)


def nvmlDeviceGetComputeRunningProcesses(handle: object) -> list[Process]:
    """Compute processes on the GPU: asked once with no room (success means none), then with
    room for twice the count the library gave, plus a margin, in case more start meanwhile."""
    count = ctypes.c_uint(0)
    name = "nvmlDeviceGetComputeRunningProcesses_v3"
    code = _function(name)(handle, ctypes.byref(count), None)
    if code == 0:
        return []
    if code != INSUFFICIENT_SIZE:
        _raise(code)
    count.value = count.value * 2 + 5
    procs = (c_nvmlProcessInfo_t * count.value)()
    _call(name, handle, ctypes.byref(count), procs)
    return [
        Process(p.pid, None if p.usedGpuMemory == NOT_AVAILABLE else p.usedGpuMemory)
        for p in procs[: count.value]
    ]


def nvmlDeviceGetGpuFabricInfo(handle: object, info: object) -> None:
    _call("nvmlDeviceGetGpuFabricInfo", handle, info)


def nvmlDeviceGetGpuFabricInfoV(handle: object, info: object) -> None:
    """The versioned call: `info` a c_nvmlGpuFabricInfo_v3_t or _v2_t with its version set;
    a driver that does not know that version answers ArgumentVersionMismatch."""
    _call("nvmlDeviceGetGpuFabricInfoV", handle, info)


def nvmlDeviceGetNvLinkState(handle: object, link: int) -> int:
    return _uint("nvmlDeviceGetNvLinkState", handle, ctypes.c_uint(link))
