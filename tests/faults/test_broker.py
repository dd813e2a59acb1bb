"""Fault scenarios on the broker: kill -9 of the node (3) and a flaky network (4)."""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime

import pytest
import sqlalchemy as sa

from tests.faults import tasks
from tests.faults.chaos_proxy import ChaosProxy
from tests.faults.conftest import SCALE, done_timeout_s, scaled
from tests.faults.services import wait_s
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]

OUTAGE_S = 5.0
BLACKHOLE_S = 15.0
_LOSS_RE = re.compile(r"^(\S+ \S+) WARNING +(worker-\d+)\[\d+\] \S+: broker connection lost",
                      re.MULTILINE)
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

    scenario.wait_all_done(timeout_s=done_timeout_s(240))
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
    # Worker processes and the relay reach the broker only through the proxy. pika checks
    # for heartbeats every heartbeat + 5 s and needs one silent check interval: with 2 s a
    # silent connection is noticed within 14 s, inside the 15 s blackhole.
    worker = scenario.start_worker(
        2, broker_url=proxy.url(scenario.rabbit.url), relay=True, heartbeat_s="2"
    )
    worker.wait_consuming(2, timeout_s=60)
    producer = _Producer(scenario)
    producer.start()
    try:
        resets_until = time.monotonic() + 20 * SCALE
        while time.monotonic() < resets_until:
            wait_s(scenario.rng.uniform(2.0, 4.0))
            proxy.reset()
            scenario.schedule.add("reset all connections")
        # Processing goes on after resets: a task committed after the last one runs.
        scenario.notes["resumed_after_resets"] = _resumed(scenario, producer, "reset")
        proxy.blackhole()
        scenario.schedule.add("blackhole")
        blackhole_at = datetime.now()
        wait_s(BLACKHOLE_S)
        noticed = _losses_logged(worker.log(), since=blackhole_at)
        proxy.heal()
        scenario.schedule.add("heal")
        scenario.notes["noticed_in_blackhole"] = "/".join(sorted(noticed)) or "none"
        scenario.expect(len(noticed) >= 2, "the heartbeats of both worker processes did not "
                        f"notice the {BLACKHOLE_S:.0f}s blackhole (noticed: {sorted(noticed)})")
        # ...and after the blackhole: a task committed after the heal runs within 30 s.
        scenario.notes["resumed_after_heal"] = _resumed(scenario, producer, "heal")
        wait_s(5.0)  # a few seconds more of healthy traffic
    finally:
        producer.stop()
    # Not a count of the checker, but worth seeing: processes that died of the faults
    # (and were replaced by the supervisor) instead of reconnecting.
    log = worker.log()
    scenario.notes["io_thread_crashes"] = str(log.count("broker I/O thread failed"))
    scenario.notes["relay_deaths"] = str(log.count("outbox relay process died"))
    scenario.wait_all_done(timeout_s=done_timeout_s(240))
    scenario.finish()


class _Producer(threading.Thread):
    """Commits outbox rows all along (about 100 tasks/s; the database stays up)."""

    def __init__(self, scenario) -> None:
        super().__init__(name="producer")
        self.scenario = scenario
        self.batches: list[tuple[float, list[str]]] = []  # (monotonic commit time, ids)
        self._halt = threading.Event()  # not _stop: threading.Thread has one

    def run(self) -> None:
        while not self._halt.is_set():
            ids = self.scenario.enqueue_rows(self.scenario.durations_ms(10, 0, 20))
            self.batches.append((time.monotonic(), ids))
            self._halt.wait(0.1)  # the producers' pace

    def committed_after(self, since: float) -> list[str]:
        return [i for at, ids in list(self.batches) if at > since for i in ids]

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


def _resumed(scenario, producer: _Producer, fault: str) -> str:
    """Wait until a task committed after ``fault`` ran; return how long that took."""
    since = time.monotonic()
    took_s = scenario.expect_soon(
        lambda: _any_done(scenario, producer.committed_after(since)),
        timeout_s=RESUME_WITHIN_S,
        problem=f"processing did not resume after the {fault}",
    )
    return "never" if took_s is None else f"{took_s:.2f}s"


def _losses_logged(log: str, *, since: datetime) -> set[str]:
    """Worker processes (``worker-N``) that logged a lost connection after ``since``."""
    return {
        process for at, process in _LOSS_RE.findall(log)
        if datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f") >= since
    }


def _any_done(scenario, ids: list[str]) -> bool:
    if not ids:
        return False
    try:
        with scenario.engine.connect() as conn:
            query = sa.select(tasks.effects.c.task_id).where(
                tasks.effects.c.task_id.in_(list(ids))
            ).limit(1)
            return conn.execute(query).first() is not None
    except sa.exc.DBAPIError:
        return False
