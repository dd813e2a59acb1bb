"""When the supervisor takes a worker process for stalled (consuming nothing while alive)."""

from __future__ import annotations

import multiprocessing

from taskq.settings import Settings
from taskq.worker.monitoring import STALLED_MIN_S, stalled_after_s
from taskq.worker.time_limits import Slot

SPAWN = multiprocessing.get_context("spawn")


def test_a_process_whose_consumer_shows_no_progress_and_holds_no_delivery_is_stalled() -> None:
    slot = Slot(SPAWN)
    assert not slot.is_stalled(1000.0, 30.0)  # its consumer has not started: start-up
    slot.io_at.value = 125.0
    assert not slot.is_stalled(150.0, 30.0)
    assert slot.is_stalled(156.0, 30.0)
    slot.begin(b"message-1", None)             # a task runs: busy, not stalled
    assert not slot.is_stalled(1000.0, 30.0)
    slot.release()
    assert slot.is_stalled(1000.0, 30.0)
    slot.clear()                               # the supervisor, before the next process
    assert slot.io_at.value == 0.0
    assert not slot.is_stalled(1000.0, 30.0)


def test_the_stall_limit_covers_heartbeats_and_connect_attempts_to_every_node() -> None:
    assert stalled_after_s(Settings()) == 2 * Settings().heartbeat_s  # 120 s by default
    one = Settings(heartbeat_s=2, connect_timeout_s=5.0)
    assert stalled_after_s(one) == STALLED_MIN_S
    urls = ";".join(f"amqp://guest:guest@127.0.0.1:{port}/%2F" for port in (5672, 5673, 5674))
    three = Settings(heartbeat_s=2, connect_timeout_s=10.0, broker_url=urls)
    assert stalled_after_s(three) == 3 * 2 * 10.0 + STALLED_MIN_S / 2
