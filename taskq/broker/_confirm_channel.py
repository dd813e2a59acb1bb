"""One connection and one confirm-mode channel with its own confirm bookkeeping.

Private to :mod:`taskq.broker.publisher`. pika's ``BlockingChannel`` in confirm mode waits for
every confirm with no time limit and one message at a time, so this drives the channel's
underlying asynchronous ``pika.channel.Channel`` (``BlockingChannel._impl``) instead: confirms
are turned on there with our own ack/nack and return callbacks, and the blocking adapter's own
wait loop (``BlockingChannel._flush_output``) runs the I/O loop
until the awaited confirms are in, the channel or connection closes, or an I/O-loop timer
fires. Messages are not published through pika's ``basic_publish``: their frames are packed
by :mod:`taskq.broker._frames` (byte for byte what pika would send, at a fraction of the CPU),
buffered, and handed to the connection's transport a few dozen messages at a time. These pika
internals have been stable through pika 1.x; setup.cfg pins ``pika<2``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from taskq.broker._frames import content_frames, method_frame
from taskq.broker.connection import declare
from taskq.broker.topology import Topology
from taskq.errors import TopologyError
from taskq.message import WireMessage

logger = logging.getLogger(__name__)

_ACK = pika.spec.Basic.Ack
# Buffered messages are handed to the transport (one send() each) once this many are waiting,
# or this many bytes, or before any wait for confirms.
_FLUSH_MESSAGES = 32
_FLUSH_BYTES = 256 * 1024


class ConfirmTimeout(Exception):
    """No confirm arrived in time; ``blocked`` says whether the broker blocked publishing."""

    def __init__(self, timeout_s: float, *, blocked: bool) -> None:
        super().__init__(f"no publisher confirm within {timeout_s:g}s")
        self.blocked = blocked


class ConfirmChannel:
    """One connection and one confirm-mode channel, with the confirm bookkeeping.

    Delivery tags count publishes on the channel from 1. ``pending`` maps each unconfirmed tag
    to its token (an index into ``ids``) in publish order, so that a ``multiple`` ack settles
    a prefix. RabbitMQ sends a message's Basic.Return before its Basic.Ack; a return names no
    tag, so it is matched by ``message_id`` among the pending tokens.
    """

    # Publish with ``mandatory`` (returns of unroutable messages); subclasses may turn it off.
    mandatory = True

    def __init__(self, connection: pika.BlockingConnection, *, wait_s: float) -> None:
        self.connection = connection
        # (exchange, routing key) pairs that need no more declaring on this connection
        self.ready: set[tuple[str, str]] = set()
        self.base_declared = False
        self.is_blocked = False
        impl = connection._impl  # the SelectConnection under the blocking adapter
        self._connection_impl = impl
        self._ioloop = impl.ioloop
        # Registered on the impl: the blocking adapter would defer these to
        # process_data_events, which a publisher waiting for a confirm never calls.
        impl.add_on_connection_blocked_callback(self._on_blocked)
        impl.add_on_connection_unblocked_callback(self._on_unblocked)
        coalesce_frames(impl)
        self.ids: Sequence[str | None] = ()
        self.settled = 0
        self._wait_s = wait_s
        self.open_channel(None)

    # -- channel -----------------------------------------------------------------------------

    def open_channel(self, channel: BlockingChannel | None) -> None:
        """Use ``channel`` (or a new one) in confirm mode with fresh bookkeeping."""
        self.channel = channel if channel is not None else self.connection.channel()
        impl = self.channel._impl
        self._channel_impl = impl
        self._channel_number: int = impl.channel_number
        self._methods: dict[tuple[str, str], bytes] = {}
        self._out: list[bytes] = []
        self._out_bytes = self._out_frames = 0
        self.tag = 0
        self.pending: OrderedDict[int, int] = OrderedDict()
        self.nacked: list[int] = []
        self.returned: dict[int, tuple[int, str]] = {}
        impl.add_on_return_callback(self._on_return)
        selected: list[Any] = []
        impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=selected.append)
        if not self.wait(selected.__len__, self._wait_s):
            raise ConfirmTimeout(self._wait_s, blocked=self.is_blocked)

    @property
    def is_usable(self) -> bool:
        """Whether the channel is open (pika closes every channel of a lost connection)."""
        return bool(self.channel.is_open)

    def ensure_declared(self, topology: Topology, exchange: str, routing_key: str) -> None:
        """Declare the base topology once, and each work queue before its first publish."""
        try:
            if not self.base_declared:
                declare(self.channel, topology.base())
                self.base_declared = True
            if exchange == topology.exchange:
                # A partition of an ordered queue declares them all (once, not per partition).
                unit = topology.declared_as(routing_key)
                declare(self.channel, topology.for_queue(unit))
                self.ready.update((exchange, q) for q in topology.partition_queues(unit))
            self.ready.add((exchange, routing_key))
        except TopologyError as exc:
            # pika closed our channel on PRECONDITION_FAILED; declare() opened another.
            reopened = getattr(exc, "channel", None)
            if reopened is not None:
                self.open_channel(reopened)
            raise

    # -- publishing --------------------------------------------------------------------------

    def send(self, token: int, exchange: str, routing_key: str, wire: WireMessage) -> None:
        """Publish ``wire`` without waiting (buffered; see :meth:`flush`); its confirm settles
        ``token`` later."""
        route = (exchange, routing_key)
        method = self._methods.get(route)
        if method is None:
            method = self._methods[route] = method_frame(
                self._channel_number, exchange, routing_key, self.mandatory
            )
        body_max: int = self._connection_impl._body_max_length
        data = method + content_frames(self._channel_number, wire, body_max)
        out = self._out
        out.append(data)
        self._out_bytes += len(data)
        size = len(wire.body)
        self._out_frames += 2 + (-(-size // body_max) if size else 0)
        self.tag += 1
        self.pending[self.tag] = token
        if len(out) >= _FLUSH_MESSAGES or self._out_bytes >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered messages to the connection's transport (one write).

        Raises pika's ChannelWrongStateError or ConnectionWrongStateError, as its
        ``basic_publish`` would, when the channel or the connection is closed; the messages
        stay pending (their fate unknown), so a caller that reconnects sends them again.
        """
        out = self._out
        if not out:
            return
        connection = self._connection_impl
        if connection.is_closed:
            raise pika.exceptions.ConnectionWrongStateError(
                "Attempted to send a frame on closed connection."
            )
        if not self._channel_impl.is_open:
            raise pika.exceptions.ChannelWrongStateError("Channel is closed.")
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        connection.bytes_sent += len(data)
        connection.frames_sent += self._out_frames
        self._out_bytes = self._out_frames = 0
        connection._adapter_emit_data(data)

    def all_settled(self) -> bool:
        """Whether every message sent on this channel is confirmed (acked or nacked)."""
        return not self.pending

    def wait(self, until: Callable[[], object], timeout_s: float) -> bool:
        """Run the I/O loop until ``until()`` is true or ``timeout_s`` passed.

        Returns ``until()``. Raises pika's ChannelClosedByBroker when the broker closes the
        channel, and its connection errors when the connection is lost.
        """
        self.flush()
        expired: list[bool] = []
        timer = self._ioloop.call_later(timeout_s, lambda: expired.append(True))
        try:
            # pika's own wait loop: flush output, poll, run timers until a waiter is true;
            # it raises when the channel or the connection closes meanwhile.
            self.channel._flush_output(until, expired.__len__)
        finally:
            if not expired:
                self._ioloop.remove_timeout(timer)
        return bool(until())

    def wait_settled(self, until: Callable[[], object], timeout_s: float) -> None:
        """Wait for ``until()``, failing only after ``timeout_s`` without any confirm."""
        while True:
            before = self.settled
            if self.wait(until, timeout_s):
                return
            if self.settled == before:
                raise ConfirmTimeout(timeout_s, blocked=self.is_blocked)

    # -- callbacks (run inside the I/O loop) -------------------------------------------------

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        is_ack = isinstance(method, _ACK)
        pending = self.pending
        if method.multiple:
            tag = method.delivery_tag or self.tag  # tag 0 with multiple means "all"
            while pending:
                first = next(iter(pending))
                if first > tag:
                    break
                self._settle(pending.popitem(last=False)[1], is_ack)
        else:
            token = pending.pop(method.delivery_tag, None)
            if token is not None:
                self._settle(token, is_ack)

    def _settle(self, token: int, is_ack: bool) -> None:
        self.settled += 1
        if not is_ack:
            self.nacked.append(token)

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        message_id = properties.message_id
        for token in self.pending.values():
            if token not in self.returned and self.ids[token] == message_id:
                self.returned[token] = (method.reply_code, method.reply_text)
                return
        logger.warning("unmatched Basic.Return for message %s: %s", message_id, method)

    def _on_blocked(self, _connection: Any, frame: Any) -> None:
        self.is_blocked = True
        logger.warning("RabbitMQ blocked publishing: %s", getattr(frame.method, "reason", ""))

    def _on_unblocked(self, _connection: Any, _frame: Any) -> None:
        self.is_blocked = False
        logger.info("RabbitMQ unblocked publishing")

    # -- ending ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection politely (Connection.Close / CloseOk)."""
        if self.connection.is_open:
            self.connection.close()

    def abort(self) -> None:
        """Drop the TCP connection without the AMQP close handshake (see abort_connection)."""
        self.abort_connection(self.connection)

    @staticmethod
    def abort_connection(connection: pika.BlockingConnection) -> None:
        """Drop ``connection`` without the AMQP close handshake.

        Used when confirms stopped arriving: a polite close would wait for a CloseOk that a
        dead or frozen peer never sends. pika's heartbeat checker ends connections this way.
        """
        if connection.is_closed:
            return
        try:
            connection._impl._terminate_stream(pika.exceptions.StreamLostError("aborted"))
            # The transport closes its socket from an I/O-loop callback: let it run.
            for _ in range(100):
                if connection.is_closed:
                    break
                connection.process_data_events(time_limit=0.01)
        except pika.exceptions.AMQPError:
            pass  # the expected end: the loop reports the closed connection
        except Exception:  # best effort; the object is dropped either way
            logger.debug("error aborting the broker connection", exc_info=True)

    def forget(self) -> None:
        """In a forked child: release the inherited socket without a word on the wire.

        Closing the child's copy of the file descriptor leaves the parent's connection intact
        (no AMQP close, no shutdown); keeping it would hold the parent's TCP connection open
        after the parent itself is gone.
        """
        try:
            self.connection._impl._transport._sock.close()
        except Exception:  # internals moved or already closed: leave it to the GC
            logger.debug("could not release the inherited broker socket", exc_info=True)


def coalesce_frames(impl: Any) -> None:
    """Make ``impl`` write a message's frames (method, header, body) with one ``send``.

    pika hands each frame to the transport separately, which sends each with its own system
    call and TCP segment: three per message. Joined, a confirmed publish costs about 10% less
    CPU (benchmarks/publish.py). Skipped if a pika version lacks these internals.
    """
    emit = getattr(impl, "_adapter_emit_data", None)
    if emit is None or not hasattr(impl, "_output_marshaled_frames"):
        return

    def output_marshaled_frames(frames: Sequence[bytes]) -> None:
        data = b"".join(frames)
        impl.bytes_sent += len(data)
        impl.frames_sent += len(frames)
        emit(data)

    impl._output_marshaled_frames = output_marshaled_frames
