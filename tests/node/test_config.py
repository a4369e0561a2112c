from __future__ import annotations

import conftest
import pytest

from slurmhealth.node import checks, config

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
        ("[[node]]\ngpu.count = 2\n", "t.toml:1: every [[node]] needs match"),
        (
            '[[node]]\nmatch = "gpu01"\n\n[[node]]\n[node.gpu]\ncount = 4\n',
            "t.toml:4: every [[node]] needs match",
        ),
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
    for check in checks.REGISTRY:
        assert f'[checks."{check}"]' in text


def test_metrics_are_off_by_default_and_the_path_is_a_string():
    assert config.defaults()["settings"]["metrics_file"] == ""
    path = "/var/lib/node_exporter/textfile/slurmhealth-{node}.prom"
    parsed = config.parse(f'[settings]\nmetrics_file = "{path}"\n', "t.toml")
    assert config.Config(parsed).for_node("gpu01")["settings"]["metrics_file"] == path
    with pytest.raises(config.ConfigError, match="t.toml:3: settings.metrics_file must be str"):
        config.parse("[settings]\n\nmetrics_file = true\n", "t.toml")


# --- values out of bounds: rejected by validate and check, their defaults in the hooks -------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[settings]\ndeadline = 0\n", "t.toml:2: settings.deadline: must be > 0"),
        ("[settings]\ndeadline = -1.5\n", "t.toml:2: settings.deadline: must be > 0"),
        ("[settings]\ndeadline = nan\n", "t.toml:2: settings.deadline: must be > 0"),
        ("[settings]\ndeadline = inf\n", "t.toml:2: settings.deadline: must be > 0"),
        ("[settings]\ndeadline = 1e12\n", "settings.deadline: must be > 0 and at most 86400"),
        ("[settings]\ntimeout_gpu = 0\n", "t.toml:2: settings.timeout_gpu: must be > 0"),
        ("[settings]\ntimeout_kmsg = -1\n", "t.toml:2: settings.timeout_kmsg: must be > 0"),
        ("[settings]\ndrain_timeout = 0\n", "t.toml:2: settings.drain_timeout: must be > 0"),
        ("[settings]\nresume_after = -1\n", "t.toml:2: settings.resume_after: must be >= 0"),
        ("[settings]\nbreaker_share = 1.5\n", "t.toml:2: settings.breaker_share: must be a share"),
        ("[settings]\nbreaker_share = nan\n", "t.toml:2: settings.breaker_share: must be a share"),
        ("[settings]\nbreaker_share = -0.1\n", "settings.breaker_share: must be a share"),
        ("[settings]\nbreaker_window = 0\n", "t.toml:2: settings.breaker_window: must be > 0"),
        ("[settings]\nprobation_days = -1\n", "t.toml:2: settings.probation_days: must be >= 0"),
        ("[gpu]\ncount = -3\n", "t.toml:2: gpu.count: must be >= 0, not -3"),
        ("[gpu]\npcie_width = -16\n", "t.toml:2: gpu.pcie_width: must be >= 0"),
        ("[gpu]\nclock_event_mask = -1\n", "t.toml:2: gpu.clock_event_mask: must be a 64-bit"),
        ("[gpu]\nsbe_warn = 0\n", "t.toml:2: gpu.sbe_warn: must be >= 1"),
        ("[nvlink]\nlinks_per_gpu = -18\n", "t.toml:2: nvlink.links_per_gpu: must be >= 0"),
        ("[nvlink]\ncrc_fail = 0\n", "t.toml:2: nvlink.crc_fail: must be >= 1"),
        ("[ib]\nrate = -400\n", "t.toml:2: ib.rate: must be >= 0"),
        ("[ib]\nsymbol_error_fail = 0\n", "t.toml:2: ib.symbol_error_fail: must be >= 1"),
        ("[ib]\nlink_downed_warn = -1\n", "t.toml:2: ib.link_downed_warn: must be >= 1"),
        ('[ib]\ndevices = ["mlx5_0", 3]\n', "t.toml:2: ib.devices: must be a list of HCA"),
        ('[ib]\ndevices = [""]\n', "t.toml:2: ib.devices: must be a list of HCA"),
        ('[ib]\nports = ["mlx5_0"]\n', "t.toml:2: ib.ports: must be a list of ports"),
        ("[ib]\nports = [1]\n", "t.toml:2: ib.ports: must be a list of ports"),
        ('[xid]\napp = [13, "x"]\n', "t.toml:2: xid.app: must be a list of Xid numbers"),
        ("[xid]\napp = [-1]\n", "t.toml:2: xid.app: must be a list of Xid numbers"),
        ("[xid]\napp = [1.5]\n", "t.toml:2: xid.app: must be a list of Xid numbers"),
        ('[xid]\nseverity = { 94 = "wrn" }\n', "t.toml:2: xid.severity: must map Xid numbers"),
        ('[xid]\nseverity = { x = "warn" }\n', "t.toml:2: xid.severity: must map Xid numbers"),
        ('[xid]\nunknown = "loud"\n', "t.toml:2: xid.unknown: must be warn, fail or ignore"),
        ('[settings]\nremediate = "yes"\n', "t.toml:2: settings.remediate: must be one of off"),
        ("[settings]\nremediate_max = 0\n", "t.toml:2: settings.remediate_max: must be 1 to"),
        ('[settings]\nremediate_window = "2y"\n', "settings.remediate_window: not a duration"),
        ("[settings]\nremediate_window = 0\n", "settings.remediate_window: must be > 0"),
        ("[xid]\ndedup_s = -60\n", "t.toml:2: xid.dedup_s: must be >= 0"),
        # [[node]] blocks are validated alike; the line is the block's, not the top-level key's
        (
            '[settings]\ndeadline = 8\n\n[[node]]\nmatch = "gpu01"\nsettings.deadline = 0\n',
            "t.toml:6: settings.deadline: must be > 0",
        ),
        (
            '[gpu]\ncount = 8\n\n[[node]]\nmatch = "gpu01"\ngpu.count = -3\n',
            "t.toml:6: gpu.count: must be >= 0, not -3",
        ),
    ],
)
def test_values_out_of_bounds_are_errors_with_file_and_line(text, expected):
    with pytest.raises(config.ConfigError) as err:
        config.parse(text, "t.toml")
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "text",
    [
        "[settings]\ndeadline = 0.5\ntimeout_gpu = 86400\n",
        "[settings]\nbreaker_share = 0\nresume_after = 0\nprobation_days = 0\n",
        "[settings]\nbreaker_share = 1\n",
        "[gpu]\ncount = 0\nclock_event_mask = 0\nsbe_warn = 1\n",
        '[ib]\nports = ["mlx5_0:1", "ibp12s0:2"]\ndevices = ["mlx5_0"]\nsymbol_error_warn = 1\n',
        '[xid]\napp = [13, "79"]\nseverity = { 94 = "warn", 8 = "ignore", 31 = "app" }\n',
        '[xid]\nunknown = "ignore"\ndedup_s = 0\n',
        '[settings]\nremediate = "reboot"\nremediate_max = 100\nremediate_window = "366d"\n',
    ],
)
def test_values_at_their_bounds_are_fine(text):
    config.parse(text, "t.toml")


