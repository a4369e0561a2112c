"""On a real GPU node: the live NVML path, a captured snapshot and the hot path's real figures.

One run does everything, in order of importance, each stage with its own time limit, and
writes what it finds to OUT as it goes (a stage that fails is recorded, and the next runs):

  live      nvidia-smi -q (timed once), `snapshot`, `config genconf`, `check --json` with and
            without those expectations, and the snapshot replayed through `check`: the
            verdicts must be the same as live.
  prolog    the hook script as slurmd runs it (env file beside slurm.conf, store on local disk),
            N times, alternated with `python -c pass` of the same venv; the split: imports
            (-X importtime), nvmlInit and the sweep (in-process), the store (`check --db`
            against `check --no-db`).
  faults    a process left on the GPU (a CUDA program through PyTorch, when the node has it),
            NVML unavailable (the library hidden), a hung NVML call (a stand-in over the real
            binding): exit code, wall time and what the hook said.
  diagnose  `diagnose --level quick` and `--level medium` with the built-in GPU tests; then
            NVML's policy-time fields 74/75 against nvidia-smi's clocks-event counters (units).

Run on the node, as root, from the source tree, with the venv that holds slurmhealth:
  python3 bench/bench_gpu_node.py --venv /tmp/venv --out /tmp/out [--runs 50]
Writes OUT/summary.json (every figure), OUT/log.txt, OUT/h200.json (the snapshot),
OUT/h200-busy.json (a snapshot under load) and OUT/details.tar.gz (every command's output).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

from common import pct, timed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = "gpu01"
HOOK = os.path.join(REPO, "packaging", "slurmhealth-hook")
# Passed on to every command: where the driver's libraries are; for a rehearsal on a machine
# without a GPU, the NVML stand-in (tests/fakenvml) and its snapshot.
PASSED = ("LD_LIBRARY_PATH", "PYTHONPATH", "FAKE_NVML_SNAPSHOT")

# A pynvml over the real one whose device calls hang: the fault of a GPU whose GSP stopped
# answering, without harming the GPU.
HANG_PROXY = """
import importlib.machinery, importlib.util, os, sys, time
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "pynvml", [p for p in sys.path if os.path.abspath(p or ".") != _here])
_real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
def nvmlDeviceGetHandleByIndex(index):
    time.sleep(3600)
"""
# The same for the builtin binding, patched in as the interpreter starts.
HANG_BUILTIN = """
import time
from slurmhealth.node.sources import nvml_lib
def _hang(index):
    time.sleep(3600)
nvml_lib.nvmlDeviceGetHandleByIndex = _hang
"""

# A CUDA program left running on GPU 0: 2 GiB held and bf16 products in a loop.
BUSY = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
keep = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
open(sys.argv[1], "w").close()
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
"""

# NVML's policy-time fields and what else a per-job record could read, as this driver serves
# them: value, or the error's name (NotSupported, ...). Fields 74/75 are checked against
# nvmlDeviceGetViolationStatus (nvmlViolationTime_t.violationTime, in ns by nvml.h) and
# nvidia-smi's "Clocks Event Reasons Counters".
FIELDS_NOW = """
import json, time, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
vals = n.nvmlDeviceGetFieldValues(h, [74, 75, 94])
out = {"t": time.time()}
for fid, v in zip((74, 75, 94), vals):
    out[str(fid)] = {"ret": v.nvmlReturn, "type": v.valueType, "value": v.value.ullVal,
                     "timestamp_us": v.timestamp, "latency_us": v.latencyUsec}
def val(x):
    if isinstance(x, (int, float, str, type(None))):
        return x
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, (list, tuple)):
        return [val(y) for y in x]
    fields = getattr(x, "_fields_", None)
    if fields:
        return {f[0]: val(getattr(x, f[0])) for f in fields}
    return repr(x)
calls = [
    ("violation_power", "nvmlDeviceGetViolationStatus", 0),
    ("violation_thermal", "nvmlDeviceGetViolationStatus", 1),
    ("violation_sync_boost", "nvmlDeviceGetViolationStatus", 2),
    ("clock_sm", "nvmlDeviceGetClockInfo", 1),
    ("clock_mem", "nvmlDeviceGetClockInfo", 2),
    ("max_clock_sm", "nvmlDeviceGetMaxClockInfo", 1),
    ("app_clock_sm", "nvmlDeviceGetApplicationsClock", 1),
    ("app_clock_mem", "nvmlDeviceGetApplicationsClock", 2),
    ("default_app_clock_sm", "nvmlDeviceGetDefaultApplicationsClock", 1),
    ("power_mw", "nvmlDeviceGetPowerUsage"),
    ("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit"),
    ("energy_mj", "nvmlDeviceGetTotalEnergyConsumption"),
    ("utilization", "nvmlDeviceGetUtilizationRates"),
    ("margin_temperature", "nvmlDeviceGetMarginTemperature"),
    ("temp_shutdown", "nvmlDeviceGetTemperatureThreshold", 0),
    ("temp_slowdown", "nvmlDeviceGetTemperatureThreshold", 1),
    ("temp_gpu_max", "nvmlDeviceGetTemperatureThreshold", 3),
    ("pcie_replay", "nvmlDeviceGetPcieReplayCounter"),
    ("remapped_rows", "nvmlDeviceGetRemappedRows"),
    ("retired_pages_sbe", "nvmlDeviceGetRetiredPages", 0),
    ("ecc_total_corrected_volatile", "nvmlDeviceGetTotalEccErrors", 0, 0),
    ("ecc_total_corrected_aggregate", "nvmlDeviceGetTotalEccErrors", 0, 1),
    ("compute_mode", "nvmlDeviceGetComputeMode"),
    ("inforom_image", "nvmlDeviceGetInforomImageVersion"),
    ("board_part", "nvmlDeviceGetBoardPartNumber"),
    ("nvml_version", None),
    ("pcie_link_max_speed", "nvmlDeviceGetPcieLinkMaxSpeed"),
    ("pcie_speed", "nvmlDeviceGetPcieSpeed"),
    ("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons"),
    ("supported_event_reasons", "nvmlDeviceGetSupportedClocksEventReasons"),
    ("gsp_firmware", "nvmlDeviceGetGspFirmwareVersion"),
    ("gsp_mode", "nvmlDeviceGetGspFirmwareMode"),
    ("cc_mode", "nvmlSystemGetConfComputeState"),
]
for name, func, *args in calls:
    try:
        if func is None:
            out[name] = val(n.nvmlSystemGetNVMLVersion())
        elif func.startswith("nvmlSystem"):
            out[name] = val(getattr(n, func)(*args))
        else:
            out[name] = val(getattr(n, func)(h, *args))
    except Exception as exc:
        out[name] = "error: " + type(exc).__name__
print(json.dumps(out))
n.nvmlShutdown()
"""

