"""``taskq_outbox.ordering_key`` and its index: the relay keeps the order of each key.

Rows of an ordered queue carry their ordering key; the relay claims only the oldest waiting
row of each key (:meth:`taskq.outbox.store.OutboxStore.claim`), which the index
``(queue, ordering_key, created_at)`` answers. The same DDL on PostgreSQL and SQLite, and
exactly what ``taskq.metadata.create_all()`` makes.
"""

from __future__ import annotations

from django.db import migrations, models

_FORWARD = (
    "ALTER TABLE taskq_outbox ADD COLUMN ordering_key VARCHAR(255)",
    "CREATE INDEX ix_taskq_outbox_ordering ON taskq_outbox (queue, ordering_key, created_at)",
)
_BACKWARD = (
    "DROP INDEX ix_taskq_outbox_ordering",
    "ALTER TABLE taskq_outbox DROP COLUMN ordering_key",
)


class Migration(migrations.Migration):
    dependencies = [("taskq", "0004_schedule")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(list(_FORWARD), list(_BACKWARD)),
            ],
            state_operations=[
                migrations.AddField(
                    model_name="outboxmessage",
                    name="ordering_key",
                    field=models.CharField(max_length=255, null=True),
                ),
                migrations.AddIndex(
                    model_name="outboxmessage",
                    index=models.Index(
                        fields=["queue", "ordering_key", "created_at"],
                        name="ix_taskq_outbox_ordering",
                    ),
                ),
            ],
        ),
    ]
