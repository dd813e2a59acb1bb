"""The Publisher against the real RabbitMQ: confirms, parking, errors, reconnects, fork.

Every test works in its own namespace ``t<uuid8>`` and deletes what it declared through a
separate admin connection. Outages go through TCP proxies on 127.0.0.1, never the broker.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from taskq.broker.publisher import Publisher
from taskq.broker.topology import QueueOptions, Topology
from taskq.errors import PublishError, TopologyError
from taskq.message import CONTENT_TYPE, IDEMPOTENCY_KEY, RETRIES, TASK, TASKQ_VERSION, WireMessage
from taskq.settings import Settings
from tests.conftest import BROKER_URL
from tests.support.broker import BrokerAdmin
from tests.support.waiting import wait_until


class Names:
    """Names of one test's namespace; remembers the queues it hands out for cleanup."""

    def __init__(self) -> None:
        self.ns = f"t{uuid.uuid4().hex[:8]}"
        self.queues: list[str] = []

    def queue(self, suffix: str) -> str:
        name = f"{self.ns}.{suffix}"
        self.queues.append(name)
        return name


@pytest.fixture
def names() -> Iterator[Names]:
    names = Names()
    yield names
    admin = BrokerAdmin(BROKER_URL)
    try:
        for queue in names.queues:
            admin.delete_queue(queue)
            admin.delete_queue(f"{queue}.dlq")
        admin.delete_queue(f"{names.ns}.unroutable")
        for exchange in (names.ns, f"{names.ns}.dlx", f"{names.ns}.unroutable"):
            admin.delete_exchange(exchange)
    finally:
        admin.close()


@pytest.fixture
def admin() -> Iterator[BrokerAdmin]:
    admin = BrokerAdmin(BROKER_URL)
    yield admin
    admin.close()


@pytest.fixture
def make_publisher(names: Names) -> Iterator[Callable[..., Publisher]]:
    publishers: list[Publisher] = []

    def factory(
        queues: dict[str, QueueOptions] | None = None, **settings: Any
    ) -> Publisher:
        settings.setdefault("broker_url", BROKER_URL)
        settings.setdefault("connect_timeout_s", 2.0)
        loaded = Settings.load({"namespace": names.ns, **settings}, environ={})
        publisher = Publisher(loaded, Topology(names.ns, queues=queues or {}))
        publishers.append(publisher)
        return publisher

    yield factory
    for publisher in publishers:
        publisher.close()


def wire(priority: int = 0, **headers: Any) -> WireMessage:
    task_id = str(uuid.uuid4())
    return WireMessage(
        body=b"\x82\xa4args\x90\xa6kwargs\x80",
        message_id=task_id,
        headers={TASKQ_VERSION: 1, TASK: "tests.noop", RETRIES: 0, **headers},
        priority=priority,
        timestamp=int(time.time()),
        app_id="publisher-tests",
        content_type=CONTENT_TYPE,
    )


def send(publisher: Publisher, queue: str, message: WireMessage | None = None) -> WireMessage:
    message = message or wire()
    publisher.publish(
        message, exchange=publisher._topology.exchange, routing_key=queue, task="tests.noop"
    )
    return message


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- confirmed publishing ------------------------------------------------------------------


def test_confirmed_publish_lands_in_the_queue(make_publisher, names, admin):
    publisher = make_publisher()
    queue = names.queue("work")

    send(publisher, queue)

    # A confirm means the broker enqueued (and, persistent, stored) it: no waiting needed.
    assert admin.depth(queue) == 1
    assert admin.depth(f"{queue}.dlq") == 0
    assert admin.depth(f"{names.ns}.unroutable") == 0


def test_properties_and_headers_on_the_wire_follow_the_protocol(make_publisher, names, admin):
    publisher = make_publisher()
    queue = names.queue("work")
    message = wire(priority=7, **{IDEMPOTENCY_KEY: "order-42"})

    send(publisher, queue, message)

    [(method, properties, body)] = admin.get_all(queue)
    assert method.exchange == names.ns
    assert method.routing_key == queue
    assert body == message.body
    assert properties.message_id == message.message_id
    assert properties.content_type == "application/x-msgpack"
    assert properties.delivery_mode == 2
    assert properties.priority == 7
    assert properties.timestamp == message.timestamp
    assert properties.app_id == "publisher-tests"
    assert properties.headers == {
        "taskq-v": 1,
        "taskq-task": "tests.noop",
        "taskq-retries": 0,
        "taskq-idempotency-key": "order-42",
    }


