"""A consumer that records when each message arrived (for delay tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pika


@dataclass(frozen=True)
class Arrival:
    """One message as it arrived: id, epoch ms of arrival, its ``taskq-eta`` and headers."""

    message_id: str
    arrived_ms: int
    eta_ms: int | None
    headers: dict[str, Any]

    @property
    def late_ms(self) -> int:
        """How late it arrived after its ``taskq-eta`` (negative: early)."""
        assert self.eta_ms is not None, f"message {self.message_id} has no taskq-eta"
        return self.arrived_ms - self.eta_ms


class ArrivalRecorder:
    """Consumes ``queue`` (auto-ack) on its own connection and thread, recording arrivals.

    Args:
        url: AMQP URL.
        queue: An existing queue, or several (one consumer each, on the same channel).
    """

    def __init__(self, url: str, queue: str | Sequence[str]) -> None:
        self.url = url
        self.queues = [queue] if isinstance(queue, str) else list(queue)
        self.arrivals: list[Arrival] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ArrivalRecorder:
        """Start consuming; returns once the consumer is registered."""
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError(
                f"consumer on {', '.join(self.queues)} did not start: {self._error!r}"
            )
        return self

    def ids(self) -> list[str]:
        """Message ids in arrival order."""
        return [a.message_id for a in list(self.arrivals)]

    def by_id(self) -> dict[str, Arrival]:
        """Arrivals keyed by message id."""
        return {a.message_id: a for a in list(self.arrivals)}

    def stop(self) -> None:
        """Stop consuming and close the connection."""
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            for queue in self.queues:
                channel.basic_consume(queue, self._on_message, auto_ack=True)
        except BaseException as exc:  # reported by start()
            self._error = exc
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                connection.process_data_events(time_limit=0.02)
        finally:
            connection.close()

    def _on_message(self, _channel: Any, _method: Any, properties: Any, _body: bytes) -> None:
        arrived_ms = time.time_ns() // 1_000_000
        headers = dict(properties.headers or {})
        eta = headers.get("taskq-eta")
        self.arrivals.append(
            Arrival(properties.message_id, arrived_ms, int(eta) if eta else None, headers)
        )
