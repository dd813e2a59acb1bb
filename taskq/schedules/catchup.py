"""Which ticks a scheduler fires when it comes to a due schedule: pure decisions.

A tick the scheduler reaches within ``grace_s`` of its time is *on time* and always runs.
An older one was *missed* (no scheduler ran, or all were stopped or far behind), and the
schedule's ``missed`` policy decides:

- ``"once"`` (default): one run stands for every missed tick (the newest missed tick's time);
- ``"skip"``: missed ticks are dropped;
- ``"all"``: each missed tick runs, at most ``max_runs`` of them (the newest); older ones
  are dropped and counted in :attr:`Plan.dropped`.

Then the schedule continues with its first tick after now. Enumerating missed ticks is
bounded too: a year-long outage of an every-second schedule costs a few hundred steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from taskq.errors import ConfigurationError
from taskq.schedules.spec import Schedule

MISSED_POLICIES = ("once", "skip", "all")
_MICROSECOND = timedelta(microseconds=1)
# Ticks enumerated in one pass, at most.
_BATCH = 512
# Look-back windows tried, at most, to find the newest missed ticks.
_MAX_WINDOWS = 64


@dataclass(frozen=True)
class Plan:
    """What one tick transaction does.

    Args:
        runs: The tick times to enqueue, oldest first.
        next_run_at: The schedule's next tick after this transaction.
        missed: Missed ticks found (``None``: more than could be counted cheaply).
        dropped: Missed ticks not run (``None``: not counted, see ``missed``).
    """

    runs: list[datetime]
    next_run_at: datetime
    missed: int | None = 0
    dropped: int | None = 0


def validate_missed(missed: object) -> str:
    """Return ``missed`` if it is a policy name, else raise ``ConfigurationError``."""
    if missed not in MISSED_POLICIES:
        raise ConfigurationError(
            f"missed must be one of {', '.join(repr(p) for p in MISSED_POLICIES)}, not {missed!r}"
        )
    return str(missed)


def plan_ticks(
    schedule: Schedule,
    next_run_at: datetime,
    now: datetime,
    *,
    missed: str,
    grace_s: float,
    max_runs: int,
) -> Plan:
    """Decide the runs of a schedule whose stored next tick is ``next_run_at``, at ``now``."""
    cutoff = now - timedelta(seconds=grace_s)
    first_on_time = next_run_at if next_run_at > cutoff else schedule.next_after(cutoff)
    on_time, _ = _ticks(schedule, first_on_time, now, _BATCH)
    keep = {"all": max_runs, "once": 1, "skip": 0}[missed]
    late: list[datetime] = []
    count: int | None = 0
    if next_run_at <= cutoff:
        late, count = _newest_ticks(schedule, next_run_at, cutoff, max(keep, 1))
    runs = late[len(late) - keep:] if keep else []
    dropped = None if count is None else count - len(runs)
    return Plan(runs + on_time, schedule.next_after(now), count, dropped)


def _ticks(
    schedule: Schedule, first: datetime, until: datetime, limit: int
) -> tuple[list[datetime], bool]:
    """Ticks from ``first`` (a tick) up to ``until``; at most ``limit`` (then truncated)."""
    ticks: list[datetime] = []
    tick = first
    while tick <= until:
        if len(ticks) == limit:
            return ticks, True
        ticks.append(tick)
        tick = schedule.next_after(tick)
    return ticks, False


def _newest_ticks(
    schedule: Schedule, first: datetime, until: datetime, keep: int
) -> tuple[list[datetime], int | None]:
    """The newest ``keep`` (or more) ticks in ``[first, until]`` and their count if known.

    Few ticks: all of them, counted. Many: look back from ``until`` over a window sized by
    the density of the first batch, doubled while it holds fewer than ``keep`` ticks and
    halved while it holds more than one pass enumerates.
    """
    batch, truncated = _ticks(schedule, first, until, max(_BATCH, keep + 1))
    if not truncated:
        return batch, len(batch)
    lookback = (batch[-1] - batch[0]) * (keep + 1) / len(batch) + _MICROSECOND
    tail: list[datetime] = []
    for _ in range(_MAX_WINDOWS):
        begin = until - lookback
        if begin <= batch[-1]:  # the window reaches back over the first batch
            tail, truncated = _ticks(schedule, schedule.next_after(batch[-1]), until,
                                     4 * (keep + 1) + _BATCH)
            if not truncated:
                return batch + tail, None
        else:
            tail, truncated = _ticks(schedule, schedule.next_after(begin - _MICROSECOND),
                                     until, 4 * (keep + 1) + _BATCH)
            if not truncated and len(tail) >= keep:
                return tail, None
        lookback = lookback / 2 if truncated else lookback * 2
    return tail, None  # a schedule this uneven: some late ticks, not surely the newest
