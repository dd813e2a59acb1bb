"""A burst of persistent messages through one fixed-TTL classic queue, or split over several.

    python -m benchmarks.tier_burst [--messages 30000] [--rate 5000] [--queues 1 2 4]

What a delay tier does with a cohort (messages that entered it together): each message is
published with its send time into one of ``--queues`` queues with ``x-message-ttl`` 3,000 ms
that dead-letter to a target queue; a consumer in another process takes them from the target
and records how late each arrived (now - send time - TTL). If one queue process bounded the
cohort, splitting it over several queues would make it less late; if the broker as a whole
does (publish, expire, dead-letter, persist, deliver on these cores), it would not. Queues are
named ``tier-burst-<random>-*`` and deleted afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue as queues
import struct
import time
import uuid

import pika

from benchmarks._contenders import BROKER_URL

TTL_MS = 3000
_STAMP = struct.Struct("d")


def _consume(target: str, n: int, out: multiprocessing.Queue[list[float]]) -> None:
    late: list[float] = []
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=256)

    def on_message(ch: object, method: object, _properties: object, body: bytes) -> None:
        late.append(time.time() * 1000 - _STAMP.unpack(body)[0] - TTL_MS)
        channel.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
        if len(late) >= n:
            channel.stop_consuming()

    channel.basic_consume(target, on_message)
    channel.start_consuming()
    connection.close()
    out.put(late)


def burst(n: int, rate: float, k: int) -> str:
    tag = uuid.uuid4().hex[:6]
    target = f"tier-burst-{tag}-target"
    tiers = [f"tier-burst-{tag}-{i}" for i in range(k)]
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = connection.channel()
    try:
        channel.queue_declare(target, durable=True)
        for name in tiers:
            channel.queue_declare(name, durable=True, arguments={
                "x-message-ttl": TTL_MS, "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": target})
        out: multiprocessing.Queue[list[float]] = multiprocessing.Queue()
        consumer = multiprocessing.Process(target=_consume, args=(target, n, out), daemon=True)
        consumer.start()
        deadline = time.monotonic() + 30  # consuming before the first message is sent
        while channel.queue_declare(target, passive=True).method.consumer_count < 1:
            if time.monotonic() > deadline or not consumer.is_alive():
                raise RuntimeError(f"{target}: the consumer did not start consuming")
            time.sleep(0.01)
        properties = pika.BasicProperties(delivery_mode=2)
        began = time.time()
        for i in range(n):
            if i % 50 == 0 and (ahead := began + i / rate - time.time()) > 0:
                time.sleep(ahead)
            channel.basic_publish("", tiers[i % k], _STAMP.pack(time.time() * 1000),
                                  properties)
        sent_s = time.time() - began
        try:
            late = sorted(out.get(timeout=120))
        except queues.Empty:
            consumer.kill()
            raise RuntimeError(f"{target}: not all {n} messages arrived within 120 s") from None
        consumer.join(10)
    finally:
        for name in [*tiers, target]:
            channel.queue_delete(name)
        connection.close()

    def at(fraction: float) -> float:
        return late[min(len(late) - 1, int(fraction * len(late)))]

    early = sum(1 for value in late if value < 0)
    return (f"| {k} | {n / sent_s:,.0f} | {early} | {at(0.5):.0f} ms | {at(0.99):.0f} ms | "
            f"{late[-1]:.0f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--rate", type=float, default=5_000, help="messages per second")
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    print("| queues | sent/s | early | late p50 | p99 | max |\n|---:|---:|---:|---:|---:|---:|")
    for k in args.queues:
        print(burst(args.messages, args.rate, k), flush=True)


if __name__ == "__main__":
    main()
