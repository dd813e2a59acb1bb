"""Publisher: confirmed, mandatory, persistent publishing over one connection per process.

Confirms are awaited with a time limit and pipelined by
:class:`~taskq.broker._confirm_channel.ConfirmChannel` (pika's BlockingChannel can do
neither); one machinery confirms one message (``publish``) or keeps a window of many in
flight (``publish_many``).

Failure policy
--------------
Every retry sends the same message (same message id) again, until ``publish_timeout_s`` has
passed since the call began (``taskq.broker._publish_deadline``); with several broker nodes
a reconnect goes to the next node that answers.

=============================================  ==============================================
what happened                                  what follows
=============================================  ==============================================
connection lost (an open one: stale, cut,      reconnect (another node if this one is gone)
killed by a missed heartbeat, its node died)   and publish again, until ``publish_timeout_s``;
                                               then ``PublishError`` (``connection_lost``)
cannot connect on the first attempt            ``PublishError`` at once (``unreachable``): no
                                               node answers, an outage, not a failover
cannot connect while retrying                  retried until ``publish_timeout_s`` (a node
                                               coming back, or the next one answering)
no confirm within the timeout                  the connection is aborted (its confirm stream
                                               is no longer trustworthy) and the publish is
                                               retried on a new one, until
                                               ``publish_timeout_s``; not when the broker has
                                               blocked publishers (memory or disk alarm)
nack on a queue with ``x-overflow=reject-      ``PublishError``, no retry: the queue is full
publish`` (or ``reject-publish-dlx``)          and an immediate retry gets the same answer
any other nack (a quorum queue electing a      published again on a new channel (an old
leader, a failed queue process)                one may keep nacking after a leader died)
                                               after a short pause, until
                                               ``publish_timeout_s``
returned (mandatory, no route)                 ``PublishError``; cannot happen on the app's
                                               exchange, whose alternate exchange parks it
channel error (404 no such exchange...)        channel reopened, ``PublishError``, no retry
a message AMQP cannot encode (a float or       ``PublishError`` (``unencodable``) for that
tuple header, a name over 255 bytes...)        message, no retry; the others of a batch go on
queue exists with other arguments              ``TopologyError``
=============================================  ==============================================

A retry after a lost connection or a timeout may duplicate a message that the broker had in
fact taken: duplicates, never losses (the idempotency key makes the second run a no-op).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterable, Sequence

import pika
import pika.exceptions
import pika.spec

from taskq.broker._confirm_channel import ConfirmChannel, ConfirmTimeout
from taskq.broker._process_link import ProcessLink
from taskq.broker._publish_deadline import PublishDeadline
from taskq.broker._publish_errors import CHANNEL_ERROR_ADVICE, ENCODE_ERRORS, PublishErrors
from taskq.broker.connection import open_connection
from taskq.broker.topology import Topology
from taskq.errors import BrokerConnectionError, PublishError, TopologyError
from taskq.message import WireMessage
from taskq.settings import Settings, redact_url

logger = logging.getLogger(__name__)

# publish_many keeps at most this many messages unconfirmed: enough to keep the broker busy
# (benchmarks/publish.py: 64 -> 11k msg/s, 256 -> 17k, 1024 -> 18k, 4096 -> 17k), few enough
# to bound what is re-sent after a lost connection.
PUBLISH_WINDOW = 512
# ... and waits for every confirm once this many body bytes went out unconfirmed, so that a
# window of large messages cannot pile up in pika's output buffer.
PUBLISH_WINDOW_BYTES = 32 * 1024 * 1024

#: ``PublishError.reason`` values that mean the broker could not be reached or did not
#: answer: a fault of the broker or the network, whatever the messages were. Any other
#: reason (``nack``, ``returned``, ``unencodable``, ``channel_error``, ``topology``) is a
#: refusal of particular messages, queues or exchanges while the broker is up.
OUTAGE_REASONS = frozenset({"unreachable", "login_refused", "connection_lost", "timeout",
                            "blocked"})

_PERSISTENT = 2
_LIVE_PUBLISHERS: weakref.WeakSet[Publisher] = weakref.WeakSet()
_fork_hook_registered = False


def _forget_inherited_connections() -> None:
    for publisher in list(_LIVE_PUBLISHERS):
        publisher._forget_inherited()


class Publisher(ProcessLink[ConfirmChannel]):
    """Publishes encoded messages with publisher confirms, ``mandatory`` and persistence.

    One long-lived connection per process, opened on first use; safe to share between threads
    (a lock serialises publishes) and across ``fork`` (a child opens its own connection and
    never touches the parent's).

    Args:
        settings: Broker URL, confirm and connect timeouts.
        topology: What to declare: the base objects on connect, and a work queue before the
            first publish to it on the app's exchange.
        client_name: Shown in the management UI's connection list.
    """

    def __init__(
        self, settings: Settings, topology: Topology, *, client_name: str = "taskq publisher"
    ) -> None:
        global _fork_hook_registered
        self._settings = settings
        self._topology = topology
        self._client_name = client_name
        self._url = redact_url(settings.broker_url)
        self._timeout_s = settings.publish_confirm_timeout_s
        self._errors = PublishErrors(self._url, topology.exchange, self._timeout_s)
        super().__init__("publisher")
        _LIVE_PUBLISHERS.add(self)
        if not _fork_hook_registered:
            os.register_at_fork(after_in_child=_forget_inherited_connections)
            _fork_hook_registered = True

    def publish(
        self, wire: WireMessage, *, exchange: str, routing_key: str, task: str | None = None
    ) -> None:
        """Publish one message and wait for the broker's confirm.

        Args:
            wire: The encoded message.
            exchange: Usually the app's exchange; work queues on it are declared first.
            routing_key: The queue name on the app's exchange.
            task: Task name, for error messages.

        Raises:
            PublishError: not confirmed (see the module docstring for what is retried).
            TopologyError: the work queue exists with other arguments.
        """
        ids = (wire.message_id,)
        self._adopt_process()
        with self._lock:
            deadline = PublishDeadline(self._settings.publish_timeout_s)
            while True:
                link = self._link
                try:
                    if link is None or not link.channel.is_open:
                        link = self._connect(ids, task, exchange, routing_key, deadline)
                    if (exchange, routing_key) not in link.ready:
                        link.ensure_declared(self._topology, exchange, routing_key)
                    link.ids = ids
                    try:
                        link.send(0, exchange, routing_key, wire)
                    except ENCODE_ERRORS as exc:
                        if link.pending.get(link.tag) == 0:
                            raise  # it was sent and the write failed: not the message's fault
                        raise self._errors.unencodable(
                            exc, ids, task, exchange, routing_key
                        ) from exc
                    link.wait_settled(link.all_settled, self._timeout_s)
                except Exception as exc:
                    self._recover_or_raise(exc, deadline, ids, task, exchange, routing_key)
                    deadline.pause()
                    continue
                if link.nacked and not link.returned and self._may_retry_nack(
                    exchange, routing_key, deadline
                ):
                    link.nacked = []
                    self._fresh_channel(link)
                    deadline.pause()
                    continue
                if link.nacked or link.returned:
                    raise self._refused(link, ids, task, exchange, routing_key)
                return

    def publish_many(self, items: Iterable[tuple[str, str, WireMessage]]) -> None:
        """Publish ``(exchange, routing_key, wire)`` items with many confirms in flight.

        Up to :data:`PUBLISH_WINDOW` messages are unconfirmed at a time; the call returns
        when all are confirmed. After a lost connection (or a confirm timeout) the messages
        not yet confirmed are sent once more on a new connection.

        Raises:
            PublishError: some messages were not confirmed; ``unconfirmed_ids`` lists their
                message ids (all others are confirmed), ``reason`` says why. When only
                particular messages were refused (``nack``, ``returned``, ``unencodable``),
                ``failures`` maps each of their ids to its own reason.
            TopologyError: a work queue exists with other arguments (nothing was published).
        """
        batch = list(items)
        if not batch:
            return
        ids = [wire.message_id for _, _, wire in batch]
        self._adopt_process()
        with self._lock:
            deadline = PublishDeadline(self._settings.publish_timeout_s)
            todo = list(range(len(batch)))
            failed: dict[int, str] = {}
            while todo:
                settled: set[int] = set()
                try:
                    self._send_window(batch, ids, todo, settled, failed, deadline)
                    todo = []
                except Exception as exc:
                    todo = [i for i in todo if i not in settled]
                    lost = [ids[i] for i in (*todo, *failed)]
                    first = batch[todo[0]] if todo else batch[0]
                    # With nothing left to send, a broker failure only costs the connection
                    # (a fresh budget: the first retry is always allowed).
                    budget = deadline if todo else PublishDeadline(0.0)
                    self._recover_or_raise(exc, budget, lost, None, first[0], first[1])
                nacked = self._retryable_nacks(batch, failed, deadline)
                if nacked and self._link is not None:
                    self._fresh_channel(self._link)
                todo += nacked
                if todo:
                    deadline.pause()
            if failed:
                raise self._errors.batch_refused(failed, ids)

    def _retryable_nacks(
        self,
        batch: list[tuple[str, str, WireMessage]],
        failed: dict[int, str],
        deadline: PublishDeadline,
    ) -> list[int]:
        """Take the nacked messages that are worth sending again out of ``failed``."""
        again = sorted(
            index for index, why in failed.items()
            if why == "nack" and self._may_retry_nack(batch[index][0], batch[index][1], deadline)
        )
        for index in again:
            del failed[index]
        return again

    def _may_retry_nack(
        self, exchange: str, routing_key: str, deadline: PublishDeadline
    ) -> bool:
        """Whether a nack may be transient: a quorum queue electing a leader, not a full one.

        A queue declared with ``x-overflow=reject-publish`` nacks because it is full, and an
        immediate retry would get the same answer; any other nack is retried in time.
        """
        if deadline.expired():
            return False
        if exchange == self._topology.exchange:
            overflow = self._topology.options(routing_key).overflow
            if overflow in ("reject-publish", "reject-publish-dlx"):
                return False
        logger.warning(
            "RabbitMQ at %s nacked a message for %r (a quorum queue electing a new leader, "
            "or a failed queue process); publishing it again", self._url, routing_key,
        )
        return True

    # -- internals ---------------------------------------------------------------------------

    def _connect(
        self,
        ids: Sequence[str | None],
        task: str | None,
        exchange: str,
        routing_key: str,
        deadline: PublishDeadline,
    ) -> ConfirmChannel:
        old, self._link = self._link, None
        if old is not None:
            old.abort()
        try:
            connection = open_connection(
                self._settings, client_name=self._client_name, broker=self._topology.broker
            )
        except BrokerConnectionError as exc:
            login = isinstance(exc.__cause__, pika.exceptions.ProbableAuthenticationError)
            if deadline.retries and not login:
                # A failover in progress: the message is in doubt and another attempt (or a
                # node coming back) may still succeed before publish_timeout_s.
                raise _NodesUnreachable(exc.message) from exc
            raise self._errors.error(
                exc.message,
                "fix the credentials, then enqueue again"
                if login
                else "enqueue again once the broker answers; or enqueue through the outbox "
                "(apply_async(session=...)) so that the relay publishes it then",
                "login_refused" if login else "unreachable",
                ids,
                task,
                exchange,
                routing_key,
            ) from exc
        try:
            self._link = ConfirmChannel(connection, wait_s=self._settings.connect_timeout_s)
        except BaseException:
            ConfirmChannel.abort_connection(connection)
            raise
        logger.debug("publisher connected to %s (pid %s)", self._url, self._pid)
        return self._link

    def _recover_or_raise(
        self,
        exc: Exception,
        deadline: PublishDeadline,
        ids: Sequence[str | None],
        task: str | None,
        exchange: str,
        routing_key: str,
    ) -> None:
        """Decide after a failure: return to retry, or raise the error to report."""
        if isinstance(exc, (PublishError, TopologyError)):
            raise exc
        link = self._link
        if isinstance(exc, pika.exceptions.ChannelClosedByBroker) and (
            link is not None and link.connection.is_open
        ):
            self._reopen_channel(link)
            if _is_node_down(exc) and not deadline.expired():
                # A classic queue of a cluster node that is down: it comes back with its node.
                logger.warning("publishing to %s: %s; trying again until publish_timeout_s",
                               self._url, exc.reply_text)
                return
            raise self._errors.error(
                f"RabbitMQ at {self._url} closed the channel ({exc.reply_code} {exc.reply_text})",
                CHANNEL_ERROR_ADVICE.get(exc.reply_code, CHANNEL_ERROR_ADVICE[0]),
                "channel_error",
                ids,
                task,
                exchange,
                routing_key,
            ) from exc
        if not isinstance(exc, (pika.exceptions.AMQPError, OSError, ConfirmTimeout,
                                _NodesUnreachable)):
            # A bug, not a broker failure: let it show as it is, and drop the connection so
            # that no message buffered by the failed call goes out with a later one.
            self._drop_link()
            raise exc
        blocked = isinstance(exc, ConfirmTimeout) and exc.blocked
        self._drop_link()
        # The first retry is always made (a stale connection); later ones while time is left.
        if not blocked and (not deadline.retries or not deadline.expired()):
            logger.warning(
                "publishing to %s failed (%s: %s); publishing again (same message id) on "
                "a new connection", self._url, type(exc).__name__, exc,
            )
            return
        if isinstance(exc, _NodesUnreachable):
            exc = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        raise self._errors.failure(exc, ids, task, exchange, routing_key) from exc

    def _refused(
        self,
        link: ConfirmChannel,
        ids: Sequence[str | None],
        task: str | None,
        exchange: str,
        routing_key: str,
    ) -> PublishError:
        returned, link.returned = link.returned, {}
        link.nacked = []
        return self._errors.refused(returned, ids, task, exchange, routing_key)

    def _fresh_channel(self, link: ConfirmChannel) -> None:
        """Go on on a new channel after a nack.

        A channel's quorum-queue client keeps nacking after the queue's leader died (seen
        for 30 s and more on RabbitMQ 3.10: docs/cluster.md); a new channel finds the new
        leader at once.
        """
        old = link.channel
        self._reopen_channel(link)
        try:
            if old.is_open:
                old.close()
        except Exception:  # closing is best effort; the connection may be gone
            logger.debug("could not close the nacked channel", exc_info=True)

    def _reopen_channel(self, link: ConfirmChannel) -> None:
        try:
            link.open_channel(None)
        except Exception:  # the connection went too; the next publish reconnects
            logger.debug("could not reopen the publisher channel", exc_info=True)
            self._drop_link()  # ``link`` is this process's link: every caller passes it

    # -- publish_many ------------------------------------------------------------------------

    def _send_window(
        self,
        batch: list[tuple[str, str, WireMessage]],
        ids: list[str | None],
        todo: list[int],
        settled: set[int],
        failed: dict[int, str],
        deadline: PublishDeadline,
    ) -> None:
        """Send ``todo`` with a window of confirms; fill ``settled`` and ``failed``."""
        link = self._link
        if link is None or not link.is_usable:
            first = batch[todo[0]]
            unsent = [ids[i] for i in (*todo, *failed)]
            link = self._connect(unsent, None, first[0], first[1], deadline)
        for exchange, routing_key in dict.fromkeys((batch[i][0], batch[i][1]) for i in todo):
            if (exchange, routing_key) not in link.ready:
                link.ensure_declared(self._topology, exchange, routing_key)
        link.ids = ids
        pending = link.pending
        window = PUBLISH_WINDOW
        low_water = window // 2
        timeout_s = self._timeout_s
        sent = unconfirmed_bytes = 0
        try:
            for index in todo:
                exchange, routing_key, wire = batch[index]
                try:
                    link.send(index, exchange, routing_key, wire)
                except ENCODE_ERRORS as exc:
                    if link.pending.get(link.tag) == index:
                        raise  # it was sent and the write failed: not the message's fault
                    # Nothing of it was buffered: refuse this one, send the others.
                    failed[index] = f"cannot be encoded as AMQP ({type(exc).__name__}: {exc})"
                    sent += 1
                    continue
                sent += 1
                unconfirmed_bytes += len(wire.body)
                if unconfirmed_bytes > PUBLISH_WINDOW_BYTES:
                    link.wait_settled(link.all_settled, timeout_s)
                    unconfirmed_bytes = 0
                elif len(pending) >= window:
                    # Wait down to half a window, not one slot: one I/O-loop wait per half
                    # window instead of one per message once the window is full.
                    link.wait_settled(lambda: len(pending) <= low_water, timeout_s)
            link.wait_settled(link.all_settled, timeout_s)
        finally:
            # Whatever is still pending has an unknown fate: sent again, or reported.
            settled.update(set(todo[:sent]).difference(pending.values()))
            failed.update(dict.fromkeys(link.nacked, "nack"))
            for index, (code, text) in link.returned.items():
                failed[index] = f"returned {code} {text}"
            link.nacked.clear()
            link.returned.clear()

def _is_node_down(exc: pika.exceptions.ChannelClosedByBroker) -> bool:
    """RabbitMQ's 404 for a durable classic queue whose node is down (a cluster failover)."""
    return exc.reply_code == 404 and "down or inaccessible" in str(exc.reply_text)


class _NodesUnreachable(Exception):
    """No node answered while a publish was being retried (a failover, or an outage)."""


def _properties(wire: WireMessage) -> pika.BasicProperties:
    """AMQP properties of ``wire`` (docs/PROTOCOL.md): always persistent."""
    return pika.BasicProperties(
        content_type=wire.content_type,
        delivery_mode=_PERSISTENT,
        priority=wire.priority,
        timestamp=wire.timestamp,
        app_id=wire.app_id,
        message_id=wire.message_id,
        headers=wire.headers or None,
    )
