"""checks/aer.py: PCIe AER and DPC lines in the kernel's own formats (drivers/pci/pcie/aer.c
aer_print_port_info, aer_print_error, __aer_print_error, pci_print_aer; dpc.c); bus ids and
status words are made up, the line shapes are the kernel's format strings."""

from __future__ import annotations

import pytest

from slurmhealth.node.checks import aer
from slurmhealth.node.checks.base import Context

# A fatal completion timeout on an H100 (10de:2330) below root port 0000:40:01.1.
FATAL_GPU = [
    "pcieport 0000:40:01.1: AER: Uncorrected (Fatal) error received: 0000:41:00.0",
    "nvidia 0000:41:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), "
    "type=Transaction Layer, (Requester ID)",
    "nvidia 0000:41:00.0: AER:   device [10de:2330] error status/mask=00004000/00000000",
    "nvidia 0000:41:00.0: AER:    [14] CmpltTO                (First)",
]
# The same in the words of kernels that print the specification's terms.
FATAL_NEW = [
    "pcieport 0000:40:01.1: AER: Uncorrectable (Fatal) error message received from "
    "0000:41:00.0",
    "mlx5_core 0000:41:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), "
    "type=Data Link Layer, (Receiver ID)",
    "mlx5_core 0000:41:00.0: AER:   device [15b3:1021] error status/mask=00000020/00000000",
    "mlx5_core 0000:41:00.0: AER:    [ 5] SDES                   (First)",
]
NONFATAL = [
    "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0",
    "nvme 0000:01:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
    "type=Transaction Layer, (Requester ID)",
    "nvme 0000:01:00.0: AER:   device [144d:a80a] error status/mask=00100000/00400000",
    "nvme 0000:01:00.0: AER:    [20] UnsupReq               (First)",
    "nvme 0000:01:00.0: AER:   TLP Header: 34000000 01000010 00000000 00000000",
]
CORRECTED = [
    "pcieport 0000:40:01.1: AER: Corrected error received: 0000:41:00.0",
    "nvidia 0000:41:00.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
    "(Receiver ID)",
    "nvidia 0000:41:00.0: AER:   device [10de:2330] error status/mask=00000001/0000e000",
    "nvidia 0000:41:00.0: AER:    [ 0] RxErr                  (First)",
]
# An old kernel (4.x): no `AER: ` on the function's lines, the requester as `id=`.
OLD = [
    "pcieport 0000:00:03.0: AER: Multiple Corrected error received: id=0018",
    "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
    "id=0018(Receiver ID)",
    "pcieport 0000:00:03.0:   device [8086:2f08] error status/mask=00000001/00002000",
    "pcieport 0000:00:03.0:    [ 0] Receiver Error         (First)",
]
# Firmware first (APEI GHES, pci_print_aer): fatal where the status bit is in the severity.
FIRMWARE = [
    "nvidia 0000:c1:00.0: AER: aer_status: 0x00040000, aer_mask: 0x00000000",
    "nvidia 0000:c1:00.0: AER:    [18] MalfTLP                (First)",
    "nvidia 0000:c1:00.0: AER: aer_layer=Transaction Layer, aer_agent=Receiver ID",
    "nvidia 0000:c1:00.0: AER: aer_uncor_severity: 0x00462030",
]
DPC = [
    "pcieport 0000:40:01.1: DPC: containment event, status:0x1f01 source:0x0000",
    "pcieport 0000:40:01.1: DPC: unmasked uncorrectable error detected",
]


def raw(lines: list[str], usec_step: int = 1000000, **extra: object) -> dict:
    records = [
        {"seq": i, "usec": i * usec_step, "pri": 3, "msg": m, **extra}
        for i, m in enumerate(lines, 1)
    ]
    return {"records": records}


def judge(lines: list[str], **expect: object) -> tuple:
    facts = aer.parse(raw(lines))
    ctx = Context(expect=expect)
    return facts, aer.uncorrectable(facts, ctx), aer.correctable(facts, ctx)


