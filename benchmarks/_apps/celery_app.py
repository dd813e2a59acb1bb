"""Celery bench app: ``celery -A benchmarks._apps.celery_app worker -c 2 -P prefork``.

RabbitMQ through py-amqp (``pyamqp://``), ``task_acks_late=True``, otherwise Celery's
defaults. Environment: ``BENCH_BROKER_URL``, ``BENCH_QUEUE`` (the task queue; its name also
prefixes the event and control exchanges, so a run leaves nothing shared behind) and
``BENCH_CONFIRM=1`` for publisher confirms (``broker_transport_options``).
"""

from __future__ import annotations

import os

from celery import Celery

from benchmarks._apps.bodies import latency, noop, sleep


def make_app(broker_url: str, queue: str, *, confirm: bool) -> Celery:
    """A Celery app whose tasks go to ``queue``."""
    app = Celery("bench", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_default_queue=queue,
        event_exchange=f"{queue}.ev",
        control_exchange=queue,
        broker_connection_retry_on_startup=True,
    )
    if confirm:
        app.conf.broker_transport_options = {"confirm_publish": True}

    for fn in (noop, sleep, latency):
        # shared=False: each app (one per measurement in the harness) keeps its own tasks.
        app.task(name=f"bench.{fn.__name__}", shared=False)(fn)
    return app


app = make_app(
    os.environ.get("BENCH_BROKER_URL", "pyamqp://guest:guest@127.0.0.1:5672//"),
    os.environ.get("BENCH_QUEUE", "bench"),
    confirm=os.environ.get("BENCH_CONFIRM") == "1",
)
