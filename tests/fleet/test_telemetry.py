"""The node that held a multi-node job back (slurmhealth/fleet/telemetry.py): the rule on its
own, then from what the real runner and store record for a job, through `slurmhealth job` and
the lemon sweep's warnings."""

from __future__ import annotations

import base64
import json
import zlib

import pytest
from conftest import run_cli, snapshot_path

from slurmhealth.core import store
from slurmhealth.fleet import jobs, queries, signals, telemetry
from slurmhealth.fleet.text import job as job_text
from slurmhealth.node import config, counters, runner

HOUR = 3600.0
NS = 1e9


def figures(share: float, gpu: str = "GPU 0", cause: str = "power-capped") -> dict:
    return {"share": share, "worst_gpu": gpu if share else None, "cause": cause, "span_s": 6 * HOUR}


# --- the rule ------------------------------------------------------------------------------------


def test_the_node_far_above_its_peers_held_the_job_back():
    job = {
        "gpu05": figures(0.02),
        "gpu06": figures(0.01),
        "gpu07": figures(0.34, "GPU 3"),
        "gpu08": figures(0.03),
    }
    found = telemetry.held_back(job, 6 * HOUR)
    assert found == {
        "node": "gpu07",
        "gpu": "GPU 3",
        "cause": "power-capped",
        "share": 0.34,
        "others_median": 0.02,
        "duration_s": 6 * HOUR,
    }
    assert telemetry.words(found) == (
        "gpu07 held the job back: GPU 3 power-capped 34% of the job's 6.0 h, others' median 2%"
    )


@pytest.mark.parametrize(
    ("shares", "why"),
    [
        ([0.02, 0.02, 0.11], "9 points above the median: under the margin"),
        ([0.40, 0.40, 0.60], "20 points above, under twice the median: capped everywhere"),
        ([0.0, 0.50], "one other node: no telling which of two is odd"),
        ([0.50], "a 1-node job: nothing to compare"),
        ([0.0, 0.0, 0.0], "no slowdown anywhere"),
        ([0.10, 0.10, 0.25], "15 points over, but 2.5x: a part that caps sooner (FACTOR 3)"),
    ],
)
def test_no_node_is_named_without_a_clear_margin_over_enough_peers(shares, why):
    job = {f"gpu{i:02}": figures(s) for i, s in enumerate(shares)}
    assert telemetry.held_back(job, HOUR) is None, why


def test_a_margin_and_a_factor_just_met_name_the_node():
    job = {"a": figures(0.02), "b": figures(0.02), "c": figures(0.13)}
    assert telemetry.held_back(job, HOUR)["node"] == "c"
    three_times = {"a": figures(0.10), "b": figures(0.10), "c": figures(0.31)}
    assert telemetry.held_back(three_times, HOUR)["node"] == "c"
    median_zero = {"a": figures(0.0), "b": figures(0.0), "c": figures(0.0), "d": figures(0.101)}
    assert telemetry.held_back(median_zero, HOUR)["others_median"] == 0.0


def test_node_figures_sum_each_gpu_and_take_the_worst():
    rows = [
        ("gpu:0000:18:00.0", "GPU 0", "perf_power_ns", 2, 60 * NS),
        ("gpu:0000:5d:00.0", "GPU 3", "perf_power_ns", 3, 600 * NS),
        ("gpu:0000:5d:00.0", "GPU 3", "perf_thermal_ns", 1, 1200 * NS),
        ("gpu:0000:5d:00.0", "GPU 3", "pcie_replay", 2, 40),
        ("nvlink:0000:5d:00.0:4", "GPU 3 link 4", "nvlink_crc", 1, 7),
        ("gpu:0000:9b:00.0", "GPU 5", "ecc_sbe_volatile", 0, 0),  # a first reading: no increase
    ]
    got = telemetry.node_figures(rows, HOUR)
    assert (got["share"], got["worst_gpu"], got["cause"]) == (0.5, "GPU 3", "thermally slowed")
    assert [(g["gpu"], g["power_s"], g["thermal_s"]) for g in got["gpus"]] == [
        ("GPU 3", 600.0, 1200.0),
        ("GPU 0", 60.0, 0.0),
    ]
    assert got["errors"] == [
        {"device": "GPU 3", "counter": "pcie_replay", "episodes": 2, "errors": 40.0},
        {"device": "GPU 3 link 4", "counter": "nvlink_crc", "episodes": 1, "errors": 7.0},
    ]
    assert telemetry.error_words(got["errors"]) == (
        "GPU 3 PCIe replays +40 (2 episodes), GPU 3 link 4 NVLink CRC errors +7 (1 episode)"
    )


