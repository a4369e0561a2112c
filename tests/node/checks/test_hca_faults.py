"""checks/hca_faults.py: the HCA's mlx5_core lines (port modules, firmware health, slot power)
and the PCI core's link report, read through xid.parse, and the xid area's three checks on
them. Fixtures: tests/fixtures/kmsg/hca-*.kmsg and hca-boot.dmesg (modelled on the driver's
format strings), captured-slot-power*.dmesg* (captured; sources in tests/fixtures/kmsg/README.md).
"""

from __future__ import annotations

import json
import os

import conftest
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.node.checks import hca_faults, xid
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import kmsg

FIX = os.path.join(conftest.FIXTURES, "kmsg")
HCA = "mlx5_core 0000:5c:00.0: "
FN = "port_module:1148:(pid 0): "  # mlx5_core_err's prefix (newer kernels)


def facts_of(name: str) -> dict:
    return xid.parse(kmsg.read(os.path.join(FIX, name)))


def facts(*msgs: str, pri: int = 3) -> dict:
    """xid.parse of kernel records (facility 0) with these messages, one a second."""
    records = [{"seq": n, "usec": n * 1000000, "pri": pri, "msg": m} for n, m in enumerate(msgs)]
    if pri > 7:
        for record in records:
            record["facility"] = pri >> 3
    return xid.parse({"records": records})


def check(name: str, parsed: dict, **expect: object):
    return getattr(hca_faults, name)(parsed, Context(expect=dict(expect)))


def kinds(parsed: dict) -> list:
    return [(e["kind"], e["bus_id"], e["module"], e["repeats"]) for e in parsed["hca"]]


# --- port modules ---------------------------------------------------------------------------


def test_module_over_temperature_and_a_downtrained_link():
    parsed = facts_of("hca-events.kmsg")
    assert parsed["events"] == []  # not Xids
    assert kinds(parsed) == [
        ("pcie_limited", "0000:17:00.0", None, 1),
        ("module_state", "0000:63:00.1", 1, 1),  # one `Cable unplugged`: no problem
        ("module_error", "0000:5c:00.0", 0, 2),  # the rate-limited repeat is one event
        ("module_error", "0000:d2:00.0", 3, 1),  # the older kernels' form, no function prefix
    ]  # a full-speed link and a user-space line are not events
    result = check("hca_events", parsed)
    assert (result.status, result.action) == ("fail", "service")
    assert result.message == "HCA 0000:5c:00.0 module 0 over temperature x2 (+2 more)"
    assert result.data["count"] == 3


def test_a_downtrained_hca_link_warns():
    result = check("hca_events", facts_of("hca-downtrained.kmsg"))
    assert (result.status, result.action) == ("warn", "service")
    assert result.message == (
        "HCA 0000:17:00.0 PCIe link downtrained: 8.0 GT/s PCIe x8 at 0000:16:00.0, capable of "
        "16.0 GT/s PCIe x16 (63.008 of 252.048 Gb/s)"
    )


@pytest.mark.parametrize(
    "error, label",
    [
        ("Power budget exceeded", "over the power budget"),
        ("Long Range for non MLNX cable", "long-range module not supported"),
        ("Bus stuck (I2C or data shorted)", "I2C bus stuck or shorted"),
        ("Bus stuck(I2C or data shorted)", "I2C bus stuck or shorted"),  # older kernels
        ("No EEPROM/retry timeout", "EEPROM not readable"),
        ("Enforce part number list", "part number not allowed"),
        ("Unknown identifier", "unknown module type"),
        ("High Temperature", "over temperature"),
        ("Bad or shorted cable/module", "bad or shorted cable or module"),
    ],
)
def test_each_module_error_the_driver_names_fails_naming_hca_and_module(error, label):
    for line in (f"{HCA}{FN}Port module event[error]: module 2, Cable error, {error}",
                 f"{HCA}Port module event[error]: module 2, Cable error, {error}"):  # fmt: skip
        result = check("hca_events", facts(line))
        assert (result.status, result.action) == ("fail", "service"), line
        assert result.message == f"HCA 0000:5c:00.0 module 2 {label}"


