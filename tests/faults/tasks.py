"""Tasks run by the fault suite's workers (``-A tests.faults.tasks:app``).

The app takes broker, database, namespace and queue from ``TASKQ_*`` variables, which each
scenario sets for its own processes. Two records tell what happened to a task id:

- an *execution*: one line ``exec <task id> <pid>`` appended (``O_APPEND``, one short write:
  atomic between processes) to the file named by ``TASKQ_FAULT_EXECUTIONS`` when the body
  starts, outside any transaction: it survives a rollback or a kill, so it counts runs;
- an *effect*: one row in ``fault_effects`` written by a ``transactional=True`` task in its
  session, committed with its idempotency key or not at all. The table has no unique key on
  purpose: a second row for an id is a duplicated effect, which the suite counts.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import sqlalchemy as sa

from taskq import App

app = App("taskq-faults")

EXECUTIONS_ENV = "TASKQ_FAULT_EXECUTIONS"

effects_metadata = sa.MetaData()
effects = sa.Table(
    "fault_effects",
    effects_metadata,
    sa.Column("task_id", sa.String(64), nullable=False),  # no unique key: duplicates show
    sa.Column("pid", sa.Integer, nullable=False),
)


def record_execution(task: Any, kind: str = "exec") -> str:
    """Append ``<kind> <task id> <pid>`` to the executions file; return the task id."""
    task_id: str = task.request.task_id  # the public API (taskq.Task.request)
    assert task_id, f"{task.name} ran outside a worker"
    line = f"{kind} {task_id} {os.getpid()}\n".encode()
    fd = os.open(os.environ[EXECUTIONS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return task_id


@app.task(transactional=True)
def work(duration_ms: int, *, session: Any) -> None:
    """Healthy work: record the run, take ``duration_ms``, write one effect row."""
    task_id = record_execution(work)
    if duration_ms:
        time.sleep(duration_ms / 1000)
    session.execute(effects.insert().values(task_id=task_id, pid=os.getpid()))


# -- poison (scenario 7): each one is dead-lettered after a bounded number of attempts -------


@app.task(idempotent=False)
def exits() -> None:
    """Kill the process without any cleanup."""
    record_execution(exits, "poison")
    os._exit(3)


@app.task(idempotent=False)
def segfaults() -> None:
    """Dereference NULL: the process dies of SIGSEGV."""
    record_execution(segfaults, "poison")
    ctypes.string_at(0)


@app.task(idempotent=False, time_limit_s=1.0, max_retries=1, retry_backoff=0.1)
def hangs() -> None:
    """Run far past the 1 s hard limit (one retry, then dead-lettered)."""
    record_execution(hangs, "poison")
    time.sleep(120)


@app.task(idempotent=False)
def raises() -> None:
    """Raise (retries are opt-in: dead-lettered at once)."""
    record_execution(raises, "poison")
    raise LookupError("the order does not exist")


POISON = {"exits": exits, "segfaults": segfaults, "hangs": hangs, "raises": raises}
