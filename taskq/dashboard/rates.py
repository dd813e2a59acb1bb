"""Rates the dashboard shows, from the broker's statistics or successive observations.

RabbitMQ counts publishes and acks per queue only in its management plugin
(``message_stats``). When ``taskq status`` reads the management API, the dashboard shows:

* ``published_per_s`` and ``acked_per_s``: the broker's own rates (averaged over its
  statistics interval, 5 s by default), for every publisher and consumer of the queue.

Without the plugin, it derives what it honestly can:

* ``ready_change_per_s``: the change of the queue's ready count between two observations
  at least :data:`MIN_INTERVAL_S` apart (positive: it grows). Always available after the
  second observation.
* ``finished_per_s``: tasks this worker's processes finished (succeeded, retried,
  dead-lettered or skipped as duplicates: each one an ack) per second, from the worker's
  Prometheus counters. Only when the dashboard runs inside ``taskq worker`` with
  ``--metrics-port`` (the counters exist only then), and only this worker's processes. It
  stands in for ``acked_per_s`` (``acked_source`` says which one it is).

Anything else is ``None`` with a reason in ``notes``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# Observations closer together than this are not used for a rate (noise).
MIN_INTERVAL_S = 1.0

PUBLISH_NOTE = (
    "publish and ack counts are kept only by RabbitMQ's management plugin (message_stats): "
    "enable rabbitmq_management for published/s and every consumer's acked/s"
)
FINISHED_NOTE = (
    "tasks finished per second come from the worker's metrics: serve the dashboard from "
    "`taskq worker --dashboard-port N --metrics-port M` to see them"
)
#: The same, for a dashboard a worker serves already: only its metrics are missing.
METRICS_NOTE = (
    "tasks finished per second come from this worker's metrics, which it does not collect: "
    "start it with --metrics-port M as well"
)


@dataclass(frozen=True)
class _Sample:
    at: float
    ready: dict[str, int]
    finished: dict[str, float] | None
    #: The broker's rates per queue (management API), ``None`` each where it cannot tell.
    broker: dict[str, tuple[float | None, float | None]]


FinishedCounts = Callable[[], "dict[str, float] | None"]


class RateTracker:
    """Remembers the last observations and turns them into per-queue rates.

    Args:
        finished: Returns tasks finished so far per queue (``None``: not counted here).
        clock: Monotonic seconds (tests may pass their own).
    """

    def __init__(self, finished: FinishedCounts | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # A worker serving the dashboard passes its counts (None while it collects none).
        self._served_from_worker = finished is not None
        self._finished = finished or (lambda: None)
        self._clock = clock
        self._lock = threading.Lock()
        self._previous: _Sample | None = None
        self._last: _Sample | None = None

    def observe(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """Record ``status`` (``Status.to_dict()``) and return the rates per queue."""
        queues = status.get("queues", [])
        ready = {q["name"]: int(q["ready"]) for q in queues}
        broker = {q["name"]: (q.get("published_per_s"), q.get("acked_per_s")) for q in queues}
        sample = _Sample(self._clock(), ready, self._finished(), broker)
        with self._lock:
            if self._last is None or sample.at - self._last.at >= MIN_INTERVAL_S:
                self._previous, self._last = self._last, sample
            base = self._previous
        return self._rates(base, sample)

    def _rates(self, base: _Sample | None, now: _Sample) -> dict[str, Any]:
        queues = {name: self._queue(base, now, name) for name in now.ready}
        notes = []
        if any(q["published_per_s"] is None for q in queues.values()):
            notes.append(PUBLISH_NOTE)
        # Only when the counts are missing: on a first look (no base yet) every rate is
        # unknown, and the note below says why.
        if now.finished is None and (
                not queues or any(q["acked_per_s"] is None for q in queues.values())):
            notes.append(METRICS_NOTE if self._served_from_worker else FINISHED_NOTE)
        if base is None:
            notes.append("rates need two observations at least 1 s apart: refresh again")
        return {"queues": queues, "notes": notes}

    @staticmethod
    def _queue(base: _Sample | None, now: _Sample, name: str) -> dict[str, Any]:
        published, acked = now.broker.get(name, (None, None))
        finished = _rate(base, now, _finished(base, name), _finished(now, name))
        if acked is not None:
            acked_source: str | None = "broker"
        elif finished is not None:
            acked, acked_source = finished, "this worker"
        else:
            acked_source = None
        return {
            "published_per_s": published,
            "acked_per_s": acked,
            "acked_source": acked_source,
            "ready_change_per_s": _rate(base, now, base.ready.get(name) if base else None,
                                        now.ready[name]),
            "finished_per_s": finished,
        }


def _finished(sample: _Sample | None, queue: str) -> float | None:
    if sample is None or sample.finished is None:
        return None
    return sample.finished.get(queue, 0.0)


def _rate(base: _Sample | None, now: _Sample, before: float | None,
          current: float | None) -> float | None:
    if base is None or before is None or current is None:
        return None
    return round((current - before) / (now.at - base.at), 2)


def worker_finished_counts() -> dict[str, float] | None:
    """Tasks finished per queue, summed over this worker's processes (``taskq_tasks``);
    ``None`` when the worker collects no metrics (no ``--metrics-port``)."""
    from taskq.worker import metrics

    if not metrics.is_enabled():
        return None
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    counts: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "taskq_tasks_total":
                queue = sample.labels.get("queue", "")
                counts[queue] = counts.get(queue, 0.0) + sample.value
    return counts
