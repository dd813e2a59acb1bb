"""Idempotent tasks claim their key before running (PostgreSQL): two copies run once.

Two :class:`~taskq.worker.dedupe.Deduplicator` objects on two engines stand for two worker
processes, each with its own database session; the test interleaves them step by step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from taskq.db import create_engine
from taskq.worker import dedupe
from taskq.worker.dedupe import Deduplicator, Duplicate
from taskq.worker.execution import Outcome, Succeeded

KEY = "order-42"


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


def _task(ran: list[str], name: str, during: Callable[[], None] = lambda: None) -> Any:
    def execute(kwargs: dict[str, Any]) -> Outcome:
        ran.append(name)
        during()
        return Succeeded(0.001)

    return execute


def _run(process: Deduplicator, execute: Any) -> Any:
    return process.run(KEY, "ship", {}, execute, transactional=False)


def test_two_copies_in_two_prefetch_batches_run_once(
    processes: Callable[[], Deduplicator],
) -> None:
    first, second = processes(), processes()
    ran: list[str] = []

    # Given each process took a copy of the key into its prefetch batch and checked it
    first.precheck([KEY, "other-1"])
    second.precheck([KEY, "other-2"])

    # When both run their copy, one after the other
    outcomes = [_run(first, _task(ran, "first")), _run(second, _task(ran, "second"))]

    # Then only the first ran; the second copy is a duplicate at once: the key is recorded,
    # though the first process keeps its claim until its batch ends
    assert ran == ["first"]
    assert isinstance(outcomes[0], Succeeded)
    assert isinstance(outcomes[1], Duplicate)
    first.run("other-1", "ship", {}, _task(ran, "other-1"), transactional=False)
    second.precheck([KEY])
    assert isinstance(_run(second, _task(ran, "again")), Duplicate)
    assert ran == ["first", "other-1"]


@pytest.mark.parametrize("batched", [True, False], ids=["prefetch-batch", "one-by-one"])
def test_a_copy_that_starts_while_the_first_runs_is_turned_away(
    processes: Callable[[], Deduplicator], batched: bool,
) -> None:
    first, second = processes(), processes()
    ran: list[str] = []
    seen: list[Any] = []

    def second_copy_arrives() -> None:
        if batched:
            second.precheck([KEY, "other"])
        seen.append(_run(second, _task(ran, "second")))

    if batched:
        first.precheck([KEY, "other"])
    _run(first, _task(ran, "first", during=second_copy_arrives))

    assert ran == ["first"]
    assert isinstance(seen[0], dedupe.Busy)


def test_the_claim_of_a_process_that_died_is_taken_over(
    processes: Callable[[], Deduplicator],
) -> None:
    first, second = processes(), processes()
    ran: list[str] = []

    # Given the first process claimed the key in its batch, then died before running it
    first.precheck([KEY, "other"])
    first.store.close()  # its database session ends, as a killed process's would

    # When the second process gets the copy the broker redelivered
    second.precheck([KEY, "other"])
    outcome = _run(second, _task(ran, "second"))

    # Then it runs it: a claim never outlives its holder's session
    assert ran == ["second"]
    assert isinstance(outcome, Succeeded)
