"""One cluster scenario's world: its namespace and quorum queue, its processes, its counts.

A :class:`ClusterScenario` works on the module's 3-node :class:`RabbitCluster` and on a
PostgreSQL schema of the module's own (taskq's tables and ``cluster_effects``). It enqueues
through an App of its own (``broker_url`` naming all three nodes) and books every id in a
ledger; at the end it stops its worker and relay subprocesses, collects what the system shows
and reports ``lost / unexpected / duplicate`` effects, which must all be 0:

- *lost*: an id whose enqueue was confirmed (or whose outbox row committed) without an
  effect row;
- *unexpected*: an id executed, with an effect or still queued that nobody enqueued (or
  whose enqueue raised ``PublishError``: those are counted apart as in doubt);
- *duplicate*: an id with more than one effect row (executions may repeat: a redelivery
  recognised by its idempotency key runs nothing twice).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App
from taskq.broker import topology as topo
from taskq.errors import PublishError
from taskq.task import Task
from tests.cluster import tasks
from tests.conftest import truncate_taskq_tables
from tests.support.broker import BrokerAdmin
from tests.support.rabbitmq_nodes import RabbitCluster
from tests.system.workers import ROOT, Worker

logger = logging.getLogger(__name__)

APP_PATH = "tests.cluster.tasks:app"
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.2


@dataclass
class Counts:
    """The verdict of one scenario."""

    committed: int
    in_doubt: int
    lost: list[str]
    unexpected: list[str]
    duplicates: list[str]
    dead_lettered: list[str]
    executions: dict[int, int]
    max_delivery_count: int
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No loss, nothing unexpected, no duplicate effect, nothing healthy dead-lettered,
        and no publish that failed (failover must be invisible to producers)."""
        return not (self.lost or self.unexpected or self.duplicates or self.dead_lettered
                    or self.in_doubt or "producers_died" in self.notes)

    def line(self, scenario: str) -> str:
        return (
            f"cluster[{scenario}] committed={self.committed} lost={len(self.lost)} "
            f"unexpected={len(self.unexpected)} duplicate={len(self.duplicates)} "
            f"in_doubt={self.in_doubt} dead_lettered={len(self.dead_lettered)} "
            f"executions_per_task={dict(sorted(self.executions.items()))} "
            f"max_x_delivery_count={self.max_delivery_count} "
            + " ".join(f"{key}={value}" for key, value in self.notes.items())
        )


