"""checks/imex.py: this node's IMEX daemon and its domain, judged where the run's GPU facts show a
multi-node NVLink fabric (the modelled GB200 tray) or IMEX is expected; tests/fixtures/imex."""

from __future__ import annotations

import json
import os

import pytest
from conftest import FIXTURES, SNAPSHOTS, run_cli, snapshot_path

from slurmhealth.node.checks import gpu, imex
from slurmhealth.node.checks.base import Context

FIX = os.path.join(FIXTURES, "imex")
GB200 = os.path.join(SNAPSHOTS, "gb200-nvl72-healthy.json")


def lines(name: str) -> list[str]:
    with open(os.path.join(FIX, name), encoding="utf-8") as handle:
        return handle.read().splitlines()


def ran(name: str | None = None, **outcome) -> dict:
    base = {"status": 0, "timed_out": False, "error": None, "stderr": ""}
    return {**base, "lines": lines(name) if name else [], **outcome}


def raw(query: dict, domain: dict) -> dict:
    return {"tool": "/usr/bin/nvidia-imex-ctl", "query": query, "domain": domain}


def gpu_facts(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return gpu.parse(json.load(handle)["gpu"])


def ctx(gpus: str | None = GB200, **expect) -> Context:
    base = {k: v[0] for k, v in imex.DEFAULTS.items()}
    others = {"gpu": gpu_facts(gpus)} if gpus else {}
    return Context("gb01", "healthcheck", {**base, **expect}, facts=others)


HEALTHY = raw(ran("query-ready.txt"), ran("domain-up.json"))


def test_a_ready_tray_in_an_up_domain_passes():
    facts = imex.parse(HEALTHY)
    assert imex.daemon(facts, ctx()).message == "IMEX daemon READY"
    assert imex.domain(facts, ctx()).message == "IMEX domain UP, 4 nodes"
    assert imex.expectations(facts) == {"expected": True}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (ran("query-waiting.txt"), "IMEX daemon WAITING_FOR_PEERS, not READY"),
        (ran("query-not-configured.txt"), "IMEX not configured: no node configuration file"),
    ],
)
def test_a_daemon_not_ready_fails(query, message):
    result = imex.daemon(imex.parse(raw(query, ran("domain-up.json"))), ctx())
    assert (result.status, result.action, result.message) == ("fail", "drain", message)


def test_a_command_service_that_does_not_answer_is_judged_only_where_expected():
    refused = ran(status=1, stderr="connection refused")
    facts = imex.parse(raw(refused, ran(status=1)))
    result = imex.daemon(facts, ctx())
    assert result.status == "ok"
    assert result.message == (
        "not judged: nvidia-imex-ctl -q exit 1: connection refused (command service off?)"
    )
    expected = imex.daemon(facts, ctx(expected=True))
    assert (expected.status, expected.message) == (
        "fail", "nvidia-imex-ctl -q exit 1: connection refused"
    )
    hung = imex.daemon(imex.parse(raw(ran(status=None, timed_out=True), ran())), ctx())
    assert (hung.status, hung.message) == ("warn", "nvidia-imex-ctl -q timed out")


def test_a_degraded_domain_warns_naming_the_tray_not_ready():
    facts = imex.parse(raw(ran("query-ready.txt"), ran("domain-degraded.json")))
    result = imex.domain(facts, ctx())
    assert (result.status, result.action) == ("warn", "none")
    assert result.message == "IMEX domain DEGRADED: node 10.0.0.13 UNAVAILABLE"


def test_a_domain_answer_that_is_not_json_is_not_judged():
    facts = imex.parse(raw(ran("query-ready.txt"), ran(lines=["Connection failed"])))
    result = imex.domain(facts, ctx())
    assert result.status == "ok"
    assert result.message == "not judged: nvidia-imex-ctl -N -j no JSON status"


def test_a_node_without_a_multinode_fabric_is_not_judged():
    facts = imex.parse(raw(ran("query-waiting.txt"), ran("domain-degraded.json")))
    for check in imex.CHECKS:
        result = check(facts, ctx(snapshot_path("healthy")))
        assert (result.status, result.message) == ("ok", "not judged: no multi-node NVLink fabric")


def test_untrusted_text_is_bounded_and_one_line():
    domain = {"status": "DOWN\x1b[31m", "nodes": {"0": {"status": "DOWN", "host": "a\nb" * 50}}}
    facts = imex.parse(raw(ran(lines=["REA\x07DY"]), ran(lines=[json.dumps(domain)])))
    assert facts["query"]["word"] is None
    message = imex.domain(facts, ctx()).message
    assert "\n" not in message and "\x1b" not in message and len(message) < 200


@pytest.mark.parametrize("junk", [None, [], {"query": "x", "domain": 3}, {"query": {"lines": 5}}])
def test_parse_never_raises(junk):
    facts = imex.parse(junk)
    assert imex.daemon(facts, ctx()).status in ("ok", "warn", "fail")


def test_the_tray_snapshot_with_imex_replays(tmp_path):
    """`slurmhealth check` replays a GB200 tray with an imex section, as `snapshot` writes it."""
    with open(GB200, encoding="utf-8") as handle:
        doc = json.load(handle)
    doc["sources"]["imex"] = {"status": "ok", "message": "", "seconds": 0.05}
    doc["imex"] = raw(ran("query-waiting.txt"), ran("domain-degraded.json"))
    path = tmp_path / "gb200-imex.json"
    path.write_text(json.dumps(doc))
    proc = run_cli("check", "--no-db", "--json", "--gpu-source", str(path), "--only", "gpu,imex")
    got = {r["check"]: (r["status"], r["message"]) for r in json.loads(proc.stdout)["results"]}
    assert got["imex.daemon"] == ("fail", "IMEX daemon WAITING_FOR_PEERS, not READY")
    assert got["imex.domain"] == ("warn", "IMEX domain DEGRADED: node 10.0.0.13 UNAVAILABLE")
    assert proc.returncode == 1
