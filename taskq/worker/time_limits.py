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
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

from taskq.errors import SoftTimeLimitExceeded

logger = logging.getLogger(__name__)

# Longest message id the slot stores; AMQP short strings are at most 255 bytes.
MESSAGE_ID_MAX_BYTES = 255


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


class Slot:
    """What a worker process shares with its supervisor: the message in hand and its deadline.

    The fields are raw shared memory without a lock: the child is the only writer, and the
    supervisor reads the message id and time limit only after the child is dead, or right
    after it decided to kill it. The deadline is one aligned 8-byte float, read and written
    whole. The child writes the id before the deadline and clears them in reverse order.

    Args:
        context: The multiprocessing context the child processes are started with.
    """

    def __init__(self, context: Any) -> None:
        self.message_id = context.Array("c", MESSAGE_ID_MAX_BYTES + 1, lock=False)
        self.deadline = context.Value("d", 0.0, lock=False)
        self.time_limit_s = context.Value("d", 0.0, lock=False)
        # Monotonic time the loop last saw its consumer connected (health checks).
        self.alive_at = context.Value("d", 0.0, lock=False)

    def read_message_id(self) -> str:
        """The id of the message the process holds, or ``""`` when it is idle."""
        return bytes(self.message_id.value).decode("utf-8", "replace")

    def read_deadline(self) -> float:
        """Monotonic hard deadline of the running task; ``0.0`` when there is none."""
        return float(self.deadline.value)

    def read_time_limit_s(self) -> float:
        """The hard time limit of the task that set the current deadline."""
        return float(self.time_limit_s.value)

    def is_healthy(self, now: float, stale_after_s: float) -> bool:
        """Consuming recently, or busy with a task (a long task is not a sick process)."""
        return bool(self.message_id.value) or now - float(self.alive_at.value) < stale_after_s

    def clear(self) -> None:
        """Mark the slot idle (used by the supervisor before starting a replacement)."""
        self.message_id.value = b""
        self.deadline.value = 0.0
        self.time_limit_s.value = 0.0
        self.alive_at.value = 0.0
