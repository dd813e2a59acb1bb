"""``taskq_django_tasks``: calls enqueued through the ``django.tasks`` backend (TaskqBackend)."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("taskq", "0002_task_ids_up_to_255")]

    operations = [
        migrations.CreateModel(
            name="TaskRecord",
            fields=[
                ("id", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("task_path", models.CharField(max_length=255)),
                ("backend", models.CharField(max_length=255)),
                ("queue_name", models.CharField(max_length=255)),
                ("priority", models.SmallIntegerField(default=0)),
                ("run_after", models.DateTimeField(null=True)),
                ("args", models.JSONField(default=list)),
                ("kwargs", models.JSONField(default=dict)),
                ("enqueued_at", models.DateTimeField()),
                ("started_at", models.DateTimeField(null=True)),
                ("last_attempted_at", models.DateTimeField(null=True)),
                ("worker_ids", models.JSONField(default=list)),
                ("errors", models.JSONField(default=list)),
            ],
            options={
                "db_table": "taskq_django_tasks",
                "indexes": [
                    models.Index(fields=["enqueued_at"], name="ix_taskq_django_tasks_enq")
                ],
            },
        ),
    ]
