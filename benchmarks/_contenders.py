"""Contenders: one system in one configuration, behind the few operations the scenarios use.

Every measurement gets a fresh queue (and, for taskq, a fresh namespace); ``cleanup`` deletes
what the contender and its workers declared. Workers run as subprocesses in their own session
(process group), stopped with SIGTERM and, failing that, SIGKILL to that group only.

Task kinds: ``noop``; ``sleep`` (``time.sleep(arg)``); ``latency`` (the argument is the
producer's ``time.time()`` at the enqueue call).
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

ROOT = Path(__file__).resolve().parents[1]
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
#: Window of unconfirmed messages of the raw pipelined producer (as taskq's PUBLISH_WINDOW).
RAW_WINDOW = 512
#: basic.qos of the raw consumer: taskq's default prefetch_count.
RAW_PREFETCH = 16
_DOUBLE = struct.Struct("<d")


def celery_url(url: str = BROKER_URL) -> str:
    """The same broker as a kombu ``pyamqp://`` URL."""
    rest = url.split("://", 1)[1]
    host, _, vhost = rest.partition("/")
    return f"pyamqp://{host}/{'' if vhost in ('', '%2F') else vhost}"


@dataclass
class Worker:
    """A running worker command and its log file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (warm shutdown); SIGKILL the process group if it is still there."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the group we created, leftovers only
        self.process.wait(10)

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_worker(command: list[str], env: dict[str, str], log_path: Path) -> Worker:
    """Run ``command`` from the repository root with ``env`` added, output to ``log_path``."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    return Worker(process, log_path)


@dataclass
class Measurement:
    """Where one measurement happens: its queue, probe directory and log file."""

    queue: str
    probe_dir: Path
    log_path: Path
    database_url: str | None = None


class Contender:
    """One system in one configuration (see the subclasses)."""

    #: Row label in the tables, e.g. ``"celery (confirms on)"``.
    name: str = ""
    #: Short label of the system: raw pika, taskq, celery, dramatiq.
    system: str = ""
    #: What ``publish_fast`` uses, for the enqueue table.
    fast_api: str = ""
    #: What ``publish_each`` uses.
    each_api: str = ""
    #: Consumers on the queue once every worker process is up.
    consumers: int = 2

    def open(self, m: Measurement) -> None:
        """Prepare the producer side for ``m.queue``."""
        self.m = m

    def publish_fast(self, kind: str, n: int, arg: float = 0.0) -> None:
        """Enqueue ``n`` tasks with the fastest API the system offers."""
        raise NotImplementedError

    def publish_each(self, kind: str, n: int, arg: float = 0.0) -> None:
        """Enqueue ``n`` tasks one call at a time (one confirm per call where configured)."""
        for _ in range(n):
            self.publish_one(kind, arg)

    def publish_one(self, kind: str, arg: float = 0.0) -> None:
        """Enqueue one task with the system's everyday call."""
        raise NotImplementedError

    def start(self, m: Measurement, kind: str) -> Worker:
        """Start the workers for ``m`` (``kind`` matters to the raw consumer only)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the producer side."""

    def cleanup(self, admin: Admin) -> None:
        """Delete what this measurement declared."""
        admin.delete_queues(self.m.queue)


