"""A :class:`~tests.support.proxy.TcpProxy` to PostgreSQL that cuts at a chosen statement.

A database outage that matters most is the one that hits between two statements of one
transaction: after some have run, before the commit. A test cannot time a plain ``cut()``
that precisely, so this proxy watches what clients send and, once :meth:`arm` was given a
byte pattern, cuts (as :meth:`~tests.support.proxy.TcpProxy.cut`: every connection reset,
new ones refused until :meth:`~tests.support.proxy.TcpProxy.restore`) the moment a client
sends a message containing it; that message never reaches the server. The statement text is
readable on the wire only without TLS: connect with ``sslmode=disable``.

The subclass reaches into the base class's loop (``_read``, ``_Link``): both live in the
tests and change together.
"""

from __future__ import annotations

import socket
import threading

from tests.support.proxy import TcpProxy, _Link

__all__ = ["StatementCutProxy"]


class StatementCutProxy(TcpProxy):
    """TcpProxy plus :meth:`arm`: cut when a client sends ``pattern``, once."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self._pattern: bytes | None = None
        # the last bytes each client sent, so a pattern split over two reads is seen
        self._tails: dict[_Link, bytes] = {}
        self.tripped = threading.Event()

    def arm(self, pattern: bytes) -> None:
        """Cut the next time any client sends ``pattern`` (then disarm)."""
        self._call(lambda: self._do_arm(pattern))

    def _do_arm(self, pattern: bytes) -> None:
        self._pattern = pattern
        self.tripped.clear()

    def _read(self, link: _Link, sock: socket.socket) -> None:
        client = next(iter(link.peer))  # _Link(client, upstream): the client comes first
        upstream = link.peer[client]
        before = len(link.pending[upstream])
        super()._read(link, sock)
        pattern = self._pattern
        if pattern is None or link.closed or sock is not client:
            return
        window = self._tails.get(link, b"") + bytes(link.pending[upstream][before:])
        if pattern in window:
            self._pattern = None
            self._tails.clear()
            self._do_cut()
            self.tripped.set()
            return
        self._tails[link] = window[-(len(pattern) - 1):] if len(pattern) > 1 else b""

    def _forget(self, link: _Link) -> None:
        self._tails.pop(link, None)
        super()._forget(link)
