"""The remediation ladder (node/ladder.py): the policy as a pure function of the node's reason,
its reboot flags, the mode and the attempt count; then each step in-process, against a Slurm
stand-in that keeps node states in memory and a real store file. The hooks' wiring is in
test_agent.py (real processes, the fake scontrol); the whole ladder on a real Slurm in
tests/slurm/test_remediation.py."""

from __future__ import annotations

import time

import pytest

from slurmhealth.core import slurm, store
from slurmhealth.core.constants import REBOOT, RESET, SERVICE
from slurmhealth.node import config, ladder
from slurmhealth.node.journal import Journal

SETTINGS = dict(config.defaults()["settings"], remediate="reboot")
KEEP = ladder.KEEP
XID = "GPU 0 (0000:18:00) Xid 79 GPU has fallen off the bus"


class Client:
    """The calls the ladder makes of core.slurm.Slurm, answered from a dict of nodes; a reboot
    is marked as Slurm marks it (REBOOT_REQUESTED, the reason replaced)."""

    def __init__(self, states: dict, fail: str = "") -> None:
        self.states = {
            name: {"name": name, "state": s, "flags": s.split("+"), "reason": r, "since": t}
            for name, (s, r, t) in states.items()
        }
        self.fail = fail  # the call that raises SlurmError
        self.calls: list = []

    def _call(self, call: str) -> None:
        self.calls.append(call)
        if self.fail == call:
            raise slurm.SlurmError(f"scontrol {call}: Unable to contact slurm controller")

    def set(self, name: str, state: str, reason: str) -> None:
        self.states[name].update(state=state, flags=state.split("+"), reason=reason)

    def node(self, name: str) -> dict:
        self._call("node")
        return dict(self.states[name])

    def nodes(self) -> list:
        self._call("nodes")
        return [dict(n) for n in self.states.values()]

    def drain(self, name: str, why: str) -> None:
        self._call("drain")
        base = self.states[name]["state"].split("+")[0]
        self.set(name, f"{base}+DRAIN", why)
        self.states[name]["since"] = time.time()

    def resume(self, name: str) -> None:
        self._call("resume")
        self.set(name, "IDLE", "")

    def reboot(self, name: str, why: str) -> None:
        self._call("reboot")
        self.set(name, self.states[name]["state"] + "+REBOOT_REQUESTED", why)
        self.states[name]["since"] = time.time()


def fleet(n: int = 20, **special) -> dict:
    out = {f"gpu{i:02d}": ("IDLE", "", 0.0) for i in range(1, n + 1)}
    out.update(special)
    return out


@pytest.fixture
def conn(tmp_path):
    return store.connect(str(tmp_path / "node.db"))


def steps(client, conn, settings=None, reset=None, gpus=(0,), node="gpu01"):
    """The ladder of `node` with a journal on `conn`; its log lines in .logged."""
    logged: list = []
    journal = Journal(conn, "slurmhealth healthcheck", logged.append)
    out = ladder.Ladder(client, node, dict(SETTINGS, **(settings or {})), journal, reset, gpus)
    out.logged = logged
    return out


def recorded(conn, node="gpu01"):
    rows = conn.execute(
        "SELECT action, reason, ok, detail FROM actions WHERE node = ? ORDER BY time", (node,)
    )
    return [tuple(r) for r in rows]


def ran(conn, phase, verdict, node="gpu01", started=None):
    run = {"node": node, "phase": phase, "started": started or time.time(), "duration": 0.1}
    run.update(verdict=verdict, tool_version="t", sources="{}", job_id=None)
    store.record_run(conn, {"run": run, "results": [], "events": [], "baselines": {}})


