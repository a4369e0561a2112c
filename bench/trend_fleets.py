"""Fleet models for validating the rising-counter finder, each with its own assumptions about
how healthy devices count errors (docs/trends.md, "Validation"). None of them is the project's
simulator (sim/simulate.py); each writes what a site's nodes would export: `counter` records
as node/counters.py makes them (one per reading that changed, `delta` its increase, None after a
counter reset), and a daily `run` per node that names its GPU model.

Every model: N nodes of two GPU classes (60% H100 with 8 GPUs, 18 NVLinks each, 8 IB ports; 40%
A100 with 8 GPUs, 12 NVLinks, 4 ports), D days, counters read every `step` seconds (the health
check's cadence: 5 minutes to an hour), each node at its own phase. Planted: a few nodes, each
on one series whose error rate rises tenfold from a random onset, two of three by more frequent
episodes (x10), one of three by more frequent (x3.3) and bigger (x3) ones.

- **drift**: episodes are a Poisson process whose rate drifts from day to day (log-normal, sd
  0.3); sizes geometric, mean 3.
- **workload**: errors follow the jobs a node runs: busy spells (mean 12 h) and idle gaps (mean
  3 h), each job with its own load (0.3-1.5x); idle at a tenth of the rate. Sizes heavy-tailed
  (Pareto, alpha 1.6); 3% of the devices that count are noisy but steady, 1-5 episodes a day
  with sizes of Pareto alpha 1.2. 5% of nodes are out for a day (no readings, counters reset
  when they return), and a driver rollout over days 8-10 resets every GPU counter once.
- **clustered**: episodes come in clusters (each one brings Poisson(0.8) more within about 20
  minutes: a marginal link retrains and fails again), the primary rate follows the week
  (weekdays 1.3x, weekends 0.5x), device rates spread widely (log-normal sd 1.5 around each
  counter's median), sizes log-normal (median 2, sd 1.2 in log).
"""

from __future__ import annotations

import json
import math
import random

DAY = 86400.0
HOUR = 3600.0
START = 20_000 * DAY  # a UTC midnight
MODELS = {
    "NVIDIA H100 80GB HBM3": {"share": 0.6, "links": 18, "ports": 8},
    "NVIDIA A100-SXM4-80GB": {"share": 0.4, "links": 12, "ports": 4},
}
# counter: (device kind, share of devices that ever count, median episodes a day of those)
KINDS = {
    "pcie_replay": ("gpu", 0.3, 1.0),
    "ecc_sbe_volatile": ("gpu", 0.1, 0.3),
    "aer_correctable": ("gpu", 0.1, 0.5),
    "nvlink_crc": ("nvlink", 0.02, 1.0),
    "symbol_error": ("ib", 0.2, 0.5),
    "link_error_recovery": ("ib", 0.05, 0.3),
}


def devices(model: str, kind: str) -> list:
    spec = MODELS[model]
    if kind == "gpu":
        return [(f"gpu:0000:{0x18 + 16 * g:02x}:00.0", f"GPU {g}") for g in range(8)]
    if kind == "nvlink":
        return [
            (f"nvlink:0000:{0x18 + 16 * g:02x}:00.0:{k}", f"GPU {g} link {k}")
            for g in range(8)
            for k in range(spec["links"])
        ]
    return [(f"ib:mlx5_{p}:1", f"mlx5_{p} port 1") for p in range(spec["ports"])]


def poisson(rng: random.Random, mu: float) -> int:
    if mu > 50:
        return max(0, round(rng.gauss(mu, math.sqrt(mu))))
    k, p, limit = 0, 1.0, math.exp(-mu)
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _geometric(rng: random.Random, mean: float) -> int:
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1 - 1 / mean))


def _pareto(rng: random.Random, alpha: float) -> int:
    return min(100_000, int((1.0 - rng.random()) ** (-1 / alpha)))


def _events(rng: random.Random, rate_at, start: float, end: float, peak: float) -> list:
    """Times of a Poisson process of rate_at(t) episodes/s in [start, end) (thinning; peak
    bounds the rate)."""
    out, t = [], start
    if peak <= 0:
        return out
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return out
        if rng.random() * peak < rate_at(t):
            out.append(t)


class Plant:
    def __init__(self, node: str, device: tuple, counter: str, onset: float, base: float, how: str):
        self.node, self.device, self.counter = node, device, counter
        self.onset, self.base, self.how = onset, base, how

    def episodes(self, t: float) -> float:
        return (10.0 if self.how == "often" else 3.3) if t >= self.onset else 1.0

    def size(self, t: float) -> float:
        return 3.0 if self.how == "bigger" and t >= self.onset else 1.0


