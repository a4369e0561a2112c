"""node/diag/parsers.py: each tool's real output format gives its outcomes; no input raises."""

from __future__ import annotations

import json
import os

import conftest
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.node.diag import parsers

FIXTURES = os.path.join(conftest.FIXTURES, "diag")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return handle.read()


def by_unit(found: list) -> dict:
    return {o["unit"]: o for o in found}


def assert_outcome(o: dict) -> None:
    """The contract every outcome keeps, whatever the input."""
    assert set(o) == {"unit", "status", "figures", "evidence"}
    assert o["status"] in ("pass", "fail", "skip")
    assert isinstance(o["unit"], str) and o["unit"]
    assert all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in o["figures"].values()
    )
    assert isinstance(o["evidence"], str) and "\n" not in o["evidence"]
    assert 0 < len(o["evidence"]) <= parsers.EVIDENCE_MAX


# --- dcgmi diag -j ------------------------------------------------------------------------------


def test_dcgm_4x_pass_is_one_pass_per_gpu():
    found = parsers.dcgm_diag(fixture("dcgmi-4.x-r3-pass.json"))
    assert [o["unit"] for o in found] == [f"gpu{i}" for i in range(8)]
    assert {o["status"] for o in found} == {"pass"}
    assert found[0]["figures"] == {"passed": 7, "failed": 0, "skipped": 0}
    assert found[0]["evidence"].startswith("7 passed: software, memory, diagnostic")


def test_dcgm_4x_failure_names_the_gpu_the_test_and_dcgms_words():
    found = by_unit(parsers.dcgm_diag(fixture("dcgmi-4.x-r3-fail.json")))
    assert found["gpu3"]["status"] == "fail"
    assert found["gpu3"]["evidence"] == (
        "memory: Detected 2 volatile double-bit ECC error(s) in GPU 3. "
        "Drain the GPU and reset it or reboot the node."
    )
    assert all(found[f"gpu{i}"]["status"] == "pass" for i in range(8) if i != 3)
    assert "node" not in found, "the summary repeats GPU 3's error: no node-level outcome"


def test_dcgm_33_failure_and_deployment_as_node():
    found = by_unit(parsers.dcgm_diag(fixture("dcgmi-3.3-r2-fail.json")))
    assert set(found) == {"gpu0", "gpu1", "node"}
    assert found["gpu0"]["status"] == "fail"
    assert found["gpu0"]["evidence"].startswith(
        "GPU Memory (+1 more failed): GPU 0 Error using CUDA API cuCtxCreate"
    )
    assert found["gpu0"]["figures"] == {"passed": 1, "failed": 2, "skipped": 0}
    assert found["gpu1"]["status"] == "pass"
    assert found["node"]["status"] == "pass"
    assert found["node"]["figures"]["passed"] == 9


def test_dcgm_33_everything_skipped_is_skip():
    found = by_unit(parsers.dcgm_diag(fixture("dcgmi-3.3-r3-skip.json")))
    assert found["gpu0"]["status"] == "skip"
    assert found["gpu0"]["evidence"] == "all 7 tests skipped"
    assert found["node"]["status"] == "pass"


def test_dcgm_31_deployment_failure_is_node_level():
    """Before 3.3 a Deployment result names no GPU: persistence mode off is the node's."""
    found = parsers.dcgm_diag(fixture("dcgmi-3.1-r1-persistence.json"))
    assert [o["unit"] for o in found] == ["node"]
    assert found[0]["status"] == "fail"
    assert found[0]["evidence"].startswith(
        "Persistence Mode: Persistence mode for GPU 0 is currently disabled."
    )


def test_dcgm_runtime_error_fails_the_node():
    found = parsers.dcgm_diag(fixture("dcgmi-4.x-runtime-error.json"))
    assert found == [
        {
            "unit": "node",
            "status": "fail",
            "figures": {"passed": 0, "failed": 1, "skipped": 0},
            "evidence": "runtime error: Error: Diagnostic can only be performed on a "
            "homogeneous group of GPUs.",
        }
    ]


def doc_4x(results: list, summary: dict | None = None) -> str:
    test = {"name": "pcie", "results": results}
    if summary is not None:
        test["test_summary"] = summary
    return json.dumps({"DCGM Diagnostic": {"test_categories": [{"tests": [test]}]}})


