"""Servers the supervisor runs on threads of its own process beside the worker processes.

``taskq worker --dashboard-port`` hands the supervisor a :class:`Sidecar` (the dashboard,
:mod:`taskq.dashboard.server`); the supervisor starts it once its processes are being
started, passing itself as the :class:`SupervisedProcesses` the sidecar may read, and stops
it when it shuts down. The protocols keep the worker layer free of the dashboard's imports.
"""

from __future__ import annotations

from typing import Protocol


class SupervisedProcesses(Protocol):
    """What a sidecar may read of the supervisor that runs it."""

    @property
    def process_count(self) -> int:
        """Worker processes the supervisor keeps running."""

    @property
    def restarts(self) -> int:
        """Worker processes replaced after dying since the supervisor started."""

    def alive(self) -> int:
        """Worker processes running now."""

    def healthy(self) -> bool:
        """Every worker process runs and consumes."""


class Sidecar(Protocol):
    """A server started and stopped by the supervisor."""

    def start(self, processes: SupervisedProcesses) -> None:
        """Start serving (on a thread); raise a TaskqError when it cannot."""

    def stop(self) -> None:
        """Stop serving and release the socket."""
