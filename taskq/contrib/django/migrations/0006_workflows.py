"""Create taskq_workflows and taskq_workflow_members (chains, groups, chords).

The SQL is what ``taskq.metadata.create_all()`` emits (SQLAlchemy), frozen here as
migrations are; the models only describe the tables to Django (state operations).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

_TABLES = ("taskq_workflow_members", "taskq_workflows")

_POSTGRESQL = (
    """CREATE TABLE taskq_workflows (
        id VARCHAR(255) NOT NULL,
        kind VARCHAR(16) NOT NULL,
        state VARCHAR(16) NOT NULL,
        step INTEGER NOT NULL,
        steps INTEGER NOT NULL,
        remaining INTEGER NOT NULL,
        result BYTEA,
        error TEXT,
        failed_task_id VARCHAR(255),
        failed_task VARCHAR(255),
        link_error BYTEA,
        created_at TIMESTAMP WITH TIME ZONE NOT NULL,
        finished_at TIMESTAMP WITH TIME ZONE,
        PRIMARY KEY (id)
    )""",
    "CREATE INDEX ix_taskq_workflows_finished_at ON taskq_workflows (finished_at)",
    """CREATE TABLE taskq_workflow_members (
        task_id VARCHAR(255) NOT NULL,
        workflow_id VARCHAR(255) NOT NULL,
        step INTEGER NOT NULL,
        position INTEGER NOT NULL,
        task VARCHAR(255) NOT NULL,
        queue VARCHAR(255) NOT NULL,
        state VARCHAR(16) NOT NULL,
        call BYTEA NOT NULL,
        result BYTEA,
        error TEXT,
        traceback TEXT,
        finished_at TIMESTAMP WITH TIME ZONE,
        PRIMARY KEY (task_id)
    )""",
    "CREATE INDEX ix_taskq_workflow_members_step "
    "ON taskq_workflow_members (workflow_id, step, position)",
)

_SQLITE = (
    """CREATE TABLE taskq_workflows (
        id VARCHAR(255) NOT NULL,
        kind VARCHAR(16) NOT NULL,
        state VARCHAR(16) NOT NULL,
        step INTEGER NOT NULL,
        steps INTEGER NOT NULL,
        remaining INTEGER NOT NULL,
        result BLOB,
        error TEXT,
        failed_task_id VARCHAR(255),
        failed_task VARCHAR(255),
        link_error BLOB,
        created_at DATETIME NOT NULL,
        finished_at DATETIME,
        PRIMARY KEY (id)
    )""",
    "CREATE INDEX ix_taskq_workflows_finished_at ON taskq_workflows (finished_at)",
    """CREATE TABLE taskq_workflow_members (
        task_id VARCHAR(255) NOT NULL,
        workflow_id VARCHAR(255) NOT NULL,
        step INTEGER NOT NULL,
        position INTEGER NOT NULL,
        task VARCHAR(255) NOT NULL,
        queue VARCHAR(255) NOT NULL,
        state VARCHAR(16) NOT NULL,
        call BLOB NOT NULL,
        result BLOB,
        error TEXT,
        traceback TEXT,
        finished_at DATETIME,
        PRIMARY KEY (task_id)
    )""",
    "CREATE INDEX ix_taskq_workflow_members_step "
    "ON taskq_workflow_members (workflow_id, step, position)",
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
    dependencies = [("taskq", "0005_outbox_ordering")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_tables, drop_tables)],
            state_operations=[
                migrations.CreateModel(
                    name="Workflow",
                    fields=[
                        ("id", models.CharField(max_length=255, primary_key=True, serialize=False)),
                        ("kind", models.CharField(max_length=16)),
                        ("state", models.CharField(max_length=16)),
                        ("step", models.IntegerField()),
                        ("steps", models.IntegerField()),
                        ("remaining", models.IntegerField()),
                        ("result", models.BinaryField(null=True)),
                        ("error", models.TextField(null=True)),
                        ("failed_task_id", models.CharField(max_length=255, null=True)),
                        ("failed_task", models.CharField(max_length=255, null=True)),
                        ("link_error", models.BinaryField(null=True)),
                        ("created_at", models.DateTimeField()),
                        ("finished_at", models.DateTimeField(null=True)),
                    ],
                    options={
                        "db_table": "taskq_workflows",
                        "indexes": [
                            models.Index(
                                fields=["finished_at"], name="ix_taskq_workflows_finished_at"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="WorkflowMember",
                    fields=[
                        (
                            "task_id",
                            models.CharField(max_length=255, primary_key=True, serialize=False),
                        ),
                        ("workflow_id", models.CharField(max_length=255)),
                        ("step", models.IntegerField()),
                        ("position", models.IntegerField()),
                        ("task", models.CharField(max_length=255)),
                        ("queue", models.CharField(max_length=255)),
                        ("state", models.CharField(max_length=16)),
                        ("call", models.BinaryField()),
                        ("result", models.BinaryField(null=True)),
                        ("error", models.TextField(null=True)),
                        ("traceback", models.TextField(null=True)),
                        ("finished_at", models.DateTimeField(null=True)),
                    ],
                    options={
                        "db_table": "taskq_workflow_members",
                        "indexes": [
                            models.Index(
                                fields=["workflow_id", "step", "position"],
                                name="ix_taskq_workflow_members_step",
                            )
                        ],
                    },
                ),
            ],
        )
    ]