def test_a_module_error_the_driver_does_not_name_warns_with_its_words():
    result = check("hca_events", facts(f"{HCA}{FN}Port module event[error]: module 0, "
                                       "Cable error, Unknown error"))  # fmt: skip
    assert (result.status, result.action) == ("warn", "service")
    assert result.message == "HCA 0000:5c:00.0 module 0 error: Unknown error"


def unplugs(times: int, module: int = 0) -> list:
    said = []
    for _ in range(times):
        said += [f"{HCA}Port module event: module {module}, Cable unplugged",
                 f"{HCA}Port module event: module {module}, Cable plugged"]  # fmt: skip
    return said


@pytest.mark.parametrize(
    "times, bound, status",
    [(1, 2, "ok"), (2, 2, "warn"), (5, 2, "warn"), (2, 3, "ok"), (3, 3, "warn"), (9, 0, "ok")],
)
def test_a_module_that_keeps_unplugging_warns_at_the_bound(times, bound, status):
    result = check("hca_events", facts(*unplugs(times)), hca_unplug_max=bound)
    assert result.status == status
    if status == "warn":
        assert result.action == "service"
        assert result.message == f"HCA 0000:5c:00.0 module 0 unplugged {times} times"


def test_unplugs_of_different_modules_or_hcas_do_not_add_up():
    other = [line.replace("0000:5c:00.0", "0000:5c:00.1") for line in unplugs(1)]
    parsed = facts(*unplugs(1, module=0), *unplugs(1, module=1), *other)
    assert check("hca_events", parsed).status == "ok"


def test_the_bound_defaults_to_the_xid_areas_setting():
    assert xid.DEFAULTS["hca_unplug_max"][0] == hca_faults.UNPLUG_MAX == 2
    assert check("hca_events", facts(*unplugs(2))).status == "warn"  # no config: the default


def test_a_disabled_module_warns():
    result = check("hca_events", facts(f"{HCA}Port module event: module 1, Cable disabled"))
    assert (result.status, result.action) == ("warn", "service")
    assert result.message == "HCA 0000:5c:00.0 module 1 disabled 1 time"


def test_module_fixture_fails_on_errors_and_warns_on_the_flap():
    parsed = facts_of("hca-modules.kmsg")
    result = check("hca_events", parsed)
    assert (result.status, result.action) == ("fail", "service")
    shown = [hca_faults._module_words(e) for e in result.data["events"]]
    assert shown[:2] == [
        "HCA 0000:4d:00.0 module 0 over the power budget",
        "HCA 0000:5e:00.0 module 0 EEPROM not readable",
    ]  # failures first, in log order
    assert "HCA 0000:dc:00.0 module 0 unplugged 3 times" in shown  # the flap
    assert "HCA 0000:5e:00.1 module 1 disabled 1 time" in shown
    assert "HCA 0000:cc:00.1 module 1 error: Unknown error" in shown
    # a boot's `Cable plugged`, one empty cage, a reseat and a user-space line: no problem
    assert not [s for s in shown if "0000:1a:00.0" in s or "0000:3c:00.0" in s]
    assert result.data["count"] == 10


def test_a_healthy_eight_hca_boot_has_no_hca_problem():
    parsed = facts_of("hca-boot.dmesg")
    assert len(parsed["hca"]) == 8  # each HCA's `Cable plugged`, counted, no problem
    for name in ("hca_events", "hca_firmware", "hca_power"):
        assert check(name, parsed).status == "ok", name


# --- firmware health --------------------------------------------------------------------------


def firmware(parsed: dict) -> dict:
    return {e["bus_id"]: e for e in parsed["hca"] if e["kind"] == "firmware"}