class Admin:
    """The harness's own connection: queue depth, consumer count, deletes."""

    def __init__(self, url: str = BROKER_URL) -> None:
        self.url = url
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()

    def server_version(self) -> str:
        props = self.connection._impl.server_properties or {}
        version = props.get("version", b"?")
        return version.decode() if isinstance(version, bytes) else str(version)

    def _channel(self) -> Any:
        # Idle through a long scenario (600 s of delays), the connection missed heartbeats
        # and the broker closed it: reading it once notices that, and it is opened again.
        with suppress(pika.exceptions.AMQPError):
            if self.connection.is_open:
                self.connection.process_data_events(0)
        if not self.channel.is_open:
            if not self.connection.is_open:
                self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
            self.channel = self.connection.channel()
        return self.channel

    def counts(self, queue: str) -> tuple[int, int] | None:
        """(ready messages, consumers) of ``queue``; ``None`` if it does not exist."""
        try:
            ok = self._channel().queue_declare(queue, passive=True).method
        except pika.exceptions.ChannelClosedByBroker:
            return None
        return int(ok.message_count), int(ok.consumer_count)

    def declare(self, queue: str) -> None:
        self._channel().queue_declare(queue, durable=True)

    def delete_queues(self, *names: str) -> None:
        for name in names:
            with suppress(pika.exceptions.ChannelClosedByBroker):
                self._channel().queue_delete(name)

    def delete_exchanges(self, *names: str) -> None:
        for name in names:
            with suppress(pika.exceptions.ChannelClosedByBroker):
                self._channel().exchange_delete(name)

    def delete_taskq_app(self, namespace: str, queue: str) -> None:
        """Delete what a taskq app in ``namespace`` declared for its work ``queue``."""
        from taskq.broker import topology as topo

        self.delete_queues(queue, topo.dlq_name(queue), topo.unroutable_name(namespace))
        self.delete_exchanges(
            topo.exchange_name(namespace), topo.dlx_name(namespace),
            topo.unroutable_name(namespace),
        )

    def sleep(self, seconds: float) -> None:
        self.connection.sleep(seconds)

    def close(self) -> None:
        with suppress(Exception):
            self.connection.close()


# -- raw pika -------------------------------------------------------------------------------


def _raw_properties() -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, message_id=str(uuid.uuid4()))


def publish_windowed(
    url: str, total: int, send: Callable[[Any, int, int], int], window: int = RAW_WINDOW
) -> None:
    """Publish ``total`` messages on a SelectConnection keeping ``window`` unconfirmed.

    ``send(channel, first, room)`` publishes messages ``first``, ``first + 1``, ... (at most
    ``room`` of them) and returns how many it published. Returns once all are confirmed.
    """
    state = {"next": 0, "unconfirmed": 0, "confirmed": 0}
    holder: list[Any] = []

    def fill() -> None:
        channel = holder[0]
        while state["unconfirmed"] < window and state["next"] < total:
            room = min(window - state["unconfirmed"], total - state["next"])
            sent = send(channel, state["next"], room)
            state["next"] += sent
            state["unconfirmed"] += sent

    def on_confirm(frame: Any) -> None:
        method = frame.method
        done = method.delivery_tag - state["confirmed"] if method.multiple else 1
        state["confirmed"] += done
        state["unconfirmed"] -= done
        if state["confirmed"] >= total:
            connection.close()
        else:
            fill()

    def on_channel(channel: Any) -> None:
        holder.append(channel)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: fill())

    connection = pika.SelectConnection(
        pika.URLParameters(url),
        on_open_callback=lambda conn: conn.channel(on_open_callback=on_channel),
        on_close_callback=lambda _conn, _reason: connection.ioloop.stop(),
    )
    connection.ioloop.start()


def raw_pipelined(url: str, queue: str, bodies: list[bytes], window: int = RAW_WINDOW) -> None:
    """Publish ``bodies`` to ``queue`` keeping ``window`` unconfirmed (SelectConnection)."""

    def send_one(channel: Any, first: int, _room: int) -> int:
        channel.basic_publish("", queue, bodies[first], _raw_properties())
        return 1

    publish_windowed(url, len(bodies), send_one, window)


