"""checks/net.py: listed links up, MTUs, carrier_changes between runs as flaps."""

from __future__ import annotations

from slurmhealth.node.checks import net
from slurmhealth.node.checks.base import Context

BOOT = "3b1f6c0e-5c1d-4f6a-9d7e-1f2e3d4c5b6a"


def link(operstate="up", carrier="1", changes="2", kind="1", mtu="9000", device=True):
    return {"operstate": operstate, "carrier": carrier, "carrier_changes": changes,
            "type": kind, "mtu": mtu, "speed": "100000" if carrier == "1" else None,
            "device": device}


def facts(**links):
    return net.parse({"boot_id": BOOT, "net": links})


HOST = facts(eth0=link(), ib0=link(kind="32", mtu="4092"), eth1=link("down", None, "0"),
             lo=link("unknown", "1", "0", "772", "65536", False),
             docker0=link("down", "0", "0", device=False), veth1a2b=link(device=True))


def test_virtual_links_are_not_physical():
    physical = sorted(n for n, x in HOST["links"].items() if x["physical"])
    assert physical == ["eth0", "eth1", "ib0"]


def test_nothing_required_up_without_config():
    assert net.link_up(HOST, Context()).message == "no interfaces expected up: not judged"
    assert net.mtu(HOST, Context()).status == "ok"


def test_listed_links_up_or_fail():
    assert net.link_up(HOST, Context(expect={"up": ["eth0", "ib0"]})).status == "ok"
    result = net.link_up(HOST, Context(expect={"up": ["eth0", "eth1", "ib1"]}))
    assert result.status == "fail" and result.action == "drain"
    assert result.message == "eth1 down, no carrier (+1 more interface)"
    assert result.data["ib1"] is None


def test_mtu():
    assert net.mtu(HOST, Context(expect={"mtu": {"ib0": 4092, "eth0": 9000}})).status == "ok"
    result = net.mtu(HOST, Context(expect={"mtu": {"ib0": 2044}}))
    assert result.status == "fail" and result.message == "ib0 MTU 4092, expected 2044"


def judged(now, before, seconds=3600.0, **expect):
    base = net.baseline(before, 1000.0)
    limits = {"flaps_warn": 0.0, "flaps_fail": 0.5, **expect}
    return net.flaps(now, Context(expect=limits, baseline=base, now=1000.0 + seconds))


def test_first_run_records_a_baseline():
    assert net.flaps(HOST, Context()).message == "baseline recorded"


def test_one_flap_warns_three_in_six_hours_fail():
    one = facts(eth0=link(changes="4"))
    result = judged(one, facts(eth0=link()))
    assert result.status == "warn" and result.message.startswith("eth0 1 flap (1/h")
    three = facts(eth0=link(changes="8"))
    result = judged(three, facts(eth0=link()), seconds=6 * 3600.0)
    assert result.status == "fail" and result.action == "drain"
    slow = judged(three, facts(eth0=link()), seconds=7 * 3600.0)
    assert slow.status == "warn"  # 3 flaps in 7 h: under 0.5/h


def test_a_single_transition_is_no_flap():
    assert judged(facts(eth0=link(changes="3")), facts(eth0=link())).status == "ok"


def test_reset_and_reboot_start_a_new_baseline():
    lower = judged(facts(eth0=link(changes="0")), facts(eth0=link(changes="40")))
    assert lower.status == "ok" and lower.message == "baseline recorded"
    rebooted = net.parse({"boot_id": "other", "net": {"eth0": link(changes="40")}})
    assert judged(rebooted, facts(eth0=link())).message == "baseline recorded"


def test_virtual_links_never_judged_for_flaps_unless_listed():
    now = facts(docker0=link(changes="40", device=False))
    before = facts(docker0=link(changes="0", device=False))
    assert judged(now, before).message == "no physical interfaces: not judged"
    assert judged(now, before, up=["docker0"]).status == "fail"


def test_genconf_writes_physical_links_up_and_their_mtus():
    assert net.expectations(HOST) == {"up": ["eth0", "ib0"], "mtu": {"eth0": 9000, "ib0": 4092}}


def test_parse_is_total():
    assert net.parse(None) == {"links": {}, "boot_id": None}
    odd = net.parse({"net": {"x": {"carrier": "a", "mtu": ["1"], "device": "yes"}, "y": 3}})
    assert odd["links"]["x"]["mtu"] is None and not odd["links"]["x"]["physical"]
