"""Periodic tasks for ``taskq beat`` and ``taskq worker --beat`` subprocess tests.

Settings come from ``TASKQ_*`` variables (namespace, queue, broker, database) set by each
test; ``TASKQ_TEST_SCHEDULES`` picks the schedules: ``ha`` (one every-second schedule,
``missed="all"``) or ``downtime`` (one every-second schedule per ``missed`` policy).
``TASKQ_TEST_RUNS`` names the file each run appends ``ran <schedule> <tick> <pid>`` to.
"""

from __future__ import annotations

import os

from taskq import App
from tests.tasks import append_line

app = App("taskq-periodic-tests")


@app.task(bind=True)
def tick(self) -> None:  # type: ignore[no-untyped-def]
    """Record one run with its schedule and tick (the message's taskq-schedule headers)."""
    headers = self.request.headers
    append_line(os.environ["TASKQ_TEST_RUNS"], "ran", headers.get("taskq-schedule"),
                headers.get("taskq-schedule-tick"))


if os.environ.get("TASKQ_TEST_SCHEDULES", "ha") == "ha":
    app.add_periodic_task(1, tick, name="every-second", missed="all")
else:
    for _missed in ("once", "skip", "all"):
        app.add_periodic_task(1, tick, name=f"every-second-{_missed}", missed=_missed)
