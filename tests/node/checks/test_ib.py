"""checks/ib.py: parse is total, each fault scenario gives its status and action."""

from __future__ import annotations

import copy
import json
import os

import conftest
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.core import result
from slurmhealth.node.checks import ib
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources.sysfs import COUNTERS
from slurmhealth.node.sources.sysfs import read as gather

FIXTURES = os.path.join(conftest.FIXTURES, "sysfs")
EIGHT = [f"mlx5_{i}" for i in range(8)]
EIGHT_PORTS = [f"{d}:1" for d in EIGHT]


def raw_of(scenario: str) -> dict:
    return gather(os.path.join(FIXTURES, scenario))


def facts_of(scenario: str) -> dict:
    return ib.parse(raw_of(scenario))


def run(check, facts: dict, baseline: dict | None = None, **expect) -> result.Result:
    res = check(facts, Context(expect=expect, baseline=baseline))
    assert isinstance(res, result.Result)
    return res


def assert_result(res, status: str, action: str = result.NONE, message: str | None = None):
    assert (res.status, res.action) == (status, action), res
    if message is not None:
        assert res.message == message


# ---------------------------------------------------------------- parse


@pytest.mark.parametrize(
    "text,expected",
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("5: ACTIVE_DEFER", (5, "ACTIVE_DEFER")),
        ("ACTIVE", (4, "ACTIVE")),
        ("  2: INIT  ", (2, "INIT")),
        ("9: <unknown>", (9, "<unknown>")),
        ("garbage", (None, "garbage")),
        ("", (None, None)),
        (None, (None, None)),
        (4, (None, None)),
    ],
)
def test_parse_state(text, expected):
    assert ib.parse_state(text, ib._STATES) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("5: LinkUp", (5, "LinkUp")),
        ("2: Polling", (2, "Polling")),
        ("3: Disabled", (3, "Disabled")),
        ("7: Phy Test", (7, "Phy Test")),
    ],
)
def test_parse_phys_state(text, expected):
    assert ib.parse_state(text, ib._PHYS_STATES) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("400 Gb/sec (4X NDR)", (400.0, "4X", "NDR")),
        ("200 Gb/sec (4X HDR)", (200.0, "4X", "HDR")),
        ("100 Gb/sec (2X HDR)", (100.0, "2X", "HDR")),
        ("2.5 Gb/sec (1X SDR)", (2.5, "1X", "SDR")),
        ("53.125 Gb/sec (1X PAM4)", (53.125, "1X", "PAM4")),
        ("800 Gb/sec (4X XDR)", (800.0, "4X", "XDR")),
        ("10 Gb/sec (4X)", (10.0, "4X", None)),  # old kernels: no name for SDR
        ("400 Gb/sec", (400.0, None, None)),
        ("fast", (None, None, None)),
        ("-400 Gb/sec (4X NDR)", (None, "4X", "NDR")),
        ("1.2.3 Gb/sec (4X NDR)", (None, "4X", "NDR")),
        ("9" * 400 + " Gb/sec (4X NDR)", (None, "4X", "NDR")),
        ("", (None, None, None)),
        (None, (None, None, None)),
    ],
)
def test_parse_rate(text, expected):
    assert ib.parse_rate(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0", 0),
        ("123", 123),
        ("18446744073709551615", 2**64 - 1),
        (" 7 ", 7),
        ("N/A (no PMA)", None),
        (None, None),
        ("", None),
        ("-1", None),
        ("1e3", None),
        ("\u0663", None),  # ARABIC-INDIC DIGIT THREE: int() would take it, sysfs never writes it
        ("1" * 5000, None),  # int() of this raises on 3.11+ (digit limit)
    ],
)
def test_parse_counter(text, expected):
    raw = {"devices": {"mlx5_0": {"ports": {"1": {"counters": {"link_downed": text}}}}}}
    assert ib.parse(raw)["ports"]["mlx5_0:1"]["counters"]["link_downed"] == expected


def test_parse_healthy_fixture():
    facts = facts_of("healthy-8x-ndr")
    assert sorted(facts["devices"]) == EIGHT
    assert sorted(facts["ports"]) == EIGHT_PORTS
    port = facts["ports"]["mlx5_0:1"]
    assert port["device"] == "mlx5_0"
    assert (port["state"], port["state_name"]) == (4, "ACTIVE")
    assert (port["phys_state"], port["phys_name"]) == (5, "LinkUp")
    assert (port["rate"], port["width"], port["speed"]) == (400.0, "4X", "NDR")
    assert port["link_layer"] == "InfiniBand"
    assert port["counters"]["link_downed"] == 1
    assert set(port["counters"]) == set(COUNTERS)
    assert facts["devices"]["mlx5_0"]["fw_ver"] == "28.39.1002"


def test_parse_unreadable_counter_is_none():
    facts = facts_of("counters-na")
    assert set(facts["ports"]["mlx5_1:1"]["counters"].values()) == {None}
    assert facts["ports"]["mlx5_0:1"]["counters"]["symbol_error"] is None
    assert facts["ports"]["mlx5_0:1"]["counters"]["port_rcv_errors"] == 0


