"""``django.tasks`` on taskq (``TaskqBackend``), against real RabbitMQ, PostgreSQL and workers.

Runs on Django 6.x (``django.tasks``) and on Django 4.2 with the ``django-tasks`` backport:
``make test`` runs this module in both environments. The test tasks are in
tests/contrib/djapp/tasks.py; the worker is ``manage.py taskq worker`` of the example shop
with the same settings (tests/contrib/django_settings.py), and logs every signal it sends.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App, PublishError
from taskq.testing import WorkerProcess
from tests.conftest import BROKER_URL
from tests.contrib.conftest import SHOP_DIR, count_rows, schema_url, shop_database_env
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_until

FINAL = ("SUCCESSFUL", "FAILED")


@pytest.fixture
def start_shop_worker(
    shop_app: App,
    django_schema: str,
    worker_env: dict[str, str],
    start_command: Callable[..., WorkerProcess],
) -> Callable[..., WorkerProcess]:
    """Factory: ``manage.py taskq worker -c 1`` in this test's namespace, consuming."""

    def start(**env: str) -> WorkerProcess:
        worker = start_command(
            ["manage.py", "taskq", "worker", "-c", "1", "--loglevel", "INFO"],
            cwd=SHOP_DIR,
            env={**worker_env, **shop_database_env(django_schema), **env},
        )
        worker.wait_ready()
        return worker

    return start


@pytest.fixture
def enqueued() -> Iterator[list[Any]]:
    """The ``task_result`` of every ``task_enqueued`` signal this process receives."""
    from taskq.contrib.django.tasks._api import task_enqueued

    received: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        received.append(task_result)

    task_enqueued.connect(receive, weak=False, dispatch_uid="test-enqueued")
    yield received
    task_enqueued.disconnect(dispatch_uid="test-enqueued")


def finished(task: Any, result_id: str, worker: WorkerProcess, timeout_s: float = 30) -> Any:
    """Wait until the task's result is final; return it."""
    worker.wait_for(lambda: str(task.get_result(result_id).status) in FINAL, timeout_s=timeout_s)
    return task.get_result(result_id)


def signals(worker: WorkerProcess, name: str, result_id: str) -> list[str]:
    """The status of each ``name`` signal the worker sent for ``result_id``."""
    return re.findall(rf"signal {name} {re.escape(result_id)} (\w+)", worker.log())


@pytest.mark.slow
def test_rolled_back_enqueue_never_runs_and_a_committed_one_runs_once_with_its_result(
    start_shop_worker: Callable[..., WorkerProcess], django_schema: str, enqueued: list[Any],
) -> None:
    from django.db import transaction

    from taskq.contrib.django.tasks._api import TaskResultDoesNotExist
    from tests.contrib.djapp.tasks import add

    worker = start_shop_worker()
    url = schema_url(django_schema)

    # When: enqueue inside atomic() and the block raises
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = add.enqueue(1, 2)
        raise RuntimeError("rolled back")

    # Then: no trace of it: no record, no outbox row, no result, no signal
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(rolled_back.id)
    assert count_rows(url, "taskq_outbox") == 0
    assert enqueued == []

    # When: the same inside a block that commits
    with transaction.atomic():
        committed = add.enqueue(2, 3)
        assert add.get_result(committed.id).status == "READY"
        assert enqueued == []  # sent once the task exists: at commit

    # Then: it runs once, and get_result() shows it
    result = finished(add, committed.id, worker)
    assert (result.status, result.return_value, result.args) == ("SUCCESSFUL", 5, [2, 3])
    assert result.attempts == 1 and len(result.worker_ids) == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert [r.id for r in enqueued] == [committed.id]
    assert signals(worker, "task_started", committed.id) == ["RUNNING"]
    assert signals(worker, "task_finished", committed.id) == ["SUCCESSFUL"]
    assert rolled_back.id not in worker.log()
    wait_until(lambda: count_rows(url, "taskq_outbox") == 0, timeout_s=10)
    assert worker.stop(timeout_s=20) == 0


