"""What limits draining a pre-filled queue: the broker's priority queue, or the worker's prefetch.

    python -m benchmarks.drain_limits [--tasks 40000] [--rounds 2]

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
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pika

from benchmarks._apps.taskq_app import make_app
from benchmarks._contenders import BROKER_URL, Admin, raw_pipelined
from benchmarks._proc import Broker, tree_cpu_s


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
            process.wait(30)
    finally:
        connection.close()
    return Point(name, n / elapsed, 1e6 * worker_s / n, 1e6 * broker_s / n)


def raw_point(n: int, arguments: dict[str, int], label: str, broker: Broker,
              probe: str) -> Point:
    queue = f"limits-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    connection.channel().queue_declare(queue, durable=True, arguments=arguments)
    connection.close()
    try:
        raw_pipelined(BROKER_URL, queue, [b"\x00" * 8] * n)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=2)
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
    results: dict[str, list[Point]] = {}
    for round_index in range(args.rounds):
        for measure in points:
            point = measure()
            results.setdefault(point.name, []).append(point)
            print(f"round {round_index + 1} {point.name:<34} {point.rate:8,.0f}/s  worker "
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
