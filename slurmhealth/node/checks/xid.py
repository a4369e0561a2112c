"""Xid errors in the kernel log: parse the NVIDIA driver's lines, classify them, check them;
and the HCA events the mlx5 driver prints there.

Reads the raw dict of sources/kmsg.py (records newer than the saved sequence number).

Config ([xid] in slurmhealth.toml), see DEFAULTS:
    app = [13, 31, 43, 45, 68, 109]     application Xids: reported, never drain
    severity = { 94 = "warn", 8 = "ignore" }   per-Xid class: app, warn, fail or ignore
    unknown = "warn"                    class of an Xid the table does not know
    dedup_s = 60                        identical lines closer than this are one event
    repeat_days = 7, burst_max = 3, burst_h = 24, tpc_jobs = 3
                                        the node's memory (its store's recent Xids): _escalate

Facts (parse):
    {"events": [{"seq", "usec", "xid", "bus_id", "gpu_instance", "pid", "name", "text",
                 "detail", "repeats", "class", "action"}],
                                  class/action under the built-in policy; repeats = lines merged
                                  into the event (>= 1); detail = what the line itself says
                                  (see `line_detail`), or None
     "records": 12, "first_seq": 0, "after_seq": 1200, "last_seq": 1211,
     "lost": False, "missed": 0, "foreign": 0, "boot_id": "...", "window_s": 60,
     "hca": [{"kind", "bus_id", "module", "text", "seq", "usec", "repeats", ...}]
                                  the HCA's mlx5_core lines (not Xids): checks/hca_faults.py
     "sxid": [...], "driver": [...]}   NVSwitch SXid lines and the driver's Xid-less failures
                                  (GPU initialisation, NVLink link mask): checks/driver_faults.py
`foreign` counts NVRM and SXid lines that are not the kernel's own: /dev/kmsg records (or `dmesg -r`
lines) whose facility is not LOG_KERN (0), i.e. written from user space (`echo > /dev/kmsg`,
systemd). They never become events. journalctl and syslog lines carry no facility: there a
`logger -t kernel` line looks exactly like a kernel one and cannot be told apart.
Process names come from the kernel log and are untrusted: kept as bounded one-line data.
"""

from __future__ import annotations

import re

from slurmhealth.core.result import (
    DRAIN,
    FAIL,
    NONE,
    REBOOT,
    RESET_GPU,
    SERVICE,
    WARN,
    Result,
    clean,
    counted,
    fail,
    ok,
    warn,
    worst_action,
)
from slurmhealth.node.checks import driver_faults, hca_faults
from slurmhealth.node.checks.base import Context, norm_bus_id, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Keep, Schema

AREA = "xid"
SOURCE = "kmsg"

APP = "app"
IGNORE = "ignore"
NVLINK5 = "nvlink5"  # table marker: decided per line (Fatal / Nonfatal), see _nvlink5
CLASSES = (APP, WARN, FAIL, IGNORE)

DEFAULTS: Schema = {
    "app": (
        [13, 31, 43, 45, 68, 109],
        list,
        "application Xids: reported ok, never drain (k8s-device-plugin's list; 109 is disputed)",
    ),
    "severity": ({}, dict, 'per-Xid class app|warn|fail|ignore: { 94 = "warn", 8 = "ignore" }'),
    "unknown": ("warn", str, "class of an Xid missing from the table: warn, fail or ignore"),
    "dedup_s": (60, int, "identical Xid lines within this many seconds are one event"),
    # Memory (the node store's recent events, read by the agent; none with --no-db): see
    # _escalate. 0 turns a rule off.
    "repeat_days": (
        7,
        int,
        "the same fatal Xid on the same GPU (74: same link, any link for the register bits "
        "NVIDIA's NVSentinel reads per GPU; its ECC/parity bits a third time) again within N "
        "days: service, the reset or reboot did not mend it (Xid catalogue: then "
        "CONTACT_SUPPORT)",
    ),
    "burst_max": (
        3,
        int,
        "fatal-Xid reads on one GPU within burst_h that call for service (project's count)",
    ),
    "burst_h": (24, int, "the window of burst_max, in hours"),
    "sxid_repeat_max": (
        driver_faults.SXID_REPEAT_MAX,
        int,
        "the same non-fatal NVSwitch SXid on one switch and link this many times since the last "
        "run fails (the nvlink area's recovery_fail: a link that keeps failing); 0: never",
    ),
    "hca_unplug_max": (
        hca_faults.UNPLUG_MAX,
        int,
        "an HCA's port module reported unplugged this many times since the last run warns "
        "(xid.hca_events): a boot reports an empty cage once and a reseat is one unplug, a "
        "module that keeps losing contact drops its link each time; 0: never",
    ),
    "tpc_jobs": (
        3,
        int,
        "Xid 13 on the same GPU, GPC and TPC in N jobs within repeat_days: warn, suspect "
        "hardware, run diagnostics (NVIDIA GPU debug guidelines, Xid 13 workflow)",
    ),
}

