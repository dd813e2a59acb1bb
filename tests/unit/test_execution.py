"""execute(): one task call in, one Outcome out; no broker involved."""

from __future__ import annotations

import sys
import time

import pytest

from taskq.errors import Reject, Retry, SoftTimeLimitExceeded
from taskq.worker.execution import Failed, Rejected, Succeeded, execute
from taskq.worker.time_limits import SoftTimeLimit


def add(a: int, b: int = 0) -> int:
    return a + b


def explode() -> None:
    raise ValueError("the answer is not 42")


def test_a_returning_task_succeeds_with_its_result_and_duration() -> None:
    outcome = execute(add, [1], {"b": 2})

    assert isinstance(outcome, Succeeded)
    assert outcome.result == 3
    assert outcome.duration_s >= 0


def test_a_raising_task_fails_with_type_message_and_a_traceback_from_the_task() -> None:
    outcome = execute(explode, [], {})

    assert isinstance(outcome, Failed)
    assert (outcome.exc_type, outcome.message) == ("ValueError", "the answer is not 42")
    assert outcome.traceback.startswith("Traceback (most recent call last):")
    assert "in explode" in outcome.traceback
    assert "worker/execution.py" not in outcome.traceback  # taskq frames are left out


def test_reject_becomes_rejected_with_its_reason() -> None:
    def cancelled() -> None:
        raise Reject("the order was cancelled")

    outcome = execute(cancelled, [], {})

    assert outcome == Rejected("the order was cancelled", outcome.duration_s)


def test_a_retry_request_is_a_failure_carrying_the_request_for_the_policy() -> None:
    def again() -> None:
        raise Retry(0.5)

    outcome = execute(again, [], {})

    assert isinstance(outcome, Failed)
    assert outcome.exc_type == "Retry"
    assert isinstance(outcome.exc, Retry) and outcome.exc.delay_s == 0.5


def test_a_retry_with_a_cause_describes_the_cause_for_a_later_dead_letter() -> None:
    def again() -> None:
        try:
            raise ConnectionError("provider down")
        except ConnectionError as exc:
            raise Retry(exc=exc) from exc

    outcome = execute(again, [], {})

    assert isinstance(outcome, Failed)
    assert (outcome.exc_type, outcome.message) == ("ConnectionError", "provider down")
    assert "raise ConnectionError" in outcome.traceback
    assert isinstance(outcome.exc, Retry)


def test_sys_exit_in_task_code_is_a_failure_not_the_end_of_the_worker() -> None:
    outcome = execute(sys.exit, [3], {})

    assert isinstance(outcome, Failed)
    assert outcome.exc_type == "SystemExit"


def test_soft_time_limit_raises_inside_the_task_which_may_clean_up() -> None:
    seen = []

    def sleepy() -> None:
        try:
            time.sleep(5)
        except SoftTimeLimitExceeded:
            seen.append("caught")
            raise

    started = time.monotonic()
    outcome = execute(sleepy, [], {}, soft_time_limit_s=0.2, soft_limit=SoftTimeLimit())

    assert time.monotonic() - started < 2
    assert seen == ["caught"]
    assert isinstance(outcome, Failed)
    assert outcome.exc_type == "SoftTimeLimitExceeded"


def test_soft_time_limit_is_not_swallowed_by_except_exception() -> None:
    def careless() -> str:
        try:
            time.sleep(5)
        except Exception:  # noqa: BLE001 - exactly what careless task code does
            return "swallowed"
        return "slept"

    outcome = execute(careless, [], {}, soft_time_limit_s=0.2, soft_limit=SoftTimeLimit())

    assert isinstance(outcome, Failed)
    assert outcome.exc_type == "SoftTimeLimitExceeded"


def test_a_disarmed_soft_limit_never_fires_later() -> None:
    soft_limit = SoftTimeLimit()
    outcome = execute(add, [1], {}, soft_time_limit_s=0.1, soft_limit=soft_limit)
    time.sleep(0.2)  # past the limit: an armed timer would raise here

    assert isinstance(outcome, Succeeded)


@pytest.mark.parametrize("outcome_type", [Succeeded, Failed, Rejected])
def test_outcomes_are_frozen(outcome_type: type) -> None:
    fields = {"Succeeded": (1.0,), "Failed": ("E", "m", "tb", 1.0), "Rejected": ("r", 1.0)}
    outcome = outcome_type(*fields[outcome_type.__name__])

    with pytest.raises(AttributeError):
        outcome.duration_s = 2.0
