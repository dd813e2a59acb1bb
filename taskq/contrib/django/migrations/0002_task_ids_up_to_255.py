"""Task ids up to 255 characters in taskq_outbox.id and taskq_results.task_id (were 36).

Task ids are AMQP short strings (``apply_async(task_id=...)`` accepts any up to 255 bytes),
not only uuids. PostgreSQL widens the columns in place; SQLite does not enforce VARCHAR
lengths, but its declared type is rewritten too (a table rebuild, SQLite's documented way to
change a column), so that the schema stays exactly what ``taskq.metadata.create_all()``
makes.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import migrations, models

_WIDENED = (("taskq_outbox", "id"), ("taskq_results", "task_id"))


def _postgresql(schema_editor: Any, length: int) -> None:
    for table, column in _WIDENED:
        schema_editor.execute(
            f"ALTER TABLE {table} ALTER COLUMN {column} TYPE VARCHAR({length})"
        )


def _sqlite(schema_editor: Any, length: int) -> None:
    cursor = schema_editor.connection.cursor()
    for table, column in _WIDENED:
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = %s", [table])
        (ddl,) = cursor.fetchone()
        cursor.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s "
            "AND sql IS NOT NULL", [table],
        )
        indexes = [row[0] for row in cursor.fetchall()]
        head, _, rest = ddl.partition(f"{column} VARCHAR(")
        _, _, tail = rest.partition(")")
        # After a rebuild SQLite keeps the name quoted (CREATE TABLE "taskq_outbox").
        widened = re.sub(
            rf'^CREATE TABLE ("?){table}\1', f"CREATE TABLE {table}_widened",
            f"{head}{column} VARCHAR({length}){tail}", count=1,
        )
        schema_editor.execute(widened)
        schema_editor.execute(f"INSERT INTO {table}_widened SELECT * FROM {table}")
        schema_editor.execute(f"DROP TABLE {table}")
        schema_editor.execute(f"ALTER TABLE {table}_widened RENAME TO {table}")
        for index in indexes:
            schema_editor.execute(index)


def _alter(length: int) -> Any:
    def alter(apps: Any, schema_editor: Any) -> None:
        vendor = schema_editor.connection.vendor
        if vendor == "postgresql":
            _postgresql(schema_editor, length)
        elif vendor == "sqlite":
            _sqlite(schema_editor, length)
        else:
            raise RuntimeError(
                f"taskq's tables support PostgreSQL and SQLite, not {vendor!r}; widen "
                "taskq_outbox.id and taskq_results.task_id to VARCHAR(255) yourself and run "
                "`manage.py migrate taskq --fake`"
            )

    return alter


class Migration(migrations.Migration):
    dependencies = [("taskq", "0001_initial")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(_alter(255), _alter(36))],
            state_operations=[
                migrations.AlterField(
                    model_name="outboxmessage",
                    name="id",
                    field=models.CharField(max_length=255, primary_key=True, serialize=False),
                ),
                migrations.AlterField(
                    model_name="taskresult",
                    name="task_id",
                    field=models.CharField(max_length=255, primary_key=True, serialize=False),
                ),
            ],
        ),
    ]