def test_every_numeric_and_list_key_has_bounds_that_its_default_meets():
    keys = {"settings": config.SETTINGS, **{a: m.DEFAULTS for a, m in checks.AREAS.items()}}
    for section, schema in keys.items():
        for key, (default, kind, _why) in schema.items():
            name = f"{section}.{key}"
            if kind in (int, float, list, dict):
                assert name in config.BOUNDS, f"{name}: add its bounds to config.BOUNDS"
            if default is not None:
                assert config.value_problem(section, key, default) is None, name
    for name in config.BOUNDS:
        section, key = name.split(".", 1)
        assert key in config._schema(section), f"{name} bounds an unknown key"


BAD_VALUES = """
[settings]
deadline = 0
gpu_source = "/snap/healthy.json"
breaker_share = 1.5

[gpu]
count = 8

[[node]]
match = "gpu[01-16]"
gpu.count = -3
ib.rate = 400
"""


def test_unusable_values_leave_the_rest_of_the_config_usable_with_their_defaults():
    with pytest.raises(config.ConfigError) as err:
        config.parse(BAD_VALUES, "t.toml")
    assert len(str(err.value).splitlines()) == 3
    effective = err.value.usable.for_node("gpu07")
    settings = effective["settings"]
    assert settings["deadline"] == config.SETTINGS["deadline"][0]
    assert settings["breaker_share"] == config.SETTINGS["breaker_share"][0]
    assert settings["gpu_source"] == "/snap/healthy.json"  # the usable values stay
    assert effective["gpu"]["count"] == 8  # the block's -3 is unset: the top-level 8 applies
    assert effective["ib"]["rate"] == 400
    assert err.value.usable.path == "t.toml"


