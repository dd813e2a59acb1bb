"""The delay seam: :class:`DelayedMessage`, the :class:`DelayBackend` protocol, the declarer.

Both backends (:mod:`taskq.delay.tiers`, :mod:`taskq.delay.plugin`) implement
:class:`DelayBackend`; the app and the relay see only this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from taskq.broker.delayed import PublishItem, declare_now
from taskq.broker.publisher import OUTAGE_REASONS
from taskq.broker.topology import Declarations, HeaderBindingSpec, Topology
from taskq.delay.maths import delayed_headers, with_headers
from taskq.errors import BrokerError, PublishError, TopologyError
from taskq.message import WireMessage
from taskq.settings import Settings

#: Delayed messages sent on one reading of the clock. Both backends send a large batch in
#: slices, each measured from its own start, so the last message is not late by the whole
#: batch's sending time (about 30 ms for a slice here, not 0.8 s for 10,000 messages).
CLOCK_SLICE = 512


@dataclass(frozen=True, slots=True)
class DelayedMessage:
    """An encoded message to deliver to ``queue`` no earlier than ``eta_ms``.

    Args:
        wire: The message (its ``taskq-eta`` header is set to ``eta_ms`` on publishing).
        queue: The destination work queue.
        eta_ms: Epoch milliseconds before which it must not be delivered.
    """

    wire: WireMessage
    queue: str
    eta_ms: int


class DelayBackend(Protocol):
    """Publishes messages that the broker holds until they are due.

    ``publish_many`` returns once the broker confirmed every message (a message that is
    already due is published straight to its queue). Otherwise it raises ``PublishError``
    like :meth:`Publisher.publish_many`, whose ``unconfirmed_ids`` lists *every* message of
    the call that was not confirmed, sent or not: the outbox relay deletes the rows of all
    the others. An error without ids (or a ``TopologyError``) confirmed none.
    """

    @property
    def name(self) -> str:
        """``"plugin"`` or ``"tiers"``."""

    @property
    def max_delay_ms(self) -> int:
        """The longest delay this backend accepts."""

    def publish_many(
        self, messages: Sequence[DelayedMessage], *, now_ms: int | None = None
    ) -> None:
        """Publish ``messages`` with confirms; ``now_ms`` defaults to the clock."""

    def close(self) -> None:
        """Release connections the backend opened itself."""


class DelayDeclarer:
    """Declares delay topology and destination queues once per process, on a short connection.

    The publisher declares a work queue only before a publish to the app's exchange; a
    delayed message enters through a tier exchange, so its queue and the tiers are declared
    here first (idempotently) so that delays work on a fresh broker.

    Args:
        settings: Where to connect.
        topology: Names and arguments.
        declare: Declares one batch (injected by tests).
    """

    def __init__(
        self,
        settings: Settings,
        topology: Topology,
        declare: Callable[[Declarations, Sequence[HeaderBindingSpec]], None] | None = None,
    ) -> None:
        self._settings = settings
        self._topology = topology
        self._declare: Callable[..., None] = declare or (
            lambda d, b: declare_now(settings, d, b, broker=topology.broker)
        )
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, *, tiers: str | None, queues: Iterable[str]) -> bool:
        """Declare the ``tiers`` queue type's tiers and ``queues`` unless done already.

        Returns:
            Whether anything was declared (it took a round trip to the broker).

        Raises:
            BrokerConnectionError: the broker is unreachable.
            TopologyError: an object exists with other arguments.
        """
        wanted = [f"queue:{q}" for q in sorted(set(queues))]
        if tiers is not None:
            wanted.insert(0, f"tiers:{tiers}")
        with self._lock:
            missing = [key for key in wanted if key not in self._done]
            if not missing:
                return False
            bindings: tuple[HeaderBindingSpec, ...] = ()
            for key in missing:
                kind, _, name = key.partition(":")
                if kind == "tiers":
                    bindings = self._topology.delay_tiers(name).header_bindings

            def declarations() -> Declarations:
                # Built once connected: what a quorum queue gets depends on the broker's
                # version, learnt at connect (taskq.broker.quorum).
                parts = [self._topology.base()]
                for key in missing:
                    kind, _, name = key.partition(":")
                    if kind == "tiers":
                        parts.append(self._topology.delay_tiers(name).declarations)
                    else:
                        parts.append(self._topology.for_queue(name))
                return merge_declarations(parts)

            self._declare(declarations, bindings)
            self._done.update(missing)
            return True

    def forget(self) -> None:
        """Declare everything again next time (after a channel error: something was deleted)."""
        with self._lock:
            self._done.clear()


def merge_declarations(parts: Sequence[Declarations]) -> Declarations:
    return Declarations(
        exchanges=tuple(e for p in parts for e in p.exchanges),
        queues=tuple(q for p in parts for q in p.queues),
        bindings=tuple(b for p in parts for b in p.bindings),
        partition_checks=tuple(c for p in parts for c in p.partition_checks),
    )


def due_item(topology: Topology, message: DelayedMessage) -> PublishItem:
    """The ``(exchange, routing_key, wire)`` that publishes a due message to its queue now."""
    headers = delayed_headers(message.wire, message.eta_ms)
    return topology.exchange, message.queue, with_headers(message.wire, headers)


def with_unsent(exc: PublishError, unsent: Sequence[DelayedMessage]) -> PublishError:
    """``exc`` of one slice of a call, accounting also for its later slices, not sent."""
    if not unsent:
        return exc
    named = list(getattr(exc, "unconfirmed_ids", None) or [])
    attributes = {k: v for k, v in vars(exc).items() if k not in ("message", "unconfirmed_ids")}
    return PublishError(
        f"{exc.message}; the {len(unsent)} delayed message(s) after it in the same call were "
        "not sent",
        **attributes,
        unconfirmed_ids=named + [m.wire.message_id for m in unsent],
    )


#: A part of a call that the broker refused: the error, and the ids it left unconfirmed.
PartFailure = tuple[BrokerError, list[str | None]]


def attempt_part(
    publish: Callable[[], None], ids: list[str | None], failures: list[PartFailure]
) -> None:
    """Run one part's ``publish``; on a refusal, note the error and the ids it left unconfirmed.

    An error that names no ids (a ``TopologyError``, a failed connect) confirmed none of them.
    """
    try:
        publish()
    except (PublishError, TopologyError) as exc:
        failures.append((exc, list(getattr(exc, "unconfirmed_ids", None) or ids)))


def is_outage(exc: BrokerError) -> bool:
    """Whether ``exc`` says the broker cannot be reached (``OUTAGE_REASONS``), not a refusal."""
    return getattr(exc, "reason", None) in OUTAGE_REASONS


def combined_error(failures: Sequence[PartFailure]) -> PublishError:
    """One ``PublishError`` for the failed parts; an outage's reason wins over a refusal's."""
    reasons = [str(getattr(exc, "reason", "topology")) for exc, _ in failures]
    reason = next((r for r in reasons if r in OUTAGE_REASONS), reasons[0])
    unconfirmed = [i for _, ids in failures for i in ids]
    own: dict[str, str] = {}
    for exc, _ in failures:
        own.update(getattr(exc, "failures", None) or {})
    first = failures[0][0]
    return PublishError(
        " Also: ".join(exc.message for exc, _ in failures),
        url=getattr(first, "url", None),
        queue=getattr(first, "queue", None),
        reason=reason,
        unconfirmed_ids=unconfirmed,
        **({"failures": own} if own else {}),
    )
