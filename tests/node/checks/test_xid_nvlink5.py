"""checks/xid.py: Xid 144-150 (NVLink5) by the catalogue's decode sheet: unit, error status and,
for the NETIR link events, the sub-code in bits 20-25 of the first word.

Lines marked "gpud" are as leptonai/gpud's tests quote them from GB200 nodes
(components/accelerator/nvidia/xid/kmsg_extended_test.go, xid_test.go); the others are modelled
on that form (docs/sources.md)."""

from __future__ import annotations

import pytest

from slurmhealth.node.checks import xid
from slurmhealth.node.checks.base import Context

# A GB200 compute tray: four GPUs, each in its own PCI domain
GPUS = {f"0000{dom}:01:00.0": index for index, dom in enumerate(["0008", "0009", "0018", "0019"])}


def one(msg: str) -> dict:
    raw = {"records": [{"seq": 1, "usec": 1, "pri": 4, "msg": msg}], "lost": False, "missed": 0}
    events = xid.parse(raw)["events"]
    assert len(events) == 1, events
    return events[0]


LINES = [
    # (line, class, action, what the line says of itself)
    (  # gpud
        "NVRM: Xid (PCI:0008:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 "
        "0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",
        "warn", "none", "NETIR_BER_EVENT nonfatal, link 1, status 0x1: IGNORE",
    ),
    (  # gpud: the status the sheet sends to the Xid 154 printed beside it
        "NVRM: Xid (PCI:0019:01:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 "
        "0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
        "warn", "none", "RLW_SRC_TRACK nonfatal, link 12, status 0x8: XID_154_EVAL",
    ),
    (  # gpud: a process named, then the unit
        "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal "
        "XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
        "warn", "none", "RLW_RXPIPE nonfatal, link 13, status 0x8: IGNORE",
    ),
    (  # gpud: the unit without a link
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
        "0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu", "NETIR fatal, link -1, status 0x0: RESET_GPU",
    ),
    (  # gpud: padded columns; sub-code 0x21, investigate the peer device, reset
        "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 "
        "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu", "NETIR_LINK_EVT fatal, link 1, status 0x0, sub-code 0x21: RESET_GPU",
    ),
    (  # gpud: sub-code 0x26, investigate software or the user: the sheet's IGNORE, printed Fatal
        "NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 "
        "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        "warn", "none", "NETIR_LINK_EVT fatal, link 0, status 0x0, sub-code 0x26: IGNORE",
    ),
    (  # modelled: SAW_MVB status 0x10, the sheet's Fatal and RESET_GPU
        "NVRM: Xid (PCI:0018:01:00): 144, SAW_MVB Fatal XC0 i0 Link 04 (0x00000001 0x00000010 "
        "0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu", "SAW_MVB fatal, link 4, status 0x10: RESET_GPU",
    ),
    (  # modelled: a TLW sub-unit by its R575 name
        "NVRM: Xid (PCI:0008:01:00): 146, TLW_RX_PIPE1 Fatal XC1 i0 Link 07 (0x0000000b "
        "0x00000004 0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu", "TLW_RX_PIPE1 fatal, link 7, status 0x4: RESET_GPU",
    ),
    (  # modelled: the MSE watchdog
        "NVRM: Xid (PCI:0009:01:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link -1 (0x00000000 "
        "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu", "MSE_WATCHDOG fatal, link -1, status 0x0: RESET_GPU",
    ),
    (  # modelled: a status the sheet does not list for the unit: the printed word decides
        "NVRM: Xid (PCI:0019:01:00): 145, RLW_CTRL Fatal XC0 i0 Link 02 (0x00000003 0x00000001 "
        "0x00000000 0x00000000)",
        "fail", "reset_gpu", "RLW_CTRL fatal, link 2, status 0x1",
    ),
    (  # modelled: NETIR with a status: the sheet resets for NETIR whatever its status
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR_INT Nonfatal XC0 i0 Link -1 (0x000fe406 "
        "0x00000002 0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu", "NETIR_INT nonfatal, link -1, status 0x2: RESET_GPU",
    ),
    (  # modelled: a NETIR link event with a status: its sub-code still decides (0x21: reset)
        "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_DOWN Nonfatal XC0 i0 Link 03 (0x021425c6 "
        "0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu",
        "NETIR_LINK_DOWN nonfatal, link 3, status 0x1, sub-code 0x21: RESET_GPU",
    ),
    (  # modelled: RLW_RXPIPE 0x2 is "Non-fatal*", promotable: printed Fatal, Action 2 resets
        "NVRM: Xid (PCI:0019:01:00): 145, RLW_RXPIPE Fatal XC0 i0 Link 13 (0x0409a4c2 "
        "0x00000002 0x00000000 0x00000000 0x00000000 0x00000000)",
        "fail", "reset_gpu", "RLW_RXPIPE fatal, link 13, status 0x2: RESET_GPU",
    ),
    (  # modelled: the same printed Nonfatal stays the sheet's IGNORE
        "NVRM: Xid (PCI:0019:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 "
        "0x00000002 0x00000000 0x00000000 0x00000000 0x00000000)",
        "warn", "none", "RLW_RXPIPE nonfatal, link 13, status 0x2: IGNORE",
    ),
    (  # modelled: a unit the sheet does not list
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR_NEW_EVENT Nonfatal XC0 i0 Link 02 (0x00000030 "
        "0x00000001)",
        "warn", "none", "NETIR_NEW_EVENT nonfatal, link 2, status 0x1",
    ),
]


@pytest.mark.parametrize(("line", "cls", "action", "said"), LINES, ids=lambda v: str(v)[:40])
def test_each_line_is_classified_by_the_decode_sheet(line, cls, action, said):
    event = one(line)
    assert (event["class"], event["action"]) == (cls, action)
    assert xid._said_words(event) == said


def test_the_sub_code_is_bits_20_to_25_of_the_first_word():
    detail = one(LINES[4][0])["detail"]
    assert detail == {
        "unit": "NETIR_LINK_EVT",
        "fatal": True,
        "link": 1,
        "intrinfo": "0x021425c6",
        "status": 0,
        "subcode": 0x21,
    }
    assert one(LINES[5][0])["detail"]["subcode"] == 0x26


def test_the_reason_names_the_gpu_the_unit_and_the_bucket():
    event = one(LINES[4][0])
    result = xid.hardware({**xid.parse({"records": [], "lost": False, "missed": 0}),
                           "events": [event]}, Context(gpus=GPUS))
    assert (result.status, result.action) == ("fail", "reset_gpu")
    assert result.message == (
        "GPU 1 (0009:01:00) Xid 149 NVLink netir error, NETIR_LINK_EVT fatal, link 1, "
        "status 0x0, sub-code 0x21: RESET_GPU"
    )


def test_a_line_without_its_words_keeps_the_printed_severity():
    event = one("NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 L 8")
    assert (event["class"], event["action"], event["detail"]) == ("fail", "reset_gpu", None)


def test_lines_that_differ_in_status_or_sub_code_stay_two_events():
    """Their decode differs: merging them would hide the one that resets."""
    reset, ignored = LINES[4][0].replace("Link 01", "Link 00"), LINES[5][0]
    raw = {"records": [{"seq": n, "usec": n, "pri": 4, "msg": m.replace("0009", "0008")}
                       for n, m in enumerate([reset, ignored, reset])],
           "lost": False, "missed": 0}
    events = xid.parse(raw)["events"]
    assert [(e["detail"]["subcode"], e["repeats"], e["class"]) for e in events] == [
        (0x21, 2, "fail"),
        (0x26, 1, "warn"),
    ]


def test_every_decoded_unit_is_one_of_the_nvlink5_xids():
    for (code, unit), rules in xid.NVLINK5_DECODE.items():
        assert 144 <= code <= 150 and unit.isupper(), unit
        assert xid.XIDS[code][1] == xid.NVLINK5
        assert rules in ("NETIR_LINK", "R") or set(rules.values()) <= {"R", "I", "E", "P"}
