"""In-place retries of ordered tasks keep within their hold budget by giving deliveries back.

The retrier's decisions with a recording settler in place of the subscription: which
deliveries are requeued, in what order, and with which retry count one comes back to run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from taskq import App
from taskq.broker.delivery import REQUEUE, Delivery
from taskq.message import RETRIES, WireMessage
from taskq.ordering.in_place import InPlaceRetrier


class Settled:
    """Records settlements, as Subscription.settle would queue them."""

    def __init__(self) -> None:
        self.actions: list[tuple[int, int]] = []

    def settle(self, delivery: Delivery, action: int) -> None:
        self.actions.append((delivery.delivery_tag, action))


@pytest.fixture
def make_retrier(
    make_app: Callable[..., App], namespace: str
) -> Callable[[list[int]], InPlaceRetrier]:
    """An InPlaceRetrier of an app with the ordered queue ``ledger`` and a 1 s hold budget."""

    def make(generation: list[int]) -> InPlaceRetrier:
        app = make_app(consumer_timeout_s=2.0)
        app.queue(f"{namespace}.ledger", partitions=2)
        return InPlaceRetrier(
            app, is_stopping=lambda: False, generation=lambda: generation[0],
            alive_at=SimpleNamespace(value=0.0), hold=None, dead_letters=None,  # type: ignore[arg-type]
        )

    return make


@pytest.fixture
def partitions(namespace: str) -> tuple[str, str]:
    """The two partition queues of the test's ordered queue."""
    return f"{namespace}.ledger.p0", f"{namespace}.ledger.p1"


def _delivery(owner: Any, message_id: str, queue: str, tag: int, *, held_s: float = 0.0,
              redelivered: bool = False, generation: int = 0) -> Delivery:
    wire = WireMessage(b"\x80", message_id, {RETRIES: 0})
    return Delivery(wire, queue, redelivered, tag, generation, owner,
                    received_at=time.monotonic() - held_s)


def test_a_retry_past_the_budget_is_given_back_with_its_partitions_later_deliveries(
    make_retrier: Callable[[list[int]], InPlaceRetrier], partitions: tuple[str, str],
) -> None:
    p0, p1 = partitions
    settled, generation = Settled(), [0]
    retrier = make_retrier(generation)
    # Given a delivery of ledger.p0 held 0.9 s that fails with a 0.5 s backoff left
    first = _delivery(settled, "t-0", p0, 1, held_s=0.9)
    assert retrier.retry(first, task="t", retries=0, delay_s=0.5, reason="boom")
    # Then it is requeued at once instead of waited on (0.9 + 0.5 > 1 s), not run again here
    assert settled.actions == [(1, REQUEUE)]
    assert not retrier.take_again(first)
    # and a later delivery of its partition goes back behind it; another partition's runs
    assert retrier.gives_back(_delivery(settled, "t-1", p0, 2))
    assert not retrier.gives_back(_delivery(settled, "o-1", p1, 3))
    assert settled.actions == [(1, REQUEUE), (2, REQUEUE)]
    # When it comes back, the rest of its backoff is waited and it runs with retries 1
    started = time.monotonic()
    back = _delivery(settled, "t-0", p0, 4, redelivered=True)
    assert not retrier.gives_back(back)
    assert time.monotonic() - started >= 0.3
    assert back.message.headers[RETRIES] == 1
    # and the partition's later deliveries run again
    assert not retrier.gives_back(_delivery(settled, "t-1", p0, 5))
    assert settled.actions == [(1, REQUEUE), (2, REQUEUE)]


def test_a_lost_channel_ends_the_wait_for_a_given_back_delivery(
    make_retrier: Callable[[list[int]], InPlaceRetrier], partitions: tuple[str, str],
) -> None:
    p0, p1 = partitions
    settled, generation = Settled(), [0]
    retrier = make_retrier(generation)
    first = _delivery(settled, "t-0", p0, 1, held_s=0.9)
    assert retrier.retry(first, task="t", retries=0, delay_s=0.5, reason="boom")
    # When the channel is lost, the broker has put everything back in order: the next
    # delivery of the partition on the new channel runs, whatever it is
    generation[0] = 1
    assert not retrier.gives_back(_delivery(settled, "t-1", p0, 1, generation=1))
    assert settled.actions == [(1, REQUEUE)]


def test_a_retry_within_the_budget_waits_in_place(
    make_retrier: Callable[[list[int]], InPlaceRetrier], partitions: tuple[str, str],
) -> None:
    p0, p1 = partitions
    settled, generation = Settled(), [0]
    retrier = make_retrier(generation)
    first = _delivery(settled, "t-0", p0, 1, held_s=0.1)
    assert retrier.retry(first, task="t", retries=0, delay_s=0.2, reason="boom")
    assert settled.actions == []
    assert retrier.take_again(first)
    assert first.message.headers[RETRIES] == 1
