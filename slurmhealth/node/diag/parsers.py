"""Parsers of the deep-diagnostic tools' output: text in, outcomes out, never an exception.

An outcome is a dict: unit ("node", "gpu<N>" or "<hca>:<port>"), status ("pass", "fail" or
"skip"), figures ({name: number}) and evidence: one cleaned line of at most 160 characters
saying why it failed or was skipped, or what was measured. Tool output is untrusted: output
these parsers cannot read is one failed "node" outcome, "unreadable <tool> output: ...".

The formats, and the public captures the fixtures follow: tests/fixtures/diag/README.md.
"""

from __future__ import annotations

import json
import math
import re

from slurmhealth.core.result import clean, counted

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

PASS = "pass"  # noqa: S105 - an outcome, not a password
FAIL = "fail"
SKIP = "skip"
EVIDENCE_MAX = 160

# NCCL all-reduce bus bandwidth (GB/s) an 8-GPU node must reach at the largest message size
# (8-16 GiB, where busbw has flattened out). Azure HPC's node health checks fail a node below
# these, measured with all_reduce_perf at one size, 16G, across the node's 8 GPUs:
# ND H100 v5 460.0 and ND H200 v5 431.0 (432.0 on the nd96is/nd96isrf shapes), ND A100 v4
# 228.0 (Azure/azurehpc-health-checks, conf/nd96isr_h100_v5.conf, nd96isr_h200_v5.conf,
# nd96amsr_a100_v4.conf, check_nccl_allreduce; customTests/azure_nccl_allreduce.nhc). The H100
# and H200 figures are also the ones our issue tracker gives. Keys are substrings of NVML's
# model names ("NVIDIA H100 80GB HBM3" is the SXM5 part), most specific first: a caller taking
# the first match gets the right one. PCIe and NVL parts are not all-to-all NVLink connected
# and have no floor here; allreduce_floor() leaves them out.
ALLREDUCE_FLOORS_GBPS = {
    "H100 80GB HBM3": 460.0,
    "H100 SXM": 460.0,
    "H200": 431.0,
    "A100-SXM4": 228.0,
}
# RDMA bandwidth pass mark: 90% of the port rate (Mellanox/ngc_multinode_perf, common.sh: a
# device passes at 0.9 * port rate; Azure's check_ib_bw_gdr asks 380 of 400 Gb/s NDR).
IB_WRITE_BW_MIN_SHARE = 0.9
# RDMA read latency pass mark, microseconds: ngc_multinode_perf fails read tests above 4.5 us
# ("arbitrary criteria ... if the performance is worse than them, there certainly is an issue",
# its PR #97); write and send above 2.5 us.
IB_READ_LAT_MAX_USEC = 4.5

_MIB_GBITS = 1048576 * 8 / 1e9  # perftest's MB/sec and MiB/sec are 2**20 bytes a second
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_ASCII_INT = re.compile(r"[0-9]{1,20}")


def outcome(
    unit: str, status: str, evidence: str, figures: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"unit": unit, "status": status, "figures": figures or {}, "evidence": _line(evidence)}


def _line(text: object) -> str:
    """One short clean line; cut first, so a megabyte of garbage costs nothing."""
    return clean(str(text)[: EVIDENCE_MAX * 4], EVIDENCE_MAX)


def unreadable(tool: str, why: str, text: str = "") -> list[dict[str, Any]]:
    last = _last_line(text)
    tail = f" (last line: {last})" if last else ""
    return [outcome("node", FAIL, f"unreadable {tool} output: {why}{tail}")]


def _last_line(text: str) -> str:
    for raw in reversed(text[-4096:].splitlines()):
        line = clean(raw[:400], 80)
        if line.strip("-=*# "):
            return line
    return ""


