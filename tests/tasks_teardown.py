"""An app that declares every kind of broker object, for ``taskq teardown`` tests.

``-A tests.tasks_teardown:app`` takes namespace, default queue and broker from ``TASKQ_*``
variables; the tests build the same app in-process with :func:`build`.
"""

from __future__ import annotations

from taskq import App


def build(app: App) -> App:
    """Give ``app`` a classic, a quorum and an ordered queue (3 partitions) with a task each."""
    ns = app.settings.namespace
    app.queue(f"{ns}.work")
    app.queue(f"{ns}.billing", type="quorum")
    app.queue(f"{ns}.ledger", partitions=3)

    @app.task(name="teardown.work", queue=f"{ns}.work", idempotent=False)
    def work(n: int) -> int:
        return n

    @app.task(name="teardown.bill", queue=f"{ns}.billing", idempotent=False)
    def bill(n: int) -> int:
        return n

    @app.task(name="teardown.post", queue=f"{ns}.ledger", ordering_key="account",
              idempotent=False)
    def post(account: str, n: int) -> int:
        return n

    return app


app = build(App("teardown-tests"))