class Fleet:
    """One planted fleet of a model: records() are the NDJSON records a site would import."""

    def __init__(self, model: str, seed: int, nodes: int, days: int, step: float, planted: int,
                 base: tuple = (2.0, 20.0)):
        self.model, self.days, self.step = model, days, step
        self.rng = random.Random(f"{model}-{seed}")  # noqa: S311 - a simulation
        rng = self.rng
        self.names = [f"gpu{i:04d}" for i in range(nodes)]
        self.models = {
            n: ("NVIDIA H100 80GB HBM3" if rng.random() < 0.6 else "NVIDIA A100-SXM4-80GB")
            for n in self.names
        }
        self.plants = {}
        for node in rng.sample(self.names, planted):
            counter = rng.choice(sorted(KINDS))
            device = rng.choice(devices(self.models[node], KINDS[counter][0]))
            onset = START + rng.uniform(days - 7, days - 3) * DAY
            base_rate = math.exp(rng.uniform(math.log(base[0]), math.log(base[1])))
            how = "bigger" if rng.random() < 1 / 3 else "often"
            self.plants[node] = Plant(node, device, counter, onset, base_rate, how)
        self.out = {n: None for n in self.names}
        if model == "workload":
            for n in rng.sample(self.names, max(1, nodes // 20)):
                day = rng.randrange(2, days - 1)
                self.out[n] = (START + day * DAY, START + (day + 1) * DAY)
        self.busy = {n: self._busy(n) for n in self.names} if model == "workload" else {}

    def _busy(self, node: str) -> list:
        """(start, end, load) spells of jobs on the node."""
        rng, t, spells = self.rng, START, []
        while t < START + self.days * DAY:
            length = rng.expovariate(1 / (12 * HOUR))
            spells.append((t, t + length, rng.uniform(0.3, 1.5)))
            t += length + rng.expovariate(1 / (3 * HOUR))
        return spells

    def _load(self, node: str, t: float) -> float:
        for start, end, load in self.busy[node]:
            if start <= t < end:
                return load
            if start > t:
                break
        return 0.1

    def records(self) -> list:
        lines = []
        for node in self.names:
            for day in range(self.days):
                if self._is_out(node, START + day * DAY + 60):
                    continue
                sources = {"gpu": {"status": "ok", "versions": {"model": [self.models[node]]}}}
                lines.append(_record("run", {
                    "id": f"{node}-{day}", "node": node, "phase": "check",
                    "started": START + day * DAY + 60, "duration": 0.05, "verdict": "ok",
                    "tool_version": "bench", "sources": json.dumps(sources),
                }))
            lines.extend(self._node_counters(node))
        return lines

    def _is_out(self, node: str, t: float) -> bool:
        out = self.out[node]
        return out is not None and out[0] <= t < out[1]

    def _node_counters(self, node: str) -> list:
        rng, model = self.rng, self.models[node]
        plant = self.plants.get(node)
        phase = rng.uniform(0, self.step)
        resets = self._resets(node)
        lines = []
        for counter, (kind, share, median) in KINDS.items():
            for device, label in devices(model, kind):
                planted = plant is not None and plant.device == (device, label) and (
                    plant.counter == counter
                )
                if not planted and rng.random() >= share:
                    continue
                events = self._series(node, counter, median, plant if planted else None)
                events = [(t, s) for t, s in events if not self._is_out(node, t)]
                reset_at = resets if kind == "gpu" else [r for r in resets if r[1] == "boot"]
                lines.extend(self._readings(node, device, label, counter, events, phase, reset_at))
        return lines

    def _resets(self, node: str) -> list:
        """(time, why) of the node's counter resets: back from a day out; the driver rollout."""
        out = []
        if self.out[node] is not None:
            out.append((self.out[node][1], "boot"))
        if self.model == "workload":
            out.append((START + self.rng.uniform(8, 10) * DAY, "driver"))
        return sorted(out)

    def _series(self, node: str, counter: str, median: float, plant: Plant | None) -> list:
        """(time, errors) episodes of one series over the record."""
        rng, end = self.rng, START + self.days * DAY
        model = self.model
        if plant is not None:
            rate = plant.base
        elif model == "clustered":
            rate = median * math.exp(rng.gauss(0, 1.5))
        else:
            rate = median * math.exp(rng.gauss(0, 1.0))
        noisy = model == "workload" and plant is None and rng.random() < 0.03
        if noisy:
            rate = rng.uniform(1, 5)
        per_s = rate / DAY
        if model == "drift":
            drift = [math.exp(rng.gauss(0, 0.3)) for _ in range(self.days)]

            def rate_at(t):
                day = min(self.days - 1, int((t - START) // DAY))
                return per_s * (1.0 if plant else drift[day]) * (plant.episodes(t) if plant else 1)

            peak = per_s * max(drift) * 10
        elif model == "workload":

            def rate_at(t):
                level = 1.0 if noisy else self._load(node, t)
                return per_s * level * (plant.episodes(t) if plant else 1)

            peak = per_s * 1.5 * 10
        else:

            def rate_at(t):
                weekday = int((t - START) // DAY) % 7 < 5
                return per_s * (1.3 if weekday else 0.5) * (plant.episodes(t) if plant else 1)

            peak = per_s * 1.3 * 10
        out = []
        for t in _events(rng, rate_at, START, end, peak):
            grow = plant.size(t) if plant else 1.0
            out.append((t, self._size(noisy) * grow))
            if model == "clustered":
                for _ in range(poisson(rng, 0.8)):
                    out.append((t + rng.expovariate(1 / (20 * 60)), self._size(False) * grow))
        return sorted((t, max(1, round(s))) for t, s in out if t < end)

    def _size(self, noisy: bool) -> float:
        rng = self.rng
        if self.model == "drift":
            return _geometric(rng, 3.0)
        if self.model == "workload":
            return _pareto(rng, 1.2 if noisy else 1.6)
        return math.exp(math.log(2) + rng.gauss(0, 1.2))

    def _readings(self, node, device, label, counter, events, phase, resets) -> list:
        """One record per reading whose counter changed; after a reset the first reading has
        delta None (the increase across a reset is unknown: node/counters.py)."""
        bins: dict = {}
        for t, size in events:
            reading = START + phase + math.ceil((t - START - phase) / self.step) * self.step
            bins[reading] = bins.get(reading, 0) + size
        lines, value, pending = [], 0, list(resets)
        for t in sorted(bins):
            delta = bins[t]
            if pending and t >= pending[0][0]:
                while pending and t >= pending[0][0]:
                    pending.pop(0)
                value = delta
                delta = None
            else:
                value += delta
            lines.append(_record("counter", {
                "node": node, "device": device, "counter": counter, "time": t,
                "value": value, "delta": delta, "label": label,
            }))
        return lines


def _record(kind: str, fields: dict) -> str:
    return json.dumps(dict(fields, type=kind))
