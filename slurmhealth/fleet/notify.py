"""Tell someone: the fleet store's drains, lemons, breaker trips and nodes gone silent, posted to
a webhook (docs/alerts.md).

`slurmhealth notify` runs on the head node after collect and the lemon sweep (the periodic
jobs, `SLURMHEALTH_WEBHOOK_URL`). Each run posts what happened since the last post it made:

- drains: the actions the hooks and `lemons --apply` recorded (`drain`, ok or failed), a lemon
  told apart by its actor; the drains monitor-only mode would have made (`would-drain`);
- breaker trips: the drains the circuit breaker (or an unreachable controller) held back;
- reboots the remediation ladder asked Slurm for (docs/remediation.md), and those not made;
- silence: a node not heard from within `silent_after` (6 h, as the lemon sweep's), once when it
  goes silent, and once when it is heard from again;
- a node that ran jobs within the last day with no run of slurmhealth's on record (its hooks
  are not running, or its exports never arrive: lemons.freshness, `unguarded`), once, until
  its first run is on record.

What was posted is remembered in the fleet store (meta key `notify`): the newest action posted,
by time and id, and the nodes said silent or unguarded. It moves only after the receiver took
the post (HTTP 2xx), so a receiver that is down loses nothing: the next run posts the same
events again.
A rate limit keeps an incident from flooding a channel: at most `max_events` events a post,
and at most `max_posts` posts an hour; past either, the rest is one line with its count (and
`slurmhealth history` has every one of them), and counts as posted.

Every string from the records (node names, reasons, details) is untrusted: it goes out as
`core.result.clean` leaves it (one printable line, bounded), and in Slack's format with its
three control characters escaped (`&`, `<`, `>`), so a reason cannot mention a channel or
forge a link. The receiver's URL is a secret (a Slack webhook's path is its key): it is never
printed whole.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

from slurmhealth.core import store
from slurmhealth.core.command import CommandError, Console
from slurmhealth.core.constants import ACT_BREAKER, ACT_DRAIN, ACT_REBOOT, ACT_WOULD_DRAIN
from slurmhealth.core.result import clean, counted
from slurmhealth.fleet import queries
from slurmhealth.fleet.lemons import ACTOR as LEMONS
from slurmhealth.fleet.lemons import SILENT_AFTER_S, freshness, jobs_seen

KEY = "notify"  # the fleet store's meta row
ACTIONS = (ACT_DRAIN, ACT_BREAKER, ACT_WOULD_DRAIN, ACT_REBOOT)
MAX_EVENTS = 20  # events in one post; the rest is one line with its count
MAX_POSTS = 6  # posts an hour
# The first run on a store (no mark yet) posts the last hour's events, not its whole history:
# drains of weeks ago would read as news (a Slack message carries no date)
FIRST_LOOKBACK_S = 3600.0
ATTEMPTS = 3  # a post tried this many times on a 5xx, a 429 or no connection
TIMEOUT_S = 10.0
TEXT_MAX = 300  # a reason or detail as a Slurm Reason or a log line keeps it

Post = Callable[[str, bytes], None]


@dataclasses.dataclass(frozen=True)
class Request:
    """url: the webhook (http or https); fmt: "json" or "slack"; dry_run: print what would be
    posted, post and remember nothing."""

    url: str
    fmt: str = "json"
    now: float | None = None
    dry_run: bool = False
    silent_after: float = SILENT_AFTER_S
    max_events: int = MAX_EVENTS
    max_posts: int = MAX_POSTS


def check_url(url: str) -> str:
    """The URL if it is an http(s) URL with a host; CommandError (usage, exit 2) otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandError(f"not an http or https URL: {shown(url)}", option="--url")
    return url


