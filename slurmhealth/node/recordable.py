"""What recording a run reads of it: its rows for the store and the spool (node/agent.py
record) and its series for the metrics file (node/metrics.py). A check run (runner.Run) and a
diagnosis (diag/run.Diagnosis, which holds its check run rather than being one) both carry
these, so both take the one path into the store, the spool and the metrics file.

Read by the type checker only: the modules that name it import it under TYPE_CHECKING (the hook
path stays without `typing`).
"""

from __future__ import annotations

from typing import Any, Protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slurmhealth.core.result import Result
    from slurmhealth.core.store import RunRecords
    from slurmhealth.node.runner import Gathered


class Recordable(Protocol):
    node: str
    phase: str
    verdict: str
    started: float  # epoch seconds
    duration: float  # seconds
    results: list[Result]
    sources: dict[str, Gathered]  # {source: what reading it gave}
    baselines: dict[str, Any]  # {area: baseline}: the kernel log's position, for metrics
    events: list[dict[str, Any]]  # Xids and other events, counted in the metrics file
    readings: dict[str, Any]  # {"<device>|<counter>": value}

    def records(self, job_id: str | None = None) -> RunRecords:
        """The run as core/store.record_run writes it."""
        ...
