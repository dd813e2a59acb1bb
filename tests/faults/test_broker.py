"""Fault scenarios on the broker: kill -9 of the node (3) and a flaky network (4)."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from tests.faults import tasks
from tests.faults.chaos_proxy import ChaosProxy
from tests.faults.conftest import SCALE, scaled
from tests.faults.services import wait_s
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]

OUTAGE_S = 5.0
RESUME_WITHIN_S = 30.0


def test_broker_killed_mid_publish_and_mid_consume_loses_nothing(
    scenario_factory, private_rabbit
):
    scenario = scenario_factory("broker_kill")
    worker = scenario.start_worker(2)
    worker.wait_consuming(2, timeout_s=60)
    work = scenario.task(tasks.work)
    durations_ms = scenario.durations_ms(scaled(1000), 10, 50)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for duration_ms in durations_ms:
                scenario.delay_until_confirmed(work, duration_ms)
        except BaseException as exc:  # re-raised by the test below
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    # Mid-publish: a third of the tasks confirmed, the producer still publishing.
    wait_until(lambda: len(scenario.ledger.committed) >= len(durations_ms) // 3, timeout_s=60)
    _outage(scenario, private_rabbit, "mid-publish")
    producer.join(180)
    assert not producer.is_alive() and not errors, f"producer: {errors}"

    # Mid-consume: some of the work done, most of it still queued or in hand.
    wait_until(lambda: scenario.completed_count() >= len(durations_ms) * 0.4, timeout_s=120)
    _outage(scenario, private_rabbit, "mid-consume")

    scenario.wait_all_done(timeout_s=240)
    scenario.finish()


def _outage(scenario, rabbit, moment: str) -> None:
    pid = rabbit.kill()
    scenario.schedule.add(f"kill -9 broker {pid} {moment}")
    wait_s(OUTAGE_S)
    rabbit.start()
    scenario.schedule.add("broker restarted")


def test_resets_and_a_blackhole_then_processing_resumes(scenario_factory, private_rabbit):
    scenario = scenario_factory("network_faults")
    proxy = ChaosProxy("127.0.0.1", private_rabbit.port)
    proxy.start()
    try:
        _run_network_faults(scenario, proxy)
    finally:
        proxy.stop()


def _run_network_faults(scenario, proxy: ChaosProxy) -> None:
    # Worker processes and the relay reach the broker only through the proxy; a 5 s
    # heartbeat lets a silent connection be noticed within the blackhole.
    worker = scenario.start_worker(
        2, broker_url=proxy.url(scenario.rabbit.url), relay=True, heartbeat_s="5"
    )
    worker.wait_consuming(2, timeout_s=60)
    stop = threading.Event()
    after_heal: list[str] = []
    healed = threading.Event()

    def produce() -> None:  # outbox rows committed all along (the database stays up)
        while not stop.is_set():
            ids = scenario.enqueue_rows(scenario.durations_ms(10, 0, 20))
            if healed.is_set():
                after_heal.extend(ids)
            stop.wait(0.1)  # the producers' pace: about 100 tasks/s

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        resets_until = time.monotonic() + 20 * SCALE
        while time.monotonic() < resets_until:
            wait_s(scenario.rng.uniform(2.0, 4.0))
            proxy.reset()
            scenario.schedule.add("reset all connections")
        proxy.blackhole()
        scenario.schedule.add("blackhole")
        wait_s(15.0)
        proxy.heal()
        scenario.schedule.add("heal")
        healed_at = time.monotonic()
        healed.set()
        # Processing resumes: a task committed after the heal runs within 30 s of it.
        wait_until(lambda: after_heal and _any_done(scenario, after_heal),
                   timeout_s=RESUME_WITHIN_S,
                   message=lambda: f"a task committed after the heal to run; log tail:\n"
                                   f"{worker.log()[-4000:]}")
        resumed_s = time.monotonic() - healed_at
        wait_s(5.0)  # a few seconds more of healthy traffic
    finally:
        stop.set()
        producer.join(60)
    scenario.notes["resumed_after_heal"] = f"{resumed_s:.2f}s"
    # Not a count of the checker, but worth seeing: processes that died of the faults
    # (and were replaced by the supervisor) instead of reconnecting.
    log = worker.log()
    scenario.notes["io_thread_crashes"] = str(log.count("broker I/O thread failed"))
    scenario.notes["relay_deaths"] = str(log.count("outbox relay process died"))
    scenario.wait_all_done(timeout_s=240)
    scenario.finish()


def _any_done(scenario, ids: list[str]) -> bool:
    try:
        with scenario.engine.connect() as conn:
            query = sa.select(tasks.effects.c.task_id).where(
                tasks.effects.c.task_id.in_(list(ids))
            ).limit(1)
            return conn.execute(query).first() is not None
    except sa.exc.DBAPIError:
        return False