# Xid -> (catalog mnemonic, class, action), from NVIDIA's Xid catalogue (its buckets,
# its older per-Xid guidance, and the toolkit column). "app": the job's own fault, recorded,
# never drains; "warn": recorded, never drains alone (the action is a hint for an idle point);
# "fail": hardware, the node takes no job until the action is done.
XIDS = {
    8: ("FIFO_ERROR_IDLE_TIMEOUT", WARN, NONE),
    13: ("GR_EXCEPTION", APP, NONE),
    31: ("FIFO_ERROR_MMU_ERR_FLT", APP, NONE),
    # Corrupted push buffer: driver, system memory, bus or thermal; only a recurrence drains.
    32: ("PBDMA_ERROR", WARN, NONE),
    43: ("RESETCHANNEL_VERIF_ERROR", APP, NONE),
    # Cleanup after another error (often a DBE): the companion Xid carries the verdict.
    45: ("PREEMPTIVE_REMOVAL", APP, NONE),
    46: ("GPU_TIMEOUT_ERROR", FAIL, RESET_GPU),
    48: ("GPU_ECC_DBE", FAIL, RESET_GPU),
    # Auxiliary power not connected: mechanical, a reset cannot fix it.
    54: ("PWR_REDUCED_CLOCKING", FAIL, SERVICE),
    # "Unused" on Ampere+ (catalog); older drivers: microcontroller breakpoint, rare.
    61: ("PMU_BREAKPOINT", FAIL, DRAIN),
    62: ("PMU_HALT_ERROR", FAIL, RESET_GPU),
    # Row remap recorded, not fatal; it only takes effect at the next GPU reset.
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", WARN, RESET_GPU),
    # Row remap failed: an RMA criterion in NVIDIA's GPU memory error management guide ("RMA
    # policy thresholds for row remapping"); the gpu area fails NVML's remap_failure with
    # service too. A reset only activates what was remapped before (catalogue: RESET_GPU, then
    # CONTACT_SUPPORT), so the node waits for service, not for a reset.
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", FAIL, SERVICE),
    68: ("NVDEC0_ERROR", APP, NONE),
    69: ("GR_CLASS_ERROR", WARN, NONE),
    # The line names the link and prints the link's seven error registers, e.g. `NVLink: fatal
    # error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)`: the catalogue's
    # RESET_GPU, refined by the register bit where one alone is set (NVLINK_BITS below).
    74: ("NVLINK_ERROR", FAIL, RESET_GPU),
    # Unreachable over PCIe: a GPU reset cannot reach it; reboot (catalog RESTART_BM).
    79: ("GPU_HAS_FALLEN_OFF_THE_BUS", FAIL, REBOOT),
    92: ("EXCESSIVE_SBE_INTERRUPTS", WARN, NONE),
    # Contained memory error. Newer drivers say on the line whether the GPU needs a reset
    # (`RST: Yes|No, D-RST: Yes|No`): see _containment. A line without those fields keeps this
    # row: k8s-device-plugin and Meta GCM both count 94 as critical, and the remap waits for a
    # GPU reset, for which the prolog is the idle point.
    94: ("CONTAINED_ERROR", FAIL, RESET_GPU),
    # Uncontained: the catalog's RESET_GPU (older guidance said reboot when MIG is off).
    95: ("UNCONTAINED_ERROR", FAIL, RESET_GPU),
    # Disputed: the catalog says RESET_GPU, k8s-device-plugin and Meta call it the app's.
    109: ("CTXSW_TIMEOUT_ERROR", APP, NONE),
    110: ("SEC_FAULT_ERROR", FAIL, RESET_GPU),
    # GSP RPC timeout: each one stalls driver calls ~6 s; the GPU needs a reset.
    119: ("GSP_RPC_TIMEOUT", FAIL, RESET_GPU),
    120: ("GSP_ERROR", FAIL, RESET_GPU),
    121: ("C2C_ERROR", WARN, NONE),
    136: ("ALI_TRAINING_FAIL", FAIL, RESET_GPU),
    137: ("NVLINK_PRIV_ERR", WARN, NONE),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", FAIL, RESET_GPU),
    # Initialisation failed: the catalogue's immediate bucket is RESET_GPU (then
    # CONTACT_SUPPORT); a repeat within repeat_days calls for service (_escalate).
    143: ("GPU_INIT_ERROR", FAIL, RESET_GPU),
    144: ("NVLINK_SAW_ERROR", NVLINK5, RESET_GPU),
    145: ("NVLINK_RLW_ERROR", NVLINK5, RESET_GPU),
    146: ("NVLINK_TLW_ERROR", NVLINK5, RESET_GPU),
    147: ("NVLINK_TREX_ERROR", NVLINK5, RESET_GPU),
    148: ("NVLINK_NVLPW_CTRL_ERROR", NVLINK5, RESET_GPU),
    149: ("NVLINK_NETIR_ERROR", NVLINK5, RESET_GPU),
    150: ("NVLINK_MSE_ERROR", NVLINK5, RESET_GPU),
    # Confidential-computing key rotation: the catalog says restart the VM; not bare metal.
    151: ("KEY_ROTATION_ERROR", WARN, NONE),
    # The driver changed the GPU's recovery action and names it on the line: see RECOVERY. A
    # line whose action cannot be read keeps this row and points to NVML (gpu area).
    154: ("GPU_RECOVERY_ACTION_CHANGED", WARN, NONE),
    155: ("NVLINK_SW_DEFINED_ERROR", FAIL, RESET_GPU),
    # Retirement done: like 63, applies at the next reset.
    156: ("RESOURCE_RETIREMENT_EVENT", WARN, RESET_GPU),
    # Retirement failed: the catalog's immediate bucket is IGNORE, then investigate.
    157: ("RESOURCE_RETIREMENT_FAILURE", WARN, NONE),
    158: ("GPU_FATAL_TIMEOUT", FAIL, RESET_GPU),
    # GB200's video encoder 3: the catalogue's bucket is CONTACT_SUPPORT, not a reset; the
    # GPU computes on, so no job is refused for it.
    142: ("NVENC3_ERROR", WARN, SERVICE),
    # CHI non-data error on a C2C-linked GPU: the catalogue's CHECK_UVM, a reset where UVM or
    # vGPU is in use, else ignore; which one holds is not on the line: a warning with the hint.
    159: ("CHI_NON_DATA_ERROR", WARN, RESET_GPU),
    160: ("CHANNEL_RETIREMENT_EVENT", WARN, NONE),
    # The companion of 160; the catalogue: IGNORE, then investigate the software.
    161: ("CHANNEL_RETIREMENT_FAILURE", WARN, NONE),
    162: ("PSHC_REENGAGED", WARN, NONE),
    163: ("PSHC_DISENGAGED", WARN, NONE),
    # Power-smoothing circuitry wearing out: plan service, not an emergency (unverified).
    164: ("PSHC_LOW_LIFETIME", WARN, SERVICE),
    165: ("PSHC_ZERO_LIFETIME", WARN, SERVICE),
    # The catalogue gives no bucket for 167 and 169. A PCIe fatal timeout is the bus failing
    # under the GPU (like 79's cause, which a reset cannot reach); 169's description is 62's
    # ("Internal micro-controller halt"), whose bucket is RESET_GPU.
    167: ("PCIE_FATAL_TIMEOUT", FAIL, REBOOT),
    # Errors in the write-protected region with ECC off (catalogue: enable ECC, or boot again).
    168: ("REDUCED_GPU_MEMORY_CAPACITY", WARN, REBOOT),
    169: ("SEC2_HALT_ERROR", FAIL, RESET_GPU),
    # Companions of Xid 48 telling DRAM from SRAM: treated as 48.
    171: ("UNCORRECTABLE_DRAM_ERROR", FAIL, RESET_GPU),
    172: ("UNCORRECTABLE_SRAM_ERROR", FAIL, RESET_GPU),
}

NOTES = {154: "act on the GPU's recovery action (NVML, gpu area)"}

# Xid 154 `GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)`: the new
# action's value is nvmlDeviceGpuRecoveryAction_t (nvml.h); what each asks for is NVIDIA's GPU
# memory error management guide, "Error Recovery and Response Flags". Same mapping as the gpu
# area's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (checks/gpu.py), so the log and NVML agree.
#   None: "the GPU can be immediately used again": the earlier action is cleared.
#   GPU Reset: terminate all GPU processes and reset the GPU.
#   Node Reboot: the fault "may have left the OS in an inconsistent state": reboot.
#   Drain P2P: quiesce all peer-to-peer traffic (end those processes, UVM persistence off), then
#     read the action again. A new job would start P2P traffic, so the node takes none (fail,
#     drain) until the driver names the next action, which is then acted on.
#   Drain and Reset: drain P2P, then reset. A reset needs an idle GPU, which is drained by
#     definition, so the action is reset_gpu (it outranks drain); the node fails meanwhile.
#   5-7 (newer nvml.h: recover IMEX domain, bus reset, system reboot) as in the gpu area; an
#   action this table does not know fails with drain.
RECOVERY = {
    0: ("recovery action cleared", IGNORE, NONE),
    1: ("GPU reset required", FAIL, RESET_GPU),
    2: ("node reboot required", FAIL, REBOOT),
    3: ("drain P2P", FAIL, DRAIN),
    4: ("drain P2P and reset", FAIL, RESET_GPU),
    5: ("recover IMEX domain", FAIL, DRAIN),
    6: ("bus reset", FAIL, REBOOT),
    7: ("system reboot", FAIL, REBOOT),
}
# The words the driver prints in parentheses, for a line without the number. Some newer drivers
# name 0x1 `PF FLR` (a function-level reset of the GPU) where others print `GPU Reset Required`
# (595.84 and 610 in NVIDIA/open-gpu-kernel-modules#1353), and 0x2 `OS Reboot` where others print
# `Node Reboot Required` (quoted from driver 610.43.02 in a public write-up whose repository
# could not be named); the number is what is read first.
_RECOVERY_WORDS = {
    "none": 0,
    "gpu reset required": 1,
    "pf flr": 1,
    "node reboot required": 2,
    "os reboot": 2,
    "drain p2p": 3,
    "drain and reset": 4,
}