@pytest.mark.slow
def test_a_failed_task_is_failed_with_its_exception_class_path_and_traceback(
    start_shop_worker: Callable[..., WorkerProcess], enqueued: list[Any],
) -> None:
    from tests.contrib.djapp.tasks import add, decline, label

    worker = start_shop_worker()

    failing = decline.enqueue(7)  # outside atomic(): published at once, confirmed
    result = finished(decline, failing.id, worker)

    assert result.status == "FAILED"
    assert [e.exception_class_path for e in result.errors] == [
        "tests.contrib.djapp.tasks.PaymentDeclined"
    ]
    assert "order 7: card declined" in result.errors[0].traceback
    assert result.errors[0].exception_class.__name__ == "PaymentDeclined"
    assert result.finished_at is not None and result.attempts == 1
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    assert signals(worker, "task_finished", failing.id) == ["FAILED"]
    assert [r.id for r in enqueued] == [failing.id]

    # aenqueue / aget_result work too (Django's sync_to_async defaults)
    queued = asyncio.run(add.aenqueue(20, 22))
    worker.wait_for(lambda: str(add.get_result(queued.id).status) == "SUCCESSFUL")
    assert asyncio.run(add.aget_result(queued.id)).return_value == 42

    # A signal receiver that raises in the worker is logged and fails nothing
    survived = finished(label, label.enqueue("receiver-raises").id, worker)
    assert (survived.status, survived.attempts) == ("SUCCESSFUL", 1)
    assert "a receiver's own bug" in worker.log()
    assert worker.stop(timeout_s=20) == 0


@pytest.mark.slow
def test_a_task_past_its_time_limit_is_failed_with_taskq_s_reason(
    start_shop_worker: Callable[..., WorkerProcess],
) -> None:
    from tests.contrib.djapp.tasks import sleepy

    worker = start_shop_worker()

    queued = sleepy.enqueue(60)  # @task(time_limit_s=1.0); OPTIONS: max_retries=0
    result = finished(sleepy, queued.id, worker)

    assert result.status == "FAILED" and result.attempts == 1
    assert [e.exception_class_path for e in result.errors] == ["taskq.errors.TimeLimitExceeded"]
    assert signals(worker, "task_started", queued.id) == ["RUNNING"]
    assert worker.stop(timeout_s=20) == 0

@pytest.mark.slow
def test_priorities_order_a_backlog_and_run_after_is_respected(
    start_shop_worker: Callable[..., WorkerProcess],
) -> None:
    from django.utils import timezone

    from tests.contrib.djapp.tasks import label

    # Given: a backlog in the queue before any worker runs, and one deferred task
    later_at = timezone.now() + timedelta(seconds=3)
    deferred = label.using(run_after=later_at, priority=100).enqueue("deferred")
    ids = {
        priority: label.using(priority=priority).enqueue(f"p{priority}").id
        for priority in (-100, 0, 100, -50, 50)
    }

    # When: one worker process works through it
    worker = start_shop_worker()
    results = {p: finished(label, task_id, worker) for p, task_id in ids.items()}
    late = finished(label, deferred.id, worker, timeout_s=30)

    # Then: highest Django priority first; the deferred task not before its run_after
    by_start = sorted(results, key=lambda p: results[p].started_at)
    assert by_start == [100, 50, 0, -50, -100]
    assert late.return_value == "deferred"
    assert late.started_at >= later_at
    assert late.task.run_after == later_at and late.task.priority == 100
    assert worker.stop(timeout_s=20) == 0


@pytest.mark.slow
def test_takes_context_sees_the_attempt_number_across_retries(
    start_shop_worker: Callable[..., WorkerProcess],
) -> None:
    from tests.contrib.djapp.tasks import flaky

    worker = start_shop_worker()

    queued = flaky.enqueue(2)  # fails on attempts 1 and 2; @task(max_retries=2, ...)
    result = finished(flaky, queued.id, worker)

    assert (result.status, result.return_value, result.attempts) == ("SUCCESSFUL", 3, 3)
    assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"] * 2
    assert signals(worker, "task_started", queued.id) == ["RUNNING"] * 3
    assert signals(worker, "task_finished", queued.id) == ["SUCCESSFUL"]  # once, at the end
    assert worker.stop(timeout_s=20) == 0


