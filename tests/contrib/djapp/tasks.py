"""Test tasks: django.tasks functions on TaskqBackend, and one taskq-native task."""

from __future__ import annotations

from shopsite.taskq_app import app

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task


class PaymentDeclined(Exception):
    """What ``decline`` raises (its class path shows in TaskResult.errors)."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def decline(order_id: int) -> None:
    raise PaymentDeclined(f"order {order_id}: card declined")


@task(takes_context=True, max_retries=2, autoretry_for=(ConnectionError,),
      retry_backoff=0.2, retry_jitter=False)
def flaky(context, fail_attempts: int) -> int:  # noqa: ANN001 - Django's TaskContext
    if context.attempt <= fail_attempts:
        raise ConnectionError(f"attempt {context.attempt} fails")
    return int(context.attempt)


@task
def label(text: str) -> str:
    return text


@app.task
def note(order_id: int) -> None:
    """A taskq-native task (``@app.task``): the contrib API without django.tasks."""
    from orders.models import Order

    Order.objects.filter(pk=order_id).update(confirmation="noted")


@task(time_limit_s=1.0)
def sleepy(seconds: float) -> None:
    import time

    time.sleep(seconds)  # past its hard time limit: the worker replaces the process


@app.task
def double(x: int) -> int:
    """A workflow member (tests of chains started inside transaction.atomic())."""
    return 2 * x


@app.task
def plus(x: int, y: int) -> int:
    return x + y
