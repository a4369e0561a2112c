"""checks/edac.py: uncorrected memory errors fail, corrected ones warn past a rate."""

from __future__ import annotations

from slurmhealth.node.checks import edac
from slurmhealth.node.checks.base import Context

BOOT = "3b1f6c0e-5c1d-4f6a-9d7e-1f2e3d4c5b6a"
LABEL = "CPU_SrcID#0_MC#0_Chan#1_DIMM#0"


def facts(ce="0", ue="0", boot=BOOT, dimm_ce="0", dimm_ue="0"):
    mc = {"ce_count": ce, "ue_count": ue, "ce_noinfo_count": "0", "ue_noinfo_count": "0",
          "dimms": {"dimm1": {"ce_count": dimm_ce, "ue_count": dimm_ue, "label": LABEL}}}
    return edac.parse({"boot_id": boot, "edac": {"mc0": mc}})


def judge(check, now, before=None, hours=1.0, **expect):
    base = edac.baseline(before, 1000.0) if before else {}
    return check(now, Context(expect=expect, baseline=base, now=1000.0 + hours * 3600))


def test_no_edac_tree_is_not_judged_unless_expected():
    none = edac.parse({"edac": None})
    assert judge(edac.uncorrected, none).message == "no EDAC memory controllers: not judged"
    assert judge(edac.corrected, none).status == "ok"
    result = judge(edac.uncorrected, none, expected=True)
    assert result.status == "fail" and result.action == "service"


def test_a_new_uncorrected_error_fails_naming_the_dimm():
    result = judge(edac.uncorrected, facts(ue="1", dimm_ue="1"), facts())
    assert result.status == "fail" and result.action == "service"
    assert result.message == f"mc0 ({LABEL}): 1 new uncorrected memory error"


def test_counts_since_another_boot_are_all_new():
    result = judge(edac.uncorrected, facts(ue="2"), facts(ue="5", boot="before"))
    assert result.status == "fail" and result.data["mc0"] == {"new": 2}


def test_a_reset_counter_is_a_new_baseline():
    assert judge(edac.uncorrected, facts(ue="0"), facts(ue="3")).status == "ok"


def test_first_run_warns_of_uncorrected_errors_of_unknown_age():
    result = judge(edac.uncorrected, facts(ue="1"))
    assert result.status == "warn" and "before the first baseline" in result.message
    assert judge(edac.corrected, facts(ce="500")).message == "baseline recorded"


def test_corrected_rate_per_day_at_least_a_day():
    assert judge(edac.corrected, facts(ce="9"), facts()).status == "ok"  # 9 in 1 h: < 10
    result = judge(edac.corrected, facts(ce="10", dimm_ce="10"), facts())
    assert result.status == "warn" and result.message.startswith(f"mc0 ({LABEL}): 10 corrected")
    week = judge(edac.corrected, facts(ce="60"), facts(), hours=7 * 24)
    assert week.status == "ok"  # 60 in a week: 8.6/day
    assert judge(edac.corrected, facts(ce="60"), facts(), hours=7 * 24,
                 ce_warn_per_day=5.0).status == "warn"


def test_genconf_expects_the_tree_it_saw():
    assert edac.expectations(facts()) == {"expected": True}
    assert edac.expectations(edac.parse({})) == {}