def test_firmware_fixture_reads_each_hca_in_driver_order():
    found = firmware(facts_of("hca-firmware.kmsg"))
    assert set(found) == {"0000:1a:00.0", "0000:5c:00.0", "0000:9a:00.0", "0000:d2:00.0"}
    recovered = found["0000:1a:00.0"]  # fatal, syndrome, the driver's reset, recovered
    assert (recovered["fatal"], recovered["sensor"], recovered["synd"]) == (1, 5, 1)
    assert (recovered["syndrome"], recovered["severity"]) == ("firmware internal error", 3)
    assert recovered["recovered"] is True and recovered["failed"] == 0
    hung = found["0000:5c:00.0"]
    assert (hung["hung"], hung["synd"], hung["severity"]) == (1, 7, 2)
    gone = found["0000:9a:00.0"]
    assert (gone["fatal"], gone["sensor"], gone["unreachable"], gone["failed"]) == (1, 1, 1, 1)
    assert found["0000:d2:00.0"]["timeouts"] == 1
    # the user-space `Fatal error` line (facility 1) named 0000:3c:00.0: no event


def test_firmware_failures_fail_with_reboot_and_a_recovered_hca_warns():
    result = check("hca_firmware", facts_of("hca-firmware.kmsg"))
    assert (result.status, result.action) == ("fail", "reboot")
    shown = [hca_faults._firmware_words(e) for e in result.data["events"]]
    assert shown == [
        "HCA 0000:5c:00.0 firmware: firmware not responding (health counter stopped), irisc "
        "not responding (synd 0x7, critical)",
        "HCA 0000:9a:00.0 firmware: fatal error (PCI reads fail), not reachable over PCIe, the "
        "driver's recovery failed",
        "HCA 0000:1a:00.0 firmware: fatal error (firmware asked for a reset), firmware "
        "internal error (synd 0x1, error), recovered by the driver's reset",
        "HCA 0000:d2:00.0 firmware: 1 command timed out",
    ]  # failures first, in log order
    assert result.message == f"{shown[0]} (+3 more)"


@pytest.mark.parametrize(
    "lines, expected",
    [
        (["poll_health:813:(pid 0): Fatal error 5 detected"], ("fail", "reboot")),
        (["poll_health:829:(pid 0): device's health compromised - reached miss count"],
         ("fail", "reboot")),
        (["device's health compromised"], ("fail", "reboot")),  # older kernels
        (["print_health_info:431:(pid 0): PCI slot is unavailable"], ("fail", "reboot")),
        (["mlx5_health_try_recover:376:(pid 9): health recovery failed"], ("fail", "reboot")),
        (["mlx5_fw_fatal_reporter_err_work:712:(pid 9): Driver is in error state. Unloading"],
         ("fail", "reboot")),
        (["print_health_info:438:(pid 0): Health issue observed, High temperature, severity(4) "
          "WARNING:"], ("warn", "none")),
        (["print_health_info:438:(pid 0): Health issue observed, FFSER error, severity(3) "
          "ERROR:"], ("fail", "reboot")),
        (["synd 0x9: firmware CRC error"], ("fail", "reboot")),  # older kernels: no severity
        (["cmd[0]: ACCESS_REG(0x805) Async, timeout. Will cause a leak of a command resource"],
         ("warn", "none")),
        (["poll_health:813:(pid 0): Fatal error 5 detected", "health recovery succeeded"],
         ("warn", "none")),
        (["poll_health:813:(pid 0): Fatal error 5 detected", "health recovery succeeded",
          "poll_health:813:(pid 0): Fatal error 5 detected"], ("fail", "reboot")),  # again
    ],
)  # fmt: skip
def test_each_firmware_line_alone(lines, expected):
    result = check("hca_firmware", facts(*[HCA + line for line in lines]))
    assert (result.status, result.action) == expected, result.message
    assert result.message.startswith("HCA 0000:5c:00.0 firmware: ")


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_health_try_recover:376:(pid 9): starting health recovery flow",
        "mlx5_health_try_recover:370:(pid 9): handling bad device here",
        "print_health_info:442:(pid 0): assert_var[0] 0x00000000",
        "mlx5_cmd_out_err:838:(pid 1): ACCESS_REG(0x805) op_mod(0x1) failed, status internal "
        "error(0x1), syndrome (0x305684), err(-22)",
        "Fatal error in my own words",
        "devlink health reporter fw created",
    ],
)
def test_other_mlx5_lines_are_no_firmware_event(line):
    assert firmware(facts(HCA + line)) == {}


