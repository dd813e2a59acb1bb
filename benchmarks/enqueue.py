"""Bulk enqueue: what limits ``Task.starmap`` against raw pika's windowed publishing.

Every contender publishes ``--count`` persistent messages with a window of 512 unconfirmed
(pika's SelectConnection) into a fresh queue; the contenders take turns for ``--rounds``
rounds. For each, the median rate, the producer's CPU per message and, when the broker runs
on this machine, the broker's CPU per message (``beam.smp`` in /proc).

- ``raw pika, minimal``: the ceiling that benchmarks.compare uses: two properties
  (``delivery_mode``, ``message_id``), no headers, default exchange, plain queue;
- ``taskq's messages, pre-marshalled``: taskq's frames for the same task calls (properties,
  four ``taskq-*`` headers, ``mandatory``, the app's exchange and its alternate exchange, a
  queue declared as taskq declares it) built *before* the clock starts, so the producer
  costs nothing: the most any client can get out of the broker for what taskq sends;
- variants of that one, each leaving out one thing taskq sends, to price it on the broker:
  no headers, a queue without ``x-max-priority``, no ``mandatory``;
- ``Task.starmap``: taskq's bulk API, envelopes to confirms.

Usage::

    python -m benchmarks.enqueue [--count 20000] [--rounds 5] [--url amqp://...]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

from benchmarks._contenders import Admin, publish_windowed, raw_pipelined
from taskq import App
from taskq.broker import topology as topo
from taskq.broker._frames import content_frames, method_frame
from taskq.broker.connection import declare
from taskq.message import encode

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
WINDOW = 512
RAW_BODY = b"\x82\xa4args\x90\xa6kwargs\x80"  # {"args": [], "kwargs": {}}


def _process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _broker_pid() -> str | None:
    try:
        return subprocess.check_output(["pgrep", "-f", "beam.smp"], text=True).split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return None


def _pid_cpu_s(pid: str | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def send_frames(url: str, frames: list[bytes], chunk: int = 32) -> None:
    """Write pre-marshalled Basic.Publish frames (channel 1) with a window of confirms."""

    def send_chunk(channel: Any, first: int, room: int) -> int:
        assert channel.channel_number == 1, "frames were marshalled for channel 1"
        count = min(chunk, room)
        channel.connection._adapter_emit_data(b"".join(frames[first:first + count]))
        return count

    publish_windowed(url, len(frames), send_chunk, WINDOW)


class Bench:
    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.count = count
        self.broker = _broker_pid()
        self.admin = Admin(url)

    def app(self, *, priority: bool = True) -> tuple[App, Any, str]:
        """An app in a fresh namespace, its topology declared (a work queue without
        ``x-max-priority`` when not ``priority``), and its no-op task."""
        namespace = f"bench-enq-{uuid.uuid4().hex[:8]}"
        app = App("bench", broker_url=self.url, namespace=namespace)

        @app.task(name="bench.noop", idempotent=False)
        def noop() -> None:
            return None

        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        queue = app.settings.default_queue
        declare(channel, app.topology.base())
        if priority:
            declare(channel, app.topology.for_queue(queue))
        else:
            arguments = {"x-dead-letter-exchange": topo.dlx_name(namespace),
                         "x-dead-letter-routing-key": queue}
            channel.queue_declare(queue, durable=True, arguments=arguments)
            channel.queue_bind(queue, app.topology.exchange, queue)
        connection.close()
        return app, noop, app.settings.default_queue

    def cleanup(self, app: App) -> None:
        app.close()
        self.admin.delete_taskq_app(app.settings.namespace, app.settings.default_queue)

    def measure(self, run: Callable[[], None]) -> tuple[float, float, float]:
        broker0, cpu0, t0 = _pid_cpu_s(self.broker), _process_cpu_s(), time.perf_counter()
        run()
        wall = time.perf_counter() - t0
        n = self.count
        broker_us = (_pid_cpu_s(self.broker) - broker0) / n * 1e6 if self.broker else float("nan")
        return n / wall, (_process_cpu_s() - cpu0) / n * 1e6, broker_us

    # -- contenders -------------------------------------------------------------------------

    def raw_minimal(self) -> tuple[float, float, float]:
        queue = f"bench-enq-raw-{uuid.uuid4().hex[:8]}"
        self.admin.declare(queue)
        try:
            return self.measure(lambda: raw_pipelined(self.url, queue, [RAW_BODY] * self.count))
        finally:
            self.admin.delete_queues(queue)

    def premarshalled(
        self, *, headers: bool = True, priority: bool = True, mandatory: bool = True
    ) -> tuple[float, float, float]:
        app, noop, queue = self.app(priority=priority)
        try:
            exchange = app.topology.exchange
            method = method_frame(1, exchange, queue, mandatory)
            frames = []
            for _ in range(self.count):
                wire = encode(noop.envelope(()))
                if not headers:
                    wire = wire.with_headers({})
                frames.append(method + content_frames(1, wire, 131_072 - 8))
            return self.measure(lambda: send_frames(self.url, frames))
        finally:
            self.cleanup(app)

    def starmap(self) -> tuple[float, float, float]:
        app, noop, _queue = self.app()
        try:
            noop.starmap([()])  # connect and declare outside the clock, as the others do
            return self.measure(lambda: noop.starmap([()] * self.count))
        finally:
            self.cleanup(app)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=DEFAULT_URL)
    options = parser.parse_args()
    bench = Bench(options.url, options.count)
    contenders: dict[str, Callable[[], tuple[float, float, float]]] = {
        "raw pika, minimal (the ceiling)": bench.raw_minimal,
        "taskq's messages, pre-marshalled": bench.premarshalled,
        "  ... without headers": lambda: bench.premarshalled(headers=False),
        "  ... into a queue without x-max-priority": lambda: bench.premarshalled(priority=False),
        "  ... without mandatory": lambda: bench.premarshalled(mandatory=False),
        "Task.starmap": bench.starmap,
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in contenders}
    for round_no in range(options.rounds):
        for name, run in contenders.items():
            results[name].append(run())
        print(f"round {round_no + 1}/{options.rounds} done", flush=True)
    ceiling = statistics.median(r[0] for r in results["raw pika, minimal (the ceiling)"])
    print(f"\n{options.count} messages, window {WINDOW}, median of {options.rounds} rounds")
    print(f"{'contender':44s} {'msg/s':>8s} {'ceiling':>8s} {'client µs':>10s} "
          f"{'broker µs':>10s}  rounds")
    for name, rows in results.items():
        rate = statistics.median(r[0] for r in rows)
        print(f"{name:44s} {rate:8,.0f} {rate / ceiling:8.0%} "
              f"{statistics.median(r[1] for r in rows):10.1f} "
              f"{statistics.median(r[2] for r in rows):10.1f}  "
              + " · ".join(f"{r[0]:,.0f}" for r in rows))


if __name__ == "__main__":
    main()
