"""An idempotency claim never outlives the deliveries in hand (PostgreSQL advisory locks).

After a lost connection the broker hands a process's prefetched deliveries to another
consumer while the first process still holds their keys' claims. Two
:class:`~taskq.worker.dedupe.Deduplicator` objects on two engines stand for the two processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from taskq.db import create_engine
from taskq.worker.dedupe import Deduplicator, Duplicate
from taskq.worker.execution import Outcome, Succeeded


@pytest.fixture
def processes(postgres_url: str) -> Iterator[Callable[[], Deduplicator]]:
    """Factory of Deduplicators, each with an engine (a database session) of its own."""
    made: list[Deduplicator] = []

    def make() -> Deduplicator:
        process = Deduplicator(SimpleNamespace(engine=create_engine(postgres_url)))  # type: ignore[arg-type]
        made.append(process)
        return process

    yield make
    for process in made:
        process.store.close()
        process.store.engine.dispose()


def _run(process: Deduplicator, key: str, ran: list[str]) -> Any:
    def execute(kwargs: dict[str, Any]) -> Outcome:
        ran.append(key)
        return Succeeded(0.001)

    return process.run(key, "post", {}, execute, transactional=False)


def test_claims_of_deliveries_dropped_unexecuted_are_released_with_the_batch(
    processes: Callable[[], Deduplicator],
) -> None:
    cut_off, standby = processes(), processes()
    ran: list[str] = []
    # Given a process that claimed K/0..K/2 in one prefetch batch and ran K/0,
    cut_off.precheck(["k0", "k1", "k2"])
    assert isinstance(_run(cut_off, "k0", ran), Succeeded)
    # when its channel is lost, K/1 and K/2 are dropped unexecuted and its batch ends
    cut_off.end_batch()
    # Then the consumer that got them from the broker claims and runs them; K/0 is done
    standby.precheck(["k0", "k1", "k2"])
    outcomes = [_run(standby, key, ran) for key in ("k0", "k1", "k2")]
    assert isinstance(outcomes[0], Duplicate)
    assert all(isinstance(outcome, Succeeded) for outcome in outcomes[1:])
    assert ran == ["k0", "k1", "k2"]


def test_a_key_recorded_by_a_process_that_still_holds_its_claim_is_a_duplicate_elsewhere(
    processes: Callable[[], Deduplicator],
) -> None:
    holder, other = processes(), processes()
    ran: list[str] = []
    # Given a process that ran and recorded K/0 and still holds its batch's claims
    holder.precheck(["k0", "k1"])
    assert isinstance(_run(holder, "k0", ran), Succeeded)
    # Then a copy of K/0 elsewhere is a duplicate (not "claimed by another process"), in a
    # batch or one by one, and K/1, not run yet, is still turned away
    other.precheck(["k0", "k1"])
    assert isinstance(_run(other, "k0", ran), Duplicate)
    assert isinstance(_run(processes(), "k0", ran), Duplicate)
    assert type(_run(other, "k1", ran)).__name__ == "Busy"
    assert ran == ["k0"]
