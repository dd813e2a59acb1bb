"""Create taskq_task_states: what each worker last saw happen to a task (taskq.states).

The SQL is what ``taskq.metadata.create_all()`` emits (SQLAlchemy), frozen here as
migrations are; the model only describes the table to Django (a state operation).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def _table(timestamp: str) -> str:
    return f"""CREATE TABLE taskq_task_states (
        task_id VARCHAR(255) NOT NULL,
        task VARCHAR(255) NOT NULL,
        queue VARCHAR(255) NOT NULL,
        state VARCHAR(16) NOT NULL,
        retries INTEGER NOT NULL,
        idempotency_key VARCHAR(255),
        worker VARCHAR(255),
        error TEXT,
        next_at {timestamp},
        started_at {timestamp},
        updated_at {timestamp} NOT NULL,
        PRIMARY KEY (task_id)
    )"""


_INDEX = "CREATE INDEX ix_taskq_task_states_updated ON taskq_task_states (updated_at)"
_DDL = {
    "postgresql": (_table("TIMESTAMP WITH TIME ZONE"), _INDEX),
    "sqlite": (_table("DATETIME"), _INDEX),
}


def create_table(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in _DDL:
        raise RuntimeError(
            f"taskq's tables support PostgreSQL and SQLite, not {vendor!r}; create them with "
            "`taskq db create` and run `manage.py migrate taskq --fake`"
        )
    for statement in _DDL[vendor]:
        schema_editor.execute(statement)


def drop_table(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute("DROP TABLE taskq_task_states")


class Migration(migrations.Migration):
    dependencies = [("taskq", "0006_workflows")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_table, drop_table)],
            state_operations=[
                migrations.CreateModel(
                    name="TaskState",
                    fields=[
                        ("task_id", models.CharField(max_length=255, primary_key=True,
                                                     serialize=False)),
                        ("task", models.CharField(max_length=255)),
                        ("queue", models.CharField(max_length=255)),
                        ("state", models.CharField(max_length=16)),
                        ("retries", models.IntegerField()),
                        ("idempotency_key", models.CharField(max_length=255, null=True)),
                        ("worker", models.CharField(max_length=255, null=True)),
                        ("error", models.TextField(null=True)),
                        ("next_at", models.DateTimeField(null=True)),
                        ("started_at", models.DateTimeField(null=True)),
                        ("updated_at", models.DateTimeField()),
                    ],
                    options={
                        "db_table": "taskq_task_states",
                        "indexes": [models.Index(fields=["updated_at"],
                                                 name="ix_taskq_task_states_updated")],
                    },
                ),
            ],
        )
    ]
