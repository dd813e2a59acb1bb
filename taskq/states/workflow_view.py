"""A workflow as JSON: what ``taskq inspect WORKFLOW_ID --json`` and the dashboard show."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taskq.workflows.store import MemberRecord, WorkflowRecord, read_members, read_workflow

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def workflow_dict(engine: Engine, workflow_id: str) -> dict[str, Any] | None:
    """The workflow ``workflow_id`` with its members (``None``: no such workflow)."""
    record = read_workflow(engine, workflow_id)
    return None if record is None else as_dict(record, read_members(engine, record.id))


def as_dict(record: WorkflowRecord, members: list[MemberRecord]) -> dict[str, Any]:
    """JSON-ready fields of ``record`` and its ``members``."""

    def iso(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "workflow_id": record.id, "kind": record.kind, "state": record.state.value,
        "step": record.step + 1, "steps": record.steps, "remaining": record.remaining,
        "result": repr(record.result) if record.result is not None else None,
        "error": record.error, "failed_task_id": record.failed_task_id,
        "failed_task": record.failed_task, "created_at": iso(record.created_at),
        "finished_at": iso(record.finished_at),
        "members": [
            {"task_id": m.task_id, "task": m.task, "queue": m.queue, "step": m.step + 1,
             "position": m.position + 1, "state": m.state.value,
             "result": repr(m.result) if m.result is not None else None, "error": m.error,
             "finished_at": iso(m.finished_at)}
            for m in members
        ],
    }
