"""App of the ordered-queue benchmark: ``taskq worker -A benchmarks._apps.ordered_app:app``.

Configured by ``TASKQ_NAMESPACE``, ``TASKQ_DEFAULT_QUEUE`` and ``TASKQ_BROKER_URL``; the
ordered queue is ``BENCH_ORDERED_QUEUE`` with ``BENCH_PARTITIONS`` partitions (default 16).
Both tasks are no-ops with ``idempotent=False``: the figures are the queue's own cost.
"""

from __future__ import annotations

import os

from taskq import App

ORDERED_QUEUE = os.environ.get("BENCH_ORDERED_QUEUE", "bench-ordered")
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "16"))

app = App("bench-ordered")
app.queue(ORDERED_QUEUE, partitions=PARTITIONS)


@app.task(name="bench.ordered_noop", queue=ORDERED_QUEUE, ordering_key="key", idempotent=False)
def ordered_noop(key: str) -> None:
    """Do nothing, in order per key."""


@app.task(name="bench.noop", idempotent=False)
def noop(key: str) -> None:
    """Do nothing, on the unordered default queue."""
