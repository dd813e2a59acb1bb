"""One fault scenario's world: its database, queue, processes, producer and the final check.

A :class:`Scenario` owns a fresh database on the private PostgreSQL cluster (taskq's tables
and ``fault_effects``), a namespace and queue on the private RabbitMQ node, an executions
file, and every ``taskq worker`` / ``taskq relay`` subprocess it starts (each in its own
session, so the finaliser SIGKILLs exactly their process groups). It enqueues through an App
of its own and books every id in a :class:`~tests.faults.ledger.Ledger`; at the end it stops
the processes, collects what the system shows (:class:`~tests.faults.ledger.Observed`) and
asserts the counts.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App
from taskq.broker import topology as topo
from taskq.errors import PublishError
from taskq.schema import metadata
from taskq.task import Task
from tests.faults import tasks
from tests.faults.ledger import Counts, FaultSchedule, Ledger, Observed, check
from tests.faults.services import PrivatePostgres, PrivateRabbit
from tests.support.broker import BrokerAdmin
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, Worker

logger = logging.getLogger(__name__)

APP_PATH = "tests.faults.tasks:app"
# taskq.worker.dead_letters logs "task <name>[<id>] from <queue> dead-lettered after ..."
_DEAD_LETTERED_RE = re.compile(r"\[([0-9a-f-]{36})\] from \S+ dead-lettered after attempt")
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.25


class Scenario:
    """Harness of one scenario (see the module docstring).

    Args:
        name: Short scenario name, printed in the counts line.
        rabbit: The private broker node.
        postgres: The private database cluster.
        directory: A directory of this scenario's own (logs, executions file).
        seed: Seed of every random choice.
    """

    def __init__(
        self, name: str, *, rabbit: PrivateRabbit, postgres: PrivatePostgres,
        directory: Path, seed: int,
    ) -> None:
        self.name = name
        self.rabbit = rabbit
        self.directory = directory
        self.rng = random.Random(seed)
        self.schedule = FaultSchedule(seed)
        self.ledger = Ledger()
        self.namespace = f"tqf{uuid.uuid4().hex[:8]}"
        self.queue = f"{self.namespace}.work"
        self.executions_path = directory / "executions.txt"
        self.database_url = _create_database(postgres, f"faults_{self.namespace}")
        self.engine = sa.create_engine(self.database_url, pool_pre_ping=True)
        self.app = App(
            "taskq-faults", broker_url=rabbit.url, database_url=self.database_url,
            namespace=self.namespace, default_queue=self.queue,
        )
        self.processes: list[Worker] = []
        self.done_at: float | None = None
        self.counts: Counts | None = None
        #: Figures of the scenario's own, printed in its counts line (``name=value``).
        self.notes: dict[str, str] = {}
        #: Failed checks of the scenario's own, reported by finish() with the counts.
        self.problems: list[str] = []

    # -- processes ---------------------------------------------------------------------------

    def env(self, broker_url: str | None = None, **settings: str) -> dict[str, str]:
        """Environment of a worker or relay subprocess (``TASKQ_<SETTING>`` from kwargs)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
        env.update(
            PYTHONPATH=str(ROOT),
            TASKQ_BROKER_URL=broker_url or self.rabbit.url,
            TASKQ_DATABASE_URL=self.database_url,
            TASKQ_NAMESPACE=self.namespace,
            TASKQ_DEFAULT_QUEUE=self.queue,
            **{tasks.EXECUTIONS_ENV: str(self.executions_path)},
        )
        env.update({f"TASKQ_{key.upper()}": value for key, value in settings.items()})
        return env

    def _spawn(self, label: str, command: list[str], env: dict[str, str]) -> Worker:
        log_path = self.directory / f"{label}-{len(self.processes) + 1}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "taskq", *command], cwd=ROOT, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        handle = Worker(process, log_path)
        self.processes.append(handle)
        return handle

    def start_worker(
        self, processes: int, *args: str, broker_url: str | None = None, relay: bool = False,
        **settings: str,
    ) -> Worker:
        """``taskq worker -c <processes>`` (relay off unless asked for)."""
        command = ["worker", "-A", APP_PATH, "--loglevel", "INFO", "-c", str(processes),
                   "--relay" if relay else "--no-relay", *args]
        return self._spawn("worker", command, self.env(broker_url, **settings))

    def start_relay(self, broker_url: str | None = None, **settings: str) -> Worker:
        """``taskq relay`` on its own."""
        command = ["relay", "-A", APP_PATH, "--loglevel", "INFO"]
        return self._spawn("relay", command, self.env(broker_url, **settings))

    def logs(self) -> str:
        """Every process log of the scenario, one after another."""
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
                logger.warning("%s did not stop within %.0fs", handle.log_path.name,
                               STOP_TIMEOUT_S)
            handle.kill_tree()  # also any child left behind

    # -- producing ---------------------------------------------------------------------------

    def task(self, task: Task[Any, Any]) -> Task[Any, Any]:
        """``task`` (of :mod:`tests.faults.tasks`) bound to this scenario's App."""
        return Task(self.app, task.fn, name=task.name, options=task.options)

    def durations_ms(self, count: int, low_ms: int, high_ms: int) -> list[int]:
        """``count`` task durations drawn from the scenario's seed."""
        return [self.rng.randint(low_ms, high_ms) for _ in range(count)]

    def delay(self, task: Task[Any, Any], *args: Any) -> str | None:
        """Publish now; book the id committed, or in doubt if the publish raised."""
        task_id = str(uuid.uuid4())
        try:
            task.apply_async(args, task_id=task_id)
        except PublishError:
            self.ledger.doubt(task_id)
            return None
        self.ledger.commit(task_id)
        return task_id

    def delay_until_confirmed(self, task: Task[Any, Any], *args: Any,
                              timeout_s: float = 120.0) -> str:
        """Publish now, retrying with the same task id until the broker confirms it.

        What a careful producer does during an outage: a copy that was confirmed after all
        is absorbed by the idempotency key. Books the id committed once confirmed.
        """
        task_id = str(uuid.uuid4())
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                task.apply_async(args, task_id=task_id)
                break
            except PublishError:
                if time.monotonic() > deadline:
                    self.ledger.doubt(task_id)
                    raise
                time.sleep(0.2)  # a producer's retry pace
        self.ledger.commit(task_id)
        return task_id

    def publish_copies(self, task: Task[Any, Any], calls: list[tuple[Any, ...]],
                       copies: int) -> list[str]:
        """Publish every call ``copies`` times back to back (same message); book them."""
        from taskq.message import encode

        envelopes = [task.envelope(args) for args in calls]
        items = [(self.app.topology.exchange, task.queue, encode(envelope))
                 for envelope in envelopes for _ in range(copies)]
        self.app.publisher.publish_many(items)
        ids = [envelope.task_id for envelope in envelopes]
        self.ledger.commit(*ids)
        return ids

    def republish(self, task: Task[Any, Any], calls: dict[str, tuple[Any, ...]]) -> None:
        """Publish the calls again under their ids (a second copy of each message)."""
        from taskq.message import encode

        items = [(self.app.topology.exchange, task.queue,
                  encode(task.envelope(args, task_id=task_id)))
                 for task_id, args in calls.items()]
        self.app.publisher.publish_many(items)

    def queue_depth(self) -> int:
        """Ready messages in the scenario's queue (-1 while the broker is unreachable)."""
        admin = BrokerAdmin(self.rabbit.url)
        try:
            return admin.depth(self.queue)
        except Exception:  # down, or not declared yet
            return -1
        finally:
            admin.close()

    def enqueue_rows(self, durations_ms: list[int], *, commit: bool = True,
                     hold_s: float = 0.0) -> list[str]:
        """One producer transaction adding an outbox row per duration; commit or roll back.

        ``hold_s`` keeps the transaction open that long after its inserts (a slow request).
        """
        work = self.task(tasks.work)
        ids = [str(uuid.uuid4()) for _ in durations_ms]
        try:
            with Session(self.engine) as session:
                with session.begin():
                    for task_id, duration_ms in zip(ids, durations_ms, strict=True):
                        work.apply_async((duration_ms,), task_id=task_id, session=session)
                    if hold_s:
                        time.sleep(hold_s)  # the fault under test: a transaction held open
                    if not commit:
                        session.rollback()
        except sa.exc.DBAPIError:
            # The database went away: a COMMIT cut off may or may not have happened.
            self.ledger.doubt(*ids)
            raise
        (self.ledger.commit if commit else self.ledger.roll_back)(*ids)
        return ids

    # -- waiting and checking ----------------------------------------------------------------

    def expect(self, condition: bool, problem: str) -> None:
        """Note a failed check; :meth:`finish` fails with it after printing the counts."""
        if not condition:
            logger.error("scenario %s: %s", self.name, problem)
            self.problems.append(problem)

    def expect_soon(self, predicate: Callable[[], object], *, timeout_s: float,
                    problem: str) -> float | None:
        """Wait for ``predicate``; return how long it took, or note ``problem`` (None)."""
        started = time.monotonic()
        try:
            wait_until(predicate, timeout_s=timeout_s, interval_s=POLL_INTERVAL_S,
                       message=problem)
        except AssertionError:
            self.expect(False, f"{problem} (not within {timeout_s:.0f}s)")
            return None
        return time.monotonic() - started

    def completed_ids(self) -> set[str]:
        """Ids with an effect row (none while the database is unreachable)."""
        try:
            with self.engine.connect() as conn:
                return {row[0] for row in conn.execute(sa.select(tasks.effects.c.task_id))}
        except sa.exc.DBAPIError:
            return set()

    def completed_count(self) -> int:
        """Committed ids with an effect row (0 while the database is unreachable)."""
        return len(self.ledger.committed & self.completed_ids())

    def logged_dead_letters(self) -> set[str]:
        """Ids the workers logged as dead-lettered (their copy in ``Q.dlq`` confirmed).

        Only for waiting: the final counts read ``Q.dlq`` itself.
        """
        return set(_DEAD_LETTERED_RE.findall(self.logs()))

    def outbox_rows(self) -> int | None:
        """Rows waiting in the outbox (None while the database is unreachable)."""
        try:
            with self.engine.connect() as conn:
                return int(conn.execute(sa.text("SELECT count(*) FROM taskq_outbox")).scalar() or 0)
        except sa.exc.DBAPIError:
            return None

    def wait_all_done(self, timeout_s: float) -> bool:
        """Wait until every committed id completed or was dead-lettered; note the time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            settled = self.completed_ids() | self.logged_dead_letters()
            if self.ledger.committed <= settled:
                self.done_at = time.monotonic()
                return True
            time.sleep(POLL_INTERVAL_S)
        logger.error("scenario %s: not all done within %.0fs", self.name, timeout_s)
        return False

    def observe_executions(self) -> Counter[str]:
        """Runs per task id so far (from the executions file)."""
        return _executions(self.executions_path)

    def observe(self) -> Observed:
        """What the system shows (call after :meth:`stop_processes`)."""
        observed = Observed(executions=_executions(self.executions_path))
        with self.engine.connect() as conn:
            observed.effects = Counter(
                row[0] for row in conn.execute(sa.select(tasks.effects.c.task_id))
            )
            observed.queued.update(
                row[0] for row in conn.execute(sa.text("SELECT id FROM taskq_outbox"))
            )
        admin = BrokerAdmin(self.rabbit.url)
        try:
            dlq = topo.dlq_name(self.queue)
            for _, props, _ in admin.get_all(dlq) if admin.exists(dlq) else []:
                headers = props.headers or {}
                task_id = str(props.message_id)
                observed.dead_letters[task_id] = str(
                    headers.get("taskq-error-type", "no taskq-error-type header")
                )
                observed.dead_letter_errors[task_id] = str(headers.get("taskq-error", ""))[:300]
            for name in (self.queue, topo.unroutable_name(self.namespace)):
                if admin.exists(name):
                    observed.queued.update(str(p.message_id) for _, p, _ in admin.get_all(name))
        finally:
            admin.close()
        return observed

    def finish(
        self, *, expected_dead: frozenset[str] = frozenset(), other_dead_ok: bool = False,
        check_more: Callable[[Counts, Observed], list[str]] | None = None,
    ) -> Counts:
        """Stop everything, check, print the counts line last, and fail on any bad count.

        Args:
            expected_dead: Ids that must end in ``Q.dlq`` (poison).
            other_dead_ok: Whether other committed ids may be dead-lettered too (a kill
                storm charges deaths to whatever message a process held); otherwise a
                healthy task in ``Q.dlq`` fails the scenario.
            check_more: The scenario's own checks of the outcome; returns problems.
        """
        self.stop_processes()
        observed = self.observe()
        counts = check(self.ledger, observed, done_at=self.done_at, schedule=self.schedule)
        self.counts = counts
        problems = [*self.problems, *([counts.details()] if not counts.ok else [])]
        healthy_dead = sorted(set(counts.dead_lettered) - expected_dead)
        if healthy_dead and not other_dead_ok:
            problems.append(f"healthy tasks dead-lettered ({len(healthy_dead)}): "
                            f"{', '.join(healthy_dead[:5])}")
        not_dead = sorted(expected_dead - set(counts.dead_lettered))
        if not_dead:
            problems.append(f"poison not dead-lettered ({len(not_dead)}): "
                            f"{', '.join(not_dead[:5])}")
        if check_more is not None:
            problems.extend(check_more(counts, observed))
        line = counts.line(self.name, self.schedule, self.notes)
        if problems:
            bad = counts.lost + counts.unexpected + counts.dup_effects + healthy_dead + not_dead
            print(f"faults[{self.name}] " + "; ".join(problems))
            print(self.evidence(bad, observed))
        print(line)
        assert not problems, "; ".join(problems) + "\n" + line
        return counts

    def evidence(self, ids: list[str], observed: Observed, per_id: int = 8) -> str:
        """Log lines naming the first few ``ids``, and their dead-letter reasons."""
        logs = self.logs().splitlines()
        out = []
        for task_id in ids[:5]:
            lines = [line for line in logs if task_id in line][:per_id]
            if task_id in observed.dead_letters:
                lines.append(f"in Q.dlq: {observed.dead_letters[task_id]}: "
                             f"{observed.dead_letter_errors.get(task_id, '')}")
            runs = observed.executions.get(task_id, 0)
            rows = observed.effects.get(task_id, 0)
            out.append(f"-- {task_id} (executions {runs}, effect rows {rows}):\n"
                       + "\n".join(lines))
        return "\n".join(out)

    def close(self) -> None:
        """Kill every process and release the scenario's App and engine."""
        for handle in self.processes:
            handle.kill_tree()
        self.app.close()
        self.engine.dispose()


def _create_database(postgres: PrivatePostgres, name: str) -> str:
    admin = sa.create_engine(postgres.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = postgres.url(name)
    engine = sa.create_engine(url)
    metadata.create_all(engine)
    tasks.effects_metadata.create_all(engine)
    engine.dispose()
    return url


def _executions(path: Path) -> Counter[str]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return Counter()
    return Counter(line.split()[1] for line in lines if line.strip())
