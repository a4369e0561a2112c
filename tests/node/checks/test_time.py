"""checks/time.py: adjtimex(2)'s state and status read as synchronised or not; nothing judged
by default; an expected synchronised clock warns when it is not, maxerror beyond its bound
fails."""

from __future__ import annotations

from hypothesis import given, settings
from test_fs import json_values

from slurmhealth.core import result
from slurmhealth.node import config
from slurmhealth.node.checks import time as clock
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import Options, host

# chronyd keeping the clock: TIME_OK, STA_PLL|STA_NANO; the kernel's own view with no daemon:
# TIME_ERROR, STA_UNSYNC, maxerror at NTP_PHASE_LIMIT (16 s).
SYNCED = {"state": 0, "status": 0x2001, "maxerror": 12500, "esterror": 40, "offset": 0}
UNSYNCED = {"state": 5, "status": 0x40, "maxerror": 16000000, "esterror": 16000000, "offset": 0}


def run(check, reading: dict, **over) -> result.Result:
    expect = dict(config.defaults()["time"], **over)
    res = check(clock.parse({"clock": reading}), Context(expect=expect))
    assert isinstance(res, result.Result)
    return res


def test_parse_reads_the_kernels_state():
    facts = clock.parse({"clock": SYNCED})
    assert facts["synchronised"] is True and facts["maxerror_ms"] == 12.5
    assert clock.parse({"clock": UNSYNCED})["synchronised"] is False
    # STA_UNSYNC alone says unsynchronised, whatever the state
    assert clock.parse({"clock": dict(SYNCED, status=0x41)})["synchronised"] is False


@settings(max_examples=150, deadline=None)
@given(raw=json_values)
def test_parse_and_checks_never_raise(raw):
    facts = clock.parse({"clock": raw})
    ctx = Context(expect={"synchronised": True, "max_error_ms": 100.0})
    for check in clock.CHECKS:
        assert check(facts, ctx)


def test_nothing_is_judged_by_default_so_a_container_passes():
    assert [run(c, UNSYNCED).status for c in clock.CHECKS] == ["ok", "ok"]
    assert clock.expected(config.defaults()["time"]) is False


def test_an_expected_synchronised_clock_warns_when_it_is_not():
    res = run(clock.synchronised, UNSYNCED, synchronised=True)
    assert (res.status, res.action) == ("warn", "none")
    assert run(clock.synchronised, SYNCED, synchronised=True).status == "ok"


def test_maxerror_beyond_the_bound_fails_drain():
    res = run(clock.max_error, UNSYNCED, max_error_ms=100.0)
    assert (res.status, res.action) == ("fail", "drain")
    assert res.message == "clock maxerror 16000 ms beyond 100 ms"
    assert run(clock.max_error, SYNCED, max_error_ms=100.0).status == "ok"


def test_a_clock_left_to_the_health_check_skips():
    res = run(clock.synchronised, {"skipped": host.SKIPPED}, synchronised=True)
    assert res.status == "skip" and "health check" in res.message


def test_genconf_expects_a_synchronised_clock_to_stay_so():
    assert clock.expectations(clock.parse({"clock": SYNCED})) == {"synchronised": True}
    assert clock.expectations(clock.parse({"clock": UNSYNCED})) == {}


def test_the_live_clock_parses():
    facts = clock.parse(host.gather(Options()))
    assert facts["not_read"] is None and isinstance(facts["synchronised"], bool)
    assert facts["maxerror_ms"] >= 0