def _number(token: object) -> float | None:
    """A finite number from a token, or None (nan, inf, '1e999', 5000 digits, 'N/A')."""
    if isinstance(token, bool) or not isinstance(token, (str, int, float)):
        return None
    try:
        value = float(token)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _positive(value: object) -> float | None:
    number = _number(value) if not isinstance(value, str) else None
    return number if number is not None and number > 0 else None


def size_text(nbytes: float) -> str:
    """A byte count as people read it: 8 GiB."""
    return _size(nbytes)


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    return f"{nbytes:g} TiB"


# --- DCGM: dcgmi diag -r N -j ------------------------------------------------------------------
#
# Three shapes (DCGM's dcgmi/Diag.cpp, by release):
# - 2.x to 3.2: "DCGM GPU Diagnostic" > test_categories > tests > results, each result
#   {"gpu_ids": "0", "status", "warnings": "text", "info": "text"}; the Deployment tests have one
#   result for the node, with no GPU id.
# - 3.3: the same, with "gpu_id" and warnings a list of {"warning", "error_id", ...}; a Deployment
#   result names the GPU of its last error ("gpu_id": 0) and its list says "warnings" per item.
# - 4.x: "DCGM Diagnostic"; results name an entity ("entity_group": "GPU", "entity_id": 0), info
#   is a list, and each test has a "test_summary" whose warnings are all of the test's errors.
# dcgmi writes DCGM_DIAG_RESULT_WARN as "Fail" in JSON; a run that could not start is
# {"DCGM Diagnostic": {"runtime_error": "Error: ..."}}; -i N wraps runs in {"iterations": [...]}.


def dcgm_diag(text: str) -> list[dict[str, Any]]:
    """Outcomes of `dcgmi diag -r 1|2|3 -j`: one per GPU, plus "node" for what names no GPU."""
    doc = _json_document(text)
    if doc is None:
        return unreadable("dcgmi diag", "no JSON document", text)
    runs = doc["iterations"] if isinstance(doc.get("iterations"), list) else [doc]
    found = [r for run in runs if isinstance(run, dict) for r in _dcgm_run(run)]
    if isinstance(doc.get("iterations"), list) and _dcgm_status(doc.get("Overall Result")) == FAIL:
        found.append(("node", "iterations", FAIL, _messages(doc.get("warning"))))
    if not found:
        return unreadable("dcgmi diag", "no test results", text)
    return _dcgm_outcomes(found)


def _json_document(text: str) -> dict[str, Any] | None:
    """The first JSON object in the text (dcgmi's stderr may come first)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    for _ in range(50):
        if start < 0:
            return None
        try:
            doc, _end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            start = text.find("{", start + 1)
            continue
        return doc if isinstance(doc, dict) else None
    return None


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _messages(value: object) -> list[str]:
    """Warning or info texts: a string, a list of strings, or a list of warning objects."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        text = item.get("warning", item.get("warnings")) if isinstance(item, dict) else item
        if isinstance(text, str) and text.strip():
            out.append(text)
    return out


def _dcgm_status(value: object) -> str | None:
    word = value.strip().lower() if isinstance(value, str) else ""
    if word == "pass":
        return PASS
    if word in ("skip", "skipped", "not run"):
        return SKIP
    if word in ("fail", "warn", "warning"):
        return FAIL
    return None


def _gpu_index(value: object) -> int | None:
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,4}", value.strip()):
        return int(value.strip())  # not str.isdigit(): "²" is a digit int() refuses
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10000:
        return value
    return None


def _dcgm_unit(result: dict[str, Any]) -> tuple[Any, ...]:
    """(unit, label) of one result: a GPU, or the node with the entity it named (CPU0...)."""
    if "entity_id" in result:
        group = result.get("entity_group", "GPU")
        index = _gpu_index(result.get("entity_id"))
        if group == "GPU" and index is not None:
            return f"gpu{index}", ""
        return "node", f"{str(group)[:16]}{str(result.get('entity_id'))[:16]}"
    for key in ("gpu_id", "gpu_ids"):
        index = _gpu_index(result.get(key))
        if index is not None:
            return f"gpu{index}", ""
    return "node", ""