# --- the policy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "mode", "rung"),
    [
        ("reboot", "reboot", REBOOT),
        ("reset_gpu", "reboot", RESET),
        ("reset_gpu", "reset", RESET),
        ("reboot", "reset", None),  # a reboot is past where the site lets it go: drained only
        ("reboot", "off", None),
        ("reset_gpu", "off", None),
        ("drain", "reboot", None),
        ("service", "reboot", None),
    ],
)
def test_how_far_the_ladder_goes_is_the_sites_choice(action, mode, rung):
    assert ladder.rung_for(action, mode) == rung


OURS = f"slurmhealth: {XID}"
UNDER_REBOOT = f"slurmhealth: reboot: {XID}"
ISSUED = f"{UNDER_REBOOT} : reboot issued"
UNDER_RESET = f"slurmhealth: reset: {XID}"
AFTER_REBOOT = f"slurmhealth: awaiting diagnosis after a reboot: {XID}"
AFTER_RESET = f"slurmhealth: awaiting diagnosis after a GPU reset: {XID}"


@pytest.mark.parametrize(
    ("wanted", "reason", "rebooting", "mode", "used", "decided"),
    [
        # a node in service, or a plain drain of ours: the rung asked for, within the limit
        (REBOOT, "", False, "reboot", 0, REBOOT),
        (RESET, OURS, False, "reboot", 1, RESET),
        (REBOOT, "", False, "reboot", 2, SERVICE),  # remediate_max (2) reached
        (REBOOT, "", False, "reboot", None, KEEP),  # the store cannot count: none made
        # under way: goes on; a higher rung replaces it; a reboot Slurm did not take is asked again
        (REBOOT, UNDER_REBOOT, True, "reboot", 1, KEEP),
        (RESET, UNDER_REBOOT, True, "reboot", 1, KEEP),
        (RESET, UNDER_RESET, False, "reboot", 1, KEEP),
        (REBOOT, UNDER_RESET, False, "reboot", 1, REBOOT),
        (REBOOT, UNDER_REBOOT, False, "reboot", 0, REBOOT),
        (REBOOT, UNDER_REBOOT, False, "reboot", 2, SERVICE),
        # done, and the fault is back: one rung up
        (REBOOT, ISSUED, False, "reboot", 1, SERVICE),
        (RESET, AFTER_REBOOT, False, "reboot", 1, SERVICE),
        (RESET, AFTER_RESET, False, "reboot", 1, REBOOT),
        (RESET, AFTER_RESET, False, "reboot", 2, SERVICE),
        (RESET, AFTER_RESET, False, "reset", 1, SERVICE),
        # an admin's to lift: never
        (REBOOT, "slurmhealth: service: GPU 3 row remap failed", False, "reboot", 0, KEEP),
        (REBOOT, "slurmhealth: probation: an admin must resume: x", False, "reboot", 0, KEEP),
        (REBOOT, "slurmhealth: lemon: 4 faults in 28 days", False, "reboot", 0, KEEP),
    ],
)
def test_what_a_failing_run_asks_of_the_ladder(wanted, reason, rebooting, mode, used, decided):
    assert ladder.decide(wanted, reason, rebooting, mode, used, 2) == decided


@pytest.mark.parametrize(
    ("reason", "step"),
    [
        (UNDER_REBOOT, (REBOOT, "under way")),
        (ISSUED, (REBOOT, "under way")),
        (UNDER_RESET, (RESET, "under way")),
        (AFTER_REBOOT, (REBOOT, "done")),
        (AFTER_RESET, (RESET, "done")),
        ("slurmhealth: service: x (2 remediations in 7 d)", (SERVICE, "admin")),
        (OURS, None),
        ("admin: reboot: fan", None),
    ],
)
def test_the_reason_says_where_the_node_stands_and_what_the_fault_was(reason, step):
    assert ladder.step_of(reason) == step
    if step is not None and step[0] != SERVICE:
        assert ladder.message_of(reason) == XID


