"""Fault scenarios on worker processes: a kill -9 storm (1) and poison messages (7)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.faults import tasks
from tests.faults.conftest import SCALE, done_timeout_s, scaled
from tests.support.processes import kill_process
from tests.support.waiting import wait_until
from tests.system.workers import Worker

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]

PROCESSES = 4


def _kill(worker: Worker, pid: int) -> bool:
    """SIGKILL ``pid`` if it is still a child of ``worker``'s supervisor.

    A child may have exited since it was listed, and its PID been given to a process of
    another test run: that one is never signalled.
    """
    return kill_process(pid, parent=worker.pid)


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
            if _kill(worker, victim):
                scenario.schedule.add(f"kill child {victim}")
    # ...then every child at once, three times, each time once 4 new ones are back.
    killed: set[int] = set()
    for _ in range(3):
        fresh = wait_until(
            lambda: _replaced(worker.children(), killed),
            timeout_s=60, message=lambda: f"{PROCESSES} children; log:\n{worker.log()[-3000:]}",
        )
        killed.update(pid for pid in sorted(fresh) if _kill(worker, pid))
        scenario.schedule.add(f"kill all children {'/'.join(map(str, sorted(fresh)))}")

    scenario.wait_all_done(timeout_s=done_timeout_s(240))
    scenario.expect(worker.process.poll() is None, "the supervisor died in the storm")
    scenario.expect_soon(lambda: len(worker.children()) == PROCESSES, timeout_s=60,
                         problem=f"the supervisor did not bring its children back to "
                                 f"{PROCESSES}")
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

    scenario.wait_all_done(timeout_s=done_timeout_s(180))
    scenario.expect(worker.process.poll() is None, "the supervisor died")
    scenario.finish(expected_dead=frozenset(kinds),
                    check_more=lambda counts, observed: _poison_problems(kinds, observed))


# Bounded attempts: deaths stop at max_process_deaths (3), a hard time limit with one retry
# runs twice, an exception without retries once.
POISON_REASONS = {
    "exits": ("ProcessCrashLoop", 3), "segfaults": ("ProcessCrashLoop", 3),
    "hangs": ("TimeLimitExceeded", 2), "raises": ("LookupError", 1),
}


def _poison_problems(kinds: dict[str, str], observed) -> list[str]:
    problems = []
    wrong = {
        task_id: (kind, observed.dead_letters.get(task_id), observed.executions[task_id])
        for task_id, kind in kinds.items()
        if observed.dead_letters.get(task_id) != POISON_REASONS[kind][0]
        or not 1 <= observed.executions[task_id] <= POISON_REASONS[kind][1]
    }
    if wrong:
        problems.append(f"poison with the wrong reason or runs (kind, reason, runs): {wrong}")
    healthy_runs = Counter(runs for task_id, runs in observed.executions.items()
                           if task_id not in kinds)
    if set(healthy_runs) - {1}:
        problems.append(f"healthy tasks ran more than once: runs histogram {healthy_runs}")
    return problems
