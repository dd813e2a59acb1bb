"""TcpProxy, the forwarder that connection-loss tests cut and restore, on a local echo server."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.support.proxy import TcpProxy

TIMEOUT_S = 5.0


class _EchoHandler(socketserver.BaseRequestHandler):
    server: EchoServer

    def handle(self) -> None:
        self.server.connection_opened()
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except ConnectionError:
            pass
        finally:
            self.server.connection_closed()


class EchoServer(socketserver.ThreadingTCPServer):
    """Echoes every byte back; counts the connections open on its side."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)
        self.port: int = self.server_address[1]
        self._open = 0
        self._changed = threading.Condition()

    def connection_opened(self) -> None:
        with self._changed:
            self._open += 1
            self._changed.notify_all()

    def connection_closed(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    def wait_open_connections(self, count: int) -> None:
        with self._changed:
            reached = self._changed.wait_for(lambda: self._open == count, TIMEOUT_S)
        assert reached, f"echo server has {self._open} open connections, expected {count}"


@pytest.fixture
def echo_server() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT_S)


@pytest.fixture
def proxy(echo_server: EchoServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", echo_server.port) as proxy:
        yield proxy


def connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S)


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    """Reads ``size`` bytes; the socket's timeout is the deadline of each read."""
    received = bytearray()
    while len(received) < size:
        chunk = sock.recv(size - len(received))
        assert chunk, f"connection closed after {len(received)} of {size} bytes"
        received += chunk
    return bytes(received)


def round_trip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    return receive_exactly(sock, len(payload))


def assert_connection_ended(sock: socket.socket) -> None:
    """The peer closed or reset the connection (a timeout means it stayed up)."""
    try:
        data = sock.recv(1)
    except ConnectionError:
        return
    assert data == b"", f"expected the connection to be closed, received {data!r}"


def test_forwards_bytes_both_ways(proxy: TcpProxy) -> None:
    with connect(proxy) as client:
        assert round_trip(client, b"hello") == b"hello"
        assert round_trip(client, b"again") == b"again"


def test_forwards_large_payload_while_both_sides_are_busy(proxy: TcpProxy) -> None:
    # Given a payload larger than the proxy's and the kernel's buffers
    payload = bytes(range(256)) * 16 * 1024  # 4 MiB
    with connect(proxy) as client:
        # When the client sends it all while reading the echo at the same time
        sender = threading.Thread(target=client.sendall, args=(payload,), daemon=True)
        sender.start()
        echoed = receive_exactly(client, len(payload))
        sender.join(TIMEOUT_S)
    # Then every byte comes back, in order
    assert not sender.is_alive()
    assert echoed == payload


def test_half_close_is_forwarded(proxy: TcpProxy, echo_server: EchoServer) -> None:
    with connect(proxy) as client:
        client.sendall(b"last words")
        client.shutdown(socket.SHUT_WR)
        assert receive_exactly(client, len(b"last words")) == b"last words"
        assert_connection_ended(client)
    echo_server.wait_open_connections(0)


def test_cut_breaks_established_connections(proxy: TcpProxy, echo_server: EchoServer) -> None:
    with connect(proxy) as first, connect(proxy) as second:
        assert round_trip(first, b"ping") == b"ping"
        assert round_trip(second, b"ping") == b"ping"
        echo_server.wait_open_connections(2)

        proxy.cut()

        assert_connection_ended(first)
        assert_connection_ended(second)
        # the target sees the connections go too, as a broker would
        echo_server.wait_open_connections(0)
        assert proxy.connection_count == 0


def test_cut_refuses_new_connections(proxy: TcpProxy) -> None:
    proxy.cut()

    with pytest.raises(ConnectionRefusedError):
        connect(proxy).close()


def test_restore_forwards_again_on_the_same_port(proxy: TcpProxy) -> None:
    port = proxy.port
    with connect(proxy) as before:
        assert round_trip(before, b"one") == b"one"
        proxy.cut()
        assert_connection_ended(before)

    proxy.restore()

    assert proxy.port == port
    with connect(proxy) as after:
        assert round_trip(after, b"two") == b"two"
        assert proxy.connection_count == 1


def test_cut_and_restore_are_idempotent(proxy: TcpProxy) -> None:
    proxy.cut()
    proxy.cut()
    proxy.restore()
    proxy.restore()
    with connect(proxy) as client:
        assert round_trip(client, b"ok") == b"ok"


def test_unreachable_target_closes_the_client_connection() -> None:
    # Given a target port with nothing listening on it
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        closed_port = placeholder.getsockname()[1]
    with TcpProxy("127.0.0.1", closed_port) as proxy:
        # Then the client's connection is reset rather than left hanging (the reset may
        # arrive while connect() is still returning)
        try:
            client = connect(proxy)
        except ConnectionResetError:
            return
        with client:
            assert_connection_ended(client)


def test_stop_closes_connections_and_ends_the_thread(echo_server: EchoServer) -> None:
    proxy = TcpProxy("127.0.0.1", echo_server.port).start()
    thread_name = f"TcpProxy-{proxy.port}"
    with connect(proxy) as client:
        assert round_trip(client, b"x") == b"x"

        proxy.stop()

        assert_connection_ended(client)
    echo_server.wait_open_connections(0)
    assert thread_name not in {thread.name for thread in threading.enumerate()}
    with pytest.raises(ConnectionRefusedError):
        connect(proxy).close()
    proxy.stop()  # a second stop is harmless


def test_url_points_at_the_proxy(proxy: TcpProxy) -> None:
    base = "amqp://guest:secret@localhost:5672/%2F?heartbeat=2"

    assert proxy.url(base) == f"amqp://guest:secret@127.0.0.1:{proxy.port}/%2F?heartbeat=2"
    assert proxy.url("amqp://rabbit/") == f"amqp://127.0.0.1:{proxy.port}/"


def test_for_url_targets_the_url_host_and_port() -> None:
    proxy = TcpProxy.for_url("amqp://guest:guest@localhost:5673/%2F")

    assert proxy.target == ("localhost", 5673)
    assert TcpProxy.for_url("amqp://broker/").target == ("broker", 5672)
    assert TcpProxy.for_url("amqps://broker/").target == ("broker", 5671)