@pytest.mark.parametrize("raw", [None, [], "x", 3, {"devices": []}, {"devices": {"a": None}}])
def test_parse_wrong_shapes(raw):
    facts = ib.parse(raw)
    assert set(facts) == {"devices", "ports", "errors"}
    for check in ib.CHECKS:
        run(check, facts)


TEXT = st.one_of(st.none(), st.text(max_size=40))
JUNK = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
PORT = st.fixed_dictionaries(
    {name: TEXT for name in ("state", "phys_state", "rate", "link_layer")},
    optional={"counters": st.dictionaries(st.sampled_from(COUNTERS), TEXT)},
)
DEVICE = st.fixed_dictionaries(
    {name: TEXT for name in ib._IDENTITY},
    optional={"ports": st.dictionaries(st.text(max_size=3), PORT, max_size=3)},
)
RAW = st.fixed_dictionaries(
    {"devices": st.dictionaries(st.text(max_size=8), DEVICE, max_size=4)},
    optional={"errors": st.dictionaries(st.text(), st.text())},
)
BASELINE = st.one_of(JUNK, st.builds(lambda raw: ib.baseline(ib.parse(raw)), RAW))


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(RAW, JUNK), before=BASELINE)
def test_parse_and_checks_never_raise(raw, before):
    """Any text in any file: parse, every check, baseline and expectations still answer."""
    facts = ib.parse(raw)
    before = before if isinstance(before, dict) else {}
    for check in ib.CHECKS:
        res = run(check, facts, baseline=before)
        assert "\n" not in res.message and len(res.message) <= result.MESSAGE_MAX
    genconf = ib.expectations(facts)
    for check in ib.CHECKS:
        run(check, facts, baseline=before, **genconf)
    assert set(ib.baseline(facts)) == {"counters", "taken_at"}


# ---------------------------------------------------------------- contract


def test_module_contract():
    assert (ib.AREA, ib.SOURCE) == ("ib", "ib")
    for key, (default, kind, why) in ib.DEFAULTS.items():
        assert kind in (list, int, float, str, bool), key
        assert default is None or isinstance(default, kind), key
        assert why and "\n" not in why, key
    for name in COUNTERS:
        assert ib.DEFAULTS[f"{name}_warn"][0] <= ib.DEFAULTS[f"{name}_fail"][0]
    for check in ib.CHECKS:
        assert check.__doc__, check.__name__
    assert [c.__name__ for c in ib.CHECKS] == [
        "devices_present",
        "port_state",
        "port_rate",
        "link_layer",
        "firmware",
        "pcie_link",
        "counters",
    ]


# ---------------------------------------------------------------- scenarios


def test_healthy_all_ok_without_expectations():
    facts = facts_of("healthy-8x-ndr")
    for check in ib.CHECKS:
        assert_result(run(check, facts), result.OK)


def test_healthy_all_ok_with_genconf_expectations():
    facts = facts_of("healthy-8x-ndr")
    expect = ib.expectations(facts)
    assert expect == {
        "devices": EIGHT,
        "ports": EIGHT_PORTS,
        "link_layer": "InfiniBand",
        "rate": 400,
        "fw_ver": "28.39.1002",
    }
    before = ib.baseline(facts)
    for check in ib.CHECKS:
        assert_result(run(check, facts, before, **expect), result.OK)
    assert run(ib.port_state, facts, **expect).message == "8 ports ACTIVE/LinkUp"


def test_no_infiniband_skips(tmp_path):
    facts = ib.parse(gather(str(tmp_path)))
    for check in ib.CHECKS:
        assert_result(run(check, facts), result.SKIP)
    assert run(ib.devices_present, facts).message == "no InfiniBand devices"


def test_no_infiniband_but_expected_fails(tmp_path):
    facts = ib.parse(gather(str(tmp_path)))
    res = run(ib.devices_present, facts, devices=["mlx5_0", "mlx5_1"])
    assert_result(res, result.FAIL, result.SERVICE, "mlx5_0 missing (+1 more HCA)")
    res = run(ib.port_state, facts, ports=["mlx5_0:1"])
    assert_result(res, result.FAIL, result.DRAIN, "mlx5_0:1 absent")


def test_missing_hca():
    facts = facts_of("missing-hca")
    res = run(ib.devices_present, facts, devices=EIGHT)
    assert_result(res, result.FAIL, result.SERVICE, "mlx5_7 missing")
    assert res.data["missing"] == ["mlx5_7"]
    res = run(ib.port_state, facts, ports=EIGHT_PORTS)
    assert_result(res, result.FAIL, result.DRAIN, "mlx5_7:1 absent")
    # Nothing expected: seven present HCAs are all there is.
    assert_result(run(ib.devices_present, facts), result.OK, message="7 HCAs present")


def test_port_down_disabled():
    facts = facts_of("port-down")
    res = run(ib.port_state, facts)
    assert_result(res, result.FAIL, result.DRAIN, "mlx5_1:1 state DOWN, phys Disabled")
    assert res.data["mlx5_1:1"] == {"state": "DOWN", "phys_state": "Disabled"}
    # A down port's rate means nothing: port_rate judges only the active one.
    assert_result(run(ib.port_rate, facts, rate=400), result.OK, message="1 port at >= 400 Gb/s")


