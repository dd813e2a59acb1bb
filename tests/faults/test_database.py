"""Fault scenario on taskq's own database: PostgreSQL stopped ``-m immediate`` (5)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from tests.faults.conftest import done_timeout_s, scaled
from tests.faults.services import wait_s
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]

DOWN_S = 20.0
ROWS_PER_TRANSACTION = 10


def test_postgres_outage_dead_letters_nothing_and_loses_nothing(
    scenario_factory, private_postgres
):
    scenario = scenario_factory("postgres_outage")
    worker = scenario.start_worker(2, relay=True)
    worker.wait_consuming(2, timeout_s=60)
    total = scaled(1000)
    database_up = threading.Event()
    database_up.set()

    def produce() -> None:  # 200 rows/s while the relay flushes and the workers run
        committed = 0
        while committed < total:
            database_up.wait(120)
            durations_ms = scenario.durations_ms(ROWS_PER_TRANSACTION, 20, 100)
            try:
                scenario.enqueue_rows(durations_ms)
                committed += len(durations_ms)
            except sa.exc.DBAPIError:
                pass  # the outage: this transaction failed (a failed COMMIT is in doubt)
            wait_s(0.05)

    producer = threading.Thread(target=produce)
    producer.start()
    # Stop the database while rows wait in the outbox and tasks are in their transactions.
    wait_until(lambda: scenario.completed_count() >= 20 and (scenario.outbox_rows() or 0) > 0,
               timeout_s=120, message="tasks running and rows waiting in the outbox")
    database_up.clear()
    private_postgres.stop_immediate()
    scenario.schedule.add("pg_ctl stop -m immediate")
    wait_s(DOWN_S)
    private_postgres.start()
    scenario.schedule.add("postgres started")
    database_up.set()
    producer.join(300)
    assert not producer.is_alive(), "the producer did not finish"

    scenario.wait_all_done(timeout_s=done_timeout_s(300))
    scenario.finish()