@pytest.mark.slow
def test_broker_down_at_commit_the_outbox_task_runs_later_and_on_commit_loses_it(
    shop_app: App, start_shop_worker: Callable[..., WorkerProcess], django_schema: str,
) -> None:
    from django.db import transaction
    from orders.models import Order
    from orders.tasks import send_confirmation

    with TcpProxy.for_url(BROKER_URL) as proxy:
        # Given: the web process and the worker reach RabbitMQ only through the proxy
        proxy_url = proxy.url(BROKER_URL)
        shop_app.configure(broker_url=proxy_url, publish_confirm_timeout_s=2,
                           connect_timeout_s=1)
        worker = start_shop_worker(TASKQ_BROKER_URL=proxy_url)

        # When: the broker is unreachable while two requests commit
        proxy.cut()
        with transaction.atomic():  # enqueue() inside the transaction: an outbox row
            kept = Order.objects.create(email="ada@example.com", total_cents=100)
            kept_task = send_confirmation.enqueue(kept.id)
        with pytest.raises(PublishError), transaction.atomic():  # Django's documented way
            lost = Order.objects.create(email="bob@example.com", total_cents=200)
            transaction.on_commit(partial(send_confirmation.enqueue, lost.id))

        # Then: both orders are committed; only the first has a task, waiting in the outbox
        assert Order.objects.filter(pk__in=[kept.id, lost.id]).count() == 2
        url = schema_url(django_schema)
        assert count_rows(url, "taskq_outbox") == 1
        assert count_rows(url, "taskq_django_tasks") == 1

        # When: the broker comes back
        proxy.restore()

        # Then: the outbox task runs; the on_commit one is gone for good
        result = finished(send_confirmation, kept_task.id, worker, timeout_s=60)
        assert result.return_value.startswith(f"Django shop: order #{kept.id} confirmed")
        assert Order.objects.get(pk=kept.id).confirmation == result.return_value
        assert Order.objects.get(pk=lost.id).confirmation is None
        # the relay deletes the row after the confirm: maybe after the task already ran
        wait_until(lambda: count_rows(url, "taskq_outbox") == 0, timeout_s=10)
        assert count_rows(url, "taskq_django_tasks") == 1
        assert worker.log().count("confirmation to ") == 1
        assert worker.stop(timeout_s=20) == 0


# -- without a worker ------------------------------------------------------------------------


def test_django_priorities_map_monotonically_onto_taskq_levels() -> None:
    from taskq.contrib.django.tasks.backend import taskq_priority

    levels = [taskq_priority(p) for p in range(-100, 101)]

    assert levels == sorted(levels)
    assert (levels[0], levels[-1], taskq_priority(0), taskq_priority(1)) == (0, 9, 4, 5)
    assert sorted(set(levels)) == list(range(10))