def test_reasons_say_the_rung_the_count_and_the_window():
    settings = dict(SETTINGS, remediate_window=7 * 86400.0)
    assert ladder.reason_for(REBOOT, XID, 0, settings) == f"reboot: {XID}"
    said = ladder.reason_for(SERVICE, XID, 2, settings)
    assert said == f"service: {XID} (2 remediations in 7 d)"
    why = "failing still after a reboot"
    one = ladder.reason_for(SERVICE, XID, 1, dict(settings, remediate_window=43200.0), why)
    assert one == f"service: {XID} (failing still after a reboot; 1 remediation in 12 h)"
    assert ladder.span(1800) == "30 min"


def test_the_gpus_a_reset_is_for_are_those_the_faults_name():
    data = [
        {"events": [{"xid": 48, "gpu": 2}, {"xid": 63, "gpu": 2}, {"xid": 48, "gpu": None}]},
        {"scope": {"other_gpus": [5]}},
        {"count": 1},
    ]
    assert ladder.gpus_of(data) == [2, 5]
    assert ladder.gpus_of([{"events": [{"gpu": True}]}]) == []


# --- reboot -----------------------------------------------------------------------------------


def drained(client, conn, reason, node="gpu01"):
    """Our drain of the node with `reason` (as actions.drain leaves it), recorded."""
    client.drain(node, reason)
    store.record_action(conn, node, "drain", reason, "slurmhealth healthcheck", True, "")


def test_a_reboot_fault_has_slurm_reboot_our_drained_node_and_says_so(conn):
    client = Client(fleet())
    reason, count = ladder.first_reason(Journal(conn, "t", print), "gpu01", XID, REBOOT, SETTINGS)
    assert (reason, count) == (f"reboot: {XID}", 0)
    drained(client, conn, slurm.reason(reason))
    steps(client, conn).after_drain(XID, REBOOT)
    assert client.calls[-1] == "reboot"
    assert client.states["gpu01"]["reason"] == UNDER_REBOOT
    said = "requested: 1 of 2 remediations in 7 d"
    assert recorded(conn)[-1] == ("reboot", UNDER_REBOOT, 1, said)
    # the runs while it waits for its jobs, or reboots, ask nothing more
    client.calls.clear()
    client.set("gpu01", "MIXED+DRAIN+REBOOT_REQUESTED", UNDER_REBOOT)
    steps(client, conn).after_drain(XID, REBOOT)
    client.set("gpu01", "DOWN+DRAIN+REBOOT_ISSUED", ISSUED)
    steps(client, conn).after_drain(XID, REBOOT)
    assert not steps(client, conn).progress(client.node("gpu01"))
    assert "reboot" not in client.calls and "drain" not in client.calls


def test_back_from_its_reboot_the_node_awaits_a_diagnosis_and_only_that_returns_it(conn):
    client = Client(fleet(gpu01=("IDLE+DRAIN", ISSUED, 1.0)))
    store.record_action(conn, "gpu01", "reboot", UNDER_REBOOT, "hc", True, "requested", 1.0)
    assert not steps(client, conn).progress(client.node("gpu01"))
    assert client.states["gpu01"]["reason"] == AFTER_REBOOT
    assert recorded(conn)[-1] == ("remediated", AFTER_REBOOT, 1, "rebooted")
    for _ in range(5):  # passing health checks alone: never
        ran(conn, "healthcheck", "ok")
        assert not steps(client, conn).progress(client.node("gpu01"))
    ran(conn, "diag", "warn")  # inconclusive: nothing ran that could pass it
    ran(conn, "healthcheck", "ok")
    ran(conn, "healthcheck", "ok")
    assert not steps(client, conn).progress(client.node("gpu01"))
    ran(conn, "diag", "ok")
    ran(conn, "healthcheck", "ok")
    assert not steps(client, conn).progress(client.node("gpu01"))  # resume_after is 3
    ran(conn, "healthcheck", "fail")
    ran(conn, "healthcheck", "ok")
    ran(conn, "healthcheck", "ok")
    assert not steps(client, conn).progress(client.node("gpu01"))
    ran(conn, "healthcheck", "ok")
    assert steps(client, conn).progress(client.node("gpu01"))
    assert client.states["gpu01"]["state"] == "IDLE"
    action, reason, ok, _ = recorded(conn)[-1]
    assert (action, ok) == ("resume", 1)
    assert reason == f"a diagnosis passed after a reboot: {AFTER_REBOOT}"


