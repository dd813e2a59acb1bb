"""The answer of :mod:`taskq.states.lookup`: :class:`TaskStatus`, and what it reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from taskq.results import ResultState

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from taskq.broker.topology import Topology
    from taskq.results import ResultStore
    from taskq.settings import Settings

NO_VALUE_KEPT = "no value kept: set store_result=True on the task to keep it"


class StateSource(Protocol):
    """What a lookup reads of the app (:class:`~taskq.app.App` provides it)."""

    settings: Settings

    @property
    def engine(self) -> Engine:
        """The engine of ``database_url``."""

    @property
    def results(self) -> ResultStore:
        """The result store."""

    @property
    def topology(self) -> Topology:
        """Queue names and options."""

    def queue_names(self) -> list[str]:
        """Every work queue of the app."""


@dataclass(frozen=True)
class TaskStatus:
    """Where one task id stands, and what says so.

    Args:
        task_id: The id asked about.
        state: One of :class:`~taskq.results.ResultState`.
        summary: One line for humans ("succeeded at ... on host pid 12; no value kept ...").
        task: The registered task name, when known.
        queue: Its work queue, when known.
        attempt: Attempt number (``retries + 1``), when known.
        worker: Host and pid of the worker process that last handled it.
        started_at: When its last attempt started.
        finished_at: When it ended (success, failure, dead letter, skip).
        due_at: When it runs: the outbox row's or delayed message's eta, a retry's next run.
        dead_letter_queue: The ``Q.dlq`` holding it.
        error: The error of a failure, dead letter or retry.
        traceback: The traceback, when kept.
        result: The return value, when kept (``has_result``).
        has_result: Whether ``result`` holds a kept value.
        idempotency_key: The key, when it matters (a skipped duplicate).
        workflow_id: The workflow it belongs to.
        notes: What could not be looked at, or other caveats.
        sources: Where the answer came from (``outbox``, ``results``, ``states``, ...).
    """

    task_id: str
    state: ResultState
    summary: str
    task: str | None = None
    queue: str | None = None
    attempt: int | None = None
    worker: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    due_at: datetime | None = None
    dead_letter_queue: str | None = None
    error: str | None = None
    traceback: str | None = None
    result: Any = None
    has_result: bool = False
    idempotency_key: str | None = None
    workflow_id: str | None = None
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = field(default=())

    @property
    def is_known(self) -> bool:
        """Whether anything was found about the id."""
        return self.state is not ResultState.UNKNOWN

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``taskq inspect --json``, the dashboard's API)."""
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value is not None else None

        return {
            "task_id": self.task_id, "state": self.state.value, "summary": self.summary,
            "task": self.task, "queue": self.queue, "attempt": self.attempt,
            "worker": self.worker, "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at), "due_at": iso(self.due_at),
            "dead_letter_queue": self.dead_letter_queue, "error": self.error,
            "traceback": self.traceback,
            "result": repr(self.result) if self.has_result else None,
            "has_result": self.has_result, "idempotency_key": self.idempotency_key,
            "workflow_id": self.workflow_id, "notes": list(self.notes),
            "sources": list(self.sources),
        }
