"""The slot a worker process shares with its supervisor: delivery keys, the kill decision.

Real processes (multiprocessing spawn) and real signals, as ``taskq worker`` uses them; the
supervisor's clock is injected where a test needs a deadline to have passed.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from taskq.message import WireMessage
from taskq.worker.deaths import DeathLedger
from taskq.worker.supervisor import Supervisor, _Child
from taskq.worker.time_limits import (
    MESSAGE_ID_MAX_BYTES,
    Slot,
    SlotState,
    delivery_key,
    describe_key,
    message_key,
)
from tests.support.waiting import wait_until

SPAWN = multiprocessing.get_context("spawn")

HOSTILE_IDS: list[str | bytes] = [
    "0b6c2f3e-uuid-like",
    "a\x00b",                        # NUL inside: a C string would stop at 'a'
    b"\x00",
    b"\x00" * MESSAGE_ID_MAX_BYTES,   # the longest AMQP short string, all NUL
    b"\xff\xfe not UTF-8",          # pika hands a non-UTF-8 id over as bytes
    bytes(range(255)),
    "ünïcødé ✓",
    "line\nbreak",
]


@pytest.fixture
def slot() -> Slot:
    return Slot(SPAWN)


# -- delivery keys (item 2) ------------------------------------------------------------------


@pytest.mark.parametrize("message_id", HOSTILE_IDS)
def test_any_message_id_round_trips_through_the_slot(slot: Slot, message_id: Any) -> None:
    key = delivery_key(WireMessage(b"body", message_id))

    slot.begin(key, 30.0)
    state = slot.state()

    assert state is not None and state.key == key
    raw = message_id.encode() if isinstance(message_id, str) else message_id
    assert key[1:] == raw  # the exact bytes, nothing truncated or replaced
    assert slot.holds(key) and not slot.holds(message_key(raw + b"x"))


def _hold_and_exit(slot: Slot, key: bytes) -> None:
    slot.hold(key)
    os._exit(1)


def test_ids_that_differ_after_a_nul_byte_are_different_deliveries(tmp_path: Path) -> None:
    # Written by another process (shared memory), read back and counted in the ledger
    ledger = DeathLedger(str(tmp_path))
    keys = [message_key(b"a\x00one"), message_key(b"a\x00two"), message_key(b"a")]
    for key in keys:
        slot = Slot(SPAWN)
        process = SPAWN.Process(target=_hold_and_exit, args=(slot, key))
        process.start()
        process.join(30)
        state = slot.state()
        assert state is not None and state.key == key
        ledger.record_death(state.key)

    assert [ledger.read(key) is not None and ledger.read(key).deaths for key in keys] == [1, 1, 1]


def test_a_message_without_id_has_one_key_across_redeliveries() -> None:
    headers = {"taskq-task": "t", "taskq-v": 1}
    first = WireMessage(b"body", None, headers, priority=0)
    # A quorum queue adds x-delivery-count on redelivery; the key must not change with it
    again = WireMessage(b"body", "", {**headers, "x-delivery-count": 3}, priority=0)
    other_body = WireMessage(b"other", None, headers, priority=0)
    hostile = WireMessage(b"body", None, {b"\xff name": [b"\x00", {"nested": 1}]})

    assert delivery_key(first) == delivery_key(again)
    assert delivery_key(first) != delivery_key(other_body)
    assert delivery_key(hostile) != delivery_key(first)
    assert delivery_key(first) != message_key(delivery_key(first))  # never an id's key
    assert describe_key(delivery_key(first)).startswith("(no message id;")
    assert describe_key(message_key("m-1")) == "m-1"
    assert describe_key(message_key("line\nbreak")) == repr("line\nbreak")


# -- the supervisor records deaths by delivery key ------------------------------------------


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    app = App("slot-tests", broker_url="amqp://guest:guest@127.0.0.1:5672/%2F",
              database_url=f"sqlite:///{tmp_path}/t.db")
    supervisor = Supervisor(app, app_path="tests.tasks:app", queues=("q",), overrides={})
    supervisor._ledger = DeathLedger(str(tmp_path / "ledger"))
    os.mkdir(supervisor._ledger.directory)
    yield supervisor
    app.close()


def _watch_until_reaped(supervisor: Supervisor, child: _Child, now: Any = None) -> None:
    """The supervisor's own check, as its watch loop runs it, until the process is reaped."""
    wait_until(
        lambda: supervisor._check(child, time.monotonic() if now is None else now())
        or child.process is None,
        timeout_s=30, interval_s=0.001,
    )


def test_a_process_that_dies_holding_a_message_without_id_is_counted(
    supervisor: Supervisor,
) -> None:
    # Given a process that dies (os._exit) with a message without message_id in hand
    key = delivery_key(WireMessage(b"poison", None, {"taskq-task": "t"}))
    child = _Child(1, Slot(SPAWN))
    child.process = SPAWN.Process(target=_hold_and_exit, args=(child.slot, key))
    child.process.start()

    # When the supervisor reaps it
    _watch_until_reaped(supervisor, child)

    # Then its death is in the ledger under the message's key, so the crash loop is seen
    assert supervisor._ledger is not None
    record = supervisor._ledger.read(key)
    assert record is not None and record.deaths == 1 and record.time_limit_s is None


