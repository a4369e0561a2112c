"""checks/mce.py: machine-check and hardware-error lines in the kernel's own formats."""

from __future__ import annotations

import os

import conftest
import pytest

from slurmhealth.node.checks import mce
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import kmsg

# Lines as the kernel prints them (arch/x86/kernel/cpu/mce/core.c, mm/memory-failure.c,
# drivers/acpi/apei/ghes.c, drivers/edac/mce_amd.c); the numbers are made up.
LINES = {
    "mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: 8c00004000010091": "corrected",
    "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 1: be00000000800400":
        "fatal",
    "mce: [Hardware Error]: CPU 40: Machine Check: 0 Bank 13: bc00000001010090": "uncorrected",
    "mce: [Hardware Error]: Machine check events logged": "corrected",
    "mce: [Hardware Error]: Machine check: Processor context corrupt": "fatal",
    "mce: Uncorrected hardware memory error in user-access at 3f1f2c5000": "uncorrected",
    "Memory failure: 0x3f1f2c5: recovery action for dirty LRU page: Recovered": "uncorrected",
    "{1}[Hardware Error]: event severity: corrected": "corrected",
    "{2}[Hardware Error]: event severity: recoverable": "uncorrected",
    # a record of the previous boot (BERT), as the kernel commit "efi: cper: Add support for
    # printing Firmware Error Record Reference" (2020) quotes one
    "[Hardware Error]: event severity: fatal": "fatal",
    "[Hardware Error]: Corrected error, no action required.": "corrected",
    "[Hardware Error]: Deferred error, no action required.": "uncorrected",
    "[Hardware Error]: System Fatal error.": "fatal",
}
NOT_ERRORS = [
    "mce: [Hardware Error]: TSC 0 ADDR 1ffffffb1600 MISC 9000004000010086",
    "mce: [Hardware Error]: Run the above through 'mcelog --ascii'",
    "mce: CPU0: Thermal monitoring enabled (TM1)",
    "usb 1-1: Product: mce: [Hardware Error]: Machine check: fake",
    "{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 0",
]


@pytest.mark.parametrize("line,level", LINES.items())
def test_each_line_is_classed(line, level):
    assert mce.parse_line(line)["class"] == level


@pytest.mark.parametrize("line", NOT_ERRORS)
def test_other_lines_are_not_errors(line):
    assert mce.parse_line(line) is None


def test_status_bits():
    assert mce.status_class(0x8C00004000010091) == "corrected"
    assert mce.status_class(0xBC00000001010090) == "uncorrected"  # UC without PCC
    assert mce.status_class(0xBE00000000800400) == "fatal"  # UC and PCC


def records(*lines, facility=0):
    out = []
    for seq, line in enumerate(lines, 100):
        rec = {"seq": seq, "usec": seq * 1000, "pri": 0, "msg": line}
        if facility:
            rec["facility"] = facility
        out.append(rec)
    return {"records": out}


def test_uncorrected_fails_with_service_and_failed_recovery_asks_reboot():
    facts = mce.parse(records("mce: [Hardware Error]: CPU 40: Machine Check: 0 Bank 13: "
                              "bc00000001010090"))
    result = mce.uncorrected(facts, Context())
    assert result.status == "fail" and result.action == "service"
    assert result.message.startswith("uncorrected machine check: CPU 40 bank 13")
    failed = "Memory failure: 0x1234: recovery action for kernel page: Failed"
    assert mce.uncorrected(mce.parse(records(failed)), Context()).action == "reboot"


def test_corrected_warns_and_can_be_silenced():
    facts = mce.parse(records("mce: [Hardware Error]: Machine check events logged"))
    assert mce.uncorrected(facts, Context()).status == "ok"
    assert mce.corrected(facts, Context()).status == "warn"
    assert mce.corrected(facts, Context(expect={"corrected_warn": 0})).status == "ok"


def test_user_space_lines_are_left_out():
    facts = mce.parse(records("mce: [Hardware Error]: Machine check: fake", facility=1))
    assert facts["events"] == [] and mce.uncorrected(facts, Context()).status == "ok"


def test_a_dmesg_file_read_by_the_kmsg_source(tmp_path):
    log = tmp_path / "dmesg"
    log.write_text(
        "[ 1.000000] Linux version 6.8.0\n"
        "[ 812.123456] mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: 8c00004000010091\n"
        "[ 812.123460] mce: [Hardware Error]: TSC 0 ADDR 1ffffffb1600 MISC 9000004000010086\n"
    )
    facts = mce.parse(kmsg.read(str(log)))
    assert [e["class"] for e in facts["events"]] == ["corrected"]
    assert mce.uncorrected(facts, Context()).status == "ok"


def test_the_healthy_fixture_log_has_none():
    facts = mce.parse(kmsg.read(os.path.join(conftest.FIXTURES, "kmsg", "healthy.kmsg")))
    assert facts["records"] > 0 and facts["events"] == []
