"""Error counters over time: what a run records of the cumulative counters it read (pure).

Each run reads, per GPU, NVLink, HCA and port, counters that only grow until a reset: PCIe
replays, PCIe AER errors, corrected and uncorrected ECC errors, remapped rows, retired pages,
the time a power or thermal policy held the GPU back, NVLink replays, recoveries and CRC errors,
NVLink-C2C CRC errors and replays, IB symbol errors, link recoveries and receive errors. The
fleet turns them into rates (fleet/trends.py). Stored compactly (docs/trends.md): a reading
becomes a row only when it changed since this node's previous one, with `delta` the increase,
so a healthy node adds no rows at all:
- a first reading (a new node, device or source) is recorded only when it is not 0, with delta
  None: the history before it is unknown and is never counted as a rise;
- a value lower than the previous one is a reset (driver reload, GPU or HCA reset, reboot): the
  counter restarted at 0, so the increase is the value itself;
- gauges (the idle GPU's thermal margin, the PCIe link under load) are recorded when they moved
  by at least their band, with delta the signed change.

The baseline kept between runs (the store's `counters` baseline) holds the non-zero counters
only: {"v": {"<device>|<counter>": value}, "d": [devices seen]}. A device not yet seen has no
zeros to compare with, so its first readings are first readings.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any, TypedDict

    class CounterRow(TypedDict):
        """One counter reading to record (changes()): delta None for a first reading."""

        device: str
        counter: str
        time: float
        value: int
        delta: float | None
        label: str

# NVML field values per GPU (sources/nvml.py FIELDS) that are cumulative counters.
GPU_COUNTERS = (
    "pcie_replay",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "remap_correctable",
    "remap_uncorrectable",
    "retired_sbe",
    "retired_dbe",
    "perf_power_ns",
    "perf_thermal_ns",
    "c2c_crc",
    "c2c_replay",
    "c2c_replay_b2b",
)
LINK_COUNTERS = ("replay", "recovery", "crc")  # per NVLink: nvlink_<name>
PORT_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "link_downed",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
AER_TOTALS = {
    "correctable": "TOTAL_ERR_COR",
    "nonfatal": "TOTAL_ERR_NONFATAL",
    "fatal": "TOTAL_ERR_FATAL",
}
# Gauges and the change that is recorded (°C; PCIe generation and lanes: any change).
GAUGES = {"thermal_margin": 5.0, "pcie_gen": 1.0, "pcie_width": 1.0}


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        text = value.strip()
        return int(text) if text.isdigit() else None
    if isinstance(value, float) and 0 <= value < float("inf"):  # NaN compares false
        return int(value)
    return None


def aer_total(text: object, total: str) -> int | None:
    """The TOTAL_ERR_* line of an aer_dev_* file; None when absent or unreadable."""
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if name == total:
            return _int(count)
    return None


def bus(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" -> "0000:18:00.0", the address as sysfs and Xid lines say it."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}" if rest else bus_id.lower()


class _Read:
    """One run's readings: non-zero counters and gauges by key, the keys that could not be
    read (None, not a number: never taken for 0), the parent devices read."""

    __slots__ = ("missing", "seen", "values")

    def __init__(self) -> None:
        self.values: dict[str, tuple[int, str]] = {}  # key -> (value, label)
        self.missing: set[str] = set()
        self.seen: list[str] = []

    def add(self, device: str, name: str, raw: object, label: str) -> None:
        if raw in (0, "0"):  # the common case, and the cheapest: nothing to keep
            return
        value = _int(raw)
        if value is None:
            self.missing.add(f"{device}|{name}")
        elif value:
            self.values[f"{device}|{name}"] = (value, label)


_PCI_ADDRESS = "0123456789abcdefABCDEF:."  # what a bus id is made of; a snapshot's may lie


def _gpu(dev: dict[str, Any], out: _Read) -> None:
    bus_id = dev.get("bus_id")
    if dev.get("error") or not isinstance(bus_id, str) or not bus_id:
        return
    if bus_id.strip(_PCI_ADDRESS):  # not an address: it would forge keys (`|` splits them)
        return
    where_bus = bus(bus_id)
    device, label = f"gpu:{where_bus}", f"GPU {dev.get('index')}"
    fields = dev.get("fields")
    if isinstance(fields, dict):
        for name in GPU_COUNTERS:
            raw = fields.get(name)
            if raw or raw is None:  # 0, the common case, costs one lookup
                out.add(device, name, raw, label)
    aer = dev.get("aer")
    if isinstance(aer, dict):
        for name, total in AER_TOTALS.items():
            out.add(device, f"aer_{name}", aer_total(aer.get(name), total), label)
    for link in dev.get("nvlink") or ():
        if not isinstance(link, dict):
            continue
        if link.get("replay") or link.get("recovery") or link.get("crc"):
            number = link.get("link")
            if isinstance(number, int):
                for name in LINK_COUNTERS:
                    where = f"nvlink:{where_bus}:{number}"
                    out.add(where, f"nvlink_{name}", link.get(name), f"{label} link {number}")
    processes = dev.get("processes")
    temperature, slowdown = _int(dev.get("temperature")), _int(dev.get("temp_slowdown"))
    if processes == [] and temperature is not None and slowdown is not None:
        out.values[f"{device}|thermal_margin"] = (slowdown - temperature, label)
    if processes:  # an idle GPU lowers its link (nvidia-smi): judged only under load
        for name in ("pcie_gen", "pcie_width"):
            value = _int(dev.get(name))
            if value is not None:
                out.values[f"{device}|{name}"] = (value, label)
    out.seen.append(device)


def _hca(name: str, hca: dict[str, Any], out: _Read) -> None:
    if "|" in name:  # sysfs names hold none; a snapshot's could forge keys
        return
    aer = hca.get("aer")
    if isinstance(aer, dict):
        for key, total in AER_TOTALS.items():
            out.add(f"hca:{name}", f"aer_{key}", aer_total(aer.get(key), total), name)
    for port, facts in (hca.get("ports") or {}).items():
        counters = facts.get("counters") if isinstance(facts, dict) and "|" not in port else None
        if isinstance(counters, dict):
            device, label = f"ib:{name}:{port}", f"{name} port {port}"
            for counter in PORT_COUNTERS:
                out.add(device, counter, counters.get(counter), label)
    out.seen.append(f"hca:{name}")


def readings(gpu: object, ib: object) -> _Read:
    """The counters read from the raw `gpu` and `ib` sections of a run (None: that source was
    not read)."""
    out = _Read()
    if isinstance(gpu, dict):
        for dev in gpu.get("devices") or ():
            if isinstance(dev, dict):
                _gpu(dev, out)
    if isinstance(ib, dict):
        for name, hca in sorted((ib.get("devices") or {}).items()):
            if isinstance(hca, dict):
                _hca(name, hca, out)
    return out


def _parent(device: str) -> str:
    """The device a counter's zeros are known through: a GPU for its links, an HCA for its
    ports."""
    kind, _, rest = device.partition(":")
    if kind == "nvlink":
        return f"gpu:{rest.rpartition(':')[0]}"
    if kind == "ib":
        return f"hca:{rest.rpartition(':')[0]}"
    return device


def changes(
    before: object, now: _Read, when: float
) -> tuple[list[CounterRow], dict[str, Any]]:
    """(rows to record, the baseline to keep) for the readings `now` (readings()) at `when`.
    Rows: {"device", "counter", "time", "value", "delta", "label"}."""
    base = before if isinstance(before, dict) else {}
    kept = dict(base["v"]) if isinstance(base.get("v"), dict) else {}
    known = set(base["d"]) if isinstance(base.get("d"), list) else set()
    seen = set(now.seen)
    values = dict(now.values)
    for key, prev in kept.items():  # read as 0 now: a reset, unless it could not be read
        device = key.partition("|")[0]
        if key not in values and key not in now.missing and _parent(device) in seen:
            if key.partition("|")[2] not in GAUGES and prev:
                values[key] = (0, "")
    rows: list[CounterRow] = []
    for key, (value, label) in values.items():
        device, _, counter = key.partition("|")
        prev = kept.get(key)
        if counter in GAUGES:
            if isinstance(prev, (int, float)) and abs(value - prev) < GAUGES[counter]:
                continue
            delta = value - prev if isinstance(prev, (int, float)) else None
            kept[key] = value
        else:
            if not isinstance(prev, (int, float)):
                prev = 0 if _parent(device) in known else None
            if value == prev:
                continue
            delta = None if prev is None else (value - prev if value > prev else value)
            if value:
                kept[key] = value
            else:
                kept.pop(key, None)
        rows.append(
            {
                "device": device,
                "counter": counter,
                "time": when,
                "value": value,
                "delta": delta,
                "label": label or _label(device),
            }
        )
    return rows, {"v": kept, "d": sorted(known | seen)}


def _label(device: str) -> str:
    """A device's name for a row read as 0 (its label went with its readings): the device."""
    return device