def test_the_default_priority_is_accepted_on_a_quorum_queue_and_others_refused_at_the_call(
    shop_app: App, django_schema: str, namespace: str, broker: Any
) -> None:
    """Issue 26, 3.5: Django's default priority (0) mapped to taskq's 4, which a quorum
    queue refuses, so with default_queue_type="quorum" every enqueue() raised. On RabbitMQ
    4.x, whose quorum queues honour priorities, every priority is taken (mapped)."""
    from django.db import transaction

    from taskq.contrib.django.tasks._api import InvalidTask
    from tests.conftest import delete_topology
    from tests.contrib.djapp.tasks import add

    url = schema_url(django_schema)
    shop_app.configure(default_queue_type="quorum")
    queue = f"{namespace}.default"
    try:
        # RabbitMQ 4.x orders a quorum queue by priority, 3.x does not (docs/rabbitmq.md):
        # Django's priorities map onto taskq's where the broker honours them
        takes_priorities = shop_app.road.takes_priorities(queue)
        # inside atomic(): the outbox row, with Django's default priority
        with transaction.atomic():
            add.enqueue(1, 2)
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                priorities = conn.execute(sa.text("SELECT priority FROM taskq_outbox")).all()
        finally:
            engine.dispose()
        assert [row[0] for row in priorities] == [4 if takes_priorities else 0]
        # outside: published at once to the quorum queue
        add.enqueue(2, 3)
        wait_until(lambda: broker.depth(queue) == 1, timeout_s=10)
        if takes_priorities:
            # a higher priority is honoured (RabbitMQ 4.x)
            add.using(priority=50).enqueue(3, 4)
            wait_until(lambda: broker.depth(queue) == 2, timeout_s=10)
        else:
            # a priority the quorum queue cannot honour: refused at the call, nothing written
            with pytest.raises(InvalidTask,
                               match=f"priority 50 for taskq queue '{queue}'.*arrival"):
                add.using(priority=50).enqueue(1, 2)
        # a call the function cannot take: refused at the call, nothing written
        with pytest.raises(TypeError, match="cannot be called.*missing a required argument"):
            add.enqueue(1)
        assert count_rows(url, "taskq_outbox") == 1
        assert count_rows(url, "taskq_django_tasks") == (3 if takes_priorities else 2)
        assert broker.depth(queue) == (2 if takes_priorities else 1)
    finally:
        shop_app.configure(default_queue_type="classic")
        delete_topology(shop_app)


def test_enqueue_refuses_what_json_cannot_hold_and_leaves_nothing(
    shop_app: App, django_schema: str
) -> None:
    from django.db import transaction

    from tests.contrib.djapp.tasks import add

    with transaction.atomic():
        with pytest.raises(TypeError, match="Unsupported type"):
            add.enqueue({1, 2}, 3)
        with pytest.raises(TypeError, match=r"args\[0\] has the key 1: JSON object keys"):
            add.enqueue({1: "a"}, 3)
        with pytest.raises(ValueError, match=r"kwargs\['b'\] is nan"):
            add.enqueue(1, b=float("nan"))
        queued = add.enqueue((1, 2), b=3)  # a tuple becomes a list, as JSON would have it

    assert (queued.args, queued.kwargs) == ([[1, 2]], {"b": 3})
    assert add.get_result(queued.id).args == [[1, 2]]
    url = schema_url(django_schema)
    assert count_rows(url, "taskq_django_tasks") == count_rows(url, "taskq_outbox") == 1


def test_backend_validation_refuses_what_taskq_cannot_run(shop_app: App) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from taskq.contrib.django.tasks._api import InvalidTask
    from taskq.contrib.django.tasks.backend import TaskqBackend
    from tests.contrib.djapp.tasks import add

    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        add.using(run_after=datetime(2030, 1, 1))  # noqa: DTZ001 - the point of the test
    with pytest.raises(InvalidTask, match="not valid for backend"):
        add.using(queue_name="nowhere")
    with pytest.raises(ImproperlyConfigured, match="unknown option.*transactional"):
        TaskqBackend("other", {"OPTIONS": {"transactional": True}})
    with pytest.raises(ImproperlyConfigured, match="max_retries"):
        TaskqBackend("other", {"OPTIONS": {"max_retries": -1}})


def test_task_options_come_from_the_decorator_over_the_backend_options(shop_app: App) -> None:
    from tests.contrib.djapp.tasks import flaky, label

    options = {t.name: t.options for t in shop_app.registry}
    flaky_options = options["tests.contrib.djapp.tasks.flaky"]
    assert (flaky_options.max_retries, flaky_options.retry_backoff) == (2, 0.2)
    assert flaky_options.autoretry_for == (ConnectionError,)
    assert options["tests.contrib.djapp.tasks.label"].max_retries == 0  # OPTIONS' default
    assert options["tests.contrib.djapp.tasks.label"].time_limit_s == 300
    assert all(options[t.module_path].store_result for t in (flaky, label))