def test_dcgm_4x_summary_failure_without_a_failed_entity_is_the_nodes():
    text = doc_4x(
        [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}],
        {"status": "Fail", "warnings": [{"warning": "IMEX daemon status is -3 (not READY)"}]},
    )
    found = by_unit(parsers.dcgm_diag(text))
    assert found["gpu0"]["status"] == "pass"
    assert found["node"]["status"] == "fail"
    assert found["node"]["evidence"] == "pcie: IMEX daemon status is -3 (not READY)"


def test_dcgm_4x_other_entities_are_node_level_and_named():
    text = doc_4x([{"entity_group": "CPU", "entity_id": 1, "status": "Fail"}])
    assert parsers.dcgm_diag(text)[0]["evidence"] == "pcie (CPU1) failed"


def test_dcgm_33_deployment_result_names_the_gpu_of_its_error():
    """3.3 writes the error's GPU as an integer, and its warning objects say "warnings"."""
    result = {"gpu_id": 2, "status": "Fail", "warnings": [{"error_id": 29, "warnings": "PM off"}]}
    test = {"name": "Persistence Mode", "results": [result]}
    text = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{"tests": [test]}]}})
    assert parsers.dcgm_diag(text) == [
        {
            "unit": "gpu2",
            "status": "fail",
            "figures": {"passed": 0, "failed": 1, "skipped": 0},
            "evidence": "Persistence Mode: PM off",
        }
    ]


@pytest.mark.parametrize("gpu", ["²", "٣", "-1", "99999", "0x1", True, 1.5, None, [0], {"a": 0}])
def test_dcgm_odd_gpu_ids_are_the_node(gpu):
    """Untrusted ids: only 0-9999 (a number, or ASCII digits) names a GPU."""
    test = {"name": "PCIe", "results": [{"gpu_id": gpu, "status": "Fail"}]}
    text = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{"tests": [test]}]}})
    [found] = parsers.dcgm_diag(text)
    assert (found["unit"], found["status"]) == ("node", "fail")


@pytest.mark.parametrize(
    ("status", "expected"),
    [("Pass", "pass"), ("Skip", "skip"), ("Not Run", "skip"), ("Warn", "fail"), ("Fail", "fail")],
)
def test_dcgm_status_words(status, expected):
    text = doc_4x([{"entity_group": "GPU", "entity_id": 0, "status": status}])
    assert parsers.dcgm_diag(text)[0]["status"] == expected


def test_dcgm_unknown_status_is_not_a_pass():
    text = doc_4x([{"entity_group": "GPU", "entity_id": 0, "status": "Inconclusive"}])
    found = parsers.dcgm_diag(text)[0]
    assert found["status"] == "fail"
    assert "'Inconclusive' not understood" in found["evidence"]


def test_dcgm_iterations_are_merged():
    one = json.loads(doc_4x([{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]))
    two = json.loads(doc_4x([{"entity_group": "GPU", "entity_id": 0, "status": "Fail"}]))
    text = json.dumps({"iterations": [one, two], "Overall Result": "Fail", "warning": "boom"})
    found = by_unit(parsers.dcgm_diag(text))
    assert found["gpu0"]["status"] == "fail"
    assert found["node"]["evidence"] == "iterations: boom"


def test_dcgm_text_around_the_document_is_ignored():
    text = "Successfully ran diagnostic for group.\n" + fixture("dcgmi-4.x-r3-pass.json") + "\n}"
    assert len(parsers.dcgm_diag(text)) == 8


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no JSON document"),
        ("Error: unable to establish a connection to the specified host: localhost", "no JSON"),
        ('{"DCGM Diagnostic": {"test_categories": []}}', "no test results"),
        ('{"something": "else"}', "no test results"),
        ("[" * 100000, "no JSON document"),
        ('{"a": ' * 100000, "no JSON document"),
    ],
)
def test_dcgm_unreadable(text, why):
    found = parsers.dcgm_diag(text)
    assert len(found) == 1 and found[0]["unit"] == "node" and found[0]["status"] == "fail"
    assert found[0]["evidence"].startswith(f"unreadable dcgmi diag output: {why}")


# --- all_reduce_perf ----------------------------------------------------------------------------


def test_all_reduce_healthy_h100_passes_its_floor():
    floor = parsers.allreduce_floor("NVIDIA H100 80GB HBM3")
    [found] = parsers.all_reduce(fixture("all_reduce_perf-2.15-h100.txt"), floor)
    assert found["status"] == "pass"
    assert found["figures"] == {
        "busbw_gbps": 476.84,
        "max_bytes": 8 << 30,
        "avg_busbw_gbps": 179.432,
        "wrong": 0,
    }
    assert (
        found["evidence"]
        == "busbw 476.84 GB/s at 8 GiB >= floor 460 GB/s (avg 179.432 GB/s, 0 wrong)"
    )