# Each call the sweep makes, on GPU 0 through the builtin binding: median of 30, in us; the
# batched field call against each field alone; nvmlInit+nvmlShutdown; a whole device sweep.
PROFILE = """
import json, statistics, time
from slurmhealth.node.sources import nvml, nvml_lib as n
def timed(func, *args, reps=30):
    out, err = [], None
    for _ in range(reps):
        t = time.perf_counter()
        try:
            func(*args)
        except Exception as exc:
            err = type(exc).__name__
        out.append((time.perf_counter() - t) * 1e6)
    return {"us": round(statistics.median(out), 1), "error": err}
res = {"init_shutdown": timed(lambda: (n.nvmlInit(), n.nvmlShutdown()), reps=10)}
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
info = n.c_nvmlGpuFabricInfo_t()
calls = {
    "handle": (n.nvmlDeviceGetHandleByIndex, 0),
    "driver_version": (n.nvmlSystemGetDriverVersion,),
    "cuda_version": (n.nvmlSystemGetCudaDriverVersion,),
    "count": (n.nvmlDeviceGetCount,),
    "pci": (n.nvmlDeviceGetPciInfo, h), "uuid": (n.nvmlDeviceGetUUID, h),
    "name": (n.nvmlDeviceGetName, h), "serial": (n.nvmlDeviceGetSerial, h),
    "vbios": (n.nvmlDeviceGetVbiosVersion, h), "arch": (n.nvmlDeviceGetArchitecture, h),
    "memory": (n.nvmlDeviceGetMemoryInfo, h), "persistence": (n.nvmlDeviceGetPersistenceMode, h),
    "temperature": (n.nvmlDeviceGetTemperature, h, 0),
    "temp_threshold": (n.nvmlDeviceGetTemperatureThreshold, h, 1),
    "event_reasons": (n.nvmlDeviceGetCurrentClocksEventReasons, h),
    "pcie_max_gen": (n.nvmlDeviceGetMaxPcieLinkGeneration, h),
    "pcie_max_width": (n.nvmlDeviceGetMaxPcieLinkWidth, h),
    "pcie_gen": (n.nvmlDeviceGetCurrPcieLinkGeneration, h),
    "pcie_width": (n.nvmlDeviceGetCurrPcieLinkWidth, h),
    "mig": (n.nvmlDeviceGetMigMode, h),
    "processes": (n.nvmlDeviceGetComputeRunningProcesses, h),
    "fabric": (n.nvmlDeviceGetGpuFabricInfo, h, n.byref(info)),
    "nvlink0": (n.nvmlDeviceGetNvLinkState, h, 0),
    "fields_all": (n.nvmlDeviceGetFieldValues, h, list(nvml.FIELDS.values())),
    "fields_no_74_75": (n.nvmlDeviceGetFieldValues, h,
                        [f for f in nvml.FIELDS.values() if f not in (74, 75)]),
    # the per-job fields (energy, time below base clocks) against the batch without them
    "fields_no_81_83": (n.nvmlDeviceGetFieldValues, h,
                        [f for f in nvml.FIELDS.values() if f not in (81, 83)]),
    # the health check's samples of a busy GPU (sources/nvml.py _sample)
    "sm_clock": (n.nvmlDeviceGetClockInfo, h, 1),
    "utilization": (n.nvmlDeviceGetUtilizationRates, h),
}
for key, fid in nvml.FIELDS.items():
    calls[f"field_{fid}_{key}"] = (n.nvmlDeviceGetFieldValues, h, [fid])
for key, (func, *args) in calls.items():
    res[key] = timed(func, *args)
res["sweep_device"] = timed(nvml.sweep_device, n, 0, reps=20)
n.nvmlShutdown()
print(json.dumps(res))
"""

