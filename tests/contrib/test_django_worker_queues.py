"""``manage.py taskq worker -Q`` refuses a queue the project does not know (issue 26, 3.13)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from taskq import App
from taskq.broker import topology as topo
from taskq.testing import WorkerProcess
from tests.conftest import delete_topology
from tests.contrib.conftest import SHOP_DIR, shop_database_env


def test_manage_py_taskq_worker_refuses_a_misspelt_queue_before_declaring_it(
    shop_app: App, django_schema: str, worker_env: dict[str, str],
    start_command: Callable[..., WorkerProcess], broker: Any, namespace: str,
) -> None:
    meant = f"{namespace}.default"
    typo = f"{namespace}.defautl"

    worker = start_command(
        ["manage.py", "taskq", "worker", "-Q", typo, "-c", "1"],
        cwd=SHOP_DIR, env={**worker_env, **shop_database_env(django_schema)},
    )
    try:
        assert worker.process.wait(60) == 2  # ConfigurationError's exit code, via Django
        log = worker.log()
        assert f"unknown queue {typo!r} (did you mean {meant!r}?)" in log
        assert "--declare-new-queues" in log
        assert "taskq worker exited with status 2" in log  # Django's CommandError
        assert not broker.exists(typo)
        assert not broker.exists(topo.dlq_name(typo))
    finally:
        worker.kill()
        delete_topology(shop_app, extra_queues=(typo,))  # if a worker wrongly declared it
