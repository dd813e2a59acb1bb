"""Django models of taskq's tables (taskq.schema), for queries and the admin.

The tables belong to taskq (:mod:`taskq.schema`); the migrations create them with exactly
taskq's DDL, and these models describe them to Django. Treat them as read-only: the relay
and the worker write these rows.
"""

from __future__ import annotations

from django.db import models


class OutboxMessage(models.Model):
    """A task waiting in ``taskq_outbox`` for the relay to publish it."""

    id = models.CharField(max_length=255, primary_key=True)
    queue = models.CharField(max_length=255)
    task = models.CharField(max_length=255)
    body = models.BinaryField()
    headers = models.BinaryField()
    priority = models.SmallIntegerField(default=0)
    eta = models.DateTimeField(null=True)
    idempotency_key = models.CharField(max_length=255, null=True, unique=True)
    created_at = models.DateTimeField()
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(null=True)
    ordering_key = models.CharField(max_length=255, null=True)

    class Meta:
        db_table = "taskq_outbox"
        indexes = [
            models.Index(fields=["next_attempt_at", "created_at"], name="ix_taskq_outbox_due"),
            models.Index(
                fields=["queue", "ordering_key", "created_at"], name="ix_taskq_outbox_ordering"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task}[{self.id}] -> {self.queue}"


class ProcessedKey(models.Model):
    """The idempotency key of a task that finished (``taskq_processed``)."""

    key = models.CharField(max_length=255, primary_key=True)
    task = models.CharField(max_length=255)
    finished_at = models.DateTimeField()

    class Meta:
        db_table = "taskq_processed"
        indexes = [
            models.Index(fields=["finished_at"], name="ix_taskq_processed_finished_at")
        ]

    def __str__(self) -> str:
        return f"{self.task} {self.key}"


class TaskResult(models.Model):
    """A task's state and result (``taskq_results``)."""

    task_id = models.CharField(max_length=255, primary_key=True)
    task = models.CharField(max_length=255)
    state = models.CharField(max_length=16)
    result = models.BinaryField(null=True)
    error = models.TextField(null=True)
    traceback = models.TextField(null=True)
    retries = models.IntegerField(default=0)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "taskq_results"
        indexes = [models.Index(fields=["finished_at"], name="ix_taskq_results_finished_at")]

    def __str__(self) -> str:
        return f"{self.task}[{self.task_id}] {self.state}"


class TaskRecord(models.Model):
    """A ``django.tasks`` call enqueued through ``TaskqBackend`` (``taskq_django_tasks``).

    Written in the caller's transaction together with the outbox row, so a rolled-back
    ``enqueue()`` leaves neither; the worker adds each attempt's worker id and error.
    ``TaskqBackend.get_result()`` reads it with the task's ``taskq_results`` row (status,
    return value, finished_at), which only exists once a worker started the task. Django
    only: not part of ``taskq.metadata``.
    """

    id = models.CharField(max_length=255, primary_key=True)
    task_path = models.CharField(max_length=255)
    backend = models.CharField(max_length=255)
    queue_name = models.CharField(max_length=255)
    priority = models.SmallIntegerField(default=0)
    run_after = models.DateTimeField(null=True)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    last_attempted_at = models.DateTimeField(null=True)
    worker_ids = models.JSONField(default=list)
    errors = models.JSONField(default=list)

    class Meta:
        db_table = "taskq_django_tasks"
        indexes = [models.Index(fields=["enqueued_at"], name="ix_taskq_django_tasks_enq")]

    def __str__(self) -> str:
        return f"{self.task_path}[{self.id}]"


class Schedule(models.Model):
    """A periodic task's stored state (``taskq_schedule``): its next and last run."""

    name = models.CharField(max_length=255, primary_key=True)
    task = models.CharField(max_length=255)
    schedule = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    next_run_at = models.DateTimeField()
    last_run_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "taskq_schedule"

    def __str__(self) -> str:
        return f"{self.name}: {self.schedule} -> {self.task}"


class Scheduler(models.Model):
    """A scheduler process seen (``taskq_schedulers``), with its last heartbeat."""

    id = models.CharField(max_length=64, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        db_table = "taskq_schedulers"

    def __str__(self) -> str:
        return f"scheduler {self.id[:8]} on {self.host} pid {self.pid}"


class Workflow(models.Model):
    """A chain, group or chord and where it stands (``taskq_workflows``)."""

    id = models.CharField(max_length=255, primary_key=True)
    kind = models.CharField(max_length=16)
    state = models.CharField(max_length=16)
    step = models.IntegerField()
    steps = models.IntegerField()
    remaining = models.IntegerField()
    result = models.BinaryField(null=True)
    error = models.TextField(null=True)
    failed_task_id = models.CharField(max_length=255, null=True)
    failed_task = models.CharField(max_length=255, null=True)
    link_error = models.BinaryField(null=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "taskq_workflows"
        indexes = [models.Index(fields=["finished_at"], name="ix_taskq_workflows_finished_at")]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} {self.state}"


class WorkflowMember(models.Model):
    """One member task of a workflow (``taskq_workflow_members``)."""

    task_id = models.CharField(max_length=255, primary_key=True)
    workflow_id = models.CharField(max_length=255)
    step = models.IntegerField()
    position = models.IntegerField()
    task = models.CharField(max_length=255)
    queue = models.CharField(max_length=255)
    state = models.CharField(max_length=16)
    call = models.BinaryField()
    result = models.BinaryField(null=True)
    error = models.TextField(null=True)
    traceback = models.TextField(null=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "taskq_workflow_members"
        indexes = [
            models.Index(fields=["workflow_id", "step", "position"],
                         name="ix_taskq_workflow_members_step")
        ]

    def __str__(self) -> str:
        return f"{self.task}[{self.task_id}] {self.state}"


class TaskState(models.Model):
    """What a worker last saw happen to a task (``taskq_task_states``, :mod:`taskq.states`)."""

    task_id = models.CharField(max_length=255, primary_key=True)
    task = models.CharField(max_length=255)
    queue = models.CharField(max_length=255)
    state = models.CharField(max_length=16)
    retries = models.IntegerField()
    idempotency_key = models.CharField(max_length=255, null=True)
    worker = models.CharField(max_length=255, null=True)
    error = models.TextField(null=True)
    next_at = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "taskq_task_states"
        indexes = [models.Index(fields=["updated_at"], name="ix_taskq_task_states_updated")]

    def __str__(self) -> str:
        return f"{self.task} {self.task_id} {self.state}"
