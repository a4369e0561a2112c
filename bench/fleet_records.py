"""Fleet fault records for testing a lemon (bad node) detector on data it did not generate.

The models here are written apart from sim/simulate.py on purpose. Each one
makes a different assumption about how faults arrive: uneven availability, rates that vary
from node to node, faults that bunch up in time, incidents that hit a rack or a switch, a bad
batch of parts, bad spells that a repair ends, and lemons that get fixed. `load_lanl` reads a
real public record (Los Alamos National Laboratory, failure data 1996-2005, LA-UR-05-7318,
from CMU's Computer Failure Data Repository; Schroeder & Gibson, DSN 2006) into the same
format.

A record is a plain dict:
    name, assumptions (a paragraph), start, end (epoch seconds UTC; the record is [start, end)),
    nodes: {node: {"class": str, "out": [(t0, t1), ...]}}  (out of service, not for a fault),
    faults: [{"node", "start", "end", "cause", "scopes", "shared"}], sorted by start,
    lemons: {node: [(t0, t1), ...]}  (truth; {} for real data),
    params: {...}  (what the generator drew, such as the base rate; not in the original brief).
A fault's end is when the node is back in service. It may equal the record's end when the
repair was still going on then. A node's faults never overlap, and none starts in an out span.

Run: `.venv/bin/python bench/fleet_records.py [path/to/lanl.csv]` prints summary() for
every model at seed 1, then for the large LANL systems, all categories and Hardware only.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import random
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

DAY = 86400.0
HOUR = 3600.0
START = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
DAYS = 182
END = START + DAYS * DAY
BASE_RANGE = (2.5, 6.5)  # hardware faults per 1,000 node-days in service, GPU training clusters
CAUSES = (  # the mix of causes of independent faults, with weights
    ("xid79", 4), ("xid48", 2), ("xid94", 2), ("nvlink", 2),
    ("memory", 2), ("not responding", 3), ("ib port", 2), ("psu", 1),
)
COMMON = (
    "A node is in service except during its repairs and its out spans. It cannot fault while "
    "out of service. Repair times are lognormal with a median of 6 h and sigma 1.5 (18% take "
    "over a day, about 1% over a week, capped at 6 weeks). Independent faults take their "
    "cause from a mix of 8 causes. The base rate is drawn per seed, uniform in 2.5-6.5 "
    "hardware faults per 1,000 node-days in service."
)


# ---- shared pieces ------------------------------------------------------------------------

def _rng(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311 - a simulation, not a secret


def _base(rng: random.Random) -> float:
    """The seed's base rate, in faults per node-day in service."""
    return rng.uniform(*BASE_RANGE) / 1000.0


def _size(rng: random.Random) -> list[str]:
    """416-512 node names, a whole number of 32-node switches."""
    return [f"n{i:03d}" for i in range(32 * rng.randint(13, 16))]


def _repair(rng: random.Random) -> float:
    return min(6 * HOUR * math.exp(rng.gauss(0.0, 1.5)), 42 * DAY)


def _cause(rng: random.Random) -> str:
    return rng.choices([c for c, _ in CAUSES], [w for _, w in CAUSES])[0]


def _poisson(rng: random.Random, per_day: float, t0: float, t1: float) -> list[float]:
    """Event times of a Poisson process at per_day events a day over [t0, t1)."""
    times, t = [], t0
    while per_day > 0:
        t += rng.expovariate(per_day) * DAY
        if t >= t1:
            break
        times.append(t)
    return times


def _stream(rng: random.Random, per_day: float, segments=((START, END, 1.0),), cause=None):
    """Candidate independent faults: (t, cause, shared, duration) over (t0, t1, multiplier)."""
    return [(t, cause or _cause(rng), False, None)
            for t0, t1, k in segments for t in _poisson(rng, per_day * k, t0, t1)]