# -- the hard time limit kills only the run judged overdue (item 12) --------------------------


def test_a_run_that_ended_after_its_deadline_is_not_killed_nor_the_next_one(slot: Slot) -> None:
    # M1 (limit 1 s) starts at t=0 and ends at t=1.5, just after its deadline; M2 starts
    slot.begin(message_key("M1"), 1.0, now=0.0)
    slot.end_run()
    slot.release()
    slot.begin(message_key("M2"), 10.0, now=1.5)
    killed: list[SlotState] = []

    # The supervisor looks at t=1.6: M1's deadline has passed, but M1 is no longer running
    assert slot.kill_if_overdue(1.6, killed.append) is None
    assert killed == []
    # M2 is killed only once its own deadline has passed
    state = slot.kill_if_overdue(11.6, killed.append)
    assert state is not None and state.key == message_key("M2") and killed == [state]


def test_a_process_cannot_end_the_run_while_the_supervisor_kills_it(slot: Slot) -> None:
    # Given M1 past its deadline, and a process about to end it and start M2
    slot.begin(message_key("M1"), 1.0, now=0.0)
    ended = threading.Event()

    def process_ends_m1_and_starts_m2() -> None:
        slot.release()
        slot.begin(message_key("M2"), 10.0, now=1.5)
        ended.set()

    states_seen_by_kill: list[SlotState | None] = []

    def kill(state: SlotState) -> None:
        # The process runs now, while the supervisor is between its decision and the kill
        thread = threading.Thread(target=process_ends_m1_and_starts_m2)
        thread.start()
        thread.join(0.2)
        states_seen_by_kill.append(slot.state())
        assert not ended.is_set(), "the process ended the run the supervisor is killing"

    # When the supervisor decides at t=1.1
    killed = slot.kill_if_overdue(1.1, kill)

    # Then what it killed is M1, and M1 was still the running one when the kill went out
    assert killed is not None and killed.key == message_key("M1")
    assert states_seen_by_kill == [killed]
    wait_until(ended.is_set)  # (only then could the process go on, were it alive)


def _run_late_and_innocent_tasks(slot: Slot) -> None:
    """A worker process finishing tasks as fast as it can: every other one is overdue."""
    n = 0
    while True:
        n += 1
        # Overdue from the start (its deadline lies in the past) ...
        slot.begin(message_key(f"late-{n}"), 1.0, now=time.monotonic() - 10.0)
        slot.release()
        # ... then one that is nowhere near its deadline.
        slot.begin(message_key(f"innocent-{n}"), 3600.0)
        slot.release()


@pytest.mark.parametrize("round_", range(5))
def test_the_supervisor_kills_and_charges_only_an_overdue_run(
    supervisor: Supervisor, round_: int
) -> None:
    # Given a process switching between overdue and innocent runs as fast as it can
    child = _Child(1, Slot(SPAWN))
    child.process = SPAWN.Process(target=_run_late_and_innocent_tasks, args=(child.slot,))
    child.process.start()
    wait_until(lambda: (state := child.slot.state()) is not None and state.key, timeout_s=30)

    # When the supervisor's watch loop checks it until it kills it for a time limit
    _watch_until_reaped(supervisor, child)

    # Then the process died in the very run the supervisor judged overdue: that run is
    # charged with its time limit, and no innocent run is charged with anything
    assert child.killed is not None
    assert child.killed.key.startswith(b"ilate-"), describe_key(child.killed.key)
    records = sorted(os.listdir(supervisor._ledger.directory))  # type: ignore[union-attr]
    assert records == [supervisor._ledger._path(child.killed.key).rsplit("/", 1)[1]]  # type: ignore[union-attr]
    record = supervisor._ledger.read(child.killed.key)  # type: ignore[union-attr]
    assert record is not None and record.time_limit_s == 1.0


def _die_while_writing(slot: Slot) -> None:
    # What a SIGKILL (OOM killer, second SIGTERM) between two stores of a write leaves
    slot._lock.acquire()
    slot._version.value += 1
    os._exit(1)


def test_a_process_that_died_while_writing_its_slot_does_not_wedge_it(
    supervisor: Supervisor,
) -> None:
    child = _Child(1, Slot(SPAWN))
    child.process = SPAWN.Process(target=_die_while_writing, args=(child.slot,))
    child.process.start()

    _watch_until_reaped(supervisor, child)

    # The supervisor cleared it: the next process can write, the supervisor can judge
    slot = child.slot
    assert slot.state() is not None and slot.state().key == b""  # type: ignore[union-attr]
    done = threading.Event()
    threading.Thread(target=lambda: (slot.begin(message_key("M"), 1.0, now=0.0), done.set()),
                     daemon=True).start()
    wait_until(done.is_set, timeout_s=5)
    assert slot.kill_if_overdue(2.0, lambda state: None) is not None