def test_polling_names_first_and_counts_more():
    res = run(ib.port_state, facts_of("polling"))
    assert_result(
        res, result.FAIL, result.DRAIN, "mlx5_1:1 state DOWN, phys Polling (+1 more port)"
    )


def test_port_state_counts_ports_in_plural():
    facts = facts_of("healthy-8x-ndr")
    for key in ("mlx5_2:1", "mlx5_5:1", "mlx5_6:1"):
        facts["ports"][key]["state"], facts["ports"][key]["state_name"] = 2, "INIT"
    res = run(ib.port_state, facts)
    assert res.message == "mlx5_2:1 state INIT, phys LinkUp (+2 more ports)"


def test_active_but_link_error_recovery_fails():
    facts = facts_of("healthy-8x-ndr")
    facts["ports"]["mlx5_4:1"].update(phys_state=6, phys_name="LinkErrorRecovery")
    res = run(ib.port_state, facts)
    assert_result(res, result.FAIL, result.DRAIN, "mlx5_4:1 state ACTIVE, phys LinkErrorRecovery")


def test_unreadable_state_warns_not_fails():
    raw = raw_of("healthy-8x-ndr")
    raw["devices"]["mlx5_0"]["ports"]["1"]["state"] = None
    res = run(ib.port_state, ib.parse(raw))
    assert_result(res, result.WARN, result.NONE, "mlx5_0:1 state unknown")


def test_rate_below_expected_fails():
    res = run(ib.port_rate, facts_of("rate-200"), rate=400)
    assert_result(res, result.FAIL, result.DRAIN, "mlx5_1:1 at 200 Gb/s (4X HDR), expected 400")
    assert res.data == {"mlx5_0:1": 400.0, "mlx5_1:1": 200.0}


def test_rate_unset_uneven_warns():
    res = run(ib.port_rate, facts_of("rate-200"))
    assert_result(res, result.WARN, result.NONE, "mlx5_1:1 at 200 Gb/s (4X HDR), peers 400")


def test_rate_met_and_exceeded_is_ok():
    facts = facts_of("rate-200")
    assert_result(run(ib.port_rate, facts, rate=200), result.OK)
    assert_result(run(ib.port_rate, facts_of("healthy-8x-ndr"), rate=200), result.OK)


def test_ethernet_port_where_infiniband_expected():
    facts = facts_of("ethernet")
    res = run(ib.link_layer, facts, ports=["mlx5_0:1", "mlx5_1:1"])
    assert_result(
        res, result.FAIL, result.DRAIN, "mlx5_1:1 link layer Ethernet, expected InfiniBand"
    )


def test_ethernet_port_unlisted_is_not_judged():
    facts = facts_of("ethernet")
    assert ib.expected_ports(facts, Context()) == ["mlx5_0:1"]
    assert_result(run(ib.link_layer, facts), result.OK, message="1 port InfiniBand")
    assert_result(run(ib.port_state, facts), result.OK, message="1 port ACTIVE/LinkUp")
    # RoCE cluster: the expected link layer picks the Ethernet port instead.
    assert ib.expected_ports(facts, Context(expect={"link_layer": "Ethernet"})) == ["mlx5_1:1"]


def test_firmware_drift_names_odd_hca():
    res = run(ib.firmware, facts_of("fw-drift"))
    assert_result(res, result.WARN, result.NONE, "mlx5_2 firmware 28.36.1010, others 28.39.1002")


def test_firmware_against_golden():
    facts = facts_of("fw-drift")
    res = run(ib.firmware, facts, fw_ver="28.39.1002")
    assert res.message == "mlx5_2 firmware 28.36.1010, expected 28.39.1002"
    res = run(ib.firmware, facts, fw_ver="28.40.1000")
    assert_result(res, result.WARN)
    assert res.message == "mlx5_0 firmware 28.39.1002, expected 28.40.1000 (+2 more HCAs)"
    assert_result(run(ib.firmware, facts_of("healthy-8x-ndr"), fw_ver="28.39.1002"), result.OK)


def test_firmware_ignores_unjudged_ethernet_nic():
    raw = raw_of("ethernet")
    raw["devices"]["mlx5_1"]["fw_ver"] = "22.41.1000"  # a ConnectX-6 Dx storage NIC
    assert_result(run(ib.firmware, ib.parse(raw)), result.OK)


def with_iwarp(scenario: str, *names: str, fw: str = "1.27.5.0") -> dict:
    """The scenario's raw tree with Chelsio T6 iWARP NICs added (cxgb4: hca_type is the
    driver's name, board_id the PCI vendor.device; Linux drivers/infiniband/hw/cxgb4/provider.c)."""
    raw = raw_of(scenario)
    port = copy.deepcopy(next(iter(raw["devices"]["mlx5_0"]["ports"].values())))
    port.update(link_layer="Ethernet", rate="100 Gb/sec (4X EDR)")
    for name in names:
        raw["devices"][name] = {
            "fw_ver": fw, "hca_type": "cxgb4", "board_id": "1425.6408", "node_guid": None,
            "ports": {"1": copy.deepcopy(port)},
        }
    return raw


