"""Retries on RabbitMQ 4.3: quorum queues' native delayed retry beside taskq's delay tiers.

Every mode starts from the same place: ``--count`` messages in a quorum work queue, one
consumer (prefetch 256) that fails each message once, then acks it when it comes back.
What "fails" does is the mode:

- ``native``: ``basic.reject(requeue=True)`` on a queue declared with
  ``x-delayed-retry-type: failed`` and ``x-delayed-retry-min = x-delayed-retry-max =
  --delay-s`` (RabbitMQ 4.3+; a reject raises the message's ``delivery-count``, and the
  delay is ``min(min * delivery-count, max)``, so the same delay for every attempt here);
  the broker holds the message in the queue and hands it out again when due;
- ``tiers-classic`` / ``tiers-quorum``: what taskq's worker does for a retry: publish a
  copy through ``App.publish_delayed`` (classic or quorum delay tiers, one confirm each),
  then ack the original.

Per mode it reports how late each retry came back (after the reject, or after the copy's
``taskq-eta``: both are the moment of failing plus the delay), how many came back early
(must be 0), how long failing all of them took, the broker's memory
(``erlang:memory(total)``) and the queues' own memory (``rabbitmqctl list_queues memory``)
while all retries wait, and the broker's CPU and bytes written (``/proc/<pid>/stat`` and
``io``) per retry. Modes alternate in every round (``--rounds``); figures are per round.

Usage (the 4.3 node of docs/rabbitmq.md; ``BENCH_RABBITMQCTL`` reaches its CLI)::

    BENCH_RABBITMQCTL='chroot /opt/rmq43 env HOME=/var/lib/rabbitmq ERL_EPMD_PORT=4373 \\
        rabbitmqctl -n r43@localhost' \\
    python -m benchmarks.native_retry --url amqp://guest:guest@127.0.0.1:5673/%2F \\
        --count 5000 --delay-s 30 --rounds 3

The broker and the machine are shared with whatever else runs: the load average is printed
with every run, and memory/CPU figures include the other users' work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pika

from benchmarks._proc import Broker, rabbitmqctl
from benchmarks.delays import _percentile
from taskq import App
from taskq.broker import topology as topo
from taskq.message import CONTENT_TYPE, ETA, WireMessage

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5673/%2F"
MODES = ("native", "tiers-classic", "tiers-quorum")
PREFETCH = 256


@dataclass
class Run:
    """One mode's figures in one round."""

    mode: str
    round: int
    count: int
    delay_ms: int
    loadavg: tuple[float, ...]
    failing_s: float = 0.0
    returned: int = 0
    early: int = 0
    late_ms: dict[str, float] = field(default_factory=dict)
    broker_memory_mb: dict[str, float | None] = field(default_factory=dict)
    queues_memory_mb: float | None = None
    broker_cpu_us_per_retry: float | None = None
    broker_written_bytes_per_retry: float | None = None


class Consumer:
    """Fails each message once (the mode's way), records lateness when it is back."""

    def __init__(self, url: str, queue: str, mode: str, delay_ms: int, app: App | None) -> None:
        self.url, self.queue, self.mode, self.delay_ms, self.app = url, queue, mode, delay_ms, app
        self.failed_at: dict[str, float] = {}
        self.lateness_ms: list[float] = []
        self.all_failed = threading.Event()
        self.all_back = threading.Event()
        self.stop = threading.Event()
        self.expected = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.all_failed.set()
            self.all_back.set()

    def _run(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=PREFETCH)

        def on_message(ch: Any, method: Any, props: pika.BasicProperties, body: bytes) -> None:
            headers = props.headers or {}
            message_id = props.message_id
            if message_id == "warmup":
                ch.basic_ack(method.delivery_tag)
                return
            now_ms = time.time() * 1000
            retried = (headers.get("x-delivery-count", 0) > 0 if self.mode == "native"
                       else "bench-retried" in headers)
            if retried:
                due = (self.failed_at[message_id] + self.delay_ms if self.mode == "native"
                       else headers[ETA])
                self.lateness_ms.append(now_ms - due)
                ch.basic_ack(method.delivery_tag)
                if len(self.lateness_ms) >= self.expected:
                    self.all_back.set()
                return
            if self.mode == "native":
                self.failed_at[message_id] = time.time() * 1000
                ch.basic_reject(method.delivery_tag, requeue=True)
            else:
                assert self.app is not None
                copy = WireMessage(body, message_id, {**headers, "bench-retried": 1},
                                   content_type=CONTENT_TYPE)
                self.app.publish_delayed(copy, queue=self.queue, delay_s=self.delay_ms / 1000)
                ch.basic_ack(method.delivery_tag)
            self.failed_at.setdefault(message_id, now_ms)
            if len(self.failed_at) >= self.expected:
                self.all_failed.set()

        channel.basic_consume(self.queue, on_message)
        while not self.stop.is_set():
            connection.process_data_events(time_limit=0.05)
        connection.close()


