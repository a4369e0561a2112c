"""The drain and resume decisions, in-process: a Slurm client stand-in that keeps node states in
memory, a real store file. The end-to-end versions (a real hook process, scontrol stand-ins and a
real slurmctld) are in test_agent.py and tests/slurm."""

from __future__ import annotations

import time

import pytest

from slurmhealth.core import slurm, store
from slurmhealth.core.constants import BREAKER, DRAINED, FAILED, HELD, REBOOTING, SKIPPED
from slurmhealth.node import actions, config
from slurmhealth.node.checks import gpu
from slurmhealth.node.journal import Journal

SETTINGS = config.defaults()["settings"]


class Client:
    """The calls actions.py makes of core.slurm.Slurm, answered from a dict of nodes."""

    def __init__(self, states: dict, fail: str = "") -> None:
        self.states = {
            name: {"name": name, "state": s, "flags": s.split("+"), "reason": r, "since": t}
            for name, (s, r, t) in states.items()
        }
        self.fail = fail  # "node", "nodes" or "drain": that call raises SlurmError
        self.calls: list = []

    def _maybe_fail(self, call: str) -> None:
        self.calls.append(call)
        if self.fail == call:
            raise slurm.SlurmError(f"scontrol {call}: timed out")

    def node(self, name: str) -> dict:
        self._maybe_fail("node")
        return dict(self.states[name])

    def nodes(self) -> list:
        self._maybe_fail("nodes")
        return [dict(n) for n in self.states.values()]

    def drain(self, name: str, why: str) -> None:
        self._maybe_fail("drain")
        self.states[name].update(state="IDLE+DRAIN", flags=["IDLE", "DRAIN"], reason=why)
        self.states[name]["since"] = time.time()

    def resume(self, name: str) -> None:
        self._maybe_fail("resume")
        self.states[name].update(state="IDLE", flags=["IDLE"], reason="")


def fleet(n: int = 20, **special) -> dict:
    out = {f"gpu{i:02d}": ("IDLE", "", 0.0) for i in range(1, n + 1)}
    out.update(special)
    return out


@pytest.fixture
def conn(tmp_path):
    return store.connect(str(tmp_path / "node.db"))


def drain(client, conn, node="gpu01", message="GPU 3 GpuIsLost", **settings):
    logged: list = []
    journal = Journal(conn, "test", logged.append)
    outcome = actions.drain(client, node, message, dict(SETTINGS, **settings), journal)
    return outcome, logged


def recorded(conn):
    return [tuple(r) for r in conn.execute("SELECT action, reason, ok FROM actions ORDER BY time")]


def test_a_node_in_service_is_drained_with_our_reason(conn):
    client = Client(fleet())
    outcome, _ = drain(client, conn)
    assert outcome == DRAINED
    assert client.states["gpu01"]["reason"] == "slurmhealth: GPU 3 GpuIsLost"
    assert recorded(conn) == [("drain", "slurmhealth: GPU 3 GpuIsLost", 1)]


def test_a_node_someone_else_took_out_is_left_alone(conn):
    client = Client(fleet(gpu01=("IDLE+DRAIN", "admin: fan", 1.0)))
    outcome, _ = drain(client, conn)
    assert outcome == SKIPPED and "drain" not in client.calls
    assert client.states["gpu01"]["reason"] == "admin: fan"
    assert recorded(conn)[0][0] == "drain-skipped"


def test_a_skip_said_once_is_not_repeated_until_something_changes(conn):
    """repeat_skip=False (the hourly lemon sweep): a node that stays out is recorded as skipped
    once; a new reason of its own, or any action in between, makes the next skip worth a row.
    The default repeats (a hook's skip is an event of its own)."""
    client = Client(fleet(gpu01=("IDLE+DRAIN", "admin: fan", 1.0)))

    def sweep(message="lemon: 4 faults"):
        journal = Journal(conn, "sweep", print)
        return actions.drain(client, "gpu01", message, SETTINGS, journal, repeat_skip=False)

    assert [sweep(), sweep(), sweep()] == [SKIPPED] * 3
    assert [r[0] for r in recorded(conn)] == ["drain-skipped"]
    client.states["gpu01"]["reason"] = "admin: fan and PSU"  # the admin said more
    sweep()
    sweep("lemon: 5 faults")  # the evidence grew
    assert len(recorded(conn)) == 3
    store.record_action(conn, "gpu01", "resume", "back", "admin", True, "", time.time() + 1)
    store.record_action(conn, "gpu01", "drain", "x", "hc", True, "", time.time() + 2)
    client.states["gpu01"]["reason"] = "admin: fan and PSU"
    journal = Journal(conn, "sweep", print)
    assert actions.drain(
        client, "gpu01", "lemon: 5 faults", SETTINGS, journal, repeat_skip=False
    ) == SKIPPED
    assert len(recorded(conn)) == 6, "after other actions, the skip is said again"
    drain(client, conn)
    drain(client, conn)
    assert len(recorded(conn)) == 8, "a hook's skips are each recorded"


