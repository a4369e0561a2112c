/* A stand-in libnvidia-ml.so.1 for machines without a GPU: the C functions the GPU sweep
 * calls, with nvml.h's signatures and struct layouts, so that both bindings (slurmhealth's own,
 * sources/nvml_lib.py, and nvidia-ml-py) load it and run their real ctypes code. Written for
 * this project from NVIDIA's nvml.h documentation; the values are made up.
 *
 * Built by tests/node/sources/test_nvml_lib.py: cc -shared -fPIC -o libnvidia-ml.so.1 this.c
 * Environment:
 *   FAKE_NVML_LIB_GPUS=N        GPUs (default 2)
 *   FAKE_NVML_LIB_LOG=PATH      append a line "init" per nvmlInit, "shutdown" per nvmlShutdown
 *   FAKE_NVML_LIB_FAULT=...     init:CODE  nvmlInit_v2 returns CODE (9: driver not loaded)
 *                               lost:I     every call on GPU I returns GPU_IS_LOST (15)
 *                               unsupported  optional calls return NOT_SUPPORTED (3)
 *                               procs:N    N compute processes on GPU 0
 *                               mig:I      GPU I in MIG mode, with two MIG devices
 *                               nvl72      the GPUs in a multi-node NVLink clique: cluster
 *                                          UUID set, clique 32766, partition assigned
 *                               degraded:I GPU I's fabric bandwidth degraded
 *                               fabric:v2  the versioned fabric call knows v2 only (R550-R575)
 *                               fabric:old no versioned fabric call (drivers before R550)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device { unsigned int index; } *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
} nvmlGpuFabricInfo_t;

/* nvmlGpuFabricInfo_v2_t and _v3_t: the version word first, the health mask (and summary) last. */
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;
#define FABRIC_V2 (36u | 2u << 24) /* NVML_STRUCT_VERSION(GpuFabricInfo, 2) */
#define FABRIC_V3 (40u | 3u << 24)

enum { OK = 0, UNINIT = 1, INVALID = 2, UNSUPPORTED = 3, NOT_FOUND = 6, INSUFFICIENT = 7,
       NO_FUNCTION = 13,
       LOST = 15, VERSION_MISMATCH = 25 };

#define MIG_BASE 100 /* the MIG devices' fake indexes: MIG_BASE + their index under the GPU */
static struct fake_device devices[64];
static struct fake_device migs[2] = {{MIG_BASE}, {MIG_BASE + 1}};
static int initialised;

static const char *fault(void) { const char *f = getenv("FAKE_NVML_LIB_FAULT"); return f ? f : ""; }
static int fault_number(const char *prefix) {
    size_t n = strlen(prefix);
    return strncmp(fault(), prefix, n) == 0 ? atoi(fault() + n) : -1;
}
static unsigned int gpus(void) {
    const char *n = getenv("FAKE_NVML_LIB_GPUS");
    unsigned int count = n ? (unsigned int)atoi(n) : 2;
    return count > 64 ? 64 : count;
}
static int unsupported(void) { return strcmp(fault(), "unsupported") == 0; }
/* The return code for a call on `dev`: not initialised, lost, or fine. */
static nvmlReturn_t check(nvmlDevice_t dev) {
    if (!initialised) return UNINIT;
    if (dev == NULL) return INVALID;
    if ((int)dev->index == fault_number("lost:")) return LOST;
    return OK;
}
static nvmlReturn_t text(char *out, unsigned int size, const char *value) {
    if (strlen(value) + 1 > size) return INSUFFICIENT;
    strcpy(out, value);
    return OK;
}

static void note(const char *line) {
    const char *log = getenv("FAKE_NVML_LIB_LOG");
    FILE *out = log ? fopen(log, "a") : NULL;
    if (out) {
        fputs(line, out);
        fclose(out);
    }
}

