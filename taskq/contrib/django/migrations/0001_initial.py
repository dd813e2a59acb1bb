"""Create taskq_outbox, taskq_processed and taskq_results with taskq's own DDL.

The SQL is what ``taskq.metadata.create_all()`` emits (SQLAlchemy), frozen here
as migrations are; the models only describe the tables to Django (state operations).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

_TABLES = ("taskq_outbox", "taskq_processed", "taskq_results")

_POSTGRESQL = (
    """CREATE TABLE taskq_outbox (
        id VARCHAR(36) NOT NULL,
        queue VARCHAR(255) NOT NULL,
        task VARCHAR(255) NOT NULL,
        body BYTEA NOT NULL,
        headers BYTEA NOT NULL,
        priority SMALLINT NOT NULL,
        eta TIMESTAMP WITH TIME ZONE,
        idempotency_key VARCHAR(255),
        created_at TIMESTAMP WITH TIME ZONE NOT NULL,
        attempts INTEGER NOT NULL,
        next_attempt_at TIMESTAMP WITH TIME ZONE NOT NULL,
        last_error TEXT,
        PRIMARY KEY (id),
        UNIQUE (idempotency_key)
    )""",
    "CREATE INDEX ix_taskq_outbox_due ON taskq_outbox (next_attempt_at, created_at)",
    """CREATE TABLE taskq_processed (
        key VARCHAR(255) NOT NULL,
        task VARCHAR(255) NOT NULL,
        finished_at TIMESTAMP WITH TIME ZONE NOT NULL,
        PRIMARY KEY (key)
    )""",
    "CREATE INDEX ix_taskq_processed_finished_at ON taskq_processed (finished_at)",
    """CREATE TABLE taskq_results (
        task_id VARCHAR(36) NOT NULL,
        task VARCHAR(255) NOT NULL,
        state VARCHAR(16) NOT NULL,
        result BYTEA,
        error TEXT,
        traceback TEXT,
        retries INTEGER NOT NULL,
        created_at TIMESTAMP WITH TIME ZONE NOT NULL,
        started_at TIMESTAMP WITH TIME ZONE,
        finished_at TIMESTAMP WITH TIME ZONE,
        PRIMARY KEY (task_id)
    )""",
    "CREATE INDEX ix_taskq_results_finished_at ON taskq_results (finished_at)",
)

_SQLITE = (
    """CREATE TABLE taskq_outbox (
        id VARCHAR(36) NOT NULL,
        queue VARCHAR(255) NOT NULL,
        task VARCHAR(255) NOT NULL,
        body BLOB NOT NULL,
        headers BLOB NOT NULL,
        priority SMALLINT NOT NULL,
        eta DATETIME,
        idempotency_key VARCHAR(255),
        created_at DATETIME NOT NULL,
        attempts INTEGER NOT NULL,
        next_attempt_at DATETIME NOT NULL,
        last_error TEXT,
        PRIMARY KEY (id),
        UNIQUE (idempotency_key)
    )""",
    "CREATE INDEX ix_taskq_outbox_due ON taskq_outbox (next_attempt_at, created_at)",
    """CREATE TABLE taskq_processed (
        "key" VARCHAR(255) NOT NULL,
        task VARCHAR(255) NOT NULL,
        finished_at DATETIME NOT NULL,
        PRIMARY KEY ("key")
    )""",
    "CREATE INDEX ix_taskq_processed_finished_at ON taskq_processed (finished_at)",
    """CREATE TABLE taskq_results (
        task_id VARCHAR(36) NOT NULL,
        task VARCHAR(255) NOT NULL,
        state VARCHAR(16) NOT NULL,
        result BLOB,
        error TEXT,
        traceback TEXT,
        retries INTEGER NOT NULL,
        created_at DATETIME NOT NULL,
        started_at DATETIME,
        finished_at DATETIME,
        PRIMARY KEY (task_id)
    )""",
    "CREATE INDEX ix_taskq_results_finished_at ON taskq_results (finished_at)",
)

_DDL = {"postgresql": _POSTGRESQL, "sqlite": _SQLITE}


def create_tables(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in _DDL:
        raise RuntimeError(
            f"taskq's tables support PostgreSQL and SQLite, not {vendor!r}; create them with "
            "`taskq db create` and run `manage.py migrate taskq --fake`"
        )
    for statement in _DDL[vendor]:
        schema_editor.execute(statement)


def drop_tables(apps: Any, schema_editor: Any) -> None:
    for table in _TABLES:
        schema_editor.execute(f"DROP TABLE {schema_editor.quote_name(table)}")


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_tables, drop_tables)],
            state_operations=[
                migrations.CreateModel(
                    name="OutboxMessage",
                    fields=[
                        ("id", models.CharField(max_length=36, primary_key=True, serialize=False)),
                        ("queue", models.CharField(max_length=255)),
                        ("task", models.CharField(max_length=255)),
                        ("body", models.BinaryField()),
                        ("headers", models.BinaryField()),
                        ("priority", models.SmallIntegerField(default=0)),
                        ("eta", models.DateTimeField(null=True)),
                        (
                            "idempotency_key",
                            models.CharField(max_length=255, null=True, unique=True),
                        ),
                        ("created_at", models.DateTimeField()),
                        ("attempts", models.IntegerField(default=0)),
                        ("next_attempt_at", models.DateTimeField()),
                        ("last_error", models.TextField(null=True)),
                    ],
                    options={
                        "db_table": "taskq_outbox",
                        "indexes": [
                            models.Index(
                                fields=["next_attempt_at", "created_at"],
                                name="ix_taskq_outbox_due",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ProcessedKey",
                    fields=[
                        (
                            "key",
                            models.CharField(max_length=255, primary_key=True, serialize=False),
                        ),
                        ("task", models.CharField(max_length=255)),
                        ("finished_at", models.DateTimeField()),
                    ],
                    options={
                        "db_table": "taskq_processed",
                        "indexes": [
                            models.Index(
                                fields=["finished_at"], name="ix_taskq_processed_finished_at"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="TaskResult",
                    fields=[
                        (
                            "task_id",
                            models.CharField(max_length=36, primary_key=True, serialize=False),
                        ),
                        ("task", models.CharField(max_length=255)),
                        ("state", models.CharField(max_length=16)),
                        ("result", models.BinaryField(null=True)),
                        ("error", models.TextField(null=True)),
                        ("traceback", models.TextField(null=True)),
                        ("retries", models.IntegerField(default=0)),
                        ("created_at", models.DateTimeField()),
                        ("started_at", models.DateTimeField(null=True)),
                        ("finished_at", models.DateTimeField(null=True)),
                    ],
                    options={
                        "db_table": "taskq_results",
                        "indexes": [
                            models.Index(
                                fields=["finished_at"], name="ix_taskq_results_finished_at"
                            )
                        ],
                    },
                ),
            ],
        )
    ]
