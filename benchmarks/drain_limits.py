"""What limits draining a pre-filled queue: the broker's priority queue, or the worker's prefetch.

    python -m benchmarks.drain_limits [--tasks 40000] [--rounds 2] [--broker-cost]

Each point pre-fills a queue of its own with N no-op messages, starts consumers on it, and
measures from the first delivery to an empty queue (depth polled every 10 ms): tasks/s and the
CPU of the consumers' process tree and of the broker (``beam.smp``, /proc) per task.

- ``raw pika``, 2 processes, prefetch 16, one ``basic_ack`` per message (the ceiling of
  ``benchmarks.compare``), into a plain durable queue and into one with ``x-max-priority 10``
  (what taskq declares for a classic queue): the broker's own cost of the priority queue.
- ``raw pika`` on a queue that taskq declared and filled (``Task.starmap``): taskq's queue
  arguments, message properties and headers, without taskq's consumer.
- ``taskq worker -c 2`` with ``prefetch_count`` 4, 16 (the default) and 64, and ``-c 1`` at
  16: how the rate follows the window each process may hold (its I/O thread hands deliveries
  to the task thread and acks back, so each window's worth costs thread wake-ups).

``--broker-cost`` runs another set instead, all with the raw pika consumer, so that only the
queue and the messages change: a plain queue and priority queues of 1, 4 and 10 levels with
bare messages; taskq's headers alone (on a plain and on a priority queue, one header and all
four); taskq's body alone; taskq's properties without and with its headers; and taskq's
dead-letter arguments. The broker's CPU per message, point against point, is what each part
of taskq's queue and message costs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika

from benchmarks._apps.taskq_app import make_app
from benchmarks._contenders import BROKER_URL, Admin, publish_windowed, raw_pipelined
from benchmarks._proc import Broker, tree_cpu_s
from taskq.broker.publisher import _properties as wire_properties
from taskq.broker.topology import QueueOptions, queue_arguments
from taskq.message import TASK, encode


@dataclass
class Point:
    name: str
    rate: float
    worker_us: float
    broker_us: float


def _depth(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def drain(name: str, queue: str, n: int, command: list[str], env: dict[str, str],
          broker: Broker) -> Point:
    """Start ``command`` on the filled ``queue``; measure until it is empty."""
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    try:
        deadline = time.monotonic() + 120
        while _depth(channel, queue) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{queue} never held {n} messages")
            time.sleep(0.05)
        process = subprocess.Popen(command, env={**os.environ, **env},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while _depth(channel, queue) >= n:
                time.sleep(0.002)
            began, broker_began = time.monotonic(), broker.cpu_s() or 0.0
            worker_began = tree_cpu_s(process.pid)
            while _depth(channel, queue) > 0:
                time.sleep(0.01)
            elapsed = time.monotonic() - began
            worker_s = tree_cpu_s(process.pid) - worker_began
            broker_s = (broker.cpu_s() or 0.0) - broker_began
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:  # a consumer stuck in its shutdown: the point
                process.kill()                 # is measured already
                process.wait(10)
    finally:
        connection.close()
    return Point(name, n / elapsed, 1e6 * worker_s / n, 1e6 * broker_s / n)


def raw_point(n: int, arguments: dict[str, Any], label: str, broker: Broker,
              probe: str, message: Callable[[], tuple[bytes, pika.BasicProperties]] | None = None
              ) -> Point:
    """The raw consumer draining ``n`` messages from a queue declared with ``arguments``:
    8-byte bodies with minimal properties, or what ``message()`` returns."""
    queue = f"limits-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    connection.channel().queue_declare(queue, durable=True, arguments=arguments)
    connection.close()
    try:
        if message is None:
            raw_pipelined(BROKER_URL, queue, [b"\x00" * 8] * n)
        else:
            def send(channel: Any, _first: int, _room: int) -> int:
                body, properties = message()
                channel.basic_publish("", queue, body, properties)
                return 1

            publish_windowed(BROKER_URL, n, send)
        command = [sys.executable, "-m", "benchmarks._apps.raw_consumer", queue, "noop", "2"]
        env = {"BENCH_BROKER_URL": BROKER_URL, "BENCH_PROBE_DIR": probe,
               "BENCH_PREFETCH": "16"}
        return drain(label, queue, n, command, env, broker)
    finally:
        connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        connection.channel().queue_delete(queue)
        connection.close()


def taskq_point(n: int, processes: int, prefetch: int, broker: Broker, probe: str,
                *, raw_consumer: bool = False) -> Point:
    """``taskq worker`` draining ``n`` no-ops that taskq enqueued; with ``raw_consumer`` the
    raw pika consumer drains the same queue and messages instead (taskq's queue arguments,
    properties and headers, without taskq's consumer)."""
    namespace = f"limits{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.q"
    app = make_app(broker_url=BROKER_URL, namespace=namespace, default_queue=queue)
    try:
        app.registry.get("bench.noop").starmap([()] * n)
        if raw_consumer:
            command = [sys.executable, "-m", "benchmarks._apps.raw_consumer", queue, "noop",
                       str(processes)]
            env = {"BENCH_BROKER_URL": BROKER_URL, "BENCH_PROBE_DIR": probe,
                   "BENCH_PREFETCH": str(prefetch)}
            label = f"raw pika -c {processes}, taskq's queue and messages"
        else:
            command = [sys.executable, "-m", "taskq", "worker", "-A",
                       "benchmarks._apps.taskq_app:app", "-c", str(processes), "--no-relay",
                       "--loglevel", "WARNING"]
            env = {"TASKQ_BROKER_URL": BROKER_URL, "TASKQ_NAMESPACE": namespace,
                   "TASKQ_DEFAULT_QUEUE": queue, "TASKQ_PREFETCH_COUNT": str(prefetch),
                   "BENCH_PROBE_DIR": probe, "BENCH_IDEMPOTENT": "0"}
            label = f"taskq -c {processes}, prefetch {prefetch}"
        return drain(label, queue, n, command, env, broker)
    finally:
        app.close()
        Admin().delete_taskq_app(namespace, queue)


def broker_cost_points(n: int, broker: Broker, probe: str) -> list[Callable[[], Point]]:
    """Points that change one part of the queue or the message at a time (``--broker-cost``)."""
    namespace, queue = "limitscost", "limitscost.q"
    app = make_app(broker_url=BROKER_URL, namespace=namespace, default_queue=queue)
    wire = encode(app.registry.get("bench.noop").envelope(()))
    # What taskq declares for a classic work queue: its priority levels, its dead-letter route
    taskq_queue = queue_arguments(namespace, queue, QueueOptions(),
                                  default_max_priority=app.settings.default_max_priority)
    app.close()
    bare = b"\x00" * 8

    def message(body: bytes, headers: dict[str, Any] | None, full: bool
                ) -> Callable[[], tuple[bytes, pika.BasicProperties]]:
        def make() -> tuple[bytes, pika.BasicProperties]:
            task_id = str(uuid.uuid4())
            if full:  # taskq's publisher's properties, a fresh task id each
                properties = wire_properties(dataclasses.replace(wire, message_id=task_id))
                properties.headers = headers
            else:
                properties = pika.BasicProperties(delivery_mode=2, message_id=task_id,
                                                  headers=headers)
            return body, properties
        return make

    headers = wire.headers
    one = {TASK: headers[TASK]}
    priority = {"x-max-priority": taskq_queue["x-max-priority"]}
    cases: list[tuple[str, dict[str, Any], Callable[[], tuple[bytes, pika.BasicProperties]]]] = [
        ("plain queue, bare messages", {}, message(bare, None, False)),
        ("x-max-priority 1, bare", {"x-max-priority": 1}, message(bare, None, False)),
        ("x-max-priority 4, bare", {"x-max-priority": 4}, message(bare, None, False)),
        ("x-max-priority 10, bare", priority, message(bare, None, False)),
        ("plain queue, taskq's 4 headers only", {}, message(bare, headers, False)),
        ("x-max-priority 10, 1 header only", priority, message(bare, one, False)),
        ("x-max-priority 10, taskq's 4 headers only", priority, message(bare, headers, False)),
        ("x-max-priority 10, taskq's body only", priority, message(wire.body, None, False)),
        ("x-max-priority 10, taskq's properties, no headers", priority,
         message(wire.body, None, True)),
        ("x-max-priority 10, taskq's message", priority, message(wire.body, headers, True)),
        ("taskq's queue arguments and message", taskq_queue, message(wire.body, headers, True)),
    ]
    return [
        functools.partial(raw_point, n, arguments, f"raw pika -c 2, {label}", broker, probe, make)
        for label, arguments, make in cases
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--broker-cost", action="store_true",
                        help="what each part of taskq's queue and message costs the broker")
    args = parser.parse_args()
    broker, probe, n = Broker.find(), tempfile.mkdtemp(prefix="taskq-limits-"), args.tasks
    points: list[Callable[[], Point]] = [
        lambda: raw_point(n, {}, "raw pika -c 2, plain queue", broker, probe),
        lambda: raw_point(n, {"x-max-priority": 10}, "raw pika -c 2, x-max-priority 10",
                          broker, probe),
        lambda: taskq_point(n, 2, 16, broker, probe, raw_consumer=True),
        lambda: taskq_point(n, 2, 4, broker, probe),
        lambda: taskq_point(n, 2, 16, broker, probe),
        lambda: taskq_point(n, 2, 64, broker, probe),
        lambda: taskq_point(n, 1, 16, broker, probe),
    ]
    if args.broker_cost:
        points = broker_cost_points(n, broker, probe)
    results: dict[str, list[Point]] = {}
    for round_index in range(args.rounds):
        for measure in points:
            point = measure()
            results.setdefault(point.name, []).append(point)
            print(f"round {round_index + 1} {point.name:<60} {point.rate:8,.0f}/s  worker "
                  f"{point.worker_us:5.0f} µs/task  broker {point.broker_us:5.0f} µs/task",
                  flush=True)
    print(f"\n| consumer | tasks/s (median of {args.rounds}) | runs | worker CPU µs/task | "
          "broker CPU µs/task |\n|---|---:|---|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(p.rate for p in runs):,.0f} | "
              f"{' · '.join(f'{p.rate:,.0f}' for p in runs)} | "
              f"{statistics.median(p.worker_us for p in runs):.0f} | "
              f"{statistics.median(p.broker_us for p in runs):.0f} |")


if __name__ == "__main__":
    main()