def test_a_diagnosis_before_the_remediation_was_done_does_not_count(conn):
    ran(conn, "diag", "ok", started=time.time() - 60)
    client = Client(fleet(gpu01=("IDLE+DRAIN", ISSUED, 1.0)))
    steps(client, conn).progress(client.node("gpu01"))
    for _ in range(3):
        ran(conn, "healthcheck", "ok")
    assert not steps(client, conn).progress(client.node("gpu01"))


def test_a_fault_back_after_its_reboot_leaves_the_node_for_service(conn):
    client = Client(fleet(gpu01=("IDLE+DRAIN", ISSUED, 1.0)))
    store.record_action(conn, "gpu01", "reboot", UNDER_REBOOT, "hc", True, "requested")
    steps(client, conn).after_drain(XID, REBOOT)
    want = f"slurmhealth: service: {XID} (failing still after a reboot; 1 remediation in 7 d)"
    assert client.states["gpu01"]["reason"] == want
    assert "reboot" not in client.calls
    assert recorded(conn)[-1] == ("drain", want, 1, f"was: {ISSUED}")
    assert not steps(client, conn).progress(client.node("gpu01"))  # an admin's now


def test_past_the_limit_a_node_in_service_is_drained_for_service(conn):
    for hours in (30, 20):
        when = time.time() - hours * 3600
        store.record_action(conn, "gpu01", "reboot", UNDER_REBOOT, "hc", True, "requested", when)
    # an epilog's routine reset of an idle GPU is no remediation of the ladder's
    store.record_action(conn, "gpu01", "reset_gpu", "GPU 3", "slurmhealth epilog", True, "")
    store.record_action(conn, "gpu01", "reboot", UNDER_REBOOT, "hc", False, "failed: timeout")
    journal = Journal(conn, "t", print)
    reason, count = ladder.first_reason(journal, "gpu01", XID, REBOOT, SETTINGS)
    assert (reason, count) == (f"service: {XID} (2 remediations in 7 d)", 2)
    old = time.time() - 8 * 86400  # outside the window: counts no more
    conn.execute("UPDATE actions SET time = ? WHERE action = 'reboot'", (old,))
    conn.commit()
    assert ladder.first_reason(journal, "gpu01", XID, REBOOT, SETTINGS) == (f"reboot: {XID}", 0)


def test_without_a_store_to_count_in_nothing_is_remediated(tmp_path):
    journal = Journal(None, "t", print)
    reason, count = ladder.first_reason(journal, "gpu01", XID, REBOOT, SETTINGS)
    assert (reason, count) == (XID, None)  # drained as without the ladder
    client = Client(fleet(gpu01=("IDLE+DRAIN", UNDER_REBOOT, 1.0)))
    steps(client, None).after_drain(XID, REBOOT)
    assert client.calls == ["node"]


def test_the_circuit_breaker_holds_reboots_as_it_holds_drains(conn):
    now = time.time()
    others = {f"gpu{i:02d}": ("IDLE+DRAIN", "slurmhealth: x", now) for i in (2, 3)}
    client = Client(fleet(20, **others))  # 2 of 20 drained by us within the hour: the cap
    drained(client, conn, UNDER_REBOOT)
    ladder_ = steps(client, conn)
    ladder_.after_drain(XID, REBOOT)
    assert "reboot" not in client.calls
    assert any("CIRCUIT BREAKER OPEN" in line for line in ladder_.logged)
    action, reason, ok, detail = recorded(conn)[-1]
    assert (action, reason, ok) == ("reboot", UNDER_REBOOT, 0)
    assert detail.startswith("refused: circuit breaker: 2 of 20 nodes")
    # said once while it holds; asked again by a later run once the breaker lets it
    steps(client, conn).progress(client.node("gpu01"))
    assert [r[0] for r in recorded(conn)].count("reboot") == 1
    for name in others:
        client.set(name, "IDLE", "")
    steps(client, conn).progress(client.node("gpu01"))
    assert client.calls[-1] == "reboot"
    assert recorded(conn)[-1][2:] == (1, "requested: 1 of 2 remediations in 7 d")


