"""One road, every combination: each producer path × each queue kind × each delay backend.

Every way a message comes into being (``delay``/``apply_async``, a countdown, ``starmap``,
the outbox with and without a countdown, a chain's later step, a workflow's errback, a
retry, a replay from the ``.dlq``, a schedule's tick) is tried on a classic, a quorum and an
ordered queue, with the tiers (always) and the delayed-message plugin (where the broker has
it; skipped with the reason otherwise). Each combination either runs the task exactly once
(one row in ``road_effects``, written in the task's own transaction) or is refused at the
call with an error naming the task, the queue and the fix: a priority on a queue that takes
none, arguments that do not fit the function. One ``taskq worker --relay --beat`` per
delay backend serves the whole module (PostgreSQL, the shared RabbitMQ).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App, chain
from taskq.broker.topology import dlq_name
from taskq.dlq import list_parked, replay
from taskq.errors import ConfigurationError
from taskq.task import Task
from tests import tasks_road
from tests.conftest import BROKER_URL, delete_topology, postgres_schema, schema_url
from tests.contract.test_delay_backends import plugin_enabled
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, Worker

KINDS = tasks_road.KINDS
PATHS = (
    "delay", "countdown", "starmap", "outbox", "outbox_countdown", "workflow_step",
    "errback", "retry", "replay", "schedule",
)
# Paths that take a priority from the caller (a replay keeps the message's own).
PRIORITISED = tuple(p for p in PATHS if p != "replay")


@dataclass
class Road:
    """The module's worker, and the test App and tasks that send to it."""

    app: App
    prefix: str
    tasks: dict[str, dict[str, Task[Any, Any]]]
    worker: Worker

    def rows(self, marker: str) -> list[str]:
        """The task ids of the runs that recorded ``marker``."""
        with self.app.engine.connect() as conn:
            return list(conn.execute(sa.select(tasks_road.effects.c.task_id)
                                     .where(tasks_road.effects.c.marker == marker)).scalars())

    def ran_once(self, marker: str, timeout_s: float = 30.0) -> None:
        """Wait until ``marker`` ran, then check it ran exactly once so far."""
        wait_until(lambda: self.rows(marker), timeout_s=timeout_s,
                   message=lambda: f"{marker} never ran; worker log:\n{self.worker.log()[-4000:]}")
        assert len(self.rows(marker)) == 1, f"{marker} ran {len(self.rows(marker))} times"


def _backends() -> list[Any]:
    plugin = pytest.mark.skipif(
        not plugin_enabled(),
        reason="the broker has no rabbitmq_delayed_message_exchange plugin (RabbitMQ 4.3 has "
        "none; on 3.x enable it to run the plugin column)",
    )
    return ["tiers", pytest.param("plugin", marks=plugin)]


@pytest.fixture(scope="module", params=_backends())
def road(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Road]:
    backend = request.param
    namespace = f"tq{uuid.uuid4().hex[:10]}"
    prefix = f"{namespace}.road"
    with postgres_schema("road") as schema:
        url = schema_url(schema)
        engine = sa.create_engine(url)
        tasks_road.effects_metadata.create_all(engine)
        engine.dispose()
        app = App("road-test", broker_url=BROKER_URL, database_url=url, namespace=namespace,
                  default_queue=f"{prefix}.classic", delay_backend=backend)
        for kind in KINDS:
            if kind == "ordered":
                app.queue(f"{prefix}.{kind}", partitions=4)
            else:
                app.queue(f"{prefix}.{kind}", type=kind)
        tasks = {
            kind: {
                what: Task(app, task.fn, name=task.name,
                           options=dataclasses.replace(task.options, queue=f"{prefix}.{kind}"))
                for what, task in tasks_road.TASKS[kind].items()
            }
            for kind in KINDS
        }
        worker = _start_worker(tmp_path_factory.mktemp("road"), namespace, prefix, url, backend)
        try:
            worker.wait_consuming(2, timeout_s=90)
            yield Road(app, prefix, tasks, worker)
            _no_duplicates(app)
        finally:
            worker.kill_tree()
            app.close()
            delete_topology(app)


