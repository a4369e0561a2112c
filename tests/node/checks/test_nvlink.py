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


def ctx(baseline=None, **expect) -> Context:
    base = {k: copy.deepcopy(v[0]) for k, v in nvlink.DEFAULTS.items()}
    base.update(expect)
    return Context("gpu01", "prolog", base, baseline)


def test_all_links_active_is_ok():
    assert nvlink.link_state(facts(), ctx(links_per_gpu=18)).status == "ok"


def test_links_down_fail_with_reset():
    result = nvlink.link_state(facts("nvlink-down"), ctx())
    assert (result.status, result.action) == ("fail", "reset_gpu")
    assert "GPU 5 (00000000:AB:00.0) 16/18 NVLinks active, down [4, 11]" in result.message


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
    assert result.status == "warn" and "GPU 2 link 3 replay +150" in result.message
    now, before = bumped("recovery", 12)
    assert nvlink.error_counters(now, ctx(before)).status == "fail"
    now, before = bumped("crc", 5)
    assert nvlink.error_counters(now, ctx(before)).status == "ok"


def test_counter_reset_counts_the_new_value():
    before = nvlink.baseline(facts())
    before["counters"]["2:3"]["recovery"] = 40  # counters were reset since
    now = facts()
    now["devices"][2]["nvlink"][3]["recovery"] = 20
    assert nvlink.error_counters(now, ctx(before)).status == "fail"


def test_expectations():
    assert nvlink.expectations(facts()) == {"links_per_gpu": 18}
