"""Task states: where any task id stands, asked of everything taskq keeps (docs/states.md).

:func:`~taskq.states.lookup.lookup` is the one answer ``taskq inspect``, the dashboard's task
page and :class:`~taskq.AsyncResult` give; :mod:`taskq.states.store` is the record the
workers keep for it (``taskq_task_states``).
"""

from __future__ import annotations

from taskq.states.lookup import DEFAULT_SCAN_LIMIT, from_database, lookup
from taskq.states.model import TaskStatus

__all__ = ["DEFAULT_SCAN_LIMIT", "TaskStatus", "from_database", "lookup"]
