"""The odd node out (pure): each node's versions and settings against the majority of its peers
of the same hardware, with no golden file to maintain.

A node's latest recorded versions (runner: the areas' versions_of) are compared, per hardware
class (the GPU model), with the class majority: driver, the CUDA version the driver supports,
kernel, the host's NCCL, VBIOS, IB firmware (per HCA product: like with like only, see
_items), persistence mode, ECC mode, MIG mode, application clocks, IB rate.
A minority value is reported with the majority's value and count:
`gpu07: driver 535.161.08 vs 550.90.07 on 511 of 512 peers (NVIDIA H100 80GB HBM3)`. A value
that a large share of the class already runs (`rolling_share`, 20%) is a rolling update in
progress, not an odd node: it is reported as such, and nobody is listed as odd for it. So is,
whatever its share, a rollout's either end:
- ahead: a version newer than the majority's (every part of it newer, compared part by part)
  that at least ROLLING_NODES nodes run: the first nodes of a rollout, not an odd node (a
  version older than the majority's stays odd however many run it);
- behind: the value the class ran before, where the nodes now in the majority moved to it from
  that value within the report's look-back (each node's earliest recorded versions, `before`):
  the nodes not yet updated. A week after the rollout they are odd again.
"""

from __future__ import annotations

import re
from typing import Callable

from slurmhealth.core.result import clean, counted

# key in the recorded versions -> what the report calls it
ITEMS = (
    ("driver", "driver"),
    ("cuda", "CUDA (driver)"),
    ("kernel", "kernel"),
    ("nccl", "NCCL (host)"),
    ("vbios", "VBIOS"),
    ("ib_fw", "IB firmware"),
    ("persistence", "persistence mode"),
    ("ecc", "ECC mode"),
    ("mig", "MIG mode"),
    ("app_clocks", "application clocks"),
    ("ib_rate", "IB rate"),
)
ROLLING_SHARE = 0.20  # a value this share of a class runs is a rollout, not an odd node
ROLLING_NODES = 2  # ... and at least this many nodes run it
# Items whose values are versions, in order: a newer one on several nodes is a rollout's start.
ORDERED = frozenset(("driver", "cuda", "kernel", "nccl", "vbios", "ib_fw"))
LIST_MAX = 200


def versions(sources: object) -> dict:
    """{"model", "driver", "cuda", "kernel", "nccl", "vbios", "ib_fw:<HCA product>",
    "persistence", "ecc", "mig", "app_clocks", "ib_rate"} as one cleaned text each, from a
    run's sources JSON (runner.Gathered.to_dict: untrusted text)."""
    if not isinstance(sources, dict):
        return {}
    gpu = (sources.get("gpu") or {}).get("versions") or {}
    ib = (sources.get("ib") or {}).get("versions") or {}
    kmsg = (sources.get("kmsg") or {}).get("versions") or {}
    gpu = gpu if isinstance(gpu, dict) else {}
    ib = ib if isinstance(ib, dict) else {}
    kmsg = kmsg if isinstance(kmsg, dict) else {}
    out = {}
    for key, value in (("driver", gpu.get("driver")), ("cuda", gpu.get("cuda"))):
        if isinstance(value, str) and value:
            out[key] = clean(value, 40)
    if isinstance(kmsg.get("kernel"), str) and kmsg["kernel"]:
        out["kernel"] = clean(kmsg["kernel"], 64)
    if isinstance(kmsg.get("nccl"), str) and kmsg["nccl"]:
        out["nccl"] = clean(kmsg["nccl"], 32)
    for key, value in (
        ("model", gpu.get("model")),
        ("vbios", gpu.get("vbios")),
        ("persistence", gpu.get("persistence")),
        ("ecc", gpu.get("ecc")),
        ("mig", gpu.get("mig")),
        ("app_clocks", gpu.get("app_clocks")),
        ("ib_rate", ib.get("rate")),
    ):
        if isinstance(value, list) and value:
            out[key] = clean(", ".join(sorted(_text(v) for v in value)), 120)
    out.update(_firmware(ib.get("fw_ver"), ib.get("product")))
    return out


PRODUCT_MAX = 40  # a product's name in a key and a label (sysfs: at most 32, checks/ib.py)


def _firmware(firmware: object, products: object) -> dict:
    """{"ib_fw:<product>": the set of that product's firmware} (checks/ib.py versions_of: the
    HCAs' firmware and products), so firmware is compared only between HCAs of one product;
    "ib_fw" holds the HCAs of no known product (a record made before products were)."""
    if not isinstance(firmware, dict) or not firmware:
        return {}
    kinds = products if isinstance(products, dict) else {}
    found: dict = {}
    for device, version in firmware.items():
        kind = kinds.get(device)
        name = clean(kind, PRODUCT_MAX) if isinstance(kind, str) else ""
        found.setdefault(f"ib_fw:{name}" if name else "ib_fw", set()).add(str(version))
    return {key: clean(", ".join(sorted(v)), 120) for key, v in found.items()}


def gpu_answered(sources: object) -> bool:
    """The run's GPU source answered (status ok): its GPU facts are the node's, model or not,
    and the node's older runs have nothing to add to them."""
    gpu = sources.get("gpu") if isinstance(sources, dict) else None
    return isinstance(gpu, dict) and gpu.get("status") == "ok"