def test_all_reduce_wrong_elements_fail_even_without_a_floor():
    for floor in (460.0, None):
        [found] = parsers.all_reduce(fixture("all_reduce_perf-2.15-wrong.txt"), floor)
        assert found["status"] == "fail"
        assert found["figures"]["wrong"] == 50
        assert found["evidence"].startswith("50 wrong elements: data corruption")


def test_all_reduce_newest_format_under_the_floor_fails():
    floor = parsers.allreduce_floor("NVIDIA H200")
    [found] = parsers.all_reduce(fixture("all_reduce_perf-2.19-h200-slow.txt"), floor)
    assert found["status"] == "fail"
    assert found["figures"]["busbw_gbps"] == 330.5
    assert found["figures"]["max_bytes"] == 16 << 30
    assert found["evidence"] == "busbw 330.5 GB/s at 16 GiB < floor 431 GB/s"


def test_all_reduce_without_a_floor_skips_with_the_reason():
    [found] = parsers.all_reduce(fixture("all_reduce_perf-2.15-h100.txt"), None)
    assert found["status"] == "skip"
    assert found["evidence"].startswith("no bus-bandwidth floor for this GPU model")
    assert found["figures"]["busbw_gbps"] == 476.84


def test_all_reduce_without_data_check_says_so():
    text = fixture("all_reduce_perf-2.15-h100.txt").replace("      0", "    N/A")
    [found] = parsers.all_reduce(text, 460.0)
    assert found["status"] == "pass"
    assert "wrong" not in found["figures"]
    assert found["evidence"].endswith("data not checked (-c 0))")


def test_all_reduce_follows_the_header_of_per_iteration_columns():
    head = "#       size  count  type  redop  root  time  algbw  busbw  #wrong  i_min  i_max  "
    head += "i_p99  i_cv%  time  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%"
    row = "  1073741824  268435456  float  sum  -1  3952.9  271.63  475.36  3  1.0  2.0  3.0"
    row += "  1.0  3945.0  272.18  476.31  0  1.0  2.0  3.0  1.0"
    [found] = parsers.all_reduce(f"{head}\n{row}\n", 460.0)
    assert found["figures"]["busbw_gbps"] == 475.36
    assert found["figures"]["wrong"] == 3


def test_all_reduce_before_the_wrong_column_trusts_out_of_bounds():
    """Old releases print an "error" column (a relative error, 2e-07 is rounding): not a count."""
    head = "#       size         count    type   redop     time   algbw   busbw  error"
    row = "   134217728      33554432   float     sum    21410    6.27    9.40  2e-07"
    text = f"{head}\n{row}\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 4.22207\n"
    [found] = parsers.all_reduce(text, 5.0)
    assert found["status"] == "pass"
    assert found["figures"] == {
        "busbw_gbps": 9.4,
        "max_bytes": 134217728,
        "avg_busbw_gbps": 4.22207,
        "wrong": 0,
    }


@pytest.mark.parametrize(
    ("name", "floor"),
    [
        ("NVIDIA H100 80GB HBM3", 460.0),
        ("NVIDIA H200", 431.0),
        ("NVIDIA A100-SXM4-80GB", 228.0),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA L40S", None),
    ],
)
def test_allreduce_floor_by_model(name, floor):
    assert parsers.allreduce_floor(name) == floor


def test_floors_are_numbers_most_specific_first():
    assert all(isinstance(v, float) and v > 0 for v in parsers.ALLREDUCE_FLOORS_GBPS.values())
    keys = list(parsers.ALLREDUCE_FLOORS_GBPS)
    for i, key in enumerate(keys):
        assert not any(key in later for later in keys[i + 1 :]), "a broader key shadows " + key


# --- perftest -----------------------------------------------------------------------------------


def test_ib_write_bw_gbits_passes_at_ndr():
    [found] = parsers.ib_write_bw(fixture("ib_write_bw-gbits.txt"), 400.0)
    assert found == {
        "unit": "mlx5_0:1",
        "status": "pass",
        "figures": {"bw_avg_gbps": 392.14, "bytes": 65536},
        "evidence": "RDMA write 392.14 Gb/s at 64 KiB, 98% of the 400 Gb/s port rate",
    }


