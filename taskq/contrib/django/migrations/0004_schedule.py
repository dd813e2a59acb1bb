"""taskq_schedule and taskq_schedulers: periodic tasks (taskq.schedules, docs/periodic.md).

The SQL is what ``taskq.metadata.create_all()`` emits, frozen here as migrations are; the
models only describe the tables to Django (state operations).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

_TABLES = ("taskq_schedule", "taskq_schedulers")

_TIMESTAMP = {"postgresql": "TIMESTAMP WITH TIME ZONE", "sqlite": "DATETIME"}


def _ddl(timestamp: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE taskq_schedule (
            name VARCHAR(255) NOT NULL,
            task VARCHAR(255) NOT NULL,
            schedule VARCHAR(255) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            next_run_at {timestamp} NOT NULL,
            last_run_at {timestamp},
            updated_at {timestamp} NOT NULL,
            PRIMARY KEY (name)
        )""",
        f"""CREATE TABLE taskq_schedulers (
            id VARCHAR(64) NOT NULL,
            host VARCHAR(255) NOT NULL,
            pid INTEGER NOT NULL,
            started_at {timestamp} NOT NULL,
            last_seen_at {timestamp} NOT NULL,
            PRIMARY KEY (id)
        )""",
    )


def create_tables(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in _TIMESTAMP:
        raise RuntimeError(
            f"taskq's tables support PostgreSQL and SQLite, not {vendor!r}; create them with "
            "`taskq db create` and run `manage.py migrate taskq --fake`"
        )
    for statement in _ddl(_TIMESTAMP[vendor]):
        schema_editor.execute(statement)


def drop_tables(apps: Any, schema_editor: Any) -> None:
    for table in _TABLES:
        schema_editor.execute(f"DROP TABLE {schema_editor.quote_name(table)}")


class Migration(migrations.Migration):
    dependencies = [("taskq", "0003_django_tasks")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_tables, drop_tables)],
            state_operations=[
                migrations.CreateModel(
                    name="Schedule",
                    fields=[
                        (
                            "name",
                            models.CharField(max_length=255, primary_key=True, serialize=False),
                        ),
                        ("task", models.CharField(max_length=255)),
                        ("schedule", models.CharField(max_length=255)),
                        ("fingerprint", models.CharField(max_length=64)),
                        ("next_run_at", models.DateTimeField()),
                        ("last_run_at", models.DateTimeField(null=True)),
                        ("updated_at", models.DateTimeField()),
                    ],
                    options={"db_table": "taskq_schedule"},
                ),
                migrations.CreateModel(
                    name="Scheduler",
                    fields=[
                        (
                            "id",
                            models.CharField(max_length=64, primary_key=True, serialize=False),
                        ),
                        ("host", models.CharField(max_length=255)),
                        ("pid", models.IntegerField()),
                        ("started_at", models.DateTimeField()),
                        ("last_seen_at", models.DateTimeField()),
                    ],
                    options={"db_table": "taskq_schedulers"},
                ),
            ],
        )
    ]
