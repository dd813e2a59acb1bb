"""Delay precision: how late delayed messages arrive, per delay backend.

Publishes ``--count`` messages through ``App.publish_delayed_many`` with delays spread over
``--min-delay-s`` .. ``--max-delay-s`` (in a shuffled order, so that long and short delays
share the tiers), consumes the destination queue on a separate connection and compares each
arrival with the message's ``taskq-eta`` header (epoch ms). Reports how many arrived early
(must be 0) and the lateness percentiles. The figures go to docs/delays.md.

Usage::

    python benchmarks/delays.py [--count 300] [--max-delay-s 8] [--backend tiers]
                                [--queue-type classic|quorum] [--url amqp://...]

``--pattern worst`` uses delays whose binary form is all ones (the most tier hops for their
length) instead of random ones.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import uuid

import pika

from taskq import App
from taskq.broker import topology as topo
from taskq.delay.backend import DelayedMessage
from taskq.delay.maths import epoch_ms
from taskq.message import CONTENT_TYPE, ETA, WireMessage

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _delays_ms(args: argparse.Namespace) -> list[int]:
    low, high = int(args.min_delay_s * 1000), int(args.max_delay_s * 1000)
    if args.pattern == "worst":
        ones = [2**bits - 1 for bits in range(1, 40) if low <= 2**bits - 1 <= high]
        return [ones[i % len(ones)] for i in range(args.count)]
    return [random.randint(low, high) for _ in range(args.count)]


def _consume(url: str, queue: str, expected: int, lateness_ms: list[int], done: threading.Event,
             ready: threading.Event, ids: list[str] | None = None) -> None:
    """Append each arrival's lateness (ms after its eta) to ``lateness_ms``, and its message
    id to ``ids`` (when given), until ``expected`` arrived or ``done`` is set."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()

    def on_message(_ch: object, _method: object, properties: pika.BasicProperties,
                   _body: bytes) -> None:
        if properties.message_id == "warmup":
            return
        lateness_ms.append(time.time_ns() // 1_000_000 - properties.headers[ETA])
        if ids is not None:
            ids.append(properties.message_id)
        if len(lateness_ms) >= expected:
            done.set()

    channel.basic_consume(queue, on_message, auto_ack=True)
    ready.set()
    while not done.is_set():
        connection.process_data_events(time_limit=0.05)
    connection.close()


def _percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--min-delay-s", type=float, default=0.05)
    parser.add_argument("--max-delay-s", type=float, default=8.0)
    parser.add_argument("--backend", default="tiers", choices=("auto", "plugin", "tiers"))
    parser.add_argument("--queue-type", default="classic", choices=("classic", "quorum"))
    parser.add_argument("--pattern", default="random", choices=("random", "worst"))
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args()

    namespace = f"bench{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.delays"
    app = App("bench", broker_url=args.url, namespace=namespace, default_queue=queue,
              delay_backend=args.backend, delay_tier_queue_type=args.queue_type)
    try:
        _run(app, args, queue)
    finally:
        app.close()
        _cleanup(args.url, namespace, queue)


def _run(app: App, args: argparse.Namespace, queue: str) -> None:
    # One delayed message declares the tiers and the queue before the consumer starts.
    warmup = WireMessage(b"\x80", "warmup", {}, content_type=CONTENT_TYPE)
    app.publish_delayed(warmup, queue=queue, delay_s=0.001)
    lateness_ms: list[int] = []
    done, ready = threading.Event(), threading.Event()
    delays = _delays_ms(args)
    consumer = threading.Thread(
        target=_consume, args=(args.url, queue, len(delays), lateness_ms, done, ready)
    )
    consumer.start()
    ready.wait(10)
    now = epoch_ms()
    messages = [
        DelayedMessage(WireMessage(b"\x80", str(i), {}, content_type=CONTENT_TYPE), queue,
                       now + delay)
        for i, delay in enumerate(delays)
    ]
    random.shuffle(messages)
    started = time.monotonic()
    app.publish_delayed_many(messages)
    print(f"published {len(messages)} in {time.monotonic() - started:.3f}s "
          f"(backend {app.delay_backend_name}, {args.queue_type} tiers, {args.pattern} delays "
          f"{args.min_delay_s:g}..{args.max_delay_s:g}s)")
    if not done.wait(args.max_delay_s + 30):
        print(f"only {len(lateness_ms)} of {len(delays)} arrived")
    done.set()
    consumer.join()
    late = lateness_ms
    early = [value for value in late if value < 0]
    print(f"arrived {len(late)}, early {len(early)}; lateness ms: "
          f"p50 {_percentile(late, 0.50)}, p90 {_percentile(late, 0.90)}, "
          f"p99 {_percentile(late, 0.99)}, max {max(late)}, mean {statistics.mean(late):.1f}")


def _cleanup(url: str, namespace: str, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for queue_type in ("classic", "quorum"):
        for level in range(topo.DELAY_TIER_LEVELS):
            name = topo.delay_tier_name(namespace, level, queue_type)
            channel.queue_delete(name)
            channel.exchange_delete(name)
    for name in (queue, topo.dlq_name(queue), topo.unroutable_name(namespace)):
        channel.queue_delete(name)
    for name in (namespace, topo.dlx_name(namespace), topo.unroutable_name(namespace),
                 topo.delayed_exchange_name(namespace)):
        channel.exchange_delete(name)
    connection.close()


if __name__ == "__main__":
    main()