def test_no_rows_is_no_slowdown_and_time_from_before_the_job_is_capped():
    assert telemetry.node_figures([], HOUR) == {
        "span_s": HOUR,
        "share": 0.0,
        "worst_gpu": None,
        "cause": None,
        "gpus": [],
        "errors": [],
    }
    assert telemetry.error_words([]) == "none"
    # no prolog reading: the first delta in the job counts time from the node's previous run
    early = [("gpu:0000:18:00.0", "GPU 0", "perf_power_ns", 1, 5 * HOUR * NS)]
    assert telemetry.node_figures(early, HOUR)["share"] == 1.0
    assert telemetry.node_figures(early, 0.0)["share"] == 0.0


def test_a_node_is_repeated_from_its_second_job_held_back():
    held = [("gpu07", 100.0), ("gpu02", 50.0), ("gpu07", 300.0), ("gpu07", 200.0)]
    assert telemetry.repeated(held) == [("gpu07", 300.0)]
    assert telemetry.repeated(held[:2]) == []


def test_hostile_names_are_cleaned_in_the_words():
    found = {
        "node": "gpu07\x1b[2J",
        "gpu": "GPU\n3",
        "cause": "power-capped",
        "share": 0.5,
        "others_median": 0.0,
        "duration_s": 1800.0,
    }
    text = telemetry.words(found)
    assert text.isprintable() and "\x1b" not in text and "of the job's 30 min" in text


# --- from the store: the real runner's readings of a 5-node job ----------------------------------

T0 = 1_750_000_000.0
SPAN = 6 * HOUR
NODES = ("gpu04", "gpu05", "gpu06", "gpu07", "gpu08")


def run_hook(conn, tmp_path, node, job, phase, when, power_ns=None, replays=0, nodes=5):
    """One run as the hooks record it (the real runner on the replayed healthy H100 snapshot,
    its counter readings given), dated `when`. power_ns: {GPU index: perf_power_ns}."""
    with open(snapshot_path("healthy")) as handle:
        doc = json.load(handle)
    for gpu in doc["gpu"]["devices"]:
        fields = gpu.setdefault("fields", {})
        fields.update(perf_power_ns=0, perf_thermal_ns=0, pcie_replay=0)
        fields["perf_power_ns"] = (power_ns or {}).get(gpu["index"], 0)
    doc["gpu"]["devices"][3]["fields"]["pcie_replay"] = replays
    snap = tmp_path / f"{node}-{phase}-{when}.json"
    snap.write_text(json.dumps(doc))
    options = runner.Options(gpu_source=str(snap))
    baselines = store.load_baselines(conn, node)
    run = runner.run(node, config.defaults(), options, ["gpu"], phase, baselines, list(range(8)))
    records = run.records(job if phase != "check" else None)
    records["run"]["started"] = when
    for row in records["counters"]:
        row["time"] = when
    columns = None
    if phase == "prolog":
        columns = {"uid": 1000, "user": "alice", "start": when, "state": "running"}
        columns["num_nodes"] = nodes
    elif phase == "epilog":
        columns = {"end": when, "state": "ended", "exit_code": 0, "signal": 0}
    store.record_run(conn, records, columns)


