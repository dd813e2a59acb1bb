"""The worker's consumer: an I/O thread owns the connection, the main thread runs tasks.

pika's ``BlockingConnection`` is not thread-safe and answers heartbeats only while someone
calls into it. So one I/O thread per worker process owns the connection: it consumes with
manual acks and ``basic_qos(prefetch_count)``, puts each :class:`Delivery` on a hand-off queue
and otherwise sits in ``process_data_events``, which keeps heartbeats flowing however long a
task runs. The main thread takes deliveries off that queue, executes them and hands the ack
back with ``add_callback_threadsafe`` -- the one thread-safe call pika offers.

Acks are coalesced: the main thread finishes deliveries strictly in the order they arrived,
so when several acks are waiting the I/O thread sends one ``basic_ack(tag, multiple=True)``
for the highest tag. Rejects are sent in order between them, so a multiple ack never covers
a delivery that was rejected.

When the connection is lost, the broker closes the channel (a delivery unacked past its
``consumer_timeout`` before RabbitMQ 4.3, a 406) or cancels a consumer (4.3's consumer
timeout on quorum queues, a deleted queue: :mod:`taskq.broker.cancels` asks the broker
which, and a timeout is reported to ``on_timed_out``), the I/O thread reconnects with capped
exponential backoff plus jitter, re-declares the topology and consumes again, even while the
main thread runs a task. Anything else ends the process, via the main thread.

Each channel has a *generation*. The I/O thread moves the generation on the moment it sees
its channel or connection die -- not only once a new one is up: the broker has already put
every unacked message of that channel back (other consumers may be running them), so the
deliveries still waiting in the hand-off queue are dropped unexecuted by :meth:`get`, and a
late ack for one is a logged no-op (delivery tags belong to a channel; on the new one the
same tag would settle another message).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from taskq.broker._losses import (
    close_quietly,
    closing_reason,
    drop_connection,
    log_loss,
    nothing,
    reconnect_delay_s,
    reject,
    wait_stamping,
)
from taskq.broker.cancels import CancelWatch
from taskq.broker.connection import declare, open_connection
from taskq.broker.delivery import ACK, REQUEUE, Delivery, received_message
from taskq.broker.topology import Topology
from taskq.errors import BrokerConnectionError, ConfigurationError, PublishError, TopologyError
from taskq.settings import Settings

logger = logging.getLogger(__name__)

# How often the I/O thread looks at flags set by signal handlers (stop consuming).
_TICK_S = 0.5
# Errors after which reconnecting can help: the connection or the channel went away.
_RECOVERABLE = (pika.exceptions.AMQPError, BrokerConnectionError, OSError)


class Subscription:
    """Consumes work queues on a connection owned by a background I/O thread.

    Args:
        settings: Broker URL, heartbeat, prefetch and reconnect settings.
        topology: What to declare before consuming (base objects and each queue).
        queues: The work queues to consume.
        client_name: Connection name shown in RabbitMQ's management UI.
        delay_backend: Returns the app's delay backend kind (``"plugin"`` or ``"tiers"``,
            e.g. ``lambda: app.delay_backend_name``), asked at each connect, after the
            connection is up. With the plugin each queue is declared with its binding to the
            delayed exchange (:meth:`Topology.for_queue`), so a queue the worker re-creates
            still receives the delayed messages due for it. ``None``: tiers.
        standby: Queues consumed only ``standby_delay_s`` after ``queues`` on each channel:
            partitions of ordered queues that other processes registered for first (single
            active consumer activates the first registered consumer; see
            :mod:`taskq.ordering.spread`).
        standby_delay_s: See ``standby``.
        consumer_timeout_s: The ``x-consumer-timeout`` its quorum consumers ask for (4.3+):
            see :class:`~taskq.broker.cancels.CancelWatch` and ``cancels.on_timed_out``.
    """

    def __init__(
        self,
        settings: Settings,
        topology: Topology,
        queues: Sequence[str],
        *,
        client_name: str,
        delay_backend: Callable[[], str] | None = None,
        standby: Sequence[str] = (),
        standby_delay_s: float = 0.0,
        consumer_timeout_s: float | None = None,
    ) -> None:
        self._settings = settings
        self.cancels = CancelWatch(topology, consumer_timeout_s)
        self._standby, self._standby_delay_s = tuple(standby), standby_delay_s
        self._kept: set[str] = set()  # consumer tags of ordered partitions (see _consume)
        self._delay_backend = delay_backend
        self._topology = topology
        self._queues = tuple(queues)
        self._client_name = client_name
        self._deliveries: queue.SimpleQueue[Delivery | None] = queue.SimpleQueue()
        self._pending: deque[tuple[Delivery, int]] = deque()
        self._flush_scheduled = False
        # Settlements queued by the main thread, and those the I/O thread has written to the
        # socket (or dropped as stale): see wait_sent().
        self._settled = self._sent = 0
        self._sent_changed = threading.Condition()
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        # Moves on at each new channel and again as soon as its loss is seen (module docstring).
        self._generation = 0
        self._connections = 0
        self._stopping = False
        self._consuming_wanted = True
        self._wake = threading.Event()
        self._progress: Any = None  # see watch_progress()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="taskq-io", daemon=True)

    @property
    def is_connected(self) -> bool:
        """Whether a channel is open and consuming (read from any thread; for health)."""
        channel = self._channel
        return channel is not None and channel.is_open and not self.cancels.cancelled

    @property
    def generation(self) -> int:
        """Number of the current channel; deliveries of other generations are stale.

        It changes as soon as the I/O thread sees the channel or its connection die, so a
        delivery of a lost channel is stale from that moment, during the reconnect backoff.
        """
        return self._generation

    # -- main thread ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the I/O thread; it connects (retrying with backoff) and starts consuming."""
        self._thread.start()

    def get(self, timeout_s: float) -> Delivery | None:
        """Return the next delivery, or ``None`` after ``timeout_s`` without one.

        Deliveries of a channel that died meanwhile are dropped here, unexecuted (the broker
        redelivers them).

        Raises:
            TopologyError: the queues cannot be declared as configured (fatal).
            ConfigurationError: the delay backend cannot be chosen as configured (fatal).
            BrokerError: the I/O thread stopped on an unexpected error.
        """
        deadline_at = 0.0
        while True:
            try:
                item = self._deliveries.get(timeout=timeout_s)
            except queue.Empty:
                item = None
            if item is None:
                if self._failure is not None:
                    raise self._failure
                return None
            if item.generation == self._generation:
                return item
            self._drop_stale(item)
            # Wait out what is left of timeout_s for a live one.
            now = time.monotonic()
            deadline_at = deadline_at or now + timeout_s
            timeout_s = max(0.0, deadline_at - now)

    def get_ready(self, max_n: int) -> list[Delivery]:
        """Up to ``max_n`` live deliveries already received, without waiting (may be empty)."""
        ready: list[Delivery] = []
        get = self._deliveries.get_nowait
        while len(ready) < max_n:
            try:
                item = get()
            except queue.Empty:
                break
            if item is None:
                continue
            if item.generation == self._generation:
                ready.append(item)
            else:
                self._drop_stale(item)
        return ready

    def _drop_stale(self, delivery: Delivery) -> None:
        logger.info("message %s from %s dropped unexecuted: the channel it came on is gone "
                    "and the broker has put it back in the queue",
                    delivery.message.message_id, delivery.queue)

    def settle(self, delivery: Delivery, action: int) -> None:
        """Queue an ack or reject for ``delivery`` and wake the I/O thread to send it."""
        self._pending.append((delivery, action))
        self._settled += 1
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        connection = self._connection
        try:
            if connection is None:
                raise pika.exceptions.ConnectionWrongStateError("not connected")
            connection.add_callback_threadsafe(self._flush)
        except pika.exceptions.ConnectionWrongStateError:
            # The I/O thread is reconnecting; it flushes (and drops as stale) what is
            # pending once the new connection is up.
            self._flush_scheduled = False

    def wait_sent(self, timeout_s: float) -> bool:
        """Wait until every ack and reject queued so far is written to the broker's socket.

        Acks are sent by the I/O thread a moment after :meth:`settle`; a process that dies in
        that moment loses them, and the broker redelivers the message. Before a task body
        that may crash the process runs, the loop waits here after a settlement that a
        redelivery would repeat (a dead letter, a retry). Once written, the kernel sends the
        bytes even if the process dies. Settlements of a channel that is gone count as done
        (the broker redelivers those anyway).

        Returns:
            Whether they were all sent within ``timeout_s``.
        """
        target = self._settled
        with self._sent_changed:
            return self._sent_changed.wait_for(lambda: self._sent >= target, timeout_s)

    def watch_progress(self, stamp: Any) -> None:
        """Have the I/O thread write the monotonic time to ``stamp.value`` as it works.

        Each tick while connected (about every 0.5 s, however long a task runs), before
        each connect attempt and every second of a reconnect backoff. ``stamp`` is a shared
        double (the process slot's), so the supervisor can tell a consumer that stalled or
        whose thread is gone from one that is busy or reconnecting.
        """
        self._progress = stamp
        self._stamp()

    def _stamp(self) -> None:
        if self._progress is not None:
            self._progress.value = time.monotonic()

    def stop_consuming(self) -> None:
        """Ask the broker to stop sending (``basic_cancel``, within ~0.5 s), except for
        ordered partitions: their consumers end with the channel (see ``_consume``).

        Only sets a flag, so a signal handler may call it: the I/O thread's periodic tick
        sends the cancel. Deliveries already received stay unacked until settled or closed.
        """
        self._consuming_wanted = False

    def close(self, timeout_s: float = 5.0) -> None:
        """Send pending acks, close the connection and stop the I/O thread.

        Unacked deliveries (prefetched, never started) return to their queue when the
        channel closes.
        """
        self._stopping = True
        self._consuming_wanted = False
        self._wake.set()
        self._call_in_io_thread(nothing)
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("broker I/O thread did not stop within %.1fs", timeout_s)

    def _call_in_io_thread(self, callback: Any) -> None:
        connection = self._connection
        if connection is None:
            return
        try:
            connection.add_callback_threadsafe(callback)
        except pika.exceptions.ConnectionWrongStateError:
            pass  # closed: the I/O thread notices on its own

    # -- I/O thread ------------------------------------------------------------------------

    def _run(self) -> None:
        # Whatever ends this thread other than a stop must reach the main thread (get()
        # raises it and the process exits, to be replaced): a process whose I/O thread is gone
        # would otherwise live on connected to nothing.
        try:
            self._serve_until_stopped()
            self._shutdown()
        except (TopologyError, ConfigurationError) as exc:
            self._fail(exc)
        except BaseException as exc:  # a bug: let the main thread end the process
            logger.exception("broker I/O thread failed; the worker process exits and is "
                             "replaced (its unacked messages return to their queues)")
            self._fail(exc)

    def _serve_until_stopped(self) -> None:
        """Connect, consume, and after each loss reconnect with backoff, until stopped."""
        attempt = 0
        while not self._stopping:
            try:
                self._stamp()
                self._connect(attempt)
                attempt = 0
                self._serve()
            except (TopologyError, ConfigurationError):
                raise
            except _RECOVERABLE as exc:
                self._discard_connection()
                if self._is_stopping():  # close() may have been called meanwhile
                    break
                delay_s = reconnect_delay_s(attempt, self._settings.reconnect_max_delay_s)
                attempt += 1
                log_loss(exc, delay_s, attempt)
                wait_stamping(self._wake, delay_s, self._stamp)

    def _is_stopping(self) -> bool:
        return self._stopping
    def _connect(self, attempt: int) -> None:
        connection = open_connection(
            self._settings, client_name=self._client_name, broker=self._topology.broker
        )
        try:
            channel = self._prepare_channel(connection)
        except BaseException:
            close_quietly(connection)
            raise
        # Order matters (see settle()): publish the new connection, bump the generation,
        # then clear the flush flag and drain what the main thread queued meanwhile.
        self._connection, self._channel = connection, channel
        self._generation += 1
        self._connections += 1
        self.cancels.cancelled = False
        self._flush_scheduled = False
        self._flush()
        if self._consuming_wanted:
            for name in self._queues:
                self._consume(channel, name)
            if self._standby:
                connection.call_later(
                    self._standby_delay_s, functools.partial(self._consume_standby, channel)
                )
        connection.call_later(_TICK_S, self._tick)
        log = logger.warning if attempt or self._connections > 1 else logger.info
        params = connection._impl.params  # the node that answered (broker_url may name several)
        log(
            "connected to the broker (node %s:%s); consuming %s with prefetch %d",
            params.host, params.port, ", ".join(self._queues), self._settings.prefetch_count,
        )

    def _prepare_channel(self, connection: pika.BlockingConnection) -> BlockingChannel:
        channel = connection.channel()
        channel = declare(channel, self._topology.base())
        delayed = self._uses_delay_plugin()
        declared_as = self._topology.declared_as  # an ordered queue once, not per partition
        for name in dict.fromkeys(declared_as(n) for n in (*self._queues, *self._standby)):
            channel = declare(channel, self._topology.for_queue(name, delayed=delayed))
        channel.basic_qos(prefetch_count=self._settings.prefetch_count)
        channel.add_on_cancel_callback(self.cancels.on_cancel)
        return channel

    def _consume_standby(self, channel: BlockingChannel) -> None:
        live = self._channel  # a channel given up meanwhile: the next one schedules its own
        if live is channel and live is not None and live.is_open and self._consuming_wanted:
            for name in self._standby:
                self._consume(live, name)
            logger.info("registered as standby consumer of %s", ", ".join(self._standby))

    def _consume(self, channel: BlockingChannel, name: str) -> None:
        tag = channel.basic_consume(
            name, functools.partial(self._on_message, name),
            arguments=self.cancels.arguments(name),
        )
        self.cancels.consumed(tag, name)
        if self._topology.ordered_parent(name) is not None:
            # Never cancelled on stop: the standby would start on the next message while this
            # process still holds earlier ones; closing the channel returns those first.
            self._kept.add(tag)

    def _uses_delay_plugin(self) -> bool:
        if self._delay_backend is None:
            return False
        try:
            return self._delay_backend() == "plugin"
        except PublishError as exc:  # the broker went away while the backend was chosen
            raise BrokerConnectionError(exc.message) from exc

    def _serve(self) -> None:
        connection, channel = self._connection, self._channel
        if connection is None or channel is None:
            return
        while not self._stopping:
            # Returns once callbacks ran (deliveries, acks handed over, wake-ups); heartbeats
            # are answered inside, so a long task never starves them.
            connection.process_data_events(time_limit=None)
            if not channel.is_open:
                # pika ends process_data_events when the broker closes a channel (a
                # consumer_timeout, a 406) but raises nothing while the connection is up.
                raise closing_reason(channel)
            if self.cancels.cancelled and self._consuming_wanted:
                # Reported before the generation moves on (in _discard_connection).
                raise self.cancels.explain(connection, self._generation)

    def _on_message(
        self,
        queue_name: str,
        channel: BlockingChannel,
        method: Any,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        if channel is not self._channel:
            return  # a late delivery of a channel given up: its generation is already gone
        self._deliveries.put(
            Delivery(
                received_message(properties, body), queue_name, method.redelivered,
                method.delivery_tag, self._generation, self,
            )
        )

    def _flush(self) -> None:
        # Clear the flag first: an action queued after this line schedules a new flush.
        self._flush_scheduled = False
        pending, channel, generation = self._pending, self._channel, self._generation
        ack_up_to = 0
        done = 0
        try:
            while pending:
                delivery, action = pending.popleft()
                done += 1
                if delivery.generation != generation or channel is None:
                    logger.warning(
                        "cannot settle message %s: its channel is gone; the broker "
                        "redelivers it", delivery.message.message_id,
                    )
                elif action == ACK:
                    ack_up_to = delivery.delivery_tag
                else:
                    if ack_up_to:
                        channel.basic_ack(ack_up_to, multiple=True)
                        ack_up_to = 0
                    reject(channel, delivery.delivery_tag, requeue=action == REQUEUE)
            if ack_up_to and channel is not None:
                channel.basic_ack(ack_up_to, multiple=True)  # BlockingChannel writes it now
        finally:
            # Counted even when the channel failed: those settlements are lost with it and
            # the broker redelivers their messages; a waiter must not wait for them.
            with self._sent_changed:
                self._sent += done
                self._sent_changed.notify_all()

    def _tick(self) -> None:
        self._stamp()
        channel, connection = self._channel, self._connection
        if channel is None or connection is None or not channel.is_open:
            return
        if not self._consuming_wanted:
            for tag in set(channel.consumer_tags) - self._kept:
                # pika requeues deliveries that arrive between cancel and cancel-ok.
                channel.basic_cancel(tag)
        connection.call_later(_TICK_S, self._tick)

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._deliveries.put(None)  # wake the main thread so that get() raises
        try:
            self._discard_connection()
        except BaseException:  # noqa: BLE001 - the failure is on its way to the main thread
            logger.debug("error discarding the connection of a failed I/O thread",
                         exc_info=True)

    def _shutdown(self) -> None:
        connection = self._connection
        if connection is not None and connection.is_open:
            try:
                self._flush()
                if self._kept:
                    drop_connection(connection)  # ordered partitions: see drop_connection
                else:
                    connection.close()
            except _RECOVERABLE:
                logger.debug("error closing the broker connection", exc_info=True)
        self._channel = None

    def _discard_connection(self) -> None:
        # First, before anything that may block: from here on the main thread drops the
        # deliveries of this channel instead of running them (the broker requeued them).
        if self._channel is not None:
            self._generation += 1
        connection, self._channel = self._connection, None
        if connection is not None and self._kept and connection.is_open:
            drop_connection(connection)
        elif connection is not None:
            close_quietly(connection)