def _dcgm_run(run: dict[str, Any]) -> list[Any]:
    """(unit, test, status, messages) of every result of one run."""
    body = run.get("DCGM Diagnostic", run.get("DCGM GPU Diagnostic"))
    if not isinstance(body, dict):
        return []
    found = []
    if _messages(body.get("runtime_error")):
        found.append(("node", "runtime error", FAIL, _messages(body.get("runtime_error"))))
    for category in _dicts(body.get("test_categories")):
        for test in _dicts(category.get("tests")):
            found.extend(_dcgm_test(test))
    return found


def _dcgm_test(test: dict[str, Any]) -> list[Any]:
    name = test.get("name") if isinstance(test.get("name"), str) else "unnamed test"
    found = []
    for result in _dicts(test.get("results")):
        unit, label = _dcgm_unit(result)
        status = _dcgm_status(result.get("status"))
        messages = _messages(result.get("warnings"))
        if status is None:
            status, messages = FAIL, [f"status {result.get('status')!r} not understood"]
        elif status == SKIP:
            messages += _messages(result.get("info"))
        found.append((unit, f"{name} ({label})" if label else name, status, messages))
    summary = test.get("test_summary")
    if isinstance(summary, dict) and _dcgm_status(summary.get("status")) == FAIL:
        if not any(status == FAIL for _unit, _name, status, _msgs in found):
            found.append(("node", name, FAIL, _messages(summary.get("warnings"))))
    return found


def _dcgm_outcomes(found: list[Any]) -> list[dict[str, Any]]:
    units: dict[str, Any] = {}
    for unit, name, status, messages in found:
        units.setdefault(unit, []).append((name, status, messages))
    order = sorted((u for u in units if u != "node"), key=lambda u: int(u[3:]))
    order += ["node"] if "node" in units else []
    return [_dcgm_unit_outcome(unit, units[unit]) for unit in order]


def _dcgm_unit_outcome(unit: str, tests: list[Any]) -> dict[str, Any]:
    failed = [(n, m) for n, s, m in tests if s == FAIL]
    passed = [n for n, s, _m in tests if s == PASS]
    skipped = [(n, m) for n, s, m in tests if s == SKIP]
    figures = {"passed": len(passed), "failed": len(failed), "skipped": len(skipped)}
    if failed:
        name, messages = failed[0]
        more = f" (+{len(failed) - 1} more failed)" if len(failed) > 1 else ""
        why = f": {messages[0]}" if messages else " failed"
        return outcome(unit, FAIL, name + more + why, figures)
    if passed:
        note = f", {len(skipped)} skipped" if skipped else ""
        return outcome(unit, PASS, f"{len(passed)} passed{note}: {', '.join(passed)}", figures)
    reasons = [m[0] for _n, m in skipped if m]
    why = f": {reasons[0]}" if reasons else ""
    return outcome(unit, SKIP, f"all {counted(len(skipped), 'test')} skipped{why}", figures)


# --- NCCL: all_reduce_perf ---------------------------------------------------------------------
#
# nccl-tests prints one row per message size: size count type redop root, then time algbw
# busbw #wrong out-of-place and the same in-place (src/common.cu, src/util.cu). The header line
# names the columns, so its own layout is followed: a root column since 2.x, per-iteration
# columns with -I 1, a timestamp with -Z; releases before the "#wrong" column printed an
# "error" column (largest relative error, not a count), and `-c 0` prints N/A: no data check.

_NCCL_ROW = re.compile(r"\s*[0-9]+\s+[0-9]+\s+\S+\s+\S+\s")
_NCCL_COLUMNS = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong"
_AVG_BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)")
_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*([0-9]{1,12})\b")


