"""Opening broker connections: every way a connect can fail is a BrokerConnectionError."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from taskq.broker.connection import open_connection
from taskq.errors import BrokerConnectionError
from taskq.settings import Settings


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never says a word (a blackhole)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not done.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    done.set()
    thread.join(timeout=5)
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_broker_that_accepts_but_never_answers_is_a_connection_error(
    silent_port: int,
) -> None:
    # pika ends this handshake with AMQPConnectorStackTimeout, which is not an AMQPError:
    # unwrapped, it killed the worker's I/O thread and the relay instead of a reconnect.
    settings = Settings.load(
        {"broker_url": f"amqp://guest:s3cret@127.0.0.1:{silent_port}/%2F",
         "connect_timeout_s": 0.3}
    )

    with pytest.raises(BrokerConnectionError) as caught:
        open_connection(settings, client_name="test")

    assert f"127.0.0.1:{silent_port}" in str(caught.value)
    assert "s3cret" not in str(caught.value)
