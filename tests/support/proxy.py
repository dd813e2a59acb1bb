"""A TCP forwarder on 127.0.0.1 that a test can cut and restore.

Connection-loss tests run a client through a :class:`TcpProxy` instead of stopping the shared
broker::

    with TcpProxy.for_url(broker_url) as proxy:
        app = make_app(broker_url=proxy.url(broker_url))
        ...
        proxy.cut()      # every proxied connection is reset; new ones are refused
        proxy.restore()  # connections are accepted and forwarded again, on the same port

One daemon thread runs a selector loop over the listening socket and every proxied
connection (non-blocking, buffered both ways with back-pressure). ``cut()``, ``restore()`` and
``stop()`` are carried out by that thread and return once they have taken effect, so a test
can act on them at once.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy"]

_CHUNK_BYTES = 64 * 1024
# stop reading from one side while this much waits to be written to the other
_BUFFER_LIMIT_BYTES = 256 * 1024
_CONNECT_TIMEOUT_S = 5.0
_COMMAND_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0

_WAKE = object()
_LISTENER = object()


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a dropped network or crashed peer would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Link:
    """One proxied connection: the accepted client socket and its upstream socket."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.peer = {client: upstream, upstream: client}
        # bytes waiting to be written *to* the key socket
        self.pending: dict[socket.socket, bytearray] = {client: bytearray(), upstream: bytearray()}
        # sockets whose peer has sent EOF (no more reads from them)
        self.at_eof: set[socket.socket] = set()
        self.closed = False

    def finished(self) -> bool:
        return len(self.at_eof) == 2 and not any(self.pending.values())