def test_publish_many_lands_every_message(make_publisher, names, admin):
    publisher = make_publisher()
    queue = names.queue("bulk")
    messages = [wire() for _ in range(1000)]

    publisher.publish_many((names.ns, queue, message) for message in messages)

    assert admin.depth(queue) == 1000
    got = admin.get_all(queue)
    assert [p.message_id for _, p, _ in got] == [m.message_id for m in messages]


def test_a_message_that_cannot_be_framed_is_refused_alone_and_leaves_nothing_behind(
    make_publisher, names, admin
):
    # A message whose frames cannot be built (encode() refuses such headers; this one is
    # built by hand, as an old outbox row could be) is refused by itself: the others of the
    # batch are published, and nothing of it goes out with the next call.
    publisher = make_publisher()
    queue = names.queue("unframeable")
    bad = dataclasses.replace(wire(), headers={"h" * 300: 1})
    batch = [wire() for _ in range(5)] + [bad] + [wire() for _ in range(4)]

    with pytest.raises(PublishError, match="longer than 255 bytes") as caught:
        publisher.publish_many((names.ns, queue, message) for message in batch)
    assert caught.value.reason == "unencodable"
    assert caught.value.unconfirmed_ids == [bad.message_id]
    later = [wire(), wire()]
    publisher.publish_many((names.ns, queue, message) for message in later)

    assert [p.message_id for _, p, _ in admin.get_all(queue)] == [
        m.message_id for m in [*batch[:5], *batch[6:], *later]
    ]


def test_a_single_message_amqp_cannot_carry_is_refused_without_a_reconnect(
    make_publisher, names, admin, caplog
):
    publisher = make_publisher()
    queue = names.queue("float-header")
    bad = dataclasses.replace(wire(), headers={"x-score": 1.5})

    with pytest.raises(PublishError, match="cannot be encoded") as caught:
        publisher.publish(bad, exchange=names.ns, routing_key=queue)
    assert caught.value.reason == "unencodable"
    assert "reconnecting" not in caplog.text
    good = wire()
    publisher.publish(good, exchange=names.ns, routing_key=queue)
    assert [p.message_id for _, p, _ in admin.get_all(queue)] == [good.message_id]


def test_concurrent_threads_share_one_publisher(make_publisher, names, admin):
    publisher = make_publisher()
    queue = names.queue("threads")
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(50):
                send(publisher, queue)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert admin.depth(queue) == 200


# -- unroutable, returned, refused ---------------------------------------------------------


def test_unroutable_publish_is_parked_in_the_unroutable_queue(make_publisher, names, admin):
    # Given a queue the publisher has declared on this connection, whose binding then vanishes
    publisher = make_publisher()
    queue = names.queue("gone")
    send(publisher, queue)
    admin.unbind(queue, names.ns, queue)

    # When a message is published with that routing key (nothing routes it any more)
    parked = send(publisher, queue)

    # Then the exchange's alternate exchange parks it: confirmed, no error, nothing lost
    assert admin.depth(queue) == 1
    [(_, properties, _)] = admin.get_all(f"{names.ns}.unroutable")
    assert properties.message_id == parked.message_id


def test_returned_message_raises_publish_error(make_publisher, names):
    publisher = make_publisher()
    message = wire()

    # amq.direct has no alternate exchange: mandatory makes the broker return the message.
    with pytest.raises(PublishError) as caught:
        publisher.publish(message, exchange="amq.direct", routing_key=f"{names.ns}.nowhere")

    assert caught.value.reason == "returned"
    assert caught.value.task_id == message.message_id
    assert message.message_id in str(caught.value)
    assert "NO_ROUTE" in str(caught.value)


