"""bench/validate_predictive.py and bench/fleet_records.py: what the predictive validation of
docs/lemons.md rests on. A record's signals are what a fleet store holding the record gives
(the sweep is `slurmhealth lemons --now T`), and LANL's record format reads as documented."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone

import pytest
from conftest import FIXTURES, REPO

sys.path.insert(0, os.path.join(REPO, "bench"))

import fleet_records  # noqa: E402
import validate_predictive  # noqa: E402

LANL = os.path.join(FIXTURES, "lanl", "failures.csv")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["availability", "repairs", "bad-batch", "incidents"])
def test_a_records_sweeps_equal_those_over_a_fleet_store_holding_it(model):
    """Every weekly sweep of the record finds the same lemons as lemons.sweep over a store
    the record was written into: days in service, faults and their next passing runs, causes
    as scopes, a replaced GPU's reset (repairs), racks and switches as the store's places
    (incidents: faults on most of a rack or switch within minutes are one incident)."""
    record = fleet_records.MODELS[model][1](1)
    over_store = validate_predictive.store_sweeps(record)
    in_memory = validate_predictive.record_sweeps(fleet_records.MODELS[model][1](1))
    assert over_store == in_memory
    assert sum(map(len, over_store.values())) >= 10  # lemons were found, and agreed on


def test_service_days_and_time_leave_out_repairs_and_out_spans():
    day = validate_predictive.DAY
    down = [(0.5 * day, 2.5 * day), (4 * day, 10 * day)]
    assert validate_predictive.service_days(down, 0, 7 * day) == {0, 2, 3}
    assert validate_predictive.service_time(down, 0, 7 * day) == pytest.approx(2.0)


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def test_the_lanl_format_reads_into_a_record():
    record = fleet_records.load_lanl(LANL, "90")
    fleet_records.check(record)
    assert sorted(record["nodes"]) == ["n0", "n1", "n2", "n3"]  # n3 never failed: added
    assert record["nodes"]["n2"]["class"] == "fe"
    mine = [f for f in record["faults"] if f["node"] == "n0"]
    # Mountain time: 10:00 MST is 17:00 UTC; the overlapping software failure is merged
    assert [f["start"] for f in mine] == [utc("2004-01-10T17:00"), utc("2004-01-20T15:00")]
    assert mine[1]["end"] == utc("2004-01-20T16:00")
    assert mine[0]["cause"] == "Hardware: Memory Dimm"
    summer = next(f for f in record["faults"] if f["node"] == "n1")
    assert summer["start"] == utc("2004-07-04T18:00")  # MDT, UTC-6
    only = fleet_records.load_lanl(LANL, "90", ("Hardware",))
    assert {f["node"] for f in only["faults"]} == {"n0"}