# Xid 74's registers (the seven words, REG0-REG6 in printed order) where exactly one bit of
# them is set, as NVIDIA's own NVSentinel reads them (NVIDIA/NVSentinel, health-events-analyzer
# rules XID74Reg*: each matches one register with one bit and all others 0). (register, bit) ->
# (what it is, when the node needs service rather than a reset):
#   "now": at once, unless another fatal Xid on the same GPU in the same read explains it
#     (NVSentinel's "no other active errors"; its rule for REG2 bit 13 has no such condition,
#     here it has the same one as the others: a consequence of another fault keeps its reset);
#   "link": when it repeats on the same link; "gpu": when it repeats on the same GPU, any
#     link (this check's repeat rule, repeat_days, in place of NVSentinel's 24 h);
#   None: never on its own (NVSentinel's action NONE: field diagnostics if jobs fail);
#   "ignore": the catalogue's WORKFLOW_NVLINK_ERR says the bit "can be safely ignored" (REG0
#     bits 0, 23, 30): the line is ignored.
# The ECC/parity bits ("link") go to service only at their third read on the same link within
# repeat_days: the catalogue acts when one is "seen more than 2 times on the same link".
# Any other pattern (several bits, a bit not listed, not seven words) keeps the catalogue's
# RESET_GPU, with the repeat rule on the same link.
_UNEXPECTED = "unexpected NVLink error, report it to NVIDIA"
NVLINK_BITS = {
    **{(0, b): ("safe to ignore (Xid catalogue)", "ignore") for b in (0, 23, 30)},
    **{(0, b): (_UNEXPECTED, "now") for b in (1, 20)},
    **{(0, b): ("ECC/parity error", "link") for b in (4, 5)},
    **{(0, b): ("NVLink hardware error", "gpu") for b in (8, 9, 12, 16, 17, 24, 28)},
    **{
        (0, b): ("marginal signal integrity, check the link's connections", "now") for b in (21, 22)
    },
    **{(0, b): (_UNEXPECTED, "gpu") for b in (27, 29)},
    **{(2, b): ("ECC/parity error", "link") for b in (0, 1, 2, 6)},
    (2, 13): (_UNEXPECTED, "now"),
    **{(2, b): ("field diagnostics if it repeats", "gpu") for b in (16, 17, 18, 19)},
    **{(3, b): (_UNEXPECTED, "now") for b in (16, 17)},
    (3, 18): ("the NVLink fabric needs a reset", "now"),
    **{(4, b): ("ECC/parity error", "link") for b in (18, 19, 21, 22, 24, 25, 27, 28)},
    **{(4, b): ("ECC error, field diagnostics if jobs fail", None) for b in (20, 23, 26, 29)},
}
NVLINK_REGISTERS = 7

# Xid 144-150 (NVLink5, Blackwell): the catalogue's buckets are WORKFLOW_NVLINK5_ERR, i.e. its
# "Xid 144-150 Decode" sheet: per unit, and per the unit's error status (the second word of the
# line), the immediate action: RESET_GPU ("R"), IGNORE ("I") or XID_154_EVAL ("E": the Xid
# 154 printed with it names the action; this check acts on that 154). The line names the unit
# (R575 and later drivers by the second of two names, e.g. TLW_RX_PIPE0 for TLW_RX):
#   `145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 0x00000008 0x00000000 ...)`.
# The NETIR link events (NETIR_LINK_EVT / NETIR_LINK_DOWN, any status) are decided by their
# sub-code, bits 20-25 of the first word (the sheet's IntrInfo pattern): RESET_GPU but for 0x26
# (investigate software or user) and 0x28 (investigate the host), IGNORE. A unit, status or
# sub-code the sheet does not list keeps the severity the driver printed (_nvlink5).
# Read from NVIDIA's Xid catalogue spreadsheet as leptonai/gpud transcribes it
# (components/accelerator/nvidia/xid/catalog_generated.go, nvlinkRules): docs/sources.md.
_SAW = {0x1: "I", 0x2: "R", 0x4: "I", 0x8: "I", 0x10: "R", 0x20: "I"}
_TLW = {0x1: "I", 0x2: "I", 0x4: "R", 0x80000000: "I"}
_NETIR_LINK = "NETIR_LINK"  # decided by sub-code
_ANY_STATUS = "R"  # a unit the sheet resets for whatever its error status (it gives none)
NVLINK5_DECODE: dict[tuple[int, str], dict[int, str] | str] = {
    (144, "SAW_MVB"): _SAW,
    (145, "RLW_CTRL"): {0x80000000: "I"},
    (145, "RLW_REMAP"): {
        **dict.fromkeys((0x1, 0x2, 0x4, 0x8, 0x10, 0x20), "E"),
        0x40: "R", 0x80: "R", 0x100: "I", 0x200: "I", 0x80000000: "I",
    },
    (145, "RLW_RSPCOL"): {0x1: "I", 0x2: "R", 0x80000000: "I"},
    # 0x1, 0x2, 0x4: "Non-fatal*", IGNORE with an "Action 2" RESET_GPU; the sheet's glossary:
    # "* is for promoteable errors that could be non-fatal or fatal and Action 2 would apply".
    # Read here as: promoted, i.e. printed Fatal, it resets ("P"). (Its IntrInfo masks for
    # Action 2 differ from Action 1's in one bit just above the unit field, by the rendered
    # sheet: the promotion, as far as a reading of the rendered masks can tell.)
    (145, "RLW_RXPIPE"): {0x1: "P", 0x2: "P", 0x4: "P", 0x8: "I", 0x80000000: "I"},
    (145, "RLW_SRC_TRACK"): {
        0x1: "R", 0x2: "I", 0x4: "E", 0x8: "E", 0x10: "R", 0x20: "R", 0x80000000: "I",
    },
    (145, "RLW_TAGSTATE"): {
        0x1: "I", 0x2: "R", 0x10000: "I", 0x20000: "R", 0x100000: "R", 0x80000000: "I",
    },
    **{(146, unit): _TLW for unit in ("TLW_CTRL", "TLW_RX", "TLW_RX_PIPE0", "TLW_RX_PIPE1",
                                      "TLW_TX", "TLW_TX_PIPE0", "TLW_TX_PIPE1")},
    (147, "TREX"): {0x1: "I", 0x80000000: "I"},
    **{(148, unit): {0x80000000: "I"} for unit in ("NVLPW_CTRL", "NVLPW")},
    # the sheet gives these no error status: "RESET_GPU | SYMPATHETIC_REPORT_SOLO | Link Fatal"
    **{(149, unit): _ANY_STATUS for unit in ("NETIR", "NETIR_INT")},
    (149, "NETIR_BER_EVENT"): dict.fromkeys((0x0, 0x1, 0x2, 0x3), "I"),
    (149, "NETIR_LINK_EVT"): _NETIR_LINK,
    (149, "NETIR_LINK_DOWN"): _NETIR_LINK,
    (149, "NETIR_MFDE_EVENT"): {0x1: "R", 0x3: "I", 0x4: "R", 0x5: "R", 0x7: "R"},
    (150, "MSE_WATCHDOG"): {0x0: "R"},
}
# NETIR link event sub-codes the sheet lists, and the two it does not reset for.
_NETIR_SUBCODES = frozenset((0x0, 0x1, 0x2, 0x4, 0xA, 0xF, 0x10, 0x11, 0x12, 0x15, 0x16,
                             *range(0x20, 0x27), 0x28, 0x2A, 0x2B))
_NETIR_IGNORED = frozenset((0x26, 0x28))
_BUCKETS = {"R": ("RESET_GPU", FAIL, RESET_GPU), "I": ("IGNORE", WARN, NONE),
            "E": ("XID_154_EVAL", WARN, NONE)}

NAME_MAX = 64  # a comm is 15 bytes, but the kernel escapes each odd byte as 4 chars (\xNN)
TEXT_MAX = 160
EVENTS_MAX = 50  # events listed in a result's data; the count is always complete
FELL = "fallen off the bus"
OFF_BUS_TEXT = "GPU has fallen off the bus."