def _text(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def odd_nodes(
    found: dict,
    rolling_share: float = ROLLING_SHARE,
    before: dict | Callable[[str], dict | None] | None = None,
) -> dict:
    """found: {node: versions() or None}; before: each node's earliest recorded versions in the
    look-back (what the class ran before a rollout), as {node: versions() or None} or a
    function of the node, called once per node and only for items on which the class
    disagrees (a unanimous fleet costs no read). Returns
    {"items": [{class, what, majority, nodes, agree, differ: [{node, value}], differ_count,
    rolling: [{value, nodes, stage}]}], "odd": [one line per odd node and value], "unknown",
    "unknown_nodes"}; a rollout's stage is "new" (the value it moves to) or "old" (the nodes
    not yet updated)."""
    classes: dict = {}
    for node, got in found.items():
        if got:
            classes.setdefault(got.get("model", ""), {})[node] = got
    earlier = _memo(before)
    items, odd = [], []
    for model in sorted(classes):
        members = classes[model]
        for key, label in _items(members):
            item = _item(members, key, label, model, rolling_share, earlier)
            if item is None:
                continue
            items.append(item)
            for d in item["differ"]:
                odd.append(_line(d["node"], label, d["value"], item))
    unknown = sorted(n for n, v in found.items() if not v)
    return {
        "items": items,
        "odd": odd[:LIST_MAX],
        "unknown": len(unknown),
        "unknown_nodes": unknown[:LIST_MAX],
    }


def _items(members: dict) -> list:
    """ITEMS, with one IB firmware item per HCA product the class's nodes record after the
    plain one (`ib_fw:MT4129` is "IB firmware (MT4129)"): a node's HCAs are compared with its
    peers' HCAs of the same product only, and a node with an HCA of a product its peers lack
    (an iWARP NIC beside the Mellanox HCAs) is compared with nobody for it."""
    kinds = sorted({k for got in members.values() for k in got if k.startswith("ib_fw:")})
    out = []
    for key, label in ITEMS:
        out.append((key, label))
        if key == "ib_fw":
            out += [(k, f"{label} ({k.partition(':')[2]})") for k in kinds]
    return out


def _memo(before: dict | Callable[[str], dict | None] | None) -> Callable[[str], dict]:
    if before is None:
        return lambda _node: {}
    if isinstance(before, dict):
        return lambda node: before.get(node) or {}
    seen: dict = {}

    def read(node: str) -> dict:
        if node not in seen:
            seen[node] = before(node) or {}
        return seen[node]

    return read


def _item(
    members: dict,
    key: str,
    label: str,
    model: str,
    rolling_share: float,
    before: Callable[[str], dict],
) -> dict | None:
    values = {node: v[key] for node, v in members.items() if key in v}
    if not values:
        return None
    tally: dict = {}
    for value in values.values():
        tally[value] = tally.get(value, 0) + 1
    majority = max(sorted(tally), key=lambda v: tally[v])
    # A rollout is a value several nodes already run: in a class of five or fewer, one node is
    # 20% of it, and one node alone is an odd node, never a rollout.
    share = max(ROLLING_NODES, rolling_share * len(values))
    old = _left_behind(values, majority, key, before) if len(tally) > 1 else None
    stages = {}
    for v, count in tally.items():
        if v == majority:
            continue
        if v == old:
            stages[v] = "old"
        elif count >= share or (
            key.partition(":")[0] in ORDERED and count >= ROLLING_NODES and _newer(v, majority)
        ):
            stages[v] = "new"
    rolling = sorted(stages, key=lambda v: (-tally[v], v))
    differ = [
        {"node": n, "value": v}
        for n, v in sorted(values.items())
        if v != majority and v not in stages
    ]
    return {
        "class": clean(model, 80) or "unknown GPUs",
        "what": label,
        "majority": majority,
        "nodes": len(values),
        "agree": tally[majority],
        "differ": differ[:LIST_MAX],
        "differ_count": len(differ),
        "rolling": [{"value": v, "nodes": tally[v], "stage": stages[v]} for v in rolling],
    }


def _left_behind(
    values: dict, majority: str, key: str, before: Callable[[str], dict]
) -> str | None:
    """The value the class ran before a rollout to `majority`, when most of the nodes now on
    the majority (of those whose earlier versions are known) moved to it from that value within
    the look-back; else None."""
    came_from: dict = {}
    for node, value in values.items():
        if value != majority:
            continue
        earlier = before(node).get(key)
        if earlier is not None:
            came_from[earlier] = came_from.get(earlier, 0) + 1
    known = sum(came_from.values())
    moved = {v: n for v, n in came_from.items() if v != majority}
    if not moved:
        return None
    value = max(sorted(moved), key=lambda v: moved[v])
    return value if 2 * moved[value] > known else None


_PART = re.compile(r"[0-9A-Za-z]+")


def _parts(version: str) -> tuple:
    """A version's parts for ordering: decimal where all digits, else hexadecimal (a VBIOS's
    `96.00.74.00.0D`), else text after any number."""
    out = []
    for part in _PART.findall(version):
        if part.isdigit():
            out.append((0, int(part), ""))
        else:
            try:
                out.append((0, int(part, 16), ""))
            except ValueError:
                out.append((1, 0, part))
    return tuple(out)


def _newer(value: str, than: str) -> bool:
    """Every version in `value` (a node's set, `a, b`) is newer than every one in `than`."""
    mine = [_parts(v) for v in value.split(", ")]
    theirs = [_parts(v) for v in than.split(", ")]
    return min(mine) > max(theirs)


def _line(node: str, label: str, value: str, item: dict) -> str:
    return clean(
        f"{node}: {label} {value} vs {item['majority']} on {item['agree']} of "
        f"{counted(item['nodes'] - 1, 'peer')} ({item['class']})",
        200,
    )