def held_back_job(conn, tmp_path, job: str, t0: float) -> None:
    """gpu07's GPU 3 is power-capped 34% of a 6-hour job; its peers 0-3%; details below."""
    # GPU power-capping time (ns) each node had counted before the job, and at its end
    before = {"gpu04": {}, "gpu05": {0: 9e12}, "gpu06": {1: 1e12}, "gpu07": {3: 5e12}}
    before["gpu08"] = {2: 9e13}
    after = {
        "gpu04": {},  # nothing changed: no row at all
        "gpu05": {0: 9e12 + 0.02 * SPAN * NS},
        "gpu06": {1: 1e12 + HOUR * NS + 0.02 * SPAN * NS},
        "gpu07": {3: 5e12 + 0.34 * SPAN * NS},
        "gpu08": {2: 0.03 * SPAN * NS},  # the driver reloaded: the counter restarted at 0
    }
    # gpu06 was capped an hour before the job: its prolog's reading, dated the start, is not
    # the job's
    at_prolog = dict(before, gpu06={1: 1e12 + HOUR * NS})
    for node in NODES:
        start = t0 + 0.5 if node == "gpu08" else t0  # prologs do not start at the same moment
        run_hook(conn, tmp_path, node, job, "check", start - 600, before[node])
        run_hook(conn, tmp_path, node, job, "prolog", start, at_prolog[node])
    # A health check on gpu07 halfway: its reading counts, the epilog's adds the rest
    halfway = {3: 5e12 + 0.20 * SPAN * NS}
    run_hook(conn, tmp_path, "gpu07", job, "check", t0 + SPAN / 2, halfway)
    for node in NODES:
        replays = 40 if node == "gpu07" else 0
        run_hook(conn, tmp_path, node, job, "epilog", t0 + SPAN, after[node], replays)
    # After the job and the epilog's slack: not the job's
    late = {0: 9e12 + 0.9 * SPAN * NS}
    run_hook(conn, tmp_path, "gpu05", job, "check", t0 + SPAN + 600, late)


