"""Tasks of the broker-upgrade tests (``-A tests.upgrade_tasks:app``): every kind of queue.

The app takes broker, database and namespace from ``TASKQ_*`` variables, like
:mod:`tests.tasks`, and configures one queue of each kind under its namespace (:func:`queues`):
the default classic queue, a classic queue with priorities, a quorum queue and an ordered
queue of 4 partitions. Its delays use the classic tiers (the default where the broker has no
delayed-message plugin: 4.3 never has it). Tasks append ``ran <tag> <pid>`` to a file.
"""

from __future__ import annotations

import os

from taskq import App
from tests.tasks import append_line

NAMESPACE = os.environ.get("TASKQ_NAMESPACE", "upgrade-tests")
PARTITIONS = 4


def queues(namespace: str) -> dict[str, str]:
    """The queue of each kind, by kind: ``default``, ``priority``, ``quorum``, ``ordered``."""
    return {kind: f"{namespace}.{kind}" for kind in ("default", "priority", "quorum", "ordered")}


def configure(app: App, namespace: str) -> None:
    """Declare the queue kinds of :func:`queues` on ``app`` (its default queue is ``default``)."""
    names = queues(namespace)
    app.queue(names["priority"], max_priority=10)
    app.queue(names["quorum"], type="quorum")
    app.queue(names["ordered"], partitions=PARTITIONS)


app = App("taskq-upgrade-tests", delay_backend="tiers")
configure(app, NAMESPACE)


@app.task(idempotent=False)
def record(path: str, tag: str = "-") -> None:
    """Record one run: ``ran <tag> <pid>``."""
    append_line(path, "ran", tag)


@app.task(idempotent=False, ordering_key="key")
def record_ordered(path: str, key: str, tag: str = "-") -> None:
    """Record one run of an ordered task: ``ran <tag> <pid>``."""
    append_line(path, "ran", tag)