def test_a_reboot_slurm_did_not_take_is_asked_again_and_never_resumed_meanwhile(conn):
    client = Client(fleet(), fail="reboot")
    drained(client, conn, UNDER_REBOOT)
    ladder_ = steps(client, conn)
    ladder_.after_drain(XID, REBOOT)
    action, _, ok, detail = recorded(conn)[-1]
    assert (action, ok) == ("reboot", 0) and detail.startswith("failed: scontrol reboot")
    for _ in range(4):
        ran(conn, "healthcheck", "ok")
    from slurmhealth.node import actions

    journal = Journal(conn, "hc", print)
    assert not actions.resume_if_due(client, "gpu01", SETTINGS, journal)  # never by passes
    client.fail = ""
    assert not actions.resume_if_due(
        client, "gpu01", SETTINGS, journal, lambda: steps(client, conn)
    )
    assert client.calls[-1] == "reboot" and client.states["gpu01"]["state"].endswith("REQUESTED")


def test_a_reboot_an_admin_cancelled_is_not_asked_again(conn):
    client = Client(fleet())
    drained(client, conn, UNDER_REBOOT)
    steps(client, conn).after_drain(XID, REBOOT)
    client.set("gpu01", "IDLE+DRAIN", UNDER_REBOOT)  # scontrol cancel_reboot: our drain stays
    client.calls.clear()
    assert not steps(client, conn).progress(client.node("gpu01"))
    assert client.calls == ["node"]


def test_an_admins_drain_is_never_rebooted_nor_recorded(conn):
    client = Client(fleet(gpu01=("IDLE+DRAIN", "admin: replace fan", 1.0)))
    steps(client, conn).after_drain(XID, REBOOT)
    assert client.calls == ["node"] and recorded(conn) == []
    client.set("gpu01", "DOWN+DRAIN", "slurmhealth: reboot: x : reboot timed out")
    steps(client, conn).after_drain(XID, REBOOT)  # DOWN: Slurm's (ResumeTimeout) or an admin's
    assert "reboot" not in client.calls


# --- reset --------------------------------------------------------------------------------------


def test_a_reset_waits_for_the_jobs_then_the_health_check_resets_the_faults_gpus(conn):
    resets: list = []
    client = Client(fleet(gpu01=("MIXED", "", 0.0)))
    drained(client, conn, slurm.reason(f"reset: {XID}"))
    steps(client, conn, reset=resets.append, gpus=[2]).after_drain(XID, RESET)
    assert resets == [] and recorded(conn)[-1][0] == "reset-wait"
    steps(client, conn, reset=resets.append, gpus=[2]).progress(client.node("gpu01"))
    assert [r[0] for r in recorded(conn)].count("reset-wait") == 1  # said once
    client.set("gpu01", "IDLE+DRAIN", UNDER_RESET)  # the jobs ended

    def reset(gpus):
        resets.append(gpus)
        return []

    steps(client, conn, reset=reset, gpus=[2]).progress(client.node("gpu01"))
    assert resets == [[2]]
    assert client.states["gpu01"]["reason"] == AFTER_RESET
    kinds = [r[:3] for r in recorded(conn)[-2:]]
    assert kinds == [("reset_gpu", UNDER_RESET, 1), ("remediated", AFTER_RESET, 1)]
    assert recorded(conn)[-2][3] == "GPU 2 reset: 1 of 2 remediations in 7 d"


