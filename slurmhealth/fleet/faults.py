"""Faults, not records: a node's hardware evidence turned into distinct faults (pure).

One fault leaves many records: a GPU that falls off the bus during a job logs an Xid, fails the
job, fails the epilog, is drained, then fails every health check until it is repaired. Counting
records would count that one fault dozens of times, and count a long repair as many faults. The
lemon model (fleet/policy.py, docs/lemons.md) counts faults instead:

- `attribute`: a NODE_FAIL job is charged to the node that failed, where Slurm knows it (a node
  event from accounting, the node's own drain, the node that never ran its epilog while its peers
  did); only what cannot be attributed is shared over the job's nodes, each getting 1 / nodes.
- `episodes`: a node's evidence items, in time order, are one fault until a passing run of the
  node separates them (fail, pass, fail: two faults; a hundred failing runs in one repair: one).
  Where no run of the node is known after an item, items more than `gap` apart are separate.
  A long silence separates too, passing run known or not: a node out of service for days
  between two faults (down, then back and failing) had two.
- `shared`: a fault that starts on many nodes at once AND shares a cause with the others (the
  same failing check, Xid, Slurm reason or job; a leaf switch, block or small partition where
  Slurm's topology names one (collect --sacct), a rack where the records know one: an
  incident such as a switch, a filesystem, a bad configuration push) is the fleet's, not the
  node's: it counts for none of them. Unrelated faults close in time stay each node's own.

Items are (time, kind, weight, next_ok[, scopes]): kind is one of KINDS, weight in (0, 1],
next_ok the time of the node's first passing run after `time` within the window (None: none
known), scopes the causes and places the item can share with other nodes' ("check:ib.port_state",
"xid:79", "reason:not responding", "job:1234", "rack:r12"; scope_key() builds them).
fleet/signals.py builds them from a store; the source tree's simulator (sim/simulate.py, not
installed) from a simulated fleet.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

# The kinds of hardware evidence, and how a reason line names them.
KINDS = {
    "check": "failed checks",
    "xid": "hardware Xids",
    "drain": "drains",
    "prolog": "failed prologs",
    "node_fail": "NODE_FAIL",
    "down": "node down",
}

# Slurm's own reasons for taking a node out (slurmctld sets them: a node that stopped answering,
# a job step it could not kill, an unexpected reboot, a failed prolog or epilog): node events with
# these reasons are fault evidence. An admin's free-text reason ("maintenance") is not.
SLURM_FAULT_REASONS = (
    "not responding",
    "kill task failed",
    "node unexpectedly rebooted",
    "prolog error",
    "prolog failed",
    "epilog error",
    "batch job complete failure",
    "slurmhealth:",
)

# A node event or drain this long after a NODE_FAIL job's end still names its node: slurmctld
# marks a silent node DOWN after SlurmdTimeout (300 s by default, slurm.conf(5)).
ATTRIBUTION_SLACK_S = 600.0

# The longest job whose NODE_FAIL still lands in a window by its end (Slurm's MaxTime is often
# days; a month covers every common setting): attribution reads this far before a window.
LONGEST_JOB_S = 30 * 86400.0


def is_fault_reason(reason: str, lemon_prefix: str) -> bool:
    """True for a node event reason that Slurm (or slurmhealth, not its lemon sweep) set for a
    fault."""
    text = reason.strip().lower()
    if text.startswith(lemon_prefix.lower()):
        return False
    return any(text.startswith(r) for r in SLURM_FAULT_REASONS)


def names_node(state: str, reason: str, lemon_prefix: str) -> bool:
    """True for a node event that can name the node of a NODE_FAIL: the node went down or
    failed (DOWN, DOWN*, FAIL...), or Slurm or slurmhealth gave a fault's reason. An admin's
    drain ("maintenance") names nobody, even during the job."""
    word = state.strip().upper()
    return word.startswith(("DOWN", "FAIL")) or is_fault_reason(reason, lemon_prefix)


def attribute(rows: list, downs: dict, drains: dict, slack: float = ATTRIBUTION_SLACK_S) -> dict:
    """{node: weight} for one NODE_FAIL job.

    rows: the job's rows, one per node: (node, start, end, state) with state the hooks' view
    (`ended`: its epilog ran). downs: {node: [start times of node events]}; drains:
    {node: [times of slurmhealth's drains]}. The first of these that names any of the job's
    nodes within [start, end + slack] decides: node events, then drains, then the nodes
    without an epilog when some peer has one. Those nodes get weight 1, the others 0; if none
    decides, every node gets 1 / nodes.
    """
    nodes = sorted({r[0] for r in rows})
    if len(nodes) == 1:
        return {nodes[0]: 1.0}
    begin = min((r[1] for r in rows if r[1] is not None), default=None)
    finish = max((r[2] for r in rows if r[2] is not None), default=begin)
    if begin is not None and finish is not None:
        for marks in (downs, drains):
            named = {n for n in nodes if _within(marks.get(n, ()), begin, finish + slack)}
            if named:
                return {n: float(n in named) for n in nodes}
    ended = {r[0] for r in rows if r[3] == "ended"}
    if ended and len(ended) < len(nodes):
        return {n: float(n not in ended) for n in nodes}
    return dict.fromkeys(nodes, 1.0 / len(nodes))


def _within(times: Iterable[float], lo: float, hi: float) -> bool:
    return any(lo <= t <= hi for t in times)


def scope_key(kind: str, value: object) -> str:
    """A scope as items carry it: "kind:value", the value lower-cased with its digit runs as
    "#" for reasons (GPU and port numbers differ from node to node in one incident's messages),
    at most 60 characters. Other kinds ("xid", "job", "check", and the places "rack", "switch",
    "block", "partition") keep their value."""
    text = " ".join(str(value).split()).lower()
    if kind == "reason":
        text = re.sub(r"\d+", "#", text)
    return f"{kind}:{text[:60]}"


def own_reason(reason: str) -> str:
    """A drain's or node event's reason without slurmhealth's prefix: the cause its scope
    names (a hook's drain and Slurm's own event for one fault then share it)."""
    return reason[len("slurmhealth:") :].strip() if reason.startswith("slurmhealth:") else reason


def episodes(items: list, gap: float) -> list:
    """A node's items (time order) as faults: [(start, weight, {kind: items}, {scopes})]."""
    out: list = []
    previous = None
    for item in items:
        time, kind, weight = item[0], item[1], item[2]
        if weight <= 0:
            continue
        scopes = item[4] if len(item) > 4 and item[4] else ()
        if previous is None or _separated(previous, time, gap):
            out.append([time, weight, {kind: 1}, set(scopes)])
        else:
            last = out[-1]
            last[1] = max(last[1], weight)
            last[2][kind] = last[2].get(kind, 0) + 1
            last[3].update(scopes)
        previous = item
    return [tuple(e) for e in out]


def _separated(previous: tuple, time: float, gap: float) -> bool:
    """A passing run between the last item and this one, or a long silence (no record of the
    node for `gap`: it was out, or nothing watched it)."""
    before, next_ok = previous[0], previous[3]
    return (next_ok is not None and next_ok < time) or time - before > gap


def burst_size(starts: int, span: float, window: float, p_cut: float, least: int) -> int:
    """How many nodes starting a fault within `window` of each other make a shared fault: the
    least count that the fleet's own rate of fault starts (`starts` over `span` seconds) would
    reach by chance with probability below p_cut (Poisson), and at least `least`."""
    mu = max(starts, 1) / max(span, window) * 2 * window
    count, term = 0, math.exp(-mu)
    tail = 1.0  # P(X >= count)
    while tail >= p_cut and count < 10_000:
        tail -= term
        count += 1
        term *= mu / count
    return max(least, count)


# Scopes that are a place or one job: faults sharing one of these within the hour are one
# incident on burst_size nodes. A cause alone (the same check, Xid or Slurm reason) is one only
# on shared_cause_nodes: the most common hardware faults (a GPU off the bus) strike unrelated
# nodes, and a handful of bad nodes of one batch, failing together when one job starts on all
# of them, are each a lemon, not an incident.
PLACES = ("rack", "switch", "block", "partition", "job")


def shared(by_node: dict, span: float, params: dict) -> dict:
    """{(node, start): (scope, nodes)} of the faults that started on enough nodes within
    `shared_window_s` (either side) of each other, all sharing `scope` (a cause or place:
    episodes' scopes), `nodes` the most nodes that scope's burst held around this start.

    How many nodes make a burst is set by the fleet's rate of all fault starts (burst_size at
    shared_p, at least shared_min_nodes), and for a cause alone at least shared_cause_nodes
    (PLACES); a shared scope is what makes it one incident: faults of unrelated causes that
    happen to start close together stay each node's own. Only whole faults (weight 1) are
    counted: the shares of one unattributed NODE_FAIL job must not make a burst of their own."""
    window = params["shared_window_s"]
    whole = [
        (e[0], node, e[3] if len(e) > 3 else ())
        for node, eps in by_node.items()
        for e in eps
        if e[1] >= 1.0
    ]
    if not whole:
        return {}
    need = burst_size(len(whole), span, window, params["shared_p"], params["shared_min_nodes"])
    by_scope: dict = {}
    for t, node, scopes in whole:
        for scope in scopes:
            by_scope.setdefault(scope, []).append((t, node))
    out: dict = {}
    # by name: where two scopes' bursts hold a fault with as many nodes, the one named is the
    # first by name, not the first a set of strings happened to give (their order changes
    # with each process's hash seed, and the same sweep said two causes on two runs)
    for scope, starts in sorted(by_scope.items()):
        place = scope.split(":", 1)[0] in PLACES
        least = need if place else max(need, params["shared_cause_nodes"])
        if len({node for _, node in starts}) < least:
            continue
        for key, nodes in _bursts(sorted(starts), window, least):
            if out.get(key, ("", 0))[1] < nodes:
                out[key] = (scope, nodes)
    return out


def _bursts(starts: list, window: float, need: int):
    """(node, start), nodes within `window` either side, of the starts (time order) with at
    least `need` distinct nodes that close: a window sliding over the starts with the count of
    each node's starts in it, linear in the starts (a 10,000-node month has tens of thousands;
    a set per start was quadratic: CHANGELOG.md)."""
    inside: dict = {}
    lo = hi = 0
    for t, node in starts:
        while hi < len(starts) and starts[hi][0] <= t + window:
            inside[starts[hi][1]] = inside.get(starts[hi][1], 0) + 1
            hi += 1
        while starts[lo][0] < t - window:
            gone = starts[lo][1]
            inside[gone] -= 1
            if not inside[gone]:
                del inside[gone]
            lo += 1
        if len(inside) >= need:
            yield (node, t), len(inside)


def count(by_node: dict, span: float, params: dict, starts: dict | None = None) -> dict:
    """{node: (faults, {kind: faults it showed in}, [discounted], start of the latest fault
    counted or None)} with the shared faults (an incident) left out, each listed in discounted
    as {"start", "scope", "nodes"}; faults is a weighted count (a share of a NODE_FAIL counts
    1 / n). `starts`, when given, receives {node: [start of each whole fault not shared]}."""
    common = shared(by_node, span, params)
    out = {}
    for node, eps in by_node.items():
        total, left_out, last = 0.0, [], None
        kinds: dict[str, int] = {}
        whole = []
        for start, weight, seen, *_ in eps:
            why = common.get((node, start)) if weight >= 1.0 else None
            if why is not None:
                left_out.append({"start": start, "scope": why[0], "nodes": why[1]})
                continue
            if weight >= 1.0:
                whole.append(start)
            total += weight
            last = start if last is None else max(last, start)
            for kind in seen:
                kinds[kind] = kinds.get(kind, 0) + 1
        out[node] = (total, kinds, left_out, last)
        if starts is not None:
            starts[node] = whole
    return out


def most_within(starts: list, window: float) -> int:
    """The most of these fault starts (time order) that lie within `window` seconds of the
    first of them: the node's worst day, for a window of a day."""
    most, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] > window:
            lo += 1
        most = max(most, hi - lo + 1)
    return most