def _start_worker(directory: Path, namespace: str, prefix: str, url: str, backend: str) -> Worker:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace,
        "TASKQ_DEFAULT_QUEUE": f"{prefix}.classic",
        "TASKQ_DATABASE_URL": url,
        "TASKQ_DELAY_BACKEND": backend,
        "TASKQ_TEST_ROAD_PREFIX": prefix,
        "TASKQ_TEST_ROAD_SCHEDULES": "1",
    }
    log_path = directory / "worker.log"
    command = [sys.executable, "-m", "taskq", "worker", "-A", "tests.tasks_road:app",
               "-c", "2", "--relay", "--beat", "--loglevel", "INFO"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return Worker(process, log_path)


def _no_duplicates(app: App) -> None:
    effects = tasks_road.effects
    with app.engine.connect() as conn:
        twice = conn.execute(
            sa.select(effects.c.task_id, sa.func.count()).group_by(effects.c.task_id)
            .having(sa.func.count() > 1)
        ).all()
    assert twice == [], f"tasks that ran more than once: {twice}"


# -- the producer paths --------------------------------------------------------------------


def send(road: Road, path: str, kind: str, marker: str, *, priority: int | None = None,
         short: bool = False) -> Callable[[], None] | None:
    """Send ``marker`` along ``path`` to ``kind``'s queue; return what completes it, if any.

    ``short=True`` leaves the ``marker`` argument out: a call the function cannot take.
    """
    tasks = road.tasks[kind]
    args: tuple[Any, ...] = (marker,) if short else (marker, marker)  # (key, marker)
    options: dict[str, Any] = {} if priority is None else {"priority": priority}
    if path == "delay":
        tasks["record"].apply_async(args, **options)
    elif path == "countdown":
        tasks["record"].apply_async(args, countdown=0.5, **options)
    elif path == "starmap":
        tasks["record"].starmap([args], **options)
    elif path in ("outbox", "outbox_countdown"):
        countdown = 0.5 if path == "outbox_countdown" else None
        with Session(road.app.engine) as session, session.begin():
            tasks["record"].apply_async(args, session=session, countdown=countdown, **options)
    elif path == "workflow_step":
        # The second step gets the first one's result ("<marker>/first") as its key.
        first = tasks["record"].si(marker, f"{marker}/first")
        chain(first, tasks["record"].s(*args[1:])).apply_async(**options)
    elif path == "errback":
        chain(tasks["fail"].si(marker, f"{marker}/fails")).apply_async(
            link_error=tasks["errback"].s(*args), **options)
    elif path == "retry":
        tasks["flaky"].apply_async(args, **options)
    elif path == "replay":
        return _replay(road, kind, tasks["gate"].apply_async(args, **options).id, marker)
    elif path == "schedule":
        road.app.add_periodic_task(60.0, tasks["record"], name=f"road-{marker}", args=args,
                                   **options)
    return None


def _replay(road: Road, kind: str, task_id: str, marker: str) -> Callable[[], None]:
    queue = f"{road.prefix}.{kind}"

    def complete() -> None:
        # The .dlq holds other tests' dead letters too (the errback path's): wait for this
        # one, open its gate, replay it alone.
        wait_until(lambda: task_id in {p.task_id for p in list_parked(road.app, queue)},
                   timeout_s=30, interval_s=0.3,
                   message=f"{marker} was never dead-lettered to {dlq_name(queue)}")
        with road.app.engine.begin() as conn:
            conn.execute(tasks_road.gates.insert().values(marker=marker))
        report = replay(road.app, queue, ids={task_id})
        assert report.replayed == 1, report

    return complete


# -- the combinations --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_each_path_runs_the_task_exactly_once_on_each_queue_kind(
    road: Road, path: str, kind: str
) -> None:
    if path == "schedule":  # the worker's own schedules: one per kind, every second
        marker = f"tick-{kind}"
        wait_until(lambda: len(road.rows(marker)) >= 2, timeout_s=30,
                   message=lambda: f"no two ticks of {kind}; log:\n{road.worker.log()[-4000:]}")
        ids = road.rows(marker)
        assert len(ids) == len(set(ids)), f"a tick ran twice: {ids}"
        return
    marker = f"{path}-{kind}-{uuid.uuid4().hex[:8]}"
    complete = send(road, path, kind, marker)
    if complete is not None:
        complete()
    road.ran_once(marker)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", PRIORITISED)
def test_a_priority_runs_where_the_queue_honours_it_and_is_refused_at_the_call_elsewhere(
    road: Road, path: str, kind: str
) -> None:
    marker = f"prio-{path}-{kind}-{uuid.uuid4().hex[:8]}"
    queue = f"{road.prefix}.{kind}"
    # Classic queues take priorities; quorum ones from RabbitMQ 4.0 (the road learns the
    # broker's version); ordered ones never.
    if road.app.road.takes_priorities(queue):
        send(road, path, kind, marker, priority=5)
        if path == "schedule":
            return  # accepted at definition; its tick is a minute away
        road.ran_once(marker)
        return
    with pytest.raises(ConfigurationError) as refused:
        send(road, path, kind, marker, priority=5)
    text = str(refused.value)
    assert f"road.{_refused_task(path)}.{kind}" in text
    assert repr(queue) in text and "drop the priority" in text.lower()
    assert road.rows(marker) == []
    assert road.rows(f"{marker}/first") == [] and road.rows(f"{marker}/fails") == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_a_call_the_function_cannot_take_is_refused_at_the_call(
    road: Road, path: str, kind: str
) -> None:
    marker = f"short-{path}-{kind}-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TypeError) as refused:
        send(road, path, kind, marker, short=True)
    text = str(refused.value)
    assert f"road.{_refused_task(path, short=True)}.{kind}" in text
    assert "missing" in text and "nothing was enqueued" in text
    assert road.rows(marker) == []


def _refused_task(path: str, *, short: bool = False) -> str:
    """The task the refusal names: the first message of the path that cannot be built."""
    if path == "errback":
        return "errback" if short else "fail"
    if path == "workflow_step":
        return "record"
    return {"retry": "flaky", "replay": "gate"}.get(path, "record")
