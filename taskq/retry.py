"""Retry policies: *whether* and *when* a failed task runs again (pure, no I/O).

:mod:`taskq.delay` decides *how* a message waits; this module only decides. The worker asks
:func:`decide` after every failed attempt and performs what it answers: :class:`RetryLater`
(publish a copy with ``taskq-retries + 1`` through the delay backend, confirmed, then ack the
original) or :class:`GiveUp` (dead-letter to ``Q.dlq``).

Which failures are retried (Celery's rules, opt-in):

1. the task raised :class:`~taskq.errors.Retry` (``raise self.retry(...)``): always, while
   retries are left -- an explicit request is not filtered by ``autoretry_for``;
2. the exception is an instance of ``dont_autoretry_for``: never (it wins over 3 and 4);
3. the worker killed the task at its hard time limit (:class:`~taskq.errors.TimeLimitExceeded`):
   retried while retries are left, like the broker re-runs a task whose process died;
4. the exception is an instance of ``autoretry_for``: retried while retries are left;
5. anything else: never -- a task that raises is dead-lettered at once unless it opted in.

Backoff: retry ``n`` (``retries == n``, 0-based) waits ``retry_backoff_s * 2**n`` seconds,
capped at ``retry_backoff_max_s``; with ``retry_jitter`` the wait is drawn uniformly from
``[delay / 2, delay]`` ("equal jitter"): retries of tasks that failed together spread out,
and none comes back sooner than half its backoff. A delay the task asked for
(``self.retry(countdown=...)``) is used as it is, without jitter.

Precedence of every option, lowest first: app settings (``task_max_retries``...), the task's
``@app.task(...)`` options, the call (``self.retry(max_retries=...)``); :func:`resolve_policy`
is the one place that applies it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, cast

from taskq.errors import ConfigurationError, Retry, TimeLimitExceeded
from taskq.settings import Settings

ExceptionTypes = tuple[type[BaseException], ...]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how late a failing task is retried.

    Args:
        max_retries: Retries after the first run (so at most ``max_retries + 1`` runs);
            0 turns retries off.
        retry_backoff_s: Exponential base in seconds: retry ``n`` waits ``base * 2**n``.
        retry_backoff_max_s: Upper bound of one backoff delay, in seconds.
        retry_jitter: Draw each delay from ``[delay / 2, delay]``.
        autoretry_for: Exception types that are retried automatically.
        dont_autoretry_for: Exception types never retried automatically (wins).
    """

    max_retries: int = 3
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 600.0
    retry_jitter: bool = True
    autoretry_for: ExceptionTypes = ()
    dont_autoretry_for: ExceptionTypes = ()

    def __post_init__(self) -> None:
        _check_count("max_retries", self.max_retries)
        _check_seconds("retry_backoff", self.retry_backoff_s)
        _check_seconds("retry_backoff_max", self.retry_backoff_max_s)
        if not isinstance(self.retry_jitter, bool):
            raise ConfigurationError(
                f"retry_jitter must be True or False, not {self.retry_jitter!r}"
            )
        # Frozen: normalise a single class or a list to a tuple in place.
        for name in ("autoretry_for", "dont_autoretry_for"):
            object.__setattr__(self, name, _exception_types(name, getattr(self, name)))

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """The app-level defaults (settings ``task_max_retries``, ``task_retry_*``)."""
        return cls(
            max_retries=settings.task_max_retries,
            retry_backoff_s=settings.task_retry_backoff_s,
            retry_backoff_max_s=settings.task_retry_backoff_max_s,
            retry_jitter=settings.task_retry_jitter,
        )


@dataclass(frozen=True)
class RetryOverrides:
    """Retry options given on a task or a call; ``None`` (or empty) inherits.

    The names are the ones ``@app.task(...)`` accepts; ``retry_backoff`` and
    ``retry_backoff_max`` are seconds.

    Args:
        max_retries: Overrides :attr:`RetryPolicy.max_retries`.
        retry_backoff: Overrides :attr:`RetryPolicy.retry_backoff_s` (seconds).
        retry_backoff_max: Overrides :attr:`RetryPolicy.retry_backoff_max_s` (seconds).
        retry_jitter: Overrides :attr:`RetryPolicy.retry_jitter`.
        autoretry_for: Replaces :attr:`RetryPolicy.autoretry_for` when not empty.
        dont_autoretry_for: Replaces :attr:`RetryPolicy.dont_autoretry_for` when not empty.

    Raises:
        ConfigurationError: a value of the wrong type or range (when built).
    """

    max_retries: int | None = None
    retry_backoff: float | None = None
    retry_backoff_max: float | None = None
    retry_jitter: bool | None = None
    autoretry_for: ExceptionTypes = ()
    dont_autoretry_for: ExceptionTypes = ()

    def __post_init__(self) -> None:
        # Validate now (at @app.task time), not when the first task fails in a worker.
        RetryPolicy(**_policy_changes(self))


