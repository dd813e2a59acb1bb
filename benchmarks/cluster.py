"""End-to-end no-op throughput on a 3-node RabbitMQ cluster beside a single node, same run.

Each target is private (tests/support/rabbitmq_nodes.py: its own epmd, ports and temporary
directory, removed at the end) and booted only for its own measurement, so that the two
never share the 2 cores. On each: a quorum work queue, ``taskq worker -c P`` consuming it,
and the producer enqueueing N no-op tasks with ``map`` (windowed confirms). The rate is N
divided by the time from the first publish to an empty queue; ``enqueue`` is the producer's
own rate. The cluster's ``broker_url`` names all three nodes (clients spread over them).

Usage::

    python -m benchmarks.cluster [--tasks 5000] [--processes 2] [--rounds 2]

Figures go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

from taskq import App
from tests.support.rabbitmq_nodes import RabbitCluster

ROOT = Path(__file__).resolve().parents[1]


class _Depth:
    """Ready messages of one queue, over a connection of its own."""

    def __init__(self, url: str, queue: str) -> None:
        self._connection = pika.BlockingConnection(pika.URLParameters(url))
        self._channel = self._connection.channel()
        self._queue = queue

    def __call__(self) -> int:
        method = self._channel.queue_declare(self._queue, passive=True).method
        return int(method.message_count)

    def close(self) -> None:
        self._connection.close()


def one_round(
    cluster: RabbitCluster, args: argparse.Namespace, workdir: Path
) -> tuple[float, float]:
    """Return (end-to-end tasks/s, enqueue tasks/s) of one round on ``cluster``."""
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.default"
    settings = {
        "broker_url": cluster.broker_url, "namespace": namespace, "default_queue": queue,
        "default_queue_type": "quorum", "database_url": f"sqlite:///{workdir}/{namespace}.db",
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           **{f"TASKQ_{k.upper()}": v for k, v in settings.items()}}
    log = open(workdir / f"{namespace}.log", "wb")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [sys.executable, "-m", "taskq", "worker", "-A", "tests.tasks:app", "-c",
         str(args.processes), "--loglevel", "WARNING", "--no-relay"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    app = App("bench", **settings)
    try:
        from tests import tasks

        noop = tasks.noop
        bound = type(noop)(app, noop.fn, name=noop.name, options=noop.options)
        bound.delay()  # declares the queue; the worker consumes once it exists
        ready = _Depth(cluster.urls[0], queue)
        deadline = time.monotonic() + 60
        while ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        bound.starmap([()] * args.tasks)
        enqueued_s = time.monotonic() - started
        while ready():
            time.sleep(0.01)
        total_s = time.monotonic() - started
        ready.close()
        return args.tasks / total_s, args.tasks / enqueued_s
    finally:
        app.close()
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
        log.close()


def measure(size: int, args: argparse.Namespace) -> tuple[list[float], list[float], float]:
    with RabbitCluster(size) as cluster, tempfile.TemporaryDirectory() as tmp:
        boot_s = cluster.start()
        rates = [one_round(cluster, args, Path(tmp)) for _ in range(args.rounds)]
    return [r[0] for r in rates], [r[1] for r in rates], boot_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for label, size in (("single node", 1), ("3-node cluster", 3)):
        end_to_end, enqueue, boot_s = measure(size, args)
        print(
            f"{label} (quorum queue, boot {boot_s:.0f}s): end to end "
            f"{statistics.median(end_to_end):,.0f} tasks/s (rounds: "
            f"{', '.join(f'{r:,.0f}' for r in end_to_end)}), enqueue "
            f"{statistics.median(enqueue):,.0f} tasks/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