def test_the_breaker_refuses_past_its_share_and_says_so(conn):
    now = time.time()
    ours = {f"gpu{i:02d}": ("IDLE+DRAIN", "slurmhealth: x", now) for i in (2, 3)}
    client = Client(fleet(20, **ours))  # 2 of 20 already drained by us: the 10% cap
    outcome, logged = drain(client, conn)
    assert outcome == BREAKER and "drain" not in client.calls
    assert any("CIRCUIT BREAKER OPEN" in line for line in logged)
    assert recorded(conn) == [("breaker", "slurmhealth: GPU 3 GpuIsLost", 0)]


def test_a_failed_drain_is_recorded_as_failed(conn):
    client = Client(fleet(), fail="drain")
    outcome, logged = drain(client, conn)
    assert outcome == FAILED and any("could not drain" in line for line in logged)
    assert recorded(conn) == [("drain", "slurmhealth: GPU 3 GpuIsLost", 0)]


@pytest.mark.parametrize(
    ("state", "reason", "next_state", "outcome"),
    [
        ("DOWN+REBOOT_ISSUED+NOT_RESPONDING", "reboot requested : reboot issued", "", DRAINED),
        ("DOWN+NOT_RESPONDING", "Not responding", "", DRAINED),
        ("DOWN+DRAIN+REBOOT_ISSUED+NOT_RESPONDING", "Reboot ASAP : reboot issued", "RESUME",
         REBOOTING),
        ("DOWN+REBOOT_ISSUED+NOT_RESPONDING", "reboot requested : reboot issued", "DOWN", SKIPPED),
        ("DOWN+DRAIN+REBOOT_ISSUED", "admin: fan : reboot issued", "", SKIPPED),
        ("DOWN", "admin: PSU", "", SKIPPED),
    ],
)
def test_a_node_back_in_service_when_its_slurmd_registers_is_drained_by_its_hooks(
    conn, state, reason, next_state, outcome
):
    """slurmd runs the health check at its start, before it registers (slurm.conf(5)); Slurm
    returns a rebooted or unanswering node to service at that registration. A fault found then
    is drained (the DRAIN holds through the registration), or held pending where the reboot
    lifts drains (ASAP, nextstate=RESUME); a node someone keeps out is left alone."""
    client = Client(fleet(gpu01=(state, reason, 1.0)))
    if next_state:
        client.states["gpu01"]["next_state"] = next_state
    logged: list = []
    sweep = Journal(conn, "slurmhealth lemons", logged.append)
    # the lemon sweep and diagnose leave every node that is out as it is
    assert actions.drain(client, "gpu01", "lemon: x", SETTINGS, sweep, False) == SKIPPED
    journal = Journal(conn, "slurmhealth healthcheck", logged.append)
    got = actions.drain(client, "gpu01", "GPU 3 GpuIsLost", SETTINGS, journal, rejoining=True)
    assert got == outcome
    assert ("drain" in client.calls) is (outcome == DRAINED)
    if outcome == DRAINED:
        assert client.states["gpu01"]["reason"] == "slurmhealth: GPU 3 GpuIsLost"
    else:
        assert client.states["gpu01"]["reason"] == reason
    if outcome == REBOOTING:
        assert recorded(conn) == [("drain-skipped", "slurmhealth: GPU 3 GpuIsLost", 1)]
        assert "NextState=RESUME" in logged[0] and "stays pending" in logged[0]


