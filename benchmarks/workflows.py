"""A chord of N no-op members, start to callback, beside the same N tasks without a join.

Both go through the same path: one transaction writes the outbox rows (and, for the chord,
the workflow rows), a ``taskq worker -c P`` (with its relay) runs them. Timed from just
before that transaction to:

- plain: the N-th idempotency key in ``taskq_processed`` (every task done);
- chord: the callback's result in ``taskq_workflows`` (``WorkflowResult.get``), which needs
  every member counted in its completion transaction and the callback relayed and run.

Usage::

    python -m benchmarks.workflows [--members 10000] [--processes 2] [--rounds 3]

Needs RabbitMQ and PostgreSQL on 127.0.0.1 (``TASKQ_BROKER_URL``, ``TASKQ_TEST_POSTGRES_URL``).
Figures go to benchmarks/README.md and docs/workflows.md.
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

import sqlalchemy as sa

from taskq import App, chord, group
from taskq.broker import topology as topo
from taskq.schema import metadata, processed_table
from taskq.task import Task
from tests import tasks_workflows as wt

ROOT = Path(__file__).resolve().parents[1]
BROKER_URL = os.environ.get("TASKQ_BROKER_URL", "amqp://guest:guest@localhost:5672/%2F")
POSTGRES_URL = os.environ.get(
    "TASKQ_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)


def bound(app: App, task: Task[Any, Any]) -> Task[Any, Any]:
    """``task`` sending through ``app``."""
    return Task(app, task.fn, name=task.name, options=task.options)


def processed(engine: sa.Engine) -> int:
    """Rows in taskq_processed."""
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(processed_table))
                   .scalar_one())


def run_plain(app: App, n: int, timeout_s: float = 600.0) -> float:
    """Seconds from the enqueue transaction to the N-th task done."""
    noop = bound(app, wt.noop)
    engine = app.engine
    before = processed(engine)
    started = time.perf_counter()
    with engine.begin() as conn:
        noop.starmap([() for _ in range(n)], session=conn)
    deadline = time.monotonic() + timeout_s
    while processed(engine) < before + n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} plain tasks not done within {timeout_s}s")
        time.sleep(0.01)
    return time.perf_counter() - started


def run_chord(app: App, n: int, timeout_s: float = 600.0) -> float:
    """Seconds from the start transaction to the callback's result."""
    noop, noop_sum = bound(app, wt.noop), bound(app, wt.noop_sum)
    started = time.perf_counter()
    result = chord(group(noop.si() for _ in range(n)), noop_sum.s()).apply_async()
    count = result.get(timeout_s=timeout_s, interval_s=0.01)
    elapsed = time.perf_counter() - started
    if count != n:
        raise AssertionError(f"the callback got {count} results, not {n}")
    return elapsed


def start_worker(namespace: str, queue: str, url: str, processes: int) -> subprocess.Popen[bytes]:
    """``taskq worker -c P`` (relay included) on the benchmark's queue and schema."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace, "TASKQ_DEFAULT_QUEUE": queue,
        "TASKQ_DATABASE_URL": url,
    }
    command = [sys.executable, "-m", "taskq", "worker", "-A", "tests.tasks_workflows:app",
               "-c", str(processes), "--loglevel", "WARNING"]
    return subprocess.Popen(command, env=env, cwd=ROOT)


def main() -> None:
    """Run the rounds and print both timings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # SIGTERM (``timeout``, Ctrl-C's cousin) still runs the clean-up below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.default"
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    app = App("bench", broker_url=BROKER_URL, database_url=url, namespace=namespace,
              default_queue=queue)
    metadata.create_all(app.engine)
    worker = start_worker(namespace, queue, url, args.processes)
    results: dict[str, list[float]] = {"plain": [], "chord": []}
    try:
        run_plain(app, 100)  # warm-up: the worker is consuming and the relay listening
        for number in range(1, args.rounds + 1):
            results["plain"].append(run_plain(app, args.members))
            results["chord"].append(run_chord(app, args.members))
            print(f"round {number}: plain {results['plain'][-1]:.2f}s, "
                  f"chord {results['chord'][-1]:.2f}s", flush=True)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        app.close()
        _cleanup(namespace, queue, schema, admin)
    plain, joined = statistics.median(results["plain"]), statistics.median(results["chord"])
    print(f"{args.members} no-op tasks, {args.processes} processes (median of {args.rounds}): "
          f"without a join {plain:.2f}s ({args.members / plain:,.0f} tasks/s); chord start to "
          f"callback {joined:.2f}s ({args.members / joined:,.0f} members/s) = "
          f"{joined / plain:.2f}x")


def _cleanup(namespace: str, queue: str, schema: str, admin: sa.Engine) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    for name in (queue, topo.dlq_name(queue), topo.unroutable_name(namespace)):
        channel.queue_delete(name)
    for name in (namespace, topo.dlx_name(namespace), topo.unroutable_name(namespace)):
        channel.exchange_delete(name)
    connection.close()
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


if __name__ == "__main__":
    main()
