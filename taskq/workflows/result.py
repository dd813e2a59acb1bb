"""WorkflowResult: the handle a chain, group or chord returns when it is started.

``get()`` waits for the workflow row to reach a final state and returns the result of its
last step: a chain's last task's value, a group's list of values in member order, a chord's
callback's value. A workflow that failed raises :class:`~taskq.errors.TaskFailed` naming the
member that was dead-lettered and its error.
"""

from __future__ import annotations

import time
from typing import Any

from taskq.errors import ResultTimeout, TaskFailed
from taskq.workflows.messages import WorkflowApp
from taskq.workflows.store import (
    MemberRecord,
    WorkflowRecord,
    WorkflowState,
    read_members,
    read_workflow,
)


class WorkflowResult:
    """A handle on one started workflow.

    Args:
        workflow_id: The workflow id (``taskq inspect ID`` shows it).
        kind: ``chain``, ``group`` or ``chord``.
        app: The app whose database holds the workflow tables.
    """

    __slots__ = ("id", "kind", "app")

    def __init__(self, workflow_id: str, *, kind: str, app: WorkflowApp) -> None:
        self.id = workflow_id
        self.kind = kind
        self.app = app

    def __repr__(self) -> str:
        return f"<WorkflowResult {self.kind} {self.id}>"

    def record(self) -> WorkflowRecord | None:
        """The workflow row, or ``None`` before its transaction committed (or if it never
        did, or was pruned)."""
        return read_workflow(self.app.engine, self.id)

    def members(self) -> list[MemberRecord]:
        """Every member in step and member order, with its state and result."""
        return read_members(self.app.engine, self.id)

    @property
    def state(self) -> WorkflowState:
        """``PENDING`` (no row), ``RUNNING``, ``SUCCESS`` or ``FAILURE``."""
        record = self.record()
        return record.state if record is not None else WorkflowState.PENDING

    def ready(self) -> bool:
        """Whether the workflow finished (succeeded or failed)."""
        return self.state.is_ready

    def get(self, timeout_s: float | None = None, *, interval_s: float = 0.1) -> Any:
        """Wait for the workflow and return the result of its last step.

        Args:
            timeout_s: Give up after this many seconds (``None``: wait forever).
            interval_s: How often this handle reads the workflow row.

        Raises:
            TaskFailed: a member failed (dead-lettered, or its message could not be
                enqueued); names it and its error.
            ResultTimeout: the workflow did not finish within ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            record = self.record()
            if record is not None and record.state.is_ready:
                return self._outcome(record)
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timeout(record, timeout_s)
            time.sleep(interval_s)

    def _outcome(self, record: WorkflowRecord) -> Any:
        if record.state is WorkflowState.SUCCESS:
            return record.result
        exc_type, _, message = (record.error or "").partition(": ")
        raise TaskFailed(
            f"{record.kind} {record.id} FAILURE: member {record.failed_task} "
            f"({record.failed_task_id}) failed: {record.error}; its later steps "
            "never ran (taskq inspect shows every member)",
            task_id=record.failed_task_id, task=record.failed_task, state=record.state.value,
            exc_type=exc_type, error=message, remote_traceback=None, workflow_id=record.id,
        )

    def _timeout(self, record: WorkflowRecord | None, timeout_s: float | None) -> ResultTimeout:
        if record is None:
            where = ("no workflow row: the transaction that started it has not committed "
                     "(or rolled back)")
        else:
            where = (f"state {record.state.value}, step {record.step + 1} of {record.steps} "
                     f"waits for {record.remaining} member(s)")
        return ResultTimeout(
            f"{self.kind} {self.id} has not finished after {timeout_s:g}s ({where}); are "
            "workers consuming its queues and is a relay running (a worker runs one unless "
            "--no-relay)?",
            task_id=self.id, task=self.kind, queue=None,
        )