def test_slurmhealth_job_names_the_node_that_held_the_job_back(tmp_path):
    path = str(tmp_path / "fleet.db")
    conn = store.connect(path)
    held_back_job(conn, tmp_path, "41", T0)
    conn.close()

    proc = run_cli("job", "41", "--db", path, "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    shares = {n["node"]: round(n["telemetry"]["share"], 4) for n in got["nodes"]}
    assert shares == {"gpu04": 0.0, "gpu05": 0.02, "gpu06": 0.02, "gpu07": 0.34, "gpu08": 0.03}
    gpu07 = next(n for n in got["nodes"] if n["node"] == "gpu07")["telemetry"]
    assert (gpu07["worst_gpu"], gpu07["cause"]) == ("GPU 3", "power-capped")
    assert gpu07["errors"] == [
        {"device": "GPU 3", "counter": "pcie_replay", "episodes": 1, "errors": 40.0}
    ]
    evidence = (
        "gpu07 held the job back: GPU 3 power-capped 34% of the job's 6.0 h, others' median 2%"
    )
    assert got["held_back"]["node"] == "gpu07" and got["held_back"]["evidence"] == evidence
    assert got["verdict"] == "ok"  # a slow node is not a fault of the job

    text = run_cli("job", "41", "--db", path).stdout.splitlines()
    assert f"held back: {evidence}" in text
    assert (
        "  gpu07        slowdown  34% (GPU 3 power-capped)  errors: GPU 3 PCIe replays +40 "
        "(1 episode)"
    ) in text
    assert "  gpu04        slowdown   0%  errors: none" in text


def test_the_published_summary_carries_no_telemetry(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    held_back_job(conn, tmp_path, "41", T0)
    summary = jobs.summary(conn, "41")
    assert summary["held_back"]["node"] == "gpu07"
    back = jobs.decode(jobs.encode(summary))
    assert "held_back" not in back
    assert all("telemetry" not in n for n in back["nodes"])
    forged = dict(jobs.compact(summary), held_back={"evidence": 7})
    forged["nodes"] = [dict(n, telemetry="x") for n in forged["nodes"]]
    body = json.dumps(forged).encode()  # encoded as encode() does, without compact()
    comment = jobs.PREFIX + base64.b32encode(zlib.compress(body)).decode().lower()
    shown = job_text(jobs.decode(comment))
    assert "held back" not in shown and "slowdown" not in shown


def test_a_running_job_and_a_one_node_job_name_nobody(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    for node in ("gpu05", "gpu06", "gpu07"):
        run_hook(conn, tmp_path, node, "50", "prolog", T0, {}, nodes=3)
    run_hook(conn, tmp_path, "gpu07", "50", "check", T0 + 600, {3: 0.5 * 600 * NS})
    running = jobs.summary(conn, "50")
    assert running["verdict"] == "running" and running["held_back"] is None
    gpu07 = next(n for n in running["nodes"] if n["node"] == "gpu07")
    assert gpu07["telemetry"]["gpus"][0]["power_s"] == 300.0  # the figures so far

    run_hook(conn, tmp_path, "gpu09", "51", "prolog", T0, {}, nodes=1)
    run_hook(conn, tmp_path, "gpu09", "51", "epilog", T0 + HOUR, {2: 0.9 * HOUR * NS})
    alone = jobs.summary(conn, "51")
    assert alone["held_back"] is None
    assert alone["nodes"][0]["telemetry"]["share"] == 0.9


def test_a_node_that_held_back_two_jobs_is_a_lemon_warning(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    held_back_job(conn, tmp_path, "41", T0)
    window = (T0 - 86400, T0 + 3 * 86400)
    once = signals.signals(conn, *window)
    assert once["gpu07"]["warnings"] == []

    second = T0 + 86400
    held_back_job(conn, tmp_path, "42", second)
    twice = signals.signals(conn, *window)
    assert [(t, kind) for t, kind, _, _ in twice["gpu07"]["warnings"]] == [(second + SPAN, "warn")]
    assert all(twice[n]["warnings"] == [] for n in NODES if n != "gpu07")
    # a week after the second job, neither counts any more
    later = signals.signals(conn, T0, second + SPAN + telemetry.LOOKBACK + 1)
    assert later["gpu07"]["warnings"] == []


def test_a_job_without_slowdown_or_errors_says_so_in_one_line(tmp_path):
    conn = store.connect(str(tmp_path / "fleet.db"))
    for node in ("gpu05", "gpu06", "gpu07"):
        run_hook(conn, tmp_path, node, "60", "prolog", T0, {}, nodes=3)
        run_hook(conn, tmp_path, node, "60", "epilog", T0 + HOUR, {}, nodes=3)
    text = job_text(jobs.summary(conn, "60"))
    lines = [x for x in text.splitlines() if "slowdown" in x]
    assert lines == [
        "GPU slowdown (power or thermal policy) and error counters during the job: none"
    ]


def test_a_job_is_judged_whole_when_a_window_edge_falls_between_its_epilogs(tmp_path):
    """The sweep's window ends 5 s after three of a job's four epilogs and 5 s before the
    fourth (the node that held it back). Judging the three alone named a healthy node; the
    job is judged whole, in the window its last epilog falls in."""
    from slurmhealth.fleet import queries  # noqa: PLC0415

    conn = store.connect(str(tmp_path / "fleet.db"))
    t0, shares = 20_000 * 86400.0, {"gpu01": 0.40, "gpu02": 0.13, "gpu03": 0.02, "gpu04": 0.02}
    end = t0 + 6 * HOUR
    for node, share in sorted(shares.items()):
        finish = end + (5.0 if node == "gpu01" else -5.0)
        run = {
            "node": node,
            "job_id": "7",
            "phase": "prolog",
            "started": t0,
            "duration": 0.04,
            "verdict": "ok",
            "tool_version": "x",
            "sources": "{}",
        }
        records = {"run": run, "results": [], "events": [], "baselines": {}}
        store.record_run(conn, records, {"start": t0, "state": "running", "num_nodes": 4})
        row = {
            "device": "gpu:0000:18:00.0",
            "counter": "perf_power_ns",
            "time": finish,
            "value": share * (finish - t0) * NS,
            "delta": share * (finish - t0) * NS,
            "label": "GPU 0",
        }
        records = dict(records, run=dict(run, phase="epilog", started=finish), counters=[row])
        store.record_run(conn, records, {"end": finish, "state": "ended"})
    assert queries.held_back_jobs(conn, t0, end) == []  # its last node had not ended
    ((node, when),) = queries.held_back_jobs(conn, end, end + HOUR)
    assert (node, when) == ("gpu01", end + 5.0)
    assert [n for n, _ in queries.held_back_jobs(conn, t0, end + HOUR)] == ["gpu01"]


# --- power: the energy the epilogs recorded (jobs.gpu_energy), shown per node -------------------


def test_power_is_each_gpus_energy_over_the_nodes_time_in_the_job():
    figures = telemetry.power(json.dumps({"s": 100.0, "j": {"0": 65000, "3": 21200.5}}))
    assert figures["span_s"] == 100.0 and figures["mean_w"] == pytest.approx(431.0025)
    assert [(g["gpu"], g["watts"]) for g in figures["gpus"]] == [("GPU 3", 212.005), ("GPU 0", 650)]
    assert telemetry.power_words(figures) == "431 W per GPU (lowest GPU 3 212 W)"
    one = telemetry.power('{"s": 10, "j": {"1": 7000}}')
    assert telemetry.power_words(one) == "700 W per GPU"


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "not json",
        "[1, 2]",
        '{"s": 0, "j": {"0": 1}}',
        '{"s": -5, "j": {"0": 1}}',
        '{"s": NaN, "j": {"0": 1}}',
        '{"s": true, "j": {"0": 1}}',
        '{"s": 10, "j": []}',
        '{"s": 10, "j": {"0": -1, "x\\u001b[2J": 5, "99999": 5, "1": "5"}}',
        "[" * 100_000,
    ],
)
def test_power_from_a_damaged_or_forged_row_is_none(raw):
    assert telemetry.power(raw) is None


def test_slurmhealth_job_shows_each_nodes_mean_gpu_power(tmp_path):
    path = str(tmp_path / "fleet.db")
    conn = store.connect(path)
    held_back_job(conn, tmp_path, "41", T0)
    drew = {"gpu04": 650, "gpu05": 655, "gpu06": 648, "gpu07": 471}  # gpu08: no energy counter
    for node, watts in drew.items():
        joules = {str(i): watts * SPAN for i in range(8)}
        joules["3"] = (212 if node == "gpu07" else watts - 10) * SPAN
        energy = json.dumps({"s": SPAN, "j": joules})
        conn.execute("UPDATE jobs SET gpu_energy = ? WHERE node = ?", (energy, node))
    conn.commit()
    conn.close()

    got = json.loads(run_cli("job", "41", "--db", path, "--json").stdout)
    power = {n["node"]: n["telemetry"]["power"] for n in got["nodes"]}
    assert power["gpu08"] is None
    assert round(power["gpu07"]["mean_w"], 3) == round((7 * 471 + 212) / 8, 3)
    assert power["gpu07"]["gpus"][0] == {"gpu": "GPU 3", "joules": 212 * SPAN, "watts": 212.0}
    assert got["held_back"]["node"] == "gpu07"  # power names nobody; the slowdown does

    text = run_cli("job", "41", "--db", path).stdout.splitlines()
    at = text.index("GPU power, mean over the job (NVML energy counter, prolog to epilog):")
    assert text[at + 1 : at + 5] == [
        "  gpu04        649 W per GPU (lowest GPU 3 640 W)",
        "  gpu05        654 W per GPU (lowest GPU 3 645 W)",
        "  gpu06        647 W per GPU (lowest GPU 3 638 W)",
        "  gpu07        439 W per GPU (lowest GPU 3 212 W)",
    ]
    assert not any(line.startswith("  gpu08") and "W per GPU" in line for line in text)


# --- clocks: time below base clocks and the health checks' samples (jobs.gpu_energy) ------------


def clocks_row(share: float, util: float = 97.0, worst: str = "3", span: float = SPAN) -> str:
    """A node's epilog figures: every GPU 2% of the job below base clocks, GPU `worst` at
    `share`; 12 samples per GPU at 1980 MHz and `util` % (GPU `worst` slower)."""
    below = {str(i): 0.02 * span for i in range(8)}
    below[worst] = share * span
    sampled = {str(i): [12, 1980, util] for i in range(8)}
    sampled[worst] = [12, 1500, util]
    return json.dumps({"s": span, "j": {}, "b": below, "u": sampled})


def test_clock_figures_take_the_worst_gpus_share_and_the_sampled_means():
    got = telemetry.clock_figures(clocks_row(0.30, util=90.0))
    assert (got["worst_gpu"], round(got["share"], 6), got["samples"]) == ("GPU 3", 0.30, 12)
    assert got["mhz"] == (7 * 1980 + 1500) / 8 and got["util"] == 90.0
    assert got["gpus"][0] == {
        "gpu": "GPU 3", "below_s": 0.30 * SPAN, "share": 0.30, "samples": 12, "mhz": 1500,
        "util": 90.0,
    }
    words = "below base clocks 30% (GPU 3); SM 1920 MHz, utilisation 90% (12 samples)"
    assert telemetry.clock_words(got) == words
    # samples alone (a driver without field 81), the share alone, and a share over the span
    only = telemetry.clock_figures('{"s": 100, "u": {"0": [1, 1700, 50]}}')
    assert only["share"] is None and telemetry.clock_words(only) == (
        "SM 1700 MHz, utilisation 50% (1 sample)"
    )
    capped = telemetry.clock_figures('{"s": 100, "b": {"0": 250}}')
    assert capped["share"] == 1.0 and capped["util"] is None


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "not json",
        '{"s": 10, "j": {"0": 5}}',  # energy only
        '{"s": 0, "b": {"0": 1}}',
        '{"s": 10, "b": {"0": -1, "x\\u001b[2J": 5, "99999": 5, "1": "5"}}',
        '{"s": 10, "u": {"0": [0, 1900, 50], "1": [3, 1900, 101], "2": [3, 1900], "3": "x"}}',
        "[" * 100_000,
    ],
)
def test_clock_figures_from_a_damaged_or_forged_row_are_none(raw):
    assert telemetry.clock_figures(raw) is None


