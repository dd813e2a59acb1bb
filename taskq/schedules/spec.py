"""Schedule kinds: an interval (:class:`Every`) and a cron expression in a time zone.

Both answer one question, :meth:`Schedule.next_after`: the first tick strictly after an
aware UTC instant, as an aware UTC datetime. The scheduler stores and compares UTC only.

Intervals tick on a grid anchored at the Unix epoch (``k * interval``), so an every-300 s
schedule runs at :00, :05, :10... of each hour whoever computes it, after any restart.

Cron expressions are evaluated by croniter in the wall-clock time of their time zone, with
this rule for daylight-saving changes (docs/periodic.md):

- clocks go forward (a skipped hour): a run whose wall time does not exist that day runs
  at the first instant after the gap (``30 2 * * *`` in Europe/Berlin on the last Sunday of
  March runs at 03:00 CEST); several such runs, or one that falls on a run just after the
  gap, are one run;
- clocks go back (a repeated hour): a wall time that occurs twice runs once, at its first
  occurrence (``30 2 * * *`` runs at 02:30 CEST, not again at 02:30 CET), unless the hour
  field is ``*``: such a schedule (``*/15 * * * *``) follows elapsed time and runs in both
  copies of the hour, which are different hours of real time.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
MIN_INTERVAL_S = 1.0
# croniter's shorthands, spelled out so that the hour field is known (the DST rule).
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# A cron expression's candidates skipped by the DST rule in a row, at most (one repeated
# hour holds 60 minutes of candidates); more means the expression cannot be evaluated.
_MAX_SKIPPED_CANDIDATES = 200


class Schedule(Protocol):
    """When a periodic task runs."""

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (aware), as an aware UTC datetime."""

    def describe(self) -> str:
        """Human text: ``every 5s``, ``cron */5 * * * * Europe/Berlin``."""

    @property
    def fingerprint(self) -> str:
        """Changes exactly when the schedule's ticks change (stored with its row)."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Every:
    """Every ``interval`` of elapsed time, on a grid anchored at the Unix epoch.

    Args:
        interval: At least one second.
    """

    interval: timedelta

    def __post_init__(self) -> None:
        if self.interval.total_seconds() < MIN_INTERVAL_S:
            raise ConfigurationError(
                f"a periodic interval must be at least {MIN_INTERVAL_S:g} second, not "
                f"{self.interval.total_seconds():g}s"
            )

    def next_after(self, moment: datetime) -> datetime:
        """The first grid tick strictly after ``moment``."""
        step = self.interval // _MICROSECOND
        elapsed = (moment - _EPOCH) // _MICROSECOND
        return _EPOCH + (elapsed // step + 1) * step * _MICROSECOND

    def describe(self) -> str:
        """``every 5s`` (fractions of a second are kept: ``every 1.5s``)."""
        return f"every {self.interval.total_seconds():g}s"

    @property
    def fingerprint(self) -> str:
        """Derived from the interval in microseconds."""
        return _digest(f"every:{self.interval // _MICROSECOND}us")


@dataclass(frozen=True)
class Crontab:
    """A five-field cron expression evaluated in ``timezone`` (build it with :func:`crontab`).

    Args:
        expression: ``minute hour day-of-month month day-of-week`` (or ``@daily``...).
        timezone: An IANA time zone name, e.g. ``Europe/Berlin``.
    """

    expression: str
    timezone: str = "UTC"
    # One parsed croniter, moved to each start (5x cheaper than parsing per call); the
    # lock keeps next_after safe to call from several threads.
    _parsed: Any = field(default=None, init=False, repr=False, compare=False)
    _lock: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expression", _normalise(self.expression))
        _zone(self.timezone)
        object.__setattr__(self, "_lock", threading.Lock())
        try:
            self.next_after(datetime.now(timezone.utc))
        except (ValueError, KeyError) as exc:  # croniter's errors are ValueErrors
            raise ConfigurationError(
                f"cron expression {self.expression!r} is not valid: {exc}"
            ) from None

    @property
    def zone(self) -> ZoneInfo:
        """The time zone the expression is read in."""
        return _zone(self.timezone)

    @property
    def hour_field(self) -> str:
        """The second field (hours), after aliases are spelled out."""
        return _ALIASES.get(self.expression, self.expression).split()[1]

    def next_after(self, moment: datetime) -> datetime:
        """The first run strictly after ``moment``, by the rule in the module docstring."""
        zone = self.zone
        follows_elapsed_time = self.hour_field == "*"
        with self._lock:
            candidates = self._candidates(moment.astimezone(zone))
            for _ in range(_MAX_SKIPPED_CANDIDATES):
                found: datetime = candidates.get_next(datetime)
                candidate = found.astimezone(timezone.utc)
                if candidate <= moment:  # a wall time in the gap, moved to its end
                    continue
                if not follows_elapsed_time and _is_repeated_wall_time(candidate, zone):
                    continue
                return candidate
        raise ConfigurationError(
            f"cron expression {self.expression!r} in {self.timezone}: no run found after "
            f"{moment.isoformat()}"
        )

    def _candidates(self, start: datetime) -> Any:
        # Imported on first use: apps without cron schedules never load croniter.
        from croniter import croniter

        if self._parsed is None:
            expression = _ALIASES.get(self.expression, self.expression)
            object.__setattr__(self, "_parsed", croniter(expression, start))
        else:
            self._parsed.set_current(start)
        return self._parsed

    def describe(self) -> str:
        """``cron */5 * * * * Europe/Berlin``."""
        return f"cron {self.expression} {self.timezone}"

    @property
    def fingerprint(self) -> str:
        """Derived from the expression and the time zone."""
        return _digest(f"cron:{self.expression}:{self.timezone}")


def crontab(expression: str, timezone: str = "UTC") -> Crontab:
    """A cron schedule: ``taskq.crontab("*/5 * * * *", timezone="Europe/Berlin")``.

    Five fields (minute, hour, day of month, month, day of week) with croniter's syntax
    (``*``, ``,``, ``-``, ``/``, names like ``mon`` and ``jan``), or ``@hourly``, ``@daily``,
    ``@weekly``, ``@monthly``, ``@yearly``. See the module docstring for daylight saving.

    Raises:
        ConfigurationError: the expression is not valid or never matches, or the time zone
            is unknown; the message says why.
    """
    return Crontab(expression, timezone)


def to_schedule(value: object) -> Every | Crontab:
    """Turn what ``add_periodic_task`` accepts (seconds, ``timedelta``, crontab) into a schedule.

    Raises:
        ConfigurationError: anything else, or an interval shorter than a second.
    """
    if isinstance(value, (Every, Crontab)):
        return value
    if isinstance(value, timedelta):
        return Every(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Every(timedelta(seconds=value))
    if isinstance(value, str):
        raise ConfigurationError(
            f"schedule {value!r} is a string; write taskq.crontab({value!r}) for a cron "
            "expression, or give seconds or a timedelta for an interval"
        )
    raise ConfigurationError(
        f"schedule must be seconds, a timedelta or taskq.crontab(...), not {value!r}"
    )


def _normalise(expression: object) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"cron expression must be a non-empty str, not {expression!r}")
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in _ALIASES:
            raise ConfigurationError(
                f"cron expression {text!r} is not valid: the shorthands are "
                f"{', '.join(sorted(_ALIASES))}"
            )
        return text.lower()
    if len(text.split()) != 5:
        raise ConfigurationError(
            f"cron expression {text!r} is not valid: it has {len(text.split())} fields, "
            "expected 5 (minute hour day-of-month month day-of-week)"
        )
    return text


def _zone(name: object) -> ZoneInfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"timezone must be an IANA name like 'Europe/Berlin', not {name!r}"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown time zone {name!r}: give an IANA name like 'Europe/Berlin' or 'UTC' "
            "(install the tzdata package where the system has no time zone database)"
        ) from None


def _is_repeated_wall_time(moment: datetime, zone: ZoneInfo) -> bool:
    """``moment`` is the second occurrence of a wall time (the repeated hour)."""
    local = moment.astimezone(zone)
    return local.fold == 1 and local.utcoffset() != local.replace(fold=0).utcoffset()