def shown(url: str) -> str:
    """The URL as it may be printed: scheme and host only (its path may be a secret key)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    return clean(f"{parts.scheme}://{host}/..." if host else "(no host)", 120)


# --- what to say (pure) -------------------------------------------------------------------------


def _kind(action: str, ok: int, actor: str) -> str:
    if action == ACT_BREAKER:
        return "breaker"
    if action == ACT_WOULD_DRAIN:
        return "would_drain"
    if action == ACT_REBOOT:
        return "reboot" if ok else "reboot_failed"
    if not ok:
        return "drain_failed"
    return "lemon" if actor == LEMONS else "drained"


_SAYS = {
    "drained": "drained {node}: {reason}",
    "lemon": "drained lemon {node}: {reason}",
    "drain_failed": "could NOT drain {node} (it may take jobs): {reason}",
    "breaker": "held back the drain of {node}: {detail}",
    "would_drain": "would drain {node} (monitor-only): {reason}",
    "reboot": "rebooting {node} (remediation): {reason}",
    "reboot_failed": "could not reboot {node}, it stays drained: {detail}",
    "silent": "{node} not heard from since {since}",
    "heard": "{node} heard from again",
    "unguarded": "{node} ran {detail} with no run of slurmhealth's on record: its hooks are not "
    "running, or its exports never arrive",
    "stale": "the fleet store has heard from no node since {since}: collect stopped, or every "
    "node stopped exporting ({detail}; nodes gone silent are said once it is current again)",
    "current": "the fleet store is current again ({detail})",
}


def event(kind: str, node: str, when: float, reason: str = "", detail: str = "") -> dict[str, Any]:
    """One event as posted: every string cleaned; `text` its one line."""
    out = {
        "kind": kind,
        "node": clean(node, 64),
        "time": round(when, 3),
        "reason": clean(reason, TEXT_MAX),
        "detail": clean(detail, TEXT_MAX),
    }
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    out["text"] = _SAYS[kind].format(since=since, **out)
    return out


def from_actions(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """(id, node, time, action, reason, actor, ok, detail) rows -> events."""
    return [
        event(_kind(action, ok, actor), node, when, reason, detail)
        for _id, node, when, action, reason, actor, ok, detail in rows
    ]


def silences(heard: dict[str, float], said: list[str], fresh: dict[str, Any]) -> list[
    dict[str, Any]
]:
    """Events for the nodes gone silent since they were last said to be, and for those said
    silent that were heard from again (fresh: lemons.freshness of `heard`)."""
    silent = {e["node"]: e["last"] for e in fresh["silent"]}
    events = [event("silent", n, t) for n, t in sorted(silent.items()) if n not in said]
    return events + [event("heard", n, heard[n]) for n in sorted(said) if n not in silent]


def unguarded(said: list[str], fresh: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """Events for the nodes that ran jobs with no run on record (fresh: lemons.freshness with
    the jobs), once each: `said` holds those told until their first run is on record."""
    after = f"{fresh['jobs_after'] / 3600:g} h"
    return [
        event("unguarded", e["node"], now, detail=f"{counted(e['jobs'], 'job')} within {after}")
        for e in sorted(fresh["unguarded"], key=lambda e: e["node"])
        if e["node"] not in said
    ]


def staleness(heard: dict[str, float], was_stale: bool, fresh: dict[str, Any], now: float) -> list[
    dict[str, Any]
]:
    """A stale store (no node heard from within --silent-after: collect stopped, a fleet-wide
    outage) is one event, said once, not one per node; its end is one more. An empty store
    says nothing."""
    if fresh["newest"] is None or fresh["stale"] == was_stale:
        return []
    if fresh["stale"]:
        return [event("stale", "", fresh["newest"], detail=counted(len(heard), "node") + " silent")]
    current = len(heard) - len(fresh["silent"])
    return [event("current", "", now, detail=f"{counted(current, 'node')} heard from")]


def _slack(text: str) -> str:
    """Slack's escaping of a message text: its three control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def payload(events: list[dict[str, Any]], more: int, fmt: str) -> dict[str, Any]:
    """The body posted: generic JSON (the events and how many more), or Slack's {"text"}."""
    rest = f"{counted(more, 'more event')} in the next posts" if more else ""
    if fmt == "slack":
        lines = [f"slurmhealth: {_slack(e['text'])}" for e in events]
        return {"text": "\n".join(lines + ([f"slurmhealth: {rest}"] if rest else []))}
    return {"source": "slurmhealth", "events": events, "more": more}


# --- posting (impure) ---------------------------------------------------------------------------


class PostError(Exception):
    """The receiver did not take the post: one line."""


