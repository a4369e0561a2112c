"""Every log form a site's tools write (tests/fixtures/kmsg/forms/): a hardware Xid the kernel
printed fails in each; the same words written by a user program never do.

`<form>.kernel` holds Xid 79 as the kernel printed it, `<form>.user` the same words from user
space (`logger`, `echo > /dev/kmsg`) in the forms that can tell the two apart (a facility or a
program tag); plain dmesg without -r/-x, and a short journal line tagged `kernel`, cannot.
"""

from __future__ import annotations

import os

import conftest
import pytest

from slurmhealth.node.checks import xid
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import kmsg

FORMS = os.path.join(conftest.FIXTURES, "kmsg", "forms")
KERNEL = sorted(n for n in os.listdir(FORMS) if n.endswith(".kernel"))
USER = sorted(n for n in os.listdir(FORMS) if n.endswith(".user"))


def hardware(name: str) -> tuple[dict, object]:
    facts = xid.parse(kmsg.read(os.path.join(FORMS, name)))
    return facts, xid.hardware(facts, Context())


def test_every_form_has_a_fixture():
    forms = {n.rsplit(".", 1)[0] for n in KERNEL}
    assert {"dmesg-x", "dmesg-x-iso", "json", "syslog-rfc5424", "short-full"} <= forms
    assert len(KERNEL) >= 25 and len(USER) >= 18


@pytest.mark.parametrize("name", KERNEL)
def test_kernel_xid_fails_in_every_form(name):
    facts, result = hardware(name)
    assert result.status == "fail" and result.action == "reboot", result.message
    (event,) = facts["events"]
    assert (event["xid"], event["bus_id"]) == (79, "0000:18:00")
    assert facts["foreign"] == 0


@pytest.mark.parametrize("name", USER)
def test_user_written_xid_never_counts(name):
    facts, result = hardware(name)
    assert result.status == "ok" and facts["events"] == []
    assert facts["records"] >= 1


@pytest.mark.parametrize("name", USER)
def test_user_lines_are_marked_not_the_kernels(name):
    """Each user line reads as a record with a facility other than LOG_KERN, or (journalctl's
    monotonic forms, whose `[time] host tag:` a dmesg line's `[time] usb 1-1:` resembles)
    keeps its program tag in front, so no check anchored at the message start reads it."""
    for rec in kmsg.read(os.path.join(FORMS, name))["records"]:
        assert rec.get("facility", 0) != 0 or rec["msg"].startswith("gpu01 root: "), name


@pytest.mark.parametrize(
    ("name", "usec"),
    [
        ("dmesg-x.kernel", 86400123456),
        ("dmesg-d.kernel", 86400123456),
        ("short-delta.kernel", 86400123456),
        ("json.kernel", 86400123456),
        ("kmsg.kernel", 86400123456),
        ("dmesg-x-iso.kernel", None),
    ],
)
def test_boot_relative_time_is_kept(name, usec):
    (rec,) = [r for r in kmsg.read(os.path.join(FORMS, name))["records"] if "Xid" in r["msg"]]
    assert rec["usec"] == usec


def test_json_binary_and_multi_line_messages():
    """MESSAGE as an array of bytes (journald's form for text that is not UTF-8), and one with
    newlines, which join with a space as the indented forms do."""
    line = '{"_TRANSPORT":"kernel","PRIORITY":"3","MESSAGE":[78,86,82,77,58,32,255]}'
    assert kmsg.dmesg_fields(line) == (None, 3, None, "NVRM: \ufffd")
    line = '{"_TRANSPORT":"kernel","MESSAGE":"NVRM: The NVIDIA GPU 0000:18:00.0\\nNVRM: fallen"}'
    assert kmsg.dmesg_fields(line)[3] == "NVRM: The NVIDIA GPU 0000:18:00.0 NVRM: fallen"


@pytest.mark.parametrize(
    "line",
    ['{"MESSAGE": 5}', '{"a": [[[', "{" * 5000 + "}" * 5000, '{"MESSAGE": [1, 300]}', "[]"],
)
def test_json_that_is_no_entry_reads_as_text(line):
    assert kmsg.dmesg_fields(line)[3] == line
