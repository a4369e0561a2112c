"""checks/xid.py on kernel-log lines captured on real machines and published, or printed by
NVIDIA as examples: tests/fixtures/kmsg/captured-* and nvidia-examples.txt. Each fixture's
source (repository and file or issue, date) is in tests/fixtures/kmsg/README.md; the messages are
verbatim as published, and the verdicts are the project's rules applied to them."""

from __future__ import annotations

import os

import conftest
import pytest

from slurmhealth.node.checks import xid
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import kmsg

FIX = os.path.join(conftest.FIXTURES, "kmsg")
LINK_WORDS = ["0x0", "0x0", "0x10000", "0x0", "0x0", "0x0", "0x0"]
# REG2 bit 16 alone: NVSentinel's RepeatedXID74Reg2Bit16Or19Set (field diagnostics when it
# repeats on the GPU): a reset now, service on a repeat on any link of the GPU.
LINK_8 = {
    "link": 8,
    "words": LINK_WORDS,
    "register": 2,
    "bit": 16,
    "kind": "field diagnostics if it repeats",
    "when": "gpu",
}
UNCONTAINED_RESET = {"contained": False, "rst": True, "d_rst": False}
CONTAINED_NO_RESET = {"contained": True, "rst": False, "d_rst": False}

# fixture: (events as (seq, xid, bus, gpu instance, class, action, repeats, detail),
#           the hardware check's (status, action))
CAPTURED = {
    # tim9985/Capstone drone_yolo/SERVER_PROGRESS.md: RTX 3090, driver 580.173.02, `sudo dmesg`
    # (-T) on 2026-09-14. The middle line is no Xid (the author cut it short with `...`).
    "captured-node-reboot.dmesg-T": (
        [
            (1, 79, "0000:02:00", None, "fail", "reboot", 1, None),
            (3, 154, "0000:02:00", None, "fail", "reboot", 1, {"recovery": 2}),
        ],
        ("fail", "reboot"),
    ),
    # sirzzang/sirzzang.github.io _posts/2026-08-11-Dev-GPU-ECC-DBE-Incident.md: RTX PRO 6000
    # Blackwell, `journalctl -k` on 2026-08-10 (host name, serial and UUID tail anonymised by
    # the author). A DBE: Xid 48 (twice: the framebuffer line and the channel's), 171, 63, then
    # 154 to Drain and Reset.
    "captured-drain-and-reset.short": (
        [
            (3, 48, "0000:55:00", None, "fail", "reset_gpu", 1, None),
            (4, 171, "0000:55:00", None, "fail", "reset_gpu", 1, None),
            (5, 48, "0000:55:00", None, "fail", "reset_gpu", 1, None),
            (6, 63, "0000:55:00", None, "warn", "reset_gpu", 1, None),
            (7, 154, "0000:55:00", None, "fail", "reset_gpu", 1, {"recovery": 4}),
        ],
        ("fail", "reset_gpu"),
    ),
    # vllm-project/vllm#40652 (same log in NVIDIA/open-gpu-kernel-modules#1118): 8x A100 SXM4,
    # 2026-04-22; messages without `talosctl dmesg`'s `<node>: kern: warning: [<time>]: `.
    "captured-a100-nvlink.txt": (
        [
            (1, 45, "0000:48:00", None, "app", "none", 2, None),
            (3, 74, "0000:48:00", None, "fail", "reset_gpu", 1, LINK_8),
            (4, 154, "0000:48:00", None, "fail", "reset_gpu", 1, {"recovery": 1}),
            (8, 119, "0000:0b:00", None, "fail", "reset_gpu", 1, None),
        ],
        ("fail", "reset_gpu"),
    ),
    # NVIDIA/open-gpu-kernel-modules#1151, comment of 2026-05-23: RTX 5090, 580.159.04 /
    # 595.71.05. The Xid line and the driver's Xid-less `GPU 0000:06:00.0:` line: one event.
    "captured-off-bus.txt": (
        [(3, 79, "0000:06:00", None, "fail", "reboot", 2, None)],
        ("fail", "reboot"),
    ),
    # NVIDIA/NVSentinel#155 (2025-10-25): dmesg, driver 570.158.01; the lost-GPU report is one
    # record over three `NVRM:` lines, and no Xid is printed at all.
    "captured-off-bus-multiline.dmesg": (
        [(1, 79, "0000:b3:00", None, "fail", "reboot", 1, None)],
        ("fail", "reboot"),
    ),
    # NVIDIA/open-gpu-kernel-modules#1045, comment of 2026-04-15: `journalctl -k` of a node
    # with a Polish locale (`kwi` is April). Xid 38 is not in the table (warn); 109 is the app's.
    "captured-journal-pl.short": (
        [
            (2, 38, "0000:07:00", None, "warn", "none", 1, None),
            (3, 109, "0000:07:00", None, "app", "none", 5, None),
        ],
        ("warn", "none"),
    ),
    # skinny-l/FIARS tests/sample_tickets.py: a data-centre repair ticket (A100 PCIe,
    # 2026-07) quoting the kernel line, its `diff:371;` prefix removed.
    "captured-xid95-ticket.txt": (
        [(1, 95, "0000:37:00", None, "fail", "reset_gpu", 1, UNCONTAINED_RESET)],
        ("fail", "reset_gpu"),
    ),
    # imbue-ai/cluster-health health_checks/health_checks.py: two dmesg lines of one GPU quoted
    # as doctest examples. Xid 64 names a row-remap failure; that Xid 94 is an older driver's,
    # without the `Contained: ... RST:` fields, so the table's row decides.
    "captured-row-remap.dmesg": (
        [
            (1, 64, "0000:0f:00", None, "fail", "service", 1, {"remap_failure": True}),
            (2, 94, "0000:0f:00", None, "fail", "reset_gpu", 1, None),
        ],
        ("fail", "service"),
    ),
    # NVIDIA/open-gpu-kernel-modules#446 (8x A100 SXM4, the log of captured-a100-nvlink.txt):
    # the NVSwitch SXid lines beside an Xid 62; the SXids are test_driver_faults.py's.
    "captured-a100-sxid.txt": (
        [(5, 62, "0000:48:00", None, "fail", "reset_gpu", 1, None)],
        ("fail", "reset_gpu"),
    ),
    # No Xid in these: GPUs that did not initialise and an NVLink link mask not read
    # (test_driver_faults.py); the Xid check passes them.
    "captured-rminit.dmesg": ([], ("ok", "none")),
    "captured-rminit-two.dmesg": ([], ("ok", "none")),
    "captured-link-mask.short": ([], ("ok", "none")),
    # No Xid: an HCA's slot power lines (test_hca_faults.py).
    "captured-slot-power.dmesg-T": ([], ("ok", "none")),
    "captured-slot-power-info.dmesg": ([], ("ok", "none")),
    # NVIDIA's own examples, not from a machine: open-gpu-kernel-modules 595.45.04,
    # src/nvidia/src/kernel/gpu/arch/ampere/kern_gpu_error_cont_ga100.c, comment of
    # _gpuGenerateErrorLog ("Format/example").
    "nvidia-examples.txt": (
        [
            (1, 94, "0000:01:00", 5, "warn", "reset_gpu", 1, CONTAINED_NO_RESET),
            (2, 94, "0000:01:00", None, "warn", "reset_gpu", 1, CONTAINED_NO_RESET),
            (3, 95, "0000:01:00", None, "fail", "reset_gpu", 1, UNCONTAINED_RESET),
        ],
        ("fail", "reset_gpu"),
    ),
}


