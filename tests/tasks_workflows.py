"""Tasks of the workflow tests (``-A tests.tasks_workflows:app``).

Like :mod:`tests.tasks`, the app takes namespace, queue and databases from ``TASKQ_*``
variables; tasks that prove a run append a line to a file given as an argument, and the
callbacks whose effect must land once write it in their own transaction
(``transactional=True``) into ``wf_effects``.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from taskq import App, Reject
from tests.tasks import append_line, read_lines

app = App("taskq-workflow-tests")

effects = sa.Table(
    "wf_effects",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("what", sa.String(64), nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("total", sa.BigInteger, nullable=False),
)


@app.task
def add(x: int, y: int) -> int:
    """``x + y``."""
    return x + y


@app.task
def mul(x: int, y: int) -> int:
    """``x * y``."""
    return x * y


@app.task
def tsum(values: list[int]) -> int:
    """The sum of a group's results."""
    return sum(values)


@app.task
def square(x: int, path: str = "", pause_s: float = 0.0) -> int:
    """``x * x``, recording ``ran square <x>`` when ``path`` is given."""
    if pause_s:
        time.sleep(pause_s)
    if path:
        append_line(path, "ran", "square", x)
    return x * x


@app.task
def noop() -> None:
    """Nothing (benchmarks)."""


@app.task
def noop_sum(values: list[Any]) -> int:
    """How many results arrived (benchmarks)."""
    return len(values)


@app.task
def step(value: int, path: str, tag: str) -> int:
    """Record ``ran <tag>`` and pass ``value + 1`` on."""
    append_line(path, "ran", tag)
    return value + 1


@app.task(max_retries=0)
def boom(value: Any, path: str, tag: str) -> None:
    """Record ``ran <tag>`` and raise (no retries)."""
    append_line(path, "ran", tag)
    raise ValueError(f"boom in {tag}")


@app.task
def errback(workflow_id: str, failed_task_id: str, error: str, path: str) -> None:
    """The link_error callback: record ``errback <workflow> <failed task> <error type>``."""
    append_line(path, "errback", workflow_id, failed_task_id, error.split(":")[0])


@app.task(transactional=True)
def total_once(values: list[int], path: str, *, session: Any) -> int:
    """Chord callback: one ``wf_effects`` row per run that commits; a line per attempt."""
    append_line(path, "callback", len(values))
    session.execute(effects.insert().values(what="chord", count=len(values),
                                            total=sum(values)))
    return sum(values)


@app.task(autoretry_for=(ConnectionError,), retry_backoff=0.1, retry_jitter=False,
          max_retries=5)
def flaky_step(value: int, path: str, failures: int) -> int:
    """Raise ConnectionError on the first ``failures`` runs (retried), then ``value + 1``."""
    append_line(path, "ran", "flaky")
    if sum(1 for line in read_lines(path) if line[:2] == ["ran", "flaky"]) <= failures:
        raise ConnectionError("not yet")
    return value + 1


@app.task
def refuse(value: Any, path: str) -> None:
    """Record ``ran refuse`` and reject the message (dead-lettered, never retried)."""
    append_line(path, "ran", "refuse")
    raise Reject("refused on purpose")


@app.task(time_limit_s=1.0, max_retries=0)
def overrun(value: Any, path: str) -> None:
    """Record ``ran overrun`` and outlive the hard time limit."""
    append_line(path, "ran", "overrun")
    time.sleep(30)