def test_missing_exchange_raises_and_keeps_the_connection(make_publisher, names, admin):
    publisher = make_publisher()
    queue = names.queue("work")
    send(publisher, queue)
    link = publisher._link

    with pytest.raises(PublishError) as caught:
        publisher.publish(wire(), exchange=f"{names.ns}.missing", routing_key=queue, task="t")

    assert caught.value.reason == "channel_error"
    assert "404" in str(caught.value) and f"{names.ns}.missing" in str(caught.value)
    send(publisher, queue)
    assert publisher._link is link, "a channel error must not cost the connection"
    assert admin.depth(queue) == 2


def test_nack_from_a_full_queue_raises_without_retry(make_publisher, names, admin):
    queue = names.queue("full")
    publisher = make_publisher(
        queues={queue: QueueOptions(max_length=1, overflow="reject-publish")}
    )
    send(publisher, queue)

    refused = wire()
    with pytest.raises(PublishError) as caught:
        send(publisher, queue, refused)

    assert caught.value.reason == "nack"
    assert caught.value.task_id == refused.message_id
    assert queue in str(caught.value) and "reject-publish" in str(caught.value)
    assert admin.depth(queue) == 1


def test_publish_many_names_the_messages_that_were_not_confirmed(make_publisher, names, admin):
    queue = names.queue("full")
    publisher = make_publisher(
        queues={queue: QueueOptions(max_length=10, overflow="reject-publish")}
    )
    messages = [wire() for _ in range(15)]

    with pytest.raises(PublishError) as caught:
        publisher.publish_many((names.ns, queue, message) for message in messages)

    assert sorted(caught.value.unconfirmed_ids) == sorted(m.message_id for m in messages[10:])
    assert admin.depth(queue) == 10


# -- topology --------------------------------------------------------------------------------


def test_existing_queue_with_other_arguments_raises_topology_error(
    make_publisher, names, admin
):
    # Given a queue somebody declared with x-max-priority 5 (taskq declares 10)
    queue = names.queue("conflict")
    admin.declare_queue(queue, {"x-max-priority": 5})
    publisher = make_publisher()
    other = names.queue("fine")
    send(publisher, other)
    link = publisher._link

    with pytest.raises(TopologyError) as caught:
        send(publisher, queue)

    text = str(caught.value)
    assert repr(queue) in text
    assert "'x-max-priority': 10" in text  # what taskq declares
    assert "'x-max-priority': 5" in text  # what the existing queue has
    assert caught.value.queue == queue
    assert caught.value.expected["x-max-priority"] == 10
    assert caught.value.actual == {"x-max-priority": 5}
    # ... and the publisher's connection is still usable, without a reconnect
    send(publisher, other)
    assert publisher._link is link
    assert admin.depth(other) == 2
    assert admin.depth(queue) == 0


# -- outages -------------------------------------------------------------------------------


def test_unreachable_broker_raises_publish_error_without_the_password(make_publisher, names):
    url = f"amqp://guest:s3cret-Pw@127.0.0.1:{free_port()}/%2F"
    publisher = make_publisher(broker_url=url, connect_timeout_s=1.0)
    message = wire()

    started = time.monotonic()
    with pytest.raises(PublishError) as caught:
        send(publisher, names.queue("work"), message)

    assert time.monotonic() - started < 3.0
    error = caught.value
    assert error.reason == "unreachable"
    assert error.task == "tests.noop" and error.task_id == message.message_id
    assert "tests.noop" in str(error) and message.message_id in str(error)
    assert "127.0.0.1" in str(error)
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    assert all("s3cret-Pw" not in f"{exc} {exc!r}" for exc in chain)


@pytest.fixture
def proxy() -> Iterator[Any]:
    from tests.support.proxy import TcpProxy

    with TcpProxy.for_url(BROKER_URL) as proxy:
        yield proxy


def test_lost_connection_is_retried_transparently(make_publisher, names, admin, proxy):
    publisher = make_publisher(broker_url=proxy.url(BROKER_URL))
    queue = names.queue("work")
    send(publisher, queue)
    before = publisher._link

    proxy.cut()
    proxy.restore()
    send(publisher, queue)  # no error: one reconnect-and-retry happened

    assert publisher._link is not before
    assert admin.depth(queue) == 2