def all_reduce(text: str, floor_gbps: float | None) -> list[dict[str, Any]]:
    """The node's all-reduce: fail on any wrong element (data corruption) or a bus bandwidth at
    the largest size under the floor; skip without a floor."""
    rows, avg, out_of_bounds = _nccl_table(text)
    if not rows:
        return unreadable("all_reduce_perf", "no result rows", text)
    largest = max(size for size, _bw, _wrong in rows)
    busbw = min(bw for size, bw, _wrong in rows if size == largest)
    wrongs = [w for _s, _b, row_wrong in rows for w in row_wrong]
    # no "#wrong" column (releases before it): the "Out of bounds values" count stands alone
    checked = None not in wrongs if wrongs else out_of_bounds is not None
    wrong = max(sum(w or 0 for w in wrongs), out_of_bounds or 0)
    figures = {"busbw_gbps": busbw, "max_bytes": largest}
    if avg is not None:
        figures["avg_busbw_gbps"] = avg
    if checked:
        figures["wrong"] = wrong
    at = f"busbw {busbw:g} GB/s at {_size(largest)}"
    floor = _positive(floor_gbps)
    if wrong:
        return [outcome("node", FAIL, f"{wrong} wrong elements: data corruption ({at})", figures)]
    if floor is None:
        return [outcome("node", SKIP, f"no bus-bandwidth floor for this GPU model ({at})", figures)]
    if busbw < floor:
        return [outcome("node", FAIL, f"{at} < floor {floor:g} GB/s", figures)]
    note = f"avg {avg:g} GB/s, " if avg is not None else ""
    check = f"{wrong} wrong" if checked else "data not checked (-c 0)"
    return [outcome("node", PASS, f"{at} >= floor {floor:g} GB/s ({note}{check})", figures)]


def _nccl_table(text: str) -> tuple[Any, ...]:
    """([(size, out-of-place busbw, [#wrong or None per column])], avg busbw, out of bounds)."""
    columns = _NCCL_COLUMNS.split()
    rows, avg, out_of_bounds = [], None, None
    for line in text.splitlines():
        found = _AVG_BUSBW.search(line)
        if found:
            avg = _number(found.group(1))
        found = _OUT_OF_BOUNDS.search(line)
        if found:
            out_of_bounds = int(found.group(1))
        if line.lstrip().startswith("#"):
            names = line.strip().lstrip("#").split()
            if "size" in names and "busbw" in names:
                columns = names
        elif _NCCL_ROW.match(line):
            row = _nccl_row(line.split(), columns)
            if row is not None:
                rows.append(row)
    return rows, avg, out_of_bounds


def _nccl_row(tokens: list[Any], columns: list[Any]) -> tuple[Any, ...] | None:
    at = columns.index("busbw")
    if at >= len(tokens):
        return None
    size, busbw = _number(tokens[0]), _number(tokens[at])
    if size is None or busbw is None:
        return None
    wrong = []
    for index, name in enumerate(columns):
        if name == "#wrong" and index < len(tokens):
            value = _number(tokens[index])
            wrong.append(int(value) if value is not None and value >= 0 else None)
    return int(size), busbw, wrong


def allreduce_floor(gpu_name: str) -> float | None:
    """The default floor for an 8-GPU node of this model (NVML's name), or None: no default,
    or a PCIe/NVL part."""
    words = set(gpu_name.lower().replace("-", " ").split())
    if words & {"pcie", "nvl"}:
        return None
    for key, floor in ALLREDUCE_FLOORS_GBPS.items():
        if key.lower() in gpu_name.lower():
            return floor
    return None


# --- perftest: ib_write_bw, ib_read_lat (client side) -------------------------------------------
#
# perftest prints a banner (" Dual-port : OFF\t\tDevice : mlx5_0 ...") and a table whose header
# names the columns (src/perftest_parameters.h RESULT_FMT*, printed by perftest_parameters.c).
# Bandwidth is Gb/sec with --report_gbits, else MB/sec (MiB/sec since 2024): 2**20 bytes a
# second either way. The banner never prints the port: it is the -i argument, 1 by default
# (DEF_IB_PORT). Lines such as "Conflicting CPU frequency values detected" may sit in the table.

