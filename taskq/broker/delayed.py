"""Broker side of the delay backends: plugin probe, one-off declares, non-mandatory publishing.

Used by :mod:`taskq.delay`, which decides *how* a message waits; this module only talks AMQP.

- :func:`probe_delayed_message_plugin` asks the broker whether
  ``rabbitmq_delayed_message_exchange`` is enabled. An exchange of an unknown type is a
  *connection* error in AMQP 0-9-1 (``503 COMMAND_INVALID - unknown exchange type``): the
  broker closes the whole connection, so the probe runs on a throwaway connection.
- :func:`declare_now` declares on a short connection of its own. The
  :class:`~taskq.broker.publisher.Publisher` declares a work queue only before a publish to
  the app's exchange, and a delayed message enters through another exchange.
- :class:`PluginPublisher` publishes to the plugin's exchange with confirms but *without*
  ``mandatory``: the plugin returns every delayed message published with ``mandatory=True``
  at once as unroutable (312 NO_ROUTE) and still delivers it later, so the
  :class:`~taskq.broker.publisher.Publisher` (always mandatory) would report a failure for
  a message that was taken, and a retry would duplicate it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

import pika
import pika.exceptions

from taskq.broker._confirm_channel import ConfirmChannel, ConfirmTimeout
from taskq.broker._process_link import ProcessLink
from taskq.broker._publish_deadline import PublishDeadline
from taskq.broker._publish_errors import ENCODE_ERRORS
from taskq.broker.connection import declare, open_connection
from taskq.broker.topology import Declarations, HeaderBindingSpec
from taskq.broker.versions import BrokerFacts
from taskq.errors import BrokerConnectionError, PublishError
from taskq.message import TASK, WireMessage
from taskq.settings import Settings, redact_url

logger = logging.getLogger(__name__)

PublishItem = tuple[str, str, WireMessage]

# RabbitMQ's answer to exchange.declare with a type no plugin provides (a connection error).
_COMMAND_INVALID = 503
_PROBE_TYPE = "x-delayed-message"


class _ExpectedProbeClose(logging.Filter):
    """Drops pika's ERROR about the connection the probe expects the broker to close.

    pika logs every broker-initiated close at ERROR ("Unexpected connection close
    detected"); for the probe on a broker without the plugin that close *is* the answer.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        error = args[0] if args else None
        return not (
            isinstance(error, pika.exceptions.ConnectionClosedByBroker)
            and error.reply_code == _COMMAND_INVALID
            and _PROBE_TYPE in str(error.reply_text)
        )


_probe_filter = _ExpectedProbeClose()


def probe_delayed_message_plugin(
    settings: Settings, broker: BrokerFacts | None = None
) -> bool | None:
    """Whether the broker has ``rabbitmq_delayed_message_exchange`` enabled.

    Declares (and deletes) a throwaway ``x-delayed-message`` exchange on a connection of its
    own, because an unknown exchange type closes the connection it was declared on.

    Returns:
        ``True`` (enabled), ``False`` (the broker does not know the exchange type) or
        ``None`` (the broker refused for another reason, e.g. no configure permission).

    On a broker that cannot run the plugin (RabbitMQ 4.3+, read at connect into ``broker``)
    nothing is declared: ``False``.

    Raises:
        BrokerConnectionError: the broker is unreachable.
    """
    broker = broker or BrokerFacts()
    connection = open_connection(settings, client_name="taskq delay probe", broker=broker)
    if not broker.known.may_have_delay_plugin:
        _close_quietly(connection)
        return False
    name = f"{settings.namespace}.delay-probe.{uuid.uuid4().hex[:12]}"
    # Installed once, on first use (never at import); adding the same filter is a no-op.
    logging.getLogger("pika.adapters.blocking_connection").addFilter(_probe_filter)
    try:
        channel = connection.channel()
        channel.exchange_declare(
            name,
            exchange_type=_PROBE_TYPE,
            durable=False,
            auto_delete=True,
            arguments={"x-delayed-type": "direct"},
        )
        channel.exchange_delete(name)
        return True
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == _COMMAND_INVALID:
            return False
        logger.warning("delay plugin probe: the broker closed the connection: %s", exc)
        return None
    except pika.exceptions.ChannelClosedByBroker as exc:
        logger.warning("delay plugin probe: the broker refused the declare: %s", exc)
        return None
    except pika.exceptions.AMQPError as exc:
        raise BrokerConnectionError(
            f"lost the connection to RabbitMQ at {redact_url(settings.broker_url)} while "
            f"probing for the delayed-message plugin ({type(exc).__name__}: {exc})",
            url=redact_url(settings.broker_url),
        ) from exc
    finally:
        _close_quietly(connection)


def declare_now(
    settings: Settings,
    declarations: Declarations | Callable[[], Declarations],
    header_bindings: Sequence[HeaderBindingSpec] = (),
    *,
    broker: BrokerFacts | None = None,
) -> None:
    """Declare ``declarations`` and ``header_bindings`` idempotently on a short connection.

    ``declarations`` may be a function called once connected, after ``broker`` learnt the
    broker's version (what is declared depends on it: :mod:`taskq.broker.quorum`).

    Raises:
        BrokerConnectionError: the broker is unreachable or the connection was lost.
        TopologyError: an object exists with other arguments.
    """
    connection = open_connection(settings, client_name="taskq declare", broker=broker)
    try:
        if callable(declarations):
            declarations = declarations()
        channel = declare(connection.channel(), declarations)
        for binding in header_bindings:
            if binding.to_exchange:
                channel.exchange_bind(
                    binding.destination, binding.source, arguments=binding.arguments
                )
            else:
                channel.queue_bind(binding.destination, binding.source, arguments=binding.arguments)
    except pika.exceptions.AMQPError as exc:
        raise BrokerConnectionError(
            f"declaring delay topology on RabbitMQ at {redact_url(settings.broker_url)} "
            f"failed ({type(exc).__name__}: {exc})",
            url=redact_url(settings.broker_url),
        ) from exc
    finally:
        _close_quietly(connection)


def _close_quietly(connection: pika.BlockingConnection) -> None:
    try:
        if connection.is_open:
            connection.close()
    except Exception:  # closing is best effort: the broker may have closed it first
        logger.debug("error closing a short-lived broker connection", exc_info=True)


def _queue_part(declarations: Declarations, queue: str) -> Declarations:
    """The declaration of ``queue`` and of its bindings, without exchanges or other queues."""
    return Declarations(
        queues=tuple(q for q in declarations.queues if q.name == queue),
        bindings=tuple(b for b in declarations.bindings if b.queue == queue),
    )


class _NonMandatoryChannel(ConfirmChannel):
    """A confirm channel whose publishes are not ``mandatory`` (see the module docstring)."""

    mandatory = False


class PluginPublisher(ProcessLink[_NonMandatoryChannel]):
    """Confirmed, persistent, non-mandatory publishing to the delayed-message exchange.

    One connection per process, opened on first use; thread-safe; fork-safe like
    :class:`~taskq.broker.publisher.Publisher`. Before the first publish with a routing key on
    a connection it declares what ``declarations_for(routing_key)`` returns (the delayed
    exchange, the work queue and their binding), and before every later one the work queue
    and its bindings again (about 1 ms): the plugin routes a message only when it is due and
    tells a non-mandatory publisher nothing, so a queue deleted, or re-created without its
    binding to the delayed exchange, would otherwise drop every later delayed message
    silently. A lost connection, a confirm timeout or a nack is retried (same message ids,
    another node if need be) until ``publish_timeout_s``, as by the Publisher (a duplicate
    is possible, a loss is not).

    Args:
        settings: Broker URL and timeouts.
        declarations_for: What must exist before publishing with a routing key.
        client_name: Shown in the management UI's connection list.
    """

    def __init__(
        self,
        settings: Settings,
        declarations_for: Callable[[str], Declarations],
        *,
        client_name: str = "taskq delayed publisher",
    ) -> None:
        self._settings = settings
        self._declarations_for = declarations_for
        self._client_name = client_name
        self._url = redact_url(settings.broker_url)
        super().__init__("delayed publisher")
        # Keys prepare() has just declared: the publish that follows need not again.
        self._prepared: set[str] = set()

    def publish_many(self, items: Sequence[PublishItem]) -> None:
        """Publish ``(exchange, routing_key, wire)`` items and wait for every confirm.

        Raises:
            PublishError: not confirmed; ``reason`` is ``nack``, ``channel_error``,
                ``unreachable`` or ``connection_lost``; ``unconfirmed_ids`` lists message ids.
            TopologyError: the work queue or the exchange exists with other arguments.
        """
        if not items:
            return
        ids = [wire.message_id for _, _, wire in items]
        self._adopt_process()
        with self._lock:
            deadline = PublishDeadline(self._settings.publish_timeout_s)
            todo = list(range(len(items)))
            unencodable: dict[int, str] = {}  # index: why AMQP cannot encode it (never sent)
            while True:
                try:
                    link = self._ready_link({items[i][1] for i in todo}, deadline)
                    link.ids = ids
                    todo = self._send_encodable(link, items, todo, unencodable)
                    link.wait_settled(link.all_settled, self._settings.publish_confirm_timeout_s)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    self._drop_link()
                    raise self._error(f"the broker closed the channel ({exc})", "channel_error",
                                      ids) from exc
                except (pika.exceptions.AMQPError, OSError, ConfirmTimeout) as exc:
                    self._drop_link()
                    blocked = isinstance(exc, ConfirmTimeout) and exc.blocked
                    # The first retry always; later ones while publish_timeout_s lasts.
                    if not blocked and (not deadline.retries or not deadline.expired()):
                        logger.warning("delayed publish to %s failed (%s); publishing again "
                                       "(same message ids)", self._url, exc)
                        deadline.pause()
                        continue
                    raise self._error(f"{type(exc).__name__}: {exc}", "connection_lost",
                                      ids) from exc
                nacked, link.nacked = sorted(link.nacked), []
                if nacked and not deadline.expired():
                    # A quorum queue electing a leader nacks for a moment (docs/cluster.md).
                    logger.warning("RabbitMQ at %s nacked %d delayed message(s); publishing "
                                   "them again", self._url, len(nacked))
                    todo = nacked
                    deadline.pause()
                    continue
                if nacked:
                    raise self._error("nacked by the broker", "nack", [ids[i] for i in nacked])
                if unencodable:
                    raise self._unencodable(items, unencodable)
                return

    @staticmethod
    def _send_encodable(
        link: _NonMandatoryChannel,
        items: Sequence[PublishItem],
        todo: list[int],
        unencodable: dict[int, str],
    ) -> list[int]:
        """Send ``todo``; a message AMQP cannot encode is noted in ``unencodable``, not sent.

        Returns the indexes sent. A failure after a message was encoded (the write) is a
        connection problem and propagates.
        """
        sent = []
        for index in todo:
            exchange, key, wire = items[index]
            tag = link.tag
            try:
                link.send(index, exchange, key, wire)
            except ENCODE_ERRORS as exc:
                if link.tag != tag:
                    raise  # encoded and handed on: the write failed, not the message
                unencodable[index] = f"{type(exc).__name__}: {exc}"
                continue
            sent.append(index)
        return sent

    def _unencodable(self, items: Sequence[PublishItem], failed: dict[int, str]) -> PublishError:
        """Messages of a batch AMQP cannot encode (the others were confirmed)."""
        described = []
        for index, why in sorted(failed.items()):
            _, queue, wire = items[index]
            task = wire.headers.get(TASK) or "?"
            described.append(f"message {wire.message_id} of task {task!r} for queue "
                             f"{queue!r}: {why}")
        return PublishError(
            f"{len(failed)} delayed message(s) cannot be encoded as AMQP and were not "
            f"published to RabbitMQ at {self._url} (not retried; the others were "
            f"confirmed): {'; '.join(described[:20])}. Remove or convert the header AMQP "
            "has no type for (float, tuple, a name over 255 bytes, an int beyond 64 bits)",
            url=self._url,
            reason="unencodable",
            unconfirmed_ids=[items[i][2].message_id for i in sorted(failed)],
            failures={str(items[i][2].message_id): why for i, why in failed.items()},
        )

    def prepare(self, routing_keys: set[str]) -> None:
        """Connect and declare for ``routing_keys`` now (publish_many would do it first).

        Raises:
            PublishError: the broker is unreachable.
            TopologyError: the work queue or the exchange exists with other arguments.
        """
        self._adopt_process()
        with self._lock:
            try:
                self._ready_link(routing_keys, None)
                self._prepared = set(routing_keys)
            except pika.exceptions.AMQPError as exc:
                self._drop_link()
                raise self._error(f"{type(exc).__name__}: {exc}", "connection_lost", []) from exc

    def _ready_link(
        self,
        routing_keys: set[str],
        deadline: PublishDeadline | None,
    ) -> _NonMandatoryChannel:
        link = self._link
        if link is None or not link.is_usable:
            self._drop_link()
            try:
                connection = open_connection(self._settings, client_name=self._client_name)
            except BrokerConnectionError as exc:
                if deadline is not None and deadline.retries:
                    # Retrying after a lost connection: a node may answer again in time.
                    raise pika.exceptions.AMQPConnectionError(exc.message) from exc
                raise PublishError(
                    f"{exc.message}; the delayed message was not published",
                    url=self._url,
                    reason="unreachable",
                ) from exc
            try:
                link = _NonMandatoryChannel(connection, wait_s=self._settings.connect_timeout_s)
            except BaseException:
                ConfirmChannel.abort_connection(connection)
                raise
            self._link = link
        prepared, self._prepared = self._prepared, set()
        for key in sorted(routing_keys):
            if ("", key) not in link.ready:
                declare(link.channel, self._declarations_for(key))
                link.ready.add(("", key))
            elif key not in prepared:
                declare(link.channel, _queue_part(self._declarations_for(key), key))
        return link

    def _error(self, what: str, reason: str, ids: Sequence[str | None]) -> PublishError:
        shown = ", ".join(str(i) for i in ids[:20]) + (" ..." if len(ids) > 20 else "")
        return PublishError(
            f"delayed message(s) {shown} were not confirmed by RabbitMQ at {self._url} "
            f"({what}); enqueue again, or through the outbox so that the relay retries",
            url=self._url,
            reason=reason,
            unconfirmed_ids=list(ids),
            what=f"delayed message(s) {shown} were not confirmed by RabbitMQ at {self._url} "
            f"({what})",
        )
