"""Ordered queues against the real broker and databases: routing, delays, the outbox claim,
a changed partition count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App, TopologyError
from taskq.broker import _management as management
from taskq.broker.connection import declare, open_connection
from taskq.db import utcnow
from taskq.ordering.keys import partition_of
from taskq.outbox.store import OutboxStore
from taskq.schema import outbox_table
from taskq.status import collect, render
from tests.faults.services import ManagedRabbit
from tests.support.waiting import wait_until


@pytest.fixture
def ledger(make_app: Callable[..., App], namespace: str, database_url: str) -> App:
    app = make_app("ledger", database_url=database_url)
    app.queue(f"{namespace}.ledger", partitions=16)
    app.create_tables()

    @app.task(name="post", queue=f"{namespace}.ledger", ordering_key="account")
    def post(account: str, seq: int) -> None: ...

    return app


def _partition(app: App, key: str) -> str:
    queue = app.registry.get("post").queue
    return f"{queue}.p{partition_of(key, 16)}"


def _ids(broker: Any, queue: str) -> list[str]:
    return [props.message_id for _, props, _ in broker.get_all(queue)]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_delay_and_bulk_put_a_key_in_its_partition(ledger: App, broker: Any) -> None:
    post = ledger.registry.get("post")
    one = post.delay("acct-42", 0)
    many = post.starmap([("acct-42", 1), ("acct-7", 0)])
    assert _ids(broker, _partition(ledger, "acct-42")) == [one.id, many[0].id]
    assert _ids(broker, _partition(ledger, "acct-7")) == [many[1].id]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_delayed_task_enters_its_partition_when_due(ledger: App, broker: Any) -> None:
    post = ledger.registry.get("post")
    post.apply_async(("acct-7", 0), countdown=0.1)  # the delay tiers are declared once
    later = post.apply_async(("acct-42", 0), countdown=1.5)
    now = post.delay("acct-42", 1)
    partition = _partition(ledger, "acct-42")
    assert _ids(broker, partition) == [now.id]  # not due yet: only the undelayed one
    post.delay("acct-42", 2)  # when due it enters behind what is there by then
    wait_until(lambda: broker.depth(partition) == 2, timeout_s=10,
               message="the delayed task in its partition")
    assert _ids(broker, partition)[1] == later.id  # it entered when due, behind


def test_the_relay_publishes_one_key_oldest_first_and_a_failing_head_blocks_only_its_key(
    ledger: App, broker: Any
) -> None:
    post = ledger.registry.get("post")
    with Session(ledger.engine) as session, session.begin():
        head = post.apply_async(("K", 0), session=session)
        second = post.apply_async(("K", 1), session=session)
        other = post.apply_async(("L", 0), session=session)
    with ledger.engine.begin() as conn:  # the head of K cannot be published (corrupt headers)
        conn.execute(outbox_table.update().where(outbox_table.c.id == head.id)
                     .values(headers=b"\xc1"))
    relay = ledger.relay()
    # The first claim sees only the heads of K and L; K's fails and is held for a retry
    assert relay.run_once() == 1
    assert relay.run_once() == 0  # K's second row waits behind its held head
    assert _ids(broker, _partition(ledger, "L")) == [other.id]
    assert broker.depth(_partition(ledger, "K")) == 0  # nothing of K was sent yet
    # Once the head is repaired and due, K's rows go out in order
    with ledger.engine.begin() as conn:
        good = conn.execute(sa.select(outbox_table.c.headers)
                            .where(outbox_table.c.id == second.id)).scalar_one()
        conn.execute(outbox_table.update().where(outbox_table.c.id == head.id)
                     .values(headers=good, next_attempt_at=sa.func.current_timestamp()))
    wait_until(lambda: relay.run_once() == 0 and broker.depth(_partition(ledger, "K")) == 2,
               timeout_s=10, message="both rows of K published")
    assert _ids(broker, _partition(ledger, "K")) == [head.id, second.id]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_second_relay_claims_no_row_behind_a_head_the_first_holds(ledger: App) -> None:
    post = ledger.registry.get("post")
    with Session(ledger.engine) as session, session.begin():
        for seq in range(3):
            post.apply_async(("K", seq), session=session)
        post.apply_async(("L", 0), session=session)
    store = OutboxStore()
    with ledger.engine.connect() as first, ledger.engine.connect() as second:
        claimed = store.claim(first, limit=10, now=utcnow())  # locks K's head and L's
        assert sorted(row.ordering_key for row in claimed) == ["K", "L"]
        assert store.claim(second, limit=10, now=utcnow()) == []  # nothing overtakes them
        first.rollback()
        second.rollback()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("count", [8, 32])
def test_changing_the_partition_count_is_refused_with_the_migration_steps(
    ledger: App, make_app: Callable[..., App], namespace: str, count: int, broker: Any
) -> None:
    connection = open_connection(ledger.settings, client_name="taskq tests")
    try:  # every partition exists with 16, as a worker declares them
        channel = declare(connection.channel(), ledger.topology.base())
        declare(channel, ledger.topology.for_queue(f"{namespace}.ledger"))
    finally:
        connection.close()
    resized = make_app("resized")
    resized.queue(f"{namespace}.ledger", partitions=count)

    @resized.task(name="post", queue=f"{namespace}.ledger", ordering_key="account")
    def post(account: str, seq: int) -> None: ...

    with pytest.raises(TopologyError, match="changing the count") as caught:
        post.delay("K", 0)
    more_or_fewer = "more" if count < 16 else "fewer"
    assert f"exists with {more_or_fewer} than {count} partitions" in str(caught.value)
    assert "To migrate" in str(caught.value)
    # Nothing was published anywhere, nor were new partitions created
    assert not broker.exists(f"{namespace}.ledger.p{max(count, 16)}")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_status_shows_each_partitions_depth_and_says_the_active_consumer_is_unknown(
    ledger: App,
) -> None:
    # The shared broker has no management plugin: depths yes, active consumer unknown
    post = ledger.registry.get("post")
    for seq in range(3):
        post.delay("acct-42", seq)
    status = collect(ledger)
    (ordered,) = status.ordered
    depths = {p.name: p.ready for p in ordered.partitions}
    assert depths[_partition(ledger, "acct-42")] == 3
    assert sum(depths.values()) == 3
    assert not ordered.active_known
    text = render(status)
    assert f"{_partition(ledger, 'acct-42')}" in text and "unknown" in text
    assert "enable rabbitmq_management" in text
    row = next(q for q in status.queues if q.name == post.queue)
    assert (row.exists, row.ready) == (True, 3)  # the ordered queue's total


@pytest.mark.slow
def test_status_names_the_active_consumer_of_each_partition_with_the_management_api(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, namespace: str
) -> None:
    node = ManagedRabbit()
    try:
        node.start()
        monkeypatch.setattr(management, "MANAGEMENT_PORT", node.management_port)
        app = App("managed", broker_url=node.url, namespace=namespace,
                  database_url=f"sqlite:///{tmp_path}/t.db")
        app.queue("ledger", partitions=2)
        # Two consumers on each partition: the first registered is the active one
        first, second = (_named_connection(node.url, name) for name in ("first", "second"))
        try:
            channel = declare(first.channel(), app.topology.base())
            declare(channel, app.topology.for_queue("ledger"))
            for connection in (first, second):
                ch = connection.channel()
                for name in app.topology.partition_queues("ledger"):
                    ch.basic_consume(name, lambda *a: None)
            # the management API's consumer lists lag (statistics are collected every few
            # seconds): wait until both connections' consumers are in them
            status = wait_until(
                lambda: (s := collect(app)).ordered and all(
                    p.active and p.consumers == 2 for p in s.ordered[0].partitions) and s,
                timeout_s=30, message="active consumers reported by the management API",
            )
            (ordered,) = status.ordered
            assert ordered.active_known
            assert all(p.consumers == 2 for p in ordered.partitions)
            assert [p.active for p in ordered.partitions] == ["first", "first"]
            assert "first" in render(status)
            # When the active one goes, the other one is active
            first.close()
            wait_until(lambda: [p.active for p in collect(app).ordered[0].partitions]
                       == ["second", "second"], timeout_s=30, message="the failover shown")
        finally:
            for connection in (first, second):
                if connection.is_open:
                    connection.close()
    finally:
        node.close()


def _named_connection(url: str, name: str) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)