@pytest.mark.parametrize(
    "text",
    [
        "[settings]\ndeadline = 0\n\n[gpux]\n",  # an unknown section besides
        "[settings]\ndeadline = 0\ndeadlines = 1\n",  # an unknown key besides
        '[settings]\ndeadline = 0\n\n[[node]]\nmatch = "gpu[01-"\n',  # a bad pattern besides
        "[settings\n",  # not TOML
    ],
)
def test_a_config_wrong_beyond_its_values_has_nothing_usable(text):
    with pytest.raises(config.ConfigError) as err:
        config.parse(text, "t.toml")
    assert err.value.usable is None


def test_load_rejects_an_unusable_value_and_offers_the_usable_rest(tmp_path):
    path = tmp_path / "slurmhealth.toml"
    path.write_text("[settings]\ndeadline = -1\ntimeout_ib = 1.5\n")
    with pytest.raises(config.ConfigError, match=f"{path}:2: settings.deadline: must be > 0"):
        config.load(str(path))
    try:
        config.load(str(path))
    except config.ConfigError as exc:
        effective = exc.usable.for_node("gpu01")
    assert effective["settings"]["deadline"] == 10.0
    assert effective["settings"]["timeout_ib"] == 1.5


def test_node_entries_that_are_not_tables_are_an_error_not_a_crash():
    with pytest.raises(config.ConfigError, match="node must be an array of tables"):
        config.parse("node = [1, 2]\n", "t.toml")


# --- [[node]] patterns: validated and matched without expanding them ------------------------

HUGE_PATTERNS = """
[[node]]
match = "gpu[0-99999][0-99999]"
gpu.count = 4

[[node]]
match = "r[00-99]n[0000-9999],!r07n0001"
gpu.count = 2
"""


def _no_expand(term):
    raise AssertionError(f"hostlist.expand({term!r}) called")


def test_huge_node_patterns_validate_and_match_without_expanding(monkeypatch):
    monkeypatch.setattr(config.hostlist, "expand", _no_expand)
    cfg = config.Config(config.parse(HUGE_PATTERNS, "t.toml"))
    assert cfg.for_node("gpu1234567890")["gpu"]["count"] == 4
    assert cfg.for_node("r07n0420")["gpu"]["count"] == 2
    assert cfg.for_node("r07n0001")["gpu"]["count"] is None
    assert cfg.for_node("r7n0420")["gpu"]["count"] is None
    assert cfg.for_node("login1")["gpu"]["count"] is None


