"""How long a publish keeps trying, and the pause between its attempts.

Private to the broker package. A publish that was nacked, or whose connection died before its
confirm, is sent again (same message id) until ``publish_timeout_s`` has passed since it
began: long enough for a quorum queue to elect a new leader (0.2-0.4 s measured) or for a
client to fail over to another node (``docs/cluster.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The first retry goes at once (a lost connection: reconnect to another node now); later
# ones wait this long, doubling up to the cap, so that a node or an election in progress
# is not hammered.
_FIRST_PAUSE_S = 0.05
_MAX_PAUSE_S = 1.0


class PublishDeadline:
    """The time budget of one ``publish`` or ``publish_many`` call.

    Args:
        timeout_s: ``publish_timeout_s``: retries stop once this much time has passed.
        clock: Monotonic seconds (tests pass a fake).
        sleep: Waits between attempts (tests pass a fake).
    """

    def __init__(
        self,
        timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._deadline_at = clock() + timeout_s
        self.retries = 0

    def expired(self) -> bool:
        """Whether the budget is spent (an attempt may still be running)."""
        return self._clock() >= self._deadline_at

    def pause(self) -> None:
        """Count one retry and wait before it (never past the deadline)."""
        self.retries += 1
        if self.retries == 1:
            return
        pause_s = min(_MAX_PAUSE_S, _FIRST_PAUSE_S * 2 ** (self.retries - 2))
        remaining_s = self._deadline_at - self._clock()
        if remaining_s > 0:
            self._sleep(min(pause_s, remaining_s))