def _merge(spans) -> list[tuple[float, float]]:
    """Sorted, non-overlapping union of spans (touching spans join)."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _inside(t: float, spans) -> bool:
    return any(a <= t < b for a, b in spans)


def _fault(node, t0, t1, cause, shared=False, places=()) -> dict:
    return {"node": node, "start": t0, "end": t1, "cause": cause,
            "scopes": [f"reason:{cause}", *places], "shared": shared}


def _admit(rng, node, cands, out=(), places=(), free=START) -> list[dict]:
    """A node's faults from candidates (t, cause, shared, duration or None), in time order.

    A candidate that lands while the node is out or still in repair is dropped. For a Poisson
    stream this is the same as running the process over in-service time only.
    """
    faults = []
    for t, cause, shared, dur in sorted(cands, key=lambda c: c[0]):
        if t < free or _inside(t, out):
            continue
        faults.append(_fault(node, t, min(t + (dur or _repair(rng)), END), cause, shared, places))
        free = faults[-1]["end"]
    return faults


def _life(out) -> tuple[float, float]:
    """The span from a node's installation to its decommissioning, inside the record."""
    lo = out[0][1] if out and out[0][0] <= START else START
    hi = out[-1][0] if out and out[-1][1] >= END else END
    return lo, hi


def _record(name, assumptions, nodes, faults, lemons, params) -> dict:
    if isinstance(nodes, list):
        nodes = {v: {"class": "", "out": []} for v in nodes}
    faults.sort(key=lambda f: (f["start"], f["node"]))
    return {"name": name, "assumptions": f"{assumptions} {COMMON}", "start": START, "end": END,
            "nodes": nodes, "faults": faults, "lemons": lemons, "params": params}


def _steady(rng, rates, out=None, places=None, extra=None) -> list[dict]:
    """Faults of nodes with steady Poisson rates {node: per day}, plus extra candidates."""
    faults = []
    for v, rate in rates.items():
        cands = _stream(rng, rate) + (extra or {}).get(v, [])
        faults += _admit(rng, v, cands, (out or {}).get(v, ()), (places or {}).get(v, ()))
    return faults


# ---- the models --------------------------------------------------------------------------

def _maintenance(rng: random.Random) -> list[tuple[float, float]]:
    """Out spans of one node: maintenance (20% of nodes), late installation, early removal."""
    spans = []
    if rng.random() < 0.2:
        for _ in range(rng.choice((1, 1, 2, 3))):
            d = rng.uniform(2, 30) * DAY
            t0 = rng.uniform(START, END - d)
            spans.append((t0, t0 + d))
    u = rng.random()
    if u < 0.06:
        spans.append((START, START + rng.uniform(20, 150) * DAY))
    elif u < 0.12:
        spans.append((START + rng.uniform(30, 160) * DAY, END))
    return _merge(spans)


def availability(seed: int) -> dict:
    """Uneven availability: maintenance, late installs and early removals; 6 steady lemons."""
    rng = _rng(seed)
    names, base = _size(rng), _base(rng)
    nodes = {v: {"class": "", "out": _maintenance(rng)} for v in names}
    ks = {v: rng.uniform(10, 30) for v in rng.sample(names, 6)}
    out = {v: nodes[v]["out"] for v in names}
    faults = _steady(rng, {v: base * ks.get(v, 1.0) for v in names}, out=out)
    lemons = {v: [_life(out[v])] for v in ks}
    text = ("Nodes differ in availability: 20% have 1-3 maintenance spans of 2-30 days out of "
            "service, 6% are installed 20-150 days into the record and 6% removed 30-160 days "
            "in. Faults are Poisson in in-service time at the base rate; 6 lemons fault at "
            "10-30x the base rate for their whole life in the record.")
    params = {"base_per_1000": base * 1000, "lemon_k": ks}
    return _record("availability", text, nodes, faults, lemons, params)


