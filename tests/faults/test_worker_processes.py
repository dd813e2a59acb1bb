"""Fault scenarios on worker processes: a kill -9 storm (1) and poison messages (7)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults import tasks
from tests.faults.conftest import SCALE, scaled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]

PROCESSES = 4


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _replaced(children: set[int], killed: set[int]) -> set[int]:
    """``children`` if all PROCESSES of them are new (none of ``killed``), else empty."""
    return children if len(children) == PROCESSES and not children & killed else set()


def test_child_kill_storm_loses_nothing_and_duplicates_no_effect(scenario_factory):
    scenario = scenario_factory("child_kill_storm")
    worker = scenario.start_worker(PROCESSES)
    worker.wait_consuming(PROCESSES, timeout_s=60)
    work = scenario.task(tasks.work)
    for duration_ms in scenario.durations_ms(scaled(1000), 10, 200):
        scenario.delay(work, duration_ms)

    # One random child killed every 250 ms for 30 s...
    storm_ends_at = time.monotonic() + 30 * SCALE
    while time.monotonic() < storm_ends_at:
        time.sleep(0.25)  # the storm's pace, not a wait for a condition
        children = sorted(worker.children())
        if children:
            victim = scenario.rng.choice(children)
            if _kill(victim):
                scenario.schedule.add(f"kill child {victim}")
    # ...then every child at once, three times, each time once 4 new ones are back.
    killed: set[int] = set()
    for _ in range(3):
        fresh = wait_until(
            lambda: _replaced(worker.children(), killed),
            timeout_s=60, message=lambda: f"{PROCESSES} children; log:\n{worker.log()[-3000:]}",
        )
        killed.update(pid for pid in sorted(fresh) if _kill(pid))
        scenario.schedule.add(f"kill all children {'/'.join(map(str, sorted(fresh)))}")

    scenario.wait_all_done(timeout_s=240)
    assert worker.process.poll() is None, "the supervisor died in the storm"
    wait_until(lambda: len(worker.children()) == PROCESSES, timeout_s=60,
               message=f"the supervisor to bring its children back to {PROCESSES}")
    # A kill charges a death to the message in hand: after max_process_deaths (3) a healthy
    # message is dead-lettered by design (it is accounted for, not lost).
    scenario.finish(other_dead_ok=True)


def test_poison_is_dead_lettered_with_its_reason_and_healthy_work_runs_once(
    scenario_factory,
):
    scenario = scenario_factory("poison")
    worker = scenario.start_worker(2)
    worker.wait_consuming(2, timeout_s=60)
    work = scenario.task(tasks.work)
    poison = {name: scenario.task(task) for name, task in tasks.POISON.items()}
    kinds: dict[str, str] = {}
    healthy = scaled(400)
    per_kind = scaled(5)
    # Poison ids spread at random among the healthy ones.
    plan = ["work"] * healthy + [name for name in poison for _ in range(per_kind)]
    scenario.rng.shuffle(plan)
    for kind in plan:
        if kind == "work":
            scenario.delay(work, scenario.rng.randint(5, 50))
        else:
            task_id = scenario.delay(poison[kind])
            assert task_id is not None
            kinds[task_id] = kind
    scenario.schedule.add(f"published {len(kinds)} poison among {healthy} healthy")

    scenario.wait_all_done(timeout_s=300)
    assert worker.process.poll() is None, "the supervisor died"
    counts = scenario.finish(expected_dead=frozenset(kinds))

    expected_reason = {
        "exits": "ProcessCrashLoop", "segfaults": "ProcessCrashLoop",
        "hangs": "TimeLimitExceeded", "raises": "LookupError",
    }
    # Bounded attempts: deaths stop at max_process_deaths (3), a hard time limit with one
    # retry runs twice, an exception without retries once.
    max_runs = {"exits": 3, "segfaults": 3, "hangs": 2, "raises": 1}
    executions = scenario.observe_executions()
    wrong = {
        task_id: (kind, counts.dead_lettered.get(task_id), executions.get(task_id, 0))
        for task_id, kind in kinds.items()
        if counts.dead_lettered.get(task_id) != expected_reason[kind]
        or not 1 <= executions.get(task_id, 0) <= max_runs[kind]
    }
    assert not wrong, f"poison with the wrong reason or attempts (kind, reason, runs): {wrong}"
    healthy_runs = [executions.get(task_id, 0) for task_id in scenario.ledger.committed
                    if task_id not in kinds]
    assert set(healthy_runs) == {1}, "every healthy task runs once"