class ClusterScenario:
    """Harness of one scenario (see the module docstring)."""

    def __init__(
        self, name: str, *, cluster: RabbitCluster, database_url: str, directory: Path
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.directory = directory
        self.database_url = database_url
        self.namespace = f"tqc{uuid.uuid4().hex[:8]}"
        self.queue = f"{self.namespace}.work"
        self.executions_path = directory / f"{self.namespace}-executions.txt"
        self.engine = sa.create_engine(database_url, pool_pre_ping=True)
        # The module's scenarios share the schema and run one after another: start empty.
        truncate_taskq_tables(database_url)
        with self.engine.begin() as conn:
            conn.execute(tasks.effects.delete())
        self.app = App("taskq-cluster", **self.settings())
        self.committed: set[str] = set()
        self.in_doubt: set[str] = set()
        self.publish_errors: list[str] = []
        self.producer_failures: list[str] = []
        self._lock = threading.Lock()
        self.processes: list[Worker] = []
        self.notes: dict[str, str] = {}
        self.counts: Counts | None = None

    def settings(self) -> dict[str, Any]:
        """Settings of the producer App and (as TASKQ_* variables) of every subprocess."""
        return {
            "broker_url": self.cluster.broker_url,
            "database_url": self.database_url,
            "namespace": self.namespace,
            "default_queue": self.queue,
            "default_queue_type": "quorum",
            "delay_backend": "tiers",
            "delay_tier_queue_type": "quorum",
            "prefetch_count": 8,
            "publish_timeout_s": 30.0,
            "heartbeat_s": 10,
            "connect_timeout_s": 2.0,
        }

    def task(self, task: Task[Any, Any]) -> Task[Any, Any]:
        """``task`` (of :mod:`tests.cluster.tasks`) bound to this scenario's App."""
        return Task(self.app, task.fn, name=task.name, options=task.options)

    # -- processes ---------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
        env.update({f"TASKQ_{k.upper()}": str(v) for k, v in self.settings().items()})
        env["PYTHONPATH"] = str(ROOT)
        env[tasks.EXECUTIONS_ENV] = str(self.executions_path)
        return env

    def _spawn(self, label: str, command: list[str]) -> Worker:
        log_path = self.directory / f"{self.namespace}-{label}-{len(self.processes) + 1}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "taskq", *command], cwd=ROOT, env=self.env(),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        handle = Worker(process, log_path)
        self.processes.append(handle)
        return handle

    def start_workers(self, count: int, processes: int = 1) -> list[Worker]:
        """``count`` ``taskq worker`` supervisors (no relay); return once all consume."""
        workers = [
            self._spawn("worker", ["worker", "-A", APP_PATH, "--loglevel", "INFO",
                                   "-c", str(processes), "--no-relay"])
            for _ in range(count)
        ]
        for worker in workers:
            worker.wait_consuming(processes, timeout_s=60)
        return workers

    def start_relay(self) -> Worker:
        return self._spawn("relay", ["relay", "-A", APP_PATH, "--loglevel", "INFO"])

    def consumer_connects(self) -> dict[str, int]:
        """How often worker processes connected to each node (first connects and failovers)."""
        by_port = {str(node.port): node.name.split("@")[0] for node in self.cluster.nodes}
        found = re.findall(r"connected to the broker \(node [^:]+:(\d+)\)", self.logs())
        return dict(sorted(Counter(by_port.get(port, port) for port in found).items()))

    def producer_node(self) -> str | None:
        """The node the producer App's publisher is connected to now (``rabbitN``), if any."""
        link = self.app.publisher._link
        if link is None:
            return None
        port = link.connection._impl.params.port
        return next((node.name.split("@")[0] for node in self.cluster.nodes
                     if node.port == port), None)

    def logs(self) -> str:
        return "\n".join(f"== {p.log_path.name}\n{p.log()}" for p in self.processes)

    def stop_processes(self) -> None:
        """SIGTERM every live process (warm shutdown), then SIGKILL what is left."""
        for handle in self.processes:
            if handle.process.poll() is None:
                handle.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for handle in self.processes:
            try:
                handle.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time", handle.log_path.name)
            handle.kill_tree()

    # -- producing ---------------------------------------------------------------------------

    def delay(self, task: Task[Any, Any], *args: Any) -> None:
        """Publish now; book the id committed, or in doubt if the publish raised."""
        task_id = str(uuid.uuid4())
        try:
            task.apply_async(args, task_id=task_id)
        except PublishError as exc:
            with self._lock:
                self.in_doubt.add(task_id)
                if len(self.publish_errors) < 5:
                    self.publish_errors.append(str(exc))
            return
        with self._lock:
            self.committed.add(task_id)

    def produce(self, task: Task[Any, Any], count: int, *args: Any, threads: int = 2,
                pace_s: float = 0.0) -> threading.Thread:
        """Start ``threads`` producers publishing ``count`` tasks in all; return a joiner."""
        share = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]

        def run(n: int) -> None:
            try:
                for _ in range(n):
                    self.delay(task, *args)
                    if pace_s:
                        time.sleep(pace_s)  # a steady load, not a wait for a condition
            except BaseException as exc:  # a producer must not die unnoticed
                with self._lock:
                    self.producer_failures.append(f"{type(exc).__name__}: {exc}")
                raise

        workers = [threading.Thread(target=run, args=(n,), daemon=True) for n in share]
        for thread in workers:
            thread.start()

        def join_all() -> None:
            for thread in workers:
                thread.join()

        joiner = threading.Thread(target=join_all, daemon=True)
        joiner.start()
        return joiner

    def enqueue_rows(self, count: int, *, batch: int = 500) -> None:
        """Commit ``count`` outbox rows (transactions of ``batch``) without publishing."""
        work = self.task(tasks.work)
        for start in range(0, count, batch):
            ids = [str(uuid.uuid4()) for _ in range(min(batch, count - start))]
            with Session(self.engine) as session, session.begin():
                for task_id in ids:
                    work.apply_async((0,), task_id=task_id, session=session)
            self.committed.update(ids)

    # -- observing ---------------------------------------------------------------------------

    def effect_times(self) -> list[float]:
        with self.engine.connect() as conn:
            return sorted(row[0] for row in conn.execute(sa.select(tasks.effects.c.done_at)))

    def completed_count(self) -> int:
        with self.engine.connect() as conn:
            done = {row[0] for row in conn.execute(sa.select(tasks.effects.c.task_id))}
        return len(self.committed & done)

    def outbox_rows(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM taskq_outbox")).scalar() or 0)

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Wait for ``condition``; return when it held (monotonic) or fail with the logs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return time.monotonic()
            time.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"cluster[{self.name}]: {what} not within {timeout_s:.0f}s; "
                             f"{self.progress()}\n{self.logs()[-20000:]}")

    def progress(self) -> str:
        return (f"committed={len(self.committed)} completed={self.completed_count()} "
                f"in_doubt={len(self.in_doubt)} queues={self.queue_depths()}")

    def queue_depths(self) -> dict[str, int] | str:
        """Messages in each of the scenario's queues that holds some (for failure reports)."""
        try:
            via = next(n for n in self.cluster.nodes if n.is_alive())
            rows = json.loads(via.ctl("list_queues", "name", "messages", "leader",
                                      "--formatter", "json", timeout_s=20))
        except Exception as exc:  # a report only: never hide the failure being reported
            return f"unknown ({exc})"
        return {f"{row['name']}@{row.get('leader')}": row["messages"] for row in rows
                if str(row["name"]).startswith(self.namespace) and row.get("messages")}

    def wait_all_done(self, timeout_s: float) -> float:
        return self.wait_until(lambda: self.completed_count() >= len(self.committed),
                               timeout_s, "every committed task done")

    def longest_stall_s(self, since_epoch: float) -> float:
        """Longest time without a new effect, from ``since_epoch`` to the last effect."""
        times = [t for t in self.effect_times() if t >= since_epoch]
        points = [since_epoch, *times]
        return max((b - a for a, b in zip(points, points[1:], strict=False)), default=0.0)

    def first_effect_after(self, since_epoch: float) -> float | None:
        times = [t for t in self.effect_times() if t >= since_epoch]
        return times[0] - since_epoch if times else None

    def lateness_ms(self) -> list[int]:
        """How late (ms after its ``taskq-eta``) each execution that had an eta started."""
        fields = (line.split() for line in self.execution_lines())
        return sorted(int(f[4]) for f in fields if f[4] != "-")

    def execution_lines(self) -> list[str]:
        """The lines the tasks wrote so far (none before the first execution): one read,
        never an exists-check first."""
        try:
            return self.executions_path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def tier_messages(self) -> int:
        """Messages in the scenario's delay tiers, counted by a live node (incl. dead letters
        a tier still holds: ``messages`` counts them, ``messages_ready`` does not)."""
        depths = self.queue_depths()
        assert isinstance(depths, dict), depths
        prefix = topo.delay_tier_prefix(self.namespace)
        return sum(n for name, n in depths.items() if name.startswith(prefix))

    def admin(self) -> BrokerAdmin:
        """An admin connection to a live node."""
        node = next(n for n in self.cluster.nodes if n.is_alive())
        return BrokerAdmin(node.url)

    def finish(self) -> Counts:
        """Stop everything, count, print the counts line, and fail on any bad count."""
        self.stop_processes()
        self.notes["consumer_connects"] = str(self.consumer_connects()).replace(" ", "")
        executions: Counter[str] = Counter()
        max_count = 0
        for line in self.execution_lines():
            _, task_id, _, count, _ = line.split()
            executions[task_id] += 1
            max_count = max(max_count, int(count))
        with self.engine.connect() as conn:
            effects = Counter(row[0] for row in conn.execute(sa.select(tasks.effects.c.task_id)))
            queued = {row[0] for row in conn.execute(sa.text("SELECT id FROM taskq_outbox"))}
        admin = self.admin()
        try:
            dlq = topo.dlq_name(self.queue)
            dead = [str(p.message_id) for _, p, _ in admin.get_all(dlq)] if admin.exists(
                dlq) else []
            if admin.exists(self.queue):
                queued.update(str(p.message_id) for _, p, _ in admin.get_all(self.queue))
        finally:
            admin.close()
        seen = set(executions) | set(effects) | queued | set(dead)
        counts = Counts(
            committed=len(self.committed),
            in_doubt=len(self.in_doubt),
            lost=sorted(self.committed - set(effects)),
            unexpected=sorted(seen - self.committed - self.in_doubt),
            duplicates=sorted(i for i, rows in effects.items() if rows > 1),
            dead_lettered=sorted(dead),
            executions=dict(Counter(executions.get(i, 0) for i in self.committed)),
            max_delivery_count=max_count,
            notes=self.notes,
        )
        if self.producer_failures:
            counts.notes["producers_died"] = str(len(self.producer_failures))
        self.counts = counts
        line = counts.line(self.name)
        print(line)
        assert counts.ok, (
            f"{line}\nlost: {counts.lost[:5]} unexpected: {counts.unexpected[:5]} duplicate: "
            f"{counts.duplicates[:5]} dead-lettered: {counts.dead_lettered[:5]}\n"
            f"publish errors: {self.publish_errors}\n"
            f"producers that died: {self.producer_failures}\n"
            f"{self.logs()[-20000:]}"
        )
        return counts

    def close(self) -> None:
        for handle in self.processes:
            handle.kill_tree()
        self.app.close()
        self.engine.dispose()
