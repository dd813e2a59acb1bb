"""Cost of recording task states (``taskq_task_states``, docs/states.md).

    python -m benchmarks.task_states [--events 20000] [--tasks 10000] [--rounds 3]

Three figures:

1. the worker loop's cost per task: the recorder's hooks (``started`` and ``succeeded``),
   which only put a row in a dict (the writer thread runs meanwhile);
2. the writer's cost per row: one multi-row upsert per batch, on PostgreSQL and SQLite;
3. end to end: ``taskq worker`` draining N no-op tasks (idempotent, keys on PostgreSQL) with
   ``track_task_states`` on and off (``benchmarks.worker``'s measurement).

Uses a PostgreSQL schema and a SQLite file of its own, and drops them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from datetime import timedelta

import pika
import sqlalchemy as sa

from taskq import App
from taskq.broker import topology as topo
from taskq.db import utcnow
from taskq.states.store import StateRow, TaskStateStore
from taskq.worker.events import TaskEvent
from taskq.worker.state_recorder import StateRecorder

POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
BROKER_URL = os.environ.get("TASKQ_BROKER_URL", "amqp://guest:guest@localhost:5672/%2F")


def hooks_us(app: App, events: int) -> float:
    """Loop-thread µs per task for ``started`` + ``succeeded`` (writer thread running)."""
    recorder = StateRecorder(app)
    batch = [TaskEvent(str(uuid.uuid4()), "bench.noop", "bench", 0) for _ in range(events)]
    started = time.perf_counter()
    for event in batch:
        recorder.started(event)
        recorder.succeeded(event, 0.0, None)
    elapsed = time.perf_counter() - started
    recorder.close()
    return elapsed / events * 1e6


def write_us_per_row(store: TaskStateStore, rows: int, batch_size: int) -> float:
    now = utcnow()
    made = [StateRow(str(uuid.uuid4()), "bench.noop", "bench", "SUCCESS", 0, None,
                     "host pid 1", None, None, now, now + timedelta(microseconds=i))
            for i in range(rows)]
    started = time.perf_counter()
    for i in range(0, rows, batch_size):
        store.write(made[i:i + batch_size])
    return (time.perf_counter() - started) / rows * 1e6


def in_process(url: str, events: int, rounds: int) -> dict[str, float]:
    app = App("bench", database_url=url, broker_url=BROKER_URL)
    app.create_tables()
    store = TaskStateStore(app.engine)
    figures: dict[str, list[float]] = {}
    for _ in range(rounds):
        figures.setdefault("hooks on the loop thread (µs/task)", []).append(
            hooks_us(app, events))
        for size in (100, 1000):
            figures.setdefault(f"upsert, batches of {size} (µs/row)", []).append(
                write_us_per_row(store, events // 4, size))
    app.close()
    return {name: statistics.median(values) for name, values in figures.items()}


def end_to_end(url: str, tasks: int, rounds: int) -> dict[str, float]:
    """Drain rate of ``taskq worker -c 2`` with the states recorded and not."""
    from benchmarks import worker as drain

    namespace = f"bench{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.default"
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments=topo.queue_arguments(
        namespace, queue, topo.QueueOptions(), default_max_priority=10))
    args = argparse.Namespace(tasks=tasks, processes=2, prefetch=16)
    rates: dict[str, list[float]] = {"states on": [], "states off": []}
    saved = dict(os.environ)
    try:
        for _ in range(rounds):
            for label, flag in (("states on", "true"), ("states off", "false")):
                os.environ.update(TASKQ_DATABASE_URL=url, TASKQ_TRACK_TASK_STATES=flag)
                rates[label].append(drain.run_taskq(channel, namespace, queue, args))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for name in (queue, topo.dlq_name(queue), topo.unroutable_name(namespace)):
            channel.queue_delete(name)
        for name in (namespace, topo.dlx_name(namespace), topo.unroutable_name(namespace)):
            channel.exchange_delete(name)
        connection.close()
    return {f"{label} (tasks/s, median)": statistics.median(v) for label, v in rates.items()}


def _schema_url(schema: str) -> str:
    return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    schema = f"bench_states_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    results: dict[str, dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as directory:
            results["PostgreSQL"] = in_process(_schema_url(schema), args.events, args.rounds)
            _show("PostgreSQL", results["PostgreSQL"])
            results["SQLite"] = in_process(f"sqlite:///{directory}/bench.sqlite3",
                                           args.events, args.rounds)
            _show("SQLite", results["SQLite"])
        if args.tasks:
            part = "end to end, PostgreSQL"
            results[part] = end_to_end(_schema_url(schema), args.tasks, args.rounds)
            _show(part, results[part])
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _show(part: str, figures: dict[str, float]) -> None:
    print(part, flush=True)
    for name, value in figures.items():
        print(f"  {name}: {value:,.1f}", flush=True)


if __name__ == "__main__":
    main()
