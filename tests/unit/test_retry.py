"""Retry policies: backoff maths, jitter bounds, which failures retry, option precedence."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from taskq import App, ConfigurationError, Retry, TimeLimitExceeded
from taskq.request import Request, current_request
from taskq.retry import (
    GiveUp,
    RetryLater,
    RetryOverrides,
    RetryPolicy,
    backoff_s,
    decide,
    resolve_policy,
)
from taskq.settings import Settings


class Transient(Exception):
    pass


class Permanent(Transient):
    pass


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    policy = RetryPolicy(retry_backoff_s=0.5, retry_backoff_max_s=5.0, retry_jitter=False)

    assert [backoff_s(policy, n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff_s(policy, 10_000) == 5.0  # no overflow for absurd counts


def test_jitter_stays_between_half_the_backoff_and_the_backoff() -> None:
    policy = RetryPolicy(retry_backoff_s=1.0, retry_backoff_max_s=600.0, retry_jitter=True)
    rng = random.Random(7)

    for retries in range(8):
        full = min(600.0, 2.0**retries)
        samples = [backoff_s(policy, retries, rng=rng) for _ in range(200)]
        assert all(full / 2 <= s <= full for s in samples)
        assert max(samples) - min(samples) > full / 4  # it really spreads


def test_by_default_a_raising_task_is_not_retried() -> None:
    decision = decide(RetryPolicy(), ValueError("no"), 0)

    assert decision == GiveUp("ValueError is not in autoretry_for")


def test_autoretry_for_retries_subclasses_until_max_retries() -> None:
    policy = RetryPolicy(max_retries=2, autoretry_for=(Transient,), retry_jitter=False)

    assert decide(policy, Permanent("x"), 0) == RetryLater(1.0)
    assert decide(policy, Transient("x"), 1) == RetryLater(2.0)
    assert decide(policy, Transient("x"), 2) == GiveUp("max_retries=2 reached")


def test_dont_autoretry_for_wins_over_autoretry_for() -> None:
    policy = RetryPolicy(autoretry_for=(Exception,), dont_autoretry_for=(Permanent,))

    assert isinstance(decide(policy, Transient("x"), 0), RetryLater)
    assert decide(policy, Permanent("x"), 0) == GiveUp("Permanent is in dont_autoretry_for")


def test_an_explicit_retry_ignores_autoretry_for_but_not_max_retries() -> None:
    policy = RetryPolicy(max_retries=1, dont_autoretry_for=(Exception,))

    assert decide(policy, Retry(0.2), 0) == RetryLater(0.2)
    assert decide(policy, Retry(0.2), 1) == GiveUp("max_retries=1 reached")
    assert decide(policy, Retry(), 0, rng=random.Random(1)).delay_s <= 1.0  # type: ignore[union-attr]


def test_a_time_limit_kill_retries_by_default_unless_excluded() -> None:
    kill = TimeLimitExceeded("killed")

    assert isinstance(decide(RetryPolicy(), kill, 0), RetryLater)
    assert isinstance(decide(RetryPolicy(max_retries=0), kill, 0), GiveUp)
    assert isinstance(decide(RetryPolicy(dont_autoretry_for=(TimeLimitExceeded,)), kill, 0), GiveUp)


def test_options_resolve_call_over_task_over_app() -> None:
    settings = Settings.load(
        {"task_max_retries": 7, "task_retry_backoff_s": 2.0}, environ={}
    )
    app_level = RetryPolicy.from_settings(settings)
    task_level = RetryOverrides(max_retries=5, retry_jitter=False, autoretry_for=(OSError,))
    call_level = RetryOverrides(max_retries=9)

    assert app_level.max_retries == 7 and app_level.retry_backoff_s == 2.0
    task_policy = resolve_policy(app_level, task_level)
    assert (task_policy.max_retries, task_policy.retry_backoff_s) == (5, 2.0)
    assert (task_policy.retry_jitter, task_policy.autoretry_for) == (False, (OSError,))
    assert resolve_policy(app_level, task_level, call_level).max_retries == 9
    assert resolve_policy(app_level, None, RetryOverrides()) == app_level


def test_app_defaults_come_from_the_environment() -> None:
    settings = Settings.load(
        environ={"TASKQ_TASK_MAX_RETRIES": "0", "TASKQ_TASK_RETRY_JITTER": "false"}
    )

    policy = RetryPolicy.from_settings(settings)

    assert (policy.max_retries, policy.retry_jitter) == (0, False)


def test_task_options_use_the_issue_spellings_and_resolve_per_task() -> None:
    app = App("shop", task_max_retries=1)

    @app.task(max_retries=4, retry_backoff=0.1, retry_backoff_max=0.3, autoretry_for=(KeyError,))
    def flaky() -> None:
        return None

    policy = resolve_policy(
        RetryPolicy.from_settings(app.settings), flaky.options.retry_overrides()
    )
    assert (policy.max_retries, policy.retry_backoff_s, policy.retry_backoff_max_s) == (
        4, 0.1, 0.3
    )
    assert policy.autoretry_for == (KeyError,)


@pytest.mark.parametrize(
    "options",
    [
        {"max_retries": -1},
        {"max_retries": 1.5},
        {"retry_backoff": -1},
        {"retry_backoff": True},
        {"retry_backoff_max": float("inf")},
        {"retry_jitter": "yes"},
        {"autoretry_for": ("ValueError",)},
        {"dont_autoretry_for": (int,)},
    ],
)
def test_invalid_retry_options_fail_at_registration(options: dict[str, object]) -> None:
    app = App("shop")

    with pytest.raises(ConfigurationError):

        @app.task(**options)
        def noop() -> None:
            return None


def test_a_bound_task_gets_itself_and_an_empty_request_outside_a_worker() -> None:
    app = App("shop")

    @app.task(bind=True, name="shop.whoami")
    def whoami(self, x: int) -> tuple[str, int, int]:
        return self.request.task_id, self.request.retries, x

    assert whoami(5) == ("", 0, 5)


def test_request_is_the_current_delivery_of_this_task() -> None:
    app = App("shop")

    @app.task(bind=True, name="shop.attempt")
    def attempt(self) -> int:
        return self.request.retries

    token = current_request.set(Request("id-9", "shop.attempt", retries=2, queue="q"))
    try:
        assert attempt() == 2
        assert attempt.request.task_id == "id-9"
    finally:
        current_request.reset(token)


def test_self_retry_raises_retry_with_countdown_cause_and_max_retries() -> None:
    app = App("shop")

    @app.task(bind=True, name="shop.call")
    def call(self) -> None:
        try:
            raise ConnectionError("provider down")
        except ConnectionError:
            raise self.retry(countdown=timedelta(seconds=0.2), max_retries=5) from None

    with pytest.raises(Retry) as caught:
        call()

    assert caught.value.delay_s == 0.2 and caught.value.max_retries == 5
    assert isinstance(caught.value.exc, ConnectionError)  # the exception being handled


def test_self_retry_rejects_a_negative_countdown() -> None:
    app = App("shop")

    @app.task(bind=True, name="shop.neg")
    def neg(self) -> None:
        raise self.retry(countdown=-1)

    with pytest.raises(ConfigurationError, match="countdown"):
        neg()
