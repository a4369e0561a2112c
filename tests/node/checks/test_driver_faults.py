"""checks/driver_faults.py: NVSwitch SXid lines and the driver's Xid-less failures (GPU
initialisation, NVLink link mask), read through xid.parse, and the xid area's four checks on
them. Fixtures: tests/fixtures/kmsg/sxid.kmsg and driver-init.kmsg (modelled on the driver's
format strings) and captured-a100-sxid.txt, captured-rminit*.dmesg, captured-link-mask.short
(captured; sources in tests/fixtures/kmsg/README.md)."""

from __future__ import annotations

import os

import conftest
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.node.checks import driver_faults, xid
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import kmsg

FIX = os.path.join(conftest.FIXTURES, "kmsg")
SW0 = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): "


def facts_of(name: str) -> dict:
    return xid.parse(kmsg.read(os.path.join(FIX, name)))


def facts(*msgs: str, pri: int = 3) -> dict:
    records = [{"seq": n, "usec": n, "pri": pri, "msg": m} for n, m in enumerate(msgs)]
    if pri != 3:
        for record in records:
            record["facility"] = pri >> 3
    return xid.parse({"records": records})


def sxids(parsed: dict) -> list:
    keys = ("sxid", "switch", "bus_id", "link", "severity", "repeats")
    return [tuple(e[k] for k in keys) for e in parsed["sxid"]]


def check(name: str, parsed: dict, **ctx: object):
    return getattr(driver_faults, name)(parsed, Context(**ctx))


# --- SXid line forms --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rest, expected",
    [
        (
            "12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
            (12028, 32, "non-fatal"),
        ),
        ("24007, Fatal, Link 44 sourcetrack timeout error (First)", (24007, 44, "fatal")),
        ("11012, Correctable, Link 03 ingress ECC SBE", (11012, 3, "correctable")),
        ("24007, Severity 1 Engine instance 12 Sub-engine instance 00", (24007, 12, "fatal")),
        ("12028, Severity 0 Engine instance 05 Sub-engine instance 00", (12028, 5, "non-fatal")),
        ("12001, Fatal, egress crossbar overflow, instance=2, chiplet=0", (12001, None, "fatal")),
        ("26006, SOE HALT data[0] = 0x               0", (26006, None, None)),
        ("26002, SOE init Failed(0)", (26002, None, None)),
    ],
)
def test_each_sxid_form_reads_number_link_and_severity(rest, expected):
    (event,) = facts(SW0 + rest)["sxid"]
    assert (event["sxid"], event["link"], event["severity"]) == expected
    assert (event["switch"], event["bus_id"]) == ("nvswitch0", "0000:05:00.0")


@pytest.mark.parametrize(
    "msg",
    [
        SW0 + "12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064}",
        SW0 + "24007, Severity x Engine instance 12",
        "nvidia-nvswitch0: SXid (PCI:bad): 12028, Fatal, Link 1 x",
        "kernel: something SXid (PCI:0000:05:00.0): 24007, Fatal, Link 1 x",  # not at the start
        "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
    ],
)
def test_data_lines_and_other_lines_are_no_sxid_event(msg):
    assert facts(msg)["sxid"] == []


def test_the_dump_of_an_error_is_the_same_event_as_its_report():
    parsed = facts(
        SW0 + "24007, Fatal, Link 44 sourcetrack timeout error (First)",
        SW0 + "24007, Severity 1 Engine instance 44 Sub-engine instance 00",
        SW0 + "24007, Data {0x0, 0x0}",
    )
    assert sxids(parsed) == [(24007, "nvswitch0", "0000:05:00.0", 44, "fatal", 1)]


def test_sxid_lines_written_from_user_space_are_foreign_and_no_event():
    parsed = facts(SW0 + "24007, Fatal, Link 44 sourcetrack timeout error (First)", pri=12)
    assert parsed["sxid"] == [] and parsed["foreign"] == 1
    assert check("sxid_fatal", parsed).status == "ok"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_sxid_and_driver_parsers_never_raise(tail):
    parsed = facts(SW0 + tail, "NVRM: GPU 0000:ba:00.0: " + tail, "NVRM: knvlink" + tail)
    for name in ("sxid_fatal", "sxid_nonfatal", "gpu_init", "nvlink_init"):
        assert check(name, parsed).status in ("ok", "warn", "fail")


