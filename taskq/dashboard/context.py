"""The dashboard's state shared by its views: :class:`Dashboard` and :func:`dashboard`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flask import current_app

from taskq.dashboard import data
from taskq.dashboard.rates import RateTracker
from taskq.dashboard.security import Guard

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.worker.sidecars import SupervisedProcesses

EXTENSION = "taskq"


@dataclass
class Dashboard:
    """What the views need: the taskq app, the rules, the supervisor (when served by one)."""

    app: App
    guard: Guard
    processes: SupervisedProcesses | None = None
    rates: RateTracker = field(default_factory=RateTracker)

    def overview(self) -> dict[str, Any]:
        """The overview's data (and one more observation for the rates)."""
        return data.overview(self.app, self.rates, self.processes)


def dashboard() -> Dashboard:
    """The :class:`Dashboard` of the app handling this request."""
    return current_app.extensions[EXTENSION]  # type: ignore[no-any-return]
