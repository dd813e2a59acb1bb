"""What both confirmed publishers share: one connection per process, threads, fork.

:class:`~taskq.broker.publisher.Publisher` and :class:`~taskq.broker.delayed.PluginPublisher`
each keep one :class:`ConfirmChannel` per process, opened on first use, behind a lock that
serialises the threads publishing through it. A child process after ``fork`` must never write
to the parent's socket (the frames of two processes would interleave on one connection): it
forgets the inherited connection without closing it and opens its own.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Generic, TypeVar

from taskq.broker._confirm_channel import ConfirmChannel

logger = logging.getLogger(__name__)

LinkT = TypeVar("LinkT", bound=ConfirmChannel)


class ProcessLink(Generic[LinkT]):
    """The per-process confirm channel, its lock and the fork check (module docstring).

    Args:
        what: Names the publisher in the debug log of a failed close.
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._link: LinkT | None = None

    def _adopt_process(self) -> None:
        """Before taking the lock: in a forked child, forget what the parent held."""
        if self._pid != os.getpid():
            self._forget_inherited()

    def _forget_inherited(self) -> None:
        """After fork: drop the parent's connection without closing it, and its lock."""
        link, self._link = self._link, None
        if link is not None:
            link.forget()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _drop_link(self) -> None:
        """Abort the connection (it failed, or its state is unknown)."""
        link, self._link = self._link, None
        if link is not None:
            link.abort()

    def close(self) -> None:
        """Close this process's connection (safe to call more than once)."""
        if self._pid != os.getpid():
            self._forget_inherited()
            return
        with self._lock:
            link, self._link = self._link, None
            if link is not None:
                try:
                    link.close()
                except Exception:  # closing is best effort: the broker may be gone
                    logger.debug("error closing the %s connection", self._what, exc_info=True)
