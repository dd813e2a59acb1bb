"""Delays through the outbox: far etas stay in the table, near ones go to the delay backend."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App
from taskq.broker import topology as topo
from taskq.db import as_aware
from taskq.schema import outbox_table
from tests.conftest import BROKER_URL
from tests.support.arrivals import ArrivalRecorder
from tests.support.waiting import wait_until

PRECISION_MS = 150  # as in tests/contract/test_delay_backends.py


def make_shop(make_app: Callable[..., App], database_url: str, **settings: Any) -> App:
    app = make_app("shop", database_url=database_url, delay_backend="tiers", **settings)
    app.create_tables()

    @app.task(name="remind")
    def remind(user_id: int) -> None:
        return None

    return app


def rows(app: App) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(sa.select(outbox_table)).mappings())


def tier_depth(app: App, broker: Any) -> int:
    ns, kind = app.settings.namespace, app.settings.delay_tier_queue_type
    return sum(
        broker.depth(topo.delay_tier_name(ns, level, kind))
        for level in range(topo.DELAY_TIER_LEVELS)
    )


def test_a_row_beyond_the_horizon_stays_in_the_table_until_near_due(
    make_app: Callable[..., App], database_url: str, broker: Any
) -> None:
    app = make_shop(make_app, database_url, outbox_delay_horizon_s=60.0)
    with Session(app.engine) as session, session.begin():
        result = app.registry.get("remind").apply_async((1,), session=session, countdown=600)
    [row] = rows(app)
    assert as_aware(row["next_attempt_at"]) == as_aware(row["eta"]) - timedelta(seconds=60)
    now = datetime.now(timezone.utc)
    relay = app.relay()

    # Far from due: nothing reaches RabbitMQ.
    relay.clock = lambda: now + timedelta(seconds=500)
    assert relay.run_once() == 0
    assert [r["id"] for r in rows(app)] == [result.id]

    # Within the horizon: handed to the delay tiers, not to the work queue.
    relay.clock = lambda: now + timedelta(seconds=541)
    assert relay.run_once() == 1
    assert rows(app) == []
    assert broker.depth(app.settings.default_queue) == 0
    assert tier_depth(app, broker) == 1


def test_a_row_inside_the_horizon_is_delayed_by_the_broker_and_arrives_at_its_eta(
    make_app: Callable[..., App], tmp_path: Any
) -> None:
    app = make_shop(make_app, f"sqlite:///{tmp_path}/taskq.sqlite3")
    queue = app.settings.default_queue
    with Session(app.engine) as session, session.begin():
        result = app.registry.get("remind").apply_async((1,), session=session, countdown=1.0)

    assert app.relay().run_once() == 1  # published now, held by the broker
    assert rows(app) == []

    recorder = ArrivalRecorder(BROKER_URL, queue).start()
    try:
        wait_until(lambda: recorder.ids() == [result.id], timeout_s=5)
        [arrival] = recorder.arrivals
        assert 0 <= arrival.late_ms < PRECISION_MS
        assert arrival.headers["taskq-task"] == "remind"
    finally:
        recorder.stop()


def test_a_relay_without_a_delay_backend_keeps_near_rows_until_due(
    make_app: Callable[..., App], tmp_path: Any, broker: Any
) -> None:
    from taskq.outbox.relay import OutboxRelay

    app = make_shop(make_app, f"sqlite:///{tmp_path}/taskq.sqlite3")
    with Session(app.engine) as session, session.begin():
        app.registry.get("remind").apply_async((1,), session=session, countdown=30)
    relay = OutboxRelay(app.engine, app.publisher, exchange=app.topology.exchange, app_id="shop")

    assert relay.run_once() == 0

    [row] = rows(app)
    assert as_aware(row["next_attempt_at"]) == as_aware(row["eta"])
    assert row["attempts"] == 0 and row["last_error"] is None


def stand_in_plugin_backend(app: App) -> Any:
    """A real :class:`PluginDelay` whose plugin exchange is a plain direct exchange.

    The test broker has no delayed-message plugin; a direct exchange of the same name routes
    at once and ignores ``x-delay``, but confirms (or nacks) like the plugin's exchange, so
    the backend's split between the plugin part and the tiers part runs for real.
    """
    from taskq.broker.delayed import PluginPublisher
    from taskq.delay.backend import DelayDeclarer, merge_declarations
    from taskq.delay.plugin import PluginDelay
    from taskq.delay.tiers import TierDelay

    exchange = topo.delayed_exchange_name(app.settings.namespace)

    def declarations_for(queue: str) -> topo.Declarations:
        return merge_declarations([
            app.topology.base(),
            app.topology.for_queue(queue),
            topo.Declarations(exchanges=(topo.ExchangeSpec(exchange, "direct"),),
                              bindings=(topo.BindingSpec(queue, exchange, queue),)),
        ])

    declarer = DelayDeclarer(app.settings, app.topology)
    tiers = TierDelay(app.topology, app.publisher, declarer)
    return PluginDelay(app.topology, PluginPublisher(app.settings, declarations_for), tiers)


def test_rows_of_a_batch_are_deleted_only_when_their_own_message_was_confirmed(
    make_app: Callable[..., App], database_url: str, broker: Any
) -> None:
    from taskq.outbox.relay import OutboxRelay

    # Given: a full reject-publish queue (one message in it) and a free one; the relay's
    # clock is 10 min behind, so rows due 5 min ago reach the delay backend as "delayed"
    # (the race of an eta passing between claim and publish) and go its tiers path, due,
    # into the full queue: real nacks. Rows due in an hour go the plugin path.
    app = make_shop(make_app, database_url)
    ns = app.settings.namespace
    full, free = f"{ns}.full", f"{ns}.free"
    app.queue(full, max_length=1, overflow="reject-publish")
    remind = app.registry.get("remind")
    remind.apply_async((0,), queue=full)
    now = datetime.now(timezone.utc)
    with Session(app.engine) as session, session.begin():
        nacked = [remind.apply_async((i,), session=session, queue=full,
                                     eta=now - timedelta(minutes=5)).id for i in range(3)]
        sent = [remind.apply_async((i,), session=session, queue=free,
                                   eta=now + timedelta(hours=1)).id for i in range(3)]
    with app.engine.begin() as conn:
        conn.execute(outbox_table.update().values(next_attempt_at=now - timedelta(minutes=20)))
    backend = stand_in_plugin_backend(app)
    relay = OutboxRelay(app.engine, app.publisher, exchange=app.topology.exchange,
                        app_id="shop", clock=lambda: now - timedelta(minutes=10),
                        delay=lambda: backend)
    try:
        # When
        relay.run_once()
    finally:
        backend.close()

    # Then: the confirmed rows are gone and their messages are in their queue; the nacked
    # rows stay, marked, with a later attempt.
    assert sorted(props.message_id for _, props, _ in broker.get_all(free)) == sorted(sent)
    left = {r["id"]: r for r in rows(app)}
    assert sorted(left) == sorted(nacked)
    for row in left.values():
        assert row["attempts"] == 1
        assert "nack" in row["last_error"]
        assert as_aware(row["next_attempt_at"]) > now - timedelta(minutes=10)
    assert broker.depth(full) == 1


def test_a_delayed_row_whose_queue_exists_with_other_arguments_does_not_hold_up_the_others(
    make_app: Callable[..., App], database_url: str, broker: Any
) -> None:
    # Given: near-due rows for the delay tiers, the oldest for a queue declared by someone
    # else with other arguments (the declare before the tiers publish closes the channel).
    app = make_shop(make_app, database_url)
    remind = app.registry.get("remind")
    other = f"{app.settings.namespace}.misdeclared"
    broker.declare_queue(other, {"x-max-priority": 3})
    try:
        with Session(app.engine) as session, session.begin():
            bad = remind.apply_async((0,), session=session, queue=other, countdown=30).id
            good = [remind.apply_async((i,), session=session, countdown=30).id
                    for i in range(1, 6)]
        now = datetime.now(timezone.utc)
        relay = app.relay()
        relay.clock = lambda: now + timedelta(seconds=1)  # claims the rows: near due

        # When
        assert relay.run_once() == len(good)

        # Then: the good rows wait in the tiers; the bad one stays, saying why.
        assert tier_depth(app, broker) == len(good)
        [row] = rows(app)
        assert row["id"] == bad and row["attempts"] == 1
        assert other in row["last_error"] and "other arguments" in row["last_error"]
    finally:
        broker.delete_queue(other)