# The same calls, each timed once, in the sweep's order, in a fresh process: what the first
# sweep after nvmlInit costs call by call (repeated calls are served faster). Run 20 times.
PROFILE_COLD = """
import json, time
t = time.perf_counter()
from slurmhealth.node.sources import nvml, nvml_lib as n
res = {"import": time.perf_counter() - t}
def timed(key, func, *args):
    t = time.perf_counter()
    try:
        value = func(*args)
    except Exception:
        value = None
    res[key] = time.perf_counter() - t
    return value
timed("init", n.nvmlInit)
timed("driver_version", n.nvmlSystemGetDriverVersion)
timed("cuda_version", n.nvmlSystemGetCudaDriverVersion)
timed("count", n.nvmlDeviceGetCount)
h = timed("handle", n.nvmlDeviceGetHandleByIndex, 0)
for key, func, *args in (
    ("pci", n.nvmlDeviceGetPciInfo), ("uuid", n.nvmlDeviceGetUUID), ("name", n.nvmlDeviceGetName),
    ("serial", n.nvmlDeviceGetSerial), ("vbios", n.nvmlDeviceGetVbiosVersion),
    ("arch", n.nvmlDeviceGetArchitecture), ("memory", n.nvmlDeviceGetMemoryInfo),
    ("persistence", n.nvmlDeviceGetPersistenceMode),
    ("fields", n.nvmlDeviceGetFieldValues, list(nvml.FIELDS.values())),
    ("temperature", n.nvmlDeviceGetTemperature, 0),
    ("temp_threshold", n.nvmlDeviceGetTemperatureThreshold, 1),
    ("event_reasons", n.nvmlDeviceGetCurrentClocksEventReasons),
    ("pcie_max_gen", n.nvmlDeviceGetMaxPcieLinkGeneration),
    ("pcie_max_width", n.nvmlDeviceGetMaxPcieLinkWidth),
    ("pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration),
    ("pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth),
    ("app_clock_sm", n.nvmlDeviceGetApplicationsClock, 1),
    ("app_clock_mem", n.nvmlDeviceGetApplicationsClock, 2), ("mig", n.nvmlDeviceGetMigMode),
    ("processes", n.nvmlDeviceGetComputeRunningProcesses),
    ("fabric", n.nvmlDeviceGetGpuFabricInfo, n.byref(n.c_nvmlGpuFabricInfo_t())),
    ("nvlink0", n.nvmlDeviceGetNvLinkState, 0),
    ("sm_clock", n.nvmlDeviceGetClockInfo, 1), ("utilization", n.nvmlDeviceGetUtilizationRates),
    ("fields_again", n.nvmlDeviceGetFieldValues, list(nvml.FIELDS.values())),
):
    timed(key, func, h, *args)
timed("shutdown", n.nvmlShutdown)
print(json.dumps({k: round(v * 1e6) for k, v in res.items()}))
"""

# The first field-values call costs ~9 ms, most of it NVML's policy-time fields 74/75 (their
# latencyUsec): cold, in fresh processes, 10 each: the batch without them, them alone, both
# halves at once from two threads, nvmlDeviceGetViolationStatus (the same figures, nvml.h).
PROFILE_SPLIT = """
import ctypes, json, sys, threading, time
from slurmhealth.node.sources import nvml, nvml_lib as n
mode = sys.argv[1]
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
ids = list(nvml.FIELDS.values())
rest = [f for f in ids if f not in (74, 75)]
class V(ctypes.Structure):
    _fields_ = [("referenceTime", ctypes.c_ulonglong), ("violationTime", ctypes.c_ulonglong)]
def violation():
    f = n._function("nvmlDeviceGetViolationStatus")
    for policy in (0, 1):
        v = V()
        f(h, ctypes.c_uint(policy), ctypes.byref(v))
t = time.perf_counter()
if mode == "all":
    n.nvmlDeviceGetFieldValues(h, ids)
elif mode == "rest":
    n.nvmlDeviceGetFieldValues(h, rest)
elif mode == "only7475":
    n.nvmlDeviceGetFieldValues(h, [74, 75])
elif mode == "violation":
    violation()
elif mode == "rest_then_violation":
    n.nvmlDeviceGetFieldValues(h, rest)
    violation()
elif mode == "split_threads":
    other = threading.Thread(target=n.nvmlDeviceGetFieldValues, args=(h, [74, 75]))
    other.start()
    n.nvmlDeviceGetFieldValues(h, rest)
    other.join()
elif mode == "sweep_device":
    nvml.sweep_device(n, 0)
print(round((time.perf_counter() - t) * 1e6))
"""