def add_samples(before: object, facts: object) -> dict[str, list[int]]:
    """The SM clock and utilisation samples summed so far, with this run's added.

    NVML keeps no job-long figure for either, so each run that found a GPU running processes
    (the health checks during a job; node/sources/nvml.py `_sample`) adds its reading to a
    running sum kept in the node's GPU baseline: {index: [samples, SM MHz summed, utilisation %
    summed]}. Like a counter, the sum only grows: the prolog keeps the sums at the job's start,
    the epilog's sums minus those are the job's (job_telemetry). A GPU not sampled keeps its
    sums. before: the previous sums (anything else: none); facts: this run's parsed GPU facts.
    """
    kept: dict[str, list[int]] = {}
    if isinstance(before, dict):
        for index, sums in before.items():
            read = [_int(v) for v in sums] if isinstance(sums, list) else []
            sane = [v for v in read if v is not None]
            if len(read) == 3 and len(sane) == 3:
                kept[str(index)] = sane
    devices = facts.get("devices") if isinstance(facts, dict) else None
    for dev in devices or ():
        if not isinstance(dev, dict) or dev.get("error"):
            continue
        clock, util = _int(dev.get("sm_clock")), _int(dev.get("util_gpu"))
        if clock is None or util is None or util > 100:
            continue
        count, clocks, utils = kept.get(str(dev.get("index")), [0, 0, 0])
        kept[str(dev.get("index"))] = [count + 1, clocks + clock, utils + util]
    return kept


