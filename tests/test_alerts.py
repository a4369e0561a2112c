"""packaging/prometheus/slurmhealth-alerts.yml: valid to Prometheus' own promtool, each alert
firing (and not firing) as docs/alerts.md says on series as slurmhealth writes them, and every
metric, label and value it reads one that slurmhealth or node_exporter writes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from conftest import REPO, require_real

from slurmhealth.core.constants import DRAIN_OUTCOMES, PHASES
from slurmhealth.core.result import STATUSES
from slurmhealth.node import metrics
from slurmhealth.report import render

RULES = os.path.join(REPO, "packaging", "prometheus", "slurmhealth-alerts.yml")
UNIT_TESTS = os.path.join(REPO, "tests", "fixtures", "alerts", "slurmhealth-alerts-test.yml")
# node_exporter's textfile collector, for the fleet file's age (its `file` label)
NODE_EXPORTER = {"node_textfile_mtime_seconds": ("file",)}


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        require_real("promtool not installed (Debian's prometheus package; make test installs it)")
    return str(found)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_accepts_the_rules(promtool):
    proc = _run([promtool, "check", "rules", RULES])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_say(promtool):
    proc = _run([promtool, "test", "rules", UNIT_TESTS])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_a_wrong_expectation_fails_promtool(promtool, tmp_path):
    # the unit tests compare labels and annotations exactly: a changed expectation fails
    text = open(UNIT_TESTS).read().replace("(score 4.2)", "(score 4.3)")
    broken = tmp_path / "broken-test.yml"
    broken.write_text(text.replace("../../../packaging", os.path.join(REPO, "packaging")))
    proc = _run([promtool, "test", "rules", str(broken)])
    assert proc.returncode != 0 and "SlurmhealthLemon" in proc.stdout + proc.stderr


def alerts() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", open(RULES).read(), re.M)


def _expressions() -> list[str]:
    """Each rule's expr, its folded continuation lines joined."""
    out, current = [], None
    for line in open(RULES).read().splitlines():
        found = re.match(r"\s+expr: (.*)$", line)
        if found:
            current = found.group(1).removeprefix(">-").strip()
            out.append(current)
            continue
        if current is not None and out and re.match(r"\s{10,}\S", line) and ":" not in line:
            out[-1] += " " + line.strip()
        else:
            current = None
    return out


def test_every_alert_has_unit_tests():
    tested = set(re.findall(r"alertname: (\w+)", open(UNIT_TESTS).read()))
    assert set(alerts()) == tested
    assert len(_expressions()) == len(alerts())


def test_the_rules_read_only_what_slurmhealth_and_node_exporter_write():
    families = {name: ("node", *spec[1]) for name, spec in metrics.FAMILIES.items()}
    families.update({name: labels for name, labels, _ in render.PROM_FAMILIES})
    families.update(NODE_EXPORTER)
    values = {"outcome": DRAIN_OUTCOMES, "status": STATUSES, "phase": PHASES}
    for expr in _expressions():
        for name, selector in re.findall(r"\b((?:slurmhealth|node)_[a-z_]+)(\{[^}]*\})?", expr):
            assert name in families, f"{name}: not a metric slurmhealth or node_exporter writes"
            for label, op, value in re.findall(r'(\w+)(=~|!=|=)"([^"]*)"', selector):
                assert label in families[name], f"{name} has no label {label}"
                if op == "=" and label in values:
                    assert value in values[label], f"{name}{{{label}}} is never {value!r}"