def test_ib_write_bw_mb_per_second_is_converted_and_judged():
    """12555.67 MB/sec is 2**20-byte megabytes: 105.3 Gb/s, under 90% of an HDR 200 Gb/s port."""
    [found] = parsers.ib_write_bw(fixture("ib_write_bw-mbsec-roce.txt"), 200.0, port=2)
    assert found["unit"] == "mlx5_2:2"
    assert found["status"] == "fail"
    assert found["figures"]["bw_avg_gbps"] == pytest.approx(105.325, abs=0.001)
    assert found["evidence"] == "RDMA write 105.325 Gb/s at 64 KiB < 90% of the 200 Gb/s port rate"
    [low_bar] = parsers.ib_write_bw(fixture("ib_write_bw-mbsec-roce.txt"), 100.0)
    assert low_bar["status"] == "pass"


def test_ib_write_bw_sweep_judges_the_largest_message():
    text = fixture("ib_write_bw-gbits.txt").replace(
        " 65536 ",
        " 2          5000           0.042350            0.042185            2.636533\n 65536 ",
    )
    [found] = parsers.ib_write_bw(text, 400.0)
    assert found["figures"]["bytes"] == 65536 and found["status"] == "pass"


def test_ib_write_bw_without_device_line_is_the_node():
    table = fixture("ib_write_bw-gbits.txt").split("---\n #bytes")[-1]
    [found] = parsers.ib_write_bw(" #bytes" + table, 400.0)
    assert found["unit"] == "node" and found["status"] == "pass"


def test_ib_write_bw_hostile_device_name_is_not_a_unit():
    text = fixture("ib_write_bw-gbits.txt").replace("mlx5_0", "mlx5_0;rm${IFS}-rf")
    assert parsers.ib_write_bw(text, 400.0)[0]["unit"] == "node"


def test_ib_read_lat_judges_t_typical():
    text = fixture("ib_read_lat.txt")
    [found] = parsers.ib_read_lat(text, parsers.IB_READ_LAT_MAX_USEC)
    assert found["unit"] == "mlx5_0:1"
    assert found["status"] == "pass"
    assert found["figures"] == {
        "bytes": 2,
        "typical_usec": 2.01,
        "avg_usec": 2.03,
        "p99_usec": 2.31,
    }
    [slow] = parsers.ib_read_lat(text, 1.5)
    assert slow["status"] == "fail"
    assert slow["evidence"] == "RDMA read latency typical 2.01 us at 2 B > 1.5 us"


def test_ib_read_lat_duration_run_judges_the_average():
    text = (
        " Dual-port       : OFF\t\tDevice         : mlx5_1\n"
        " #bytes        #iterations       t_avg[usec]    tps average\n"
        " 2       1802517            5.55        180251.70\n"
    )
    [found] = parsers.ib_read_lat(text, 4.5)
    assert found["unit"] == "mlx5_1:1"
    assert found["status"] == "fail"
    assert found["figures"] == {"bytes": 2, "avg_usec": 5.55}
    assert found["evidence"] == "RDMA read latency avg 5.55 us at 2 B > 4.5 us"


@pytest.mark.parametrize(
    ("parse", "tool"),
    [
        (lambda t: parsers.ib_write_bw(t, 400.0), "ib_write_bw"),
        (lambda t: parsers.ib_read_lat(t, 4.5), "ib_read_lat"),
        (lambda t: parsers.all_reduce(t, 460.0), "all_reduce_perf"),
    ],
)
def test_text_tools_unreadable_keep_the_last_line(parse, tool):
    text = "---------\n Couldn't connect to localhost:18515\n---------\n"
    [found] = parse(text)
    assert (found["unit"], found["status"]) == ("node", "fail")
    assert found["evidence"].startswith(f"unreadable {tool} output: ")
    assert found["evidence"].endswith("(last line: Couldn't connect to localhost:18515)")


def test_bad_thresholds_skip_rather_than_guess():
    assert parsers.ib_write_bw(fixture("ib_write_bw-gbits.txt"), 0)[0]["status"] == "skip"
    assert parsers.ib_read_lat(fixture("ib_read_lat.txt"), float("nan"))[0]["status"] == "skip"
    nan_floor = parsers.all_reduce(fixture("all_reduce_perf-2.15-h100.txt"), float("nan"))
    assert nan_floor[0]["status"] == "skip"


