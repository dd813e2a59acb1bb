"""Tasks of the workflow fault tests (``-A tests.tasks_workflow_faults:app``).

Like :mod:`tests.tasks`, the app takes namespace, queue and database from ``TASKQ_*``
variables. ``TASKQ_TEST_ORDERED_QUEUE`` names a queue this worker's app declares *ordered*
(two partitions) where the producer's app declares it plain: the configuration drift of a
rolling deploy, which no check at the producer can see. Tasks append one line per run to a
file given as an argument.
"""

from __future__ import annotations

import os
from typing import Any

from taskq import App
from tests.tasks import append_line

app = App("taskq-workflow-fault-tests")

_ORDERED = os.environ.get("TASKQ_TEST_ORDERED_QUEUE")
if _ORDERED:
    app.queue(_ORDERED, partitions=2)


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


@app.task
def big(path: str, size: int) -> str:
    """Record ``ran big`` and return ``size`` characters (too many for the next message)."""
    append_line(path, "ran", "big")
    return "x" * size