# PCI address as the driver prints it: `0000:9b:00`, legacy `PCI:`-less, or with `.0`.
_BUS = r"(?:PCI:)?([0-9A-Fa-f]{1,8}(?::[0-9A-Fa-f]{1,4}){1,2}(?:\.[0-7])?)"
# Anchored at the message start: a user-controlled string elsewhere in another subsystem's line
# (a file name, a device name) cannot pass for an Xid. MIG adds ` GPU-I:05` inside the parens.
# Patterns stay strings for re's own cache: a prolog whose new records hold no NVRM line never
# compiles them.
_XID_LINE = (
    r"\s*NVRM: Xid \(" + _BUS + r"(?: GPU-I:([0-9]{1,4}))?[^)]{0,64}\): ([0-9]{1,6})\b,? ?(.*)"
)
# Fallen off the bus without Xid text (the driver's NVRM lines, docs/sources.md): one line
# naming the GPU by its PCI address only (`GPU 0000:18:00.0: GPU has fallen off the bus.`, or
# with `at PCI:` as in the driver's `GPU at PCI:0000:18:00: GPU-<uuid>` line), or
# `The NVIDIA GPU <bus>` followed within a few records by `... fallen off the bus and is not
# responding to commands.` (or in one record, when dmesg joined its continuation lines).
_GPU_OFF = r"\s*NVRM: GPU (?:at )?" + _BUS + r": GPU has fallen off the bus"
_THE_GPU = r"\s*NVRM: The NVIDIA GPU " + _BUS
PENDING_RECORDS = 3
_NVLINK5_SEVERITY = r"\b(non-?fatal|fatal)\b"
# Xid 144-150's own words: unit, severity, containment, instance, link, then the unit's words
# in parentheses (the driver pads the columns with spaces): `NETIR_LINK_EVT  Fatal   XC0 i0
# Link 01 (0x021425c6 0x00000000 ...)`.
_NVLINK5_LINE = (
    r"\b([A-Z][A-Z0-9_]{1,31}) +(Fatal|Non-?fatal) +XC ?([0-9]) +i ?([0-9]{1,3}) +Link +"
    r"(-?[0-9]{1,3}) *[(\[](0x[0-9A-Fa-f]{1,8})(?:[ ,]+(0x[0-9A-Fa-f]{1,8}))?"
)
_NUMBERS = r"0x[0-9A-Fa-f]+|[0-9]+"
# What a line says about itself (line_detail). Xid 154: `... from 0x0 (None) to 0x1 (GPU Reset
# Required)`; the number is authoritative, the words serve a line without it.
_RECOVERY_TO = (
    r"recovery action changed from .{0,40}?\bto "
    r"(?:(0x[0-9A-Fa-f]{1,8}|[0-9]{1,9}))? ?(?:\(([^)]{0,40})\))?"
)
# Xid 94/95: `Contained: CE User Channel (0x9). RST: No, D-RST: No` (`D-RST` must not pass for
# `RST`, hence the look-behind).
_CONTAINED = r"\b(Uncontained|Contained)\b"
_RST = r"(?<![\w-])RST: ?(Yes|No)\b"
_D_RST = r"\bD-RST: ?(Yes|No)\b"
# Xid 74: `NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)`.
_WORD = r"(?:0x[0-9A-Fa-f]{1,16}|[0-9]{1,20})"
_LINK_WORDS = r"\blink ?([0-9]{1,3}) ?\((" + _WORD + r"(?:, ?" + _WORD + r"){0,15})\)"
_LINK = r"\blink ?([0-9]{1,3})\b"
# Xid 13: `Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address`.
_GPC_TPC = r"\(GPC ?([0-9]{1,3}), ?TPC ?([0-9]{1,3})\b"
# A row-remapper failure in the driver's words (`Row Remapper Error`, `row remapping failed`).
_REMAP_FAILED = r"\bremap\w{0,10}\W{1,3}(?:\w+\W{1,3}){0,3}?(?:error|fail\w{0,4})\b"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pid(token: str) -> int | None:
    """`2024380` -> 2024380; `'<unknown>'` and anything else -> None."""
    return int(token) if token.isdigit() and token.isascii() and len(token) <= 10 else None


def _name(token: str) -> str | None:
    """A process name from the log: untrusted, so one printable line of bounded length."""
    if token in ("", "<unknown>", "'<unknown>'"):
        return None
    return clean(token, NAME_MAX) or None


def _field(rest: str, key: str) -> tuple[Any, ...]:
    """(value, rest after it) when `rest` starts with `key=`; (None, rest) otherwise."""
    if not rest.startswith(key):
        return None, rest
    value, _, after = rest[len(key) :].partition(",")
    return value.strip(), after.lstrip()


def _event(xid: int, bus: str | None, instance: str | None, rest: str) -> dict[str, Any]:
    pid, rest = _field(rest, "pid=")
    name, rest = _field(rest, "name=")
    return {
        "xid": xid,
        "bus_id": norm_bus_id(bus) if bus else None,
        "gpu_instance": int(instance) if instance else None,
        "pid": _pid(pid) if pid is not None else None,
        "name": _name(name[: 4 * NAME_MAX]) if name is not None else None,
        "text": clean(rest[: 4 * TEXT_MAX], TEXT_MAX),
        "detail": line_detail(xid, rest[: 4 * TEXT_MAX]),
    }


def _yes(found: re.Match[str] | None) -> bool | None:
    return None if found is None else found.group(1) == "Yes"


def _recovery(text: str) -> dict[str, Any] | None:
    found = re.search(_RECOVERY_TO, text, re.A)
    if found is None:
        return None
    number, words = found.groups()
    code = int(number, 0) if number else _RECOVERY_WORDS.get((words or "").strip().lower())
    return {"recovery": code} if code is not None else None


def line_detail(xid: int, text: str) -> dict[str, Any] | None:
    """What the driver's line says about its own severity, as plain data, or None:
    Xid 154 {"recovery": n} (nvmlDeviceGpuRecoveryAction_t); Xid 94/95 {"contained",
    "rst", "d_rst"} (True/False, None when the line has no such field); Xid 74 {"link",
    "words"} (the link's error registers as printed), with {"register", "bit", "kind", "when"}
    where one bit alone is set and NVLINK_BITS names it; Xid 144-150 {"unit", "fatal",
    "link", "intrinfo", "status", "subcode"} (_nvlink5_words); Xid 13 {"gpc", "tpc"} where
    the exception names its unit; any Xid whose text reports a row-remap failure
    {"remap_failure": True}. Cheap: only these Xids run a regex."""
    detail: dict[str, Any] = {}
    if xid == 13:
        found = re.search(_GPC_TPC, text, re.A)
        detail = {"gpc": int(found.group(1)), "tpc": int(found.group(2))} if found else {}
    elif xid == 154:
        detail = _recovery(text) or {}
    elif xid in (94, 95):
        contained = re.search(_CONTAINED, text, re.A)
        rst, d_rst = re.search(_RST, text, re.A), re.search(_D_RST, text, re.A)
        if contained or rst or d_rst:
            detail = {
                "contained": None if contained is None else contained.group(1) == "Contained",
                "rst": _yes(rst),
                "d_rst": _yes(d_rst),
            }
    elif 144 <= xid <= 150:
        detail = _nvlink5_words(text)
    elif xid == 74:
        found = re.search(_LINK_WORDS, text, re.A | re.I)
        if found:
            words = [w.strip() for w in found.group(2).split(",")]
            detail = {"link": int(found.group(1)), "words": words, **_nvlink_bit(words)}
        else:
            found = re.search(_LINK, text, re.A | re.I)
            detail = {"link": int(found.group(1)), "words": []} if found else {}
    if "emap" in text and re.search(_REMAP_FAILED, text, re.A | re.I):
        detail["remap_failure"] = True
    return detail or None


def _nvlink5_words(text: str) -> dict[str, Any]:
    """Xid 144-150's unit, the severity the driver printed, its link, first word (`intrinfo`),
    error status (the second word; None where the line has one word) and the sub-code, bits
    20-25 of the first word; {} when the line is not in that form."""
    found = re.search(_NVLINK5_LINE, text, re.A)
    if found is None:
        return {}
    unit, severity, _, _, link, first, second = found.groups()
    intrinfo = int(first, 16)
    return {
        "unit": unit,
        "fatal": severity == "Fatal",
        "link": int(link),
        "intrinfo": f"0x{intrinfo:08x}",
        "status": int(second, 16) if second else None,
        "subcode": intrinfo >> 20 & 0x3F,
    }


def nvlink5_bucket(xid: int, detail: dict[str, Any]) -> str | None:
    """The catalogue's decode-sheet bucket ("R", "I" or "E": NVLINK5_DECODE) of an Xid 144-150
    line's words, or None where the sheet does not list the unit, status or sub-code."""
    rules = NVLINK5_DECODE.get((xid, str(detail.get("unit"))))
    status, sub = detail.get("status"), detail.get("subcode")
    if rules == _ANY_STATUS:
        return "R"
    if rules == _NETIR_LINK:  # the sheet's rows give a sub-code and no error status
        if sub not in _NETIR_SUBCODES:
            return None
        return "I" if sub in _NETIR_IGNORED else "R"
    if isinstance(rules, dict) and isinstance(status, int):
        bucket = rules.get(status)
        if bucket == "P":  # promotable: Action 2 (RESET_GPU) where the line says Fatal
            return "R" if detail.get("fatal") else "I"
        return bucket
    return None