def test_firmware_compares_only_hcas_of_one_product():
    """An iWARP NIC listed beside the ConnectX-7 HCAs runs another product's firmware: no
    drift; the healthy node stays ok and says what it compared."""
    raw = with_iwarp("healthy-8x-ndr", "cxgb4_0")
    res = run(ib.firmware, ib.parse(raw), devices=[*EIGHT, "cxgb4_0"])
    assert_result(res, result.OK, result.NONE, (
        "firmware per product: 8 MT4129 HCAs on 28.39.1002, 1 cxgb4 HCA on 1.27.5.0"
    ))
    assert res.data["products"]["cxgb4_0"] == "cxgb4"
    assert res.data["reference"] == "28.39.1002"
    # A RoCE node (Ethernet is the expected layer): the iWARP ports are in scope too.
    roce = with_iwarp("ethernet", "cxgb4_0")
    roce["devices"]["mlx5_0"]["ports"]["1"]["link_layer"] = "Ethernet"
    assert_result(run(ib.firmware, ib.parse(roce), link_layer="Ethernet"), result.OK)


def test_firmware_drift_within_each_product_names_the_product():
    raw = with_iwarp("fw-drift", "cxgb4_0", "cxgb4_1")
    raw["devices"]["cxgb4_1"]["fw_ver"] = "1.26.6.0"
    res = run(ib.firmware, ib.parse(raw), devices=[*EIGHT, "cxgb4_0", "cxgb4_1"])
    assert_result(res, result.WARN, result.NONE, (
        "mlx5_2 (MT4129) firmware 28.36.1010, others 28.39.1002 (+1 more HCA)"
    ))
    assert res.data["fw_ver"]["cxgb4_1"] == "1.26.6.0"


def test_golden_firmware_is_the_main_products():
    """`fw_ver` names the firmware of the HCAs most of the node's are; another product's HCA is
    compared with its own kind, never with the golden value."""
    raw = with_iwarp("healthy-8x-ndr", "cxgb4_0")
    facts = ib.parse(raw)
    res = run(ib.firmware, facts, devices=[*EIGHT, "cxgb4_0"], fw_ver="28.39.1002")
    assert_result(res, result.OK)
    res = run(ib.firmware, facts, devices=[*EIGHT, "cxgb4_0"], fw_ver="28.40.1000")
    assert res.message == (
        "mlx5_0 (MT4129) firmware 28.39.1002, expected 28.40.1000 (+7 more HCAs)"
    )


def test_product_is_hca_type_else_board_id():
    assert ib.product({"hca_type": "MT4129", "board_id": "MT_0000000838"}) == "MT4129"
    assert ib.product({"hca_type": None, "board_id": "1425.6408"}) == "1425.6408"
    assert ib.product({"hca_type": None, "board_id": None}) == ""
    # Two HCAs that say nothing of what they are are compared with each other, as before.
    raw = raw_of("fw-drift")
    for device in raw["devices"].values():
        device["hca_type"] = device["board_id"] = None
    assert_result(run(ib.firmware, ib.parse(raw)), result.WARN)


def test_genconf_takes_the_main_products_firmware():
    raw = with_iwarp("healthy-8x-ndr", "cxgb4_0")
    raw["devices"]["cxgb4_0"]["ports"]["1"]["link_layer"] = "InfiniBand"  # its port in scope
    assert ib.expectations(ib.parse(raw))["fw_ver"] == "28.39.1002"


def test_genconf_on_ethernet_node_lists_only_ib_ports():
    expect = ib.expectations(facts_of("ethernet"))
    assert expect["ports"] == ["mlx5_0:1"]
    assert expect["devices"] == ["mlx5_0", "mlx5_1"]
    assert expect["link_layer"] == "InfiniBand"


def test_genconf_on_roce_only_node():
    raw = raw_of("ethernet")
    raw["devices"]["mlx5_0"]["ports"]["1"]["link_layer"] = "Ethernet"
    expect = ib.expectations(ib.parse(raw))
    assert (expect["link_layer"], expect["ports"]) == ("Ethernet", ["mlx5_0:1", "mlx5_1:1"])


def test_genconf_leaves_out_down_ports_and_mixed_firmware():
    expect = ib.expectations(facts_of("port-down"))
    assert expect["ports"] == ["mlx5_0:1"]
    assert "fw_ver" not in ib.expectations(facts_of("fw-drift"))
    assert ib.expectations(facts_of("rate-200"))["rate"] == 200


def test_genconf_from_healthy_catches_each_fault():
    expect = ib.expectations(facts_of("healthy-8x-ndr"))
    cases = {
        "missing-hca": ib.devices_present,
        "port-down": ib.port_state,
        "polling": ib.port_state,
        "rate-200": ib.port_rate,
        "ethernet": ib.link_layer,
    }
    for scenario, check in cases.items():
        facts = facts_of(scenario)
        mine = dict(expect)
        if scenario != "missing-hca":  # smaller trees: expect only their own HCAs
            mine["devices"] = sorted(facts["devices"])
            mine["ports"] = [f"{d}:1" for d in mine["devices"]]
        assert run(check, facts, **mine).status == result.FAIL, scenario
    assert run(ib.firmware, facts_of("fw-drift"), **expect).status == result.WARN


# ---------------------------------------------------------------- counters


def with_counters(facts: dict, port: str, **values) -> dict:
    out = copy.deepcopy(facts)
    out["ports"][port]["counters"].update(values)
    return out