@pytest.mark.parametrize(("mode", "then"), [("reboot", "reboot"), ("reset", "service")])
def test_a_reset_that_fails_climbs_a_rung(conn, mode, then):
    client = Client(fleet(gpu01=("IDLE+DRAIN", UNDER_RESET, 1.0)))
    ladder_ = steps(client, conn, {"remediate": mode}, reset=lambda gpus: gpus, gpus=[2])
    ladder_.progress(client.node("gpu01"))
    assert recorded(conn)[0][:3] == ("reset_gpu", UNDER_RESET, 0)
    reason = client.states["gpu01"]["reason"]
    if then == "reboot":
        assert reason == f"slurmhealth: reboot: {XID} (GPU reset failed)"
        assert client.calls[-1] == "reboot"
    else:
        assert reason == f"slurmhealth: service: {XID} (GPU reset failed; 0 remediations in 7 d)"


def test_no_gpu_to_reset_climbs_too(conn):
    client = Client(fleet(gpu01=("IDLE+DRAIN", UNDER_RESET, 1.0)))
    steps(client, conn, reset=lambda gpus: [], gpus=[]).progress(client.node("gpu01"))
    assert recorded(conn)[0][:3] == ("reset_gpu", UNDER_RESET, 0)
    assert client.calls[-1] == "reboot"


def test_a_relapse_after_a_return_is_the_ladders_to_count_not_probations(conn):
    """Returned by the ladder a day ago, the node fails again with a reboot fault: a second
    reboot (2 of 2), where a plain drain would be on probation; a third: service."""
    from slurmhealth.node import actions

    day = 86400.0
    then = time.time() - 2 * day
    store.record_action(conn, "gpu01", "drain", UNDER_REBOOT, "hc", True, "", then)
    store.record_action(conn, "gpu01", "reboot", UNDER_REBOOT, "hc", True, "requested", then)
    store.record_action(conn, "gpu01", "resume", "a diagnosis passed", "hc", True, "", then + day)
    client = Client(fleet())
    journal = Journal(conn, "slurmhealth healthcheck", print)
    reason, _ = ladder.first_reason(journal, "gpu01", XID, REBOOT, SETTINGS)
    assert actions.drain(client, "gpu01", reason, SETTINGS, journal) == "drained"
    assert client.states["gpu01"]["reason"] == UNDER_REBOOT
    steps(client, conn).after_drain(XID, REBOOT)
    assert recorded(conn)[-1][3] == "requested: 2 of 2 remediations in 7 d"
    plain = actions.drain(Client(fleet()), "gpu01", "GPU 3 GpuIsLost", SETTINGS, journal)
    assert plain == "drained"  # a plain drain of a node we returned a day ago: probation
    assert recorded(conn)[-1][1].startswith("slurmhealth: probation: an admin must resume")
    reason, _ = ladder.first_reason(journal, "gpu01", XID, REBOOT, SETTINGS)
    assert reason == f"service: {XID} (2 remediations in 7 d)"


@pytest.mark.parametrize("reason", [UNDER_RESET, UNDER_REBOOT])
def test_switched_off_meanwhile_the_ladder_starts_nothing_new_and_never_returns_the_node(
    conn, reason
):
    """remediate = "off" while a reset waits or a reboot Slurm did not take is due: neither is
    made; the node stays drained for an admin (passing health checks never lift it)."""
    client = Client(fleet(gpu01=("IDLE+DRAIN", reason, 1.0)))
    ladder_ = steps(client, conn, {"remediate": "off"}, reset=lambda gpus: [], gpus=[0])
    assert not ladder_.progress(client.node("gpu01"))
    assert client.calls == ["node"] and recorded(conn) == []
    assert client.states["gpu01"]["reason"] == reason
