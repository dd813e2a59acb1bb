"""The ports that private test services (RabbitMQ nodes, their epmd, proxies) are given."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit

from tests.conftest import BROKER_URL
from tests.support.rabbitmq_nodes import free_port, speaks_amqp


def test_free_port_never_hands_out_the_same_port_twice() -> None:
    # bind(0) may give back a port it gave a moment ago, once that socket is closed: a
    # private node got the port of its own epmd that way and could not start (eaddrinuse).
    ports = [free_port() for _ in range(2000)]

    assert len(set(ports)) == len(ports)


def test_a_port_where_something_else_listens_does_not_speak_amqp() -> None:
    # epmd (or any other server) accepts the TCP connection; only an AMQP server answers
    # the protocol header with a frame.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def accept_and_close() -> None:
            connection, _ = listener.accept()
            connection.close()

        server = threading.Thread(target=accept_and_close, daemon=True)
        server.start()
        assert not speaks_amqp(port)
        server.join(5)


def test_the_test_broker_speaks_amqp() -> None:
    assert speaks_amqp(urlsplit(BROKER_URL).port or 5672)