def _broker_io_written(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _queues_memory_mb(prefix: str) -> float | None:
    """The summed ``memory`` of the queues whose names start with ``prefix``."""
    try:
        done = subprocess.run([*rabbitmqctl(), "-q", "list_queues", "--formatter", "json",
                               "name", "memory"], capture_output=True, text=True, timeout=60,
                              check=False)
        rows = json.loads(done.stdout or "[]")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return sum(int(row["memory"]) for row in rows if row["name"].startswith(prefix)) / 2**20


class Setup:
    """One mode's queue (and App, for the tiers), declared and warmed once for every round.

    A delay tier holds its first messages late while it is new (docs/delays.md: 200-350 ms
    for quorum tiers), and a deployment's tiers exist long before its retries: so one
    message of the measured delay passes through the tiers before the first round.
    """

    def __init__(self, args: argparse.Namespace, mode: str) -> None:
        self.mode, self.url = mode, args.url
        self.namespace = f"nr{uuid.uuid4().hex[:8]}"
        self.queue = f"{self.namespace}.work"
        self.delay_ms = int(args.delay_s * 1000)
        self.app: App | None = None
        connection = pika.BlockingConnection(pika.URLParameters(args.url))
        try:
            if mode == "native":
                connection.channel().queue_declare(self.queue, durable=True, arguments={
                    "x-queue-type": "quorum", "x-delayed-retry-type": "failed",
                    "x-delayed-retry-min": self.delay_ms, "x-delayed-retry-max": self.delay_ms,
                })
                return
            self.app = App("bench", broker_url=args.url, namespace=self.namespace,
                           default_queue=self.queue, delay_backend="tiers",
                           delay_tier_queue_type=mode.split("-")[1])
            self.app.queue(self.queue, type="quorum")
            self.app.publish_delayed(WireMessage(b"\x80", "warmup", {}, content_type=CONTENT_TYPE),
                                     queue=self.queue, delay_s=args.delay_s)
            channel = connection.channel()
            deadline = time.monotonic() + args.delay_s * 4 + 60
            while time.monotonic() < deadline:
                method, _, _ = channel.basic_get(self.queue, auto_ack=True)
                if method is not None:
                    return
                connection.sleep(0.05)
            raise RuntimeError(f"the warm-up message never came through {mode}")
        finally:
            connection.close()

    def close(self) -> None:
        if self.app is not None:
            self.app.close()
        _cleanup(self.url, self.namespace, self.queue)


def run_mode(args: argparse.Namespace, setup: Setup, round_index: int, broker: Broker) -> Run:
    mode, queue, delay_ms = setup.mode, setup.queue, setup.delay_ms
    result = Run(mode, round_index, args.count, delay_ms, os.getloadavg())
    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for i in range(args.count):
            channel.basic_publish("", queue, b"\x80", pika.BasicProperties(
                message_id=str(i), delivery_mode=2, content_type=CONTENT_TYPE, headers={}))
    finally:
        connection.close()
    consumer = Consumer(args.url, queue, mode, delay_ms, setup.app)
    consumer.expected = args.count
    memory_before = broker.memory_mb()
    cpu_before, written_before = broker.cpu_s(), _broker_io_written(broker.pid)
    thread = threading.Thread(target=consumer.run, daemon=True)
    started = time.monotonic()
    thread.start()
    consumer.all_failed.wait(args.delay_s * 4 + 120)
    result.failing_s = time.monotonic() - started
    # Every retry is waiting now (unless failing them took longer than the delay).
    memory_waiting = broker.memory_mb()
    result.queues_memory_mb = _queues_memory_mb(setup.namespace)
    consumer.all_back.wait(args.delay_s * 4 + 120)
    consumer.stop.set()
    thread.join(30)
    if consumer.error is not None:
        raise consumer.error
    cpu_after, written_after = broker.cpu_s(), _broker_io_written(broker.pid)
    late = consumer.lateness_ms
    result.returned = len(late)
    result.early = sum(1 for value in late if value < 0)
    if late:
        result.late_ms = {"p50": _percentile(late, 0.5), "p90": _percentile(late, 0.9),
                          "p99": _percentile(late, 0.99), "max": max(late),
                          "mean": statistics.mean(late)}
    result.broker_memory_mb = {"before": memory_before, "waiting": memory_waiting}
    if cpu_before is not None and cpu_after is not None:
        result.broker_cpu_us_per_retry = (cpu_after - cpu_before) / args.count * 1e6
    if written_before is not None and written_after is not None:
        result.broker_written_bytes_per_retry = (written_after - written_before) / args.count
    return result


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
    for name in (namespace, topo.dlx_name(namespace), topo.unroutable_name(namespace)):
        channel.exchange_delete(name)
    connection.close()


def _line(run: Run) -> str:
    late = run.late_ms
    memory = run.broker_memory_mb
    return (f"round {run.round} {run.mode:<13} load {run.loadavg[0]:5.2f}  failing "
            f"{run.failing_s:5.1f}s  back {run.returned}/{run.count} early {run.early}  late ms "
            f"p50 {late.get('p50', 0):.0f} p90 {late.get('p90', 0):.0f} "
            f"p99 {late.get('p99', 0):.0f} max {late.get('max', 0):.0f}  broker MB "
            f"{memory.get('before') or 0:.0f}->{memory.get('waiting') or 0:.0f}  queues MB "
            f"{run.queues_memory_mb or 0:.1f}  broker CPU us/retry "
            f"{run.broker_cpu_us_per_retry or 0:.0f}  written B/retry "
            f"{run.broker_written_bytes_per_retry or 0:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--delay-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--output", type=Path, help="write every run as JSON here")
    args = parser.parse_args()
    broker = Broker.find(args.url)
    runs: list[Run] = []
    setups: dict[str, Setup] = {}
    try:
        for mode in args.modes:
            setups[mode] = Setup(args, mode)
        for round_index in range(1, args.rounds + 1):
            shift = (round_index - 1) % len(args.modes)
            for mode in args.modes[shift:] + args.modes[:shift]:
                run = run_mode(args, setups[mode], round_index, broker)
                runs.append(run)
                print(_line(run), flush=True)
    finally:
        for setup in setups.values():
            setup.close()
    if args.output:
        args.output.write_text(json.dumps([asdict(run) for run in runs], indent=1))


if __name__ == "__main__":
    main()
