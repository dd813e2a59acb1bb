"""An outbox session must write where the relay reads: ``database_url`` (issue 26, 3.12).

Before the check, ``apply_async(..., session=s)`` with ``s`` bound to another database
returned an id, the row committed in that database's ``taskq_outbox``, and no relay ever
read it: the task was lost without a word. Real SQLite files, real PostgreSQL schemas and
databases, the real relay and broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App, ConfigurationError
from taskq.schema import metadata, outbox_table
from tests.conftest import POSTGRES_URL, postgres_schema, schema_url


def outbox_rows(url_or_engine: str | sa.Engine) -> int:
    engine = sa.create_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(outbox_table))
                       .scalar_one())
    finally:
        if isinstance(url_or_engine, str):
            engine.dispose()


@pytest.fixture
def engines() -> Iterator[Callable[[str], sa.Engine]]:
    """Factory of engines with taskq's tables, disposed afterwards."""
    made: list[sa.Engine] = []

    def make(url: str) -> sa.Engine:
        engine = sa.create_engine(url)
        metadata.create_all(engine)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.dispose()


def shop_app(make_app: Callable[..., App], database_url: str) -> App:
    app = make_app("shop", database_url=database_url)
    app.create_tables()

    @app.task(name="ship")
    def ship(order_id: int) -> None:
        return None

    return app


def ship(app: App) -> Any:
    return app.registry.get("ship")


def assert_refused(app: App, session: Any, elsewhere: str) -> None:
    """``apply_async`` raises, naming the task, both databases and what to do."""
    with pytest.raises(ConfigurationError) as refused:
        ship(app).apply_async((1,), session=session)
    message = str(refused.value)
    assert "task 'ship'" in message
    assert f"queue {ship(app).queue!r}" in message
    assert elsewhere in message
    assert f"database_url {app.settings.database_url}" in message
    assert "would never be published" in message
    assert "Session(app.engine)" in message
    assert refused.value.task == "ship"  # type: ignore[attr-defined]


def assert_relayed_once(app: App, broker: Any) -> None:
    relay = app.relay()
    assert relay.run_once() == 1
    assert outbox_rows(app.engine) == 0
    [(_, props, _body)] = broker.get_all(ship(app).queue)
    assert props.headers["taskq-task"] == "ship"


# -- SQLite: two files ---------------------------------------------------------------------


def test_a_session_on_another_sqlite_file_is_refused_and_nothing_is_lost(
    make_app: Callable[..., App], engines: Callable[[str], sa.Engine], tmp_path: Path,
    broker: Any,
) -> None:
    app = shop_app(make_app, f"sqlite:///{tmp_path}/relay.sqlite3")
    other = engines(f"sqlite:///{tmp_path}/other.sqlite3")

    with Session(other) as session, session.begin():
        assert_refused(app, session, f"sqlite:///{tmp_path}/other.sqlite3")
    with other.begin() as conn:  # a Core Connection too
        assert_refused(app, conn, f"sqlite:///{tmp_path}/other.sqlite3")

    assert outbox_rows(other) == 0  # on main: 2 rows here, that no relay reads
    assert app.relay().run_once() == 0
    assert outbox_rows(app.engine) == 0
    assert not broker.exists(ship(app).queue)


