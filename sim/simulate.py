"""A simulated GPU fleet: N nodes x D days of jobs, checks, Xids and drains, with planted lemons.

The demo, the lemon validation (bench/validate_lemons.py) and the benchmarks use it. Everything
is deterministic per seed (one `random.Random(seed)`), pure Python, and every assumption is a
`Fleet` field, explained in docs/lemons.md:

- Hardware faults strike each node as a Poisson process at the cluster's base rate (drawn per
  seed from the literature's 2.34-6.50 per 1,000 node-days), k times that on a lemon; the
  fleet may hold GPU generations with their own rates (`generations`), and a lemon's faults may
  come in bursts (`lemon_burst`).
- A fault during a job is a hardware Xid (the job FAILED, the epilog fails and drains) or a crash
  (the job NODE_FAIL, Slurm takes the node down); on an idle node the next prolog (the job
  prolog_failed, drained) or the health check (drained) finds it. Then the node fails its health
  checks until repaired (or once: `repair_hours` 0), and slurmhealth resumes its own drains
  (none in monitor mode: `drains` False). Slurm accounting records a crash as a node event
  (`node_event_share` of them).
- Sub-fatal symptoms, warning Xids and health-check warnings, come on every node at a background
  rate, k times that on a lemon (the assumption that lets more evidence beat job failures alone).
- Users' faults: failed jobs and application Xids (13, 31) on all nodes alike.
- A fleet-wide incident: every node fails one health check for an hour; drains obey the
  circuit breaker (safety.may_drain_more).

events(fleet) builds a History (records, ground truth, breaker counts); signals() computes the
lemon signals from it in memory exactly as docs/signals.md defines them over a store;
write_store() writes the same history into a store.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import random
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from slurmhealth.core import safety, store
from slurmhealth.core.constants import ACT_BREAKER, ACT_DRAIN, ACT_RESUME, LEMON
from slurmhealth.core.result import counted
from slurmhealth.fleet import faults as faultlib
from slurmhealth.fleet import policy
from slurmhealth.node.runner import VERSIONS_EVERY

DAY = 86400
EPOCH = 1_704_067_200  # 2024-01-01 00:00 UTC
LITERATURE_RATES = (2.34e-3, 6.50e-3)  # hardware failures per node-day: Meta RSC-2, RSC-1


# Xids by class, as checks/xid.py classifies them.
HW_XIDS = (79, 48, 94, 95, 119, 74, 64)
WARN_XIDS = (92, 63, 154, 32, 69)
APP_XIDS = (13, 31)
FAULT_CHECKS = (
    ("gpu.count", "7 GPUs visible, 8 expected", "reboot"),
    ("gpu.ecc", "GPU 3: 2 uncorrectable ECC errors (volatile)", "reset_gpu"),
    ("nvlink.link_state", "GPU 5: NVLink 4 inactive", "reset_gpu"),
    ("ib.port_state", "mlx5_2 port 1: DOWN (expected ACTIVE)", "service"),
)
WARN_CHECKS = (
    ("ib.counters", "mlx5_1 port 1: 37 new symbol errors", "none"),
    ("gpu.memory_errors", "GPU 2: 120 new corrected ECC errors", "none"),
    ("gpu.thermal", "GPU 6: 87 C, slowdown at 90 C", "none"),
)
INCIDENT_CHECK = ("ib.port_state", "mlx5_0 port 1: DOWN (expected ACTIVE)", "service")


@dataclass
class Fleet:
    """A simulated cluster; every field is an assumption of the model (docs/lemons.md)."""

    nodes: int = 512
    days: int = 28
    seed: int = 0
    lemons: dict = field(default_factory=dict)  # {node name: k}: k times the base fault rate
    base_rate: float | None = None  # faults per node-day; None: drawn in LITERATURE_RATES
    lemon_burst: int = 1  # a lemon's faults come in bursts of this many (same mean rate)
    generations: tuple = ()  # ((share, factor), ...): consecutive node blocks, base rate x factor
    jobs_per_node_day: float = 4.0  # job rows per node-day (a multi-node job has one per node)
    utilization: float = 0.8  # share of node time in jobs
    multi_node_share: float = 0.2  # share of jobs that span nodes...
    multi_node_sizes: tuple = (2, 4, 8)  # ...and their sizes, equally likely
    job_fail_share: float = 0.08  # users' failed jobs (no hardware evidence)
    app_xid_share: float = 0.03  # users' jobs that fail with an application Xid (13/31)
    warn_xid_rate: float = 0.05  # warning Xids per node-day, healthy node (lemon: k x)
    check_warn_rate: float = 0.1  # health-check warnings per node-day, healthy (lemon: k x)
    warn_factor: float | None = None  # a lemon's warning rates: this times healthy; None: k
    warn_repeat: float = 0.3  # chance a check warning shows again at the next health check
    xid_in_job_share: float = 0.5  # fault during a job: hardware Xid; else the node crashes
    prolog_share: float = 0.3  # fault on an idle node found by the next prolog; else the check
    repair_hours: float = 2.0  # mean time a faulty node keeps failing its health checks; 0: once
    repair_min_s: int | None = None  # a repair's least length; None: one health-check interval
    node_event_share: float = 1.0  # crashes that Slurm accounting records as a node event
    drains: bool = True  # False: monitor mode, slurmhealth records no drain/resume/breaker
    healthcheck_interval: int = 300  # seconds (Slurm HealthCheckInterval)
    incident_day: int | None = 14  # None: no incident
    incident_hours: float = 1.0  # from 10:00 UTC of incident_day
    breaker_share: float = 0.10
    breaker_window: int = 3600
    start: int = EPOCH
    prefix: str = "gpu"
    drifted: int = 3  # nodes off the fleet's driver, VBIOS or HCA firmware (one kind each)

    def names(self) -> list:
        width = max(4, len(str(self.nodes)))
        return [f"{self.prefix}{i:0{width}d}" for i in range(1, self.nodes + 1)]

    @property
    def end(self) -> int:
        return self.start + self.days * DAY


def pick_lemons(fleet: Fleet, count: int, k: float) -> dict:
    """`count` distinct nodes of the fleet, chosen by its seed, each k times the base rate."""
    chosen = random.Random(f"lemons-{fleet.seed}").sample(fleet.names(), count)  # noqa: S311
    return {name: k for name in sorted(chosen)}


def generation_of(fleet: Fleet) -> list:
    """Each node's index in fleet.generations: consecutive blocks of nodes by share (all 0
    when the fleet has no generations)."""
    shares = [share for share, _factor in fleet.generations]
    if not shares:
        return [0] * fleet.nodes
    factors = [factor for _share, factor in fleet.generations]
    if min(shares + factors) < 0 or abs(sum(shares) - 1) > 1e-6:
        raise ValueError("generations: shares and factors must be >= 0, shares add up to 1")
    out: list = []
    total = 0.0
    for g, share in enumerate(shares):
        total += share
        out += [g] * (round(total * fleet.nodes) - len(out))
    return (out + [len(shares) - 1] * fleet.nodes)[: fleet.nodes]


def _validate(fleet: Fleet) -> None:
    if not 0 < fleet.healthcheck_interval <= DAY:
        raise ValueError("healthcheck_interval must be within (0, 86400] s")
    if not isinstance(fleet.lemon_burst, int) or fleet.lemon_burst < 1:
        raise ValueError("lemon_burst must be a whole number >= 1")
    if fleet.repair_hours < 0 or (fleet.repair_min_s is not None and fleet.repair_min_s < 1):
        raise ValueError("repair_hours must be >= 0 and repair_min_s >= 1 s")
    if not 0 <= fleet.node_event_share <= 1:
        raise ValueError("node_event_share must be within [0, 1]")


@dataclass
class History:
    """What a store would hold after the simulated weeks, plus the ground truth.

    Runs that were ok are implied, not listed: a health check at every slot of each node, a
    prolog at each job row's start and an epilog at its end (when it has one). `runs` lists
    those that were not ok, with the same ids.
    """

    fleet: Fleet
    names: list
    offsets: list  # each node's health-check phase, seconds after fleet.start
    base_rate: float
    jobs: list  # (node, job_id, start, end, num_nodes, state, slurm_state, uid, user, exit)
    runs: list  # (id, node, job_id, phase, started, verdict, check, message, action)
    events: list  # (id, run_id, node, job_id, time, code, class, gpu)
    actions: list  # (id, node, time, action, reason, actor, ok, detail)
    faults: dict  # ground truth: {node: [times the node's hardware faults were recorded]}
    breaker: dict  # cap, attempts, drained, stopped, max_in_window, incident_*
    node_events: list = field(default_factory=list)  # (node, start, end, state, reason)
    generation: list = field(default_factory=list)  # each node's index in fleet.generations

    def slots(self, i: int) -> int:
        """How many health-check slots node i has in the simulated period."""
        span, step = self.fleet.days * DAY, self.fleet.healthcheck_interval
        return max(0, math.ceil((span - self.offsets[i]) / step))

    def slot_time(self, i: int, slot: int) -> int:
        return self.fleet.start + self.offsets[i] + slot * self.fleet.healthcheck_interval


class _Job:
    __slots__ = (
        "id",
        "start",
        "end",
        "nodes",
        "size",
        "state",
        "uid",
        "app_xid",
        "crashed",
        "pfailed",
    )

    def __init__(self, start: int, end: int, nodes: list, state: str, uid: int, app: bool):
        self.id, self.start, self.end, self.nodes = "", start, end, nodes
        self.size = len(nodes)  # num_nodes as Slurm saw it, even if one node drops out
        self.state, self.uid, self.app_xid = state, uid, app
        self.crashed: set = set()  # nodes that crashed under it (no epilog there)
        self.pfailed: set = set()  # nodes whose prolog failed (the job ran elsewhere)

    def row_end(self, i: int) -> int:
        return self.start + 5 if i in self.pfailed else self.end


class _Builder:
    """Builds one History; the steps run in order, each a short method."""

    def __init__(self, fleet: Fleet) -> None:
        _validate(fleet)
        self.f = fleet
        self.rng = random.Random(fleet.seed)  # noqa: S311 - a simulation, not a secret
        self.names = fleet.names()
        self.index = {n: i for i, n in enumerate(self.names)}
        unknown = set(fleet.lemons) - set(self.index)
        if unknown:
            raise ValueError(f"lemons not in the fleet: {sorted(unknown)}")
        lo, hi = LITERATURE_RATES
        self.base = fleet.base_rate if fleet.base_rate is not None else self.rng.uniform(lo, hi)
        step = fleet.healthcheck_interval
        self.offsets = [self.rng.randrange(step) for _ in self.names]
        self.hist = History(fleet, self.names, self.offsets, self.base, [], [], [], [], {}, {})
        self.hist.generation = generation_of(fleet)
        # Its own stream: which crashes accounting records leaves the rest of the history alone.
        self.event_rng = random.Random(f"events-{fleet.seed}")  # noqa: S311
        self.marks: list = [{} for _ in self.names]  # per node: {slot: (verdict, check, ...)}
        self.job_runs: dict = {}  # explicit prolog/epilog runs by id
        self.attempts: list = []  # drain attempts: (time, node, actor, reason, release)
        self.out: list = [[] for _ in self.names]  # per node: [(from, until)] out of service
        self.node_jobs: list = [[] for _ in self.names]

    def k(self, i: int) -> float:
        return self.f.lemons.get(self.names[i], 1.0)

    def rate(self, i: int) -> float:
        """Node i's base fault rate per node-day: the cluster's, times its generation's factor."""
        gens = self.f.generations
        return self.base * gens[self.hist.generation[i]][1] if gens else self.base

    def warn_k(self, i: int) -> float:
        lemon = self.names[i] in self.f.lemons
        return self.k(i) if self.f.warn_factor is None or not lemon else self.f.warn_factor

    # --- jobs -------------------------------------------------------------------------------

    def jobs(self) -> None:
        """Jobs arrive at random and take whole nodes (exclusive, as training jobs on 8-GPU
        nodes do): each goes to randomly chosen free nodes, or waits for the first to free up."""
        f, rng = self.f, self.rng
        sizes = f.multi_node_sizes
        spread = 1 + f.multi_node_share * (sum(sizes) / len(sizes) - 1)
        count = round(f.nodes * f.days * f.jobs_per_node_day / spread)
        mean = f.utilization * DAY / f.jobs_per_node_day
        arrivals = sorted(f.start + int(rng.random() * f.days * DAY) for _ in range(count))
        busy = [(f.start, i) for i in range(f.nodes)]  # (free from, node), a heap
        free: list = []  # (free from, node) of nodes free by the latest arrival
        jobs = []
        for arrival in arrivals:
            size = min(rng.choice(sizes) if rng.random() < f.multi_node_share else 1, f.nodes)
            while busy and (busy[0][0] <= arrival or len(free) < size):
                free.append(heapq.heappop(busy))
            chosen = []
            for _ in range(size):
                pick = rng.randrange(len(free))
                free[pick], free[-1] = free[-1], free[pick]
                chosen.append(free.pop())
            start = max(arrival, *(t for t, _ in chosen))
            if start >= f.end:  # would start after the simulated weeks
                free.extend(chosen)
                continue
            end = start + max(60, int(rng.expovariate(1 / mean)))
            for _, i in chosen:
                heapq.heappush(busy, (end, i))
            draw = rng.random()
            state = "FAILED" if draw < f.app_xid_share + f.job_fail_share else "COMPLETED"
            nodes = [i for _, i in chosen]
            jobs.append(_Job(start, end, nodes, state, rng.randrange(50), draw < f.app_xid_share))
        jobs.sort(key=lambda j: j.start)
        for number, job in enumerate(jobs):
            job.id = str(1_000_001 + number)
            for i in job.nodes:
                self.node_jobs[i].append(job)
        self.all_jobs = jobs

    def running(self, i: int, t: int) -> list:
        return [j for j in self.node_jobs[i] if j.start <= t < j.row_end(i)]

    def next_job(self, i: int, t: int) -> _Job | None:
        starts = [j.start for j in self.node_jobs[i]]
        at = bisect.bisect_right(starts, t)
        return self.node_jobs[i][at] if at < len(starts) else None

    # --- health-check slots -----------------------------------------------------------------

    def slot_range(self, i: int, a: float, b: float) -> range:
        """Slots of node i with times in [a, b)."""
        step, base = self.f.healthcheck_interval, self.f.start + self.offsets[i]
        first = max(0, math.ceil((a - base) / step))
        last = min(self.hist.slots(i), math.ceil((b - base) / step))
        return range(first, max(first, last))

    def mark(self, i: int, slot: int, verdict: str, check: tuple) -> None:
        if verdict == "fail" or self.marks[i].get(slot, ("ok",))[0] != "fail":
            self.marks[i][slot] = (verdict, *check)

    # --- hardware faults --------------------------------------------------------------------

    def faults(self) -> None:
        """Faults strike as a Poisson process; a lemon's come in bursts of fleet.lemon_burst
        (bursts at 1/lemon_burst the rate), the next fault of a burst 2-12 hours after the
        node is back."""
        f, rng = self.f, self.rng
        strikes = []  # (time, node, faults of its burst still to come), a heap
        for i in range(f.nodes):
            burst = f.lemon_burst if self.names[i] in f.lemons else 1
            rate = self.rate(i) * self.k(i) / burst / DAY
            t = f.start + rng.expovariate(rate)
            while t < f.end - 600:  # a fault in the last minutes would show after the end
                strikes.append((int(t), i, burst - 1))
                t += rng.expovariate(rate)
        heapq.heapify(strikes)
        while strikes:
            t, i, more = heapq.heappop(strikes)
            back = self.strike(t, i)
            after = back + int(rng.uniform(2, 12) * 3600) if more else f.end
            if after < f.end - 600:
                heapq.heappush(strikes, (after, i, more - 1))

    def strike(self, t: int, i: int) -> int:
        """A fault strikes node i at t; returns when the node is back in service."""
        out = self.out[i]
        if out and t < out[-1][1]:
            return out[-1][1]  # still failing from the last fault: the same fault
        count = len(out)
        self.fault(t, i)
        return out[-1][1] if len(out) > count else t

    def fault(self, t: int, i: int) -> None:
        running = self.running(i, t)
        if running and self.rng.random() < self.f.xid_in_job_share:
            self.xid_fault(t, i, running)
        elif running:
            self.crash(t, i, running)
        else:
            job = self.next_job(i, t)
            if job is not None and self.rng.random() < self.f.prolog_share:
                self.prolog_fault(i, job)
            else:
                self.check_fault(t, i)

    def repair(self, i: int, at: int, check: tuple, actor: str | None, since: int = 0) -> int:
        """The node fails its health checks from `at` until repaired (at least one; only one
        when repair_hours is 0: a transient fault); drained by `actor`; out of service (no new
        jobs) from `since` (default `at`). Returns the end of the repair."""
        f = self.f
        hours = self.rng.expovariate(1 / f.repair_hours) if f.repair_hours else 0.0
        least = f.healthcheck_interval if f.repair_min_s is None else f.repair_min_s
        until = at + max(least, int(hours * 3600))
        failing = self.slot_range(i, at, until) if f.repair_hours else range(0)
        failing = failing or self.slot_range(i, at, f.end)[:1]
        for slot in failing:
            self.mark(i, slot, "fail", check)
        if failing:  # back after its last failing check, never before
            until = max(until, self.hist.slot_time(i, failing[-1]) + 1)
        if actor:
            self.attempts.append((at, i, actor, check[1], until))
        since = min(since or at, at)
        self.out[i].append((since, until))
        self.hist.faults.setdefault(self.names[i], []).append(at)
        for job in [j for j in self.node_jobs[i] if since <= j.start < until]:
            if i not in job.pfailed:  # the scheduler sends nothing to a node that is out
                job.nodes.remove(i)
                self.node_jobs[i].remove(job)
        return until

    def job_run(self, i: int, job: _Job, phase: str, when: int, check: tuple) -> str:
        run_id = f"{self.names[i]}:{phase}:{job.id}"
        self.job_runs[run_id] = (run_id, self.names[i], job.id, phase, when, "fail", *check)
        return run_id

    def xid(self, i: int, run_id: str, job_id: str | None, when: int, code: int, cls: str):
        number = len(self.hist.events)
        event_id = f"xid:{self.names[i]}:sim{self.f.seed}:{number}:{code}"
        gpu = self.rng.randrange(8)
        self.hist.events.append((event_id, run_id, self.names[i], job_id, when, code, cls, gpu))
        return gpu

    def xid_fault(self, t: int, i: int, running: list) -> None:
        """A hardware Xid kills the job; its epilog finds the Xid, fails and drains."""
        code, end = self.rng.choice(HW_XIDS), t + 30
        check = ("xid.hardware", f"Xid {code} on a GPU: hardware fault", "reset_gpu")
        for job in running:
            job.end, job.state, job.app_xid = min(job.end, end), "FAILED", False
            self.job_run(i, job, "epilog", job.end, check)
        first = running[0]
        self.xid(i, f"{self.names[i]}:epilog:{first.id}", first.id, first.end, code, "fail")
        self.repair(i, first.end, check, "slurmhealth epilog")

    def crash(self, t: int, i: int, running: list) -> None:
        """The node crashes under its jobs (NODE_FAIL); Slurm takes it down, not us."""
        for job in running:
            job.state, job.end, job.app_xid = "NODE_FAIL", min(job.end, t + 60), False
            job.crashed.add(i)
        back = self.repair(i, t, self.rng.choice(FAULT_CHECKS), None, since=t)
        if self.event_rng.random() < self.f.node_event_share:  # sacctmgr show event
            end = back if back < self.f.end else None  # still down when the history ends
            self.hist.node_events.append((self.names[i], t, end, "DOWN", "Not responding"))

    def prolog_fault(self, i: int, job: _Job) -> None:
        """The next job's prolog finds the fault: the job is requeued, the node drained."""
        check = self.rng.choice(FAULT_CHECKS)
        job.pfailed.add(i)
        self.job_run(i, job, "prolog", job.start, check)
        self.job_run(i, job, "epilog", job.row_end(i), check)
        self.repair(i, job.start, check, "slurmhealth prolog")

    def check_fault(self, t: int, i: int) -> None:
        """The health check finds it, sometimes with a hardware Xid in the kernel log."""
        slots = self.slot_range(i, t, self.f.end)
        if not slots:
            return
        check = self.rng.choice(FAULT_CHECKS)
        at = self.hist.slot_time(i, slots[0])
        if self.rng.random() < 0.5:
            run_id = f"{self.names[i]}:healthcheck:{slots[0]}"
            self.xid(i, run_id, None, at, self.rng.choice(HW_XIDS), "fail")
        self.repair(i, at, check, "slurmhealth healthcheck", since=t)

    # --- sub-fatal symptoms, users' faults, the incident ------------------------------------

    def warnings(self) -> None:
        f, rng = self.f, self.rng
        for i in range(f.nodes):
            for rate, kind in ((f.warn_xid_rate, "xid"), (f.check_warn_rate, "check")):
                t = f.start + rng.expovariate(rate * self.warn_k(i) / DAY)
                while t < f.end:
                    slots = self.slot_range(i, t, f.end)
                    if slots:
                        self.warning(i, slots[0], kind)
                    t += rng.expovariate(rate * self.warn_k(i) / DAY)

    def warning(self, i: int, slot: int, kind: str) -> None:
        if kind == "xid":
            code, when = self.rng.choice(WARN_XIDS), self.hist.slot_time(i, slot)
            run_id = f"{self.names[i]}:healthcheck:{slot}"
            self.xid(i, run_id, self.claimed_by(i, when), when, code, "warn")
            self.mark(i, slot, "warn", ("xid.hardware", f"Xid {code}: recorded", "none"))
            return
        check = self.rng.choice(WARN_CHECKS)
        self.mark(i, slot, "warn", check)
        while self.rng.random() < self.f.warn_repeat and slot + 1 < self.hist.slots(i):
            slot += 1
            self.mark(i, slot, "warn", check)

    def claimed_by(self, i: int, when: int) -> str | None:
        """The job whose epilog will claim an Xid a health check read while it ran (its
        epilog runs: the node did not crash under it and it ends within the period)."""
        for job in self.running(i, when):
            if i not in job.crashed and i not in job.pfailed and job.end < self.f.end:
                return job.id
        return None

    def incident(self) -> None:
        f = self.f
        if f.incident_day is None or not 0 <= f.incident_day < f.days:
            return
        begin = f.start + f.incident_day * DAY + 10 * 3600
        end = begin + int(f.incident_hours * 3600)
        self.hist.breaker.update(incident_start=begin, incident_end=end)
        for i in range(f.nodes):
            slots = self.slot_range(i, begin, end)
            if not slots:
                continue
            for slot in slots:
                self.mark(i, slot, "fail", INCIDENT_CHECK)
            at = self.hist.slot_time(i, slots[0])
            if not any(a <= at < b for a, b in self.out[i]):
                self.attempts.append((at, i, "slurmhealth healthcheck", INCIDENT_CHECK[1], end))

    # --- drains under the circuit breaker ---------------------------------------------------

    def drains(self) -> None:
        f, acts = self.f, []
        recent: deque = deque()
        drained_until = [0] * f.nodes
        stats = self.hist.breaker
        stats.update(cap=safety.allowed_drains(0, f.nodes, f.breaker_share))
        stats.update(attempts=0, drained=0, stopped=0, max_in_window=0)
        if not f.drains:  # monitor mode: Slurm and the admins take faulty nodes out, not us
            return
        for at, i, actor, message, release in sorted(self.attempts):
            if drained_until[i] > at:
                continue  # ours already: the hook drains a node once
            while recent and recent[0] <= at - f.breaker_window:
                recent.popleft()
            stats["attempts"] += 1
            reason = f"slurmhealth: {message}"
            if not safety.may_drain_more(len(recent), f.nodes, f.breaker_share):
                detail = (
                    f"circuit breaker: {len(recent)} of {counted(f.nodes, 'node')} drained by "
                    "slurmhealth "
                    f"in {f.breaker_window / 60:g} min (max {f.breaker_share:.0%})"
                )
                acts.append((self.names[i], at, ACT_BREAKER, reason, actor, 0, detail))
                stats["stopped"] += 1
                continue
            recent.append(at)
            stats["drained"] += 1
            stats["max_in_window"] = max(stats["max_in_window"], len(recent))
            acts.append((self.names[i], at, ACT_DRAIN, reason, actor, 1, ""))
            slots = self.slot_range(i, release, f.end)
            drained_until[i] = self.hist.slot_time(i, slots[0]) if slots else f.end
            if slots:
                why = f"1 passing health checks after: {reason}"
                acts.append((self.names[i], drained_until[i], ACT_RESUME, why, actor, 1, ""))
        acts.sort(key=lambda a: (a[1], a[0]))
        self.hist.actions = [(f"sim{f.seed}-a{n}", *a) for n, a in enumerate(acts)]

    # --- the records ------------------------------------------------------------------------

    def finish(self) -> History:
        h = self.hist
        for job in self.all_jobs:
            for i in job.nodes:
                h.jobs.append(self.job_row(job, i))
                if job.app_xid and i == job.nodes[0] and self.ends_normally(job, i):
                    run_id = f"{self.names[i]}:epilog:{job.id}"
                    self.xid(i, run_id, job.id, job.end, self.rng.choice(APP_XIDS), "app")
        h.jobs.sort(key=lambda r: (r[2], r[0]))
        runs = list(self.job_runs.values())
        for i, marks in enumerate(self.marks):
            for slot, (verdict, *check) in marks.items():
                run_id = f"{self.names[i]}:healthcheck:{slot}"
                when = h.slot_time(i, slot)
                runs.append((run_id, self.names[i], None, "healthcheck", when, verdict, *check))
        runs.sort(key=lambda r: (r[4], r[0]))
        h.runs = runs
        h.events.sort(key=lambda e: (e[4], e[0]))
        h.node_events.sort(key=lambda e: (e[1], e[0]))
        return h

    def ends_normally(self, job: _Job, i: int) -> bool:
        return (
            job.end < self.f.end
            and i not in job.crashed
            and i not in job.pfailed
            and job.state == "FAILED"
        )

    def job_row(self, job: _Job, i: int) -> tuple:
        if i in job.pfailed:
            state, end = "prolog_failed", job.row_end(i)
        elif job.end >= self.f.end:
            state, end = "running", None
        elif i in job.crashed:  # no epilog ran; the end is accounting's (collect --sacct)
            state, end = "running", job.end
        else:
            state, end = "ended", job.end
        slurm_state = job.state if job.end < self.f.end else "RUNNING"
        exit_code = {"COMPLETED": 0, "FAILED": 1}.get(slurm_state) if state == "ended" else None
        user = f"user{job.uid:02d}"
        return (
            self.names[i],
            job.id,
            job.start,
            end,
            job.size,
            state,
            slurm_state,
            10_000 + job.uid,
            user,
            exit_code,
        )


