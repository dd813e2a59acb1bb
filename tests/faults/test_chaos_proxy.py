"""The fault harness's own proxy: reset, blackhole and heal do what the scenarios assume."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.faults.chaos_proxy import ChaosProxy

SILENCE_S = 0.3  # how long a black-holed connection is watched for an answer


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):  # the proxy resets it in some tests
        while data := conn.recv(4096):
            conn.sendall(data)


@pytest.fixture
def proxy(echo_port: int) -> Iterator[ChaosProxy]:
    chaos = ChaosProxy("127.0.0.1", echo_port)
    chaos.start()
    yield chaos
    chaos.stop()


def _client(proxy: ChaosProxy) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    client.sendall(b"hello")
    assert client.recv(5) == b"hello"
    return client


def test_blackhole_silences_open_and_new_connections_and_heal_resumes_them(proxy):
    old = _client(proxy)
    proxy.blackhole()
    old.sendall(b"ping")
    new = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)  # accepted...
    new.sendall(b"pong")
    for sock in (old, new):  # ...and neither hears anything
        sock.settimeout(SILENCE_S)
        with pytest.raises(TimeoutError):
            sock.recv(4)

    proxy.heal()

    for sock, expected in ((old, b"ping"), (new, b"pong")):
        sock.settimeout(5)
        assert sock.recv(4) == expected
        sock.close()


def test_reset_cuts_open_connections_and_keeps_accepting(proxy):
    with _client(proxy) as old:
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            old.recv(1)
    _client(proxy).close()
