"""checks/fmlog.py: new Fabric Manager log records since the last health check, judged by the
Fabric Manager's own wording (tests/fixtures/fmlog); the area end to end through `slurmhealth
check` on a host root and a real node store."""

from __future__ import annotations

import json
import os

import pytest
from conftest import FIXTURES, run_cli

from slurmhealth.node.checks import fmlog
from slurmhealth.node.checks.base import Context
from slurmhealth.node.sources import fmlog as source

FIX = os.path.join(FIXTURES, "fmlog")


def data(name: str) -> bytes:
    with open(os.path.join(FIX, name), "rb") as handle:
        return handle.read()


def facts(name: str = "faults.log", inode: int = 7) -> dict:
    raw = data(name)
    return fmlog.parse({"path": "/var/log/fabricmanager.log", "inode": inode, "size": len(raw),
                        "start": 0, "records": source.records(raw, 0)})


def ctx(**baseline) -> Context:
    return Context("hgx01", "healthcheck", {"expected": False}, baseline)


HEALTHY = len(data("healthy.log"))


def test_each_record_is_judged_by_its_wording():
    judged = [(r["status"], r["what"]) for r in facts()["records"]]
    assert judged == [
        # 12028 stalls the port's traffic: it fails as a fatal one does (driver_faults.STALLING)
        ("fail", "non-fatal SXid 12028 on NVSwitch 00000000:86:00.0 physical id 3 port 61"),
        ("fail", "fatal SXid 20034 on NVSwitch 00000000:86:00.0 physical id 3 port 33"),
        ("fail", "GPU NVL fatal error (moduleId 5, gpuGuid 0x1c2d3e4f5a6b7c8d, portNum 12, "
                 "errorCode 0x06, errorSubcode 0x0E)"),
        ("warn", "trunk port failure, switch 0xb0cf0e0300a1b2c3 port 61"),
        ("warn", "a GPU missing from a multicast team (NVLink fabric)"),
        ("warn", "ERROR: request to query NVSwitch device information from NVSwitch driver "
                 "failed with error:generic error [NV_ERR_GENERIC]"),
        ("ok", ""),
    ]


def test_the_first_run_records_a_baseline_and_judges_nothing():
    result = fmlog.events(facts(), ctx())
    assert result.status == "ok"
    assert result.message == ("baseline recorded: 7 records above INFO in "
                              "/var/log/fabricmanager.log, 6 of them warn or fail (not judged)")
    assert fmlog.baseline(facts(), 100.0) == {"inode": 7, "size": len(data("faults.log")),
                                              "taken_at": 100.0}


def test_new_fatal_records_fail_naming_the_first():
    result = fmlog.events(facts(), ctx(inode=7, size=HEALTHY))
    assert (result.status, result.action) == ("fail", "reboot")  # as driver_faults.sxid
    assert result.message == ("Fabric Manager: non-fatal SXid 12028 on NVSwitch 00000000:86:00.0 "
                              "physical id 3 port 61 (Mar 03 2026 02:11:09) (+2 more)")
    assert result.data["new"] == 7 and len(result.data["entries"]) == 3


def test_records_before_the_saved_size_are_not_judged_again():
    raw = data("faults.log")
    after_fatal = raw.index(b"[Mar 03 2026 02:15:30]")
    result = fmlog.events(facts(), ctx(inode=7, size=after_fatal))
    assert result.status == "warn" and result.data["new"] == 4
    nvl_only = raw.index(b"[Mar 03 2026 02:14:52]")
    assert fmlog.events(facts(), ctx(inode=7, size=nvl_only)).action == "drain"
    assert result.message.startswith("Fabric Manager: trunk port failure, switch ")
    assert fmlog.events(facts(), ctx(inode=7, size=len(raw))).message == (
        "0 new records above INFO, none severe")


def test_a_rotated_or_shorter_log_makes_every_record_new():
    rotated = fmlog.events(facts(inode=8), ctx(inode=7, size=HEALTHY))
    assert rotated.status == "fail" and rotated.data["rotated"] is True
    shorter = fmlog.events(facts("healthy.log"), ctx(inode=7, size=HEALTHY + 10))
    assert shorter.message == "0 new records above INFO since the log was rotated, none severe"


def test_bytes_written_past_the_tail_are_said():
    found = dict(facts("healthy.log"), start=5000, size=6000, records=[])
    result = fmlog.events(found, ctx(inode=7, size=1000))
    assert result.status == "ok" and result.data["unread_bytes"] == 4000
    assert result.message.endswith("; 4000 bytes past the last run not read")


def test_a_baseline_of_the_wrong_shape_reads_every_record_as_new():
    assert fmlog.events(facts(), ctx(inode=7, size="12")).data["rotated"] is True
    assert fmlog.events(facts(), ctx(inode=7, size=None)).data["rotated"] is True


@pytest.mark.parametrize("raw", [None, [], {"records": "x"}, {"records": [None, {"line": 5}]},
                                 {"records": [{"offset": -1, "line": "[x] [ERROR] [tid 1] y"}]},
                                 {"inode": True, "size": "9", "records": [{"offset": 0}]}])
def test_parse_and_the_check_never_raise(raw):
    found = fmlog.parse(raw)
    assert found["records"] == []
    assert fmlog.events(found, ctx(inode=None, size=0)).status == "ok"


def test_an_sxid_the_guide_says_has_no_impact_is_counted_not_judged():
    line = ("[Mar 03 2026 02:11:09] [ERROR] [tid 1] detected NVSwitch non-fatal error 24001 on "
            "fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 2")
    found = fmlog.parse({"inode": 1, "size": 999, "records": [{"offset": 0, "line": line}]})
    assert [r["status"] for r in found["records"]] == ["ok"]
    assert fmlog.events(found, ctx(inode=1, size=0)).status == "ok"


def test_untrusted_text_is_cleaned():
    record = {"offset": 0, "line": "[Mar 03 2026 02:21:00] [ERROR] [tid 1] bad\x1b[2J thing",
              "more": []}
    judged = fmlog.parse({"inode": 1, "size": 99, "records": [record]})["records"][0]
    assert "\x1b" not in judged["what"] and judged["status"] == "warn"


def test_the_area_end_to_end_through_check_and_its_store(tmp_path):
    root, store = tmp_path / "host", tmp_path / "store"
    log = root / "var/log/fabricmanager.log"
    log.parent.mkdir(parents=True)
    store.mkdir(mode=0o700)
    log.write_bytes(data("healthy.log"))
    argv = ["check", "--only", "fmlog", "--host-root", str(root), "--record",
            "--db", str(store / "hgx01.db"), "--node", "hgx01", "--json"]
    first = run_cli(*argv)  # the first run reads the log's past and judges none of it
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["results"][0]["message"].startswith("baseline recorded: 0")
    with open(log, "ab") as handle:
        handle.write(data("faults.log")[HEALTHY:])
    second = run_cli(*argv)
    assert second.returncode == 1, second.stderr
    result = json.loads(second.stdout)["results"][0]
    assert (result["status"], result["action"]) == ("fail", "reboot")
    assert "SXid 12028" in result["message"]
    third = run_cli(*argv)  # judged once: the next run reads past it
    assert third.returncode == 0
    assert json.loads(third.stdout)["results"][0]["message"] == (
        "0 new records above INFO, none severe")
