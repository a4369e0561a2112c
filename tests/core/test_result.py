from __future__ import annotations

import pytest

from slurmhealth.core import result
from slurmhealth.core.result import Result, clean


def test_messages_become_one_safe_bounded_line():
    hostile = "GPU 3\nXid 79\x1b[31m $(reboot) " + "x" * 500
    message = Result("fail", hostile).message
    assert "\n" not in message and "\x1b" not in message
    assert len(message) <= result.MESSAGE_MAX and message.endswith("...")


def test_unknown_status_or_action_is_a_programming_error():
    with pytest.raises(ValueError):
        Result("bad", "x")
    with pytest.raises(ValueError):
        Result("ok", "x", action="explode")


def test_verdict_levels():
    ok, warn, fail, err, skip = (Result(s, s) for s in ("ok", "warn", "fail", "error", "skip"))
    assert result.verdict([ok, skip]) == "ok"
    assert result.verdict([ok, warn]) == "warn"
    assert result.verdict([warn, fail]) == "fail"
    assert result.verdict([ok, err]) == "warn"  # our bug never drains by default
    assert result.verdict([ok, err], error_fails=True) == "fail"


def test_worst_action():
    assert result.worst_action(["drain", "reboot", "reset_gpu"]) == "reboot"
    assert result.worst_action([]) == "none"


def test_a_commands_error_is_cut_at_a_whole_word():
    text = "sacctmgr: error: slurm_persist_conn_open_without_init: failed to open persistent " * 4
    cut = clean(text, 120, words=True)
    assert len(cut) <= 120 and cut.endswith("...")
    assert text.startswith(cut[:-3]) and text[len(cut) - 3] == " "  # the next character: a space
    assert clean(text, 120) == text[:117].rstrip() + "..."  # kernel lines keep every character


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((1, "GPU"), "1 GPU"),
        ((8, "GPU"), "8 GPUs"),
        ((0, "node"), "0 nodes"),
        ((1.0, "day"), "1 day"),
        ((28.0, "day"), "28 days"),
        ((1.5, "day"), "1.5 days"),
        ((1, "summary", "summaries"), "1 summary"),
        ((2, "summary", "summaries"), "2 summaries"),
        ((1, "GPU answers", "GPUs answer"), "1 GPU answers"),
        ((1024, "record", "", ","), "1,024 records"),
    ],
)
def test_counted_says_the_singular_only_for_one(args, said):
    assert result.counted(*args) == said