def overdispersed(seed: int) -> dict:
    """Each node's own rate drawn from a gamma (mean base, shape 1.5); 5 lemons at 15x."""
    rng = _rng(seed)
    names, base = _size(rng), _base(rng)
    rates = {v: rng.gammavariate(1.5, base / 1.5) for v in names}
    lemons = rng.sample(names, 5)
    rates.update({v: 15 * base for v in lemons})
    faults = _steady(rng, rates)
    text = ("Healthy nodes differ: each node's rate is drawn from a gamma distribution with mean "
            "equal to the base rate and shape 1.5, so some healthy nodes fault 3x as often as "
            "the mean. Faults are independent (no incidents). 5 planted lemons fault at 15x the "
            "base rate; only they are in the truth.")
    params = {"base_per_1000": base * 1000, "gamma_shape": 1.5, "lemon_k": 15.0}
    return _record("overdispersed", text, names, faults, {v: [(START, END)] for v in lemons},
                   params)


def _segments(periods, k: float) -> list[tuple[float, float, float]]:
    """[START, END) cut into (t0, t1, multiplier): k inside the periods, 1 outside."""
    cuts, t = [], START
    for a, b in periods:
        cuts += [(t, a, 1.0), (a, b, k)]
        t = b
    return [s for s in [*cuts, (t, END, 1.0)] if s[1] > s[0]]


def clustered(seed: int) -> dict:
    """Busy periods (3-5 of 3-10 days) triple every node's rate; 6 lemons at 10-30x."""
    rng = _rng(seed)
    names, base = _size(rng), _base(rng)
    periods = []
    for _ in range(rng.randint(3, 5)):
        t0 = rng.uniform(START, END - 10 * DAY)
        periods.append((t0, t0 + rng.uniform(3, 10) * DAY))
    periods = _merge(periods)
    busy = sum(b - a for a, b in periods) / (END - START)
    quiet = base / (1 + 2 * busy)  # so that a healthy node's mean rate is the base rate
    segments = _segments(periods, 3.0)
    ks = {v: rng.uniform(10, 30) for v in rng.sample(names, 6)}
    faults = []
    for v in names:
        faults += _admit(rng, v, _stream(rng, quiet * ks.get(v, 1.0), segments))
    text = ("Unrelated faults bunch up in time: 3-5 busy periods of 3-10 days (heat, big "
            "training runs) triple every node's rate, and the quiet rate is set so that the "
            "mean over the record is the base rate. Faults on different nodes are independent, "
            "with their causes drawn from a mix of 8, so several nodes often fault within the "
            "same hour or day for different reasons. No incidents. 6 lemons fault at 10-30x.")
    params = {"base_per_1000": base * 1000, "busy_share": busy, "lemon_k": ks}
    return _record("clustered", text, names, faults, {v: [(START, END)] for v in ks}, params)


def _places(names, racks=True, switches=True) -> dict:
    """Racks of 16 nodes and leaf switches of 32, as scopes."""
    return {v: [f"rack:r{i // 16:02d}"] * racks + [f"switch:s{i // 32:02d}"] * switches
            for i, v in enumerate(names)}


