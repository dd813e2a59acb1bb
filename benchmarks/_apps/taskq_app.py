"""taskq bench app: ``taskq worker -A benchmarks._apps.taskq_app:app``.

Configured like any taskq app by ``TASKQ_NAMESPACE``, ``TASKQ_DEFAULT_QUEUE``,
``TASKQ_BROKER_URL`` and ``TASKQ_DATABASE_URL``; ``BENCH_IDEMPOTENT=1`` turns the tasks'
``idempotent`` option on (where this taskq has it), anything else turns it off.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks._apps.bodies import latency, noop, sleep
from taskq import App
from taskq.task import TaskOptions

#: Whether this taskq has the ``idempotent`` task option (idempotency in the worker).
HAS_IDEMPOTENCY = "idempotent" in TaskOptions.__dataclass_fields__


def make_app(*, idempotent: bool = False, **settings: Any) -> App:
    """An app with the three bench tasks; ``settings`` as for :class:`taskq.App`."""
    app = App("bench", **settings)
    options: dict[str, Any] = {}
    if HAS_IDEMPOTENCY:
        options["idempotent"] = idempotent
    elif idempotent:
        raise RuntimeError("this taskq has no idempotent task option")
    for fn in (noop, sleep, latency):
        app.task(name=f"bench.{fn.__name__}", **options)(fn)
    return app


app = make_app(idempotent=os.environ.get("BENCH_IDEMPOTENT") == "1")
