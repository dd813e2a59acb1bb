"""``taskq inspect ID`` of a workflow (or of one of its members): its members and states."""

from __future__ import annotations

import json
from typing import Any

import click

from taskq.states.workflow_view import as_dict as _as_dict
from taskq.workflows.store import (
    WorkflowRecord,
    read_members,
    read_workflow,
    workflow_of_member,
)


def show_workflow(app: Any, some_id: str, as_json: bool) -> bool:
    """Print the workflow ``some_id`` is (or is a member of); ``False`` when neither."""
    engine = app.engine
    record = read_workflow(engine, some_id)
    if record is None:
        owner = workflow_of_member(engine, some_id)
        record = read_workflow(engine, owner) if owner is not None else None
    if record is None:
        return False
    members = read_members(engine, record.id)
    if as_json:
        click.echo(json.dumps(_as_dict(record, members), sort_keys=True))
        return True
    if record.id != some_id:
        click.echo(f"{some_id} is a member of {record.kind} {record.id}")
    for line in _summary(record):
        click.echo(line)
    click.echo(f"{'step':>4} {'#':>5}  {'state':<9} {'task_id':<36}  task / result or error")
    for m in members:
        shown = m.error if m.error else (repr(m.result) if m.result is not None else "")
        mark = "*" if m.task_id == some_id else " "
        click.echo(f"{m.step + 1:>4} {m.position + 1:>5}{mark} {m.state.value:<9} "
                   f"{m.task_id:<36}  {m.task}  {_short(shown)}")
    return True


def _summary(record: WorkflowRecord) -> list[str]:
    lines = [f"{'workflow:':<12} {record.id} ({record.kind})",
             f"{'state:':<12} {record.state.value}",
             f"{'step:':<12} {record.step + 1} of {record.steps}"
             + (f", waiting for {record.remaining} member(s)" if not record.state.is_ready
                else "")]
    if record.error:
        lines.append(f"{'failed:':<12} {record.failed_task} ({record.failed_task_id}): "
                     f"{record.error}")
    elif record.state.is_ready:
        lines.append(f"{'result:':<12} {_short(repr(record.result))}")
    for name, value in (("created_at", record.created_at), ("finished_at", record.finished_at)):
        if value is not None:
            lines.append(f"{name + ':':<12} {value.isoformat()}")
    return lines


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
