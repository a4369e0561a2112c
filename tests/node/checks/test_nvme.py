"""NVMe checks on facts in the source's shape (sources/nvme.py): sysfs strings and nvme-cli
smart-logs (tests/fixtures/nvme), judged as the NVMe base specification's SMART / Health log
fields say (checks/nvme.py)."""

from __future__ import annotations

import json
import os

from conftest import FIXTURES
from hypothesis import given
from hypothesis import strategies as st

from slurmhealth.node.checks import nvme
from slurmhealth.node.checks.base import Context


def smart(name: str, **changes) -> dict:
    with open(os.path.join(FIXTURES, "nvme", f"smart-log-{name}.json")) as handle:
        return dict(json.load(handle), **changes)


def raw(*logs, tool="/usr/sbin/nvme", state="live", temp="41850") -> dict:
    controllers = {}
    for n, log in enumerate(logs):
        controllers[f"nvme{n}"] = {
            "state": state, "model": "SAMPLE NVMe 3.84TB   ", "serial": f"SER{n}",
            "firmware_rev": "GDC7302Q",
            "hwmon": {"temp1_input": temp, "temp1_max": "84850", "temp1_crit": "89850",
                      "temp1_alarm": "0"},
            "smart": log, "smart_error": None if log else "exit 1",
        }
    return {"controllers": controllers, "tool": tool}


def judge(check, data, expect=None, baseline=None):
    ctx = Context(phase="healthcheck", expect=expect or {}, baseline=baseline or {})
    return check(nvme.parse(data), ctx)


def test_a_healthy_drive_passes_every_check():
    facts = raw(smart("healthy"), smart("healthy"))
    results = [judge(check, facts) for check in nvme.CHECKS]
    assert [r.status for r in results] == ["ok"] * len(nvme.CHECKS)
    assert results[4].message == "NVMe at most 41.85 C"


def test_no_controllers_skip_unless_a_count_is_expected():
    empty = {"controllers": {}, "tool": None}
    assert {judge(c, empty).status for c in nvme.CHECKS} == {"skip"}
    missing = judge(nvme.present, raw(smart("healthy")), {"count": 2})
    assert (missing.status, missing.action) == ("fail", "service")
    assert missing.message == "1 NVMe controller, expected 2"


def test_critical_warning_bits_read_only_and_spare_fail_for_service():
    result = judge(nvme.critical_warning, raw(smart("worn-readonly")))
    assert (result.status, result.action) == ("fail", "service")
    assert result.message == "NVMe nvme0 available spare below threshold (+1 more)"
    hot = judge(nvme.critical_warning, raw(smart("healthy", critical_warning=2)))
    assert (hot.status, hot.message) == ("warn", "NVMe nvme0 temperature warning")
    verbose = smart("healthy", critical_warning={"value": 4, "reliability_degraded": 1})
    assert judge(nvme.critical_warning, raw(verbose)).message == "NVMe nvme0 reliability degraded"


def test_wear_warns_and_spare_below_its_threshold_fails():
    worn = judge(nvme.endurance, raw(smart("healthy", percent_used=85)))
    assert worn.status == "warn"
    assert worn.message == "NVMe nvme0 85% of its rated endurance used (warn at 80%)"
    assert judge(nvme.endurance, raw(smart("healthy", percent_used=85)),
                 {"wear_warn_pct": 90}).status == "ok"
    assert judge(nvme.endurance, raw(smart("worn-readonly"))).status == "fail"


def test_temperature_against_the_drives_own_thresholds_or_the_setting():
    assert judge(nvme.temperature, raw(smart("healthy"), temp="86000")).status == "warn"
    crit = judge(nvme.temperature, raw(smart("healthy"), temp="90000"))
    assert (crit.status, crit.message) == ("fail", "NVMe nvme0 90 C, at its critical 89.85 C")
    assert judge(nvme.temperature, raw(smart("healthy")), {"temp_warn_c": 40}).status == "warn"
    no_hwmon = raw(smart("healthy"))
    no_hwmon["controllers"]["nvme0"]["hwmon"] = None
    assert judge(nvme.temperature, no_hwmon).message == "NVMe at most 41 C"  # 314 K


def test_media_errors_rising_fail_and_error_log_entries_warn():
    first = nvme.parse(raw(smart("healthy")))
    before = nvme.baseline(first, 100.0)
    assert before["counters"] == {"SER0": {"media_errors": 0, "num_err_log_entries": 12}}
    assert judge(nvme.errors, raw(smart("healthy"))).message == "baseline recorded"
    assert judge(nvme.errors, raw(smart("healthy")), baseline=before).status == "ok"
    logged = judge(nvme.errors, raw(smart("healthy", num_err_log_entries=15)), baseline=before)
    assert (logged.status, logged.message) == ("warn", "NVMe nvme0 +3 error log entries")
    lost = judge(nvme.errors, raw(smart("healthy", media_errors=2)), baseline=before)
    assert (lost.status, lost.action) == ("fail", "service")
    assert lost.message == "NVMe nvme0 +2 media errors (data lost)"


def test_without_nvme_cli_the_smart_checks_skip_and_say_so():
    result = judge(nvme.critical_warning, raw(None, tool=None))
    assert (result.status, result.message) == (
        "skip", "nvme-cli not installed: SMART log not read (sysfs only)")
    assert judge(nvme.state, raw(None, tool=None)).status == "ok"


def test_controller_states():
    assert judge(nvme.state, raw(smart("healthy"), state="resetting")).status == "warn"
    dead = judge(nvme.state, raw(smart("healthy"), state="dead"))
    assert (dead.status, dead.message) == ("fail", "NVMe nvme0 dead")


def test_genconf_expects_the_controllers_seen():
    assert nvme.expectations(nvme.parse(raw(smart("healthy"), None))) == {"count": 2}
    assert nvme.versions_of(nvme.parse(raw(smart("healthy")))) == {"nvme_fw": {"nvme0": "GDC7302Q"}}


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20))
def test_parse_and_checks_never_raise(data):
    facts = nvme.parse({"controllers": {"nvme0": data}, "tool": "/x"})
    for check in nvme.CHECKS:
        check(facts, Context())