def test_time_below_base_clocks_names_a_node_the_policy_counters_do_not():
    """A hardware slowdown (a power brake, an overheating HBM stack) holds the clocks below
    base without the power or thermal policy counting it."""
    none = {n: figures(0.0) for n in ("a", "b", "c", "d")}
    clocks = {n: telemetry.clock_figures(clocks_row(0.03)) for n in ("a", "b", "c")}
    clocks["d"] = telemetry.clock_figures(clocks_row(0.41, util=98.0))
    found = telemetry.held_back(none, SPAN, clocks)
    assert (found["node"], found["gpu"], found["cause"]) == ("d", "GPU 3", "below base clocks")
    assert telemetry.words(found) == (
        "d held the job back: GPU 3 below base clocks 41% of the job's 6.0 h, others' median "
        "3%; utilisation 98%, others' median 97%"
    )
    # a job that idles its GPUs a third of the time on every node names nobody
    idle = {n: telemetry.clock_figures(clocks_row(0.33 + i / 100)) for i, n in enumerate("abcd")}
    assert telemetry.held_back(none, SPAN, idle) is None
    # the policy counters' finding comes first
    capped = dict(none, b=figures(0.5))
    assert telemetry.held_back(capped, SPAN, clocks)["node"] == "b"
    # fewer than three nodes with the figure: no telling which is odd
    two = {"c": clocks["c"], "d": clocks["d"], "a": None, "b": None}
    assert telemetry.held_back(none, SPAN, two) is None