class TcpProxy:
    """Forwards TCP connections from ``127.0.0.1:<port>`` to ``(target_host, target_port)``."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"):
        self._target = (target_host, target_port)
        self._listen_host = listen_host
        self._port: int | None = None
        self._listener: socket.socket | None = None
        self._links: set[_Link] = set()
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._running = False

    @classmethod
    def for_url(cls, amqp_url: str) -> TcpProxy:
        """A proxy to the host and port of ``amqp_url`` (port 5672, or 5671 for amqps)."""
        parts = urlsplit(amqp_url)
        default_port = 5671 if parts.scheme == "amqps" else 5672
        return cls(parts.hostname or "localhost", parts.port or default_port)

    # --- public API -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("TcpProxy.port is known once start() has been called")
        return self._port

    @property
    def target(self) -> tuple[str, int]:
        """The ``(host, port)`` connections are forwarded to."""
        return self._target

    @property
    def connection_count(self) -> int:
        """How many proxied connections are open now."""
        return len(self._links)

    def url(self, base_amqp_url: str) -> str:
        """``base_amqp_url`` with its host and port replaced by this proxy's."""
        parts = urlsplit(base_amqp_url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}{at}{self._listen_host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def start(self) -> TcpProxy:
        if self._thread is not None:
            raise RuntimeError("TcpProxy.start() was already called")
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._open_listener(port=0)
        self._running = True
        self._thread = threading.Thread(target=self._run, name=f"TcpProxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def cut(self) -> None:
        """Reset every proxied connection and refuse new ones until :meth:`restore`."""
        self._call(self._do_cut)

    def restore(self) -> None:
        """Accept and forward connections again, on the same port."""
        self._call(self._do_restore)

    def stop(self) -> None:
        """Reset every connection and end the proxy's thread. Safe to call twice."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # it may end on its own meanwhile
                self._call(self._do_stop)
            thread.join(_STOP_TIMEOUT_S)
            if thread.is_alive():
                raise RuntimeError(f"{thread.name} did not end within {_STOP_TIMEOUT_S}s")
        self._close_control()

    def __enter__(self) -> TcpProxy:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- calls into the loop thread -----------------------------------------------------

    def _call(self, action: Callable[[], None]) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive() or self._wake_w is None:
            raise RuntimeError("TcpProxy is not running")
        command = _Command(action)
        self._commands.put(command)
        self._wake_w.send(b"\0")
        command.wait(_COMMAND_TIMEOUT_S)

    def _do_cut(self) -> None:
        self._close_listener()
        for link in list(self._links):
            self._drop(link)

    def _do_restore(self) -> None:
        if self._listener is None:
            self._open_listener(port=self.port)

    def _do_stop(self) -> None:
        self._running = False
        self._do_cut()

    # --- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        assert self._selector is not None
        try:
            while self._running:
                for key, mask in self._selector.select():
                    self._dispatch(key, mask)
        finally:
            self._running = False
            self._do_cut()
            self._fail_pending_commands()

    def _dispatch(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data is _WAKE:
            self._run_commands()
        elif key.data is _LISTENER:
            if key.fileobj is self._listener:
                self._accept()
        else:
            link: _Link = key.data
            if not link.closed:
                self._service(link, key.fileobj, mask)  # type: ignore[arg-type]

    def _run_commands(self) -> None:
        assert self._wake_r is not None
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command.run()

    def _fail_pending_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command.fail(RuntimeError("TcpProxy has stopped"))

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._connect_upstream(client)

    def _connect_upstream(self, client: socket.socket) -> None:
        """Link an accepted client to the target (or abort it if the target refuses)."""
        # Blocking, but the target is on this machine: it answers or refuses at once.
        try:
            upstream = socket.create_connection(self._target, timeout=_CONNECT_TIMEOUT_S)
        except OSError:
            _abort(client)
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(client, upstream)
        self._links.add(link)
        self._update_interest(link)

    def _service(self, link: _Link, sock: socket.socket, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            self._read(link, sock)
        if not link.closed and mask & selectors.EVENT_WRITE:
            self._write(link, sock)
        if link.closed:
            return
        if link.finished():
            self._close(link)
        else:
            self._update_interest(link)

    def _read(self, link: _Link, sock: socket.socket) -> None:
        try:
            data = sock.recv(_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(link)
            return
        peer = link.peer[sock]
        if data:
            link.pending[peer] += data
            return
        link.at_eof.add(sock)
        if not link.pending[peer]:
            self._shutdown_write(link, peer)

    def _write(self, link: _Link, sock: socket.socket) -> None:
        buffer = link.pending[sock]
        try:
            sent = sock.send(buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(link)
            return
        del buffer[:sent]
        if not buffer and link.peer[sock] in link.at_eof:
            self._shutdown_write(link, sock)

    def _shutdown_write(self, link: _Link, sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(link)

    def _update_interest(self, link: _Link) -> None:
        assert self._selector is not None
        for sock, peer in link.peer.items():
            events = 0
            if sock not in link.at_eof and len(link.pending[peer]) < _BUFFER_LIMIT_BYTES:
                events |= selectors.EVENT_READ
            if link.pending[sock]:
                events |= selectors.EVENT_WRITE
            try:
                key: selectors.SelectorKey | None = self._selector.get_key(sock)
            except KeyError:
                key = None
            if key is None:
                if events:
                    self._selector.register(sock, events, link)
            elif not events:
                self._selector.unregister(sock)
            elif key.events != events:
                self._selector.modify(sock, events, link)

    def _close(self, link: _Link) -> None:
        """Both sides said goodbye and everything was delivered: an orderly close."""
        self._forget(link)
        for sock in link.peer:
            sock.close()

    def _drop(self, link: _Link) -> None:
        """Reset both sides at once."""
        if link.closed:
            return
        self._forget(link)
        for sock in link.peer:
            _abort(sock)

    def _forget(self, link: _Link) -> None:
        assert self._selector is not None
        link.closed = True
        self._links.discard(link)
        for sock in link.peer:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)

    # --- sockets owned by the proxy -----------------------------------------------------

    def _open_listener(self, *, port: int) -> None:
        assert self._selector is not None
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._listen_host, port))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        assert self._selector is not None
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(listener)
        listener.close()

    def _close_control(self) -> None:
        self._close_listener()
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._wake_r = self._wake_w = None


class _Command:
    """An action for the loop thread, and the caller's wait for it to be done."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action = action
        self._done = threading.Event()
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._action()
        except BaseException as exc:  # handed to the caller, who raises it
            self._error = exc
        finally:
            self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def wait(self, timeout_s: float) -> None:
        if not self._done.wait(timeout_s):
            raise RuntimeError(f"TcpProxy did not carry out a command within {timeout_s}s")
        if self._error is not None:
            raise self._error