def post(url: str, body: bytes, attempts: int = ATTEMPTS, timeout: float = TIMEOUT_S,
         sleep: Callable[[float], None] = time.sleep) -> None:
    """POST `body` (JSON) to `url`: done on a 2xx; tried again after 1 s, then 2 s, on a 5xx, a
    429 or no connection; PostError on any other answer or when the tries run out."""
    why = ""
    for attempt in range(attempts):
        if attempt:
            sleep(float(2 ** (attempt - 1)))
        req = urllib.request.Request(  # noqa: S310 - check_url let only http(s) through
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:  # noqa: S310
                answer.read(4096)
            return
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
            if exc.code != 429 and exc.code < 500:
                break  # a wrong URL or key: trying again changes nothing
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            why = clean(str(reason), 120)
    raise PostError(f"{shown(url)} did not take the post: {why}")


# --- the command --------------------------------------------------------------------------------


def _actions_after(conn: Any, mark: list[Any], now: float) -> list[tuple[Any, ...]]:
    """The drains, breaker trips and would-be drains recorded after `mark` ([time, id]) up to
    `now`, oldest first."""
    marks = ", ".join("?" for _ in ACTIONS)
    return conn.execute(
        "SELECT id, node, time, action, reason, actor, ok, detail FROM actions "  # noqa: S608
        f"WHERE action IN ({marks}) AND time <= ? AND (time > ? OR (time = ? AND id > ?)) "
        "ORDER BY time, id",
        (*ACTIONS, now, mark[0], mark[0], mark[1]),
    ).fetchall()


def _state(conn: Any) -> dict[str, Any]:
    found = store.get_meta(conn, KEY)
    state = found if isinstance(found, dict) else {}
    mark = state.get("mark")
    return {
        "mark": mark if isinstance(mark, list) and len(mark) == 2 else [0.0, ""],
        "silent": [str(n) for n in state.get("silent") or []],
        "posts": [float(t) for t in state.get("posts") or [] if isinstance(t, (int, float))],
        "first": found is None,
        "stale": state.get("stale") is True,
        "unguarded": [str(n) for n in state.get("unguarded") or []],
    }


def _older(conn: Any, before: float) -> int:
    """How many drains, trips and would-be drains were recorded up to `before`."""
    marks = ", ".join("?" for _ in ACTIONS)
    return conn.execute(
        f"SELECT count(*) FROM actions WHERE action IN ({marks}) AND time <= ?",  # noqa: S608
        (*ACTIONS, before),
    ).fetchone()[0]


def _first_mark(conn: Any, state: dict[str, Any], request: Request) -> None:
    """A first run that posted nothing (nothing new, or the receiver down) still sets where
    the next run starts: its look-back is not taken again from a later now."""
    if state["first"] and not request.dry_run:
        with conn:
            store.set_meta(
                conn,
                KEY,
                {"mark": state["mark"], "silent": [], "posts": [], "stale": False, "unguarded": []},
            )


def run(conn: Any, request: Request, console: Console, send: Post | None = None) -> int:
    """`slurmhealth notify`: post what happened since the last post; 0 when posted, nothing to
    say or held by the rate limit, 1 when the receiver did not take it (nothing is marked
    posted: the next run posts it)."""
    now = time.time() if request.now is None else request.now
    state = _state(conn)
    if state["first"]:
        state["mark"] = [now - FIRST_LOOKBACK_S, ""]
        older = _older(conn, now - FIRST_LOOKBACK_S)
        if older:
            console.out(
                f"first run: {counted(older, 'earlier event')} not posted, only the last "
                f"{FIRST_LOOKBACK_S / 3600:g} h's (the nightly report lists them)"
            )
    rows = _actions_after(conn, state["mark"], now)
    heard = queries.heard_from(conn, now)
    fresh = freshness(heard, now, request.silent_after, jobs_seen(conn, now))
    store_said = staleness(heard, state["stale"], fresh, now)
    stale = fresh["stale"] and fresh["newest"] is not None  # said once, not node by node
    # a node told unguarded is forgotten once it has a run: told again only if it stops
    told_unguarded = [n for n in state["unguarded"] if n not in heard]
    nodes_said = [] if stale else silences(heard, state["silent"], fresh)
    nodes_said += [] if fresh["stale"] else unguarded(told_unguarded, fresh, now)
    events = from_actions(rows) + store_said + nodes_said
    if not events:
        _first_mark(conn, state, request)
        console.out("nothing to notify")
        return 0
    posts = [t for t in state["posts"] if now - t < 3600]
    if len(posts) >= request.max_posts:
        console.out(
            f"rate limit: {counted(len(posts), 'post')} in the last hour; "
            f"{counted(len(events), 'event')} wait for the next"
        )
        return 0
    told, more = events[: request.max_events], max(len(events) - request.max_events, 0)
    body = json.dumps(payload(told, more, request.fmt)).encode()
    if request.dry_run:
        console.write(body.decode() + "\n")
        console.err(f"dry run: nothing posted, nothing marked ({counted(len(events), 'event')})")
        return 0
    try:
        (send or post)(request.url, body)
    except PostError as exc:
        _first_mark(conn, state, request)
        console.err(f"{exc}; {counted(len(events), 'event')} kept for the next run")
        return 1
    acted = rows[: min(len(rows), len(told))]
    mark = [acted[-1][2], acted[-1][0]] if acted else state["mark"]
    said, was_stale = set(state["silent"]), state["stale"]
    said_unguarded = set(told_unguarded)
    for sent in told[len(acted) :]:
        if sent["kind"] in ("stale", "current"):
            was_stale = sent["kind"] == "stale"
        elif sent["kind"] == "unguarded":
            said_unguarded.add(sent["node"])
        else:
            (said.add if sent["kind"] == "silent" else said.discard)(sent["node"])
    kept = {
        "mark": mark,
        "silent": sorted(said),
        "posts": [*posts, now],
        "stale": was_stale,
        "unguarded": sorted(said_unguarded),
    }
    with conn:
        store.set_meta(conn, KEY, kept)
    rest = f"; {counted(more, 'more event')} for the next posts" if more else ""
    console.out(f"posted {counted(len(told), 'event')} to {shown(request.url)}{rest}")
    return 0
