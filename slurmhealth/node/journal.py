"""Where what a run does to a node is written, said, and kept when it cannot be written.

Every path that acts on a node (a hook draining its own node, the lemon sweep, a diagnose job)
records each action in a store, says it in its log, and hands what the store could not take to
a keeper (a spool beside the node store, replayed by a later run): nothing is lost. A Journal
is those three together, with who acts; node/actions.py takes one instead of a connection, a
logger, an actor and a keeper apart. The hooks use node/agent.py's HookJournal, which owns the
rest of a hook's run besides (its store file and spool, side state and deadline).

Light: no store is imported until an action is recorded (the hooks' healthy path records none).
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    import sqlite3
    from typing import Any, Callable

    Say = Callable[[str], None]
    Keep = Callable[[dict[str, Any]], None]


class Journal:
    """conn: the store (None when it cannot be used); actor: who acts, as recorded
    (`slurmhealth prolog`, `slurmhealth lemons`); log: one line said; keep: where an action the
    store could not take goes (None: said only)."""

    def __init__(
        self, conn: sqlite3.Connection | None, actor: str, log: Say, keep: Keep | None = None
    ) -> None:
        self.conn = conn
        self.actor = actor
        self.log = log
        self.keeper = keep

    def say(self, text: str) -> None:
        self.log(text)

    def keep(self, entry: dict[str, Any]) -> None:
        if self.keeper is not None:
            self.keeper(entry)

    def note(
        self, node: str, action: str, why: str, ok: bool, detail: str = "", once: bool = False
    ) -> None:
        """Record an action; if the store cannot take it, keep it (its own id: a replay that is
        cut short and replayed again writes it once). `once`: not when the node's latest action
        is this very one (a sweep saying again, each hour, what it already said: the first says
        it, and anything that happens between makes it new)."""
        from slurmhealth.core import store  # noqa: PLC0415 - only when there is an action

        when = time.time()
        conn = self.conn
        if once and conn is not None:
            try:
                latest = store.newest_action(conn, node)
                if latest == (action, why, self.actor, ok, detail):
                    return
            except store.StoreError:
                pass  # unknown: record it
        if conn is not None:
            try:
                store.record_action(conn, node, action, why, self.actor, ok, detail, when)
                return
            except store.StoreError as exc:
                self.say(f"could not record the {action}: {exc}")
        entry = {"action": [node, action, why, self.actor, ok, detail, when], "id": store.new_id()}
        self.keep(entry)

    def drains(self, node: str) -> list[tuple[float, str]]:
        """Our drains and resumes of the node (for probation); [] when the store cannot say:
        a drain never depends on whether the store could be read."""
        if self.conn is None:
            return []
        from slurmhealth.core import store  # noqa: PLC0415

        try:
            return store.drain_history(self.conn, node)
        except Exception as exc:
            self.say(f"could not read the node's drain history, probation unknown: {exc}")
            return []
