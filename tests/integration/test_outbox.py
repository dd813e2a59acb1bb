"""The transactional outbox against real RabbitMQ, PostgreSQL and SQLite (docs/reliability.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App, SerializationError
from taskq.db import as_aware
from taskq.schema import outbox_table
from tests.conftest import BROKER_URL
from tests.support.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def outbox_rows(app: App) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(outbox_table)).scalar())


@pytest.fixture
def shop(make_app: Callable[..., App], database_url: str) -> App:
    app = make_app("shop", database_url=database_url)
    app.create_tables()

    @app.task(name="ship")
    def ship(order_id: int) -> None:
        return None

    return app


def ship(app: App) -> Any:
    return app.registry.get("ship")


def test_rolled_back_transaction_never_publishes(shop: App, broker: Any) -> None:
    with Session(shop.engine) as session:
        ship(shop).apply_async((1,), session=session)
        session.rollback()

    relay = shop.relay()
    assert relay.run_once() == 0
    assert outbox_rows(shop) == 0
    assert not broker.exists(ship(shop).queue)  # not even declared: nothing was sent


def test_committed_row_is_published_once_and_deleted(shop: App, broker: Any) -> None:
    with Session(shop.engine) as session, session.begin():
        result = ship(shop).delay_on(session, 7)

    relay = shop.relay()
    assert relay.run_once() == 1
    assert relay.run_once() == 0

    assert outbox_rows(shop) == 0
    [(_, props, _body)] = broker.get_all(ship(shop).queue)
    assert props.message_id == result.id
    assert props.headers["taskq-task"] == "ship"
    assert props.delivery_mode == 2


def test_a_task_id_of_255_bytes_goes_through_the_outbox(shop: App, broker: Any) -> None:
    # Task ids may be any AMQP short string (apply_async(task_id=...)), not only uuids.
    task_id = "o" * 255
    with Session(shop.engine) as session, session.begin():
        ship(shop).apply_async((1,), session=session, task_id=task_id)

    assert shop.relay().run_once() == 1

    [(_, props, _body)] = broker.get_all(ship(shop).queue)
    assert props.message_id == task_id


def test_core_connection_works_like_a_session(shop: App, broker: Any) -> None:
    with shop.engine.begin() as conn:
        ship(shop).apply_async((1,), session=conn)

    assert shop.relay().run_once() == 1
    assert broker.depth(ship(shop).queue) == 1


def test_serialization_error_is_raised_in_the_callers_code(shop: App) -> None:
    with Session(shop.engine) as session, session.begin():
        with pytest.raises(SerializationError, match="ship"):
            ship(shop).apply_async(({1, 2},), session=session)

    assert outbox_rows(shop) == 0


def test_idempotency_key_makes_the_second_enqueue_a_no_op(shop: App, broker: Any) -> None:
    for _ in range(2):
        with Session(shop.engine) as session, session.begin():
            ship(shop).apply_async((1,), session=session, idempotency_key="order-1-shipped")

    assert outbox_rows(shop) == 1
    assert shop.relay().run_once() == 1
    [(_, props, _)] = broker.get_all(ship(shop).queue)
    assert props.headers["taskq-idempotency-key"] == "order-1-shipped"


def test_rows_keep_their_order_per_queue(shop: App, broker: Any) -> None:
    with Session(shop.engine) as session, session.begin():
        ids = [ship(shop).delay_on(session, n).id for n in range(50)]

    relay = shop.relay()
    while relay.run_once():
        pass

    got = [props.message_id for _, props, _ in broker.get_all(ship(shop).queue)]
    assert got == ids


def test_countdown_holds_the_row_until_due(shop: App, broker: Any) -> None:
    # Rows due further ahead than the horizon stay in the table (nearer ones go to the
    # delay backend: tests/integration/test_outbox_delays.py).
    shop.configure(outbox_delay_horizon_s=30)
    with Session(shop.engine) as session, session.begin():
        ship(shop).apply_async((1,), session=session, countdown=60)
    now = datetime.now(timezone.utc)
    relay = shop.relay()

    relay.clock = lambda: now
    assert relay.run_once() == 0
    relay.clock = lambda: now + timedelta(seconds=61)
    assert relay.run_once() == 1

    [(_, props, _)] = broker.get_all(ship(shop).queue)
    assert props.headers["taskq-eta"] >= int(now.timestamp() * 1000) + 59_000


def test_backlog_reports_rows_and_oldest_age(shop: App) -> None:
    with Session(shop.engine) as session, session.begin():
        for n in range(5):
            ship(shop).delay_on(session, n)

    backlog = shop.outbox_backlog()

    assert backlog.rows == 5
    assert backlog.oldest_created_at is not None
    assert 0 <= backlog.oldest_age_s() < 60


def test_a_row_that_cannot_be_published_is_marked_and_does_not_block(
    shop: App, broker: Any
) -> None:
    with Session(shop.engine) as session, session.begin():
        bad = ship(shop).delay_on(session, 1)
        ship(shop).delay_on(session, 2)
    with shop.engine.begin() as conn:  # corrupt the first row's headers
        conn.execute(
            outbox_table.update().where(outbox_table.c.id == bad.id).values(headers=b"\xc1")
        )

    assert shop.relay().run_once() == 1

    with shop.engine.connect() as conn:
        row = conn.execute(sa.select(outbox_table)).mappings().one()
    assert row["id"] == bad.id
    assert row["attempts"] == 1
    assert row["last_error"]
    assert broker.depth(ship(shop).queue) == 1


def spoil_headers(app: App, row_id: str, **extra: Any) -> None:
    """Give a stored row headers AMQP cannot carry (as a row written by an older taskq)."""
    with app.engine.begin() as conn:
        packed = conn.execute(
            sa.select(outbox_table.c.headers).where(outbox_table.c.id == row_id)
        ).scalar_one()
        headers = {**msgpack.unpackb(packed), **extra}
        conn.execute(outbox_table.update().where(outbox_table.c.id == row_id)
                     .values(headers=msgpack.packb(headers)))


BAD_ROWS = {
    # RabbitMQ closes the channel (406) when declaring the row's queue
    "queue_with_other_arguments": "misdeclared",
    # pika cannot encode the row's message (a float header, from an older taskq)
    "header_amqp_cannot_carry": "x-score",
    # RabbitMQ closes the channel (406 invalid message) on a CC header that is not an array
    # (sender-selected distribution); the publisher cannot tell which message it was. taskq
    # refuses CC at enqueue (taskq.road), so only a row from an older taskq carries one.
    "header_the_broker_refuses": "CC",
}


@pytest.mark.parametrize("bad", sorted(BAD_ROWS))
def test_one_row_refused_at_the_channel_level_does_not_stall_the_others(
    shop: App, broker: Any, bad: str
) -> None:
    # Given: the oldest row fails on a live broker, then 450 good rows: three batches.
    task = ship(shop)
    other = f"{shop.settings.namespace}.misdeclared"
    broker.declare_queue(other, {"x-max-priority": 3})
    try:
        with Session(shop.engine) as session, session.begin():
            if bad == "queue_with_other_arguments":
                bad_id = task.apply_async((0,), session=session, queue=other).id
            else:
                bad_id = task.delay_on(session, 0).id
            good = {task.delay_on(session, i).id for i in range(1, 451)}
        if bad == "header_amqp_cannot_carry":
            spoil_headers(shop, bad_id, **{"x-score": 1.5})
        elif bad == "header_the_broker_refuses":
            spoil_headers(shop, bad_id, CC="audit")
        with shop.engine.connect() as conn:
            due_before = conn.execute(sa.select(outbox_table.c.next_attempt_at)
                                      .where(outbox_table.c.id == bad_id)).scalar_one()
        relay = shop.relay()
        stop = threading.Event()
        runner = threading.Thread(target=relay.run, args=(stop.is_set,), daemon=True)

        # When
        runner.start()
        try:
            wait_until(lambda: outbox_rows(shop) == 1, timeout_s=30,
                       message="the good rows did not flow past the bad one")
        finally:
            stop.set()
            runner.join(timeout=30)

        # Then: every good row was published and deleted; the bad one waits, marked. A batch
        # the broker refused as a whole may have been routed in part before the channel
        # closed, so good rows of it can arrive more than once (the idempotency key absorbs
        # them). On main this compared sorted lists and failed when a copy arrived twice.
        published = [props.message_id for _, props, _ in broker.get_all(task.queue)]
        assert set(published) == good
        with shop.engine.connect() as conn:
            row = conn.execute(sa.select(outbox_table)).mappings().one()
        assert row["id"] == bad_id
        assert row["attempts"] >= 1
        assert BAD_ROWS[bad] in row["last_error"]
        assert as_aware(row["next_attempt_at"]) > as_aware(due_before)
    finally:
        broker.delete_queue(other)


PRODUCER = textwrap.dedent(
    """
    import os, sys
    from sqlalchemy.orm import Session
    from taskq import App
    app = App("shop", broker_url="amqp://guest:guest@127.0.0.1:1/%2F",
              database_url=sys.argv[1], namespace=sys.argv[2], default_queue=sys.argv[3])
    @app.task(name="ship")
    def ship(order_id): ...
    with Session(app.engine) as session, session.begin():
        print(ship.delay_on(session, 1).id, flush=True)
    os.kill(os.getpid(), 9)  # the producer dies right after its commit
    """
)


def test_producer_killed_after_commit_is_published_by_the_relay(
    shop: App, broker: Any
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PRODUCER, shop.settings.database_url,
         shop.settings.namespace, shop.settings.default_queue],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    task_id = proc.stdout.strip()

    assert shop.relay().run_once() == 1

    [(_, props, _)] = broker.get_all(ship(shop).queue)
    assert props.message_id == task_id


@pytest.mark.slow
def test_broker_outage_keeps_rows_until_it_returns(
    make_app: Callable[..., App], database_url: str, broker: Any
) -> None:
    from tests.support.proxy import TcpProxy

    # Given a relay whose broker connection goes through a proxy we can cut
    with TcpProxy.for_url(BROKER_URL) as proxy:
        app = make_app("shop", database_url=database_url, broker_url=proxy.url(BROKER_URL),
                       connect_timeout_s=1.0, outbox_poll_interval_s=0.05)
        app.create_tables()
        task = app.task(name="ship")(lambda n: None)
        relay = app.relay()
        relay.config = type(relay.config)(batch_size=200, poll_interval_s=0.05,
                                          retry_base_s=0.05, retry_max_s=0.5)
        stop = threading.Event()
        runner = threading.Thread(target=relay.run, args=(stop.is_set,), daemon=True)
        runner.start()
        try:
            # When the broker is unreachable while 1,000 rows are committed
            proxy.cut()
            for chunk in range(10):
                with Session(app.engine) as session, session.begin():
                    for n in range(100):
                        task.delay_on(session, chunk * 100 + n)
            wait_until(lambda: relay._broker_down_since is not None, timeout_s=30,
                       message="relay never noticed the outage")
            assert outbox_rows(app) == 1000
            # Then every row is published once the broker is back
            proxy.restore()
            wait_until(lambda: outbox_rows(app) == 0, timeout_s=60,
                       message=lambda: f"{outbox_rows(app)} rows still in the outbox")
        finally:
            stop.set()
            runner.join(timeout=30)
    assert broker.depth(task.queue) == 1000


RELAY = textwrap.dedent(
    """
    import sys
    from taskq import App
    app = App("shop", database_url=sys.argv[1], namespace=sys.argv[2],
              default_queue=sys.argv[3], broker_url=sys.argv[4],
              outbox_batch_size=5000)
    app.task(name="ship")(lambda n: None)
    relay = app.relay()
    print("ready", flush=True)
    relay.run(lambda: False)
    """
)


@pytest.mark.slow
def test_relay_killed_mid_batch_loses_nothing(
    make_app: Callable[..., App], postgres_url: str, broker: Any
) -> None:
    app = make_app("shop", database_url=postgres_url)
    task = app.task(name="ship")(lambda n: None)
    with Session(app.engine) as session, session.begin():
        ids = {task.delay_on(session, n).id for n in range(5000)}
    # Given a relay publishing one 5,000-row batch
    proc = subprocess.Popen(
        [sys.executable, "-c", RELAY, postgres_url, app.settings.namespace,
         app.settings.default_queue, app.settings.broker_url],
        stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        # When it is killed -9 in the middle of the batch
        wait_until(lambda: broker.exists(task.queue) and broker.depth(task.queue) > 100,
                   timeout_s=60, message="relay never started publishing")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert outbox_rows(app) > 0, "the batch finished before the kill; nothing was tested"
    # Then a new relay publishes everything: at least once, none lost
    relay = app.relay()
    while relay.run_once():
        pass
    assert outbox_rows(app) == 0
    published = [props.message_id for _, props, _ in broker.get_all(task.queue)]
    assert set(published) == ids


@pytest.mark.slow
def test_two_relays_on_postgres_publish_each_row_once(
    make_app: Callable[..., App], postgres_url: str, broker: Any
) -> None:
    app = make_app("shop", database_url=postgres_url, outbox_batch_size=200)
    task = app.task(name="ship")(lambda n: None)
    with Session(app.engine) as session, session.begin():
        ids = {task.delay_on(session, n).id for n in range(10_000)}
    relays = [app.relay(), app.relay()]
    counts = [0, 0]

    def drain(i: int) -> None:
        while (n := relays[i].run_once()) > 0:
            counts[i] += n

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)

    assert sum(counts) == 10_000
    assert all(counts), f"one relay did all the work: {counts}"
    published = [props.message_id for _, props, _ in broker.get_all(task.queue)]
    assert len(published) == 10_000
    assert set(published) == ids


def test_notify_wakes_an_idle_relay_quickly(
    make_app: Callable[..., App], postgres_url: str, broker: Any
) -> None:
    app = make_app("shop", database_url=postgres_url, outbox_poll_interval_s=30.0)
    task = app.task(name="ship")(lambda n: None)
    relay = app.relay()
    stop = threading.Event()
    runner = threading.Thread(target=relay.run, args=(stop.is_set,), daemon=True)
    runner.start()
    try:
        wait_until(lambda: broker.exists(task.queue) or relay.published_total == 0,
                   timeout_s=10)
        with Session(app.engine) as session, session.begin():
            task.delay_on(session, 1)
        # The poll interval is 30 s: only NOTIFY can deliver this within 5 s.
        wait_until(lambda: relay.published_total == 1, timeout_s=5,
                   message="the relay was not woken by NOTIFY")
    finally:
        stop.set()
        with Session(app.engine) as session, session.begin():
            task.delay_on(session, 2)  # wakes the relay so it sees the stop flag
        runner.join(timeout=30)
    assert not runner.is_alive()
