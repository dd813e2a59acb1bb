"""A :class:`~tests.support.proxy.TcpProxy` that can also reset and black-hole connections.

``cut()``/``restore()`` (inherited) refuse new connections; the fault suite also needs the
two faults a real network produces:

- ``reset()``: every proxied connection is reset at once, new ones are accepted and
  forwarded as before (a router or a NAT table forgetting its flows);
- ``blackhole()``: nothing is forwarded any more, but nothing is refused or reset either:
  open connections go silent, new ones are accepted and then hear nothing (a partition).
  Only heartbeats and timeouts can notice. ``heal()`` forwards again: the silent
  connections resume (what their peers sent meanwhile is delivered, as TCP retransmission
  would) and the connections accepted meanwhile are connected upstream.

The subclass reaches into the base class's loop (``_links``, ``_update_interest``,
``_accept``): both live in the tests and change together.
"""

from __future__ import annotations

import contextlib
import socket

from tests.support.proxy import TcpProxy, _abort, _Link

__all__ = ["ChaosProxy"]


class ChaosProxy(TcpProxy):
    """TcpProxy plus :meth:`reset`, :meth:`blackhole` and :meth:`heal`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self._blackholed = False
        self._held: list[socket.socket] = []  # accepted while black-holed, not yet upstream

    @property
    def blackholed(self) -> bool:
        """Whether traffic is black-holed now."""
        return self._blackholed

    def reset(self) -> None:
        """Reset every open connection; keep accepting (and forwarding) new ones."""
        self._call(self._do_reset)

    def blackhole(self) -> None:
        """Stop forwarding anything, without refusing or resetting any connection."""
        self._call(self._do_blackhole)

    def heal(self) -> None:
        """Forward again after :meth:`blackhole` (and accept again after ``cut``)."""
        self._call(self._do_heal)

    # --- in the loop thread -------------------------------------------------------------

    def _do_reset(self) -> None:
        for link in list(self._links):
            self._drop(link)
        for client in self._held:
            _abort(client)
        self._held.clear()

    def _do_blackhole(self) -> None:
        self._blackholed = True
        for link in list(self._links):
            self._update_interest(link)

    def _do_heal(self) -> None:
        self._blackholed = False
        self._do_restore()
        for link in list(self._links):
            self._update_interest(link)
        held, self._held = self._held, []
        for client in held:
            self._connect_upstream(client)

    def _do_cut(self) -> None:
        super()._do_cut()
        for client in self._held:
            _abort(client)
        self._held.clear()

    def _accept(self) -> None:
        if not self._blackholed:
            super()._accept()
            return
        assert self._listener is not None
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._held.append(client)  # the kernel buffers what the client sends

    def _update_interest(self, link: _Link) -> None:
        if not self._blackholed:
            super()._update_interest(link)
            return
        assert self._selector is not None
        for sock in link.peer:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)

    def _service(self, link: _Link, sock: socket.socket, mask: int) -> None:
        # An event already selected before the black hole began is dropped with it.
        if self._blackholed:
            self._update_interest(link)
            return
        super()._service(link, sock, mask)

