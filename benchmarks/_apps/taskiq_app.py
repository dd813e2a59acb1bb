"""taskiq bench app: ``taskiq worker benchmarks._apps.taskiq_app:broker --workers 2``.

taskiq with its RabbitMQ broker, taskiq-aio-pika. Environment: ``BENCH_BROKER_URL``,
``BENCH_QUEUE`` (the task queue; the exchange and dead-letter queue are named after it so
every measurement removes its own) and ``BENCH_TASKIQ_BEST=1`` for the tuned configuration
(a classic queue and prefetch 256 instead of the defaults: a quorum queue, prefetch 10).
The tasks are ``async def`` (what taskiq is built for) around the shared probe bodies.
"""

from __future__ import annotations

import os

from taskiq_aio_pika import AioPikaBroker, Exchange, Queue, QueueType

from benchmarks._apps import bodies

#: Prefetch of the tuned configuration (taskq's default prefetch is 16 per process).
BEST_QOS = 256


def make(broker_url: str, queue: str, *, best: bool) -> AioPikaBroker:
    broker = AioPikaBroker(
        broker_url,
        qos=BEST_QOS if best else 10,
        exchange=Exchange(name=queue),
        task_queues=[Queue(name=queue, type=QueueType.CLASSIC if best else QueueType.QUORUM)],
        dead_letter_queue=Queue(name=f"{queue}.dead_letter"),
    )

    @broker.task(task_name="bench.noop")
    async def noop() -> None:
        bodies.noop()

    @broker.task(task_name="bench.sleep")
    async def sleep(seconds: float) -> None:
        bodies.sleep(seconds)  # blocks the loop like the other systems' sleep tasks do

    @broker.task(task_name="bench.latency")
    async def latency(sent_at: float) -> None:
        bodies.latency(sent_at)

    return broker


broker = make(
    os.environ.get("BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"),
    os.environ.get("BENCH_QUEUE", "bench"),
    best=os.environ.get("BENCH_TASKIQ_BEST") == "1",
)