def below_base_job(conn, tmp_path, job: str, t0: float) -> None:
    """Five nodes, no policy counter moving; gpu07's GPU 3 below base clocks 41% of the job."""
    for node in NODES:
        run_hook(conn, tmp_path, node, job, "prolog", t0)
        run_hook(conn, tmp_path, node, job, "epilog", t0 + SPAN)
        row = clocks_row(0.41 if node == "gpu07" else 0.02 + NODES.index(node) / 200)
        share = counters.below_share(json.loads(row))  # as node/agent.py records it
        conn.execute(
            "UPDATE jobs SET gpu_energy = ?, below_base = ? WHERE node = ? AND job_id = ?",
            (row, share, node, job),
        )
    conn.commit()


def test_slurmhealth_job_and_the_lemon_sweep_name_a_node_below_base_clocks(tmp_path):
    path = str(tmp_path / "fleet.db")
    conn = store.connect(path)
    below_base_job(conn, tmp_path, "51", T0)
    got = json.loads(run_cli("job", "51", "--db", path, "--json").stdout)
    assert got["held_back"]["node"] == "gpu07"
    assert got["held_back"]["cause"] == "below base clocks"
    gpu07 = next(n for n in got["nodes"] if n["node"] == "gpu07")["telemetry"]["clocks"]
    assert (gpu07["worst_gpu"], gpu07["samples"]) == ("GPU 3", 12)

    text = run_cli("job", "51", "--db", path).stdout.splitlines()
    at = text.index("GPU clocks during the job (worst GPU; means of the health checks' samples):")
    assert text[at + 4] == (
        "  gpu07        below base clocks 41% (GPU 3); SM 1920 MHz, utilisation 97% (12 samples)"
    )
    assert any(line.startswith("held back: gpu07 held the job back: GPU 3 below") for line in text)

    below_base_job(conn, tmp_path, "52", T0 + 86400)
    window = (T0 - 86400, T0 + 3 * 86400)
    warned = signals.signals(conn, *window)
    assert [kind for _, kind, _, _ in warned["gpu07"]["warnings"]] == ["warn"]
    assert all(warned[n]["warnings"] == [] for n in NODES if n != "gpu07")