# --- SXid verdicts ----------------------------------------------------------------------------


def test_sxid_fixture_events():
    parsed = facts_of("sxid.kmsg")
    assert sxids(parsed) == [
        (12028, "nvswitch0", "0000:05:00.0", 32, "non-fatal", 1),
        (24007, "nvswitch1", "0000:06:00.0", 44, "fatal", 1),
        (20009, "nvswitch2", "0000:07:00.0", 28, "non-fatal", 12),
        (20009, "nvswitch2", "0000:07:00.0", 29, "non-fatal", 1),
        (11012, "nvswitch2", "0000:07:00.0", 3, "correctable", 1),
        (26006, "nvswitch3", "0000:08:00.0", None, None, 3),
        (23001, "nvswitch0", "0000:05:00.0", 7, "non-fatal", 1),
    ]
    assert parsed["foreign"] == 1


def test_fatal_sxids_fail_with_reboot_naming_switch_and_link():
    result = check("sxid_fatal", facts_of("sxid.kmsg"))
    assert (result.status, result.action) == ("fail", "reboot")
    listed = {(e["sxid"], e["switch"], e["link"]) for e in result.data["events"]}
    # the line's Fatal, an always-fatal number whatever the line says, a halted SOE, and 12028,
    # non-fatal by its word but stalling the port's traffic (the guide's non-fatal table)
    assert listed == {(24007, "nvswitch1", 44), (23001, "nvswitch0", 7), (26006, "nvswitch3", None),
                      (12028, "nvswitch0", 32)}
    assert "nvswitch0 (0000:05:00.0) link 7 SXid 23001" in result.message


def test_one_nonfatal_sxid_warns_and_names_its_link():
    result = check("sxid_nonfatal", facts(SW0 + "20009, Non-fatal, Link 32 RX Short Error Rate"))
    assert (result.status, result.action) == ("warn", "none")
    assert result.message == "NVSwitch nvswitch0 (0000:05:00.0) link 32 SXid 20009 non-fatal"


@pytest.mark.parametrize("number", [11012, 24003, 22013])
def test_a_nonfatal_sxid_the_guide_says_has_no_impact_is_ignored(number):
    """The guide's non-fatal table: single-bit ECC errors the switch corrects itself, and 22013
    ("can be safely ignored")."""
    parsed = facts(SW0 + f"{number}, Non-fatal, Link 32 x")
    assert check("sxid_nonfatal", parsed).message == "no non-fatal NVSwitch SXids (1 correctable)"
    assert check("sxid_fatal", parsed).status == "ok"


@pytest.mark.parametrize("number", [11004, 12028, 19084])
def test_a_nonfatal_sxid_that_stalls_the_fabric_fails_with_reboot(number):
    parsed = facts(SW0 + f"{number}, Non-fatal, Link 32 x")
    assert check("sxid_nonfatal", parsed).status == "ok"
    result = check("sxid_fatal", parsed)
    assert (result.status, result.action) == ("fail", "reboot")
    assert result.message == (f"NVSwitch nvswitch0 (0000:05:00.0) link 32 SXid {number} "
                              f"{driver_faults.STALLING[number]}")


@pytest.mark.parametrize("times, status", [(9, "warn"), (10, "fail")])
def test_a_nonfatal_sxid_repeating_on_one_link_fails_at_the_bound(times, status):
    parsed = facts(*[SW0 + "20009, Non-fatal, Link 28 RX Short Error Rate"] * times)
    result = check("sxid_nonfatal", parsed)
    assert result.status == status
    assert result.action == ("reboot" if status == "fail" else "none")


def test_repeats_spread_over_links_or_switches_do_not_add_up():
    msgs = [SW0 + f"20009, Non-fatal, Link {link} RX Short Error Rate" for link in range(9)]
    msgs += ["nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 0 RX"] * 9
    assert check("sxid_nonfatal", facts(*msgs)).status == "warn"


def test_the_repeat_bound_comes_from_config_and_zero_turns_it_off():
    parsed = facts(*[SW0 + "20009, Non-fatal, Link 28 RX Short Error Rate"] * 3)
    assert check("sxid_nonfatal", parsed, expect={"sxid_repeat_max": 3}).status == "fail"
    parsed = facts_of("sxid.kmsg")
    assert check("sxid_nonfatal", parsed, expect={"sxid_repeat_max": 0}).status == "warn"