@pytest.mark.parametrize("state", ["DOWN+DRAIN", "DOWN+DRAIN+REBOOT_ISSUED+NOT_RESPONDING"])
def test_our_drain_of_a_node_that_is_down_too_is_never_resumed_by_us(conn, state):
    """Drained by us while it rebooted, a node ReturnToService keeps DOWN (0, or 1 after a
    reboot) stays DOWN: our resume would lift the DOWN too, which is not ours to lift."""
    info = {"name": "n", "state": state, "flags": state.split("+"), "reason": "slurmhealth: x"}
    assert not actions.may_resume(info)
    client = Client(fleet(gpu01=(state, "slurmhealth: GPU 3 GpuIsLost", 1.0)))
    store.record_action(conn, "gpu01", "drain", "slurmhealth: GPU 3", "hc", True, "", 1.0)
    for _ in range(SETTINGS["resume_after"]):
        run = {"node": "gpu01", "phase": "healthcheck", "started": time.time(), "duration": 0.1}
        run.update(verdict="ok", tool_version="t", sources="{}", job_id=None)
        store.record_run(conn, {"run": run, "results": [], "events": [], "baselines": {}})
    assert not actions.resume_if_due(client, "gpu01", SETTINGS, Journal(conn, "hc", print))
    assert "resume" not in client.calls


def test_a_node_we_resumed_that_fails_again_soon_is_on_probation(conn):
    now = time.time()
    store.record_action(conn, "gpu01", "drain", "slurmhealth: old", "test", when=now - 86400)
    store.record_action(conn, "gpu01", "resume", "3 passes", "test", when=now - 3600)
    client = Client(fleet())
    outcome, _ = drain(client, conn)
    assert outcome == DRAINED
    reason = client.states["gpu01"]["reason"]
    assert reason.startswith("slurmhealth: probation: an admin must resume")
    assert not actions.may_resume(client.node("gpu01"))


@pytest.mark.parametrize(
    ("reason", "ours"),
    [
        ("slurmhealth: GPU 3 GpuIsLost", True),
        ("slurmhealth: probation: an admin must resume", False),
        ("slurmhealth: lemon: 5 hardware faults", False),
        ("admin: replace fan", False),
    ],
)
def test_only_our_plain_drains_may_be_resumed(reason, ours):
    info = {"name": "n", "state": "IDLE+DRAIN", "flags": ["IDLE", "DRAIN"], "reason": reason}
    assert actions.may_resume(info) is ours


@pytest.mark.parametrize(
    ("verdicts", "needed", "due"),
    [
        (["ok", "ok", "ok"], 3, True),
        (["ok", "warn", "ok"], 3, True),
        (["ok", "ok"], 3, False),
        (["ok", "fail", "ok"], 3, False),
        ([], 0, False),  # at least one pass, whatever the setting says
        (["ok"], 0, True),
    ],
)
def test_resume_is_due_after_enough_consecutive_passes(verdicts, needed, due):
    assert actions.resume_due(verdicts, needed) is due


def test_resume_lifts_our_drain_after_the_passes_and_records_it(conn):
    client = Client(fleet())
    drain(client, conn)
    journal = Journal(conn, "slurmhealth healthcheck", print)
    assert not actions.resume_if_due(client, "gpu01", SETTINGS, journal)  # no passes yet
    for _ in range(SETTINGS["resume_after"]):
        run = {"node": "gpu01", "phase": "healthcheck", "started": time.time(), "duration": 0.1}
        run.update(verdict="ok", tool_version="t", sources="{}", job_id=None)
        store.record_run(conn, {"run": run, "results": [], "events": [], "baselines": {}})
    assert actions.resume_if_due(client, "gpu01", SETTINGS, journal)
    assert client.states["gpu01"]["reason"] == ""
    assert recorded(conn)[-1][0] == "resume"


def test_resume_never_touches_an_admins_drain(conn):
    client = Client(fleet(gpu01=("IDLE+DRAIN", "admin: fan", 1.0)))
    assert not actions.resume_if_due(client, "gpu01", SETTINGS, Journal(conn, "hc", print))
    assert "resume" not in client.calls


def test_a_slurm_failure_while_resuming_is_one_log_line(conn):
    logged: list = []
    client = Client(fleet(), fail="node")
    assert not actions.resume_if_due(client, "gpu01", SETTINGS, Journal(conn, "hc", logged.append))
    assert len(logged) == 1 and "could not resume gpu01" in logged[0]


def _device(index, remap_pending=False, recovery=0, processes=(), error=None):
    fields = {"remap_pending": remap_pending, "recovery_action": recovery}
    return {"index": index, "fields": fields, "processes": list(processes), "error": error}


