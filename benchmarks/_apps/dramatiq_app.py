"""Dramatiq bench app: ``dramatiq benchmarks._apps.dramatiq_app --processes 2 --threads T``.

Its ``RabbitmqBroker`` with the default middleware. Environment: ``BENCH_BROKER_URL``,
``BENCH_QUEUE`` (the actors' queue) and ``BENCH_CONFIRM=1`` for ``confirm_delivery``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from benchmarks._apps.bodies import latency, noop, sleep


@dataclass
class Bench:
    """A broker and the three actors on ``queue``."""

    broker: RabbitmqBroker
    noop: dramatiq.Actor
    sleep: dramatiq.Actor
    latency: dramatiq.Actor


def make(broker_url: str, queue: str, *, confirm: bool) -> Bench:
    broker = RabbitmqBroker(url=broker_url, confirm_delivery=confirm)

    def actor(fn, name):  # noqa: ANN001, ANN202
        return dramatiq.actor(fn, actor_name=name, queue_name=queue, broker=broker)

    return Bench(
        broker, actor(noop, "bench_noop"), actor(sleep, "bench_sleep"),
        actor(latency, "bench_latency"),
    )


bench = make(
    os.environ.get("BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"),
    os.environ.get("BENCH_QUEUE", "bench"),
    confirm=os.environ.get("BENCH_CONFIRM") == "1",
)
broker = bench.broker
dramatiq.set_broker(broker)
