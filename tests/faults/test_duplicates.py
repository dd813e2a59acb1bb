"""Fault scenario: every message delivered twice (6)."""

from __future__ import annotations

import pytest

from tests.faults import tasks
from tests.faults.conftest import done_timeout_s, scaled

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]


def test_every_message_twice_has_its_effect_once(scenario_factory):
    scenario = scenario_factory("duplicates")
    # Prefetch 1 over 4 processes: two copies published back to back go to two processes
    # at the same moment, not one after the other through one process's buffer.
    worker = scenario.start_worker(4, "--prefetch", "1")
    worker.wait_consuming(4, timeout_s=60)
    work = scenario.task(tasks.work)
    count = scaled(500)

    # Back to back: both copies of each message published one after the other.
    scenario.publish_copies(work, [(d,) for d in scenario.durations_ms(count, 5, 50)], 2)
    scenario.schedule.add(f"{count} messages published twice back to back")

    # In sequence: a message runs, then its copy arrives.
    calls = {}
    for duration_ms in scenario.durations_ms(count, 0, 10):
        task_id = scenario.delay(work, duration_ms)
        assert task_id is not None
        calls[task_id] = (duration_ms,)
    scenario.wait_all_done(timeout_s=done_timeout_s(240))
    scenario.republish(work, calls)
    scenario.schedule.add(f"{count} messages published again after they ran")
    scenario.expect_soon(lambda: scenario.queue_depth() == 0, timeout_s=120,
                         problem="the second copies were not consumed")
    scenario.wait_all_done(timeout_s=done_timeout_s(60))
    scenario.notes["copies_skipped_as_duplicates"] = str(worker.log().count("is a duplicate"))
    scenario.finish()