# --- never raises -------------------------------------------------------------------------------

NAMES = sorted(os.listdir(FIXTURES))
REAL = st.sampled_from([fixture(n) for n in NAMES if n != "README.md"])


@st.composite
def mangled(draw) -> str:
    """A real output, cut, spliced with junk, or with a token swapped: what a crash leaves."""
    text = draw(REAL)
    cut = draw(st.integers(0, len(text)))
    junk = draw(st.text(max_size=40))
    how = draw(st.sampled_from(["head", "tail", "splice", "swap"]))
    if how == "head":
        return text[:cut]
    if how == "tail":
        return text[cut:]
    if how == "splice":
        return text[:cut] + junk + text[cut:]
    tokens = text.split(" ")
    tokens[cut % len(tokens)] = junk
    return " ".join(tokens)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
DCGM_KEYS = st.sampled_from(
    [
        "DCGM Diagnostic",
        "DCGM GPU Diagnostic",
        "test_categories",
        "tests",
        "results",
        "status",
        "entity_id",
        "gpu_id",
        "gpu_ids",
        "warnings",
        "info",
        "test_summary",
        "iterations",
    ]
)


@st.composite
def dcgm_like(draw) -> str:
    """Documents with DCGM's keys and the wrong types in them."""
    value = draw(JSONISH)
    for _ in range(draw(st.integers(1, 5))):
        value = {draw(DCGM_KEYS): value if draw(st.booleans()) else [value]}
    return json.dumps(value)


ANY_TEXT = st.one_of(
    st.text(), mangled(), dcgm_like(), st.binary().map(lambda b: b.decode("latin-1"))
)
THRESHOLD = st.one_of(st.none(), st.floats(), st.integers(-5, 1000), st.sampled_from([460.0, 4.5]))


@settings(max_examples=400, deadline=None)
@given(text=ANY_TEXT, threshold=THRESHOLD)
def test_parsers_never_raise(text, threshold):
    outcomes = [
        *parsers.dcgm_diag(text),
        *parsers.all_reduce(text, threshold),
        *parsers.ib_write_bw(text, threshold),
        *parsers.ib_write_bw(text, 400.0, threshold),
        *parsers.ib_read_lat(text, threshold),
    ]
    for o in outcomes:
        assert_outcome(o)
    for run in (parsers.all_reduce_run(text), parsers.ib_write_bw_run(text)):
        assert set(run) == {"why"} or all(isinstance(v, (int, float)) for v in run.values())


@pytest.mark.parametrize("odd", ["²", "٣", "1e999", "nan", "-0", "9" * 5000])
def test_odd_numbers_in_tables_never_raise(odd):
    for name, parse in [
        ("all_reduce_perf-2.15-h100.txt", lambda t: parsers.all_reduce(t, 460.0)),
        ("ib_write_bw-gbits.txt", lambda t: parsers.ib_write_bw(t, 400.0)),
        ("ib_read_lat.txt", lambda t: parsers.ib_read_lat(t, 4.5)),
    ]:
        for token in ("65536", "5000", "392.14", "2.01", "8589934592", "476.84", "0"):
            for o in parse(fixture(name).replace(token, odd)):
                assert_outcome(o)


def test_huge_input_is_cheap_and_readable():
    row = "  8589934592    2147483648     float     sum      -1    31525  272.48  476.84      0\n"
    text = "x" * (4 << 20) + "\n" + row * 2000
    [found] = parsers.all_reduce(text, 460.0)
    assert found["status"] == "pass"
    assert_outcome(parsers.dcgm_diag("{" * (1 << 20))[0])
    assert_outcome(parsers.ib_read_lat("9" * (1 << 20), 4.5)[0])


@pytest.mark.parametrize("name", [n for n in NAMES if n != "README.md"])
def test_every_fixture_is_read_and_listed_in_the_readme(name):
    parse = {
        "dcgmi": parsers.dcgm_diag,
        "all_reduce_perf": lambda t: parsers.all_reduce(t, 460.0),
        "ib_write_bw": lambda t: parsers.ib_write_bw(t, 400.0),
        "ib_read_lat": lambda t: parsers.ib_read_lat(t, 4.5),
    }[name.split("-")[0].split(".")[0]]
    found = parse(fixture(name))
    assert not any(o["evidence"].startswith("unreadable") for o in found)
    assert f"`{name}`" in fixture("README.md")
