"""The scheduler's missing-table error is logged under the scheduler's own logger (issue 28,
item 5); it was logged under ``taskq.worker.relay_process``, the module that checks tables."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import BROKER_URL, postgres_schema, schema_url
from tests.system.cli_user import run_taskq


def test_taskq_beat_logs_a_missing_table_as_the_scheduler(tmp_path: Path, namespace: str) -> None:
    with postgres_schema("tqbeat", taskq_tables=False) as schema:
        env = {"TASKQ_DATABASE_URL": schema_url(schema), "TASKQ_BROKER_URL": BROKER_URL,
               "TASKQ_NAMESPACE": namespace, "TASKQ_DEFAULT_QUEUE": f"{namespace}.default"}

        result = run_taskq(tmp_path, "beat", "-A", "tests.tasks_periodic:app", env=env)

    assert result.returncode == 78
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert errors, result.stderr
    assert "taskq_schedule" in errors[0]  # the wording is the missing-table error's own
    assert " taskq.schedules.beat_process: " in errors[0]
    assert "taskq.worker.relay_process" not in result.stderr
