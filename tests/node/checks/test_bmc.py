"""BMC checks on `ipmitool sel elist` lines (tests/fixtures/bmc, the format of ipmitool's
ipmi_sel_print_std_entry): new records since the baseline, judged by sensor type and event."""

from __future__ import annotations

import os

from conftest import FIXTURES
from hypothesis import given
from hypothesis import strategies as st

from slurmhealth.node.checks import bmc
from slurmhealth.node.checks.base import Context


def lines(*names: str) -> list:
    out = []
    for name in names:
        with open(os.path.join(FIXTURES, "bmc", f"{name}.txt")) as handle:
            out += handle.read().splitlines()
    return out


def judge(sel: list, baseline: dict | None = None):
    return bmc.sel(bmc.parse({"lines": sel}), Context(phase="healthcheck", baseline=baseline))


def test_a_line_is_parsed_into_its_columns():
    record = bmc.parse_line(lines("sel-elist")[4])
    assert record == {
        "id": 5, "when": "06/02/2025 03:15:44", "sensor": "Temperature CPU1_Temp",
        "event": "Upper Non-critical going high", "asserted": True,
        "text": "06/02/2025 | 03:15:44 | Temperature CPU1_Temp | Upper Non-critical going high"
                " | Asserted | Reading 91 > Threshold 90 degrees C",
    }
    assert bmc.parse_line("  1a | Linux kernel panic: Fatal excep")["id"] == 0x1A
    assert bmc.parse_line("SEL has no entries") is None


def test_the_first_run_records_a_baseline_and_judges_nothing():
    result = judge(lines("sel-elist", "sel-elist-new-faults"))
    assert result.status == "ok"
    said = "baseline recorded: 10 SEL entries, 6 of them warn or fail (not judged)"
    assert result.message == said
    before = bmc.baseline(bmc.parse({"lines": lines("sel-elist")}), 1.0)
    assert before["last_id"] == 6 and before["last_text"].startswith("06/02/2025 | 03:16:20")


def test_new_faults_since_the_baseline_fail_for_service():
    before = bmc.baseline(bmc.parse({"lines": lines("sel-elist")}))
    assert judge(lines("sel-elist"), before).message == "0 new SEL entries, none severe"
    result = judge(lines("sel-elist", "sel-elist-new-faults"), before)
    assert (result.status, result.action) == ("fail", "service")
    assert result.message == (
        "BMC SEL: Memory DIMM_C2 Uncorrectable ECC (SEL 0x7, 06/14/2025 11:20:02) (+3 more)"
    )
    assert result.data["new"] == 4 and not result.data["cleared"]


def test_each_kind_of_record_is_judged():
    cases = {
        "Correctable ECC": ("Memory DIMM_A1", ("warn", "")),
        "IERR": ("Processor CPU2_Status", ("fail", "service")),
        "Failure detected": ("Power Supply PSU1", ("fail", "service")),
        "AC lost or out-of-range": ("Power Supply PSU1", ("warn", "")),
        "Upper Critical going high": ("Temperature Inlet_Temp", ("fail", "drain")),
        "Lower Non-critical going low": ("Fan FAN3", ("warn", "")),
        "Presence detected": ("Processor CPU1_Status", ("ok", "")),
    }
    for event, (sensor, want) in cases.items():
        record = {"sensor": sensor, "event": event, "asserted": True}
        assert bmc.severity(record) == want, event
    ended = {"sensor": "Memory", "event": "Uncorrectable ECC", "asserted": False}
    assert bmc.severity(ended)[0] == "ok"


def test_a_cleared_sel_makes_every_record_new():
    before = bmc.baseline(bmc.parse({"lines": lines("sel-elist")}))
    cleared = ["   1 | 07/01/2025 | 08:00:00 | Event Logging Disabled SEL | Log area reset/cleared"
               " | Asserted", lines("sel-elist-new-faults")[0].replace("   7 |", "   2 |")]
    result = judge(cleared, before)
    assert result.status == "fail" and result.data["cleared"]
    assert judge([], {"last_id": 0, "last_text": ""}).status == "ok"


def test_a_warning_alone_warns():
    before = bmc.baseline(bmc.parse({"lines": lines("sel-elist")}))
    ac_lost = lines("sel-elist") + [lines("sel-elist-new-faults")[2]]
    result = judge(ac_lost, before)
    assert (result.status, result.message) == (
        "warn",
        "BMC SEL: Power Supply PSU2_Status Power Supply AC lost (SEL 0x9, 06/14/2025 11:25:40)",
    )


@given(st.lists(st.text(alphabet="0123456789abcdef |ECCMemoryAsserted", max_size=60), max_size=8))
def test_parse_and_the_check_never_raise(sel):
    judge(sel, {"last_id": 3, "last_text": "x"})
    judge(sel)