class RawPika(Contender):
    """Minimal pika producer and consumer: the ceiling of any pika-based task queue."""

    name = system = "raw pika"
    fast_api = "pipelined confirms (window 512)"
    each_api = "BlockingChannel, one confirm per message"

    def open(self, m: Measurement) -> None:
        super().open(m)
        self._blocking: Any = None
        connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        connection.channel().queue_declare(m.queue, durable=True)
        connection.close()

    def publish_fast(self, kind: str, n: int, arg: float = 0.0) -> None:
        body = _DOUBLE.pack(arg)
        raw_pipelined(BROKER_URL, self.m.queue, [body] * n)

    def publish_one(self, kind: str, arg: float = 0.0) -> None:
        if self._blocking is None:
            connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
            channel = connection.channel()
            channel.confirm_delivery()
            self._blocking = (connection, channel)
        if kind == "latency":
            arg = time.time()
        self._blocking[1].basic_publish("", self.m.queue, _DOUBLE.pack(arg), _raw_properties())

    def start(self, m: Measurement, kind: str) -> Worker:
        command = [sys.executable, "-m", "benchmarks._apps.raw_consumer", m.queue, kind, "2"]
        env = {
            "BENCH_BROKER_URL": BROKER_URL,
            "BENCH_PROBE_DIR": str(m.probe_dir),
            "BENCH_PREFETCH": str(RAW_PREFETCH),
        }
        return start_worker(command, env, m.log_path)

    def close(self) -> None:
        if self._blocking is not None:
            with suppress(Exception):
                self._blocking[0].close()
            self._blocking = None


# -- taskq ----------------------------------------------------------------------------------


class Taskq(Contender):
    """``taskq worker -c 2`` (or ``processes``) and the app's publisher; confirms always on."""

    system = "taskq"
    fast_api = "Task.starmap / Task.map (windowed confirms, 512)"
    each_api = "Task.delay()"

    def __init__(
        self, *, idempotent: bool = False, relay: bool = False, label: str = "",
        each: bool = False, processes: int = 2,
    ) -> None:
        self.idempotent = idempotent
        self.processes = self.consumers = processes
        self.relay = relay
        self.each = each  # e2e with delay() instead of starmap
        self.name = label or "taskq"

    def open(self, m: Measurement) -> None:
        from benchmarks._apps.taskq_app import make_app

        super().open(m)
        self.namespace = m.queue.replace(".", "-")
        settings: dict[str, Any] = {
            "broker_url": BROKER_URL, "namespace": self.namespace, "default_queue": m.queue,
        }
        if m.database_url:
            settings["database_url"] = m.database_url
        self.app = make_app(idempotent=self.idempotent, **settings)
        self.tasks = {kind: self.app.registry.get(f"bench.{kind}") for kind in
                      ("noop", "sleep", "latency")}

    def publish_fast(self, kind: str, n: int, arg: float = 0.0) -> None:
        if self.each:
            self.publish_each(kind, n, arg)
        elif kind == "noop":
            self.tasks[kind].starmap([()] * n)
        else:
            self.tasks[kind].map([arg] * n)

    def publish_one(self, kind: str, arg: float = 0.0) -> None:
        task = self.tasks[kind]
        if kind == "noop":
            task.delay()
        elif kind == "latency":
            task.delay(time.time())
        else:
            task.delay(arg)

    def start(self, m: Measurement, kind: str) -> Worker:
        command = [
            sys.executable, "-m", "taskq", "worker", "-A", "benchmarks._apps.taskq_app:app",
            "-c", str(self.processes), "--loglevel", "WARNING",
        ]
        if not self.relay:
            command.insert(-2, "--no-relay")
        env = {
            "TASKQ_BROKER_URL": BROKER_URL,
            "TASKQ_NAMESPACE": self.namespace,
            "TASKQ_DEFAULT_QUEUE": m.queue,
            "BENCH_IDEMPOTENT": "1" if self.idempotent else "0",
            "BENCH_PROBE_DIR": str(m.probe_dir),
        }
        if m.database_url:
            env["TASKQ_DATABASE_URL"] = m.database_url
        return start_worker(command, env, m.log_path)

    def close(self) -> None:
        self.app.close()

    def cleanup(self, admin: Admin) -> None:
        admin.delete_taskq_app(self.namespace, self.m.queue)


# -- Celery ---------------------------------------------------------------------------------


