"""Drain rate of ``taskq worker`` against a raw pika consumer with the same processes.

Both drain the same queue pre-filled with N no-op tasks, with the same prefetch and number
of processes; the raw consumer only acks each delivery (``basic_ack`` in the callback), which
is the ceiling any pika-based worker can reach. The rate is measured from the first delivery
(queue depth below N) to an empty queue, by polling the depth every 10 ms.

Usage::

    python -m benchmarks.worker [--tasks 20000] [--processes 2] [--prefetch 16] [--rounds 3]

Needs RabbitMQ on ``TASKQ_BROKER_URL`` (default: local). Figures go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pika

from taskq.broker import topology as topo
from taskq.message import Envelope, encode

ROOT = Path(__file__).resolve().parents[1]
BROKER_URL = os.environ.get("TASKQ_BROKER_URL", "amqp://guest:guest@localhost:5672/%2F")


def fill(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int) -> None:
    """Publish ``n`` no-op tasks straight to ``queue`` and wait until they are all in it."""
    for _ in range(n):
        wire = encode(Envelope(task_id=str(uuid.uuid4()), task="tests.tasks.noop"))
        properties = pika.BasicProperties(
            message_id=wire.message_id, headers=wire.headers, priority=wire.priority,
            timestamp=wire.timestamp, app_id=wire.app_id, content_type=wire.content_type,
            delivery_mode=2,
        )
        channel.basic_publish("", queue, wire.body, properties)
    while depth(channel, queue) < n:
        time.sleep(0.05)


def depth(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    """Ready messages in ``queue``."""
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def measure(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int,
            timeout_s: float = 300.0) -> float:
    """Tasks per second from the first delivery to an empty queue."""
    deadline = time.monotonic() + timeout_s
    start = None
    while time.monotonic() < deadline:
        now, ready = time.monotonic(), depth(channel, queue)
        if start is None and ready < n:
            start = (now, ready)
        if ready == 0 and start is not None:
            elapsed = now - start[0]
            return start[1] / elapsed if elapsed > 0 else float("inf")
        time.sleep(0.01)
    raise TimeoutError(f"{queue} not drained within {timeout_s}s")


def children_cpu_s() -> float:
    """CPU seconds (user + system) used so far by waited-for child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_taskq(channel, namespace: str, queue: str, args: argparse.Namespace) -> float:
    """Drain with ``taskq worker -c P`` at log level WARNING."""
    fill(channel, queue, args.tasks)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace,
        "TASKQ_DEFAULT_QUEUE": queue,
    }
    command = [
        sys.executable, "-m", "taskq", "worker", "-A", "tests.tasks:app",
        "-c", str(args.processes), "--prefetch", str(args.prefetch), "--loglevel", "WARNING",
    ]
    worker = subprocess.Popen(command, env=env, cwd=ROOT)
    try:
        return measure(channel, queue, args.tasks)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)


def _raw_consumer(queue: str, prefetch: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)

    def on_message(ch, method, properties, body):  # noqa: ANN001 - pika callback
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    signal.signal(signal.SIGTERM, lambda *_: channel.stop_consuming())
    channel.start_consuming()
    connection.close()


def run_raw(channel, queue: str, args: argparse.Namespace) -> float:
    """Drain with P processes of a raw pika consumer acking each message."""
    fill(channel, queue, args.tasks)
    context = multiprocessing.get_context("spawn")
    consumers = [
        context.Process(target=_raw_consumer, args=(queue, args.prefetch))
        for _ in range(args.processes)
    ]
    for process in consumers:
        process.start()
    try:
        return measure(channel, queue, args.tasks)
    finally:
        for process in consumers:
            process.terminate()
            process.join(10)


def main() -> None:
    """Run the rounds and print tasks/s for each contender."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.default"
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    arguments = topo.queue_arguments(
        namespace, queue, topo.QueueOptions(), default_max_priority=10
    )
    channel.queue_declare(queue, durable=True, arguments=arguments)
    results: dict[str, list[float]] = {"taskq": [], "raw pika": []}
    cpu: dict[str, list[float]] = {"taskq": [], "raw pika": []}
    runners = {
        "raw pika": lambda: run_raw(channel, queue, args),
        "taskq": lambda: run_taskq(channel, namespace, queue, args),
    }
    try:
        for round_number in range(1, args.rounds + 1):
            for name, runner in runners.items():
                before = children_cpu_s()
                results[name].append(runner())
                cpu[name].append((children_cpu_s() - before) / args.tasks * 1e6)
            print(
                f"round {round_number}: " + ", ".join(
                    f"{name} {results[name][-1]:,.0f} tasks/s ({cpu[name][-1]:.0f} us CPU/task)"
                    for name in runners
                ),
                flush=True,
            )
    finally:
        for name in (queue, topo.dlq_name(queue), topo.unroutable_name(namespace)):
            channel.queue_delete(name)
        for name in (namespace, topo.dlx_name(namespace), topo.unroutable_name(namespace)):
            channel.exchange_delete(name)
        connection.close()
    for label, pick in (("median", statistics.median), ("best", max)):
        raw, ours = pick(results["raw pika"]), pick(results["taskq"])
        print(
            f"{args.tasks} no-op tasks, {args.processes} processes, prefetch {args.prefetch} "
            f"({label} of {args.rounds}): raw pika {raw:,.0f} tasks/s, taskq worker "
            f"{ours:,.0f} tasks/s = {ours / raw:.0%} of raw"
        )
    print(
        "CPU per task, median (all processes, start-up included): "
        f"raw pika {statistics.median(cpu['raw pika']):.0f} us, "
        f"taskq {statistics.median(cpu['taskq']):.0f} us"
    )


if __name__ == "__main__":
    main()