def test_a_syndrome_split_by_its_newline_reads_clean():
    """hsynd_str() returns `HW fatal error\\n`: the kernel log escapes the newline."""
    line = HCA + "print_health_info:438:(pid 0): Health issue observed, HW fatal error\\x0a, " \
        "severity(3) ERROR:"  # fmt: skip
    event = firmware(facts(line))["0000:5c:00.0"]
    assert (event["syndrome"], event["severity"]) == ("HW fatal error", 3)


def test_firmware_lines_written_from_user_space_are_no_event():
    parsed = facts(HCA + "poll_health:813:(pid 0): Fatal error 5 detected", pri=8 + 3)
    assert parsed["hca"] == []
    assert check("hca_firmware", parsed).status == "ok"


# --- slot power -----------------------------------------------------------------------------


def test_slot_power_fixture_fails_for_powered_down_ports_and_warns_for_a_short_slot():
    parsed = facts_of("hca-power.kmsg")
    assert kinds(parsed) == [
        ("slot_power", "0000:5c:00.0", None, 1),
        ("slot_power", "0000:5c:00.1", None, 1),
        ("ports_unpowered", "0000:5c:00.1", 1, 1),
    ]  # `sufficient power`, `not advertised` and a user-space line: no event
    result = check("hca_power", parsed)
    assert (result.status, result.action) == ("fail", "service")
    assert result.message == (
        "HCA 0000:5c:00.1 ports powered down for lack of PCIe slot power (+2 more)"
    )
    assert check("hca_events", parsed).status == "ok"  # not a module's own fault


def test_captured_insufficient_slot_power_warns():
    result = check("hca_power", facts_of("captured-slot-power.dmesg-T"))
    assert (result.status, result.action) == ("warn", "service")
    assert result.message == (
        "HCA 0000:5c:00.0 PCIe slot power insufficient (slot advertises 27 W)"
    )


def test_captured_slot_power_not_advertised_is_no_event():
    parsed = facts_of("captured-slot-power-info.dmesg")
    assert parsed["hca"] == []
    for name in ("hca_events", "hca_firmware", "hca_power"):
        assert check(name, parsed).status == "ok", name


# --- every check, hostile input ---------------------------------------------------------------


def test_no_hca_problems_on_a_healthy_log():
    parsed = facts_of("healthy.kmsg")
    assert [check(n, parsed).message for n in ("hca_events", "hca_firmware", "hca_power")] == [
        "no HCA events in the kernel log",
        "no HCA firmware failures in the kernel log",
        "no HCA slot power events in the kernel log",
    ]


def test_hostile_words_reach_no_message_unclean():
    evil = "\x1b[31mHigh\x07 " + "x" * 500
    result = check("hca_events", facts(f"{HCA}Port module event[error]: module 0, Cable error, "
                                       f"{evil}"))  # fmt: skip
    assert result.message.isprintable() and len(result.message) <= 200
    assert "\x1b" not in json.dumps(result.to_dict())


@settings(max_examples=300, deadline=None)
@given(tail=st.text(max_size=300))
def test_the_hca_parser_never_raises(tail):
    found: dict = {}
    for head in (HCA, HCA + FN, "mlx5_core 0000:5c:00.0: Port module event", HCA + "Fatal error "):
        hca_faults.hca_line(head + tail, 1, None, found)
    for name in ("hca_events", "hca_firmware", "hca_power"):
        check(name, {"hca": list(found.values())})


# --- through the command line ---------------------------------------------------------------


def test_the_check_command_fails_a_node_whose_hca_firmware_failed():
    proc = conftest.run_cli(
        "check", "--no-db", "--kmsg", os.path.join(FIX, "hca-firmware.kmsg"), "--only", "xid",
        "--json",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    results = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    firmware_result = results["xid.hca_firmware"]
    assert (firmware_result["status"], firmware_result["action"]) == ("fail", "reboot")
    assert firmware_result["message"].startswith("HCA 0000:5c:00.0 firmware: ")
    assert results["xid.hca_events"]["status"] == "ok"
    assert results["xid.hca_power"]["status"] == "ok"
    assert results["xid.hardware"]["status"] == "ok"  # not Xids