def test_correctable_sxids_are_counted_never_reported():
    parsed = facts(SW0 + "11012, Correctable, Link 03 ingress ECC SBE")
    assert check("sxid_fatal", parsed).status == "ok"
    result = check("sxid_nonfatal", parsed)
    assert (result.status, result.message) == ("ok", "no non-fatal NVSwitch SXids (1 correctable)")


def test_captured_a100_sxid_dump_line_fails_as_fatal():
    """NVIDIA/open-gpu-kernel-modules#446: the error log's dump (`Severity 1 Engine instance
    12`) without the report line; its Data line is no event; the Xid 62 beside it is the
    hardware check's."""
    parsed = facts_of("captured-a100-sxid.txt")
    assert sxids(parsed) == [(24007, "nvswitch1", "0000:aa:00.0", 12, "fatal", 1)]
    result = check("sxid_fatal", parsed)
    assert (result.status, result.action) == ("fail", "reboot")
    assert result.message == "NVSwitch nvswitch1 (0000:aa:00.0) link 12 SXid 24007 fatal"
    assert [e["xid"] for e in parsed["events"]] == [62]


# --- the driver's Xid-less failures -----------------------------------------------------------


def test_a_gpu_that_did_not_initialise_fails_named_from_the_kernel_log():
    # NVML lists 7 GPUs (the 8th never initialised) and no count is configured: the kernel
    # log's bus id names the missing GPU; its index is the one the inventory knew.
    parsed = facts_of("driver-init.kmsg")
    result = check("gpu_init", parsed, gpus={"00000000:BA:00.0": 6})
    assert (result.status, result.action) == ("fail", "reboot")
    assert result.message == (
        "GPU 6 (0000:ba:00) did not initialise (RmInitAdapter failed, device minor 6, 3 attempts)"
    )
    (event,) = result.data["events"]
    assert (event["code"], event["minor"], event["repeats"]) == ("0x62:0x65:1792", 6, 3)
    assert parsed["foreign"] == 2  # the same lines written from user space


def test_captured_rminit_lines_fail_each_gpu():
    """NVIDIA/open-gpu-kernel-modules#789 (one GPU) and NVIDIA/gpu-operator#649 (two)."""
    one = check("gpu_init", facts_of("captured-rminit.dmesg"))
    assert one.message == "GPU 0000:98:00 did not initialise (RmInitAdapter failed, device minor 0)"
    two = check("gpu_init", facts_of("captured-rminit-two.dmesg"))
    assert [e["bus_id"] for e in two.data["events"]] == ["0000:04:01", "0000:04:02"]
    assert two.status == "fail" and two.message.endswith("(+1 more GPU)")


@pytest.mark.parametrize(
    "msg",
    [
        "NVRM: RmInitAdapter: Cannot initialize GSP firmware RM",
        "NVRM: RmInitAdapter: osInitNvMapping failed, bailing out of RmInitAdapter",
        "NVRM: GPU 0000:ba:00.0: RmInitAdapter succeeded",
        "NVRM: knvlinkCoreShutdownDeviceLinks: NVLink links shut down",
        "xyz: NVRM: GPU 0000:ba:00.0: RmInitAdapter failed! (0x62:0x65:1792)",
    ],
)
def test_other_driver_lines_are_no_failure(msg):
    parsed = facts(msg)
    assert parsed["driver"] == [] and parsed["events"] == []


def test_nvlink_link_mask_failures_fail_with_reboot():
    result = check("nvlink_init", facts_of("driver-init.kmsg"))
    assert (result.status, result.action) == ("fail", "reboot")
    assert result.message == "NVLink link mask after receiver detection not read (peers 0, 3) x3"


def test_captured_link_mask_line_fails():
    """leptonai/gpud#1271: `journalctl -k` of an H100 node."""
    result = check("nvlink_init", facts_of("captured-link-mask.short"))
    assert result.status == "fail" and "(peers 0)" in result.message


def test_a_healthy_log_passes_all_four():
    parsed = facts_of("healthy.kmsg")
    for name in ("sxid_fatal", "sxid_nonfatal", "gpu_init", "nvlink_init"):
        assert check(name, parsed).status == "ok"
