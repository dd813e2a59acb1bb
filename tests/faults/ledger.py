"""What was asked for, what happened, and the counts that compare them (Jepsen style).

Jepsen's total-queue checker sorts every message into ok, lost, unexpected, duplicated and
recovered. The fault suite does the same for task ids:

- ``committed``: ids whose enqueue was acknowledged: a ``delay()`` that returned, or an
  outbox row whose transaction committed;
- ``in_doubt``: ids whose enqueue failed in a way that does not say whether it happened (a
  ``delay()`` that raised while the broker went away may still have been confirmed later);
  they may run or not, and count as ``recovered`` when they did;
- everything else was never committed (rolled-back rows, ids never sent).

``lost`` = committed ids neither completed (an effect row) nor dead-lettered;
``unexpected`` = ids that ran, wrote an effect or sit in a queue but were never committed;
``dup_effects`` = ids with more than one effect row. Any of the three non-empty fails.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

# Ids named in a failure message, per category (the counts say how many there are).
SHOWN_IDS = 5


class FaultSchedule:
    """The faults injected, in order, with their offset from the scenario's start.

    Args:
        seed: The seed every random choice of the scenario was drawn from.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.started_at = time.monotonic()
        self.events: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def add(self, what: str) -> None:
        """Record that ``what`` (a fault, or its end: a heal, a restart) happened now."""
        with self._lock:
            self.events.append((time.monotonic() - self.started_at, what))

    @property
    def last_fault_at(self) -> float | None:
        """Monotonic time of the last event (the end of the last fault)."""
        with self._lock:
            return self.started_at + self.events[-1][0] if self.events else None

    def count(self, prefix: str) -> int:
        """How many events start with ``prefix``."""
        with self._lock:
            return sum(1 for _, what in self.events if what.startswith(prefix))

    def text(self) -> str:
        """``[0.25s kill child 123, 0.50s ...]``: runs of the same fault kind are kept whole."""
        with self._lock:
            return "[" + ", ".join(f"{at:.2f}s {what}" for at, what in self.events) + "]"


class Ledger:
    """Ids the scenario committed, left in doubt or rolled back (thread-safe)."""

    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.in_doubt: set[str] = set()
        self.rolled_back: set[str] = set()
        self._lock = threading.Lock()

    def commit(self, *ids: str) -> None:
        """The enqueue of ``ids`` was acknowledged."""
        with self._lock:
            self.committed.update(ids)

    def doubt(self, *ids: str) -> None:
        """The enqueue of ``ids`` failed ambiguously."""
        with self._lock:
            self.in_doubt.update(ids)

    def roll_back(self, *ids: str) -> None:
        """``ids`` were enqueued in a transaction that rolled back."""
        with self._lock:
            self.rolled_back.update(ids)


@dataclass
class Observed:
    """What the system shows once every process of the scenario stopped."""

    executions: Counter[str] = field(default_factory=Counter)
    effects: Counter[str] = field(default_factory=Counter)
    dead_letters: dict[str, str] = field(default_factory=dict)  # id -> taskq-error-type
    dead_letter_errors: dict[str, str] = field(default_factory=dict)  # id -> taskq-error
    queued: set[str] = field(default_factory=set)  # still in Q, unroutable or the outbox


@dataclass
class Counts:
    """The checker's verdict on one scenario."""

    committed: int
    lost: list[str]
    unexpected: list[str]
    dup_effects: list[str]
    recovered: int
    dead_lettered: dict[str, str]
    histogram: dict[int, int]
    done_after_last_fault_s: float | None

    @property
    def ok(self) -> bool:
        """No loss, nothing unexpected, no duplicated effect."""
        return not (self.lost or self.unexpected or self.dup_effects)

    def line(self, scenario: str, schedule: FaultSchedule,
             notes: dict[str, str] | None = None) -> str:
        """The one line a scenario prints last: counts, seed and fault schedule."""
        done = (
            "never" if self.done_after_last_fault_s is None
            else f"{self.done_after_last_fault_s:.2f}s"
        )
        reasons = Counter(self.dead_lettered.values())
        return (
            f"faults[{scenario}] committed={self.committed} lost={len(self.lost)} "
            f"unexpected={len(self.unexpected)} dup_effects={len(self.dup_effects)} "
            f"recovered={self.recovered} dead_lettered={len(self.dead_lettered)}"
            f"{dict(sorted(reasons.items())) if reasons else ''} "
            f"executions={dict(sorted(self.histogram.items()))} "
            f"last_fault_to_done={done} "
            + "".join(f"{key}={value} " for key, value in (notes or {}).items())
            + f"seed={schedule.seed} "
            f"faults={len(schedule.events)} schedule={schedule.text()}"
        )

    def details(self) -> str:
        """A few ids of each failing category, for the failure message."""
        parts = []
        for name, ids in (("lost", self.lost), ("unexpected", self.unexpected),
                          ("dup_effects", self.dup_effects)):
            if ids:
                parts.append(f"{name} ({len(ids)}): {', '.join(ids[:SHOWN_IDS])}")
        return "; ".join(parts)


def check(
    ledger: Ledger, observed: Observed, *, done_at: float | None, schedule: FaultSchedule
) -> Counts:
    """Compare what was asked for with what happened."""
    committed, in_doubt = ledger.committed, ledger.in_doubt
    completed = {task_id for task_id, rows in observed.effects.items() if rows}
    settled = completed | set(observed.dead_letters)
    seen = set(observed.executions) | completed | set(observed.dead_letters) | observed.queued
    last = schedule.last_fault_at
    return Counts(
        committed=len(committed),
        lost=sorted(committed - settled),
        unexpected=sorted(seen - committed - in_doubt),
        dup_effects=sorted(task_id for task_id, rows in observed.effects.items() if rows > 1),
        recovered=len(in_doubt & settled),
        dead_lettered={i: r for i, r in observed.dead_letters.items() if i in committed},
        histogram=dict(Counter(observed.executions.get(i, 0) for i in committed)),
        done_after_last_fault_s=(
            None if done_at is None else max(0.0, done_at - (last or done_at))
        ),
    )
