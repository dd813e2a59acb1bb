"""Time limits: the soft limit raises inside the task; the hard limit replaces the process.

The **soft** limit is a ``SIGALRM`` timer (``setitimer(ITIMER_REAL)``) armed around the task
call in the worker process's main thread. Its handler raises
:class:`~taskq.errors.SoftTimeLimitExceeded` there, so the task can clean up; because that
exception derives from ``BaseException``, an ``except Exception`` in task code does not
swallow it. Code blocked in C (a long ``socket.recv`` without timeout) sees the exception
only when it returns to Python: the hard limit is the backstop.

The **hard** limit cannot be enforced from inside the process (the task may be stuck in C or
holding the GIL), so each worker process publishes the deadline of the message it executes in
a :class:`Slot` shared with the supervisor, which SIGKILLs the process once the deadline
passes. Deadlines use ``time.monotonic()``: on Linux that is ``CLOCK_MONOTONIC``, one clock for
every process of the machine, so parent and child compare the same numbers.

The kill decision and the kill happen under the slot's lock, which the process also takes to
start and to end a run: so the supervisor kills only the run it found overdue, never the next
one (a task that ends just after its deadline and a new one that starts), and a run that has
ended is never killed, so the ack queued after it is never lost to a time-limit kill.

The slot also names the delivery in hand for the death ledger (:mod:`taskq.worker.deaths`)
by its :func:`delivery_key`: the exact bytes of its message id, whatever they are (NUL,
non-UTF-8), or a digest of body and headers when it has none, so that a message without a
usable id that kills its process is counted like any other.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from taskq.errors import SoftTimeLimitExceeded
from taskq.message import TASK

if TYPE_CHECKING:
    from taskq.broker.delivery import Delivery
    from taskq.message import WireMessage

logger = logging.getLogger(__name__)

# Longest message id the slot stores whole; AMQP short strings are at most 255 bytes.
MESSAGE_ID_MAX_BYTES = 255
# A delivery key is one kind byte, then the raw message id or a SHA-256 digest: a message id
# can hold any bytes, so only the kind byte keeps the two kinds apart.
_ID_KIND = b"i"
_DIGEST_KIND = b"h"
_KEY_MAX_BYTES = 1 + MESSAGE_ID_MAX_BYTES
# Lock-free readers retry this often while the process is writing its slot.
_READ_ATTEMPTS = 1000
# The supervisor gives up a time-limit check (until its next tick) when the process holds
# its slot's lock longer than this: it is stopped (SIGSTOP) or died while writing.
_JUDGE_LOCK_TIMEOUT_S = 0.01


def message_key(message_id: str | bytes) -> bytes:
    """The delivery key of a message whose id is ``message_id`` (not empty)."""
    if isinstance(message_id, str):
        try:  # an id decoded with surrogateescape gets its original bytes back
            raw = message_id.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = message_id.encode("utf-8", "surrogatepass")
    else:
        raw = bytes(message_id)
    if len(raw) > MESSAGE_ID_MAX_BYTES:  # not over AMQP; from code that built a message
        return _DIGEST_KIND + hashlib.sha256(b"id:" + raw).digest()
    return _ID_KIND + raw


def delivery_key(message: WireMessage) -> bytes:
    """What names a delivery in the slot and the death ledger, for any message.

    The message id when it has one (its exact bytes: pika hands a non-UTF-8 id over as
    ``bytes``); otherwise a SHA-256 digest of body, headers (but those the broker adds on
    redelivery) and properties, the same for every redelivery of the message. Two messages
    without id that are identical share a key, so their deaths count together.
    """
    message_id: Any = message.message_id
    if message_id:
        return message_key(message_id)
    digest = hashlib.sha256(message.body)
    headers = message.headers or {}
    stable = [(name, value) for name, value in headers.items() if not _added_by_broker(name)]
    properties = (message.priority, message.timestamp, message.app_id, message.content_type)
    digest.update(repr((stable, properties)).encode("utf-8", "backslashreplace"))
    return _DIGEST_KIND + digest.digest()


def _added_by_broker(name: Any) -> bool:
    # Headers the broker adds or changes on a redelivery (x-delivery-count on quorum queues)
    # stay out of the digest, so that every delivery of one message gets the same key.
    if isinstance(name, str):
        return name.startswith("x-")
    return isinstance(name, bytes) and name.startswith(b"x-")


def describe_key(key: bytes) -> str:
    """A delivery key for a log line: the message id as text, or what the digest is of."""
    if key.startswith(_ID_KIND):
        text = key[1:].decode("utf-8", "backslashreplace")
        return text if text.isprintable() else repr(text)
    if key.startswith(_DIGEST_KIND):
        return f"(no message id; body and headers sha256 {key[1:9].hex()})"
    return repr(key)


class SoftTimeLimit:
    """Raises ``SoftTimeLimitExceeded`` in the main thread when an armed timer fires.

    Create it once per process, in the main thread (``signal.signal`` must be called there).
    """

    def __init__(self) -> None:
        self._armed = False
        self._limit_s = 0.0
        signal.signal(signal.SIGALRM, self._on_alarm)

    def arm(self, limit_s: float) -> None:
        """Start the timer: ``SoftTimeLimitExceeded`` is raised after ``limit_s`` seconds."""
        self._limit_s = limit_s
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, limit_s)

    def disarm(self) -> None:
        """Stop the timer (idempotent)."""
        if self._armed:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        # A timer that fired after disarm() raced with the task's return: ignore it rather
        # than blow up the worker loop between two messages.
        if not self._armed:
            return
        self._armed = False
        raise SoftTimeLimitExceeded(f"soft time limit of {self._limit_s:g}s exceeded")


@dataclass(frozen=True)
class SlotState:
    """One consistent reading of a :class:`Slot`.

    Args:
        version: Changes with every write: the same version means the same run.
        key: The :func:`delivery_key` of the delivery in hand; ``b""`` when idle.
        deadline: Monotonic hard deadline of the running task; ``0.0`` when there is none.
        time_limit_s: The hard time limit that set the deadline; for a run the broker
            ended (``by_broker``), how long its delivery had been held.
        by_broker: The broker took the delivery back from under the running task (4.3's
            consumer timeout on a quorum queue): its deadline was moved to now
            (:meth:`Slot.expire`).
    """

    version: int
    key: bytes
    deadline: float
    time_limit_s: float
    by_broker: bool = False

    def is_overdue(self, now: float) -> bool:
        """A task runs and its deadline has passed."""
        return bool(self.deadline) and now > self.deadline


class Slot:
    """What a worker process shares with its supervisor: the delivery in hand and its deadline.

    The process is the only writer; it takes the slot's lock for each write and makes the
    version odd while writing (a seqlock), so that siblings and health checks can read
    without the lock and still see whole states. The supervisor decides and performs a
    time-limit kill holding the lock (:meth:`kill_if_overdue`): a process cannot end the run
    or start the next one in between.

    Args:
        context: The multiprocessing context the child processes are started with.
    """

    def __init__(self, context: Any) -> None:
        self._lock = context.Lock()
        self._version = context.Value("Q", 0, lock=False)
        self._key_bytes = context.Value("H", 0, lock=False)
        self._key = context.Array("c", _KEY_MAX_BYTES, lock=False)
        self._deadline = context.Value("d", 0.0, lock=False)
        self._time_limit_s = context.Value("d", 0.0, lock=False)
        self._by_broker = context.Value("b", 0, lock=False)
        # Monotonic start of the running task; 0.0 when none runs (only a run can expire).
        self._run_at = context.Value("d", 0.0, lock=False)
        # Monotonic time the loop last saw its consumer connected (health checks).
        self.alive_at = context.Value("d", 0.0, lock=False)
        # Monotonic time the consumer's I/O thread last showed it works, connected or
        # reconnecting (Subscription.watch_progress): the supervisor replaces a process
        # whose consumer stalled (see is_stalled).
        self.io_at = context.Value("d", 0.0, lock=False)

    # -- the worker process ------------------------------------------------------------------

    def hold(self, key: bytes) -> None:
        """Name the delivery in hand (no task runs yet, so no deadline)."""
        self._write(key, 0.0, 0.0)

    def begin(self, key: bytes, time_limit_s: float | None, *, now: float | None = None) -> None:
        """A task of the delivery ``key`` starts; with a hard limit, its deadline is set."""
        now = time.monotonic() if now is None else now
        if time_limit_s is None:
            self._write(key, 0.0, 0.0, run_at=now)
        else:
            self._write(key, now + time_limit_s, time_limit_s, run_at=now)

    def expire(self, key: bytes, held_s: float) -> bool:
        """End the running task of delivery ``key`` as if its hard time limit had passed.

        Called by the consumer's I/O thread when the broker took that delivery back (4.3's
        consumer timeout): the supervisor kills the process at its next check and records
        the death as ``by_broker``, so the copy the broker hands out again is settled once
        (:mod:`taskq.worker.crash_loops`) instead of running beside this run.

        Returns:
            Whether a run of ``key`` was in progress (and so was ended).
        """
        with self._lock:
            if not self._run_at.value or self._key.raw[: self._key_bytes.value] != key:
                return False
            version = self._version
            version.value += 1
            self._deadline.value = 1e-9  # in the past for any monotonic clock reading
            self._time_limit_s.value = held_s
            self._by_broker.value = 1
            version.value += 1
            return True

    def end_run(self) -> None:
        """The task has returned: no deadline any more; the delivery is still in hand."""
        self._write(None, 0.0, 0.0)

    def release(self) -> None:
        """The delivery is settled: the slot is idle."""
        self._write(b"", 0.0, 0.0)

    def _write(
        self, key: bytes | None, deadline: float, time_limit_s: float, *, run_at: float = 0.0
    ) -> None:
        if key is not None and len(key) > _KEY_MAX_BYTES:
            raise ValueError(f"delivery key of {len(key)} bytes (at most {_KEY_MAX_BYTES})")
        version = self._version
        with self._lock:
            version.value += 1  # odd: a write is under way
            if key is not None:
                self._key.raw = key  # copies len(key) bytes; the length says where it ends
                self._key_bytes.value = len(key)
            self._deadline.value = deadline
            self._time_limit_s.value = time_limit_s
            self._by_broker.value = 0
            self._run_at.value = run_at
            version.value += 1

    # -- readers -----------------------------------------------------------------------------

    def state(self) -> SlotState | None:
        """A whole state, read without the lock; ``None`` if no whole state could be read
        (the process is writing, or died while writing)."""
        version = self._version
        for _ in range(_READ_ATTEMPTS):
            before = version.value
            if before & 1:
                continue
            state = self._read(before)
            if version.value == before:
                return state
        return None

    def _read(self, version: int) -> SlotState:
        key = self._key.raw[: self._key_bytes.value]
        return SlotState(version, key, self._deadline.value, self._time_limit_s.value,
                         bool(self._by_broker.value))

    def holds(self, key: bytes) -> bool:
        """The process has the delivery ``key`` in hand (also ``True`` while unreadable)."""
        state = self.state()
        return state is None or state.key == key

    def is_healthy(self, now: float, stale_after_s: float) -> bool:
        """Consuming recently, or busy with a delivery (a long task is not a sick process)."""
        return bool(self._key_bytes.value) or now - float(self.alive_at.value) < stale_after_s

    def is_stalled(self, now: float, stalled_after_s: float) -> bool:
        """Holding no delivery, and no progress of its consumer for ``stalled_after_s``.

        Judged once the consumer has started (start-up, app import included, has no limit).
        """
        io_at = float(self.io_at.value)
        return not self._key_bytes.value and 0.0 < io_at < now - stalled_after_s

    # -- the supervisor ----------------------------------------------------------------------

    def kill_if_overdue(
        self, now: float, kill: Callable[[SlotState], None]
    ) -> SlotState | None:
        """Call ``kill(state)`` if the running task is past its deadline; return that state.

        The check and ``kill`` run under the slot's lock, so the process can neither end the
        overdue run nor start another one in between: what ``kill`` stops is the run judged.
        ``kill`` must send SIGKILL and wait until the process is gone (it holds the lock).
        Returns ``None`` when nothing was killed.
        """
        if not self._lock.acquire(timeout=_JUDGE_LOCK_TIMEOUT_S):
            return None
        try:
            state = self._read(self._version.value)
            if not state.is_overdue(now):
                return None
            kill(state)
            return state
        finally:
            self._lock.release()

    def clear(self) -> None:
        """Mark the slot idle (supervisor only, once its process is dead, before the next)."""
        # A process killed while writing leaves the lock taken and the version odd.
        self._lock.acquire(False)
        self._lock.release()
        if self._version.value & 1:
            self._version.value += 1
        self._write(b"", 0.0, 0.0)
        self.alive_at.value = 0.0
        self.io_at.value = 0.0


class RunInHand:
    """The task a worker process runs now, and how it ends when the broker takes it back.

    On RabbitMQ 4.3 a quorum queue cancels a consumer whose delivery stayed unacked past the
    consumer timeout and hands its messages out again at once, while the task still runs
    here: without an end, a copy would run beside it (an ``idempotent=False`` task over and
    over, one more each timeout). The consumer's I/O thread calls :meth:`on_timed_out`; if
    the running task's delivery is among those taken back, its run is ended as past a hard
    time limit (:meth:`Slot.expire`): the supervisor kills this process and records why, and
    the copy is settled once, retried per policy or dead-lettered with that reason.
    """

    def __init__(self, slot: Slot) -> None:
        self._slot = slot
        self._delivery: Delivery | None = None

    def begin(self, delivery: Delivery, time_limit_s: float | None) -> None:
        """The task of ``delivery`` starts (with its hard limit, if any)."""
        self._delivery = delivery
        self._slot.begin(delivery_key(delivery.message), time_limit_s)

    def end(self) -> None:
        """The task has returned; the delivery will be settled."""
        self._slot.release()
        self._delivery = None

    def on_timed_out(self, queue: str, generation: int) -> None:
        """The broker took back the deliveries of ``queue``'s consumer on ``generation``."""
        delivery = self._delivery
        if delivery is None or delivery.queue != queue or delivery.generation != generation:
            return
        held_s = time.monotonic() - delivery.received_at
        if self._slot.expire(delivery_key(delivery.message), held_s):
            logger.error(
                "task %s (id %s) of quorum queue %r has held its delivery for %.0fs, past the "
                "consumer timeout; the broker took the message back, so this run ends now "
                "(its worker process is replaced) and counts as a failed attempt",
                delivery.message.headers.get(TASK), delivery.message.message_id,
                queue, held_s,
            )