def _job_gpu(dev: object, wanted: set[str] | None, inventory: object) -> str | None:
    """The GPU's index when it is one of the job's and the same GPU as at the prolog."""
    if not isinstance(dev, dict) or dev.get("error"):
        return None
    index = str(dev.get("index"))
    if wanted is not None and index not in wanted:
        return None
    known = inventory.get(index) if isinstance(inventory, dict) else None
    if isinstance(known, dict) and known.get("uuid") not in (None, dev.get("uuid")):
        return None
    return index


def _grew(first: object, last: object) -> int | None:
    """last - first of a counter read at the prolog and at the epilog; None when either is
    missing or it fell (the driver reloaded during the job: the job's share is unknown)."""
    if isinstance(first, int) and isinstance(last, int) and last >= first:
        return last - first
    return None


def job_telemetry(
    start: object, facts: object, now: float, job_gpus: list[int] | None, samples: object = None
) -> dict[str, Any] | None:
    """What each of the job's GPUs did between its prolog and its epilog.

    start: the prolog's GPU baseline (checks/gpu.py baseline: `taken_at`, `energy` in mJ,
    `below_base` in ns, `samples` and `inventory` by index); facts: the epilog's GPU facts;
    now: the epilog's time; job_gpus: the job's GPU indexes (None: every GPU); samples: the
    epilog's sums (add_samples). Per GPU:
    - "j": joules used, from NVML's energy counter (field 83, mJ since the driver loaded);
    - "b": seconds the SM clock was held below its base clock (field 81, ns);
    - "u": [samples, mean SM clock MHz, mean utilisation %] of the health checks in between.
    A counter that fell (the driver reloaded during the job) and a GPU whose UUID changed (not
    the same GPU) are left out. Returns {"s": seconds, "j": {...}, "b": {...}, "u": {...}}
    ("b" and "u" only when not empty), or None when no GPU has a figure.
    """
    if not isinstance(start, dict) or not isinstance(facts, dict):
        return None
    taken = start.get("taken_at")
    if not isinstance(taken, (int, float)) or now <= taken:
        return None
    energy, below = _table(start.get("energy")), _table(start.get("below_base"))
    # no sums kept by the prolog (an older version's): the node's sums include time before it
    first_sums = start.get("samples") if isinstance(start.get("samples"), dict) else None
    wanted = None if job_gpus is None else {str(g) for g in job_gpus}
    out: dict[str, Any] = {"s": round(now - taken, 3), "j": {}}
    for dev in facts.get("devices") or ():
        index = _job_gpu(dev, wanted, start.get("inventory"))
        if index is None:
            continue
        fields = dev.get("fields") or {}
        used = _grew(energy.get(index), fields.get("energy_mj"))
        if used is not None:
            out["j"][index] = round(used / 1000.0, 1)
        slow = _grew(below.get(index), fields.get("below_base_ns"))
        if slow is not None:
            out.setdefault("b", {})[index] = round(slow / 1e9, 1)
        sampled = None if first_sums is None else _sampled(first_sums, samples, index)
        if sampled is not None:
            out.setdefault("u", {})[index] = sampled
    return out if out["j"] or "b" in out or "u" in out else None


def _table(value: object) -> dict[str, Any]:
    """A stored figure by GPU index, or {} when what is stored is not one."""
    return value if isinstance(value, dict) else {}


def _sampled(first: object, last: object, index: str) -> list[float] | None:
    """[samples, mean SM MHz, mean utilisation %] between two sums of one GPU, or None."""
    before = first.get(index, [0, 0, 0]) if isinstance(first, dict) else None
    after = last.get(index) if isinstance(last, dict) else None
    if not isinstance(after, list) or not isinstance(before, list) or len(before) != 3:
        return None
    count, clocks, utils = (_grew(a, b) for a, b in zip(before, after))
    if not count or clocks is None or utils is None:
        return None
    return [count, round(clocks / count), round(utils / count, 1)]


def below_share(figures: object) -> float | None:
    """The job's worst GPU's share of the job below base clocks (job_telemetry's "b" over its
    "s", at most 1), or None without that figure: the jobs row's `below_base`, which the fleet's
    held-back sweep reads instead of parsing every job's figures (fleet/telemetry.py
    clock_figures computes the same share from them)."""
    if not isinstance(figures, dict) or not isinstance(figures.get("b"), dict):
        return None
    span = figures.get("s")
    below = [v for v in figures["b"].values() if _int(v) is not None and not isinstance(v, str)]
    if not isinstance(span, (int, float)) or span <= 0 or not below:
        return None
    worst: float = max(below) / span
    return min(1.0, worst)
