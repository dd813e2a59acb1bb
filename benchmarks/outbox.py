"""Outbox relay throughput and commit-to-broker latency on PostgreSQL.

    python -m benchmarks.outbox [--rows 5000] [--latency-samples 200]

1. Throughput: commit ``--rows`` outbox rows, then time one relay draining them (claim with
   SKIP LOCKED, pipelined confirms, delete) and compare with publishing the same encoded
   messages directly with pipelined confirms (``Publisher.publish_many``) in the same run.
2. Latency: with a relay running (woken by LISTEN/NOTIFY), commit one row every 20 ms and
   measure commit-to-delivery time at a consumer on the queue (p50, p99).

Uses unique names and deletes them afterwards. Needs the local RabbitMQ and PostgreSQL.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

import pika
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App
from taskq.broker import topology as topo

BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"


def make_app(schema: str) -> App:
    app = App(
        "bench",
        broker_url=BROKER_URL,
        database_url=f"{POSTGRES_URL}?options=-csearch_path%3D{schema}",
        namespace=f"bench{schema}",
        default_queue=f"bench.{schema}",
        outbox_batch_size=500,
    )
    app.task(name="noop")(lambda n: None)
    return app


def commit_rows(app: App, rows: int) -> None:
    task = app.registry.get("noop")
    for start in range(0, rows, 500):
        with Session(app.engine) as session, session.begin():
            for n in range(start, min(rows, start + 500)):
                task.delay_on(session, n)


def throughput(app: App, rows: int) -> tuple[float, float]:
    task = app.registry.get("noop")
    commit_rows(app, rows)
    relay = app.relay()
    started = time.perf_counter()
    while relay.run_once():
        pass
    relay_rate = rows / (time.perf_counter() - started)
    relay.publisher.close()

    from taskq.message import encode

    items = [
        (app.topology.exchange, task.queue, encode(task.envelope((n,))))
        for n in range(rows)
    ]
    started = time.perf_counter()
    app.publisher.publish_many(items)
    direct_rate = rows / (time.perf_counter() - started)
    return relay_rate, direct_rate


def latency(app: App, samples: int) -> list[float]:
    task = app.registry.get("noop")
    relay = app.relay()
    stop = threading.Event()
    runner = threading.Thread(target=relay.run, args=(stop.is_set,), daemon=True)
    runner.start()
    arrivals: dict[str, float] = {}
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    channel.queue_purge(task.queue)
    committed: dict[str, float] = {}
    for _ in range(samples):
        with Session(app.engine) as session, session.begin():
            task_id = task.delay_on(session, 0).id
        committed[task_id] = time.perf_counter()
        deadline = time.perf_counter() + 0.02
        while time.perf_counter() < deadline or task_id not in arrivals:
            method, props, _ = channel.basic_get(task.queue, auto_ack=True)
            if method is None:
                connection.sleep(0.0005)
                continue
            arrivals[props.message_id] = time.perf_counter()
    stop.set()
    with Session(app.engine) as session, session.begin():
        task.delay_on(session, 0)
    runner.join(timeout=10)
    connection.close()
    return [(arrivals[i] - committed[i]) * 1000 for i in committed if i in arrivals]


def cleanup(app: App, schema: str) -> None:
    app.close()
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    for queue in app.queue_names():
        channel.queue_delete(queue)
        channel.queue_delete(topo.dlq_name(queue))
    channel.queue_delete(app.topology.unroutable)
    for exchange in (app.topology.exchange, app.topology.dlx, app.topology.unroutable):
        channel.exchange_delete(exchange)
    connection.close()
    engine = sa.create_engine(POSTGRES_URL)
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    schema = f"b{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(POSTGRES_URL)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    app = make_app(schema)
    app.create_tables()
    try:
        results = [throughput(app, args.rows) for _ in range(args.runs)]
        relay_rate = statistics.median(r for r, _ in results)
        direct_rate = statistics.median(d for _, d in results)
        print(f"relay     : {relay_rate:8.0f} rows/s  (median of {args.runs}: "
              f"{', '.join(f'{r:.0f}' for r, _ in results)})")
        print(f"direct    : {direct_rate:8.0f} msg/s   (publish_many, same messages: "
              f"{', '.join(f'{d:.0f}' for _, d in results)})")
        print(f"ratio     : {relay_rate / direct_rate:8.0%}")
        lat = sorted(latency(app, args.latency_samples))
        p50 = lat[len(lat) // 2]
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(f"latency   : commit-to-delivery p50 {p50:.1f} ms, p99 {p99:.1f} ms "
              f"({len(lat)} samples, one commit every 20 ms)")
    finally:
        cleanup(app, schema)


if __name__ == "__main__":
    main()
