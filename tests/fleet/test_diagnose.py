"""Which nodes diagnose --submit takes, returns or refuses (fleet/diagnose.py plan, pure); the
whole loop on a real Slurm is tests/slurm/test_diagnose.py."""

from __future__ import annotations

import shlex

from conftest import HEALTHY_SOURCES, diag_config, printing, run_cli, stand_in

from slurmhealth.core import store
from slurmhealth.fleet import diagnose, signals
from slurmhealth.report import build


def node(name: str, state: str = "idle", reason: str = "") -> dict:
    flags = [state.rstrip("*~#!%$@^-").upper()]
    return {"name": name, "state": state, "flags": flags, "reason": reason, "since": None}


OURS = "slurmhealth: GPU 3 GpuIsLost"
NODES = [
    node("gpu01"),
    node("gpu02", "drained", OURS),
    node("gpu03", "draining", OURS),  # a job still runs there
    node("gpu04", "drained", "disk swap, ticket 42"),  # an admin's
    node("gpu05", "drained", "slurmhealth: service: diagnose medium: dcgm: gpu2 memory"),
    node("gpu06", "maint"),  # in the reservation (idle there), its job gone: lost
    node("gpu07", "drained", OURS),  # its job is queued
    node("gpu08", "drained", diagnose.PASSED),  # its job passed
    node("gpu09", "drained", "slurmhealth: service: diagnose quick: dcgm: gpu0 failed"),
    node("gpu10", "drained", diagnose.PASSED),  # not in the reservation: not ours to return
]


def plan(named=(), reserved=("gpu06", "gpu08", "gpu09"), queued=("gpu07",)) -> dict:
    steps = diagnose.plan(NODES, set(reserved), set(queued), list(named))
    return {n: (what, why) for n, what, why in steps}


def test_our_drained_nodes_are_submitted_and_nothing_else_unasked():
    steps = plan()
    assert steps == {
        "gpu02": (diagnose.SUBMIT, OURS),
        "gpu06": (diagnose.LOST, "its diagnose job ended without an outcome"),
        "gpu08": (diagnose.RETURN, "passed its diagnosis"),
        "gpu09": (diagnose.RELEASE, "slurmhealth: service: diagnose quick: dcgm: gpu0 failed"),
    }


def test_an_admins_drain_is_never_touched_even_when_named():
    steps = plan(named=["gpu04"])
    assert steps["gpu04"][0] == diagnose.REFUSED
    assert "disk swap, ticket 42" in steps["gpu04"][1]


def test_named_nodes_in_service_are_submitted_busy_ones_wait():
    steps = plan(named=["gpu01", "gpu03"])
    assert steps["gpu01"] == (diagnose.SUBMIT, "named by an admin")
    assert steps["gpu03"][0] == diagnose.REFUSED and "jobs" in steps["gpu03"][1]


def test_drains_that_wait_for_an_admin_are_diagnosed_only_when_named():
    """A failed diagnosis (or any service drain, a probation relapse, a lemon) waits for an
    admin's repair; the admin names the node to have it diagnosed again."""
    assert "gpu05" not in plan()
    assert plan(named=["gpu05"])["gpu05"][0] == diagnose.SUBMIT
    lemon = [node("gpu11", "drained", "slurmhealth: lemon: 4 faults in 28 days")]
    assert diagnose.plan(lemon, set(), set(), []) == []
    assert diagnose.plan(lemon, set(), set(), ["gpu11"])[0][1] == diagnose.SUBMIT


def test_a_remediation_still_to_come_is_not_diagnosed_before_it():
    """The remediation ladder (node/ladder.py): a node whose GPU reset waits for its jobs, or
    whose reboot Slurm has not done yet, would be tested before its remedy; once its reason
    says it awaits a diagnosis (or the reboot is over), it is due like any drain of ours."""
    awaiting = "slurmhealth: awaiting diagnosis after a reboot: GPU 0 Xid 79"
    nodes = [
        node("gpu21", "drained", "slurmhealth: reset: GPU 2 Xid 48"),
        node("gpu22", "drained@", "slurmhealth: reboot: GPU 0 Xid 79"),
        node("gpu23", "reboot^", "slurmhealth: reboot: GPU 0 Xid 79 : reboot issued"),
        node("gpu24", "drained", awaiting),
    ]
    assert diagnose.plan(nodes, set(), set(), []) == [("gpu24", diagnose.SUBMIT, awaiting)]
    named = {n: what for n, what, _ in diagnose.plan(nodes, set(), set(), ["gpu21", "gpu23"])}
    assert named == {"gpu21": diagnose.REFUSED, "gpu23": diagnose.REFUSED, "gpu24": diagnose.SUBMIT}