def _incident(rng, names) -> dict:
    """One incident: a power loss on a rack or a link failure on a switch, within minutes."""
    power = rng.random() < 0.5
    size = 16 if power else 32
    first = size * rng.randrange(len(names) // size)
    t, hit = rng.uniform(START, END - DAY), rng.uniform(0.5, 1.0)
    dur = 2 * HOUR * math.exp(rng.gauss(0.0, 0.7))
    cause = "power" if power else "ib link down"
    return {v: [(t + rng.uniform(0, 600), cause, True, dur * rng.uniform(0.8, 1.5))]
            for v in names[first:first + size] if rng.random() < hit}


def incidents(seed: int) -> dict:
    """4-8 incidents hit most of one rack (power) or one switch (IB); 6 lemons at 10-30x."""
    rng = _rng(seed)
    names, base = _size(rng), _base(rng)
    shared: dict[str, list] = defaultdict(list)
    count = rng.randint(4, 8)
    for _ in range(count):
        for v, cands in _incident(rng, names).items():
            shared[v] += cands
    ks = {v: rng.uniform(10, 30) for v in rng.sample(names, 6)}
    rates = {v: base * ks.get(v, 1.0) for v in names}
    faults = _steady(rng, rates, places=_places(names), extra=shared)
    text = ("Nodes sit in racks of 16 and under leaf switches of 32 (every fault carries its "
            "node's rack and switch scopes). 4-8 incidents over the half year each hit 50-100% "
            "of the nodes of one rack (cause power) or one switch (cause ib link down) within "
            "10 minutes, down for about 2 h (shared=True); a node already in repair is not hit "
            "again. Other faults are independent Poisson at the base rate; 6 lemons at 10-30x.")
    params = {"base_per_1000": base * 1000, "incidents": count, "lemon_k": ks}
    return _record("incidents", text, names, faults, {v: [(START, END)] for v in ks}, params)


def bad_batch(seed: int) -> dict:
    """4-8 nodes with parts from one bad batch fault xid79 at 10-20x, now and then together."""
    rng = _rng(seed)
    names, base = _size(rng), _base(rng)
    bad = [names[16 * r + rng.randrange(16)]
           for r in rng.sample(range(len(names) // 16), rng.randint(4, 8))]
    ks = {v: rng.uniform(10, 20) for v in bad}
    extra = {v: _stream(rng, base * (ks[v] - 1), cause="xid79") for v in bad}
    triggers = rng.randint(2, 4)
    for _ in range(triggers):
        t = rng.uniform(START, END - DAY)
        hit = [v for v in bad if rng.random() < 0.6]
        for v in (hit if len(hit) >= 3 else rng.sample(bad, 3)):
            extra[v].append((t + rng.uniform(0, HOUR), "xid79", False, None))
    places = _places(names, switches=False)
    faults = _steady(rng, dict.fromkeys(names, base), places=places, extra=extra)
    text = ("4-8 nodes, each in a different rack of 16, got parts from one bad batch: on top of "
            "the base rate they fault with cause xid79 at 9-19x the base rate (10-20x in all). "
            "2-4 times in the record a shared trigger (a large job starting on all of them) "
            "makes 3 or more of them fault within the same hour, on top of their rate; those "
            "faults are each node's own (shared=False). Other nodes fault at the base rate "
            "with mixed causes. Every fault carries its rack scope.")
    params = {"base_per_1000": base * 1000, "triggers": triggers, "lemon_k": ks}
    return _record("bad-batch", text, names, faults, {v: [(START, END)] for v in bad}, params)


SPELL_ENTRY = -math.log(0.9) / DAYS  # per node-day: 10% of nodes start a spell in the record


def _spell_node(rng, node, base) -> tuple[list[dict], list[tuple[float, float]]]:
    """One node's faults and bad spells; the state changes are memoryless, so redraw on each."""
    faults, spells, t, spell = [], [], START, None  # spell: (start, latest end, multiplier)
    entry = t + rng.expovariate(SPELL_ENTRY) * DAY
    while t < END:
        nxt = t + rng.expovariate(base * (spell[2] if spell else 1.0)) * DAY
        if spell is None and entry < min(nxt, END):
            t = max(t, entry)  # an entry during a repair starts the spell when it ends
            spell = (t, t + 60 * DAY, rng.uniform(20, 50))
        elif spell and spell[1] < min(nxt, END):
            spells.append((spell[0], spell[1]))
            t, spell = max(t, spell[1]), None
            entry = t + rng.expovariate(SPELL_ENTRY) * DAY
        elif nxt < END:
            faults.append(_fault(node, nxt, min(nxt + _repair(rng), END), _cause(rng)))
            t = faults[-1]["end"]
            if spell and rng.random() < 0.3:
                spells.append((spell[0], t))
                spell, entry = None, t + rng.expovariate(SPELL_ENTRY) * DAY
        else:
            break
    if spell:
        spells.append((spell[0], min(spell[1], END)))
    return faults, spells


def bad_spells(seed: int) -> dict:
    """No lasting lemons: ~10% of nodes have a bad spell at 20-50x that a repair ends."""
    rng = _rng(seed)
    names, base = _size(rng), _base(rng)
    faults, lemons = [], {}
    for v in names:
        own, spells = _spell_node(rng, v, base)
        faults += own
        if spells:
            lemons[v] = spells
    text = ("No node is bad for good. Any node can enter a bad spell (entry rate such that about "
            "10% of nodes have one in the record); during a spell it faults at 20-50x the base "
            "rate. After each fault in a spell the repair fixes the node with probability 0.3, "
            "ending the spell when that repair ends; a spell lasts at most 60 days. Afterwards "
            "the node is healthy again (and may, rarely, enter another spell). The truth is the "
            "spell spans.")
    params = {"base_per_1000": base * 1000, "spell_entry_per_day": SPELL_ENTRY}
    return _record("bad-spells", text, names, faults, lemons, params)


def _repaired_lemon(rng, node, base, k) -> tuple[list[dict], tuple[float, float]]:
    """A lemon from day 0-60 for 20-60 days; then a GPU replacement (2-10 days out) fixes it."""
    b0 = START + rng.uniform(0, 60) * DAY
    b1 = b0 + rng.uniform(20, 60) * DAY
    cands = _stream(rng, base, ((START, b0, 1.0), (b0, b1, k), (b1, END, 1.0)))
    before = _admit(rng, node, [c for c in cands if c[0] < b1])
    t = max([b1] + [f["end"] for f in before])
    fix = _fault(node, t, t + rng.uniform(2, 10) * DAY, "gpu replaced")
    after = _admit(rng, node, [c for c in cands if c[0] >= fix["end"]])
    return [*before, fix, *after], (b0, fix["end"])


def repairs(seed: int) -> dict:
    """8 lemons at 15-30x, each fixed after 20-60 days by a GPU replacement."""
    rng = _rng(seed)
    names, base = _size(rng), _base(rng)
    ks = {v: rng.uniform(15, 30) for v in rng.sample(names, 8)}
    faults = _steady(rng, {v: base for v in names if v not in ks})
    lemons = {}
    for v, k in ks.items():
        own, span = _repaired_lemon(rng, v, base, k)
        faults += own
        lemons[v] = [span]
    text = ("8 lemons turn bad at a time uniform in the first 60 days and fault at 15-30x the "
            "base rate for 20-60 days. Their bad period ends with a repair: the node is taken "
            "out for 2-10 days to replace a GPU (a fault with cause 'gpu replaced', starting at "
            "the planned end or when the repair then in progress ends). After it they fault at "
            "the base rate. The truth spans run from turning bad to the end of that repair.")
    params = {"base_per_1000": base * 1000, "lemon_k": ks}
    return _record("repairs", text, names, faults, lemons, params)


MODELS: dict[str, tuple[str, Callable[[int], dict]]] = {
    "availability": ("maintenance, late installs, early removals; 6 steady lemons at 10-30x",
                     availability),
    "overdispersed": ("per-node gamma rates (shape 1.5); 5 lemons at 15x", overdispersed),
    "clustered": ("busy periods triple every node's rate; 8 causes; 6 lemons at 10-30x",
                  clustered),
    "incidents": ("rack power and switch IB incidents (shared); 6 lemons at 10-30x", incidents),
    "bad-batch": ("4-8 bad-batch nodes at 10-20x xid79, sometimes failing together",
                  bad_batch),
    "bad-spells": ("bad spells at 20-50x that a repair ends (p 0.3 a fault); no lasting lemons",
                   bad_spells),
    "repairs": ("8 lemons at 15-30x fixed after 20-60 days by a GPU replacement", repairs),
}


# ---- the LANL record -----------------------------------------------------------------------

LANL_CATEGORIES = ("Facilities", "Hardware", "Human Error", "Network", "Undetermined", "Software")
LANL_PATH = "/work/data/lanl.csv"
MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}


@functools.lru_cache(maxsize=2)
def _lanl_rows(path: str) -> list[dict]:
    """The CSV's rows, stripped (cached: callers only read them)."""
    with open(path, newline="", encoding="latin-1") as fh:
        return [{k.strip(): (v or "").strip() for k, v in row.items()}
                for row in csv.DictReader(fh)]


def _mountain(local: datetime) -> float:
    """LANL local time to epoch seconds: US Mountain, UTC-7, UTC-6 in daylight saving time.

    DST by the 1987-2006 US rule: first Sunday of April 2:00 to last Sunday of October 2:00
    (the repeated hour of October is read as daylight time).
    """
    apr1, oct31 = datetime(local.year, 4, 1), datetime(local.year, 10, 31)
    on = apr1 + timedelta(days=(6 - apr1.weekday()) % 7, hours=2)
    off = oct31 - timedelta(days=(oct31.weekday() + 1) % 7) + timedelta(hours=2)
    offset = 6 if on <= local < off else 7
    return (local + timedelta(hours=offset)).replace(tzinfo=timezone.utc).timestamp()


def _lanl_local(text: str) -> datetime | None:
    """'m/d/yyyy h:mm' (every row has 4-digit years; 2-digit ones are read too)."""
    for fmt in ("%m/%d/%Y %H:%M", "%m/%d/%y %H:%M"):
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            pass
    return None


def _lanl_time(text: str) -> float | None:
    local = _lanl_local(text)
    return None if local is None else _mountain(local)


def _lanl_month(text: str) -> tuple[int, int] | None:
    """'5-Apr' (April 2005, as a spreadsheet wrote 'Apr-05') or 'Nov-96' -> (year, month)."""
    m = re.fullmatch(r"(\d{1,2})-([A-Z][a-z]{2})", text)
    if m and m[2] in MONTHS:
        return 2000 + int(m[1]), MONTHS[m[2]]
    m = re.fullmatch(r"([A-Z][a-z]{2})-(\d{2})", text)
    if m and m[1] in MONTHS:
        return 1900 + int(m[2]), MONTHS[m[1]]
    return None  # 'current', 'before tracking', empty: not known


def _month_start(year: int, month: int) -> float:
    return _mountain(datetime(year + (month - 1) // 12, (month - 1) % 12 + 1, 1))


def _lanl_cause(row: dict) -> tuple[str, str]:
    """(category, 'Category: detail'); rows with no cause are Undetermined."""
    hits = [c for c in LANL_CATEGORIES if row.get(c)]
    if not hits:
        return "Undetermined", "Undetermined: (no cause given)"
    return hits[0], " + ".join(f"{c}: {row[c]}" for c in hits)


def _lanl_fault(row: dict, node: str) -> dict | None:
    """A fault from a row: Prob Started to Prob Fixed, else Down Time minutes, else 1 h."""
    t0, t1 = _lanl_time(row["Prob Started"]), _lanl_time(row["Prob Fixed"])
    if t0 is None:
        return None
    if t1 is None or t1 < t0:
        down = row["Down Time"]
        t1 = t0 + (float(down) * 60 if re.fullmatch(r"\d+(\.\d+)?", down) else HOUR)
    return _fault(node, t0, t1, _lanl_cause(row)[1], row["Same Event"].lower() == "yes")


def _merge_faults(faults: list[dict]) -> tuple[list[dict], int]:
    """One node's faults, overlapping or touching ones merged into the earlier one's record."""
    out: list[dict] = []
    for f in sorted(faults, key=lambda f: (f["start"], f["end"])):
        if out and f["start"] <= out[-1]["end"] and f["end"] > out[-1]["start"]:
            out[-1]["end"] = max(out[-1]["end"], f["end"])
            out[-1]["shared"] = out[-1]["shared"] or f["shared"]
        else:
            out.append(f)
    return out, len(faults) - len(out)


def _iso(text: str) -> float:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _lanl_span(rows, start, end) -> tuple[float, float]:
    """The record's span: the given ISO dates (UTC if no offset), else from the first of the
    month of the system's first fault to the first of the month after its last (local time)."""
    times = [t for t in (_lanl_local(r["Prob Started"]) for r in rows) if t is not None]
    first, last = min(times), max(times)
    lo = _iso(start) if start else _month_start(first.year, first.month)
    return lo, _iso(end) if end else _month_start(last.year, last.month + 1)


def _lanl_out(info, faults, lo, hi) -> list[tuple[float, float]]:
    """Out spans: before the production month and after the decommission month, where known,
    cut back so that no fault of the node starts inside them."""
    spans = []
    prod, decom = _lanl_month(info["node prod"]), _lanl_month(info["node decom"])
    if prod:
        first = min([f["start"] for f in faults], default=math.inf)
        spans.append((lo, min(_month_start(*prod), first, hi)))
    if decom:
        last = max([f["end"] for f in faults], default=-math.inf)
        spans.append((max(_month_start(decom[0], decom[1] + 1), last, lo), hi))
    return _merge([s for s in spans if s[1] > s[0]])


def _lanl_nodes(rows, size) -> dict[str, dict]:
    """node name -> its first row; nodes the record never names (no fault in 1996-2005) are
    added, up to the system's node count, with the system's most common node description."""
    nodes = {}
    for r in rows:
        nodes.setdefault(f"n{r['nodenumz']}", r)
    if nodes and size:
        keys = ("purpose", "node prod", "node decom")
        common = Counter(tuple(r[k] for k in keys) for r in nodes.values()).most_common(1)[0][0]
        i = min(int(r["nodenumz"]) for r in nodes.values())
        while len(nodes) < size:
            nodes.setdefault(f"n{i}", dict(zip(keys, common), unseen=True))
            i += 1
    return nodes


def load_lanl(path: str, system: str, categories: tuple = LANL_CATEGORIES,
              start: str | None = None, end: str | None = None, unseen: bool = True) -> dict:
    """One LANL system as a record (see the module docstring and the record's assumptions).

    Faults: every row of the system in `categories`, start = Prob Started, end = Prob Fixed
    (local Mountain time, converted to UTC). Faults of one node that overlap or touch are
    merged. Nodes are 'n<nodenumz>', class = purpose. unseen adds the nodes never named.
    """
    every = [r for r in _lanl_rows(path) if r["System"] == str(system)]
    rows = [r for r in every if r["nodenumz"]]
    lo, hi = _lanl_span(every, start, end)
    size = int(rows[0]["nodes"]) if unseen and rows and rows[0]["nodes"].isdigit() else 0
    info = _lanl_nodes(rows, size)
    per_node: dict[str, list] = defaultdict(list)
    for r in rows:
        f = _lanl_fault(r, f"n{r['nodenumz']}")
        if f and _lanl_cause(r)[0] in categories and lo <= f["start"] < hi:
            f["end"] = min(f["end"], hi)
            per_node[f["node"]].append(f)
    faults, merged, nodes = [], 0, {}
    for v, r in info.items():
        own, m = _merge_faults(per_node[v])
        faults, merged = faults + own, merged + m
        nodes[v] = {"class": r["purpose"], "out": _lanl_out(r, own, lo, hi)}
    faults.sort(key=lambda f: (f["start"], f["node"]))
    shared = sum(f["shared"] for f in faults)
    text = (f"LANL system {system}: {len(rows)} rows with a node ({len(every) - len(rows)} "
            f"without one left out), categories {', '.join(categories)}. Times are LANL local "
            "time (US Mountain, with daylight saving) converted to UTC. "
            f"{merged} fault rows that overlapped or touched an earlier fault of the same node "
            f"were merged into it. {sum('unseen' in r for r in info.values())} nodes that never "
            "appear in the record were added (up to the system's node count). Out spans: before "
            "the production month and after the decommission month, where known. Shared: Same "
            f"Event 'Yes', {shared} faults. The lemon truth is unknown.")
    return {"name": f"lanl-{system}" + ("" if categories == LANL_CATEGORIES else
                                        "-" + "+".join(c.lower() for c in categories)),
            "assumptions": text, "start": lo, "end": hi, "nodes": nodes, "faults": faults,
            "lemons": {}, "params": {"system": str(system), "categories": list(categories)}}


def lanl_systems(path: str, min_nodes: int = 100, min_faults: int = 200) -> list[str]:
    """The systems with at least min_nodes nodes and min_faults fault rows."""
    rows = _lanl_rows(path)
    count = Counter(r["System"] for r in rows)
    size = {r["System"]: int(r["nodes"]) for r in rows if r["nodes"].isdigit()}
    return sorted((s for s in count if size.get(s, 0) >= min_nodes and count[s] >= min_faults),
                  key=int)


# ---- summary and checks --------------------------------------------------------------------

def _covered(spans, lo, hi) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in _merge(spans))


def _near(faults, window: float = HOUR) -> int:
    """Faults with another node's fault starting within window of their start."""
    starts = sorted((f["start"], f["node"]) for f in faults)
    count, lo, hi = 0, 0, 0
    for t, v in starts:
        while starts[lo][0] < t - window:
            lo += 1
        while hi < len(starts) and starts[hi][0] <= t + window:
            hi += 1
        count += any(u != v for _, u in starts[lo:hi])
    return count


def _service_days(record: dict, extra=None) -> float:
    """Node-days in service: not out and not in repair (nor in the extra spans of a node)."""
    lo, hi, down = record["start"], record["end"], defaultdict(list)
    for f in record["faults"]:
        down[f["node"]].append((f["start"], f["end"]))
    return sum(hi - lo - _covered(info["out"] + down[v] + (extra or {}).get(v, []), lo, hi)
               for v, info in record["nodes"].items()) / DAY


def _per_1000(count: int, days: float) -> float:
    return round(1000 * count / days, 2) if days > 0 else math.nan


def summary(record: dict) -> dict:
    """Counts and rates per 1,000 node-days in service. 'healthy' leaves out shared faults and
    the lemons' spans (faults and time): the base rate a model meant."""
    faults, lemons = record["faults"], record["lemons"]
    days, healthy_days = _service_days(record), _service_days(record, lemons)
    own = [f for f in faults if not f["shared"]]
    healthy = [f for f in own if not _inside(f["start"], lemons.get(f["node"], ()))]
    near = _near(faults) / max(len(faults), 1)
    return {
        "nodes": len(record["nodes"]), "faults": len(faults), "faults not shared": len(own),
        "nodes with a fault": len({f["node"] for f in faults}),
        "node-days in service": round(days),
        "faults per 1,000 node-days in service": _per_1000(len(faults), days),
        "healthy faults per 1,000 node-days": _per_1000(len(healthy), healthy_days),
        "share with another node's fault within 1 h": round(near, 3),
        "lemon nodes": len(lemons),
    }


def check(record: dict) -> None:
    """Assert the record keeps the contract (module docstring)."""
    lo, hi, nodes = record["start"], record["end"], record["nodes"]
    assert lo < hi
    for v, info in nodes.items():
        out = info["out"]
        assert all(lo <= a < b <= hi for a, b in out), (v, out)
        assert all(b0 < a1 for (_, b0), (a1, _) in zip(out, out[1:])), (v, out)
    starts = [f["start"] for f in record["faults"]]
    assert starts == sorted(starts), "faults not sorted"
    free: dict[str, float] = {}
    for f in record["faults"]:
        v = f["node"]
        assert v in nodes and lo <= f["start"] < hi and f["start"] <= f["end"] <= hi, f
        assert f["start"] >= free.get(v, lo), ("overlapping faults", f)
        assert not _inside(f["start"], nodes[v]["out"]), ("fault while out", f)
        assert f"reason:{f['cause']}" in f["scopes"] and isinstance(f["shared"], bool), f
        free[v] = f["end"]
    for v, spans in record["lemons"].items():
        assert v in nodes and all(lo <= a < b <= hi for a, b in spans), (v, spans)


def _show(record: dict) -> None:
    check(record)
    params = {k: float(f"{p:.3g}") for k, p in record["params"].items() if isinstance(p, float)}
    print(f"{record['name']}: {summary(record)} {params or ''}")


def main(argv: list[str]) -> None:
    for name, (_, model) in MODELS.items():
        print(f"# {name}: {MODELS[name][0]}")
        _show(model(1))
    path = argv[0] if argv else LANL_PATH
    if not os.path.exists(path):
        print(f"# {path} not found: no LANL summaries")
        return
    for system in sorted(set(lanl_systems(path)) | {"18", "19", "20"}, key=int):
        _show(load_lanl(path, system))
        _show(load_lanl(path, system, ("Hardware",)))


if __name__ == "__main__":
    main(sys.argv[1:])