@pytest.fixture
def healthy():
    return facts_of("healthy-8x-ndr")


def test_counters_first_run_records_baseline(healthy):
    assert_result(run(ib.counters, healthy), result.OK, message="baseline recorded")


def test_counters_no_change_ok(healthy):
    res = run(ib.counters, healthy, ib.baseline(healthy))
    assert_result(res, result.OK, message="no counter errors on 8 ports since last run")


def test_counters_partial_baseline(healthy):
    before = ib.baseline(healthy)
    del before["counters"]["mlx5_7:1"]
    res = run(ib.counters, healthy, before)
    assert res.message == "no counter errors on 7 ports since last run, baseline recorded for 1"
    assert res.data["mlx5_7:1"]["baseline"] is False


@pytest.mark.parametrize(
    "name,delta,status",
    [
        ("link_downed", 1, result.WARN),
        ("link_downed", 2, result.WARN),
        ("link_downed", 3, result.FAIL),
        ("link_error_recovery", 1, result.WARN),
        ("link_error_recovery", 10, result.FAIL),
        ("symbol_error", 9, result.OK),
        ("symbol_error", 10, result.WARN),
        ("symbol_error", 99, result.WARN),
        ("symbol_error", 100, result.FAIL),
        ("port_rcv_errors", 10, result.WARN),
        ("port_rcv_errors", 99, result.WARN),
        ("port_rcv_errors", 100, result.FAIL),
        ("local_link_integrity_errors", 1, result.WARN),
        ("local_link_integrity_errors", 5, result.FAIL),
        ("excessive_buffer_overrun_errors", 1, result.WARN),
        ("excessive_buffer_overrun_errors", 5, result.FAIL),
    ],
)
def test_counter_delta_thresholds(healthy, name, delta, status):
    before = ib.baseline(healthy)
    value = before["counters"]["mlx5_3:1"][name] + delta
    res = run(ib.counters, with_counters(healthy, "mlx5_3:1", **{name: value}), before)
    action = result.DRAIN if status == result.FAIL else result.NONE
    assert_result(res, status, action)
    assert res.data["mlx5_3:1"]["delta"][name] == delta
    if status != result.OK:
        assert res.message.startswith(f"mlx5_3:1 {name} +{delta} (")


def test_counter_message_names_threshold(healthy):
    before = ib.baseline(healthy)
    res = run(ib.counters, with_counters(healthy, "mlx5_1:1", link_downed=4), before)
    assert res.message == "mlx5_1:1 link_downed +3 (fail at 3)"


def test_counter_thresholds_configurable(healthy):
    before = ib.baseline(healthy)
    facts = with_counters(healthy, "mlx5_1:1", link_downed=2)
    assert run(ib.counters, facts, before).status == result.WARN
    assert run(ib.counters, facts, before, link_downed_fail=1).status == result.FAIL
    assert run(ib.counters, facts, before, link_downed_warn=5, link_downed_fail=9).status == "ok"


def test_counter_that_went_down_counts_from_zero_never_a_negative_delta(healthy):
    before = ib.baseline(healthy)
    before["counters"]["mlx5_0:1"]["symbol_error"] = 5000  # before a reboot or perfquery -R
    before["counters"]["mlx5_4:1"]["link_downed"] = 9
    facts = with_counters(healthy, "mlx5_0:1", symbol_error=3)
    facts = with_counters(facts, "mlx5_4:1", link_downed=0)  # cleared, no flap since
    res = run(ib.counters, facts, before)
    assert res.data["mlx5_0:1"]["delta"]["symbol_error"] == 3  # counted since the reset
    assert res.data["mlx5_0:1"]["reset"] == ["symbol_error"]
    assert all(v >= 0 for port in EIGHT_PORTS for v in res.data[port]["delta"].values())
    assert_result(res, result.OK)
    assert res.message == (
        "no counter errors on 8 ports since last run, counter reset, counted from 0 "
        "(mlx5_0:1 symbol_error (+1 more))"
    )
    # The next run measures from the new value.
    later = with_counters(facts, "mlx5_0:1", symbol_error=15)
    res = run(ib.counters, later, ib.baseline(facts))
    assert_result(res, result.WARN, result.NONE, "mlx5_0:1 symbol_error +12 (warn at 10)")


def test_flaps_after_a_perfquery_reset_are_not_hidden(healthy):
    """perfquery -R between the prolog and the epilog cleared link_downed from 7; three flaps
    followed: the epilog judges three flaps, as it would have without the reset."""
    before = stamped(healthy, 0.0)
    before["counters"]["mlx5_2:1"]["link_downed"] = 7
    facts = with_counters(healthy, "mlx5_2:1", link_downed=3)
    res = at(facts, before, 2 * HOUR)
    assert_result(res, result.FAIL, result.DRAIN)
    assert res.message == (
        "mlx5_2:1 link_downed +3 (1.5/h over 2 h, fail at 3 and 0.5/h) since a counter reset"
    )
    assert res.data["mlx5_2:1"]["reset"] == ["link_downed"]
    # One flap after the reset warns; none is quiet (cleared to 0, nothing since).
    one = at(with_counters(healthy, "mlx5_2:1", link_downed=1), before, 2 * HOUR)
    assert_result(one, result.WARN, result.NONE)
    assert one.message.endswith("since a counter reset")
    zero = at(with_counters(healthy, "mlx5_2:1", link_downed=0), before, 2 * HOUR)
    assert_result(zero, result.OK)
    assert zero.data["mlx5_2:1"]["delta"]["link_downed"] == 0