# nvmlInit attaches every GPU; nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH = 2, nvml.h) leaves
# that to the first call on each GPU. Cold, fresh processes: init, then a whole device sweep.
PROFILE_INIT = """
import json, sys, time
from slurmhealth.node.sources import nvml, nvml_lib as n
flags = int(sys.argv[1])
t = time.perf_counter()
with n._lock:
    if not n._loaded:
        n._loaded.append(n.ctypes.CDLL("libnvidia-ml.so.1"))
n._call("nvmlInitWithFlags", n.ctypes.c_uint(flags))
t1 = time.perf_counter()
record = nvml.sweep_device(n, 0)
t2 = time.perf_counter()
print(json.dumps({"init": round((t1 - t) * 1e6), "sweep": round((t2 - t1) * 1e6),
                  "errors": record["errors"], "name": record.get("name")}))
"""

SWEEP = """
import json, time
t0 = time.perf_counter()
from slurmhealth.node.sources import nvml
binding = nvml._load()
t1 = time.perf_counter()
raw = nvml.sweep()
print(json.dumps({"import_ms": (t1 - t0) * 1000, **raw["timing_ms"]}))
"""


class Bench:
    def __init__(self, venv: str, out: str, runs: int) -> None:
        self.venv = os.path.abspath(venv)
        self.python = os.path.join(self.venv, "bin", "python")
        self.bin = os.path.join(self.venv, "bin", "slurmhealth")
        self.out = out
        self.runs = runs
        self.work = tempfile.mkdtemp(prefix="gpu-node-", dir="/var/tmp")
        self.details = os.path.join(self.work, "details")
        os.makedirs(self.details)
        self.summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.log_file = open(os.path.join(out, "log.txt"), "a", buffering=1)  # noqa: SIM115
        self.cfg = os.path.join(self.work, "slurmhealth.toml")
        self.state = os.path.join(self.work, "state")
        os.makedirs(self.state, mode=0o700)
        self.etc = os.path.join(self.work, "etc")

    def log(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.log_file.write(line + "\n")

    def save(self) -> None:
        path = os.path.join(self.out, "summary.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(self.summary, handle, indent=1, sort_keys=True, default=str)
        os.replace(path + ".tmp", path)

    def run(self, name: str, argv: list, env: dict | None = None, timeout: float = 60, **kw):
        """One command: its exit, wall ms, and its output saved under details/NAME.*"""
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, timeout=timeout, check=False, **kw
            )
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = "timeout", exc.stdout or b"", exc.stderr or b""
        except OSError as exc:
            code, out, err = f"oserror: {exc}", b"", b""
        wall = (time.perf_counter() - started) * 1000
        with open(os.path.join(self.details, f"{name}.out"), "wb") as handle:
            handle.write(out)
        with open(os.path.join(self.details, f"{name}.err"), "wb") as handle:
            handle.write(err)
        self.log(f"{name}: exit {code}, {wall:.0f} ms, {len(out)} B out, {len(err)} B err")
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), wall

    def env(self, **extra: str) -> dict:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        for key in PASSED:
            if os.environ.get(key):
                env[key] = os.environ[key]
        env.update(extra)
        return env

    # --- stages ---------------------------------------------------------------------------

    def live(self) -> None:
        s = self.summary.setdefault("live", {})
        s["nvidiactl"] = os.path.exists("/dev/nvidiactl")  # where the hooks start NVML early
        code, out, _, wall = self.run("nvidia-smi-q", ["nvidia-smi", "-q"], self.env())
        s["nvidia_smi_q_ms"] = round(wall, 1)
        shutil.copy(
            os.path.join(self.details, "nvidia-smi-q.out"), os.path.join(self.out, "nvidia-smi.txt")
        )
        self.run("nvidia-smi-perf", ["nvidia-smi", "-q", "-d", "PERFORMANCE"], self.env())
        self.run("nvidia-smi-L", ["nvidia-smi", "-L"], self.env())
        self.run("ldconfig-nvml", ["sh", "-c", "ldconfig -p | grep -i nvidia-ml"], self.env())
        self.run("uname", ["uname", "-a"], self.env())
        snap = os.path.join(self.out, "h200.json")
        code, *_ = self.run(
            "snapshot", [self.bin, "snapshot", "--node", NODE, "-o", snap], self.env()
        )
        s["snapshot_exit"] = code
        code, *_ = self.run(
            "genconf", [self.bin, "config", "genconf", "--node", NODE, "-o", self.cfg], self.env()
        )
        s["genconf_exit"] = code
        with open(self.cfg, "a") as handle:
            handle.write('\n[settings]\nslurm_bin = "/nonexistent"\n')
            handle.write(f'diag_python = "{shutil.which("python3") or sys.executable}"\n')
        shutil.copy(self.cfg, os.path.join(self.out, "genconf.toml"))
        for name, extra in (
            ("check-plain", ["--no-db"]),
            ("check-config", ["--config", self.cfg, "--db", os.path.join(self.state, "check.db")]),
            ("check-replay", ["--config", self.cfg, "--no-db", "--gpu-source", snap]),
        ):
            code, out, _, wall = self.run(
                name, [self.bin, "check", "--json", "--node", NODE, *extra], self.env()
            )
            s[name] = {"exit": code, "ms": round(wall, 1), **_verdicts(out)}
        live, replay = s["check-config"].get("results", {}), s["check-replay"].get("results", {})
        s["replay_differs"] = {
            k: [live.get(k), replay.get(k)]
            for k in set(live) | set(replay)
            if live.get(k) != replay.get(k)
        }
        self.save()

    def prolog(self) -> None:  # noqa: PLR0915 - one measured sequence, kept in order
        s = self.summary.setdefault("prolog", {})
        os.makedirs(self.etc, mode=0o755)
        conf = os.path.join(self.etc, "slurm.conf")
        open(conf, "w").close()
        with open(os.path.join(self.etc, "slurmhealth.env"), "w") as handle:
            handle.write(f"SLURMHEALTH_BIN={self.bin}\nSLURMHEALTH_CONFIG={self.cfg}\n")
            handle.write(f"SLURMHEALTH_STATE_DIR={self.state}\n")
        os.chmod(os.path.join(self.etc, "slurmhealth.env"), 0o644)
        hook_env = self.hook_env(conf, 0)
        code, _, err, _ = self.run("prolog-first", ["/bin/sh", HOOK], hook_env)
        s["first_exit"], s["first_stderr"] = code, err[-2000:]
        keys = (
            "pass",
            "prolog",
            "prolog_pynvml",
            "check_nodb",
            "check_db",
            "sweep",
            "sweep_pynvml",
        )
        series: dict = {k: [] for k in keys}
        sweeps_pynvml: list = []
        sweeps, gpu_seconds, codes = [], [], set()
        check = [self.bin, "check", "--json", "--node", NODE, "--config", self.cfg]
        db = os.path.join(self.state, "bench.db")
        for n in range(self.runs):
            series["pass"].append(timed([self.python, "-c", "pass"], self.env()))
            started = time.perf_counter()
            proc = subprocess.run(
                ["/bin/sh", HOOK], env=self.hook_env(conf, n + 1), capture_output=True, check=False
            )
            series["prolog"].append((time.perf_counter() - started) * 1000)
            codes.add(proc.returncode)
            pynvml_env = self.hook_env(conf, 100000 + n, SLURMHEALTH_NVML_BINDING="pynvml")
            series["prolog_pynvml"].append(timed(["/bin/sh", HOOK], pynvml_env))
            started = time.perf_counter()
            proc = subprocess.run(
                [*check, "--no-db"], env=self.env(), capture_output=True, check=False
            )
            series["check_nodb"].append((time.perf_counter() - started) * 1000)
            try:
                gpu_seconds.append(json.loads(proc.stdout)["sources"]["gpu"]["seconds"] * 1000)
            except (ValueError, KeyError, TypeError):
                pass
            series["check_db"].append(timed([*check, "--db", db], self.env()))
            for key, binding, kept in (
                ("sweep", "builtin", sweeps),
                ("sweep_pynvml", "pynvml", sweeps_pynvml),
            ):
                wall, doc, err = self.sweep_once(binding)
                series[key].append(wall)
                if doc is None:
                    s[f"{key}_error"] = err
                else:
                    kept.append(doc)
        s["exit_codes"] = sorted(codes)
        s["runs"] = self.runs
        for name, values in series.items():
            s[name] = _stats(values)
        s["gpu_source_ms"] = _stats(gpu_seconds)
        for key in ("import_ms", "init", "total"):
            s[f"inproc_{key}"] = _stats([x[key] for x in sweeps if key in x])
            s[f"inproc_pynvml_{key}"] = _stats([x[key] for x in sweeps_pynvml if key in x])
        s["store_ms_p50"] = round(s["check_db"]["p50"] - s["check_nodb"]["p50"], 1)
        s["ratio_prolog_to_pass"] = round(s["prolog"]["p50"] / s["pass"]["p50"], 2)
        s["importtime"] = self.importtime()
        s["importtime_pynvml"] = self.importtime(SLURMHEALTH_NVML_BINDING="pynvml")
        _, out, err, _ = self.run("profile", [self.python, "-c", PROFILE], self.env(), cwd="/")
        s["profile_us"] = _json(out) if out else err[-2000:]
        cold: dict = {}
        for _ in range(20):
            proc = subprocess.run(
                [self.python, "-c", PROFILE_COLD],
                env=self.env(),
                capture_output=True,
                check=False,
                cwd="/",
            )
            for key, value in _json(proc.stdout.decode()).items():
                cold.setdefault(key, []).append(value)
        s["profile_cold_us"] = {k: statistics.median(v) for k, v in cold.items() if k != "unparsed"}
        modes = (
            "all",
            "rest",
            "only7475",
            "violation",
            "rest_then_violation",
            "split_threads",
            "sweep_device",
        )
        split: dict = {m: [] for m in modes}
        for _ in range(10):
            for mode in modes:
                proc = subprocess.run(
                    [self.python, "-c", PROFILE_SPLIT, mode],
                    env=self.env(),
                    capture_output=True,
                    check=False,
                    cwd="/",
                )
                try:
                    split[mode].append(int(proc.stdout))
                except ValueError:
                    s.setdefault("split_errors", {})[mode] = proc.stderr.decode()[-500:]
        s["profile_split_cold_us"] = {k: _stats(v) for k, v in split.items()}
        init: dict = {}
        for _ in range(10):
            for flags in (0, 2):
                proc = subprocess.run(
                    [self.python, "-c", PROFILE_INIT, str(flags)],
                    env=self.env(),
                    capture_output=True,
                    check=False,
                    cwd="/",
                )
                doc = _json(proc.stdout.decode())
                row = init.setdefault(str(flags), {"init": [], "sweep": [], "errors": None})
                if "init" in doc:
                    row["init"].append(doc["init"])
                    row["sweep"].append(doc["sweep"])
                    row["errors"], row["name"] = doc["errors"], doc["name"]
                else:
                    row["errors"] = proc.stderr.decode()[-500:]
        s["profile_init_flags_us"] = {
            k: {
                "init": _stats(v["init"]),
                "sweep": _stats(v["sweep"]),
                "errors": v["errors"],
                "name": v.get("name"),
            }
            for k, v in init.items()
        }
        self.save()

    def sweep_once(self, binding: str) -> tuple:
        """(wall ms, the in-process timings or None, stderr) of SWEEP in a fresh process."""
        started = time.perf_counter()
        proc = subprocess.run(
            [self.python, "-c", SWEEP],
            env=self.env(SLURMHEALTH_NVML_BINDING=binding),
            capture_output=True,
            check=False,
            cwd="/",
        )
        wall = (time.perf_counter() - started) * 1000
        try:
            return wall, json.loads(proc.stdout), ""
        except ValueError:
            return wall, None, proc.stderr.decode("utf-8", "replace")[-2000:]

    def hook_env(self, conf: str, job: int, **extra: str) -> dict:
        env = {
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            "SLURM_CONF": conf,
            "SLURMD_NODENAME": NODE,
            "SLURM_JOB_ID": str(1000 + job),
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_GPUS": "0",
            "SLURM_CLUSTER_NAME": "bench",
        }
        for key in PASSED:
            if os.environ.get(key):
                env[key] = os.environ[key]
        env.update(extra)
        return env

    def importtime(self, **extra: str) -> dict:
        """Import times of the prolog, 10 runs: the whole and the heaviest top-level modules."""
        totals, heavy = [], {}
        env = self.env(
            SLURMD_NODENAME=NODE,
            SLURMHEALTH_CONFIG=self.cfg,
            SLURMHEALTH_STATE_DIR=self.state,
            SLURM_SCRIPT_CONTEXT="prolog_slurmd",
            SLURM_JOB_ID="99999",
            SLURM_JOB_GPUS="0",
            **extra,
        )
        for _ in range(10):
            proc = subprocess.run(
                [self.python, "-X", "importtime", self.bin, "prolog"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                cwd="/",
            )
            total = 0
            for line in proc.stderr.splitlines():
                if not line.startswith("import time:") or "cumulative" in line:
                    continue
                _, cumulative, name = line[len("import time:") :].split("|")
                if not name[1:].startswith(" "):
                    total += int(cumulative)
                    heavy.setdefault(name.strip(), []).append(int(cumulative))
            totals.append(total / 1000)
        top = sorted(((statistics.median(v) / 1000, k) for k, v in heavy.items()), reverse=True)[
            :10
        ]
        return {"total_ms": _stats(totals), "top_ms": [[k, round(v, 2)] for v, k in top]}

    def slurm_standin(self) -> str:
        """slurm.conf's folder for the fault prologs: its env file names a config whose
        slurm_bin is tests/fakeslurm (scontrol and sinfo stand-ins over a JSON file of 16 idle
        nodes), so the prolog acts as on a cluster: it drains, or its breaker holds."""
        etc = os.path.join(self.work, "etc-slurm")
        os.makedirs(etc, mode=0o755)
        cfg = os.path.join(self.work, "slurmhealth-slurm.toml")
        with open(self.cfg) as handle:
            text = handle.read().replace(
                'slurm_bin = "/nonexistent"', f'slurm_bin = "{REPO}/tests/fakeslurm"'
            )
        with open(cfg, "w") as handle:
            handle.write(text)
        with open(os.path.join(etc, "slurmhealth.env"), "w") as handle:
            handle.write(f"SLURMHEALTH_BIN={self.bin}\nSLURMHEALTH_CONFIG={cfg}\n")
        open(os.path.join(etc, "slurm.conf"), "w").close()
        return os.path.join(etc, "slurm.conf")

    def fault_prolog(
        self, name: str, conf: str, job: int, wrapper: tuple = (), **extra: str
    ) -> dict:
        """One prolog through the hook with a fresh node store and Slurm stand-in state."""
        folder = os.path.join(self.work, f"fault-{name}")
        os.makedirs(os.path.join(folder, "state"), mode=0o700)
        nodes = {f"gpu{i:02d}": {"state": "IDLE", "reason": ""} for i in range(1, 17)}
        slurm = os.path.join(folder, "slurm.json")
        with open(slurm, "w") as handle:
            json.dump(nodes, handle)
        env = self.hook_env(
            conf,
            job,
            SLURMHEALTH_STATE_DIR=os.path.join(folder, "state"),
            FAKE_SLURM_STATE=slurm,
            **extra,
        )
        code, _, err, wall = self.run(name, [*wrapper, "/bin/sh", HOOK], env, timeout=60)
        with open(slurm) as handle:
            after = json.load(handle)["gpu01"]
        try:
            with open(slurm + ".calls") as handle:
                calls = [json.loads(line)[:2] for line in handle]
        except OSError:
            calls = []
        return {
            "exit": code,
            "ms": round(wall, 1),
            "stderr": err[-1500:],
            "node_after": after,
            "slurm_calls": calls,
        }

    def faults(self) -> None:
        s = self.summary.setdefault("faults", {})
        conf = self.slurm_standin()
        check = [self.bin, "check", "--json", "--node", NODE, "--config", self.cfg, "--no-db"]
        # 1. a CUDA process left on GPU 0
        torch_python = shutil.which("python3")
        ready = os.path.join(self.work, "busy.ready")
        busy = None
        if torch_python:
            with open(os.path.join(self.details, "busy.err"), "wb") as err:
                busy = subprocess.Popen(
                    [torch_python, "-c", BUSY, ready, "90"],
                    stdout=err,
                    stderr=err,
                    start_new_session=True,
                )
            deadline = time.time() + 60
            while not os.path.exists(ready) and busy.poll() is None and time.time() < deadline:
                time.sleep(0.2)
        if busy and os.path.exists(ready):
            time.sleep(2)  # under load for a moment: clocks and the PCIe link up
            self.run(
                "snapshot-busy",
                [
                    self.bin,
                    "snapshot",
                    "--node",
                    NODE,
                    "-o",
                    os.path.join(self.out, "h200-busy.json"),
                ],
                self.env(),
            )
            code, out, _, wall = self.run("leftover-check", check, self.env())
            s["leftover_check"] = {"exit": code, "ms": round(wall, 1), **_verdicts(out)}
            s["leftover_prolog"] = self.fault_prolog("leftover-prolog", conf, 5000)
            os.killpg(busy.pid, 9)
            busy.wait()
            time.sleep(1)
            s["after_leftover_prolog"] = self.fault_prolog("after-leftover-prolog", conf, 5001)
        else:
            s["leftover"] = "skipped: no PyTorch program could start on the GPU (details/busy.err)"
        self.save()
        # 2. NVML unavailable: first without LD_LIBRARY_PATH, else the library hidden by a
        # bind mount in a private mount namespace
        env = {k: v for k, v in self.env().items() if k != "LD_LIBRARY_PATH"}
        code, out, _, wall = self.run("nolib-check", check, env)
        s["nolib_env"] = {"exit": code, "ms": round(wall, 1), **_verdicts(out)}
        lib = _nvml_library(self.python)
        s["nvml_library"] = lib
        if lib:
            script = f'mount --bind /dev/null "{lib}" && exec "$@"'
            code, out, _, wall = self.run(
                "hidden-check", ["unshare", "-m", "sh", "-c", script, "sh", *check], self.env()
            )
            s["hidden_check"] = {"exit": code, "ms": round(wall, 1), **_verdicts(out)}
            wrapper = ("unshare", "-m", "sh", "-c", script, "sh")
            s["hidden_prolog"] = self.fault_prolog("hidden-prolog", conf, 5002, wrapper)
        self.save()
        # 3. a hung NVML call
        proxy = os.path.join(self.work, "hang")
        os.makedirs(proxy)
        with open(os.path.join(proxy, "pynvml.py"), "w") as handle:
            handle.write(HANG_PROXY)
        with open(os.path.join(proxy, "sitecustomize.py"), "w") as handle:
            handle.write(HANG_BUILTIN)
        code, out, _, wall = self.run("hang-check", check, self.env(PYTHONPATH=proxy), timeout=60)
        s["hang_check"] = {"exit": code, "ms": round(wall, 1), **_verdicts(out)}
        s["hang_prolog"] = self.fault_prolog("hang-prolog", conf, 5003, PYTHONPATH=proxy)
        s["hang_prolog_pynvml"] = self.fault_prolog(
            "hang-prolog-pynvml", conf, 5004, PYTHONPATH=proxy, SLURMHEALTH_NVML_BINDING="pynvml"
        )
        self.save()

    def diagnose(self) -> None:
        s = self.summary.setdefault("diagnose", {})
        db = os.path.join(self.state, "diag.db")
        _, before, _, _ = self.run("fields-before", [self.python, "-c", FIELDS_NOW], self.env())
        for level, limit in (("quick", 150), ("medium", 330)):
            argv = [
                self.bin,
                "diagnose",
                "--level",
                level,
                "--json",
                "--node",
                NODE,
                "--config",
                self.cfg,
                "--db",
                db,
            ]
            code, out, _, wall = self.run(f"diagnose-{level}", argv, self.env(), timeout=limit)
            s[level] = {
                "exit": code,
                "seconds": round(wall / 1000, 1),
                "result": _diag_figures(out),
            }
            self.save()
            _, fields, _, _ = self.run(
                f"fields-after-{level}", [self.python, "-c", FIELDS_NOW], self.env()
            )
            self.run(
                f"nvidia-smi-perf-after-{level}",
                ["nvidia-smi", "-q", "-d", "PERFORMANCE"],
                self.env(),
            )
            s[f"fields_after_{level}"] = _json(fields)
        s["fields_before"] = _json(before)
        self.save()

    def finish(self) -> None:
        self.summary["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.save()
        with tarfile.open(os.path.join(self.out, "details.tar.gz"), "w:gz") as tar:
            tar.add(self.details, arcname="details")
            tar.add(self.state, arcname="state")


def _stats(values: list) -> dict:
    if not values:
        return {}
    return {
        "p50": round(statistics.median(values), 2),
        "p99": round(pct(values, 0.99), 2),
        "min": round(min(values), 2),
        "n": len(values),
    }


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return {"unparsed": text[-2000:]}


def _verdicts(out: str) -> dict:
    try:
        doc = json.loads(out)
    except ValueError:
        return {"unparsed": out[-2000:]}
    results = {
        r.get("check"): f"{r.get('status')}: {r.get('message')}" for r in doc.get("results", [])
    }
    sources = {
        k: {x: v.get(x) for x in ("status", "message", "seconds")}
        for k, v in (doc.get("sources") or {}).items()
    }
    return {"verdict": doc.get("verdict"), "results": results, "sources": sources}


def _diag_figures(out: str) -> dict:
    try:
        return json.loads(out)
    except ValueError:
        return {"unparsed": out[-4000:]}


def _nvml_library(python: str) -> str:
    """The libnvidia-ml file the binding loads, from the process's own map."""
    code = (
        "import pynvml; pynvml.nvmlInit(); "
        "print(next((l.split()[-1] for l in open('/proc/self/maps') if 'libnvidia-ml' in l), ''))"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--stages", default="live,prolog,faults,diagnose")
    opts = parser.parse_args()
    os.makedirs(opts.out, exist_ok=True)
    bench = Bench(opts.venv, opts.out, opts.runs)
    for stage in opts.stages.split(","):
        started = time.perf_counter()
        bench.log(f"stage {stage}")
        try:
            getattr(bench, stage)()
        except Exception as exc:  # record and go on: one broken stage must not cost the rest
            import traceback  # noqa: PLC0415

            bench.summary.setdefault("errors", {})[stage] = traceback.format_exc()[-3000:]
            bench.log(f"stage {stage} broke: {exc!r}")
        bench.summary.setdefault("stage_seconds", {})[stage] = round(
            time.perf_counter() - started, 1
        )
        bench.save()
    bench.finish()
    bench.log("done")


if __name__ == "__main__":
    main()