def test_config_validate_accepts_huge_patterns_and_rejects_bad_values(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from slurmhealth import cli

    monkeypatch.setattr(config.hostlist, "expand", _no_expand)
    path = tmp_path / "slurmhealth.toml"
    path.write_text(HUGE_PATTERNS)
    result = CliRunner().invoke(cli.cli, ["config", "validate", "--config", str(path)])
    assert result.exit_code == 0, result.output
    path.write_text(HUGE_PATTERNS + "settings.deadline = 0\nsettings.breaker_share = nan\n")
    result = CliRunner().invoke(cli.cli, ["config", "validate", "--config", str(path)])
    assert result.exit_code == 2
    assert f"{path}:9: settings.deadline: must be > 0" in result.output
    assert f"{path}:10: settings.breaker_share: must be a share" in result.output


def test_a_config_error_is_printable_whatever_the_file_names(tmp_path):
    """A key is the file's own text (TOML escapes allow ESC, BEL, CR, bidi overrides): the
    error that names it reaches a terminal, slurmd's log and syslog as one printable line."""
    path = tmp_path / "c.toml"
    path.write_text('[gpu]\n"bad\\u001b[31m\\u0007\\r\\u202e" = 1\n[settings]\nbogus = 1\n')
    with pytest.raises(config.ConfigError) as caught:
        config.load(str(path))
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and all(line.isprintable() for line in lines), lines
    assert "unknown key gpu.bad?[31m?" in lines[0] and "unknown key settings.bogus" in lines[1]


# ---------------------------------------------------------------- times: one grammar


DURATION_FILE = """
[settings]
deadline = "15s"
breaker_window = "1h"
probation_days = "36h"
drain_timeout = 2
[xid]
burst_h = "2h"
repeat_days = "2w"
dedup_s = 30
[nvlink]
crc_min_interval_s = "1m"
[[node]]
match = "gpu01"
settings.deadline = "1m"
"""


def test_a_time_is_a_duration_or_a_number_in_the_unit_its_key_names():
    cfg = config.Config(config.parse(DURATION_FILE, "t.toml"))
    gpu02 = cfg.for_node("gpu02")
    assert gpu02["settings"]["deadline"] == 15
    assert gpu02["settings"]["breaker_window"] == 3600
    assert gpu02["settings"]["probation_days"] == 1.5
    assert gpu02["settings"]["drain_timeout"] == 2  # an old file's bare seconds still work
    assert (gpu02["xid"]["burst_h"], gpu02["xid"]["repeat_days"]) == (2, 14)
    assert isinstance(gpu02["xid"]["burst_h"], int)
    assert gpu02["nvlink"]["crc_min_interval_s"] == 60
    assert cfg.for_node("gpu01")["settings"]["deadline"] == 60


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[settings]\ndeadline = "2x"\n', "t.toml:2: settings.deadline: not a duration: '2x'"),
        ('[settings]\ndeadline = "10"\n', "settings.deadline: not a duration: '10' has no unit"),
        ('[settings]\ndeadline = "2d"\n', "settings.deadline: must be > 0 and at most 86400"),
        ('[xid]\nburst_h = "90m"\n', "t.toml:2: xid.burst_h: '90m' is not a whole number of hours"),
        ('[xid]\nrepeat_days = "1d12h"\n', "xid.repeat_days: '1d12h' is not a whole number of"),
        ('[settings]\nresume_after = "3h"\n', "settings.resume_after must be int, not '3h'"),
    ],
)
def test_a_time_that_is_no_duration_is_named_with_its_line(text, message):
    with pytest.raises(config.ConfigError) as caught:
        config.parse(text, "t.toml")
    assert message in str(caught.value)


def test_config_validate_and_the_hook_read_durations_alike(tmp_path):
    path = tmp_path / "slurmhealth.toml"
    path.write_text(DURATION_FILE)
    path.chmod(0o644)
    proc = conftest.run_cli("config", "validate", str(path))
    assert (proc.returncode, proc.stdout.strip()) == (0, f"{path}: ok"), proc.stderr
    shown = conftest.run_cli("config", "show", "--config", str(path), "--node", "gpu01")
    assert '"deadline": 60.0' in shown.stdout and '"repeat_days": 14' in shown.stdout


def test_a_default_config_a_user_may_not_see_is_said_never_taken_for_none(public_dir):
    """The default config in a root-only directory (0700): a user's `check` and `config
    validate` say they cannot read it and exit 2, never judge by built-in defaults as if there
    were no config."""
    etc = public_dir / "etc"
    etc.mkdir(mode=0o700)
    (etc / "slurmhealth.toml").write_text("[gpu]\ncount = 8\n")
    default = str(etc / "slurmhealth.toml")
    before = f"from slurmhealth.node import config\nconfig.DEFAULT_PATH = {default!r}"
    kmsg = public_dir / "kmsg"
    kmsg.write_text("")
    replay = ("--no-db", "--gpu-source", conftest.snapshot_path("healthy"), "--kmsg", str(kmsg))
    said = f"{etc}/slurmhealth.toml: cannot read config (permission denied): run as root"
    check = conftest.run_as_nobody("check", *replay, before=before)
    assert (check.returncode, check.stdout) == (2, ""), check.stdout
    assert check.stderr == f"slurmhealth: error: {said}\n"
    validate = conftest.run_as_nobody("config", "validate", before=before)
    assert (validate.returncode, validate.stderr) == (2, f"{said}\n"), validate.stdout
    # a config file the user may see but not read says the same
    (etc / "slurmhealth.toml").chmod(0o600)
    etc.chmod(0o755)
    named = conftest.run_as_nobody("check", *replay, "--config", str(etc / "slurmhealth.toml"))
    assert (named.returncode, named.stderr) == (2, f"slurmhealth: error: {said}\n")
    # root reads it and judges by it
    root = conftest.run_cli("check", *replay, "--config", str(etc / "slurmhealth.toml"))
    assert root.returncode == 0, root.stderr