_DEVICE = re.compile(r"\bDevice\s*:\s*(\S+)")
_BW_HEADER = re.compile(r"BW average\[(Gb|MB|MiB)/sec\]")
_LAT_NAMES = re.compile(r"#bytes|#iterations|t_[a-z]+|99\.9% percentile|99% percentile|tps")


def _ib_unit(text: str, port: int) -> str:
    found = _DEVICE.search(text[:65536])
    device = found.group(1) if found else ""
    return f"{device}:{port}" if _NAME.fullmatch(device) else "node"


def ib_write_bw(
    text: str, port_rate_gbps: float, min_share: float = 0.9, port: int = 1
) -> list[dict[str, Any]]:
    """RDMA write bandwidth at the largest message size: fail under min_share of the port
    rate."""
    unit = _ib_unit(text, port)
    rows = _bw_rows(text)
    if not rows:
        return unreadable("ib_write_bw", "no bandwidth table", text)
    size = max(s for s, _bw in rows)
    bw = round(min(b for s, b in rows if s == size), 3)
    figures = {"bw_avg_gbps": bw, "bytes": size}
    rate, share = _positive(port_rate_gbps), _positive(min_share)
    at = f"RDMA write {bw:g} Gb/s at {_size(size)}"
    if rate is None or share is None:
        return [outcome(unit, SKIP, f"no port rate to compare with ({at})", figures)]
    if bw < share * rate:
        why = f"{at} < {share:.0%} of the {rate:g} Gb/s port rate"
        return [outcome(unit, FAIL, why, figures)]
    return [outcome(unit, PASS, f"{at}, {bw / rate:.0%} of the {rate:g} Gb/s port rate", figures)]


def _bw_rows(text: str) -> list[Any]:
    """[(bytes, BW average in Gb/s)] of the rows after a bandwidth header."""
    rows, scale, offset = [], None, 0
    for line in text.splitlines():
        header = _BW_HEADER.search(line)
        if header:
            scale = 1.0 if header.group(1) == "Gb" else _MIB_GBITS
            offset = 1 if "#sl" in line else 0  # the QoS table has a service-level column
            continue
        tokens = line.split()
        if scale is None or len(tokens) < 4 + offset or not _ASCII_INT.fullmatch(tokens[0]):
            continue
        size, avg = _number(tokens[0]), _number(tokens[3 + offset])
        if size is not None and avg is not None and _ASCII_INT.fullmatch(tokens[1 + offset]):
            rows.append((int(size), avg * scale))
    return rows


def ib_read_lat(text: str, max_usec: float, port: int = 1) -> list[dict[str, Any]]:
    """RDMA read latency at the smallest message size: fail when t_typical (the median) is over
    max_usec. A duration run (-D) reports only t_avg, which is judged instead."""
    unit = _ib_unit(text, port)
    rows = _lat_rows(text)
    if not rows:
        return unreadable("ib_read_lat", "no latency table", text)
    row = min(rows, key=lambda r: r["#bytes"])
    figures = {"bytes": int(row["#bytes"])}
    for name, key in (("typical", "t_typical"), ("avg", "t_avg"), ("p99", "99% percentile")):
        if key in row:
            figures[f"{name}_usec"] = row[key]
    name = "typical" if "typical_usec" in figures else "avg"
    if f"{name}_usec" not in figures:
        return unreadable("ib_read_lat", "no t_typical or t_avg column", text)
    value, bound = figures[f"{name}_usec"], _positive(max_usec)
    at = f"RDMA read latency {name} {value:g} us at {_size(row['#bytes'])}"
    if bound is None:
        return [outcome(unit, SKIP, f"no latency bound to compare with ({at})", figures)]
    if value > bound:
        return [outcome(unit, FAIL, f"{at} > {bound:g} us", figures)]
    p99 = f", p99 {figures['p99_usec']:g} us" if "p99_usec" in figures else ""
    return [outcome(unit, PASS, f"{at} <= {bound:g} us{p99}", figures)]


