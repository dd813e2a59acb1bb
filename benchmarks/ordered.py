"""Ordered queue (16 partitions) beside an unordered queue: no-op drain rate, same run.

Each round pre-fills one queue with N no-op tasks over 1,000 keys (``starmap``: windowed
confirms, routed per key), starts ``taskq worker -c P`` on it and measures tasks per second
from the first delivery to empty queue(s), polling every 10 ms; then the same for the other
queue. The ordered queue's figure includes single active consumer per partition (each process
registers its share first, the rest as standby) and serial execution per partition.

Usage::

    python -m benchmarks.ordered [--tasks 20000] [--processes 2] [--partitions 16] [--rounds 3]

Needs RabbitMQ on ``TASKQ_BROKER_URL`` (default: local). Figures go to benchmarks/README.md
and docs/ordering.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pika

from taskq import App
from taskq.task import Task

ROOT = Path(__file__).resolve().parents[1]
BROKER_URL = os.environ.get("TASKQ_BROKER_URL", "amqp://guest:guest@localhost:5672/%2F")


def depth(channel: Any, queues: list[str]) -> int:
    """Ready messages in ``queues`` together."""
    return sum(int(channel.queue_declare(q, passive=True).method.message_count) for q in queues)


def measure(channel: Any, queues: list[str], n: int, timeout_s: float = 600.0) -> float:
    """Tasks per second from the first delivery to empty ``queues``."""
    deadline = time.monotonic() + timeout_s
    start = None
    while time.monotonic() < deadline:
        now, ready = time.monotonic(), depth(channel, queues)
        if start is None and ready < n:
            start = (now, ready)
        if ready == 0 and start is not None:
            return start[1] / (now - start[0]) if now > start[0] else float("inf")
        time.sleep(0.01)
    raise TimeoutError(f"{queues} not drained within {timeout_s}s")


def run(channel: Any, app: App, task: Task[Any, Any], queues: list[str], env: dict[str, str],
        args: argparse.Namespace) -> float:
    """Fill through ``task`` (bound to ``app``), drain with ``taskq worker``; tasks/s."""
    bound: Task[Any, Any] = Task(app, task.fn, name=task.name, options=task.options)
    for start in range(0, args.tasks, 5000):
        bound.starmap([(f"key-{i % 1000}",) for i in range(start, min(args.tasks, start + 5000))])
    while depth(channel, queues) < args.tasks:
        time.sleep(0.05)
    command = [
        sys.executable, "-m", "taskq", "worker", "-A", "benchmarks._apps.ordered_app:app",
        "-Q", ",".join(sorted({task.options.queue or app.settings.default_queue})),
        "-c", str(args.processes), "--no-relay", "--loglevel", "WARNING",
    ]
    worker = subprocess.Popen(command, env=env, cwd=ROOT)
    try:
        return measure(channel, queues, args.tasks)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)


def main() -> None:
    """Run the rounds and print tasks/s for the ordered and the unordered queue."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    ordered_queue, plain_queue = f"{namespace}.ledger", f"{namespace}.default"
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace, "TASKQ_DEFAULT_QUEUE": plain_queue,
        "BENCH_ORDERED_QUEUE": ordered_queue, "BENCH_PARTITIONS": str(args.partitions),
    }
    os.environ.update({k: v for k, v in env.items() if k.startswith(("TASKQ_", "BENCH_"))})
    from benchmarks._apps import ordered_app

    app = App("bench-client", broker_url=BROKER_URL, namespace=namespace,
              default_queue=plain_queue)
    app.queue(ordered_queue, partitions=args.partitions)
    ordered_task = ordered_app.ordered_noop
    plain_task = ordered_app.noop
    partitions = app.topology.partition_queues(ordered_queue)
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    results: dict[str, list[float]] = {"ordered": [], "unordered": []}
    try:
        for round_number in range(args.rounds):
            results["ordered"].append(run(channel, app, ordered_task, partitions, env, args))
            results["unordered"].append(run(channel, app, plain_task, [plain_queue], env, args))
            print(f"round {round_number + 1}: ordered {results['ordered'][-1]:,.0f}/s, "
                  f"unordered {results['unordered'][-1]:,.0f}/s", flush=True)
    finally:
        for queue in [*partitions, plain_queue, f"{ordered_queue}.dlq", f"{plain_queue}.dlq",
                      f"{namespace}.unroutable"]:
            channel.queue_delete(queue)
        for exchange in (namespace, f"{namespace}.dlx", f"{namespace}.unroutable"):
            channel.exchange_delete(exchange)
        connection.close()
        app.close()
    ordered, unordered = (statistics.median(results[k]) for k in ("ordered", "unordered"))
    print(f"{args.tasks} no-op tasks, {args.processes} processes, {args.partitions} partitions,"
          f" median of {args.rounds}: ordered {ordered:,.0f} tasks/s, unordered "
          f"{unordered:,.0f} tasks/s ({ordered / unordered:.0%})")


if __name__ == "__main__":
    main()