class CeleryContender(Contender):
    """Celery, prefork pool ``-c 2``, ``task_acks_late=True``, py-amqp transport."""

    system = "celery"
    consumers = 1  # the consumer lives in the main process, the pool runs the tasks

    def __init__(self, *, confirm: bool) -> None:
        self.confirm = confirm
        self.name = f"celery (confirms {'on' if confirm else 'off'})"
        self.fast_api = "apply_async in a loop, one producer" + (
            ", one confirm per message" if confirm else ", no confirms"
        )
        self.each_api = "delay()" + (", one confirm per message" if confirm else "")

    def open(self, m: Measurement) -> None:
        from benchmarks._apps.celery_app import make_app

        super().open(m)
        self.app = make_app(celery_url(), m.queue, confirm=self.confirm)
        self.tasks = {kind: self.app.tasks[f"bench.{kind}"] for kind in
                      ("noop", "sleep", "latency")}

    def publish_fast(self, kind: str, n: int, arg: float = 0.0) -> None:
        task = self.tasks[kind]
        args = () if kind == "noop" else (arg,)
        with self.app.producer_or_acquire() as producer:
            for _ in range(n):
                task.apply_async(args, producer=producer)

    def publish_one(self, kind: str, arg: float = 0.0) -> None:
        task = self.tasks[kind]
        if kind == "noop":
            task.delay()
        else:
            task.delay(time.time() if kind == "latency" else arg)

    def start(self, m: Measurement, kind: str) -> Worker:
        command = [
            sys.executable, "-m", "celery", "-A", "benchmarks._apps.celery_app", "worker",
            "-c", "2", "-P", "prefork", "-Q", m.queue, "--loglevel", "WARNING",
            "-n", f"{m.queue}@%h",
        ]
        env = {
            "BENCH_BROKER_URL": celery_url(),
            "BENCH_QUEUE": m.queue,
            "BENCH_CONFIRM": "1" if self.confirm else "0",
            "BENCH_PROBE_DIR": str(m.probe_dir),
        }
        return start_worker(command, env, m.log_path)

    def close(self) -> None:
        self.app.close()

    def cleanup(self, admin: Admin) -> None:
        queue = self.m.queue
        admin.delete_queues(queue)
        admin.delete_exchanges(
            queue, f"{queue}.ev", f"{queue}.pidbox", f"reply.{queue}.pidbox"
        )


# -- Dramatiq -------------------------------------------------------------------------------


class DramatiqContender(Contender):
    """Dramatiq's RabbitmqBroker, ``--processes 2 --threads T``."""

    system = "dramatiq"

    def __init__(self, *, threads: int | None, confirm: bool) -> None:
        self.threads = threads
        self.confirm = confirm
        shown = f"{threads} thread" if threads == 1 else "8 threads (default)"
        self.name = f"dramatiq (2 proc x {shown}, confirms {'on' if confirm else 'off'})"
        self.fast_api = "actor.send() in a loop" + (", confirm_delivery" if confirm else "")
        self.each_api = self.fast_api

    def open(self, m: Measurement) -> None:
        from benchmarks._apps.dramatiq_app import make

        super().open(m)
        self.bench = make(BROKER_URL, m.queue, confirm=self.confirm)
        self.actors: dict[str, Any] = {
            "noop": self.bench.noop, "sleep": self.bench.sleep, "latency": self.bench.latency,
        }

    def publish_fast(self, kind: str, n: int, arg: float = 0.0) -> None:
        self.publish_each(kind, n, arg)

    def publish_one(self, kind: str, arg: float = 0.0) -> None:
        actor = self.actors[kind]
        if kind == "noop":
            actor.send()
        else:
            actor.send(time.time() if kind == "latency" else arg)

    def start(self, m: Measurement, kind: str) -> Worker:
        command = [
            sys.executable, "-m", "dramatiq", "benchmarks._apps.dramatiq_app",
            "--processes", "2", "--queues", m.queue,
        ]
        if self.threads is not None:
            command += ["--threads", str(self.threads)]
        env = {
            "BENCH_BROKER_URL": BROKER_URL,
            "BENCH_QUEUE": m.queue,
            "BENCH_CONFIRM": "1" if self.confirm else "0",
            "BENCH_PROBE_DIR": str(m.probe_dir),
        }
        return start_worker(command, env, m.log_path)

    def close(self) -> None:
        self.bench.broker.close()

    def cleanup(self, admin: Admin) -> None:
        queue = self.m.queue
        admin.delete_queues(queue, f"{queue}.DQ", f"{queue}.XQ")