def _lat_rows(text: str) -> list[Any]:
    """[{column: number}] of the rows after a latency header."""
    rows, names = [], []
    for line in text.splitlines():
        header = _LAT_NAMES.findall(line)
        if "#bytes" in header and ("t_avg" in header or "t_typical" in header):
            names = header
            continue
        tokens = line.split()
        if not names or len(tokens) < len(names) or not _ASCII_INT.fullmatch(tokens[0]):
            continue
        values = [_number(t) for t in tokens[: len(names)]]
        if None not in values:
            rows.append(dict(zip(names, values)))
    return rows


# --- across two nodes: one run's figures (node/diag/pairs.py judges them) ----------------------
#
# all_reduce_perf launched by srun, one task a node with -g <GPUs> (nccl-tests built with
# MPI=1): rank 0 prints the header and the table once, and its "# Using devices" block lists
# every rank of both nodes ("#  Rank  9 Group  0 Pid  1886 on   worker-0 device  1 [0x91] NVIDIA
# H100 80GB HBM3"; releases before 2.x print no Group). Built without MPI, or launched without
# the PMI it was built for, each task runs alone: every task prints its own header and table, the
# ranks of each counting from 0 again (NVIDIA/nccl-tests#213, #109), or all "Rank 0" (#254).

_RANK = re.compile(
    r"^#?\s*Rank\s+([0-9]{1,6})\s+(?:Group\s+[0-9]{1,6}\s+)?Pid\s+[0-9]{1,12}\s+on\s+(\S+)\s"
)
_RUN_HEADER = re.compile(r"^#?\s*nThread\s+[0-9]+\s+nGpus\s")


def all_reduce_run(text: str) -> dict[str, Any]:
    """One all_reduce_perf run: {busbw_gbps (out-of-place, at the largest size), max_bytes,
    wrong (elements, when the data was checked), ranks (distinct rank numbers), rank_lines,
    hosts (distinct host names), headers (runs that printed a header)}, or {"why": ...} when it
    printed no result row."""
    rows, avg, out_of_bounds = _nccl_table(text)
    if not rows:
        last = _last_line(text)
        return {"why": "no result rows" + (f" (last line: {last})" if last else "")}
    largest = max(size for size, _bw, _wrong in rows)
    found: dict[str, Any] = {
        "busbw_gbps": min(bw for size, bw, _wrong in rows if size == largest),
        "max_bytes": largest,
    }
    if avg is not None:
        found["avg_busbw_gbps"] = avg
    wrongs = [w for _s, _b, row_wrong in rows for w in row_wrong]
    if (None not in wrongs if wrongs else out_of_bounds is not None):
        found["wrong"] = max(sum(w or 0 for w in wrongs), out_of_bounds or 0)
    ranks, hosts, lines, headers = set(), set(), 0, 0
    for line in text.splitlines():
        if _RUN_HEADER.match(line):
            headers += 1
        match = _RANK.match(line)
        if match:
            lines += 1
            ranks.add(int(match.group(1)))
            hosts.add(match.group(2)[:64])
    found.update(ranks=len(ranks), rank_lines=lines, hosts=len(hosts), headers=headers)
    return found


def ib_write_bw_run(text: str) -> dict[str, Any]:
    """One ib_write_bw client's figures: {bw_avg_gbps (at the largest size), bytes}, or {"why":
    ...} when it printed no bandwidth table (perftest's own error lines say why: "Couldn't
    connect to gpu03:18515")."""
    rows = _bw_rows(text)
    if not rows:
        last = _last_line(text)
        return {"why": "no bandwidth table" + (f" (last line: {last})" if last else "")}
    size = max(s for s, _bw in rows)
    return {"bw_avg_gbps": round(min(b for s, b in rows if s == size), 3), "bytes": size}