def events(fleet: Fleet) -> History:
    """Simulate the fleet: its history of records, with the ground truth."""
    b = _Builder(fleet)
    b.jobs()
    b.faults()
    b.warnings()
    b.incident()
    b.drains()
    return b.finish()


# --- signals in memory (docs/signals.md) -----------------------------------------------------


def _run_days(h: History, start: float, end: float) -> dict:
    """{node: set of UTC days in [start, end) in service: with a run that did not fail (every
    health-check slot, every job row's prolog and, when it has one, epilog) or a job's start}."""
    f = h.fleet
    lo, hi = max(start, f.start), min(end, f.end)
    failed = {r[0] for r in h.runs if r[5] == "fail"}
    failed_slots: dict = {}  # node: {day: failed health checks}
    index = {node: i for i, node in enumerate(h.names)}
    for run_id in failed:
        node, phase, slot = run_id.rsplit(":", 2)
        if phase == "healthcheck" and node in index:
            at = h.slot_time(index[node], int(slot))
            if lo <= at < hi:
                day = failed_slots.setdefault(node, {})
                day[int(at // DAY)] = day.get(int(at // DAY), 0) + 1
    out: dict = {}
    for i, node in enumerate(h.names):
        first, last = _slot_range(h, i, lo, hi)
        if first <= last:  # slots are less than a day apart: every day between has one
            days = set(range(h.slot_time(i, first) // DAY, h.slot_time(i, last) // DAY + 1))
            for day, count in failed_slots.get(node, {}).items():
                a, b = _slot_range(h, i, max(lo, day * DAY), min(hi, (day + 1) * DAY))
                if count >= b - a + 1:  # every health check of the day failed
                    days.discard(day)
            out[node] = days
    for node, job, begin, finish, _size, state, *_ in h.jobs:
        epilog = finish if state != "running" and f"{node}:epilog:{job}" not in failed else None
        for t in (begin, epilog):
            if t is not None and start <= t < end:
                out.setdefault(node, set()).add(int(t // DAY))
    return {node: days for node, days in out.items() if days}


def _slot_range(h: History, i: int, lo: float, hi: float) -> tuple:
    """(first, last) health-check slot of node i in [lo, hi); first > last when none."""
    base, step = h.fleet.start + h.offsets[i], h.fleet.healthcheck_interval
    first = max(0, math.ceil((lo - base) / step))
    return first, min(h.slots(i), math.ceil((hi - base) / step)) - 1


def _tally(h: History, start: float, end: float, by_day: bool) -> dict:
    """{bucket: {node: signals}}: one bucket (0), or one per UTC day when by_day."""
    out: dict = {}

    def row(t: float, node: str) -> dict:
        bucket = out.setdefault(int(t // DAY) if by_day else 0, {})
        if node not in bucket:
            bucket[node] = dict.fromkeys(policy.SIGNALS, 0)
        return bucket[node]

    hw = {(e[2], e[3]) for e in h.events if e[6] == "fail" and e[3] is not None}
    for node, job_id, begin, _end, size, state, slurm_state, *_ in h.jobs:
        if start <= begin < end:
            r = row(begin, node)
            r["jobs"] += 1
            hardware = state == "prolog_failed" or slurm_state == "NODE_FAIL"
            r["hw_job_failures"] += hardware or (node, job_id) in hw
            if size and size > 1:
                r["multi_node_jobs"] += 1
                r["multi_node_failures"] += slurm_state == "FAILED"
    for _id, _run, node, _job, t, _code, cls, _gpu in h.events:
        if start <= t < end:
            r = row(t, node)
            r["hw_xids"] += cls == "fail"
            r["warn_xids"] += cls == "warn"
    for _id, node, _job, _phase, t, verdict, *_ in h.runs:
        if start <= t < end:
            r = row(t, node)
            r["check_fails"] += verdict == "fail"
            r["check_warns"] += verdict == "warn"
    for _id, node, t, action, _why, _actor, ok, _detail in h.actions:
        if start <= t < end:
            row(t, node)["drains"] += action == ACT_DRAIN and ok == 1
    for node, days in _run_days(h, start, end).items():
        for day in days:
            row(day * DAY, node)["node_days"] += 1
    return out


def signals(history: History, start: float, end: float) -> dict:
    """{node: {signal: count, "faults": items, "warnings": items, "gpu_class"}} over [start,
    end), exactly as docs/signals.md defines them over a store (fleet.signals), for every node
    with any record in the window."""
    out = _tally(history, start, end, by_day=False).get(0, {})
    items = fault_items(history, start, end)
    for node in set(items) - set(out):
        out[node] = dict.fromkeys(policy.SIGNALS, 0)
    classes = gpu_classes(history.fleet)
    for node, counts in out.items():
        mine = items.get(node, {})
        counts["faults"] = window_items(mine.get("faults", []), start, end)
        counts["warnings"] = window_items(mine.get("warnings", []), start, end)
        counts["gpu_class"] = classes.get(node, "")
    return {node: out[node] for node in sorted(out)}


class _Passes:
    """Each node's passing runs: every health-check slot not listed as failed or warned, every
    prolog and (when its row has an end) epilog not listed."""

    def __init__(self, h: History) -> None:
        self.h = h
        self.index = {n: i for i, n in enumerate(h.names)}
        explicit = {r[0]: r[5] for r in h.runs}
        self.bad_slots: list = [set() for _ in h.names]
        for run_id, node, _job, phase, *_ in h.runs:
            if phase == "healthcheck":
                self.bad_slots[self.index[node]].add(int(run_id.rsplit(":", 1)[1]))
        self.job_runs: list = [[] for _ in h.names]
        for node, job_id, begin, finish, _size, state, *_ in h.jobs:
            i = self.index[node]
            if explicit.get(f"{node}:prolog:{job_id}", "ok") == "ok":
                self.job_runs[i].append(begin)
            if state == "running":  # no epilog (yet): a crashed node's end is accounting's
                continue
            if finish is not None and explicit.get(f"{node}:epilog:{job_id}", "ok") == "ok":
                self.job_runs[i].append(finish)
        for times in self.job_runs:
            times.sort()

    def after(self, node: str, t: float) -> float | None:
        """The node's first passing run strictly after t (any time), or None."""
        i, h = self.index[node], self.h
        step, base = h.fleet.healthcheck_interval, h.fleet.start + h.offsets[i]
        slot = max(0, math.floor((t - base) / step) + 1)
        while slot < h.slots(i) and slot in self.bad_slots[i]:
            slot += 1
        best = h.slot_time(i, slot) if slot < h.slots(i) else None
        runs = self.job_runs[i]
        at = bisect.bisect_right(runs, t)
        if at < len(runs) and (best is None or runs[at] < best):
            best = runs[at]
        return best


def fault_items(h: History, start: float, end: float) -> dict:
    """{node: {"faults": items, "warnings": items}} (fleet/faults.py) of the records in
    [start, end), each item's next passing run unbounded (window_items bounds it). NODE_FAIL
    attribution reads drains and node events from a month before `start`, as fleet.signals."""
    lemon = f"slurmhealth: {LEMON}"
    early = start - faultlib.LONGEST_JOB_S
    found: dict = {}
    warned: dict = {}
    key = faultlib.scope_key

    def add(node: str, t: float, kind: str, scope: str, weight: float = 1.0) -> None:
        if start <= t < end:
            found.setdefault(node, []).append((t, kind, weight, (scope,)))

    for _id, node, _job, _phase, t, verdict, check, *_ in h.runs:
        if verdict == "fail":
            add(node, t, "check", key("check", check))
        elif verdict == "warn" and start <= t < end:
            warned.setdefault(node, []).append(t)
    for _id, _run, node, _job, t, code, cls, _gpu in h.events:
        if cls == "fail":
            add(node, t, "xid", key("xid", code))
        elif cls == "warn" and start <= t < end:
            warned.setdefault(node, []).append(t)
    drains: dict = {}
    for _id, node, t, action, why, _actor, ok, _detail in h.actions:
        if action == ACT_DRAIN and ok == 1 and early <= t < end and not why.startswith(lemon):
            drains.setdefault(node, []).append(t)
            add(node, t, "drain", key("reason", faultlib.own_reason(why)))
    downs: dict = {}
    for node, t, _until, state, reason in h.node_events:
        if early <= t < end:
            if faultlib.names_node(state, reason, lemon):
                downs.setdefault(node, []).append(t)
            if faultlib.is_fault_reason(reason, lemon):
                add(node, t, "down", key("reason", faultlib.own_reason(reason)))
    jobs: dict = {}
    for node, job_id, begin, finish, _size, state, slurm_state, *_ in h.jobs:
        if state == "prolog_failed":
            add(node, begin, "prolog", key("job", job_id))
        if slurm_state == "NODE_FAIL" and early <= begin < end:
            jobs.setdefault(job_id, []).append((node, begin, finish, state))
    for job_id, rows in jobs.items():
        weights = faultlib.attribute(rows, downs, drains)
        for node, begin, finish, _state in rows:
            if weights.get(node):
                t = finish if finish is not None else begin
                add(node, t, "node_fail", key("job", job_id), weights[node])
    passes = _Passes(h)
    out: dict = {}
    for node in set(found) | set(warned):
        hardware = sorted(found.get(node, ()))
        warnings = sorted(warned.get(node, ()))
        out[node] = {
            "faults": [(t, k, w, passes.after(node, t), sc) for t, k, w, sc in hardware],
            "warnings": [(t, "warn", 1.0, passes.after(node, t)) for t in warnings],
        }
    return out


def window_items(items: list, start: float, end: float) -> list:
    """The items in [start, end), a next passing run at or after `end` unknown (None): what a
    store holds at `end`."""
    return [
        (item[0], item[1], item[2], item[3] if item[3] is not None and item[3] < end else None)
        + tuple(item[4:])
        for item in items
        if start <= item[0] < end
    ]


def daily_signals(history: History) -> dict:
    """{UTC day number: {node: signals}} for each day of the fleet: a window of whole days is
    the sum of its days (node_days included, days being disjoint). Fast daily sweeps."""
    return _tally(history, history.fleet.start, history.fleet.end, by_day=True)


def add_signals(total: dict, more: dict) -> dict:
    """total += more, per node and signal (in place; returns total)."""
    for node, counts in more.items():
        mine = total.get(node)
        if mine is None:
            total[node] = dict(counts)
        else:
            for key, value in counts.items():
                mine[key] += value
    return total


# --- versions (configuration drift) ---------------------------------------------------------

# The fleet's versions, and what a drifted node runs instead: an older driver, one GPU with
# another VBIOS, one HCA on older firmware (the drifts the nightly report must show).
DRIVER, OLD_DRIVER = "550.90.07", "535.161.08"
VBIOS, ODD_VBIOS = "96.00.99.00.01", "96.00.74.00.0D"
HCA_FW, OLD_HCA_FW = "28.39.1002", "28.36.1010"
HCAS = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
DRIFTS = ("driver", "vbios", "ib_fw")


def drifted_nodes(fleet: Fleet) -> dict:
    """{node: drift}: `fleet.drifted` nodes chosen by the seed (not from the history's random
    stream, so histories do not change with it), each with one drift, in DRIFTS order."""
    count = min(fleet.drifted, fleet.nodes)
    chosen = random.Random(f"drift-{fleet.seed}").sample(fleet.names(), count)  # noqa: S311
    return {node: DRIFTS[n % len(DRIFTS)] for n, node in enumerate(chosen)}


# The GPU model each generation's runs record (a fleet with generations only: the others record
# none, as before), so the lemon policy can tell the generations apart as it would on a store.
GENERATION_MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200")


def gpu_classes(fleet: Fleet) -> dict:
    """{node: the GPU model its runs record} ("" for every node of a fleet without
    generations), as fleet.signals reads it back from a store."""
    if not fleet.generations:
        return dict.fromkeys(fleet.names(), "")
    models = GENERATION_MODELS
    return {n: models[g % len(models)] for n, g in zip(fleet.names(), generation_of(fleet))}


def node_versions(drift: str | None, model: str = "") -> dict:
    """The `versions` a run's sources record (runner.Gathered) on a node with this drift (and
    this GPU model, when the fleet has generations)."""
    vbios = sorted({VBIOS, ODD_VBIOS}) if drift == "vbios" else [VBIOS]
    firmware = dict.fromkeys(HCAS, HCA_FW)
    if drift == "ib_fw":
        firmware[HCAS[-1]] = OLD_HCA_FW
    gpu: dict = {"driver": OLD_DRIVER if drift == "driver" else DRIVER, "vbios": vbios}
    if model:
        gpu["model"] = [model]
    return {"gpu": gpu, "ib": {"fw_ver": firmware}}


def _sources(drift: str | None, versions: bool = True, model: str = "") -> str:
    """A run's sources JSON, as runner.Gathered.to_dict writes it, versions included or not."""
    found = node_versions(drift, model)
    out = {
        source: {"status": "ok", "message": "", "seconds": seconds}
        for source, seconds in (("gpu", 0.012), ("ib", 0.002))
    }
    for source in out if versions else ():
        out[source]["versions"] = found[source]
    out["kmsg"] = {"status": "ok", "message": "", "seconds": 0.001}
    return json.dumps(out)


# --- the store ------------------------------------------------------------------------------

# Simulated wall time of a run, by phase (seconds): typical of bench/bench_hook.py's figures,
# spread up to 1.5x, and 1 run in 100 three times slower (a busy node): p50 and p99 differ.
DURATIONS = {"healthcheck": 0.05, "prolog": 0.035, "epilog": 0.04}


def _duration(phase: str, when: float) -> float:
    """A run's wall time, from its start time by a multiplicative hash (same seed, same store)."""
    spread = (int(when) * 2654435761 % 2**32) / 2**32
    slow = 3.0 if spread > 0.99 else 1.0
    return round(DURATIONS[phase] * (1 + 0.5 * spread) * slow, 4)


def _run_rows(h: History, version: str, lo: float = -math.inf, hi: float = math.inf):
    """Every run's row; the health checks of [lo, hi) only (their slots are computed, not
    filtered: a day of a month costs a day)."""
    explicit = {r[0]: r[5] for r in h.runs}
    drift = drifted_nodes(h.fleet)
    models = gpu_classes(h.fleet)
    sources = {node: _sources(drift.get(node), model=models[node]) for node in h.names}
    # Versions unchanged are recorded again every runner.VERSIONS_EVERY: here by the first
    # health check of each 6-hour period; every other run records none.
    plain = _sources(None, versions=False)

    def row(run_id: str, node: str, job_id: str | None, phase: str, when: float, text: str):
        verdict = explicit.get(run_id, "ok")
        duration = _duration(phase, when)
        return (run_id, node, job_id, phase, when, duration, verdict, version, text)

    step = h.fleet.healthcheck_interval
    for i, node in enumerate(h.names):
        first, last = 0, h.slots(i)
        if lo > -math.inf:
            first = max(0, math.ceil((lo - h.slot_time(i, 0)) / step))
        if hi < math.inf:
            last = min(last, max(0, math.ceil((hi - h.slot_time(i, 0)) / step)))
        # the period of the slot before: a window's first slot records versions only when due
        period = h.slot_time(i, first - 1) // VERSIONS_EVERY if first else None
        for slot in range(first, last):
            when = h.slot_time(i, slot)
            due = when // VERSIONS_EVERY != period
            period = when // VERSIONS_EVERY
            text = sources[node] if due else plain
            yield row(f"{node}:healthcheck:{slot}", node, None, "healthcheck", when, text)
    for node, job_id, begin, finish, _size, state, *_ in h.jobs:
        yield row(f"{node}:prolog:{job_id}", node, job_id, "prolog", begin, plain)
        if finish is not None and state != "running":  # a crashed node ran no epilog
            yield row(f"{node}:epilog:{job_id}", node, job_id, "epilog", finish, plain)


def _event_rows(h: History):
    action = {"fail": "reset_gpu", "warn": "none", "app": "none"}
    for event_id, run_id, node, job_id, t, code, cls, gpu in h.events:
        bus = f"0000:{0x18 + 0x10 * gpu:02x}:00.0"
        text = f"NVRM: Xid (PCI:{bus}): {code}, pid=-, name=-, simulated"
        yield (
            event_id,
            run_id,
            node,
            job_id,
            t,
            "xid",
            code,
            gpu,
            bus,
            None,
            None,
            cls,
            action[cls],
            text,
            1,
        )


# The order of the simulator's job tuples (History.jobs).
JOB_COLUMNS = tuple("node job_id start end num_nodes state slurm_state uid user exit_code".split())
NODE_EVENT_COLUMNS = ("node", "start", "end", "state", "reason")  # History.node_events


def write_store(source: Fleet | History, conn, between: tuple | None = None) -> dict:
    """Write a simulated history (or simulate the fleet first) into a store opened with
    store.connect: runs (ok ones included), results of the runs that were not ok, events,
    jobs, actions, node events, in one transaction. Ids are stable: writing twice changes
    nothing. `between` (start, end): only the records dated in it (a run by its start, a job
    row by its start, whole), so a history can be written day by day as a fleet records it.
    Returns {table: rows written}."""
    from slurmhealth import __version__  # noqa: PLC0415

    h = source if isinstance(source, History) else events(source)
    counts = {}
    lo, hi = between if between is not None else (-math.inf, math.inf)

    def dated(rows: Iterable, at: int) -> Iterator:
        return (row for row in rows if lo <= row[at] < hi)

    statements = (
        (
            "runs",
            store.insert_sql("runs", verb="INSERT OR REPLACE"),
            dated(_run_rows(h, __version__, lo, hi), 4),
        ),
        (
            "results",
            store.insert_sql("results", verb="INSERT OR REPLACE"),
            ((r[0], r[6], r[5], r[7], r[8], "{}", 0.01) for r in dated(h.runs, 4)),
        ),
        (
            "events",
            store.insert_sql("events", verb="INSERT OR REPLACE"),
            dated(_event_rows(h), 4),
        ),
        (
            "jobs",
            store.insert_sql("jobs", JOB_COLUMNS, verb="INSERT OR REPLACE"),
            dated(h.jobs, 2),
        ),
        ("actions", store.insert_sql("actions", verb="INSERT OR REPLACE"), dated(h.actions, 2)),
        (
            "node_events",
            store.insert_sql("node_events", NODE_EVENT_COLUMNS, verb="INSERT OR REPLACE"),
            dated(h.node_events, 1),
        ),
    )
    cache = conn.execute("PRAGMA cache_size").fetchone()[0]
    conn.execute("PRAGMA cache_size = -131072")  # 128 MiB: 1M runs insert ~1.5x faster
    try:
        with store.immediate(conn):
            for table, sql, rows in statements:
                counts[table] = conn.executemany(sql, rows).rowcount
    finally:
        conn.execute(f"PRAGMA cache_size = {int(cache)}")
    return counts


def spool_records(h: History, start: float, end: float) -> dict:
    """{node: [record dict]} of what each node's incremental export would carry for [start,
    end): runs started, events, actions dated and job rows started or ended in it (each job
    row as the hooks know it then), in docs/fleet.md's format. The 5-minute spool at scale."""
    from slurmhealth import __version__  # noqa: PLC0415

    out: dict = {node: [] for node in h.names}
    run_columns = store.TABLE["runs"].names()
    for row in _run_rows(h, __version__, start, end):
        if start <= row[4] < end:
            out[row[1]].append({"type": "run", **dict(zip(run_columns, row))})
    for r in h.runs:
        if start <= r[4] < end:
            result = ("run_id", "check_name", "status", "message", "action")
            out[r[1]].append(
                {"type": "result", **dict(zip(result, (r[0], r[6], r[5], r[7], r[8])))}
            )
    event_columns = store.TABLE["events"].names()
    for row in _event_rows(h):
        if start <= row[4] < end:
            out[row[2]].append({"type": "event", **dict(zip(event_columns, row))})
    for row in h.jobs:
        job = dict(zip(JOB_COLUMNS, row))
        if start <= job["start"] < end or (job["end"] is not None and start <= job["end"] < end):
            out[job["node"]].append({"type": "job", **job})
    action_columns = store.TABLE["actions"].names()
    for row in h.actions:
        if start <= row[2] < end:
            out[row[1]].append({"type": "action", **dict(zip(action_columns, row))})
    return out