def facts_of(name: str) -> dict:
    return xid.parse(kmsg.read(os.path.join(FIX, name)))


def test_every_captured_fixture_is_tested_and_listed_in_the_readme():
    names = sorted(
        f for f in os.listdir(FIX) if f.startswith("captured-") or f == "nvidia-examples.txt"
    )
    assert names == sorted(CAPTURED)
    with open(os.path.join(FIX, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    for name in names:
        assert f"`{name}`" in readme, name


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_captured_lines_give_the_rules_verdicts(name):
    want, verdict = CAPTURED[name]
    facts = facts_of(name)
    got = [
        (
            e["seq"],
            e["xid"],
            e["bus_id"],
            e["gpu_instance"],
            e["class"],
            e["action"],
            e["repeats"],
            e["detail"],
        )
        for e in xid.events_for(facts, Context())
    ]
    assert got == want
    result = xid.hardware(facts, Context())
    assert (result.status, result.action) == verdict
    assert facts["foreign"] == 0 and not facts["lost"]


def test_captured_reasons_say_what_the_line_said():
    messages = {
        name: xid.hardware(facts_of(name), Context()).message
        for name in ("captured-node-reboot.dmesg-T", "captured-xid95-ticket.txt")
    }
    assert messages["captured-node-reboot.dmesg-T"] == (
        "GPU 0000:02:00 Xid 79 GPU has fallen off the bus (+1 more)"
    )
    assert messages["captured-xid95-ticket.txt"] == (
        "GPU 0000:37:00 Xid 95 uncontained error, reset required"
    )
    events = xid.events_for(facts_of("captured-drain-and-reset.short"), Context())
    assert (
        xid.describe(events[-1])
        == "GPU 0000:55:00 Xid 154 GPU recovery action changed, drain P2P and reset"
    )
    row_remap = xid.events_for(facts_of("captured-row-remap.dmesg"), Context())[0]
    assert xid.describe(row_remap).endswith(
        "Xid 64 InfoROM DRAM retirement failure, row remap failed"
    )


def test_captured_gpu_at_pci_lines_are_not_events():
    """`NVRM: GPU at PCI:0000:06:00: GPU-<uuid>` is printed once before a GPU's first Xid
    (open-gpu-kernel-modules kernel_rc.c, _krcLogUuidOnce): it names the GPU, it reports
    nothing. Every captured form, a truncated UUID included."""
    lines = []
    for name in sorted(CAPTURED):
        for rec in kmsg.read(os.path.join(FIX, name))["records"]:
            if rec["msg"].startswith("NVRM: GPU at PCI:"):
                lines.append(rec["msg"])
    assert len(lines) == 5
    for line in lines:
        assert xid.parse_line(line) is None
        assert (
            xid.parse({"records": [{"seq": 1, "usec": 1, "pri": 4, "msg": line}]})["events"] == []
        )


def test_localized_journal_month_is_still_a_kernel_line():
    """journalctl prints the month in the node's locale: the Polish capture's `kwi 15 ...` lines
    are the kernel's and read like the English ones (they were skipped before: the prefix stayed
    on the message, which then did not start with `NVRM:`)."""
    raw = kmsg.read(os.path.join(FIX, "captured-journal-pl.short"))
    assert all(r["msg"].startswith("NVRM: ") for r in raw["records"])
    assert raw["records"][1]["msg"] == (
        "NVRM: Xid (PCI:0000:07:00): 38, pid=326, name=modprobe, channel 0x00000003 0000c597 "
        "00000000 00000000"
    )


@pytest.mark.parametrize(
    ("line", "code", "action"),
    [
        # The 154 line's words for action 0x1 as some newer drivers print them
        # (NVIDIA/open-gpu-kernel-modules#1353, 595.84 and 610): the number decides.
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to "
            "0x1 (PF FLR)",
            1,
            "reset_gpu",
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from (None) to (PF FLR)",
            1,
            "reset_gpu",
        ),
        # 0x2 in the words driver 610.43.02 printed in a public write-up (its repository could
        # not be named, so it is not a captured fixture): the number decides, the words serve
        # a line without it.
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to "
            "0x2 (OS Reboot)",
            2,
            "reboot",
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from (None) to "
            "(OS Reboot)",
            2,
            "reboot",
        ),
    ],
)
def test_newer_drivers_words_for_a_recovery_action(line, code, action):
    event = xid.parse(raw_of(line))["events"][0]
    assert event["detail"] == {"recovery": code}
    assert (event["class"], event["action"]) == ("fail", action)


def raw_of(*msgs: str) -> dict:
    records = [{"seq": n, "usec": n * 1000000, "pri": 4, "msg": m} for n, m in enumerate(msgs)]
    return {"records": records, "lost": False, "missed": 0, "after_seq": None}