def test_counter_fail_listed_before_warn(healthy):
    before = ib.baseline(healthy)
    facts = with_counters(healthy, "mlx5_0:1", symbol_error=20)
    facts = with_counters(facts, "mlx5_6:1", link_downed=6)  # fixture: 1
    res = run(ib.counters, facts, before)
    assert_result(res, result.FAIL, result.DRAIN, "mlx5_6:1 link_downed +5 (fail at 3) (+1 more)")


@pytest.mark.parametrize(
    "name,top",
    [
        ("link_downed", 255),
        ("link_error_recovery", 255),
        ("local_link_integrity_errors", 15),
        ("excessive_buffer_overrun_errors", 15),
        ("symbol_error", 65535),
        ("port_rcv_errors", 65535),
    ],
)
def test_saturated_counter_warns_even_without_baseline(healthy, name, top):
    facts = with_counters(healthy, "mlx5_2:1", **{name: top})
    res = run(ib.counters, facts)
    assert_result(
        res, result.WARN, result.NONE, f"mlx5_2:1 {name} saturated at {top}, reset counters"
    )
    assert res.data["mlx5_2:1"]["saturated"] == [name]
    # One below the top is just a number.
    assert run(ib.counters, with_counters(healthy, "mlx5_2:1", **{name: top - 1})).status == "ok"


def test_saturated_and_unchanged_still_warns(healthy):
    facts = with_counters(healthy, "mlx5_2:1", link_downed=255)
    res = run(ib.counters, facts, ib.baseline(facts))
    assert_result(res, result.WARN)
    assert "saturated" in res.message