def test_fatal_error_on_a_gpu_fails_with_reboot_naming_the_function():
    facts, bad, _ = judge(FATAL_GPU)
    assert bad.status == "fail" and bad.action == "reboot"
    assert bad.message.startswith("PCIe fatal error on NVIDIA GPU 0000:41:00.0 (10de:2330)")
    assert "CmpltTO" in bad.message
    (event,) = facts["events"]  # the port's report is the same error, not a second one
    assert (event["class"], event["vendor"]) == ("fatal", "10de")


def test_newer_kernels_words_and_an_hca():
    facts, bad, _ = judge(FATAL_NEW)
    assert bad.status == "fail" and "HCA 0000:41:00.0 (15b3:1021)" in bad.message
    assert facts["events"][0]["bits"] == ["SDES"]


def test_non_fatal_warns_with_the_service_hint():
    _, bad, corrected = judge(NONFATAL)
    assert bad.status == "warn" and bad.action == "service" and "UnsupReq" in bad.message
    assert corrected.status == "ok"


def test_corrected_warns_only_above_the_rate():
    _, bad, corrected = judge(CORRECTED * 5)
    assert bad.status == "ok" and corrected.status == "ok"
    _, _, corrected = judge(CORRECTED * 11)
    assert corrected.status == "warn" and "x11" in corrected.message
    _, _, corrected = judge(CORRECTED * 11, corrected_per_h=0)
    assert corrected.status == "ok"


def test_corrected_rate_is_over_the_reads_span():
    """11 errors over 2 hours of log is 5.5 an hour: below the default 10."""
    facts = aer.parse(raw(CORRECTED * 11, usec_step=2 * 3600 * 1000000 // 43))
    assert aer.correctable(facts, Context()).status == "ok"


def test_old_kernel_lines_and_requester_id():
    facts, _, _ = judge(OLD)
    (event,) = facts["events"]
    assert event["bus_id"] == "0000:00:03.0" and event["bits"] == ["Receiver Error"]
    assert event["kind"] == "PCIe function"


def test_port_report_without_details_counts():
    facts, bad, _ = judge([FATAL_GPU[0]])
    assert bad.status == "fail" and facts["events"][0]["what"] == "reported by its port"


def test_firmware_first_fatal_and_non_fatal():
    _, bad, _ = judge(FIRMWARE)
    assert bad.status == "fail" and "MalfTLP" in bad.message
    # CmpltTO (bit 14) is not in the default severity 0x00062030 (PCIe Base Specification,
    # Uncorrectable Error Severity Register defaults): non-fatal
    nonfatal = [
        "nvidia 0000:c1:00.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000",
        "nvidia 0000:c1:00.0: AER:    [14] CmpltTO                (First)",
        "nvidia 0000:c1:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
        "nvidia 0000:c1:00.0: AER: aer_uncor_severity: 0x00062030",
    ]
    _, bad, _ = judge(nonfatal)
    assert bad.status == "warn"
    _, bad, corrected = judge(FIRMWARE[:3])
    assert bad.status == "ok" and corrected.status == "ok"


def test_dpc_containment_fails_naming_the_port():
    _, bad, _ = judge(DPC)
    assert bad.status == "fail" and bad.action == "reboot"
    assert "PCIe function 0000:40:01.1: DPC containment event" in bad.message


@pytest.mark.parametrize(
    "line",
    [
        "usb 1-1: Product: nvidia 0000:41:00.0: AER: PCIe Bus Error: severity=Uncorrected "
        "(Fatal), type=Transaction Layer, (Requester ID)",
        "pcieport 0000:00:01.1: AER: enabled with IRQ 33",
        "pci 0000:41:00.0: AER: can't find device of ID0018",
        "pcieport 0000:40:01.1: DPC: enabled with IRQ 34",
    ],
)
def test_lines_that_are_no_error(line):
    facts, bad, corrected = judge([line])
    assert facts["events"] == [] and bad.status == "ok" and corrected.status == "ok"


def test_user_written_lines_never_count():
    facts = aer.parse(raw(FATAL_GPU, facility=1))
    assert facts["events"] == [] and aer.uncorrectable(facts, Context()).status == "ok"


@pytest.mark.parametrize("bad", [None, 5, {"records": "x"}, {"records": [None, {"seq": "1"}]}])
def test_parse_is_total(bad):
    facts = aer.parse(bad)
    assert facts["events"] == [] and aer.uncorrectable(facts, Context()).status == "ok"
