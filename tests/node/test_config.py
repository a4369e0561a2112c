from __future__ import annotations

import conftest
import pytest

from slurmhealth.node import config

GOOD = """
[settings]
deadline = 8

[gpu]
count = 8

[checks."gpu.thermal"]
severity = "fail"

[[node]]
match = "gpu[01-16],!gpu05"
ib.rate = 400
ib.devices = ["mlx5_0", "mlx5_1"]

[[node]]
match = "gpu05"
gpu.count = 4
checks."ib.firmware".enabled = false
"""


def test_effective_expectations_layer_defaults_tables_and_matching_blocks():
    cfg = config.Config(config.parse(GOOD, "t.toml"))
    gpu07 = cfg.for_node("gpu07")
    assert gpu07["gpu"]["count"] == 8
    assert gpu07["ib"]["rate"] == 400
    assert gpu07["gpu"]["persistence"] is True  # built-in default survives
    assert gpu07["settings"]["deadline"] == 8
    assert gpu07["checks"]["gpu.thermal"] == {"severity": "fail"}
    gpu05 = cfg.for_node("gpu05")
    assert gpu05["gpu"]["count"] == 4
    assert gpu05["ib"]["rate"] is None
    assert gpu05["checks"]["ib.firmware"] == {"enabled": False}


def test_no_file_means_defaults_that_expect_nothing_unseen(monkeypatch):
    monkeypatch.delenv("SLURMHEALTH_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", "/nonexistent/slurmhealth.toml")
    effective = config.load(None).for_node("any")
    assert effective["gpu"]["count"] is None
    assert effective["gpu"]["persistence"] is True and effective["gpu"]["ecc"] is True
    assert effective["ib"]["devices"] is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[gpu]\ncount = \n", "t.toml:2:"),
        ("[gpu]\ncount = 8\n\n[gpux]\n", "t.toml:4: unknown section [gpux]"),
        ("[gpu]\n\ncounts = 8\n", "t.toml:3: unknown key gpu.counts"),
        ('[gpu]\ncount = "eight"\n', "t.toml:2: gpu.count must be int"),
        ("[gpu]\npersistence = 1\n", "t.toml:2: gpu.persistence must be bool"),
        ('[checks."gpu.nope"]\nenabled = false\n', "t.toml:1: unknown check 'gpu.nope'"),
        (
            '[checks."gpu.ecc"]\nseverity = "loud"\n',
            "checks.gpu.ecc.severity = 'loud' is not valid",
        ),
        ('[[node]]\nmatch = "gpu[01-"\n', "t.toml:2: unbalanced '['"),
        ("[[node]]\ngpu.count = 2\n", "every [[node]] needs match"),
    ],
)
def test_errors_name_file_and_line(text, expected):
    with pytest.raises(config.ConfigError) as err:
        config.parse(text, "t.toml")
    assert expected in str(err.value)


def test_explicit_missing_file_is_an_error():
    with pytest.raises(config.ConfigError, match="cannot read config"):
        config.load("/nonexistent/x.toml")


def test_every_area_default_has_a_type_and_a_reason():
    for section, values in config.defaults().items():
        if section == "checks":
            continue
        schema = config._schema(section)
        for key in values:
            default, kind, why = schema[key]
            assert why and isinstance(kind, type)
            assert default is None or config._type_ok(default, kind), (section, key)


def test_packaged_example_is_the_generated_catalogue_and_valid():
    import os

    path = os.path.join(
        conftest.REPO, "packaging", "slurmhealth.toml"
    )
    with open(path) as handle:
        text = handle.read()
    assert text == config.example_text(), "regenerate: slurmhealth config example"
    config.parse(text, path)
    for check in config.REGISTRY:
        assert f'[checks."{check}"]' in text


def test_metrics_are_off_by_default_and_the_path_is_a_string():
    assert config.defaults()["settings"]["metrics_file"] == ""
    path = "/var/lib/node_exporter/textfile/slurmhealth-{node}.prom"
    parsed = config.parse(f'[settings]\nmetrics_file = "{path}"\n', "t.toml")
    assert config.Config(parsed).for_node("gpu01")["settings"]["metrics_file"] == path
    with pytest.raises(config.ConfigError, match="t.toml:3: settings.metrics_file must be str"):
        config.parse("[settings]\n\nmetrics_file = true\n", "t.toml")
