"""Publishing throughput: taskq's Publisher against raw pika, confirmed and persistent.

Four contenders, each sending ``--count`` persistent messages into a fresh queue declared as
taskq declares work queues (classic, ``x-max-priority``, dead-lettering), through the app's
exchange. The contenders take turns for ``--rounds`` rounds and the median rate is reported:
one-confirm-per-message rates follow the broker's fsync latency, which drifts with the load of
a shared machine.

- ``raw pika, confirm per message``: BlockingChannel.confirm_delivery + basic_publish;
- ``Publisher.publish``: one confirm per message;
- ``raw pika, pipelined confirms``: SelectConnection with a window of unconfirmed messages;
- ``Publisher.publish_many``: the same window through taskq.

Usage::

    python benchmarks/publish.py [--count 5000] [--rounds 3] [--url amqp://...] [--profile]

``--profile`` runs Publisher.publish under cProfile and prints the top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import uuid
from collections.abc import Callable

import pika

from taskq.broker.connection import declare
from taskq.broker.publisher import PUBLISH_WINDOW, Publisher
from taskq.broker.topology import Topology
from taskq.message import CONTENT_TYPE, WireMessage
from taskq.settings import Settings

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
BODY = b"\x82\xa4args\x91\x01\xa6kwargs\x80"  # {"args": [1], "kwargs": {}}


def _wire(i: int) -> WireMessage:
    return WireMessage(
        body=BODY,
        message_id=str(uuid.uuid4()),
        headers={"taskq-v": 1, "taskq-task": "bench.noop", "taskq-retries": 0},
        priority=0,
        timestamp=int(time.time()),
        app_id="bench",
        content_type=CONTENT_TYPE,
    )


def _properties(wire: WireMessage) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type=wire.content_type,
        delivery_mode=2,
        priority=wire.priority,
        timestamp=wire.timestamp,
        app_id=wire.app_id,
        message_id=wire.message_id,
        headers=wire.headers,
    )


class Bench:
    """One namespace, fresh queues per run, everything deleted at the end."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.count = count
        self.namespace = f"bench{uuid.uuid4().hex[:8]}"
        self.settings = Settings.load({"broker_url": url, "namespace": self.namespace})
        self.topology = Topology(self.namespace)
        self.queues: list[str] = []
        self.admin = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.admin.channel()
        declare(self.channel, self.topology.base())

    def fresh_queue(self) -> str:
        queue = f"{self.namespace}.q{len(self.queues)}"
        declare(self.channel, self.topology.for_queue(queue))
        self.queues.append(queue)
        return queue

    def depth(self, queue: str) -> int:
        return int(self.channel.queue_declare(queue, passive=True).method.message_count)

    def run(
        self, label: str, body: Callable[[str, list[WireMessage]], None]
    ) -> tuple[float, float]:
        """Send ``count`` messages with ``body`` into a fresh queue.

        Returns msg/s and this process's CPU microseconds per message (steadier than the
        wall-clock rate, which follows the broker's fsyncs).
        """
        queue = self.fresh_queue()
        wires = [_wire(i) for i in range(self.count)]
        started, cpu_started = time.perf_counter(), time.process_time()
        body(queue, wires)
        elapsed = time.perf_counter() - started
        cpu_us = (time.process_time() - cpu_started) / self.count * 1e6
        landed = self.depth(queue)
        if landed != self.count:
            raise SystemExit(f"{label}: {landed} of {self.count} messages landed")
        self.channel.queue_purge(queue)
        return self.count / elapsed, cpu_us

    def cleanup(self) -> None:
        for queue in self.queues:
            self.channel.queue_delete(queue)
            self.channel.queue_delete(f"{queue}.dlq")
        self.channel.queue_delete(self.topology.unroutable)
        for exchange in (self.topology.exchange, self.topology.dlx, self.topology.unroutable):
            self.channel.exchange_delete(exchange)
        self.admin.close()

    # -- the contenders ----------------------------------------------------------------------

    def raw_confirm_each(self, queue: str, wires: list[WireMessage]) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        channel.confirm_delivery()
        for wire in wires:
            channel.basic_publish(
                self.topology.exchange, queue, wire.body, _properties(wire), mandatory=True
            )
        connection.close()

    def raw_pipelined(self, queue: str, wires: list[WireMessage]) -> None:
        """The pika asynchronous-publisher pattern: publish while the window has room."""
        state = {"next": 0, "unconfirmed": 0, "confirmed": 0}
        exchange = self.topology.exchange

        def fill(channel: pika.channel.Channel) -> None:
            while state["unconfirmed"] < PUBLISH_WINDOW and state["next"] < len(wires):
                wire = wires[state["next"]]
                channel.basic_publish(exchange, queue, wire.body, _properties(wire), True)
                state["next"] += 1
                state["unconfirmed"] += 1

        def on_confirm(frame: pika.frame.Method) -> None:
            method = frame.method
            done = method.delivery_tag - state["confirmed"] if method.multiple else 1
            state["confirmed"] += done
            state["unconfirmed"] -= done
            if state["confirmed"] == len(wires):
                connection.close()
            else:
                fill(channel_holder[0])

        channel_holder: list[pika.channel.Channel] = []

        def on_channel(channel: pika.channel.Channel) -> None:
            channel_holder.append(channel)
            channel.confirm_delivery(on_confirm, callback=lambda _frame: fill(channel))

        connection: pika.SelectConnection = pika.SelectConnection(
            pika.URLParameters(self.url),
            on_open_callback=lambda conn: conn.channel(on_open_callback=on_channel),
            on_close_callback=lambda _conn, _reason: connection.ioloop.stop(),
        )
        connection.ioloop.start()

    def publisher_each(self, queue: str, wires: list[WireMessage]) -> None:
        publisher = Publisher(self.settings, self.topology)
        for wire in wires:
            publisher.publish(
                wire, exchange=self.topology.exchange, routing_key=queue, task="bench.noop"
            )
        publisher.close()

    def publisher_many(self, queue: str, wires: list[WireMessage]) -> None:
        publisher = Publisher(self.settings, self.topology)
        exchange = self.topology.exchange
        publisher.publish_many((exchange, queue, wire) for wire in wires)
        publisher.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    bench = Bench(args.url, args.count)
    try:
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            rate, _ = bench.run("Publisher.publish", bench.publisher_each)
            profiler.disable()
            print(f"Publisher.publish under cProfile: {rate:.0f} msg/s")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            return
        contenders = {
            "raw pika, confirm per message": bench.raw_confirm_each,
            "Publisher.publish": bench.publisher_each,
            "raw pika, pipelined confirms": bench.raw_pipelined,
            "Publisher.publish_many": bench.publisher_many,
        }
        results: dict[str, list[tuple[float, float]]] = {label: [] for label in contenders}
        for _ in range(args.rounds):
            for label, body in contenders.items():
                results[label].append(bench.run(label, body))
        print(
            f"{args.count} persistent messages per run, median of {args.rounds} rounds, "
            f"publish_many window {PUBLISH_WINDOW}"
        )
        for label, values in results.items():
            rate = statistics.median(v[0] for v in values)
            cpu_us = statistics.median(v[1] for v in values)
            runs = " ".join(f"{v[0]:.0f}" for v in values)
            print(f"{label:<30} {rate:>7.0f} msg/s {cpu_us:>6.1f} us CPU/msg  (runs: {runs})")
    finally:
        bench.cleanup()


if __name__ == "__main__":
    main()