@dataclass(frozen=True, slots=True)
class RetryLater:
    """Retry after ``delay_s`` seconds."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Do not retry; ``reason`` says why (for logs), e.g. ``max_retries=3 reached``."""

    reason: str


Decision = RetryLater | GiveUp

_FIELD_NAMES = {
    "max_retries": "max_retries",
    "retry_backoff": "retry_backoff_s",
    "retry_backoff_max": "retry_backoff_max_s",
    "retry_jitter": "retry_jitter",
    "autoretry_for": "autoretry_for",
    "dont_autoretry_for": "dont_autoretry_for",
}


def resolve_policy(base: RetryPolicy, *overrides: RetryOverrides | None) -> RetryPolicy:
    """Apply ``overrides`` to ``base`` in order: later ones win (call > task > app).

    Args:
        base: Usually :meth:`RetryPolicy.from_settings` (the app level).
        *overrides: The task's options, then the call's; ``None`` entries are skipped.

    Returns:
        The effective policy.
    """
    policy = base
    for layer in overrides:
        if layer is not None:
            changes = _policy_changes(layer)
            if changes:
                policy = replace(policy, **changes)
    return policy


def decide(
    policy: RetryPolicy,
    exc: BaseException,
    retries: int,
    *,
    explicit_delay_s: float | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """Decide what follows a failed attempt (see the module docstring for the rules).

    Args:
        policy: The effective policy (:func:`resolve_policy`).
        exc: What the attempt raised (a :class:`~taskq.errors.Retry`, or a
            :class:`~taskq.errors.TimeLimitExceeded` for a hard time-limit kill).
        retries: Retries already done: the failed attempt's ``taskq-retries``.
        explicit_delay_s: A delay the task asked for; used as it is. ``None`` takes the
            ``delay_s`` of a ``Retry``, else the policy's backoff.
        rng: Source of jitter (tests pass a seeded one).

    Returns:
        :class:`RetryLater` or :class:`GiveUp`.
    """
    if not isinstance(exc, Retry):
        if isinstance(exc, policy.dont_autoretry_for):
            return GiveUp(f"{type(exc).__name__} is in dont_autoretry_for")
        if not isinstance(exc, (TimeLimitExceeded, *policy.autoretry_for)):
            return GiveUp(f"{type(exc).__name__} is not in autoretry_for")
    elif explicit_delay_s is None:
        explicit_delay_s = exc.delay_s
    if retries >= policy.max_retries:
        return GiveUp(f"max_retries={policy.max_retries} reached")
    if explicit_delay_s is not None:
        return RetryLater(max(0.0, float(explicit_delay_s)))
    return RetryLater(backoff_s(policy, retries, rng=rng))


def backoff_s(policy: RetryPolicy, retries: int, *, rng: random.Random | None = None) -> float:
    """Seconds before retry number ``retries`` (0-based), with jitter when the policy says so.

    ``retry_backoff_s * 2**retries``, capped at ``retry_backoff_max_s``; with jitter a value
    drawn uniformly from ``[delay / 2, delay]``.
    """
    # min() on the exponent first: 2**retries of a large count would be a huge float.
    delay = min(policy.retry_backoff_max_s, policy.retry_backoff_s * 2.0 ** min(retries, 64))
    if not policy.retry_jitter:
        return delay
    uniform = rng.uniform if rng is not None else random.uniform
    return float(uniform(delay / 2, delay))


def _policy_changes(overrides: RetryOverrides) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for field in fields(overrides):
        value = getattr(overrides, field.name)
        if value is not None and value != ():
            changes[_FIELD_NAMES[field.name]] = value
    return changes


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(f"{name} must be an int >= 0, not {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigurationError(f"{name} must be a number of seconds >= 0, not {value!r}")


def _exception_types(name: str, value: object) -> ExceptionTypes:
    items: Iterable[object]
    if isinstance(value, type):
        items = (value,)
    elif isinstance(value, (tuple, list)):
        items = value
    else:
        raise ConfigurationError(f"{name} must be a tuple of exception classes, not {value!r}")
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"{name} must hold exception classes; {item!r} is not one")
    return cast(ExceptionTypes, tuple(items))
