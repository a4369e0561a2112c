"""The HTML report of a simulated fleet in a real headless Chromium (Debian's `chromium`): no
console errors, the heatmap, the trend and the tables in the DOM it built, and a screenshot.

`SLURMHEALTH_SCREENSHOT=docs/report.png` (scripts/report-screenshot) keeps the screenshot.
Without Chromium the tests skip, except under SLURMHEALTH_REQUIRE_REAL=1, where they fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest
from conftest import require_real
from test_build import HOSTILE_PROCESS, html_tables

from sim import simulate
from slurmhealth.core import store
from slurmhealth.report import build as report
from slurmhealth.report import render

CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)
TIMEOUT_S = 90  # a 2-core box shared with others can be slow; a hung Chromium is killed
WINDOW = "1280,3800"


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in CHROMIUM:
        found = shutil.which(name)
        if found:
            return found
    require_real("Chromium not installed (apt-get install chromium)")
    return ""


def run_chromium(binary: str, profile: str, *args: str) -> subprocess.CompletedProcess:
    """One headless Chromium with a fresh profile, in its own process group: on a timeout the
    whole group (renderer, GPU and zygote processes) is killed, not only the browser."""
    argv = [binary, *FLAGS, f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "HOME": profile},
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"Chromium did not finish within {TIMEOUT_S} s: {' '.join(args)}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def console_errors(stderr: str) -> list:
    """Lines where Chromium logged the page's console or an uncaught exception."""
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def demo_fleet() -> simulate.Fleet:
    """The fleet of docs/report.png: 64 nodes, 28 days, two lemons, the incident."""
    f = simulate.Fleet(nodes=64, days=28, seed=1, healthcheck_interval=1800)
    f.lemons = simulate.pick_lemons(f, 2, 30)
    return f


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """The HTML report of the demo fleet half an hour after its last drain (a node out of
    service to show), with a hostile Xid process name."""
    tmp = tmp_path_factory.mktemp("browser")
    history = simulate.events(demo_fleet())
    conn = store.connect(str(tmp / "fleet.db"))
    simulate.write_store(history, conn)
    now = max(a[2] for a in history.actions if a[3] == "drain") + 1800
    conn.execute(
        "INSERT INTO events (id, run_id, node, time, kind, code, gpu, process, class) "
        "VALUES ('hostile', 'r', 'gpu0007', ?, 'xid', 13, 0, ?, 'app')",
        (now - 3600, HOSTILE_PROCESS),
    )
    path = tmp / "report.html"
    path.write_text(render.render(report.build(conn, now, 86400), "html"), encoding="utf-8")
    conn.close()
    return str(path)


def test_the_report_renders_without_console_errors(chromium, page, tmp_path):
    proc = run_chromium(chromium, str(tmp_path / "profile"), "--dump-dom", f"file://{page}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_errors(proc.stderr) == []
    dom = html_tables(proc.stdout)
    assert dom.scripts == 0
    for table in ("fleet-states", "lemons-table", "rate-table", "mttf", "checks", "xids"):
        assert len(dom.tables[table]) > 1, table
    assert {"drift-table", "drift-nodes", "cost-table", "out-of-service"} <= set(dom.tables)
    assert '<svg id="heatmap"' in proc.stdout and '<svg id="trend"' in proc.stdout
    # every node row of the heatmap has a cell per day of the window (the whole days since the
    # demo fleet's first record); incidents' nodes are left out of it (docs/report.md)
    rows = proc.stdout.count('<text class="node')
    cells = proc.stdout.count('<g><rect class="c')
    assert rows >= 5 and cells % rows == 0 and cells // rows >= 20
    assert HOSTILE_PROCESS in "".join(dom.text)  # shown as text, never run


def test_console_errors_are_seen(chromium, tmp_path):
    """The scan above can fail: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><title>x</title><script>console.error('boom'); nope();</script>")
    proc = run_chromium(chromium, str(tmp_path / "profile"), "--dump-dom", f"file://{bad}")
    errors = console_errors(proc.stderr)
    assert any("boom" in line for line in errors) and any("Uncaught" in e for e in errors)


def test_screenshot(chromium, page, tmp_path):
    shot = tmp_path / "report.png"
    proc = run_chromium(
        chromium,
        str(tmp_path / "profile"),
        f"--screenshot={shot}",
        f"--window-size={WINDOW}",
        "--hide-scrollbars",
        f"file://{page}",
    )
    assert proc.returncode == 0 and console_errors(proc.stderr) == [], proc.stderr[-2000:]
    with open(shot, "rb") as handle:
        head = handle.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (width, height) == tuple(int(x) for x in WINDOW.split(","))
    keep = os.environ.get("SLURMHEALTH_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
