"""The management API client never sends broker credentials in clear for an amqps broker."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pika
import pytest

from taskq.broker import _management as management
from taskq.broker import connection as connection_module
from taskq.broker import inspect
from taskq.settings import Settings


@pytest.mark.parametrize(
    ("broker_url", "expected"),
    [
        ("amqp://u:p@rabbit:5672/%2F", "http://rabbit:15672"),
        ("amqps://u:p@rabbit:5671/%2F", "https://rabbit:15671"),
        ("amqps://u:p@[::1]/%2F", "https://[::1]:15671"),
    ],
)
def test_management_url_is_https_for_an_amqps_broker(broker_url: str, expected: str) -> None:
    assert management.base_url(pika.URLParameters(broker_url)) == expected


class _Listener:
    """A plain TCP server on 127.0.0.1 that records the first bytes of each connection."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with client:
                client.settimeout(5)
                data = b""
                try:
                    # A TLS ClientHello or an HTTP request head; then hang up.
                    while b"\r\n\r\n" not in data and not data.startswith(b"\x16"):
                        chunk = client.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    pass
                self.received.append(data)

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close does not)
        self.server.close()
        self._thread.join(5)


@pytest.fixture
def listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Listener]:
    server = _Listener()
    # Both management ports lead to the listener: whatever the client picks, it is seen.
    monkeypatch.setattr(management, "MANAGEMENT_PORT", server.port)
    monkeypatch.setattr(management, "MANAGEMENT_TLS_PORT", server.port)
    yield server
    server.close()


def _describe_via_connection_module(broker_url: str) -> None:
    # _existing_arguments reads the parameters of an open connection; give it those alone.
    params = pika.URLParameters(broker_url)
    connection = SimpleNamespace(_impl=SimpleNamespace(params=params))
    assert connection_module._existing_arguments(connection, "queue", "q") is None  # type: ignore[arg-type]


def _status_via_inspect(broker_url: str) -> None:
    settings = Settings.load({"broker_url": broker_url}, environ={})
    assert inspect._from_management(settings, ["q"]) is None


@pytest.mark.parametrize("ask", [_status_via_inspect, _describe_via_connection_module])
def test_amqps_broker_credentials_never_go_over_plain_http(listener: _Listener, ask) -> None:
    # When taskq asks the management API of an amqps broker (the listener speaks no TLS)
    ask("amqps://guest:Sup3rSecret@127.0.0.1:5671/%2F")

    # Then what reached the port was a TLS handshake, never a request with the credentials
    assert listener.received, "no connection reached the listener"
    for data in listener.received:
        assert data.startswith(b"\x16"), data[:80]  # a TLS handshake record
        assert b"Authorization" not in data and b"Sup3rSecret" not in data


@pytest.mark.parametrize("ask", [_status_via_inspect, _describe_via_connection_module])
def test_amqp_broker_is_asked_over_plain_http(listener: _Listener, ask) -> None:
    # The listener does see a plain-HTTP request (so the test above would catch one)
    ask("amqp://guest:guest@127.0.0.1:5672/%2F")

    assert [data[:4] for data in listener.received] == [b"GET "]
    assert b"Authorization: Basic " in listener.received[0]
