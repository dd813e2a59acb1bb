"""Sending for one app: this process's confirmed publisher and its delay backends.

The :class:`~taskq.app.App` validates and encodes; a :class:`Sender` owns what talks to the
broker. Everything is created on first use and per process: after a fork the parent's
publisher is forgotten (closing it would write to a socket the parent still owns) and a
new one is opened. The delay backend *kind* is chosen once (``auto`` asks the broker whether
the delayed-message plugin is enabled); a backend is built per publisher (the app's, each
relay's), all sharing one declarer.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence

from taskq.broker.publisher import Publisher
from taskq.broker.topology import Topology
from taskq.delay.backend import (
    DelayBackend,
    DelayDeclarer,
    DelayedMessage,
    PartFailure,
    attempt_part,
    combined_error,
    due_item,
    is_outage,
    with_unsent,
)
from taskq.delay.choosing import build_backend, choose_backend
from taskq.delay.maths import check_delay_ms, epoch_ms
from taskq.errors import BrokerConnectionError, ConfigurationError, PublishError
from taskq.settings import Settings

logger = logging.getLogger(__name__)


class Sender:
    """Publishes an app's encoded messages, now or delayed, with confirms.

    Args:
        settings: The app's settings (a new Sender is made when they change).
        topology: The app's broker objects.
    """

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self._lock = threading.Lock()
        self._publisher: Publisher | None = None
        self._publisher_pid = 0
        self._owned_publishers: list[Publisher] = []
        self._delay_lock = threading.Lock()
        self._delay_kind: str | None = None
        self._delay_declarer: DelayDeclarer | None = None
        self._delay: tuple[Publisher, DelayBackend] | None = None
        self._owned_delays: list[DelayBackend] = []

    @property
    def publisher(self) -> Publisher:
        """This process's publisher (created on first use; a new one after fork)."""
        publisher = self._publisher
        if publisher is not None and self._publisher_pid == os.getpid():
            return publisher
        with self._lock:
            if self._publisher is None or self._publisher_pid != os.getpid():
                self._publisher = Publisher(self.settings, self.topology)
                self._publisher_pid = os.getpid()
            return self._publisher

    def relay_publisher(self) -> Publisher:
        """A publisher of its own for a relay, closed with this sender."""
        publisher = Publisher(self.settings, self.topology, client_name="taskq relay")
        self._owned_publishers.append(publisher)
        return publisher

    def publish_delayed_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Publish messages each to be delivered at its ``eta_ms``, with confirms.

        Messages already due go straight to their queues; the others through the delay
        backend (chosen on first use, before anything is sent). A refusal of the due part
        (a nack, a message AMQP cannot encode) does not keep the delayed part from being
        sent; an outage does (it would only wait out its own timeout), and the error then
        names the delayed messages too.

        Raises:
            ConfigurationError: a delay is too long, or the backend cannot be had (nothing
                is published).
            PublishError: not confirmed; ``unconfirmed_ids`` lists every message of the
                call that was not confirmed, sent or not (all others were). An error
                without ids confirmed none.
            TopologyError: a queue or delay tier exists with other arguments, and the call
                had only due or only delayed messages (nothing was confirmed; in a call of
                both it is a ``PublishError`` naming the messages of the refused part).
        """
        now = epoch_ms()
        due = [m for m in messages if m.eta_ms <= now]
        later = [m for m in messages if m.eta_ms > now]
        backend = self.delay_backend if later else None
        if backend is not None:
            longest = max(m.eta_ms for m in later) - now
            check_delay_ms(longest, backend.max_delay_ms, f"the {backend.name} delay backend")
        failures: list[PartFailure] = []
        if due:
            attempt_part(lambda: self._publish_due(due), _ids(due), failures)
            if failures and later and is_outage(failures[0][0]):
                raise with_unsent(combined_error(failures), later) from failures[0][0]
        if backend is not None:
            # The backend reads the clock itself, after any connecting and declaring.
            attempt_part(lambda: backend.publish_many(later), _ids(later), failures)
        if not failures:
            return
        if len(failures) == 1 and not (due and later):
            raise failures[0][0]  # the whole call was one part: its own error says it all
        raise combined_error(failures) from failures[0][0]

    def _publish_due(self, due: Sequence[DelayedMessage]) -> None:
        items = [due_item(self.topology, m) for m in due]
        if len(items) == 1:
            exchange, key, wire = items[0]
            self.publisher.publish(wire, exchange=exchange, routing_key=key)
        else:
            self.publisher.publish_many(items)

    @property
    def delay_backend(self) -> DelayBackend:
        """This process's delay backend, publishing through :attr:`publisher`.

        Raises:
            PublishError: the broker is unreachable, so ``auto`` cannot choose.
            ConfigurationError: ``delay_backend='plugin'`` and the broker lacks the plugin.
        """
        publisher = self.publisher
        current = self._delay
        if current is not None and current[0] is publisher:
            return current[1]
        backend = self._new_delay_backend(publisher)
        with self._delay_lock:
            if self._delay is not None and self._delay[0] is publisher:
                backend.close()
                return self._delay[1]
            self._delay = (publisher, backend)
        return backend

    def delay_kind(self) -> str:
        """``"plugin"`` or ``"tiers"``, chosen once from the ``delay_backend`` setting.

        Raises:
            PublishError: the broker is unreachable, so ``auto`` cannot choose.
            ConfigurationError: ``delay_backend='plugin'`` and the broker lacks the plugin.
        """
        with self._delay_lock:
            if self._delay_kind is None:
                try:
                    self._delay_kind = choose_backend(
                        self.settings, broker=self.topology.broker
                    )
                except BrokerConnectionError as exc:
                    raise PublishError(
                        f"{exc.message}; cannot choose the delay backend, so the delayed "
                        "message was not published",
                        reason="unreachable",
                    ) from exc
            return self._delay_kind

    def adopt_delay_kind(self, kind: str) -> None:
        """Take ``kind`` (``plugin`` or ``tiers``) as chosen, e.g. by the worker supervisor.

        Raises:
            ConfigurationError: ``kind`` is neither.
        """
        if kind not in ("plugin", "tiers"):
            raise ConfigurationError(
                f"delay backend kind must be 'plugin' or 'tiers', not {kind!r}"
            )
        with self._delay_lock:
            self._delay_kind = kind

    def delay_factory(self, publisher: Publisher) -> Callable[[], DelayBackend]:
        """A lazy backend for a relay's publisher: nothing is probed until a row needs it."""
        built: list[DelayBackend] = []

        def factory() -> DelayBackend:
            if not built:
                built.append(self._new_delay_backend(publisher))
                self._owned_delays.append(built[0])
            return built[0]

        return factory

    def close(self) -> None:
        """Close this process's publishers and delay backends (safe to repeat).

        The delay backend kind stays chosen: the next publish reconnects with it.
        """
        with self._lock:
            publisher, self._publisher = self._publisher, None
            if publisher is not None and self._publisher_pid == os.getpid():
                _close_quietly(publisher, "publisher")
            owned, self._owned_publishers = self._owned_publishers, []
            for relay_publisher in owned:
                relay_publisher.close()
        current, self._delay = self._delay, None
        delays, self._owned_delays = self._owned_delays, []
        for backend in (*delays, *([current[1]] if current else [])):
            _close_quietly(backend, "delay backend")

    def _new_delay_backend(self, publisher: Publisher) -> DelayBackend:
        kind = self.delay_kind()
        with self._delay_lock:
            if self._delay_declarer is None:
                self._delay_declarer = DelayDeclarer(self.settings, self.topology)
            declarer = self._delay_declarer
        return build_backend(kind, self.settings, self.topology, publisher, declarer)


def _ids(messages: Sequence[DelayedMessage]) -> list[str | None]:
    return [m.wire.message_id for m in messages]


def _close_quietly(closeable: Publisher | DelayBackend, what: str) -> None:
    try:
        closeable.close()
    except Exception:  # closing is best effort; the connection may be gone
        logger.debug("error closing a %s", what, exc_info=True)
