"""Bulk enqueue: Task.map / Task.starmap with windowed confirms, or into the outbox."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session

from taskq import App, SerializationError


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()
    app.task(name="square")(lambda n: n * n)
    app.task(name="add")(lambda x, y: x + y)
    return app


def test_map_publishes_every_call_in_order(app: App, broker: Any) -> None:
    results = app.registry.get("square").map(range(500), priority=3)

    got = broker.get_all(app.settings.default_queue)
    assert [props.message_id for _, props, _ in got] == [r.id for r in results]
    assert all(props.priority == 3 for _, props, _ in got)


def test_starmap_takes_argument_tuples(app: App, broker: Any) -> None:
    app.registry.get("add").starmap([(1, 2), (3, 4)])

    assert broker.depth(app.settings.default_queue) == 2


def test_one_bad_argument_publishes_nothing(app: App, broker: Any) -> None:
    with pytest.raises(SerializationError, match="square"):
        app.registry.get("square").map([1, 2, {3}])

    assert not broker.exists(app.settings.default_queue)


def test_map_with_a_session_writes_outbox_rows(app: App) -> None:
    app.create_tables()
    with Session(app.engine) as session, session.begin():
        app.registry.get("square").map(range(5), session=session)

    assert app.outbox_backlog().rows == 5
