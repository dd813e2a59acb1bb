"""The scheduler's missing-table error is logged under the scheduler's own logger (issue 28,
item 5); it was logged under ``taskq.worker.relay_process``, the module that checks tables.

``taskq beat`` itself checks the tables before the scheduler starts and says first what to
run (item 2, tests/system/test_missing_tables_cli.py), so the scheduler's own report is what
a library caller of :func:`taskq.schedules.beat_process.run_beat` (and a ``worker --beat``
child whose tables vanished) sees.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from taskq import App
from taskq.schedules.beat_process import run_beat
from taskq.worker.process import EXIT_FATAL
from tests.conftest import BROKER_URL, postgres_schema, schema_url
from tests.system.cli_user import run_taskq


def test_taskq_beat_reports_a_missing_table_without_the_relay_module(
    tmp_path: Path, namespace: str
) -> None:
    with postgres_schema("tqbeat", taskq_tables=False) as schema:
        env = {"TASKQ_DATABASE_URL": schema_url(schema), "TASKQ_BROKER_URL": BROKER_URL,
               "TASKQ_NAMESPACE": namespace, "TASKQ_DEFAULT_QUEUE": f"{namespace}.default"}

        result = run_taskq(tmp_path, "beat", "-A", "tests.tasks_periodic:app", env=env)

    assert result.returncode == 78
    first = result.stderr.splitlines()[0]
    assert first.startswith("Error: taskq's tables are missing: run `taskq db create -A "
                            "tests.tasks_periodic:app`"), result.stderr
    assert "taskq_schedule" in first
    assert "taskq.worker.relay_process" not in result.stderr


def test_the_scheduler_logs_a_missing_table_as_the_scheduler(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with postgres_schema("tqbeat", taskq_tables=False) as schema:
        app = App("beat-logger", broker_url=BROKER_URL, database_url=schema_url(schema),
                  namespace=namespace)

        @app.periodic(60, name="tick")
        @app.task(name="beat-logger.tick")
        def tick() -> None: ...

        with caplog.at_level(logging.ERROR):
            code = run_beat(app, lambda: True)

    assert code == EXIT_FATAL
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.name for r in errors] == ["taskq.schedules.beat_process"]
    assert errors[0].getMessage().startswith("taskq's tables are missing: run `taskq db create")
    assert "taskq_schedule" in errors[0].getMessage()