def test_a_node_that_left_slurm_leaves_the_reservation():
    steps = diagnose.plan(NODES[:1], {"gpu42"}, set(), [])
    assert steps == [("gpu42", diagnose.RELEASE, "no longer a node Slurm knows")]


def test_unknown_named_nodes_are_refused():
    assert plan(named=["gpu99"])["gpu99"] == (diagnose.REFUSED, "not a node Slurm knows")


def test_a_node_with_its_job_queued_is_left_alone():
    assert "gpu07" not in plan(named=["gpu07"])


def test_the_job_command_is_fixed_words_quoted():
    command = diagnose.job_command("medium", "/etc/slurm health/x.toml")
    words = shlex.split(command)
    assert words[1:] == [
        "-m",
        "slurmhealth",
        "diagnose",
        "--level",
        "medium",
        "--apply",
        "--config",
        "/etc/slurm health/x.toml",
    ]


# --- diagnoses travel with the rest: export, collect, lemon evidence, the report --------------


def test_diagnoses_travel_to_the_fleet_and_count_as_evidence(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    config = diag_config(tmp_path, tools)
    spool = tmp_path / "spool"
    spool.mkdir()
    node_db = str(tmp_path / "n1.db")
    for fixture, code in (("dcgmi-3.3-r2-fail.json", 1), ("dcgmi-4.x-r3-pass.json", 0)):
        stand_in(tools, "dcgmi", printing(fixture))
        args = ("--node", "n1", "--db", node_db, "--config", config, *HEALTHY_SOURCES)
        proc = run_cli("diagnose", "--level", "medium", *args)
        assert proc.returncode == code, proc.stderr
    proc = run_cli("export", "--db", node_db, "-o", str(spool / "n1.ndjson"))
    assert proc.returncode == 0, proc.stderr
    fleet_db = str(tmp_path / "fleet.db")
    proc = run_cli("collect", str(spool), "--db", fleet_db)
    assert proc.returncode == 0, proc.stderr
    conn = store.connect(fleet_db)
    runs = conn.execute(
        "SELECT started, verdict FROM runs WHERE phase = 'diag' ORDER BY started"
    ).fetchall()
    assert [v for _, v in runs] == ["fail", "ok"]
    data = conn.execute(
        "SELECT data FROM results WHERE check_name = 'diag.dcgm' AND status = 'fail'"
    ).fetchone()[0]
    assert '"level": "medium"' in data and "gpu0" in data
    # lemon evidence: the failed diagnosis is a fault, the passed one ends it
    found = signals.signals(conn, runs[0][0] - 60, runs[1][0] + 60)["n1"]["faults"]
    assert found == [(runs[0][0], "check", 1.0, runs[1][0], ("check:diag.dcgm",))]
    # the nightly report lists both, the figures of the passing one included
    shown = build.diagnosed(conn, runs[0][0] - 60, runs[1][0] + 60)
    assert [(d["node"], d["level"], d["outcome"]) for d in shown] == [
        ("n1", "medium", "fail"),
        ("n1", "medium", "pass"),
    ]
    assert "diag.dcgm" in shown[0]["failures"]


# --- sweep and finish against an in-memory Slurm: an admin acting in the middle ---------------


class Cluster:
    """The calls fleet/diagnose.py makes of core.slurm.Slurm, answered from memory: nodes, one
    maintenance reservation, diagnose jobs. `before[call]` runs once, just before that call
    answers (an admin acting while a pass or a job is under way)."""

    def __init__(self, states: dict) -> None:
        self.states = {name: [state, reason] for name, (state, reason) in states.items()}
        self.reserved: set = set()
        self.jobs: dict = {}
        self.before: dict = {}
        self.resumed: list = []

    def _at(self, call: str) -> None:
        action = self.before.pop(call, None)
        if action is not None:
            action(self)

    def _row(self, name: str) -> dict:
        state, reason = self.states[name]
        return dict(node(name, state, reason), flags=state.upper().split("+"))

    def node(self, name: str) -> dict:
        self._at("node")
        return self._row(name)

    def nodes(self) -> list:
        self._at("nodes")
        return [self._row(n) for n in self.states]

    def drain(self, name: str, why: str) -> None:
        self._at("drain")
        state = self.states[name][0]
        self.states[name] = [state if "drain" in state else "drained", why]  # Slurm: replaced

    def resume(self, name: str) -> None:
        self._at("resume")
        self.states[name] = ["idle", ""]
        self.resumed.append(name)

    def run(self, *args: str, command: str = "scontrol", timeout: float | None = None) -> str:
        self._at(command)
        if command == "squeue":
            return "".join(f"{n}|{n}\n" for n in self.jobs.values())
        if command == "sbatch":
            job_id = str(100 + len(self.jobs))
            self.jobs[job_id] = next(a for a in args if a.startswith("--nodelist=")).split("=")[1]
            return job_id + "\n"
        if args[:3] == ("-o", "show", "reservation"):
            return f"ReservationName={args[3]} Nodes={','.join(sorted(self.reserved)) or '(null)'}"
        if args[:2] == ("show", "hostnames"):
            return "\n".join(args[2].split(",")) + "\n"
        if args[0] in ("create", "update"):
            self.reserved = set(next(a for a in args if a.startswith("Nodes="))[6:].split(","))
            return ""
        if args[0] == "delete":
            self.reserved = set()
            return ""
        raise AssertionError(args)


def admin_drains(name: str):
    def act(cluster: Cluster) -> None:
        cluster.states[name] = ["drained", "admin: PSU fault, RMA ticket 77"]

    return act


def a_sweep(cluster: Cluster, monkeypatch, tmp_path) -> list:
    monkeypatch.setenv("SLURMHEALTH_STATE_DIR", str(tmp_path / "state"))
    settings = {"diag_reservation": "slurmhealth_diag"}
    return diagnose.sweep(cluster, "quick", settings, None, [], "true", 10, print)


def test_a_return_reads_the_node_again_and_never_lifts_an_admins_drain(monkeypatch, tmp_path):
    """A node that passed is returned by the next pass; an admin who drained it between the
    pass's sinfo and its resume (calls of up to 30 s each) keeps it drained."""
    cluster = Cluster({"gpu01": ("drained", diagnose.PASSED), "gpu02": ("idle", "")})
    cluster.reserved = {"gpu01"}
    cluster.before["squeue"] = admin_drains("gpu01")
    done = a_sweep(cluster, monkeypatch, tmp_path)
    assert cluster.resumed == [] and cluster.states["gpu01"][1].startswith("admin: PSU")
    assert [d["what"] for d in done] == ["left"]
    cluster = Cluster({"gpu01": ("drained", diagnose.PASSED)})  # nobody interferes: returned
    cluster.reserved = {"gpu01"}
    assert [d["what"] for d in a_sweep(cluster, monkeypatch, tmp_path)] == ["returned"]
    assert cluster.resumed == ["gpu01"] and cluster.reserved == set()


def test_a_passing_diagnosis_never_replaces_an_admins_drain_made_while_it_ran():
    """The job passed, but an admin drained the node while it ran: marking it passed would
    replace the admin's reason (Slurm does), and the next pass would return the node."""
    import types

    cluster = Cluster({"gpu01": ("maint", "")})
    cluster.before["node"] = admin_drains("gpu01")
    diagnosis = types.SimpleNamespace(node="gpu01", level="quick", verdict="ok", inconclusive=False)
    outcome = diagnose.finish(cluster, diagnosis, {}, None, print)
    assert outcome.startswith("passed; taken out meanwhile (admin: PSU fault")
    assert cluster.states["gpu01"] == ["drained", "admin: PSU fault, RMA ticket 77"]


def test_two_submit_passes_never_run_at_once(monkeypatch, tmp_path):
    """A second pass planning from the first's half-made reservation released a node the first
    had just put there, which the first then resumed outside any reservation, undiagnosed."""
    cluster = Cluster({"gpu01": ("drained", OURS)})
    seen: list = []

    def second_pass(_cluster: Cluster) -> None:
        try:
            a_sweep(cluster, monkeypatch, tmp_path)
        except diagnose.Busy as exc:
            seen.append(str(exc))

    cluster.before["resume"] = second_pass  # in the first pass's _start, before its resume
    done = a_sweep(cluster, monkeypatch, tmp_path)
    assert seen == ["another diagnose --submit pass is running: this one did nothing"]
    assert [d["what"] for d in done] == ["diagnose"] and cluster.reserved == {"gpu01"}
    assert list(cluster.jobs.values()) == ["gpu01"]
