"""node/journal.py: every action recorded in a real store, said, and kept when the store cannot
take it; what a hook's journal owns is tested through the hooks (tests/node/test_agent.py)."""

from __future__ import annotations

import time

from slurmhealth.core import store
from slurmhealth.node.journal import Journal


def _actions(conn) -> list:
    return conn.execute("SELECT node, action, reason, actor, ok, detail FROM actions").fetchall()


def test_an_action_is_recorded_with_who_acted(tmp_path):
    conn = store.connect(str(tmp_path / "node.db"))
    said: list = []
    Journal(conn, "slurmhealth lemons", said.append).note("gpu01", "drain", "lemon: 4", True)
    assert _actions(conn) == [("gpu01", "drain", "lemon: 4", "slurmhealth lemons", 1, "")]
    assert said == []  # recorded: nothing to say


def test_once_says_a_repeat_only_after_something_else_happened(tmp_path):
    conn = store.connect(str(tmp_path / "node.db"))
    journal = Journal(conn, "sweep", print)
    for _ in range(3):
        journal.note("gpu01", "drain-skipped", "lemon", True, "already out", once=True)
    assert len(_actions(conn)) == 1
    store.record_action(conn, "gpu01", "resume", "x", "admin", True, "", time.time() + 1)
    journal.note("gpu01", "drain-skipped", "lemon", True, "already out", once=True)
    assert len(_actions(conn)) == 3


def test_what_the_store_cannot_take_is_kept_and_said(tmp_path):
    """once=True over a store that fails (here closed under the sweep): not knowing whether the
    skip was said, it records it, and what the store cannot take goes to `keep`: never lost."""
    broken = store.connect(str(tmp_path / "gone.db"))
    broken.close()
    kept: list = []
    logged: list = []
    journal = Journal(broken, "sweep", logged.append, kept.append)
    journal.note("gpu01", "drain-skipped", "r", True, "d", once=True)
    assert [entry["action"][:6] for entry in kept] == [
        ["gpu01", "drain-skipped", "r", "sweep", True, "d"]
    ]
    assert isinstance(kept[0]["id"], str) and kept[0]["id"]  # replayed once, whatever happens
    assert logged and "could not record the drain-skipped" in logged[0]


def test_no_store_keeps_the_action_and_no_keeper_only_says_it(tmp_path):
    kept: list = []
    Journal(None, "slurmhealth prolog", print, kept.append).note("gpu01", "drain", "x", False)
    assert [entry["action"][:3] for entry in kept] == [["gpu01", "drain", "x"]]
    broken = store.connect(str(tmp_path / "gone.db"))
    broken.close()
    said: list = []
    Journal(broken, "sweep", said.append).note("gpu01", "drain", "x", True)
    assert len(said) == 1 and "could not record the drain" in said[0]


def test_drain_history_is_empty_and_said_when_the_store_cannot_be_read(tmp_path):
    conn = store.connect(str(tmp_path / "node.db"))
    journal = Journal(conn, "sweep", print)
    journal.note("gpu01", "drain", "GPU 3 lost", True)
    assert [action for _, action in journal.drains("gpu01")] == ["drain"]
    conn.close()
    said: list = []
    assert Journal(conn, "sweep", said.append).drains("gpu01") == []
    assert len(said) == 1 and "probation unknown" in said[0]
    assert Journal(None, "sweep", said.append).drains("gpu01") == []
