"""Many delayed tasks in the plugin-free tiers: none early, how late, and the broker's memory.

``App.publish_delayed_many`` sends N messages with delays spread uniformly over a range (in
random order, so long and short delays share the tiers); a consumer on the destination queue
compares each arrival with the message's ``taskq-eta``. The broker's memory
(``erlang:memory(total)``) is sampled every 5 s while the tasks wait.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

from benchmarks._proc import Broker
from benchmarks.delays import _cleanup, _consume
from benchmarks.scale.keys import percentiles
from taskq import App
from taskq.delay.backend import DelayedMessage
from taskq.delay.maths import epoch_ms
from taskq.message import CONTENT_TYPE, WireMessage

PUBLISH_CHUNK = 10_000


def run(url: str, count: int, low_s: float, high_s: float) -> dict[str, Any]:
    namespace = f"scale{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.delays"
    app = App("bench", broker_url=url, namespace=namespace, default_queue=queue,
              delay_backend="tiers")
    try:
        return _measure(app, url, queue, count, low_s, high_s)
    finally:
        app.close()
        _cleanup(url, namespace, queue)


def _measure(app: App, url: str, queue: str, count: int, low_s: float,
             high_s: float) -> dict[str, Any]:
    warmup = WireMessage(b"\x80", "warmup", {}, content_type=CONTENT_TYPE)
    app.publish_delayed(warmup, queue=queue, delay_s=0.001)  # declares the tiers and queue
    lateness_ms: list[int] = []
    ids: list[str] = []
    done, ready = threading.Event(), threading.Event()
    consumer = threading.Thread(
        target=_consume, args=(url, queue, count, lateness_ms, done, ready, ids), daemon=True
    )
    consumer.start()
    ready.wait(10)
    broker, memory = Broker.find(), []
    baseline = broker.memory_mb()
    delays_ms = [random.randint(int(low_s * 1000), int(high_s * 1000)) for _ in range(count)]
    published_s = _publish(app, queue, delays_ms)
    deadline = time.monotonic() + high_s + 60
    while not done.wait(5) and time.monotonic() < deadline:
        memory.append(broker.memory_mb())
    done.set()
    consumer.join()
    peaks = [m for m in memory if m is not None]
    return {
        "tasks": count, "range_s": [low_s, high_s], "arrived": len(lateness_ms),
        "early": sum(1 for v in lateness_ms if v < 0), "publish_s": published_s,
        "late": percentiles([float(v) for v in lateness_ms]) if lateness_ms else None,
        "broker_memory_mb": {"before": baseline, "peak": max(peaks) if peaks else None},
        "by_entry_tier": _by_entry_tier(ids, lateness_ms, delays_ms),
    }


def _by_entry_tier(ids: list[str], lateness_ms: list[int],
                   delays_ms: list[int]) -> dict[str, dict[str, Any]]:
    """Lateness of the messages grouped by the tier they entered (their delay's highest bit):
    each group was published together and expires from that tier together."""
    groups: dict[int, list[float]] = {}
    for message_id, late in zip(ids, lateness_ms, strict=True):
        groups.setdefault(delays_ms[int(message_id)].bit_length() - 1, []).append(float(late))
    return {f"{level:02d}": {"tier_ms": 2**level, "tasks": len(values), **percentiles(values)}
            for level, values in sorted(groups.items())}


def _publish(app: App, queue: str, delays_ms: list[int]) -> float:
    """Publish in chunks, each chunk's due times counted from when it is sent."""
    count = len(delays_ms)
    started = time.monotonic()
    for first in range(0, count, PUBLISH_CHUNK):
        now = epoch_ms()
        app.publish_delayed_many([
            DelayedMessage(WireMessage(b"\x80", str(i), {}, content_type=CONTENT_TYPE), queue,
                           now + delays_ms[i])
            for i in range(first, min(count, first + PUBLISH_CHUNK))
        ])
    return time.monotonic() - started
