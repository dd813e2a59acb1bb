"""The 1,000-member chord while worker processes are killed -9 and every message comes twice.

What is simulated, honestly:

- *every message delivered twice*: the workers run without a relay; the test runs the outbox
  relay itself with a publisher that publishes each batch twice (same message ids, same
  headers), which is what a relay that dies between its publish and its delete does. Every
  member and the callback therefore reach the queue twice.
- *worker processes killed -9 at random*: a thread SIGKILLs a random worker process (a
  child of the supervisor this test started) each time another 60-140 members (a random
  number) have been counted, about ten times in the run; the supervisor replaces it, and
  the broker redelivers what it held.

The callback is ``transactional=True``: its effect row commits with its idempotency key, so
exactly one row means it ran to completion once; it gets the list of all 1,000 results.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App, chord, group
from taskq.broker.publisher import Publisher
from taskq.broker.topology import dlq_name
from taskq.message import WireMessage
from taskq.schema import workflow_members_table
from taskq.workflows import MemberState, WorkflowState
from tests import tasks_workflows as wt
from tests.support.waiting import wait_until
from tests.system.test_workflows import APP_PATH, bound, count
from tests.system.workers import Worker, count_runs

pytestmark = pytest.mark.slow

MEMBERS = 1000
PROCESSES = 2


@pytest.fixture
def app(make_app: Callable[..., App], postgres_url: str) -> App:
    """The test's App on PostgreSQL, with an empty ``wf_effects``."""
    engine = sa.create_engine(postgres_url)
    wt.effects.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(wt.effects.delete())
    engine.dispose()
    return make_app(database_url=postgres_url)


class TwicePublisher:
    """Publishes every batch the relay hands it twice (see the module docstring)."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self.published = 0

    def publish_many(self, items: Iterable[tuple[str, str, WireMessage]]) -> None:
        batch = list(items)
        self._publisher.publish_many(batch)
        self._publisher.publish_many(batch)
        self.published += 2 * len(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._publisher, name)


class Killer(threading.Thread):
    """SIGKILLs a random worker process each time 60-140 more members have been counted.

    Kills paced by progress, not by the clock: on a loaded machine a replaced process needs
    a second or more to boot, and kills on a fixed beat would then stop all progress.
    """

    def __init__(self, worker: Worker, counted: Callable[[], int], seed: int) -> None:
        super().__init__(daemon=True)
        self._worker = worker
        self._counted = counted
        self._rng = random.Random(seed)
        self.stop = threading.Event()
        self.killed: list[int] = []

    def run(self) -> None:
        next_at = self._rng.randint(60, 140)
        while not self.stop.wait(0.05):
            if self._counted() < next_at:
                continue
            children = sorted(self._worker.children())
            if not children:
                continue
            pid = self._rng.choice(children)
            try:
                os.kill(pid, signal.SIGKILL)  # a child of the supervisor this test started
            except ProcessLookupError:
                continue
            self.killed.append(pid)
            next_at += self._rng.randint(60, 140)


def test_chord_of_1000_under_kills_and_double_delivery_calls_back_exactly_once(
    app: App, start_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    square, total_once = bound(app, wt.square), bound(app, wt.total_once)
    # Given workers that a kill does not make dead-letter a healthy member (a kill charges a
    # death to the message in hand), and a relay that publishes everything twice
    worker = start_worker("-c", str(PROCESSES), "--no-relay", app_path=APP_PATH,
                          loglevel="INFO", env={"TASKQ_MAX_PROCESS_DEATHS": "1000"})
    worker.wait_consuming(PROCESSES)
    twice = TwicePublisher(Publisher(app.settings, app.topology, client_name="twice relay"))
    relay = app.relay(publisher=twice)  # type: ignore[arg-type]
    relay_stop = threading.Event()
    relay_thread = threading.Thread(target=relay.run, args=(relay_stop.is_set,), daemon=True)
    relay_thread.start()
    seed = random.randrange(1 << 30)
    killer = Killer(worker, lambda: count(
        app, workflow_members_table,
        workflow_members_table.c.state == MemberState.SUCCESS.value), seed)
    try:
        # When the chord runs while processes are killed
        killer.start()
        result = chord(group(square.s(i) for i in range(MEMBERS)),
                       total_once.s(runs)).apply_async()
        wait_until(lambda: count(app, wt.effects) >= 1, timeout_s=90, interval_s=0.1,
                   message=lambda: f"the callback's effect (seed {seed}, {len(killer.killed)} "
                   f"kills); log:\n{worker.log()[-4000:]}")
        killer.stop.set()
        killer.join(5)
        expected = sum(i * i for i in range(MEMBERS))
        assert result.get(timeout_s=30) == expected
        # every copy handled: nothing left in the queue, nothing dead-lettered
        wait_until(lambda: broker.depth(app.settings.default_queue) == 0, timeout_s=60,
                   message=lambda: f"an empty queue; log:\n{worker.log()[-3000:]}")
    finally:
        killer.stop.set()
        relay_stop.set()
        relay_thread.join(10)
        twice._publisher.close()

    # Then the callback ran to completion once, with every result
    with app.engine.connect() as conn:
        effects = [tuple(row) for row in conn.execute(
            sa.select(wt.effects.c.count, wt.effects.c.total))]
    assert effects == [(MEMBERS, expected)], f"seed {seed}"
    assert result.state is WorkflowState.SUCCESS
    record = result.record()
    assert record is not None and record.remaining == 0
    assert count(app, workflow_members_table,
                 workflow_members_table.c.state == MemberState.SUCCESS.value) == MEMBERS + 1
    assert broker.depth(dlq_name(app.settings.default_queue)) == 0
    # and the faults really happened: kills during the run, two copies of every message
    assert len(killer.killed) >= 3, f"only {len(killer.killed)} kills (seed {seed})"
    assert twice.published >= 2 * (MEMBERS + 1)
    assert count_runs(runs, "callback") >= 1
    print(f"chord of {MEMBERS}: {len(killer.killed)} kills, {twice.published} messages "
          f"published, callback attempts {count_runs(runs, 'callback')}, effect rows "
          f"{len(effects)} (seed {seed})")