def test_resets_are_asked_for_idle_gpus_that_a_reset_would_mend():
    facts = {
        "devices": [
            _device(0),
            _device(1, remap_pending=True),
            _device(2, recovery=1),  # NVML GPU_RESET
            _device(3, recovery=4),  # DRAIN_AND_RESET
            _device(4, recovery=2),  # NODE_REBOOT: a reset does not mend it
            _device(5, remap_pending=True, processes=[{"pid": 7}]),  # busy: not now
            _device(6, remap_pending=True, error="GpuIsLost"),  # lost: a reset cannot reach it
        ]
    }
    assert gpu.resets_of(facts) == [1, 2, 3]


def test_an_answer_that_lists_no_node_holds_the_breaker(conn):
    """sinfo that answers with nothing cannot count the fleet: hold, as when it fails."""
    client = Client(fleet())
    client.nodes = lambda: []  # type: ignore[method-assign]
    outcome, logged = drain(client, conn)
    assert outcome == HELD and "drain" not in client.calls
    assert any("SLURM UNREACHABLE, NOTHING DRAINED" in line for line in logged)


class Racing(Client):
    """A Client where something happens between two calls, as on a live cluster: `after`
    maps a call to a function of the states run once, right after that call answers."""

    def __init__(self, states: dict, after: dict, **kw) -> None:
        super().__init__(states, **kw)
        self.after = dict(after)

    def node(self, name: str) -> dict:
        got = super().node(name)
        self._then("node")
        return got

    def drain(self, name: str, why: str) -> None:
        try:
            super().drain(name, why)
        finally:
            self._then("drain")

    def _then(self, call: str) -> None:
        action = self.after.pop(call, None)
        if action is not None:
            action(self.states)


def test_an_admins_drain_in_the_settle_is_never_lifted(conn, monkeypatch):
    """The recount after a drain resumes the node only when it is ours and past the cap: an
    admin who drained it in the 0.3 s settle keeps it drained (it was resumed, "others drained
    first", though no other node was)."""
    monkeypatch.setattr(actions, "SETTLE_S", 0.0)

    def admin(states: dict) -> None:
        states["gpu01"].update(state="IDLE+DRAIN", flags=["IDLE", "DRAIN"])
        states["gpu01"].update(reason="admin: fan replaced, keep out", since=time.time())

    client = Racing(fleet(4), {"drain": admin})
    outcome, _ = drain(client, conn, breaker_share=0.5)
    assert outcome == DRAINED and "resume" not in client.calls
    assert client.states["gpu01"]["reason"] == "admin: fan replaced, keep out"


def test_the_nodes_own_fresh_drain_is_not_a_burst_that_trips_the_breaker(conn):
    """The node's health check drained it between this prolog's `show node` and its count of
    the fleet: the node is out (SKIPPED, the job refused), not a drain of another node that
    opens the breaker and lets the job run on the faulty node."""

    def health_check(states: dict) -> None:
        states["gpu01"].update(state="IDLE+DRAIN", flags=["IDLE", "DRAIN"])
        states["gpu01"].update(reason="slurmhealth: GPU 3 GpuIsLost", since=time.time())

    client = Racing(fleet(4), {"node": health_check})  # cap: 1 of 4
    outcome, _ = drain(client, conn)
    assert outcome == SKIPPED and "drain" not in client.calls
    assert recorded(conn)[0][0] == "drain-skipped"


def test_an_update_that_timed_out_but_landed_is_a_drain_counted_in_the_burst(conn, monkeypatch):
    """A stopped controller that takes the update after the call timed out: the drain is
    there, so it is one (recorded, counted, recounted with the burst), not a failure that
    skipped the recount and left two nodes drained against a cap of one."""
    monkeypatch.setattr(actions, "SETTLE_S", 0.0)
    now = time.time()
    client = Client(fleet(10))

    def applied_anyway(name: str, why: str) -> None:
        client.calls.append("drain")
        client.states[name].update(state="IDLE+DRAIN", flags=["IDLE", "DRAIN"], reason=why)
        client.states[name]["since"] = now + 1
        client.states["gpu02"].update(state="IDLE+DRAIN", flags=["IDLE", "DRAIN"])
        client.states["gpu02"].update(reason="slurmhealth: x", since=now)  # drained first
        raise slurm.SlurmError("scontrol update timed out after 2 s")

    client.drain = applied_anyway
    outcome, _ = drain(client, conn)  # cap: 1 of 10, and gpu02 was first
    assert outcome == BREAKER and client.states["gpu01"]["reason"] == ""
    assert "resume" in client.calls