def _nvlink_bit(words: list[Any]) -> dict[str, Any]:
    """{"register", "bit", "kind", "when"} of Xid 74's seven registers when exactly one bit of
    them is set and NVLINK_BITS names it; else {}."""
    if len(words) != NVLINK_REGISTERS:
        return {}
    try:
        values = [int(w, 0) for w in words]
    except ValueError:
        return {}
    set_bits = [(r, b) for r, v in enumerate(values) for b in range(64) if v >> b & 1]
    if len(set_bits) != 1 or set_bits[0] not in NVLINK_BITS:
        return {}
    register, bit = set_bits[0]
    kind, when = NVLINK_BITS[set_bits[0]]
    return {"register": register, "bit": bit, "kind": kind, "when": when}


def parse_line(msg: str) -> dict[str, Any] | None:
    """The Xid event of one `NVRM: Xid (...)` message, or None when it is not one."""
    if "Xid (" not in msg:  # most NVRM lines are not Xids: skip the regex
        return None
    found = re.match(_XID_LINE, msg, re.A)
    if found is None:
        return None
    bus, instance, xid, rest = found.groups()
    return _event(int(xid), bus, instance, rest)


def fallen_off(msg: str, seq: int, pending: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """(bus id of an Xid-less fallen-off-the-bus report or None, pending) for one message.

    `pending` is (bus, seq) of a recent `The NVIDIA GPU <bus>` record whose `fallen off the
    bus` line comes a record or two later (the driver prints that report as several lines).
    """
    if FELL not in msg and "The NVIDIA GPU" not in msg:
        return None, pending
    found = re.match(_GPU_OFF, msg, re.A)
    if found:
        return found.group(1), pending
    found = re.match(_THE_GPU, msg, re.A)
    if found:
        return (found.group(1), None) if FELL in msg else (None, (found.group(1), seq))
    if pending and FELL in msg and 0 < seq - pending[1] <= PENDING_RECORDS:
        return pending[0], None
    return None, pending


def _foreign(rec: dict[str, Any]) -> bool:
    """A record from user space: its facility (PRI >> 3) is known and not LOG_KERN (0)."""
    facility = rec.get("facility")
    return isinstance(facility, int) and not isinstance(facility, bool) and facility != 0


def _scan(records: list[Any]) -> dict[str, Any]:
    """{"events", "count", "last", "foreign", "hca", "sxid", "driver"} of raw records:
    Xid events, the record count and last sequence number, the NVRM and SXid lines user space
    wrote (`_foreign`, skipped), HCA events, SXid events and the driver's Xid-less failures
    (checks/driver_faults.py). Malformed records are skipped."""
    events: list[Any] = []
    hca: dict[tuple[Any, ...], dict[str, Any]] = {}
    sxid: dict[tuple[Any, ...], dict[str, Any]] = {}
    driver: dict[tuple[Any, ...], dict[str, Any]] = {}
    count, last, pending, foreign = 0, None, None, 0
    for rec in records:
        seq = _int(rec.get("seq")) if isinstance(rec, dict) else None
        if seq is None:
            continue
        count += 1
        last = seq if last is None or seq > last else last
        msg = rec.get("msg")
        if not isinstance(msg, str):
            continue
        if "NVRM" not in msg:
            if "mlx5_core" in msg and not _foreign(rec):
                hca_faults.hca_line(msg, seq, _int(rec.get("usec")), hca)
            elif "SXid" in msg:
                if _foreign(rec):
                    foreign += 1
                else:
                    driver_faults.sxid_line(msg, seq, _int(rec.get("usec")), sxid)
            continue
        if _foreign(rec):
            foreign += 1
            continue
        event = parse_line(msg)
        if event is None:
            bus, pending = fallen_off(msg, seq, pending)
            event = _event(79, bus, None, OFF_BUS_TEXT) if bus else None
        if event is None:
            driver_faults.driver_line(msg, seq, _int(rec.get("usec")), driver)
        else:
            event.update(seq=seq, usec=_int(rec.get("usec")), repeats=1)
            events.append(event)
    return {
        "events": events,
        "count": count,
        "last": last,
        "foreign": foreign,
        "hca": list(hca.values()),
        "sxid": list(sxid.values()),
        "driver": list(driver.values()),
    }


def _key(event: dict[str, Any]) -> tuple[Any, ...]:
    """Same fault: same Xid, GPU, instance and text once numbers (pid, addresses) are blanked,
    and the same decoded severity (a 154 to reset and a 154 back to none are two events; an
    NVLink5 unit's error status and sub-code, which its decode turns on)."""
    shape = re.sub(_NUMBERS, "#", event["text"], flags=re.A)
    detail = event.get("detail") or {}
    said = (detail.get("recovery"), detail.get("rst"), detail.get("d_rst"),
            detail.get("status"), detail.get("subcode"))
    return event["xid"], event["bus_id"], event["gpu_instance"], shape, said


def _near(kept: dict[str, Any], event: dict[str, Any], window_s: float) -> bool:
    if kept["usec"] is None or event["usec"] is None:
        return True  # no timestamps (plain dmesg lines): identical lines in one read are repeats
    apart: int = abs(event["usec"] - kept["usec"])
    return apart <= window_s * 1e6


def _spread(kept: dict[str, Any], event: dict[str, Any]) -> None:
    """Xid 13 lines merged into one event but naming different GPC/TPC units: the exception
    is not local to one unit (an application's bad address hits every SM that ran it), so the
    event names none (`spread`), and the TPC rule (_escalate) never counts it."""
    mine, theirs = kept.get("detail") or {}, event.get("detail") or {}
    if "tpc" not in mine or mine.get("spread"):
        return
    if (mine.get("gpc"), mine.get("tpc")) != (theirs.get("gpc"), theirs.get("tpc")):
        kept["detail"] = dict(mine, gpc=None, tpc=None, spread=True)


def dedup(events: list[Any], window_s: float) -> list[Any]:
    """Merge repeats of the same fault within `window_s` of the first one (the driver repeats
    Xids, e.g. 119 every 6 s); each kept event counts its lines in `repeats`."""
    out: list[Any] = []
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in events:
        key = _key(event)
        kept = latest.get(key)
        if kept is not None and _near(kept, event, window_s):
            kept["repeats"] += event["repeats"]
            _spread(kept, event)
            continue
        kept = dict(event)
        latest[key] = kept
        out.append(kept)
    return out


def parse(raw: object, window_s: float = DEFAULTS["dedup_s"][0]) -> dict[str, Any]:
    """Raw kmsg facts -> Xid events (deduplicated) and log continuity. Never raises."""
    raw = raw if isinstance(raw, dict) else {}
    records = raw.get("records")
    scan = _scan(records if isinstance(records, list) else [])
    events = dedup(scan["events"], window_s)
    for event in events:
        event["class"], event["action"] = classify(event["xid"], event["text"], None, event)
    _secondary(events, None)
    boot = raw.get("boot_id")
    return {
        "events": events,
        "records": scan["count"],
        "first_seq": _int(raw.get("first_seq")),
        "after_seq": _int(raw.get("after_seq")),
        "last_seq": scan["last"],
        "lost": raw.get("lost") is True,
        "missed": max(_int(raw.get("missed")) or 0, 0),
        "foreign": scan["foreign"],
        "hca": scan["hca"],
        "sxid": scan["sxid"],
        "driver": scan["driver"],
        "boot_id": clean(boot, 64) if isinstance(boot, str) else None,
        "kernel": clean(raw["kernel"], 64) if isinstance(raw.get("kernel"), str) else None,
        "nccl": clean(raw["nccl"], 32) if isinstance(raw.get("nccl"), str) else None,
        "window_s": window_s,
    }


def versions_of(facts: Facts) -> dict[str, Any]:
    """The versions each run records of the kernel log's source (the nightly report's odd node
    out): the running kernel's release and the host's NCCL, when the log read was the live
    one."""
    return {key: facts[key] for key in ("kernel", "nccl") if facts.get(key)}


def _xid(value: object) -> int | None:
    """An Xid number from config: 79 or "79"."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return _int(value)


def _overrides(severity: object) -> dict[int | None, Any]:
    """{xid: class} from `severity = { 94 = "warn" }` (TOML keys are strings)."""
    if not isinstance(severity, dict):
        return {}
    return {_xid(k): v for k, v in severity.items() if v in CLASSES}


def policy(expect: dict[str, Any]) -> dict[str, Any]:
    """The classification policy of an area's expectations; bad entries are ignored."""
    app = expect.get("app", DEFAULTS["app"][0])
    severity = expect.get("severity")
    unknown = expect.get("unknown")
    return {
        "app": {_xid(x) for x in app} if isinstance(app, list) else set(),
        "severity": _overrides(severity),
        "unknown": unknown if unknown in (WARN, FAIL, IGNORE) else WARN,
    }


DEFAULT_POLICY = policy({})


def _nvlink5(text: str) -> tuple[Any, ...]:
    """Xid 144-150 carry their severity in the line: `NETIR_LINK_EVT Fatal ...` / `Nonfatal`.

    Where the catalogue's decode sheet lists the line's unit and status, that decides
    (NVLINK5_DECODE, _said); otherwise the word printed by the driver: Fatal fails with the
    catalogue's reset, anything else warns."""
    found = re.search(_NVLINK5_SEVERITY, text, re.I | re.A)
    if found and found.group(1).lower() == "fatal":
        return FAIL, RESET_GPU
    return WARN, NONE


def _containment(xid: int, detail: dict[str, Any]) -> tuple[Any, ...] | None:
    """Xid 94/95 by the line's own `RST` (GPU reset required) and `D-RST` (drain P2P, then
    reset) fields, read as Xid 154's GPU Reset and Drain and Reset (NVIDIA's GPU memory error
    management guide). A reset asked for: fail, reset_gpu. A contained error (94) whose GPU
    needs no reset: per the guide's error containment, only the application that met the
    error is terminated, other work continues and new work can start without a reset, so the
    node is not drained: warn (the error is the memory's, not the job's: not the app class),
    with reset_gpu as the idle-point hint the guide gives for the pending row remap. An
    uncontained error (95) may have reached every workload on the GPU: the catalogue's reset
    stands whatever the fields say. Reboot is never read from these fields: the driver asks
    for one through Xid 154 (Node Reboot Required), handled there."""
    rst, d_rst = detail.get("rst"), detail.get("d_rst")
    if rst or d_rst:
        return FAIL, RESET_GPU
    if xid == 94 and rst is False and d_rst is False and detail.get("contained") is not False:
        return WARN, RESET_GPU
    return None


def _said(xid: int, detail: object) -> tuple[Any, ...] | None:
    """(class, action) the line itself states, or None to use the table."""
    if not isinstance(detail, dict):
        return None
    if detail.get("remap_failure") is True:
        return FAIL, SERVICE  # row remap failed: service, as the gpu area's remap_failure
    if xid == 154:
        code = _int(detail.get("recovery"))
        if code is None:
            return None
        entry = RECOVERY.get(code)
        return (entry[1], entry[2]) if entry else (FAIL, DRAIN)
    if xid in (94, 95):
        return _containment(xid, detail)
    if 144 <= xid <= 150 and "unit" in detail:
        bucket = nvlink5_bucket(xid, detail)
        return _BUCKETS[bucket][1:] if bucket else None
    if xid == 74 and detail.get("when") == "now" and not detail.get("secondary"):
        return FAIL, SERVICE
    if xid == 74 and detail.get("when") == "ignore":
        return IGNORE, NONE
    return None


def _secondary(events: list[Any], rules: dict[str, Any] | None) -> None:
    """An Xid 74 whose register bit asks for service at once (NVLINK_BITS "now") is read as
    the consequence of another fault when the same GPU printed another fatal Xid in the same
    read (the catalogue: a GPU that fails takes its links down with it): its detail gains
    "secondary" and it is classified again (under `rules`), by the table. In place."""
    fatal = {e["bus_id"] for e in events if e.get("class") == FAIL and e["xid"] not in (74, 154)}
    for event in events:
        detail = event.get("detail")
        if (
            event["xid"] == 74
            and isinstance(detail, dict)
            and detail.get("when") == "now"
            and event["bus_id"] in fatal
        ):
            event["detail"] = dict(detail, secondary=True)
            event["class"], event["action"] = classify(74, event["text"], rules, event)


def _table_class(xid: int, text: str, unknown: str, detail: object = None) -> tuple[Any, ...]:
    said = _said(xid, detail)
    if said is not None:
        return said
    entry = XIDS.get(xid)
    if entry is None:
        return unknown, DRAIN if unknown == FAIL else NONE
    if entry[1] == NVLINK5:
        return _nvlink5(text)
    return entry[1], entry[2]


def classify(
    xid: int,
    text: str = "",
    rules: dict[str, Any] | None = None,
    event: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """(class, action) of one Xid: config override, then the app list, then what the line says
    (`event["detail"]`, else decoded from `text`), then the table."""
    rules = rules or DEFAULT_POLICY
    detail = event["detail"] if event and "detail" in event else line_detail(xid, text)
    cls, action = _table_class(xid, text, rules["unknown"], detail)
    if xid in rules["app"]:
        cls, action = APP, NONE
    elif cls == APP:  # taken off the app list by config: no longer the job's fault
        cls = WARN
    override = rules["severity"].get(xid)
    if override is None or override == cls:
        return cls, action
    if override == FAIL:
        return FAIL, action if action != NONE else DRAIN
    return override, NONE


def _gpu_map(gpus: object) -> dict[str, Any]:
    if not isinstance(gpus, dict):
        return {}
    return {norm_bus_id(k): v for k, v in gpus.items() if isinstance(k, str)}


def _window(ctx: Context, facts: Facts) -> float | None:
    """A configured dedup window wider than parse's: merge again (parse sees no config)."""
    value = ctx.expect.get("dedup_s")
    default: float = DEFAULTS["dedup_s"][0]
    used: float = facts.get("window_s", default)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > used:
        return value
    return None


def events_for(facts: Facts, ctx: Context) -> list[Any]:
    """The facts' events classified under the node's config and named by GPU index."""
    rules = policy(ctx.expect)
    window = _window(ctx, facts)
    events = facts.get("events") or []
    events = dedup(events, window) if window else events
    gpus = _gpu_map(ctx.gpus)
    job = ctx.job_gpus
    out = []
    for event in events:
        cls, action = classify(event["xid"], event["text"], rules, event)
        item = dict(event, gpu=gpus.get(event["bus_id"]), action=action)
        item["class"] = cls
        if isinstance(job, (list, tuple, set)):
            item["job"] = item["gpu"] in job
        out.append(item)
    _secondary(out, rules)
    if out:
        _escalate(out, facts, ctx)
    return out


# --- memory: the node's recent Xids (the store, via the agent) -------------------------------
#
# The agent reads the node's recent Xid events from its store once per run (store.recent_events,
# over history_s(expect)) and hands them in as the xid baseline's "recent": plain dicts with id,
# time, code, gpu, bus_id, class, action, text, job_id, pid. Without a store (check --no-db, a
# store that could not be read) there is no "recent" and these rules never fire. This run's own
# events are not in the store yet, except when a concurrent run read the same kernel-log
# record and recorded it first: rows with this run's event ids are left out.


def _setting(expect: dict[str, Any], key: str) -> float:
    """A rule's number from config; 0 (off) when unusable."""
    value = expect.get(key, DEFAULTS[key][0])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return 0
    return value


def history_s(expect: dict[str, Any]) -> float:
    """How far back the rules look (the agent's one read of the store): the longest window of
    a rule that is on; 0 when all are off."""
    days = _setting(expect, "repeat_days") * 86400.0
    burst = _setting(expect, "burst_h") * 3600.0 if _setting(expect, "burst_max") else 0.0
    return max(days, burst)


def _gpu_key(bus: object, gpu: object) -> tuple[Any, ...] | None:
    """A GPU by its PCI address (stable across boots), else its index."""
    if isinstance(bus, str) and bus:
        return ("bus", bus)
    return ("gpu", gpu) if _int(gpu) is not None else None


def _row_ok(row: object) -> bool:
    return (
        isinstance(row, dict)
        and isinstance(row.get("time"), (int, float))
        and _int(row.get("code")) is not None
    )


def _same_link(event: dict[str, Any], row: dict[str, Any]) -> bool:
    """Xid 74 repeats on the same NVLink; a line naming no link matches any, and so does any
    link of the GPU where the register bit is one NVIDIA reads per GPU (NVLINK_BITS "gpu")."""
    if event["xid"] != 74:
        return True
    detail = event.get("detail") or {}
    link = detail.get("link")
    if link is None or detail.get("when") == "gpu":
        return True
    then = (line_detail(74, str(row.get("text") or "")) or {}).get("link")
    return then is None or then == link


def _unit(xid: int, detail: object) -> tuple[Any, ...] | None:
    """(GPC, TPC) an Xid 13 event names, None when it names none or several (spread)."""
    if xid != 13 or not isinstance(detail, dict) or detail.get("spread"):
        return None
    gpc, tpc = _int(detail.get("gpc")), _int(detail.get("tpc"))
    return None if gpc is None or tpc is None else (gpc, tpc)


def _owner(pid: object, job: object, other: object) -> tuple[Any, ...]:
    """Whose Xid 13 it was: the process (one per job and rank), else the job, else the read."""
    if _int(pid) is not None:
        return ("pid", pid)
    return ("job", job) if job else ("read", other)


def _escalate(events: list[Any], facts: Facts, ctx: Context) -> None:
    """What the node's memory changes, in place (each sets event["again"]):
    - repeat: a fatal Xid (class fail) that this GPU (Xid 74: this link) already had within
      repeat_days, read by an earlier run: the reset or reboot that followed did not mend it.
      The catalogue's buckets for these Xids are an immediate action (RESET_GPU, RESTART_BM)
      and then an investigatory CONTACT_SUPPORT: service.
    - burst: the burst_max-th run within burst_h that read a fatal Xid on this GPU (runs, not
      Xids: one incident prints several, 48 with 63/94/154): service.
    - tpc: Xid 13 naming one GPC/TPC, which tpc_jobs distinct jobs (processes) hit on this GPU
      within repeat_days. NVIDIA's GPU debug guidelines: a Graphics Engine Exception that
      repeats on the same GPC/TPC suggests the hardware; run diagnostics. A suspicion, not a
      verdict: warn (recorded, lemon evidence, never drains alone), with service as the hint
      (dcgmi diag / field diagnostics), instead of the application's class."""
    recent = ctx.baseline.get("recent") if isinstance(ctx.baseline, dict) else None
    if not isinstance(recent, list) or not recent:
        return
    boot = facts.get("boot_id") or ""
    own = {f"{AREA}:{ctx.node}:{boot}:{e.get('seq')}:{e['xid']}" for e in events}
    rows = [r for r in recent if _row_ok(r) and r.get("id") not in own]
    days = _setting(ctx.expect, "repeat_days")
    burst_max, burst_h = _setting(ctx.expect, "burst_max"), _setting(ctx.expect, "burst_h")
    tpc_jobs = _setting(ctx.expect, "tpc_jobs")
    now = ctx.now
    for event in events:
        key = _gpu_key(event["bus_id"], event.get("gpu"))
        if key is None or event["class"] == IGNORE:
            continue
        mine = [r for r in rows if _gpu_key(r.get("bus_id"), r.get("gpu")) == key]
        if event["class"] == FAIL:
            again = _repeat(event, mine, now, days) or _burst(mine, now, burst_max, burst_h)
            if again:
                event["action"], event["again"] = SERVICE, again
        unit = _unit(event["xid"], event.get("detail"))
        if unit and tpc_jobs and days:
            owners = {
                _owner(r.get("pid"), r.get("job_id"), r.get("time"))
                for r in mine
                if r["code"] == 13
                and now - r["time"] <= days * 86400
                and _unit(13, line_detail(13, str(r.get("text") or ""))) == unit
            }
            owners.add(_owner(event.get("pid"), None, "now"))
            if len(owners) >= tpc_jobs:
                event["class"] = FAIL if event["class"] == FAIL else WARN
                event["action"] = SERVICE
                event["again"] = {"rule": "tpc", "count": len(owners), "days": days}
                event["again"].update(gpc=unit[0], tpc=unit[1])


def _repeat(
    event: dict[str, Any], mine: list[dict[str, Any]], now: float, days: float
) -> dict[str, Any] | None:
    if not days:
        return None
    runs = {
        r["time"]
        for r in mine
        if r["code"] == event["xid"]
        and r.get("class") == FAIL
        and now - r["time"] <= days * 86400
        and _same_link(event, r)
    }
    detail = event.get("detail") or {}
    need = 2 if event["xid"] == 74 and detail.get("when") == "link" else 1  # NVLINK_BITS
    return {"rule": "repeat", "count": len(runs) + 1, "days": days} if len(runs) >= need else None


def _burst(mine: list[Any], now: float, most: float, hours: float) -> dict[str, Any] | None:
    if not most or not hours:
        return None
    runs = {r["time"] for r in mine if r.get("class") == FAIL and now - r["time"] <= hours * 3600}
    if runs and len(runs) + 1 >= most:
        return {"rule": "burst", "count": len(runs) + 1, "hours": hours}
    return None


def _nth(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _again_words(event: dict[str, Any], what: str) -> str:
    """The Reason of an event the node's memory escalated (see _escalate)."""
    again, xid = event["again"], event["xid"]
    if again["rule"] == "burst":
        return (
            f"{again['count']} fatal Xid reads on {where(event)} in {again['hours']:g} h, "
            f"now Xid {xid} {what}"
        )
    if again["rule"] == "tpc":
        return (
            f"again: Xid 13 on {where(event)} GPC {again['gpc']} TPC {again['tpc']}, "
            f"{counted(again['count'], 'job')} in {counted(again['days'], 'day')}: suspect the "
            "GPU, run diagnostics"
        )
    link = (event.get("detail") or {}).get("link") if xid == 74 else None
    link_words = f" link {link}" if link is not None else ""
    return (
        f"again: Xid {xid} on {where(event)}{link_words}, {_nth(again['count'])} time in "
        f"{counted(again['days'], 'day')} ({what})"
    )


def _ordered(events: list[Any]) -> list[Any]:
    """Worst first: fail before warn, escalated by the node's memory, the worst action, the
    job's GPUs, then log order."""
    rank = {FAIL: 0, WARN: 1, APP: 2, IGNORE: 3}
    worst = worst_action([e["action"] for e in events])
    return sorted(
        events,
        key=lambda e: (
            rank[e["class"]],
            not e.get("again"),  # what the node's memory escalated is the news
            e["action"] != worst,
            not e.get("job", True),
            e["seq"],
        ),
    )


def where(event: dict[str, Any]) -> str:
    """`GPU 3 (0000:9b:00)`, `GPU 0000:9b:00` when the index is unknown; MIG adds `GI 5`."""
    bus = event["bus_id"] or "?"
    name = f"GPU {event['gpu']} ({bus})" if event.get("gpu") is not None else f"GPU {bus}"
    return name if event["gpu_instance"] is None else f"{name} GI {event['gpu_instance']}"


_ACRONYMS = {
    "gpu": "GPU",
    "ecc": "ECC",
    "dbe": "DBE",
    "sbe": "SBE",
    "nvlink": "NVLink",
    "gsp": "GSP",
    "rpc": "RPC",
    "c2c": "C2C",
    "pmu": "PMU",
    "dram": "DRAM",
    "sram": "SRAM",
    "pbdma": "PBDMA",
    "fifo": "FIFO",
    "mmu": "MMU",
    "gr": "GR",
    "ctxsw": "ctx switch",
    "sec": "security",
    "inforom": "InfoROM",
    "nvdec0": "NVDEC0",
    "ali": "ALI",
    "pshc": "PSHC",
    "pwr": "power",
}


def _mnemonic_words(mnemonic: str) -> str:
    """`GPU_HAS_FALLEN_OFF_THE_BUS` -> `GPU has fallen off the bus`."""
    return " ".join(_ACRONYMS.get(w, w) for w in mnemonic.lower().split("_"))


def title(xid: int) -> str:
    """An Xid's catalogue name in words (`79` -> `GPU has fallen off the bus`), for reports."""
    entry = XIDS.get(xid)
    return _mnemonic_words(entry[0]) if entry else "not in the Xid table"


def _said_words(event: dict[str, Any]) -> str:
    """What the line itself said, in the project's words (never the log's: a log line is data)."""
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return ""
    if detail.get("remap_failure") is True:
        return "row remap failed"
    xid = event["xid"]
    if xid == 154 and _int(detail.get("recovery")) is not None:
        entry = RECOVERY.get(detail["recovery"])
        return entry[0] if entry else f"recovery action {detail['recovery']}"
    if xid in (94, 95):
        if detail.get("rst") is True:
            return "reset required"
        if detail.get("d_rst") is True:
            return "drain P2P and reset required"
        if xid == 94 and detail.get("rst") is False and detail.get("d_rst") is False:
            return "no reset required"
    if 144 <= xid <= 150 and detail.get("unit"):
        return _nvlink5_said(xid, detail)
    if xid == 74 and _int(detail.get("link")) is not None:
        if detail.get("kind") and _int(detail.get("register")) is not None:
            return (
                f"link {detail['link']}, REG{detail['register']} bit {detail.get('bit')}: "
                f"{detail['kind']}"
            )
        return f"link {detail['link']}"
    return ""


def _nvlink5_said(xid: int, detail: dict[str, Any]) -> str:
    """`NETIR_LINK_EVT fatal, link 1, status 0x0, sub-code 0x21: RESET_GPU`: the unit and
    severity as printed (the unit matched [A-Z0-9_]: no untrusted bytes), the catalogue's
    bucket where its decode sheet lists them."""
    status = detail.get("status")
    words = [f"{detail['unit']} {'fatal' if detail.get('fatal') else 'nonfatal'}",
             f"link {detail.get('link')}"]
    if isinstance(status, int):
        words.append(f"status {status:#x}")
    if detail.get("unit") in ("NETIR_LINK_EVT", "NETIR_LINK_DOWN"):
        words.append(f"sub-code {detail.get('subcode', 0):#x}")
    bucket = nvlink5_bucket(xid, detail)
    return ", ".join(words) + (f": {_BUCKETS[bucket][0]}" if bucket else "")


def describe(event: dict[str, Any]) -> str:
    """One event in a Slurm Reason: `GPU 3 (0000:9b:00) Xid 79 GPU has fallen off the bus x4`;
    what the line said of itself follows a comma (`Xid 154 ..., GPU reset required`)."""
    entry = XIDS.get(event["xid"])
    what = _mnemonic_words(entry[0]) if entry else "not in the Xid table"
    if entry and entry[1] == NVLINK5 and not (event.get("detail") or {}).get("unit"):
        what += " fatal" if event["class"] == FAIL else " nonfatal"
    if event.get("again"):
        return _again_words(event, what)
    said = _said_words(event)
    line = f"{where(event)} Xid {event['xid']} {what}" + (f", {said}" if said else "")
    line += f" x{event['repeats']}" if event["repeats"] > 1 else ""
    note = None if said else NOTES.get(event["xid"])
    return f"{line}: {note}" if note else line


def _data(events: list[Any]) -> dict[str, Any]:
    keys = (
        "xid",
        "gpu",
        "bus_id",
        "gpu_instance",
        "pid",
        "name",
        "class",
        "action",
        "repeats",
        "seq",
        "usec",
        "text",
        "detail",
        "job",
        "again",
    )
    listed = [{k: e[k] for k in keys if k in e} for e in events[:EVENTS_MAX]]
    return {"count": len(events), "events": listed}


def hardware(facts: Facts, ctx: Context) -> Result:
    """Hardware Xids since the last run: fail with the worst action; warn-class Xids warn.

    What a line says of itself decides over the table: Xid 154's recovery action, Xid 94/95's
    RST and D-RST, a row-remap failure (service), and Xid 74's one register bit where NVIDIA's
    NVSentinel names it (NVLINK_BITS: service at once or on a repeat)."""
    events = events_for(facts, ctx)
    found = _ordered([e for e in events if e["class"] in (FAIL, WARN)])
    if not found:
        apps = sum(1 for e in events if e["class"] == APP)
        return ok(f"no new hardware Xids ({apps} application)" if apps else "no new Xids")
    message = summarize([describe(e) for e in found])
    failing = [e["action"] for e in found if e["class"] == FAIL]
    if failing:
        return fail(message, _data(found), worst_action(failing))
    return warn(message, _data(found), worst_action([e["action"] for e in found]))


def application(facts: Facts, ctx: Context) -> Result:
    """Application Xids (13, 31, 43, 45, 68, 109 by default): recorded, never drain."""
    found = _ordered([e for e in events_for(facts, ctx) if e["class"] == APP])
    if not found:
        return ok("no application Xids")
    xids = ", ".join(str(x) for x in sorted({e["xid"] for e in found}))
    gpus = ", ".join(dict.fromkeys(where(e) for e in found))
    message = f"{counted(len(found), 'application Xid')} ({xids}) on {gpus}"
    return ok(f"{message}: the job's code, not the node", _data(found))


def log_continuity(facts: Facts, ctx: Context) -> Result:
    """Kernel log read without a gap since the last run (a wrapped ring hides Xids)."""
    data = {k: facts.get(k) for k in ("records", "first_seq", "after_seq", "last_seq", "missed")}
    if facts.get("lost") and facts.get("missed"):
        lost = f"{counted(facts['missed'], 'record')} lost since last run"
        return warn(f"kernel log wrapped: {lost}, Xids may be missed", data)
    if facts.get("lost"):
        return warn("kernel log wrapped while reading: records lost, Xids may be missed", data)
    records = counted(facts.get("records") or 0, "new kernel log record")
    return ok(f"{records}, none lost", data)


CHECKS = (hardware, application, log_continuity, *hca_faults.CHECKS, *driver_faults.CHECKS)
# Judged GPU by GPU in the job hooks (checks/base.py job_verdict): the lines that name a GPU.
SCOPED = (hardware, driver_faults.gpu_init)


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """Where the next run starts: the last sequence number read (or the saved one) and boot.
    (`now` is not kept: the kernel log's sequence numbers order its records.)"""
    seq = facts.get("last_seq")
    return {
        "seq": seq if seq is not None else facts.get("after_seq"),
        "boot_id": facts.get("boot_id"),
    }


EVENT_KEYS = ("xid", "gpu", "bus_id", "pid", "name", "class", "action", "text", "repeats", "seq")


def events_of(facts: Facts, ctx: Context) -> list[Any]:
    """Every Xid event to record, classified under the node's config: {"key": a stable id
    part from the kernel-log record, "job": on the job's GPUs, and EVENT_KEYS}. What the
    config ignores, or what a disabled check would have reported, is not recorded."""
    disabled = {
        name for name, o in ctx.expect.get("checks", {}).items() if o.get("enabled") is False
    }
    reported = set()
    if "xid.hardware" not in disabled:
        reported |= {FAIL, WARN}
    if "xid.application" not in disabled:
        reported.add(APP)
    boot = facts.get("boot_id") or ""
    out = []
    for event in events_for(facts, ctx):
        if event["class"] in reported:
            item = {k: event.get(k) for k in EVENT_KEYS}
            item["key"] = f"{boot}:{event.get('seq')}:{event.get('xid')}"
            item["job"] = event.get("job", True)
            out.append(item)
    return out


def for_gpus(facts: Facts, ctx: Context, keep: Keep) -> Facts:
    """The facts with only the Xids and GPU initialisation failures of the GPUs `keep` takes,
    each GPU by its bus id (ctx.gpus; None where the index is not known)."""
    gpus = _gpu_map(ctx.gpus)
    events = [e for e in facts.get("events") or [] if keep(gpus.get(e["bus_id"]))]
    driver = [e for e in facts.get("driver") or [] if keep(gpus.get(e["bus_id"] or ""))]
    return dict(facts, events=events, driver=driver)