def test_a_jobs_rows_share_below_base_is_read_only_when_sound():
    assert telemetry.share_of(0.41) == 0.41 and telemetry.share_of(1) == 1.0
    for forged in (None, -0.1, 1.5, float("nan"), float("inf"), "0.4", True, b"\x00"):
        assert telemetry.share_of(forged) is None


def test_the_sweep_names_the_node_from_the_rows_share_and_its_gpu_from_the_figures(tmp_path):
    """The lemon sweep reads jobs.below_base from the index; the figures of a job with a
    finding name its GPU. Figures that do not agree with the share (a forged row) leave the
    finding as the shares made it, its GPU unnamed."""
    from slurmhealth.fleet import queries  # noqa: PLC0415

    conn = store.connect(str(tmp_path / "fleet.db"))
    below_base_job(conn, tmp_path, "51", T0)
    [found] = queries.held_back_findings(conn, T0, T0 + SPAN + 1)
    assert (found["node"], found["job"], found["finding"]["gpu"]) == ("gpu07", "51", "GPU 3")
    conn.execute("UPDATE jobs SET gpu_energy = NULL WHERE node = 'gpu07'")
    [found] = queries.held_back_findings(conn, T0, T0 + SPAN + 1)
    assert found["node"] == "gpu07" and found["finding"]["gpu"] is None
    assert "held the job back: a GPU below base clocks 41%" in telemetry.words(found["finding"])


def test_a_job_on_nodes_without_counters_is_not_read_and_the_held_back_one_still_is(tmp_path):
    """The sweep reads no counter of a node that has none (a simulated or quiet fleet's many
    jobs), and still names the node that held its job back beside them."""
    conn = store.connect(str(tmp_path / "fleet.db"))
    held_back_job(conn, tmp_path, "41", T0)
    for node in ("gpu10", "gpu11", "gpu12"):
        row = {"node": node, "job_id": "50", "start": T0, "end": T0 + SPAN, "num_nodes": 3}
        conn.execute(store.insert_sql("jobs"), store.row("jobs", row))
    statements: list = []
    conn.set_trace_callback(statements.append)
    found = queries.held_back_findings(conn, T0, T0 + 2 * SPAN)
    conn.set_trace_callback(None)
    assert [(f["node"], f["job"]) for f in found] == [("gpu07", "41")]
    read = [s for s in statements if "FROM counters" in s and "gpu1" in s]
    assert read == [], read
