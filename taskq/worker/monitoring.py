"""What the supervisor exposes for operations: Prometheus metrics, ``/healthz``, a health file.

:class:`Monitoring` is what ``taskq worker`` was asked for (``--metrics-port``,
``--health-file``, sidecars such as the dashboard); :class:`SupervisorMonitor` runs it for one
supervisor: the metrics server (multiprocess counters in a temporary directory, removed at
the end), the health file touched about every second while healthy, and a dead process's
gauges dropped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq.settings import Settings
    from taskq.worker.sidecars import Sidecar

# A process that has not looked at its consumer for this long is unhealthy.
# The metrics server's interface unless --metrics-host says otherwise: /metrics and /healthz
# tell about the app's queues and workers, so they are not offered to the network unasked.
LOOPBACK = "127.0.0.1"
HEALTH_STALE_S = 10.0
# How often the health file is touched while healthy (probes check its age).
HEALTH_TOUCH_INTERVAL_S = 1.0
# Least time without progress of a process's consumer before the supervisor replaces it.
STALLED_MIN_S = 30.0


def stalled_after_s(settings: Settings) -> float:
    """How long a worker process may hold no delivery and show no consumer progress.

    A consumer's I/O thread shows progress about every 0.5 s while connected and every
    second while it waits to reconnect; only a connect attempt is longer: up to twice
    ``connect_timeout_s`` per broker URL. A process silent for longer than that, and for two
    heartbeat intervals (by then the broker has given its connection up too), is stuck or
    frozen, or its consumer thread is gone: it consumes nothing and is replaced.
    """
    connecting_s = 2 * settings.connect_timeout_s * len(settings.broker_urls)
    return max(STALLED_MIN_S, 2.0 * settings.heartbeat_s, connecting_s + STALLED_MIN_S / 2)


@dataclass(frozen=True)
class Monitoring:
    """What ``taskq worker`` exposes for operations.

    Args:
        metrics_port: Serve Prometheus ``/metrics`` and ``/healthz`` on this port.
        metrics_host: The interface it binds: loopback unless told otherwise (``0.0.0.0``
            for a scraper or probe on another host, e.g. in a container).
        health_file: Touch this file about every second while healthy.
        sidecars: Servers run on threads of the supervisor (the dashboard).
    """

    metrics_port: int | None = None
    metrics_host: str = LOOPBACK
    health_file: str | None = None
    sidecars: tuple[Sidecar, ...] = ()


class SupervisorMonitor:
    """The metrics server and health file of one supervisor.

    Args:
        monitoring: What to expose.
        healthy: Whether every worker process runs and consumes, at a monotonic time.
    """

    def __init__(self, monitoring: Monitoring, healthy: Callable[[float], bool]) -> None:
        self.monitoring = monitoring
        self._healthy = healthy
        self._server: Any = None
        self._directory: str | None = None
        self._touched_at = 0.0

    def start_metrics(self, *, alive: Callable[[], int], restarts: Callable[[], int],
                      backlog: Callable[[], Any] | None) -> None:
        """Serve ``/metrics`` and ``/healthz`` when a metrics port was asked for.

        Called before any worker process starts: prometheus_client picks its storage when
        it is imported, so the processes must find the multiprocess directory set.
        """
        port = self.monitoring.metrics_port
        if port is None:
            return
        from taskq.worker import metrics

        self._directory = tempfile.mkdtemp(prefix="taskq-metrics-")
        metrics.enable_multiprocess(self._directory)
        self._server = metrics.MetricsServer(
            port, healthy=lambda: self._healthy(time.monotonic()), alive=alive, restarts=restarts,
            backlog=backlog, host=self.monitoring.metrics_host,
        ).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    def process_died(self, pid: int) -> None:
        """Drop a dead process's live gauges (its counters stay summed)."""
        if self._server is not None:
            from taskq.worker import metrics

            metrics.mark_process_dead(pid)

    def touch_health_file(self, now: float) -> None:
        path = self.monitoring.health_file
        if path is None or now - self._touched_at < HEALTH_TOUCH_INTERVAL_S:
            return
        if self._healthy(now):
            with open(path, "a", encoding="utf-8"):
                os.utime(path)
            self._touched_at = now