def test_system_checks_report_a_database_the_relay_does_not_read(shop_app: App) -> None:
    from django.core.management import call_command

    from taskq.contrib.django.tasks.backend import TaskqBackend
    from taskq.contrib.django.tasks.checks import check_backend

    call_command("check")  # the shop's own configuration passes

    missing = TaskqBackend("other", {"OPTIONS": {"database": "nope"}})
    assert [m.id for m in check_backend(missing)] == ["taskq.E102"]
    elsewhere = TaskqBackend("other", {"OPTIONS": {"database": "orders"}})
    databases = {"orders": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/orders.db"}}
    messages = check_backend(elsewhere, databases)
    assert [m.id for m in messages] == ["taskq.E103"]
    assert "would never be published" in messages[0].msg


def test_db_prune_deletes_the_records_of_pruned_results_only(shop_app: App) -> None:
    from django.core.management import call_command
    from django.utils import timezone

    from taskq.contrib.django.models import TaskRecord, TaskResult

    long_ago = timezone.now() - timedelta(days=30)
    for task_id, attempted_at in (("pruned", long_ago), ("kept", long_ago), ("waiting", None)):
        TaskRecord.objects.create(
            id=task_id, task_path="tests.contrib.djapp.tasks.add", backend="default",
            queue_name="default", enqueued_at=long_ago, last_attempted_at=attempted_at,
        )
    TaskResult.objects.create(task_id="kept", task="tests.contrib.djapp.tasks.add",
                              state="SUCCESS", created_at=timezone.now())

    call_command("taskq", "db", "prune", "--older-than", "1d")

    assert sorted(TaskRecord.objects.values_list("id", flat=True)) == ["kept", "waiting"]


def test_a_call_too_large_to_send_leaves_no_record_in_a_transaction_that_commits(
    shop_app: App, django_schema: str
) -> None:
    from django.db import transaction

    from taskq import MessageTooLarge
    from tests.contrib.djapp.tasks import label

    with transaction.atomic():
        with pytest.raises(MessageTooLarge, match="max_message_size_bytes"):
            label.enqueue("x" * 2_000_000)
        # the caller goes on and commits

    url = schema_url(django_schema)
    assert count_rows(url, "taskq_django_tasks") == count_rows(url, "taskq_outbox") == 0


def test_the_backend_queues_are_consumed_by_taskq_worker(shop_app: App, namespace: str) -> None:
    from taskq.contrib.django.tasks.backend import TaskqBackend
    from tests.contrib.djapp.tasks import add

    emails = f"{namespace}.emails"
    backend = TaskqBackend("other", {"QUEUES": ["default", emails]})

    backend.validate_task(add)  # what Django does when it builds a Task

    assert emails in shop_app.queue_names()  # `taskq worker` without -Q consumes them
    assert backend.taskq_queue("default") == shop_app.settings.default_queue
    assert backend.taskq_queue(emails) == emails


@pytest.mark.parametrize(
    ("state", "status"),
    [("STARTED", "RUNNING"), ("RETRY", "READY"), ("SUCCESS", "SUCCESSFUL"),
     ("FAILURE", "FAILED"), ("DEAD", "FAILED")],
)
def test_get_result_maps_taskq_states_onto_django_statuses(
    shop_app: App, state: str, status: str
) -> None:
    from django.utils import timezone

    from taskq.contrib.django.models import TaskRecord, TaskResult
    from tests.contrib.djapp.tasks import add

    now = timezone.now()
    TaskRecord.objects.create(
        id="t1", task_path=add.module_path, backend="default", queue_name="default",
        args=[1, 2], enqueued_at=now, started_at=now, last_attempted_at=now,
        worker_ids=["host:1"],
    )
    TaskResult.objects.create(task_id="t1", task=add.module_path, state=state, created_at=now,
                              error="Reject: out of stock", finished_at=now)

    result = add.get_result("t1")

    assert (result.status, result.attempts, result.args) == (status, 1, [1, 2])
    assert (result.finished_at is not None) == (status in FINAL)
    if status == "FAILED":  # ended outside the function: taskq's reason
        assert [e.exception_class_path for e in result.errors] == ["taskq.errors.Reject"]
        assert result.errors[0].traceback == "Reject: out of stock"
