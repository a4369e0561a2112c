"""NVLink checks: link state and error-counter deltas."""

from __future__ import annotations

import copy
import json

from conftest import snapshot_path

from slurmhealth.node.checks import nvlink
from slurmhealth.node.checks.base import Context


def facts(name: str = "healthy") -> dict:
    with open(snapshot_path(name)) as handle:
        return nvlink.parse(json.load(handle)["gpu"])


def ctx(baseline=None, now: float = 0.0, **expect) -> Context:
    base = {k: copy.deepcopy(v[0]) for k, v in nvlink.DEFAULTS.items()}
    base.update(expect)
    return Context("gpu01", "prolog", base, baseline, now=now)


def test_all_links_active_is_ok():
    assert nvlink.link_state(facts(), ctx(links_per_gpu=18)).status == "ok"


def test_links_down_fail_with_reset():
    result = nvlink.link_state(facts("nvlink-down"), ctx())
    assert (result.status, result.action) == ("fail", "reset_gpu")
    assert "GPU 5 (0000:ab:00) 16/18 NVLinks active, down [4, 11]" in result.message


def test_fewer_links_than_expected_fail():
    assert nvlink.link_state(facts(), ctx(links_per_gpu=36)).status == "fail"


def test_no_nvlink_and_none_expected_is_skip():
    f = facts()
    for dev in f["devices"]:
        dev["nvlink"] = None  # a PCIe GPU or the single H200 VM: NotSupported on link 0
    assert nvlink.link_state(f, ctx()).status == "skip"
    assert nvlink.error_counters(f, ctx()).status == "skip"
    assert nvlink.link_state(f, ctx(links_per_gpu=18)).status == "fail"


def test_first_run_records_a_baseline():
    assert nvlink.error_counters(facts(), ctx()).message == "baseline recorded"


def bumped(counter: str, by: int, link: int = 3) -> tuple:
    before = nvlink.baseline(facts())
    now = facts()
    now["devices"][2]["nvlink"][link][counter] += by
    return now, before


def test_counter_deltas_warn_and_fail():
    now, before = bumped("replay", 150)
    result = nvlink.error_counters(now, ctx(before))
    assert result.status == "warn" and "GPU 2 (0000:3a:00) link 3 replay +150" in result.message
    now, before = bumped("recovery", 12)
    assert nvlink.error_counters(now, ctx(before)).status == "fail"
    now, before = bumped("crc", 5)
    assert nvlink.error_counters(now, ctx(before)).status == "ok"


def test_counter_that_went_down_starts_a_new_baseline_never_a_fail():
    """A GPU reset or driver reload zeroes the counters: DCGM's health watch resets its own
    value then ("someone likely reset the volatile counter. Just reset ours"); so do we."""
    before = nvlink.baseline(facts(), now=0.0)
    before["counters"]["2:3"]["recovery"] = 40  # counters were reset since
    now = facts()
    now["devices"][2]["nvlink"][3]["recovery"] = 20
    result = nvlink.error_counters(now, ctx(before, now=3600.0))
    assert result.status == "ok"
    assert result.message == "counter reset: new baseline (GPU 2 (0000:3a:00) link 3 recovery)"
    assert result.data["deltas"] == {}
    assert result.data["reset"] == ["GPU 2 (0000:3a:00) link 3 recovery"]


HOUR = 3600.0


def stamped(counter: str, by: int, link: int = 3) -> tuple:
    before = nvlink.baseline(facts(), now=1000.0)
    now = facts()
    now["devices"][2]["nvlink"][link][counter] += by
    return now, before


def test_baseline_keeps_the_time_it_was_read():
    assert nvlink.baseline(facts(), now=12.0)["taken_at"] == 12.0
    assert isinstance(nvlink.baseline(facts())["taken_at"], float)


def test_crc_fails_at_dcgms_100_per_second():
    now, before = stamped("crc", 600_000)
    result = nvlink.error_counters(now, ctx(before, now=1000.0 + 3600.0))  # 167/s for an hour
    assert (result.status, result.action) == ("fail", "reset_gpu")
    assert result.message == "GPU 2 (0000:3a:00) link 3 crc +600000 (167/s)"
    assert result.data["interval_s"] == 3600.0
    result = nvlink.error_counters(now, ctx(before, now=1000.0 + 10 * HOUR))  # 16.7/s
    assert result.status == "warn"  # over crc_warn (100) but under DCGM's 100/s


def test_crc_count_above_the_old_fail_is_no_failure_at_a_low_rate():
    """10,000 CRC errors in a 10-hour job is 0.28/s: DCGM (RM) says CRC errors matter only at
    100+/s, so this warns where the count alone used to fail."""
    now, before = stamped("crc", 10_000)
    assert nvlink.error_counters(now, ctx(before, now=1000.0 + 10 * HOUR)).status == "warn"
    # Interval unknown (a baseline saved without its time): the count judges, as before.
    del before["taken_at"]
    assert nvlink.error_counters(now, ctx(before, now=1000.0 + 10 * HOUR)).status == "fail"


def test_a_short_interval_is_taken_as_dcgms_one_minute_window():
    """Two runs 1 s apart: 6000 CRC errors would be 6000/s, but over the 60 s minimum 100/s."""
    now, before = stamped("crc", 5_999)
    result = nvlink.error_counters(now, ctx(before, now=1001.0))
    assert result.status == "warn" and "(100/s)" in result.message  # 99.98/s, rounded
    now, before = stamped("crc", 6_000)
    assert nvlink.error_counters(now, ctx(before, now=1001.0)).status == "fail"
    now, before = stamped("crc", 1)
    assert nvlink.error_counters(now, ctx(before, now=1001.0)).status == "ok"
    now, before = stamped("crc", 200)  # 3.3/s over 60 s; 200/s if the minimum is set to 1 s
    assert nvlink.error_counters(now, ctx(before, now=1001.0)).status == "warn"
    short = ctx(before, now=1001.0, crc_min_interval_s=1.0)
    assert nvlink.error_counters(now, short).status == "fail"


def test_replays_and_recoveries_are_counted_during_the_job():
    now, before = stamped("recovery", 1)
    result = nvlink.error_counters(now, ctx(before, now=1000.0 + 8 * HOUR))
    assert result.status == "warn" and result.message == "GPU 2 (0000:3a:00) link 3 recovery +1"
    assert result.data["interval_s"] == 8 * HOUR
    now, before = stamped("replay", 10_000)
    assert nvlink.error_counters(now, ctx(before, now=1000.0 + 8 * HOUR)).status == "fail"


def test_clock_backwards_is_an_unknown_interval():
    before = nvlink.baseline(facts(), now=5000.0)
    assert nvlink.interval(ctx(before, now=4000.0)) is None
    assert nvlink.interval(ctx(before, now=5000.0)) is None
    assert nvlink.interval(ctx(before, now=5060.0)) == 60.0
    assert nvlink.interval(ctx({"counters": {}}, now=5060.0)) is None


def test_expectations():
    assert nvlink.expectations(facts()) == {"links_per_gpu": 18}
