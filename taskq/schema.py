"""``taskq.metadata``: the tables taskq keeps in the application's database.

Add ``taskq.metadata`` to Alembic's ``target_metadata`` (it can be a list) so that
autogenerate sees these tables, or create them with ``app.create_tables()`` /
``taskq db create``.
"""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)

metadata = MetaData()

#: Tasks enqueued inside a business transaction, waiting for the relay to publish them.
outbox_table = Table(
    "taskq_outbox",
    metadata,
    Column("id", String(255), primary_key=True, comment="task id, also the AMQP message_id"),
    Column("queue", String(255), nullable=False),
    Column("task", String(255), nullable=False),
    Column("body", LargeBinary, nullable=False, comment="msgpack body, encoded at enqueue"),
    Column("headers", LargeBinary, nullable=False, comment="msgpack map of AMQP headers"),
    Column("priority", SmallInteger, nullable=False, default=0),
    Column("eta", DateTime(timezone=True), nullable=True),
    Column("idempotency_key", String(255), nullable=True, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("last_error", Text, nullable=True),
    Column(
        "ordering_key", String(255), nullable=True,
        comment="ordered queues: rows of one key are relayed one at a time, oldest first",
    ),
)
Index("ix_taskq_outbox_due", outbox_table.c.next_attempt_at, outbox_table.c.created_at)
# The relay's "is an older row of this key still waiting?" check (taskq.outbox.store.claim).
Index(
    "ix_taskq_outbox_ordering",
    outbox_table.c.queue, outbox_table.c.ordering_key, outbox_table.c.created_at,
)

#: Idempotency keys of tasks that finished; a key present here means "already done".
processed_table = Table(
    "taskq_processed",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("task", String(255), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False, index=True),
)

#: Task states and results, for tasks (or apps) that ask for them.
results_table = Table(
    "taskq_results",
    metadata,
    Column("task_id", String(255), primary_key=True),
    Column("task", String(255), nullable=False),
    Column("state", String(16), nullable=False),
    Column("result", LargeBinary, nullable=True),
    Column("error", Text, nullable=True),
    Column("traceback", Text, nullable=True),
    Column("retries", Integer, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True, index=True),
)

#: Periodic tasks (taskq.schedules): one row per schedule name. A tick is one transaction
#: that locks the row, adds the outbox row and advances next_run_at, so a tick is enqueued
#: once however many schedulers run; ``fingerprint`` notices a changed schedule.
schedule_table = Table(
    "taskq_schedule",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("task", String(255), nullable=False),
    Column("schedule", String(255), nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("next_run_at", DateTime(timezone=True), nullable=False),
    Column("last_run_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

#: The schedulers (`taskq beat`, `taskq worker --beat`) seen: a heartbeat row each.
schedulers_table = Table(
    "taskq_schedulers",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("last_seen_at", DateTime(timezone=True), nullable=False),
)

#: Workflows (chains, groups, chords): where each stands and how many members its current
#: step still waits for (see :mod:`taskq.workflows`).
workflows_table = Table(
    "taskq_workflows",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("kind", String(16), nullable=False, comment="chain, group or chord"),
    Column("state", String(16), nullable=False, comment="RUNNING, SUCCESS or FAILURE"),
    Column("step", Integer, nullable=False, comment="index of the step now running"),
    Column("steps", Integer, nullable=False),
    Column("remaining", Integer, nullable=False, comment="members of the step not finished"),
    Column("result", LargeBinary, nullable=True, comment="msgpack: the last step's result"),
    Column("error", Text, nullable=True),
    Column("failed_task_id", String(255), nullable=True),
    Column("failed_task", String(255), nullable=True),
    Column("link_error", LargeBinary, nullable=True, comment="msgpack: the error callback"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True, index=True),
)

#: One row per member task of a workflow: its call, state and (once done) result.
workflow_members_table = Table(
    "taskq_workflow_members",
    metadata,
    Column("task_id", String(255), primary_key=True),
    Column("workflow_id", String(255), nullable=False),
    Column("step", Integer, nullable=False),
    Column("position", Integer, nullable=False),
    Column("task", String(255), nullable=False),
    Column("queue", String(255), nullable=False),
    Column("state", String(16), nullable=False, comment="PENDING, ENQUEUED, SUCCESS, FAILURE"),
    Column("call", LargeBinary, nullable=False, comment="msgpack: arguments and options"),
    Column("result", LargeBinary, nullable=True, comment="msgpack: the return value"),
    Column("error", Text, nullable=True),
    Column("traceback", Text, nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
)
Index(
    "ix_taskq_workflow_members_step",
    workflow_members_table.c.workflow_id,
    workflow_members_table.c.step,
    workflow_members_table.c.position,
)

#: The last thing each worker saw happen to a task (:mod:`taskq.states`): started where,
#: retrying until when, succeeded, dead-lettered into which ``Q.dlq``, skipped as a
#: duplicate. Written in batches by a thread of each worker process, off the task's path;
#: pruned by age like ``taskq_processed``.
task_states_table = Table(
    "taskq_task_states",
    metadata,
    Column("task_id", String(255), primary_key=True),
    Column("task", String(255), nullable=False),
    Column("queue", String(255), nullable=False),
    Column("state", String(16), nullable=False,
           comment="STARTED, RETRY, SUCCESS, FAILURE, DEAD or SKIPPED"),
    Column("retries", Integer, nullable=False, default=0),
    Column("idempotency_key", String(255), nullable=True),
    Column("worker", String(255), nullable=True, comment="host and pid of the worker process"),
    Column("error", Text, nullable=True),
    Column("next_at", DateTime(timezone=True), nullable=True, comment="RETRY: when it runs"),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
# Named by hand: Django refuses index names longer than 30 characters.
Index("ix_taskq_task_states_updated", task_states_table.c.updated_at)