nvmlReturn_t nvmlInit_v2(void) {
    int code = fault_number("init:");
    note("init\n");
    if (code > 0) return code;
    initialised = 1;
    return OK;
}
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) {
    note("shutdown\n");
    initialised = 0;
    return OK;
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int size) {
    return initialised ? text(out, size, "580.159.04") : UNINIT;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *out) { *out = 13000; return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *out) {
    if (!initialised) return UNINIT;
    *out = gpus();
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *out) {
    if (!initialised) return UNINIT;
    if (index >= gpus()) return INVALID;
    devices[index].index = index;
    *out = &devices[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    memset(out, 0, sizeof *out);
    out->bus = 0x18 + 0x10 * dev->index;
    snprintf(out->busIdLegacy, sizeof out->busIdLegacy, "0000:%02X:00.0", out->bus);
    snprintf(out->busId, sizeof out->busId, "00000000:%02X:00.0", out->bus);
    out->pciDeviceId = 0x233510de;
    return OK;
}
#define TEXT_CALL(name, fmt)                                                   \
    nvmlReturn_t name(nvmlDevice_t dev, char *out, unsigned int size) {        \
        char value[96];                                                        \
        nvmlReturn_t r = check(dev);                                           \
        if (r) return r;                                                       \
        snprintf(value, sizeof value, fmt, dev->index);                        \
        return text(out, size, value);                                         \
    }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *out, unsigned int size) {
    char value[96];
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (dev->index >= MIG_BASE) /* a MIG device's own UUID, as drivers from 470.42.01 give it */
        snprintf(value, sizeof value, "MIG-fa4e0000-0000-0000-0000-0000000001%02u",
                 dev->index - MIG_BASE);
    else
        snprintf(value, sizeof value, "GPU-fa4e0000-0000-0000-0000-00000000000%u", dev->index);
    return text(out, size, value);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *out, unsigned int size) {
    nvmlReturn_t r = check(dev);
    return r ? r : text(out, size, "NVIDIA H200");
}
TEXT_CALL(nvmlDeviceGetSerial, "165372406327%u")
TEXT_CALL(nvmlDeviceGetVbiosVersion, "96.00.A5.00.1%u")

#define UINT_CALL(name, value, optional)                                       \
    nvmlReturn_t name(nvmlDevice_t dev, unsigned int *out) {                   \
        nvmlReturn_t r = check(dev);                                           \
        if (r) return r;                                                       \
        if ((optional) && unsupported()) return UNSUPPORTED;                   \
        *out = (value);                                                        \
        return OK;                                                             \
    }
UINT_CALL(nvmlDeviceGetArchitecture, 9, 0)
UINT_CALL(nvmlDeviceGetPersistenceMode, 1, 0)
UINT_CALL(nvmlDeviceGetMaxPcieLinkGeneration, 5, 0)
UINT_CALL(nvmlDeviceGetMaxPcieLinkWidth, 16, 0)
UINT_CALL(nvmlDeviceGetCurrPcieLinkGeneration, dev->index == 1 ? 4 : 5, 1)
UINT_CALL(nvmlDeviceGetCurrPcieLinkWidth, 16, 1)

nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t dev, unsigned int clock, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (unsupported()) return UNSUPPORTED;
    if (clock != 1 && clock != 2) return INVALID;
    *out = clock == 1 ? (dev->index == 1 ? 1755 : 1980) : 3201; /* GPU 1: lowered SM clock */
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, unsigned int clock, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (clock > 3) return INVALID;
    *out = clock == 1 ? 1980 - 60 * dev->index : 3201; /* SM clock now: lower on each index */
    return OK;
}
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (unsupported()) return UNSUPPORTED;
    out->gpu = 97 - dev->index;
    out->memory = 40;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    out->total = 150754820096ULL;
    out->used = 1ULL << 30;
    out->free = out->total - out->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, unsigned int sensor, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (sensor != 0) return INVALID;
    *out = 35 + dev->index;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, unsigned int kind, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (unsupported()) return UNSUPPORTED;
    *out = kind == 1 ? 89 : 95;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    *out = dev->index == 1 ? 0x4ULL : 0x1ULL; /* GPU 1: SW power cap; others idle */
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (unsupported()) return UNSUPPORTED;
    *current = (int)dev->index == fault_number("mig:");
    *pending = dev->index == 1 || *current;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    *out = 7;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index,
                                                 nvmlDevice_t *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if ((int)dev->index != fault_number("mig:")) return INVALID;
    if (index >= 2) return NOT_FOUND;
    *out = &migs[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (dev->index < MIG_BASE) return INVALID;
    *out = 3 + dev->index - MIG_BASE;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (dev->index < MIG_BASE) return INVALID;
    *out = 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    nvmlReturn_t r = check(dev);
    unsigned int n = 0, i;
    if (r) return r;
    if (dev->index == 0 && fault_number("procs:") > 0) n = (unsigned int)fault_number("procs:");
    if (*count < n || (infos == NULL && n > 0)) {
        *count = n;
        return INSUFFICIENT;
    }
    *count = n;
    for (i = 0; i < n; i++) {
        infos[i].pid = 4000 + i;
        infos[i].usedGpuMemory = i == 0 ? ~0ULL : (unsigned long long)(i + 1) << 30; /* 0: N/A */
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    return OK;
}
/* One GPU's fabric: registration COMPLETED (3) with success; nvl72: a cluster UUID and clique. */
static void fabric_ids(unsigned char *uuid, unsigned int *clique) {
    static const unsigned char cluster[16] = {0x5f, 0x0b, 0x4c, 0x2e, 0x91, 0xd7, 0x4a, 0x63,
                                              0x8e, 0x10, 0x27, 0xc4, 0xb9, 0x3d, 0x6a, 0xf1};
    int nvl72 = strcmp(fault(), "nvl72") == 0;
    memset(uuid, 0, 16);
    if (nvl72) memcpy(uuid, cluster, 16);
    *clique = nvl72 ? 32766 : 7;
}
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (unsupported()) return UNSUPPORTED;
    memset(out, 0, sizeof *out);
    out->state = 3; /* NVML_GPU_FABRIC_STATE_COMPLETED */
    out->status = OK;
    fabric_ids(out->clusterUuid, &out->cliqueId);
    return OK;
}
/* Health mask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*): each condition 2 bits, NOT_SUPPORTED 0,
 * TRUE 1, FALSE 2; incorrect configuration 4 bits at 8, NONE 1. Healthy: degraded bandwidth,
 * route recovery, route unhealthy, access timeout recovery all FALSE, configuration NONE:
 * 0x1AA; nvl72 adds partition assigned TRUE (bit 12) and the global fabric manager connected
 * (bit 14). Degraded: bandwidth TRUE and the summary LIMITED_CAPACITY (3), else HEALTHY (1). */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfoV_t *out) {
    nvmlReturn_t r = check(dev);
    unsigned int version;
    int degraded;
    if (r) return r;
    if (strcmp(fault(), "fabric:old") == 0) return NO_FUNCTION;
    if (unsupported()) return UNSUPPORTED;
    version = out->version;
    if (version != FABRIC_V3 && version != FABRIC_V2) return VERSION_MISMATCH;
    if (version == FABRIC_V3 && strcmp(fault(), "fabric:v2") == 0) return VERSION_MISMATCH;
    degraded = (int)dev->index == fault_number("degraded:");
    memset(out, 0, version == FABRIC_V3 ? 40 : 36);
    out->version = version;
    out->state = 3;
    out->status = OK;
    fabric_ids(out->clusterUuid, &out->cliqueId);
    out->healthMask = degraded ? 0x1A9u : 0x1AAu;
    if (strcmp(fault(), "nvl72") == 0) out->healthMask |= 1u << 12 | 1u << 14;
    if (version == FABRIC_V3) out->healthSummary = degraded ? 3 : 1;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *out) {
    nvmlReturn_t r = check(dev);
    if (r) return r;
    if (unsupported()) return UNSUPPORTED;
    if (link >= 18) return INVALID;
    *out = !(dev->index == 1 && link == 5); /* GPU 1 link 5 down */
    return OK;
}
/* Per field: valueType (0 double, 1 uint, 3 unsigned long long) and the value. */
static nvmlReturn_t field(unsigned int dev, unsigned int id, unsigned int scope, nvmlFieldValue_t *v) {
    v->valueType = 1;
    switch (id) {
    case 1: case 2: v->value.uiVal = 1; return OK;                       /* ECC now, pending */
    case 3: case 4: case 6: v->valueType = 3; v->value.ullVal = 0; return OK;
    case 5: v->valueType = 3; v->value.ullVal = 12 + dev; return OK;     /* corrected, lifetime */
    case 29: case 30: case 31: return UNSUPPORTED;                      /* retired pages: pre-Ampere */
    case 91: v->value.uiVal = 18; return OK;
    case 142: v->value.uiVal = dev; return OK;
    case 143: case 144: case 145: case 230: v->value.uiVal = 0; return OK;
    case 74: v->valueType = 3; v->value.ullVal = 2599937728ULL * (dev + 1); return OK;
    case 75: v->valueType = 3; v->value.ullVal = 0; return OK;
    case 94: v->value.uiVal = 3 * dev; return OK;
    case 81: v->valueType = 3; v->value.ullVal = 700000000ULL * dev; return OK; /* ns */
    case 83: v->valueType = 3; v->value.ullVal = 5000000ULL * (dev + 1); return OK; /* mJ */
    case 161: case 162: case 163:
        if (scope >= 18) return INVALID;
        v->valueType = 3;
        v->value.ullVal = id == 163 && dev == 1 && scope == 5 ? 42 : 0;
        return OK;
    default: return UNSUPPORTED;
    }
}
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    nvmlReturn_t r = check(dev);
    int i;
    if (r) return r;
    for (i = 0; i < count; i++) {
        values[i].timestamp = 1796075588911773LL;
        values[i].latencyUsec = 100;
        values[i].nvmlReturn = unsupported() && values[i].fieldId != 1
                                   ? UNSUPPORTED
                                   : field(dev->index, values[i].fieldId, values[i].scopeId, &values[i]);
    }
    return OK;
}
