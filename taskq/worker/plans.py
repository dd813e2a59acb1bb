"""Task plans: what the worker loop needs of a registered task, computed once per task name.

The loop looks each delivery's task name up in a dict of plans instead of reading the task's
options per message: the function wrapped in the app's ``task_context`` hooks (and bound to
the task for ``bind=True``), its time limits, its idempotency mode and its resolved retry
policy.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from taskq.retry import RetryPolicy, resolve_policy
from taskq.worker.execution import in_task_context


class Plan(NamedTuple):
    """What the loop needs of a task, looked up once per task name."""

    fn: Any
    soft_time_limit_s: float | None
    time_limit_s: float | None
    idempotent: bool
    transactional: bool
    policy: RetryPolicy


def plan_of(task: Any) -> Plan:
    """The :class:`Plan` of a registered :class:`~taskq.task.Task`."""
    options = task.options
    # bind=True: the task object is the first argument (self.request, self.retry()).
    fn = functools.partial(task.fn, task) if options.bind else task.fn
    return Plan(
        # The app's task_context hooks (e.g. a Flask app context) wrap the function once.
        in_task_context(fn, task.app.task_context),
        options.soft_time_limit_s,
        options.time_limit_s,
        options.idempotent,
        options.transactional,
        resolve_policy(RetryPolicy.from_settings(task.app.settings), options.retry_overrides()),
    )
