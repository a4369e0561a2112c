"""Validation across nodes, on the head node: the two known-good peers a drained node is
diagnosed against, and the one Slurm job the three share (docs/diagnose.md, "Across nodes").
`diagnose --submit --level pair` (fleet/diagnose.py sweep) calls it; inside the job the suspect
runs `diagnose --level pair --apply` (node/diag/pairs.py).

A peer is known-good when it is idle and in service (no drain, no reservation, no diagnose job of
its own), shares a partition, a GPU count (Slurm's gres) and a GPU model (the fleet store's
recorded versions) with the suspect, its newest recorded run passed within a day, and in the
week before it had no failed run and no drain of ours (made, refused by the breaker, or that
monitor-only mode would have made). `choose` is pure.

The job asks for the suspect and its peers (`--nodelist`, `--exclusive`) in the maintenance
reservation, which holds the suspect alone: the reservation's FLEX flag lets a job of the
reservation use nodes outside it too (scontrol(1), reservation flags), so the peers never join
it and go back to users' jobs when the job ends. The batch script starts the diagnosis on the
suspect with srun, whichever node Slurm runs the script on.
"""

from __future__ import annotations

import shlex
import sqlite3
import time

from slurmhealth.core import slurm
from slurmhealth.core.constants import DAY
from slurmhealth.core.result import clean
from slurmhealth.fleet import queries

PAIR = "pair"
FRESH = DAY  # a peer's newest run: passing, and this recent
CLEAN = 7 * DAY  # ... and no failed run and no drain of ours in this long before
NO_PEERS = "no-peers"  # what a sweep says of a node it could not give two peers: left drained


def node_facts(client: slurm.Slurm) -> dict:
    """{node: {partitions, gpus, state}} from one sinfo call (a line per node and partition):
    its partitions, its GPU count from its gres (None: none that reads as one), its state in
    sinfo's long words (idle, mixed, drained, maint...)."""
    out: dict = {}
    for line in client.sinfo("-h", "-N", "-o", "%N|%R|%G|%T").splitlines():
        name, partition, gres, state = (line.split("|") + ["", "", ""])[:4]
        if not name.strip():
            continue
        node = out.setdefault(name.strip(), {"partitions": set(), "gpus": None, "state": ""})
        node["partitions"].add(partition.strip())
        node["gpus"], node["state"] = gpu_count(gres.strip()), state.strip().lower()
    return out


def gpu_count(gres: str) -> int | None:
    """The GPUs of a node's gres (`gpu:8`, `gpu:h100:8(S:0-1)`, `gpu:a:4,gpu:b:4`): their
    sum; 0 with no gpu gres; None when a gpu entry does not read as a count."""
    total = 0
    for entry in gres.split(","):
        fields = entry.split("(")[0].split(":")
        if fields[0] != "gpu":
            continue
        count = fields[-1] if len(fields) > 1 else ""
        if not count.isascii() or not count.isdigit():
            return None
        total += int(count)
    return total


def fleet_facts(conn: sqlite3.Connection, nodes: list, now: float) -> dict:
    """{node: {model, latest, troubled}} from the fleet store: its GPU model (recorded
    versions), its newest run's verdict within FRESH (None: none that recent), whether it
    failed a run or was drained in the CLEAN window."""
    models = queries.node_models(conn, nodes, now, queries.MODEL_LOOKBACK)
    latest = queries.latest_verdicts(conn, nodes, now)
    troubled = queries.troubled_nodes(conn, now - CLEAN, now)
    out = {}
    for node in nodes:
        started, verdict = latest.get(node, (None, None))
        fresh = started is not None and started >= now - FRESH
        out[node] = {
            "model": models.get(node, ""),
            "latest": verdict if fresh else None,
            "troubled": node in troubled,
        }
    return out


def choose(suspect: str, facts: dict, busy: set, used: set) -> tuple[list, str]:
    """([peer 1, peer 2], "") for the suspect, or ([], why): two known-good peers of its class
    (facts: node_facts merged with fleet_facts), none of `busy` (in the reservation or running
    a diagnose job); those `used` for another suspect this pass come last."""
    mine = facts.get(suspect)
    if mine is None:
        return [], "not a node sinfo lists"
    if not mine.get("model"):
        return [], "its GPU model is not in the fleet store (slurmhealth collect first)"
    if not mine.get("gpus"):
        return [], "Slurm lists no GPU count for it (gres)"
    good = [
        name
        for name in sorted(facts)
        if name != suspect and name not in busy and _known_good(facts[name], mine)
    ]
    good.sort(key=lambda name: name in used)  # stable: name order within each
    if len(good) < 2:
        kind = f"{mine['gpus']}x {mine['model']}, partition {'/'.join(sorted(mine['partitions']))}"
        return [], clean(f"{len(good)} known-good idle peer(s) of its class ({kind}): two needed")
    return good[:2], ""


def _known_good(peer: dict, mine: dict) -> bool:
    return (
        peer.get("state") == "idle"
        and bool(peer.get("partitions", set()) & mine["partitions"])
        and peer.get("gpus") == mine["gpus"]
        and peer.get("model") == mine["model"]
        and peer.get("latest") == "ok"
        and not peer.get("troubled")
    )


def plan(
    client: slurm.Slurm, conn: sqlite3.Connection | None, suspects: list, busy: set
) -> dict:
    """{suspect: [peer 1, peer 2] or why not}: one sinfo call, the fleet store's reads of the
    nodes it lists, choose() for each suspect in name order, a peer given to one suspect
    offered to the next only after the others."""
    if not suspects:
        return {}
    if conn is None:
        return {s: "no fleet store to choose known-good peers from" for s in suspects}
    facts = node_facts(client)
    more = fleet_facts(conn, sorted(facts), time.time())
    for name, extra in more.items():
        facts[name].update(extra)
    out: dict = {}
    used: set = set()
    for suspect in sorted(suspects):
        peers, why = choose(suspect, facts, busy | set(suspects), used)
        out[suspect] = peers or why
        used.update(peers)
    return out


def on_suspect(srun: str, node: str, command: str) -> str:
    """The pair job's script: `command` (fixed words, quoted) run on the suspect by srun, in
    a step that leaves the job's other steps room (--overlap)."""
    argv = [srun, "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={slurm.one_node(node)}"]
    return " ".join(shlex.quote(a) for a in argv) + " -- " + command


def ensure_flex(client: slurm.Slurm, name: str) -> None:
    """Give the reservation the FLEX flag if it lacks it (one made before pair jobs): without
    it a job of the reservation never runs on the peers outside it. None yet: it is made with
    the flag (diagnose.set_reservation)."""
    try:
        text = client.run("-o", "show", "reservation", name)
    except slurm.SlurmError as exc:
        if "not found" in str(exc).lower():
            return
        raise
    for token in text.split():
        if token.startswith("Flags=") and "FLEX" not in token.partition("=")[2].split(","):
            client.run("update", f"ReservationName={name}", "Flags+=FLEX")