def test_connection_kept_cut_raises_publish_error_after_publish_timeout(
    make_publisher, names, proxy
):
    publisher = make_publisher(
        broker_url=proxy.url(BROKER_URL), connect_timeout_s=1.0, publish_timeout_s=1.0
    )
    queue = names.queue("work")
    send(publisher, queue)

    proxy.cut()
    started = time.monotonic()
    with pytest.raises(PublishError) as caught:
        send(publisher, queue)

    # Reconnects are refused at once; they go on until publish_timeout_s (docs/cluster.md), and an
    # attempt under way may take one connect timeout more.
    assert 1.0 <= time.monotonic() - started < 3.5
    assert caught.value.reason == "connection_lost"
    assert queue in str(caught.value)
    assert ":***@" in str(caught.value) and "guest:guest" not in str(caught.value)


class FreezingProxy:
    """A forwarder whose existing connections can stop passing broker->client bytes.

    Frozen connections stay open but deliver no confirms (a stalled peer); connections
    accepted later flow normally.
    """

    def __init__(self, amqp_url: str) -> None:
        parts = urlsplit(amqp_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._frozen: list[threading.Event] = []
        self._sockets: list[socket.socket] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, amqp_url: str) -> str:
        host, port = self._upstream
        return amqp_url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}")

    def freeze(self) -> None:
        for gate in self._frozen:
            gate.clear()

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        for gate in self._frozen:
            gate.set()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            gate = threading.Event()
            gate.set()
            self._frozen.append(gate)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, gate), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        try:
            while data := src.recv(65536):
                if gate is not None:
                    gate.wait()
                    if self._stopped.is_set():
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_confirm_timeout_aborts_and_retries_on_a_new_connection(make_publisher, names, admin):
    # Given a publisher whose connection stalls: the broker's confirms never reach it
    stalling = FreezingProxy(BROKER_URL)
    try:
        publisher = make_publisher(
            broker_url=stalling.url(BROKER_URL), publish_confirm_timeout_s=0.5
        )
        queue = names.queue("work")
        send(publisher, queue)
        stalled = publisher._link
        stalling.freeze()

        # When it publishes, the confirm times out; the retry goes over a new connection
        started = time.monotonic()
        send(publisher, queue)
        elapsed = time.monotonic() - started

        # Then it succeeds, after the timeout, and the message is there twice: the broker had
        # taken the first copy (duplicates, never losses; the idempotency key handles them)
        assert 0.5 <= elapsed < 5.0
        assert publisher._link is not stalled and stalled.connection.is_closed
        wait_until(lambda: admin.depth(queue) == 3, timeout_s=5, message="3 messages in queue")
    finally:
        stalling.stop()


def test_forked_child_publishes_on_its_own_connection(make_publisher, names, admin):
    publisher = make_publisher()
    queue = names.queue("fork")
    send(publisher, queue)
    parent_link = publisher._link

    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            send(publisher, queue)
            code = 0 if publisher._link is not parent_link else 2
        finally:
            os._exit(code)

    deadline = time.monotonic() + 20
    while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        assert time.monotonic() < deadline, "child did not exit"
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(waited[1]) == 0
    assert admin.depth(queue) == 2

    # The parent's connection was not touched by the child: it works, without a reconnect.
    send(publisher, queue)
    assert publisher._link is parent_link
    assert admin.depth(queue) == 3


# -- failover (docs/cluster.md: several nodes, publish_timeout_s) ----------------------------


def _restore_later(proxy: Any, delay_s: float) -> threading.Timer:
    # The fault schedule of the test (the broker "comes back"), not a wait for a condition.
    timer = threading.Timer(delay_s, proxy.restore)
    timer.start()
    return timer


def test_publish_after_a_lost_connection_waits_for_the_broker_within_publish_timeout(
    make_publisher, names, admin, proxy
):
    # Given a publisher whose connection is cut, and the broker back 1 s later
    publisher = make_publisher(broker_url=proxy.url(BROKER_URL), publish_timeout_s=10.0)
    queue = names.queue("work")
    send(publisher, queue)
    proxy.cut()
    timer = _restore_later(proxy, 1.0)

    # When it publishes meanwhile, it keeps reconnecting and publishes the same message
    message = wire()
    started = time.monotonic()
    send(publisher, queue, message)
    timer.join()

    # Then the call returned once the broker answered again, and the message is there
    assert 0.9 <= time.monotonic() - started < 8.0
    got = admin.get_all(queue)
    assert [m[1].message_id for m in got][-1] == message.message_id