def test_unreadable_counters_are_skipped_not_failed():
    facts = facts_of("counters-na")
    before = {"counters": {"mlx5_0:1": {"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0}}}
    before["counters"]["mlx5_1:1"] = {name: 0 for name in COUNTERS}
    res = run(ib.counters, facts, before)
    assert_result(res, result.OK)
    assert res.data["mlx5_1:1"]["unreadable"] == sorted(COUNTERS)
    assert res.data["mlx5_1:1"]["delta"] == {}
    assert res.data["mlx5_0:1"]["unreadable"] == ["link_downed", "symbol_error"]
    assert res.data["mlx5_0:1"]["delta"] == {"port_rcv_errors": 0}


def test_baseline_keeps_only_readable_counters():
    before = ib.baseline(facts_of("counters-na"))
    assert before["counters"]["mlx5_1:1"] == {}
    assert before["counters"]["mlx5_0:1"] == {
        "link_error_recovery": 0,
        "port_rcv_errors": 0,
        "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0,
    }


def test_corrupt_baseline_is_no_baseline(healthy):
    before = {"counters": {"mlx5_0:1": {"link_downed": "7", "symbol_error": True}, "mlx5_1:1": 3}}
    res = run(ib.counters, healthy, before)
    assert_result(res, result.OK)
    assert res.data["mlx5_0:1"]["delta"] == {}
    assert res.data["mlx5_1:1"]["baseline"] is False


def test_hostile_text_stays_one_bounded_line():
    raw = raw_of("port-down")
    raw["devices"]["mlx5_1"]["ports"]["1"]["phys_state"] = "9: \x1b[31mEVIL\nreboot now" + "x" * 500
    res = run(ib.port_state, ib.parse(raw))
    assert res.status == result.FAIL
    assert "\n" not in res.message and "\x1b" not in res.message
    assert len(res.message) < 80


def test_versions_of_records_firmware_per_hca():
    facts = facts_of("fw-drift")
    found = ib.versions_of(facts)["fw_ver"]
    assert found == {name: dev["fw_ver"] for name, dev in facts["devices"].items()}
    assert len(set(found.values())) == 2
    assert set(ib.versions_of(facts)["product"].values()) == {"MT4129"}
    mixed = ib.versions_of(ib.parse(with_iwarp("fw-drift", "cxgb4_0")))
    assert mixed["product"]["cxgb4_0"] == "cxgb4"
    assert ib.versions_of(ib.parse({})) == {"fw_ver": {}}  # no port: no rate either


# ---------------------------------------------------------------- rates over the interval

HOUR = 3600.0


def stamped(facts: dict, at: float) -> dict:
    return ib.baseline(facts, now=at)


def at(facts: dict, before: dict, now: float, **expect) -> result.Result:
    res = ib.counters(facts, Context(expect=expect, baseline=before, now=now))
    assert isinstance(res, result.Result)
    return res


def test_baseline_keeps_the_time_it_was_read(healthy):
    assert ib.baseline(healthy, now=1234.5)["taken_at"] == 1234.5
    assert isinstance(ib.baseline(healthy)["taken_at"], float)  # the clock: the run's time


def test_rate_defaults_and_their_bounds():
    assert ib.DEFAULTS["symbol_error_warn_per_h"][:2] == (10.0, float)
    assert ib.DEFAULTS["symbol_error_fail_per_h"][:2] == (100.0, float)
    assert ib.DEFAULTS["link_downed_warn_per_h"][:2] == (0.0, float)
    assert ib.DEFAULTS["link_downed_fail_per_h"][:2] == (0.5, float)


@pytest.mark.parametrize(
    "name,delta,hours,status",
    [
        # 100 symbol errors in one hour: 100/h, fails; 1000 in a 20-hour job: 50/h, warns only.
        ("symbol_error", 100, 1.0, result.FAIL),
        ("symbol_error", 1000, 10.0, result.FAIL),
        ("symbol_error", 1000, 20.0, result.WARN),
        # 50 in a week (168 h): 0.3/h, line noise; 50 in an hour: 50/h, warns.
        ("symbol_error", 50, 168.0, result.OK),
        ("symbol_error", 50, 1.0, result.WARN),
        # 3 flaps within 6 hours: 0.5/h, flapping (gpud's 3, Azure's 6 h); over 3 days: warns.
        ("link_downed", 3, 6.0, result.FAIL),
        ("link_downed", 3, 72.0, result.WARN),
        # One flap warns at any rate: it killed the job's in-flight traffic.
        ("link_downed", 1, 720.0, result.WARN),
    ],
)
def test_symbol_errors_and_flaps_are_judged_per_hour(healthy, name, delta, hours, status):
    before = stamped(healthy, 1000.0)
    value = before["counters"]["mlx5_3:1"][name] + delta
    res = at(with_counters(healthy, "mlx5_3:1", **{name: value}), before, 1000.0 + hours * HOUR)
    assert res.status == status, res
    assert res.data["mlx5_3:1"]["delta"][name] == delta
    if status != result.OK:
        assert res.message.startswith(f"mlx5_3:1 {name} +{delta} (")
        assert "/h over" in res.message


# Bits an InfiniBand port carries in an hour at its data rate: NDR 4 x 100 Gb/s, HDR 4 x 50 Gb/s.
NDR_BITS_PER_H = 400e9 * HOUR
HDR_BITS_PER_H = 200e9 * HOUR


def test_symbol_error_defaults_pinned_to_published_anchors():
    """The symbol-error and receive-error defaults and the published figures they rest on.

    On HDR/NDR the port's symbol errors are those left after FEC (NVIDIA ibdiagnet user manual,
    "Bit Error Rate (BER)": symbol errors are the errors the application sees after error
    correction). NVIDIA's field thresholds for that Symbol BER (Mellanox/ufm_sdk_3.0,
    plugins/pdr_deterministic_plugin/build/config/Field_BER_Thresholds.csv): NDR with PLR
    warning 5e-15, error 1e-14; without PLR, 16 nm HDR and EDR error 1e-13. The InfiniBand
    specification's 1e-12 (NVIDIA DGX SuperPOD cabling guide, "Bit Error Rate") is the raw
    line's figure. Counts: ibqueryerrors' shipped thresholds (rdma-core
    infiniband-diags/etc/error_thresholds: SymbolErrorCounter=10, PortRcvErrors=10,
    LinkErrorRecoveryCounter=10) and GCM check-ib's critical above 100.
    """
    defaults = {key: value[0] for key, value in ib.DEFAULTS.items()}
    assert (defaults["symbol_error_warn"], defaults["symbol_error_fail"]) == (10, 100)
    assert (defaults["port_rcv_errors_warn"], defaults["port_rcv_errors_fail"]) == (10, 100)
    assert defaults["link_error_recovery_fail"] == 10
    warn_h, fail_h = defaults["symbol_error_warn_per_h"], defaults["symbol_error_fail_per_h"]
    assert (warn_h, fail_h) == (10.0, 100.0)
    # The warn rate is a post-FEC BER between NVIDIA's NDR warning and error levels.
    assert 5e-15 < warn_h / NDR_BITS_PER_H < 1e-14
    # The fail rate lies between NVIDIA's error levels with and without PLR at NDR, and at HDR
    # just above the 1e-13 of HDR on 16 nm parts; all of it below the specification's 1e-12.
    assert 1e-14 < fail_h / NDR_BITS_PER_H < 1e-13
    assert 1e-13 < fail_h / HDR_BITS_PER_H < 1e-12
    # The former 1000/h was 69x NVIDIA's NDR error level: a link UFM would already isolate.
    assert 1000.0 / NDR_BITS_PER_H / 1e-14 > 50


def test_a_short_interval_does_not_turn_one_error_into_a_failure(healthy):
    """Two runs 1 s apart: 1 symbol error is 3600/h, but the count (10) is the minimum."""
    before = stamped(healthy, 1000.0)
    one = with_counters(healthy, "mlx5_3:1", symbol_error=3)  # fixture: 2
    assert at(one, before, 1001.0).status == result.OK
    # Two flaps in a second: a warn (any flap), not the fail that 7200/h would give alone.
    two = with_counters(healthy, "mlx5_3:1", link_downed=3)  # fixture: 1
    assert at(two, before, 1001.0).status == result.WARN


def test_rate_message_names_rate_and_thresholds(healthy):
    before = stamped(healthy, 0.0)
    facts = with_counters(healthy, "mlx5_1:1", link_downed=4)  # fixture: 1, so +3
    res = at(facts, before, 2 * HOUR)
    assert res.message == "mlx5_1:1 link_downed +3 (1.5/h over 2 h, fail at 3 and 0.5/h)"


def test_rate_thresholds_configurable(healthy):
    before = stamped(healthy, 0.0)
    facts = with_counters(healthy, "mlx5_1:1", symbol_error=100)  # fixture: 0
    assert at(facts, before, 10 * HOUR).status == result.WARN  # 10/h
    assert at(facts, before, 10 * HOUR, symbol_error_warn_per_h=20.0).status == result.OK


def test_unknown_interval_judges_counts_as_before(healthy):
    """A baseline saved without its time, or a clock that went backwards: counts alone."""
    before = ib.baseline(healthy)
    del before["taken_at"]
    facts = with_counters(healthy, "mlx5_3:1", symbol_error=1002)  # fixture: 2, so +1000
    assert at(facts, before, 10 * HOUR).status == result.FAIL
    backwards = stamped(healthy, 5 * HOUR)
    assert at(facts, backwards, 4 * HOUR).status == result.FAIL
    assert ib.interval(Context(baseline={"taken_at": True}, now=5.0)) is None
    assert ib.interval(Context(baseline={"taken_at": 2.0}, now=5.0)) == 3.0


# ---------------------------------------------------------------- the HCAs' PCIe link


@pytest.mark.parametrize(
    "text,gen",
    [
        ("32.0 GT/s PCIe", 5),  # pci_speed_string(), kernels since 5.x
        ("16.0 GT/s PCIe", 4),
        ("8.0 GT/s PCIe", 3),
        ("5.0 GT/s PCIe", 2),
        ("2.5 GT/s PCIe", 1),
        ("64.0 GT/s PCIe", 6),
        ("32 GT/s", 5),  # older kernels' current_link_speed_show()
        ("8 GT/s", 3),
        ("Unknown", None),
        ("Unknown speed", None),
        ("33.0 GT/s PCIe", None),
        ("", None),
        (None, None),
        (16, None),
    ],
)
def test_parse_link_speed(text, gen):
    assert ib.parse_link_speed(text) == gen


def test_full_links_are_ok_and_genconf_keeps_them():
    facts = facts_of("pcie-gen5-x16")
    assert facts["devices"]["mlx5_0"]["link"] == {
        "pci": True,
        "gen": 5,
        "width": 16,
        "max_gen": 5,
        "max_width": 16,
    }
    assert_result(run(ib.pcie_link, facts), result.OK, message="8 HCAs at full PCIe link")
    expect = ib.expectations(facts)
    assert (expect["pcie_gen"], expect["pcie_width"]) == (5, 16)
    for check in ib.CHECKS:
        assert_result(run(check, facts, ib.baseline(facts), **expect), result.OK)


def test_a_downtrained_hca_link_warns_naming_it():
    facts = facts_of("pcie-hca-downtrained")
    res = run(ib.pcie_link, facts)
    assert_result(
        res,
        result.WARN,
        message="mlx5_3 PCIe link Gen5 x8, expected Gen5 x16 (+1 more HCA)",
    )
    assert res.data["mlx5_6"] == "Gen4 x16"
    for check in ib.CHECKS:  # nothing else notices
        if check is not ib.pcie_link:
            assert_result(run(check, facts), result.OK)


def test_the_snapshot_fault_gives_the_same_warning():
    with open(conftest.snapshot_path("hca-pcie-downtrained")) as handle:
        facts = ib.parse(json.load(handle)["ib"])
    assert (
        run(ib.pcie_link, facts).message
        == run(ib.pcie_link, facts_of("pcie-hca-downtrained")).message
    )


def test_hcas_all_below_their_max_are_a_slot_not_a_fault():
    """Gen5 HCAs in a Gen4 server: every link at 16 GT/s is what the slots give."""
    raw = raw_of("pcie-gen5-x16")
    for device in raw["devices"].values():
        device["current_link_speed"] = "16.0 GT/s PCIe"
    facts = ib.parse(raw)
    assert_result(run(ib.pcie_link, facts), result.OK)
    assert_result(run(ib.pcie_link, facts, pcie_gen=5), result.WARN)
    assert run(ib.pcie_link, facts, pcie_gen=4, pcie_width=16).status == result.OK


def test_no_link_in_sysfs_is_not_judged_and_unreadable_skips():
    assert_result(run(ib.pcie_link, facts_of("healthy-8x-ndr")), result.OK)
    raw = raw_of("pcie-gen5-x16")
    for device in raw["devices"].values():
        device["current_link_speed"] = device["current_link_width"] = None
    assert_result(run(ib.pcie_link, ib.parse(raw)), result.SKIP)
    raw["devices"]["mlx5_0"]["current_link_width"] = "0"  # not trained: unknown, not x0
    assert_result(run(ib.pcie_link, ib.parse(raw)), result.SKIP)
    assert_result(run(ib.pcie_link, ib.parse({"devices": {}})), result.SKIP)


def test_only_hcas_in_scope_are_judged():
    raw = raw_of("pcie-hca-downtrained")
    res = run(ib.pcie_link, ib.parse(raw), ports=["mlx5_0:1", "mlx5_1:1"])
    assert_result(res, result.OK, message="2 HCAs at full PCIe link")
