"""fleet/notify.py: drains, lemons, breaker trips and silent nodes posted to a real local HTTP
receiver, remembered only once it took them; retries, a receiver that is down, the rate limit,
Slack's format with hostile reasons, and the command as an admin runs it."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from conftest import open_fleet, run_cli

from slurmhealth.core import store
from slurmhealth.core.command import CommandError, Console
from slurmhealth.fleet import notify
from slurmhealth.fleet.lemons import ACTOR as LEMONS

T0 = 1_780_000_000.0
HOUR = 3600.0


class Receiver:
    """A webhook receiver on 127.0.0.1: answers each POST with the next scripted status (then
    200), keeps every body it was sent."""

    def __init__(self, statuses: tuple[int, ...] = ()) -> None:
        self.statuses = list(statuses)
        self.bodies: list[dict] = []
        self.answered: list[int] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers["Content-Length"]))
                status = outer.statuses.pop(0) if outer.statuses else 200
                outer.answered.append(status)
                if status == 200:
                    outer.bodies.append(json.loads(data))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/B0/secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(statuses: tuple[int, ...] = ()) -> Receiver:
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for one in made:
        one.close()


def fleet(path: str, nodes=("gpu01", "gpu02", "gpu03"), last=T0) -> str:
    """A fleet store at `path` (a file or a PostgreSQL URL: the fleet_store fixture) with a
    passing health check of each node."""
    conn = open_fleet(path)
    with conn:
        for n, node in enumerate(nodes):
            row = (f"r{n}", node, None, "healthcheck", last, 0.05, "ok", "v", "{}")
            conn.execute(store.insert_sql("runs"), row)
    conn.close()
    return path


def act(path: str, node: str, action: str, when: float, ok: bool = True, actor: str = "prolog",
        why: str = "slurmhealth: gpu.ecc GPU 3 DBE", detail: str = "") -> None:
    conn = open_fleet(path)
    with conn:
        store.record_action(conn, node, action, why, actor, ok, detail, when=when)
    conn.close()


class Said:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.console = Console(self.out.append, self.err.append, self.out.append)


def sweep(path: str, url: str, now: float, **kw) -> tuple[int, Said]:
    said = Said()
    conn = open_fleet(path)
    try:
        status = notify.run(conn, notify.Request(url, now=now, **kw), said.console,
                            send=lambda u, b: notify.post(u, b, sleep=lambda _s: None))
    finally:
        conn.close()
    return status, said


def test_drains_lemons_and_breaker_trips_are_posted_once(fleet_store, receiver):
    path, rx = fleet(fleet_store), receiver()
    act(path, "gpu01", "drain", T0 + 10)
    act(path, "gpu02", "drain", T0 + 20, actor=LEMONS, why="slurmhealth: lemon: 5 faults in 28 d")
    act(path, "gpu03", "breaker", T0 + 30, ok=False, detail="circuit breaker: 3 of 16 drained")
    act(path, "gpu03", "drain", T0 + 40, ok=False, detail="scontrol: timed out")
    act(path, "gpu01", "resume", T0 + 50)  # not news: a return
    act(path, "gpu02", "reboot", T0 + 55, why="slurmhealth: reboot: Xid 79")
    status, said = sweep(path, rx.url, T0 + 60)
    assert status == 0 and said.out == ["posted 5 events to http://127.0.0.1/..."]
    (body,) = rx.bodies
    assert body["source"] == "slurmhealth" and body["more"] == 0
    assert [(e["kind"], e["node"]) for e in body["events"]] == [
        ("drained", "gpu01"), ("lemon", "gpu02"), ("breaker", "gpu03"), ("drain_failed", "gpu03"),
        ("reboot", "gpu02")]
    assert body["events"][4]["text"] == "rebooting gpu02 (remediation): slurmhealth: reboot: Xid 79"
    assert body["events"][1]["text"] == "drained lemon gpu02: slurmhealth: lemon: 5 faults in 28 d"
    assert "circuit breaker: 3 of 16" in body["events"][2]["text"]
    # the next run has nothing new; a drain after the mark is the only thing posted
    assert sweep(path, rx.url, T0 + 70)[1].out == ["nothing to notify"]
    act(path, "gpu02", "drain", T0 + 80)
    assert sweep(path, rx.url, T0 + 90)[0] == 0
    assert [e["node"] for e in rx.bodies[-1]["events"]] == ["gpu02"]
    assert "secret" not in " ".join(said.out + said.err)  # the URL's key is never printed


def test_the_first_run_on_a_store_posts_the_last_hour_not_its_history(fleet_store, receiver):
    """A webhook set up on a store with weeks of drains: the first run posts the last hour's
    and says how many earlier ones it left to the report (a Slack message has no date: a
    drain of 25 days ago would read as news). A first run with nothing new still sets where
    the next starts; a dry run sets nothing."""
    path, rx = fleet(fleet_store, last=T0 + 25 * 86400), receiver()
    now = T0 + 25 * 86400 + 600
    act(path, "gpu01", "drain", T0)
    act(path, "gpu02", "drain", T0 + 86400)
    status, said = sweep(path, rx.url, T0 + 2 * 86400, dry_run=True)
    assert status == 0 and rx.bodies == []
    act(path, "gpu03", "drain", now - 300)
    status, said = sweep(path, rx.url, now)
    assert status == 0 and said.out[0].startswith("first run: 2 earlier events not posted")
    assert [e["node"] for e in rx.bodies[0]["events"]] == ["gpu03"]
    assert sweep(path, rx.url, now + 60)[1].out == ["nothing to notify"]


def test_a_first_run_with_nothing_new_sets_where_the_next_starts(fleet_store, receiver):
    other, rx = fleet(fleet_store, last=T0), receiver()
    act(other, "gpu01", "drain", T0 - 86400)
    assert sweep(other, rx.url, T0 + 60)[1].out[-1] == "nothing to notify"
    act(other, "gpu02", "drain", T0 + 7200)  # two hours later: after the mark the first set
    status, said = sweep(other, rx.url, T0 + 7260)
    assert status == 0 and not said.out[0].startswith("first run")
    assert [e["node"] for e in rx.bodies[-1]["events"]] == ["gpu02"]


def test_a_first_run_whose_receiver_is_down_loses_nothing_later(fleet_store, receiver):
    """The receiver down on the first run: the next run, hours later, still posts what the
    first run had to say, not only its own last hour."""
    path, down = fleet(fleet_store, last=T0 + 3 * 3600), receiver((503, 503, 503))
    act(path, "gpu01", "drain", T0 - 600)
    assert sweep(path, down.url, T0)[0] == 1
    up = receiver()
    assert sweep(path, up.url, T0 + 3 * 3600)[0] == 0
    assert [e["node"] for e in up.bodies[0]["events"]] == ["gpu01"]


def test_a_stale_store_is_one_event_not_one_per_node(fleet_store, receiver):
    """Collect stopped (or the whole fleet is down for maintenance): the store has heard from
    no node for longer than --silent-after. That is one event, said once, not every node
    gone silent (120 events an hour at most: days of backlog at 10,000 nodes); its end is
    one more, and the nodes still silent then are said as before."""
    nodes = tuple(f"gpu{n:02d}" for n in range(30))
    path, rx = fleet(fleet_store, nodes=nodes, last=T0), receiver()
    status, said = sweep(path, rx.url, T0 + 8 * 3600)
    assert status == 0
    (body,) = rx.bodies
    assert [e["kind"] for e in body["events"]] == ["stale"], body
    assert "heard from no node since" in body["events"][0]["text"] and "30 nodes" in (
        body["events"][0]["text"]
    )
    assert sweep(path, rx.url, T0 + 9 * 3600)[1].out == ["nothing to notify"]
    conn = open_fleet(path)
    with conn:  # collect is back: every node but the last two heard from
        for n, node in enumerate(nodes[:-2]):
            row = (f"s{n}", node, None, "healthcheck", T0 + 10 * 3600, 0.05, "ok", "v", "{}")
            conn.execute(store.insert_sql("runs"), row)
    conn.close()
    assert sweep(path, rx.url, T0 + 10 * 3600 + 60)[0] == 0
    events = rx.bodies[-1]["events"]
    assert [(e["kind"], e["node"]) for e in events] == [
        ("current", ""), ("silent", "gpu28"), ("silent", "gpu29")]
    assert "28 nodes heard from" in events[0]["text"]


def test_a_receiver_that_fails_then_takes_it_is_retried(fleet_store, receiver):
    path, rx = fleet(fleet_store), receiver((503, 429))
    act(path, "gpu01", "drain", T0 + 10)
    status, _ = sweep(path, rx.url, T0 + 60)
    assert status == 0 and rx.answered == [503, 429, 200] and len(rx.bodies) == 1


def test_a_receiver_that_is_down_or_refuses_loses_nothing(fleet_store, receiver):
    path = fleet(fleet_store)
    act(path, "gpu01", "drain", T0 + 10)
    down = receiver()
    url = down.url
    down.close()  # nothing listens there now
    status, said = sweep(path, url, T0 + 60)
    assert status == 1 and len(said.err) == 1
    assert said.err[0].startswith("http://127.0.0.1/... did not take the post: ")
    assert said.err[0].endswith("; 1 event kept for the next run")
    refusing = receiver((404,))  # a wrong key: not tried again
    assert sweep(path, refusing.url, T0 + 70)[0] == 1 and refusing.answered == [404]
    up = receiver()
    assert sweep(path, up.url, T0 + 80)[0] == 0
    assert [e["node"] for e in up.bodies[0]["events"]] == ["gpu01"]


def test_nodes_gone_silent_are_said_once_and_again_when_heard_from(fleet_store, receiver):
    path, rx = fleet(fleet_store, last=T0), receiver()
    conn = open_fleet(path)
    with conn:  # gpu01 keeps running; gpu02 and gpu03 stopped at T0
        conn.execute(store.insert_sql("runs"), ("r9", "gpu01", None, "healthcheck",
                                                T0 + 7 * HOUR, 0.05, "ok", "v", "{}"))
    conn.close()
    sweep(path, rx.url, T0 + 7 * HOUR + 60)
    assert [(e["kind"], e["node"]) for e in rx.bodies[0]["events"]] == [
        ("silent", "gpu02"), ("silent", "gpu03")]
    assert rx.bodies[0]["events"][0]["text"] == "gpu02 not heard from since 2026-05-28T20:26:40Z"
    assert sweep(path, rx.url, T0 + 8 * HOUR)[1].out == ["nothing to notify"]
    conn = open_fleet(path)
    with conn:
        conn.execute(store.insert_sql("runs"), ("r10", "gpu02", None, "healthcheck",
                                                T0 + 8 * HOUR + 60, 0.05, "ok", "v", "{}"))
    conn.close()
    sweep(path, rx.url, T0 + 8 * HOUR + 120)
    assert [(e["kind"], e["node"]) for e in rx.bodies[-1]["events"]] == [("heard", "gpu02")]


def test_a_node_that_ran_jobs_with_no_run_on_record_is_said_once(fleet_store, receiver):
    """Accounting's jobs on gpu09, a node with no run at all (its hooks are not running):
    said once, with its jobs of the last day; not again while it stays so; forgotten once its
    first run is on record, so that it is told again if it stops recording."""
    path, rx = fleet(fleet_store, last=T0), receiver()
    conn = open_fleet(path)
    with conn:
        conn.executemany(
            "INSERT INTO jobs (node, job_id, start) VALUES (?, ?, ?)",
            [("gpu09", "7", T0 - HOUR), ("gpu09", "8", T0 - 60), ("gpu01", "9", T0 - 60)],
        )
    conn.close()
    sweep(path, rx.url, T0 + 60)
    (told,) = rx.bodies[0]["events"]
    assert (told["kind"], told["node"]) == ("unguarded", "gpu09")
    assert told["text"] == (
        "gpu09 ran 2 jobs within 24 h with no run of slurmhealth's on record: its hooks are "
        "not running, or its exports never arrive"
    )
    assert sweep(path, rx.url, T0 + 120)[1].out == ["nothing to notify"]
    conn = open_fleet(path)
    with conn:
        conn.execute(store.insert_sql("runs"), ("r9", "gpu09", None, "healthcheck",
                                                T0 + 180, 0.05, "ok", "v", "{}"))
    conn.close()
    assert sweep(path, rx.url, T0 + 240)[1].out == ["nothing to notify"]
    act(path, "gpu01", "drain", T0 + 250)  # the next post keeps what was told
    sweep(path, rx.url, T0 + 300)
    assert [e["kind"] for e in rx.bodies[1]["events"]] == ["drained"]
    conn = open_fleet(path)
    state = store.get_meta(conn, notify.KEY)
    conn.close()
    assert state["unguarded"] == []


def test_the_rate_limit_keeps_the_rest_for_later_posts(fleet_store, receiver):
    path, rx = fleet(fleet_store, nodes=[f"gpu{n:02d}" for n in range(30)]), receiver()
    for n in range(30):
        act(path, f"gpu{n:02d}", "drain", T0 + n)
    status, said = sweep(path, rx.url, T0 + 100, max_events=12, max_posts=2)
    assert said.out == [
        "posted 12 events to http://127.0.0.1/...; 18 more events for the next posts"]
    assert rx.bodies[0]["more"] == 18
    sweep(path, rx.url, T0 + 200, max_events=12, max_posts=2)
    status, said = sweep(path, rx.url, T0 + 300, max_events=12, max_posts=2)
    assert said.out == ["rate limit: 2 posts in the last hour; 6 events wait for the next"]
    sweep(path, rx.url, T0 + 100 + HOUR, max_events=12, max_posts=2)
    posted = [e["node"] for body in rx.bodies for e in body["events"]]
    assert posted == [f"gpu{n:02d}" for n in range(30)]  # every one, in order, once


def test_slack_format_escapes_what_a_reason_could_forge(fleet_store, receiver):
    path, rx = fleet(fleet_store), receiver()
    hostile = "slurmhealth: job <!channel> & <https://evil.example|click>\x1b[31m\nsecond line"
    act(path, "gpu01", "drain", T0 + 10, why=hostile)
    sweep(path, rx.url, T0 + 60, fmt="slack")
    (text,) = rx.bodies[0].values()
    assert "<" not in text and ">" not in text and "\x1b" not in text and "\n" not in text
    assert "&lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;" in text
    assert text.startswith("slurmhealth: drained gpu01: ")


def test_a_dry_run_posts_and_marks_nothing(fleet_store, receiver):
    path, rx = fleet(fleet_store), receiver()
    act(path, "gpu01", "drain", T0 + 10)
    status, said = sweep(path, rx.url, T0 + 60, dry_run=True)
    assert status == 0 and rx.answered == []
    assert json.loads(said.out[0])["events"][0]["node"] == "gpu01"
    sweep(path, rx.url, T0 + 70)
    assert len(rx.bodies) == 1  # the dry run marked nothing: the real run posts it


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://x/y", "http://", "hooks.example"])
def test_only_http_urls(url):
    with pytest.raises(CommandError) as err:
        notify.check_url(url)
    assert err.value.option == "--url"


def test_the_command_as_an_admin_runs_it(fleet_store, receiver):
    path, rx = fleet(fleet_store), receiver()
    act(path, "gpu01", "drain", T0 + 10)
    env = {"SLURMHEALTH_WEBHOOK_URL": rx.url}
    args = ("notify", "--db", path, "--now", "2026-05-28T21:00:00", "--format", "slack")
    proc = run_cli(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "posted 1 event to http://127.0.0.1/...\n"
    assert rx.bodies[0]["text"].startswith("slurmhealth: drained gpu01")
    bad = run_cli("notify", "--db", path, "--url", "file:///etc/shadow")
    assert bad.returncode == 2 and "not an http or https URL" in bad.stderr
    assert "Traceback" not in bad.stderr
    helped = run_cli("notify", "--help", env=env)
    assert helped.returncode == 0 and len(rx.bodies) == 1  # --help never acts
