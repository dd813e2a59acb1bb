"""Prometheus metrics of ``taskq worker --metrics-port PORT`` (and ``/healthz``).

Worker processes count task events in ``prometheus_client``'s multiprocess mode: the
supervisor points ``PROMETHEUS_MULTIPROC_DIR`` at a private directory *before* any process
imports ``prometheus_client`` (the library picks its storage at import time), and serves the
sum of all processes' files plus its own figures (processes alive, restarts, outbox backlog)
from one HTTP server thread.

Metrics (all prefixed ``taskq_``): ``tasks_total{task,queue,outcome}`` (outcome: succeeded,
retried, dead_lettered, duplicate), ``task_duration_seconds{task,queue}``,
``retries_total{task,queue}``, ``dead_letters_total{queue,error_type}``,
``duplicates_total{task,queue}``, ``outbox_published_total`` (relay),
``outbox_backlog_rows``, ``outbox_oldest_age_seconds``, ``worker_processes_alive``,
``worker_process_restarts_total``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

logger = logging.getLogger(__name__)

ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"
_DURATION_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                       300)


def enable_multiprocess(directory: str) -> None:
    """Make this process and the processes it starts write metrics under ``directory``."""
    os.environ[ENV_DIR] = directory


def is_enabled() -> bool:
    """Whether metrics are collected (the supervisor was given ``--metrics-port``)."""
    return bool(os.environ.get(ENV_DIR))


@dataclass(frozen=True)
class TaskMetrics:
    """The metric objects a worker process updates."""

    tasks: Any
    duration: Any
    retries: Any
    dead_letters: Any
    duplicates: Any


@functools.cache
def task_metrics() -> TaskMetrics:
    """This process's task metrics (created once; prometheus_client registers by name)."""
    from prometheus_client import Counter, Histogram

    return TaskMetrics(
        tasks=Counter("taskq_tasks", "Task outcomes.", ["task", "queue", "outcome"]),
        duration=Histogram("taskq_task_duration_seconds", "Run time of succeeded tasks.",
                           ["task", "queue"], buckets=_DURATION_BUCKETS_S),
        retries=Counter("taskq_retries", "Retries scheduled.", ["task", "queue"]),
        dead_letters=Counter("taskq_dead_letters", "Messages sent to Q.dlq.",
                             ["queue", "error_type"]),
        duplicates=Counter("taskq_duplicates", "Duplicates skipped (idempotency key done).",
                           ["task", "queue"]),
    )


@functools.cache
def outbox_published() -> Any:
    """Counter of rows the relay published (its rate is the relay's publish rate)."""
    from prometheus_client import Counter

    return Counter("taskq_outbox_published", "Outbox rows published and confirmed.")


class _SupervisorCollector:
    """Figures only the supervisor knows, read at scrape time."""

    def __init__(self, alive: Callable[[], int], restarts: Callable[[], int],
                 backlog: Callable[[], Any] | None) -> None:
        self._alive, self._restarts, self._backlog = alive, restarts, backlog

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield GaugeMetricFamily("taskq_worker_processes_alive", "Worker processes running.",
                                value=self._alive())
        yield CounterMetricFamily("taskq_worker_process_restarts",
                                  "Worker processes replaced after dying.",
                                  value=self._restarts())
        if self._backlog is None:
            return
        try:
            backlog = self._backlog()
        except Exception as exc:  # the database may be down; metrics must still answer
            logger.debug("outbox backlog unavailable for metrics: %s", exc)
            return
        yield GaugeMetricFamily("taskq_outbox_backlog_rows", "Rows waiting in the outbox.",
                                value=backlog.rows)
        yield GaugeMetricFamily("taskq_outbox_oldest_age_seconds",
                                "Age of the oldest outbox row.", value=backlog.oldest_age_s())


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        logger.debug("metrics http: " + format, *args)


class MetricsServer:
    """Serves ``/metrics`` (Prometheus text) and ``/healthz`` (200 or 503) on a thread.

    Args:
        port: TCP port on all interfaces (0 picks a free one; see :attr:`port`).
        healthy: Returns whether every worker process is alive and consuming.
        alive: Returns how many worker processes run.
        restarts: Returns how many were replaced after dying.
        backlog: Returns the outbox backlog, or ``None`` when no relay runs here.
        host: Interface to bind (``Monitoring.metrics_host``: loopback unless told).
    """

    def __init__(
        self,
        port: int,
        *,
        healthy: Callable[[], bool],
        alive: Callable[[], int],
        restarts: Callable[[], int],
        backlog: Callable[[], Any] | None = None,
        host: str,
    ) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(_SupervisorCollector(alive, restarts, backlog))
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == "/healthz":
                ok = healthy()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "text/plain")])
                return [b"ok\n" if ok else b"unhealthy\n"]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        self._server: WSGIServer = make_server(host, port, app, handler_class=_QuietHandler)
        self.host = host
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="taskq-metrics",
                                        daemon=True)

    def start(self) -> MetricsServer:
        """Start serving; returns ``self``."""
        self._thread.start()
        shown = f"[{self.host}]" if ":" in self.host else self.host
        logger.info("metrics on http://%s:%d/metrics, health on /healthz", shown, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker process's live-gauge files (counters stay summed)."""
    if not is_enabled():
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
