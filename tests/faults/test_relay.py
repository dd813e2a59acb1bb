"""Fault scenarios on the outbox: a relay kill -9 storm (2) and the transaction boundary (8)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.faults.conftest import SCALE, done_timeout_s, scaled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]

ROWS_PER_TRANSACTION = 250
MIN_LANDED_KILLS = 5
# The storm lasts 20 s and then goes on until MIN_LANDED_KILLS kills landed, up to this long:
# under load a relay takes 7-12 s to start, so a fixed 20 s window held 3-4 kills.
STORM_DEADLINE_S = 180
# Rows waiting when each relay of the storm starts: a relay here publishes 3,000-5,000
# rows/s, so a smaller backlog is gone before the kill lands.
BACKLOG_ROWS = 5000


def _start_relay(scenario):
    relay = scenario.start_relay()
    wait_until(lambda: "outbox relay started" in relay.log(), timeout_s=60,
               message=lambda: f"the relay to start; log:\n{relay.log()}")
    return relay


def _top_up(scenario, rows: int) -> None:
    waiting = scenario.outbox_rows() or 0
    while waiting < rows:
        batch = min(ROWS_PER_TRANSACTION, rows - waiting)
        scenario.enqueue_rows([0] * batch)
        waiting += batch


def test_relay_kill_storm_publishes_every_committed_row(scenario_factory):
    scenario = scenario_factory("relay_kill_storm")
    _top_up(scenario, scaled(BACKLOG_ROWS))
    worker = scenario.start_worker(2)
    worker.wait_consuming(2, timeout_s=60)

    landed = 0
    needed = scaled(MIN_LANDED_KILLS)
    started = time.monotonic()
    storm_ends_at = started + 20 * SCALE
    deadline = started + STORM_DEADLINE_S * max(SCALE, 1.0)
    while time.monotonic() < storm_ends_at or (landed < needed and time.monotonic() < deadline):
        # Producers keep committing while relays die: each relay finds a backlog waiting.
        _top_up(scenario, scaled(BACKLOG_ROWS))
        relay = _start_relay(scenario)
        time.sleep(scenario.rng.uniform(0.2, 0.8))  # the kill lands 0.2-0.8 s into the flush
        pending = scenario.outbox_rows()
        relay.process.kill()  # our child, not reaped yet: its PID is still its own
        relay.process.wait(30)
        scenario.schedule.add(f"kill relay {relay.pid} ({pending} rows waiting)")
        landed += bool(pending)
    scenario.start_relay()
    scenario.schedule.add("one relay undisturbed")
    scenario.expect(
        landed >= needed,
        f"only {landed} relay kills landed while rows were waiting in "
        f"{time.monotonic() - started:.0f} s: the storm proved nothing",
    )
    scenario.notes["kills_landed"] = str(landed)

    scenario.wait_all_done(timeout_s=done_timeout_s(300))
    scenario.expect(scenario.outbox_rows() == 0, "rows left in the outbox")
    scenario.finish()


def test_rolled_back_tasks_never_run_and_committed_ones_are_never_skipped(scenario_factory):
    scenario = scenario_factory("transaction_boundary")
    worker = scenario.start_worker(2, relay=True)
    worker.wait_consuming(2, timeout_s=60)

    def producer(index: int, transactions: int) -> None:
        rng = random.Random(scenario.schedule.seed * 10 + index)  # replayable per producer
        for _ in range(transactions):
            commit = rng.random() < 0.5
            # One in five transactions is held open for seconds: rows committed late must
            # still be relayed, however many younger rows went before them.
            hold_s = rng.uniform(1.0, 4.0) if rng.random() < 0.2 else 0.0
            durations_ms = [rng.randint(0, 20) for _ in range(rng.randint(1, 10))]
            scenario.enqueue_rows(durations_ms, commit=commit, hold_s=hold_s)

    threads = [threading.Thread(target=producer, args=(i, scaled(40))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads), "producers did not finish"
    scenario.schedule.add(
        f"{len(scenario.ledger.committed)} committed, {len(scenario.ledger.rolled_back)} "
        "rolled back, in 4 interleaved producers"
    )

    scenario.wait_all_done(timeout_s=done_timeout_s(180))
    scenario.finish()
    assert scenario.ledger.rolled_back, "no transaction rolled back: nothing was tested"