def test_publish_fails_over_to_the_next_node(make_publisher, names, admin):
    from tests.support.proxy import TcpProxy

    # Given two "nodes" (two proxies to the broker) in one broker_url
    with TcpProxy.for_url(BROKER_URL) as node1, TcpProxy.for_url(BROKER_URL) as node2:
        nodes = {node1.port: node1, node2.port: node2}
        publisher = make_publisher(
            broker_url=[node1.url(BROKER_URL), node2.url(BROKER_URL)], publish_timeout_s=5.0
        )
        queue = names.queue("work")
        send(publisher, queue)
        first_port = publisher._link.connection._impl.params.port

        # When the node it is connected to dies
        nodes[first_port].cut()
        started = time.monotonic()
        message = send(publisher, queue)

        # Then the publish went to the other node at once, same message id
        assert time.monotonic() - started < 2.0
        assert publisher._link.connection._impl.params.port != first_port
        got = admin.get_all(queue)
        assert [m[1].message_id for m in got][-1] == message.message_id


def test_no_node_answering_names_every_node_without_passwords(make_publisher, names):
    urls = [f"amqp://guest:s3cret-{n}@127.0.0.1:{free_port()}/%2F" for n in (1, 2)]
    publisher = make_publisher(broker_url=";".join(urls), connect_timeout_s=1.0)

    with pytest.raises(PublishError) as caught:
        send(publisher, names.queue("work"))

    text = str(caught.value)
    assert caught.value.reason == "unreachable"
    assert "s3cret" not in text and text.count(":***@127.0.0.1:") == 2
    assert "any of the 2 RabbitMQ nodes" in text


@pytest.fixture
def full_side_queue(names, admin):
    """A queue outside the app's topology that nacks while full (max-length 1)."""
    queue = names.queue("side")
    exchange = f"{names.ns}.side"
    channel = admin.channel
    channel.exchange_declare(exchange, exchange_type="direct", auto_delete=False)
    channel.queue_declare(
        queue, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    channel.queue_bind(queue, exchange, routing_key=queue)
    channel.basic_publish(exchange, queue, b"first")
    wait_until(lambda: admin.depth(queue) == 1, timeout_s=5, message="side queue filled")
    yield exchange, queue
    admin.delete_exchange(exchange)


def _drain_later(queue: str, delay_s: float) -> threading.Timer:
    def drain() -> None:
        other = BrokerAdmin(BROKER_URL)
        try:
            other.channel.queue_purge(queue)
        finally:
            other.close()

    timer = threading.Timer(delay_s, drain)
    timer.start()
    return timer


def test_a_nack_is_published_again_until_publish_timeout(make_publisher, full_side_queue, admin):
    # Given a queue that nacks now (as a quorum queue does while it elects a leader) and
    # takes messages again 0.5 s later
    exchange, queue = full_side_queue
    publisher = make_publisher(publish_timeout_s=10.0)
    timer = _drain_later(queue, 0.5)

    # When a message is published to it
    message = wire()
    publisher.publish(message, exchange=exchange, routing_key=queue, task="tests.noop")
    timer.join()

    # Then the publish was retried with the same message id until it was confirmed
    assert [m[1].message_id for m in admin.get_all(queue)] == [message.message_id]


def test_publish_many_sends_nacked_messages_again(make_publisher, full_side_queue, admin):
    exchange, queue = full_side_queue
    publisher = make_publisher(publish_timeout_s=10.0)
    messages = [wire()]
    timer = _drain_later(queue, 0.5)

    publisher.publish_many((exchange, queue, message) for message in messages)
    timer.join()

    assert [m[1].message_id for m in admin.get_all(queue)] == [messages[0].message_id]


def test_a_nack_is_reported_once_publish_timeout_is_spent(make_publisher, full_side_queue):
    exchange, queue = full_side_queue
    publisher = make_publisher(publish_timeout_s=0.5)

    started = time.monotonic()
    with pytest.raises(PublishError) as caught:
        publisher.publish(wire(), exchange=exchange, routing_key=queue, task="tests.noop")

    assert caught.value.reason == "nack"
    assert 0.5 <= time.monotonic() - started < 3.0