def test_the_same_sqlite_file_by_a_relative_path_and_other_options_is_relayed(
    make_app: Callable[..., App], engines: Callable[[str], sa.Engine], tmp_path: Path,
    broker: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = shop_app(make_app, f"sqlite:///{tmp_path}/relay.sqlite3")
    monkeypatch.chdir(tmp_path)
    same = engines("sqlite+pysqlite:///relay.sqlite3?timeout=5")

    with Session(same) as session, session.begin():
        ship(app).apply_async((1,), session=session)

    assert_relayed_once(app, broker)


def test_a_session_with_several_binds_is_judged_by_the_bind_of_the_outbox_table(
    make_app: Callable[..., App], engines: Callable[[str], sa.Engine], tmp_path: Path,
    broker: Any,
) -> None:
    app = shop_app(make_app, f"sqlite:///{tmp_path}/relay.sqlite3")
    other = engines(f"sqlite:///{tmp_path}/other.sqlite3")

    # The outbox table is routed to the other file: refused, whatever the default bind.
    with Session(app.engine, binds={outbox_table: other}) as session, session.begin():
        assert_refused(app, session, f"sqlite:///{tmp_path}/other.sqlite3")
    # The business tables live elsewhere, the outbox table where the relay reads: accepted.
    with Session(other, binds={outbox_table: app.engine}) as session, session.begin():
        ship(app).apply_async((1,), session=session)

    assert outbox_rows(other) == 0
    assert_relayed_once(app, broker)


def test_a_session_bound_to_no_database_is_refused(
    make_app: Callable[..., App], tmp_path: Path
) -> None:
    app = shop_app(make_app, f"sqlite:///{tmp_path}/relay.sqlite3")

    with Session() as session, pytest.raises(ConfigurationError) as refused:
        ship(app).apply_async((1,), session=session)

    assert "task 'ship' was not enqueued: its session is bound to no database" in str(
        refused.value
    )


def test_flask_sqlalchemy_session_on_another_database_is_refused(
    make_app: Callable[..., App], tmp_path: Path, broker: Any
) -> None:
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy

    from taskq.contrib.flask import TaskQ

    app = shop_app(make_app, f"sqlite:///{tmp_path}/relay.sqlite3")
    flask_app = Flask("shop")
    flask_app.config.update(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path}/flask.sqlite3",
        TASKQ_DATABASE_URL=app.settings.database_url,
    )
    db = SQLAlchemy(flask_app)
    TaskQ(flask_app, db=db, taskq_app=app)

    with flask_app.app_context():
        metadata.create_all(db.engine)
        with pytest.raises(ConfigurationError, match="flask.sqlite3"):
            ship(app).delay(1)  # through db.session, the Flask integration's session
        db.session.rollback()
        assert outbox_rows(db.engine) == 0
        db.engine.dispose()

    assert app.relay().run_once() == 0
    assert not broker.exists(ship(app).queue)


# -- PostgreSQL: two schemas, two databases --------------------------------------------------


def with_options(url: str, **options: str) -> str:
    return str(sa.make_url(url).update_query_dict(options))


def test_a_session_on_another_postgresql_schema_is_refused(
    make_app: Callable[..., App], postgres_url: str, broker: Any
) -> None:
    app = shop_app(make_app, postgres_url)

    with postgres_schema("tqother") as schema:
        other = sa.create_engine(schema_url(schema))
        try:
            with Session(other) as session, session.begin():
                assert_refused(app, session, f"search_path%3D{schema}")
            assert outbox_rows(other) == 0
        finally:
            other.dispose()

    assert app.relay().run_once() == 0
    assert not broker.exists(ship(app).queue)


@contextmanager
def scratch_database() -> Iterator[str]:
    """A new database on the shared server, with taskq's tables; dropped afterwards."""
    name = f"tq_scratch_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = str(sa.make_url(POSTGRES_URL).set(database=name).render_as_string(
        hide_password=False))
    try:
        engine = sa.create_engine(url)
        metadata.create_all(engine)
        engine.dispose()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def test_a_session_on_another_postgresql_database_is_refused(
    make_app: Callable[..., App], postgres_url: str, broker: Any
) -> None:
    app = shop_app(make_app, postgres_url)

    with scratch_database() as url:
        other = sa.create_engine(url)
        try:
            with Session(other) as session, session.begin():
                assert_refused(app, session, f"/{sa.make_url(url).database}")
            assert outbox_rows(other) == 0
        finally:
            other.dispose()

    assert app.relay().run_once() == 0


def test_the_same_postgresql_schema_by_another_driver_password_and_options_is_relayed(
    make_app: Callable[..., App], postgres_url: str, broker: Any,
    engines: Callable[[str], sa.Engine],
) -> None:
    app = shop_app(make_app, postgres_url)
    url = sa.make_url(postgres_url)
    schema = url.query["options"].partition("=")[2]
    # A password the server does not ask for, a space in the libpq options, and options
    # that do not move the table.
    same = url.set(drivername="postgresql+psycopg", password="not-asked").update_query_dict(
        {"options": f"-c search_path={schema}", "connect_timeout": "5",
         "application_name": "shop"}
    )
    engine = engines(same.render_as_string(hide_password=False))

    with Session(engine) as session, session.begin():
        ship(app).apply_async((1,), session=session)
    assert_relayed_once(app, broker)

    plain = "postgresql://" + postgres_url.partition("://")[2]
    app.configure(database_url=plain)  # the app's URL without the driver's name
    with Session(engine) as session, session.begin():
        ship(app).apply_async((2,), session=session)
    assert app.relay().run_once() == 1
