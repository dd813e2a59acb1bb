"""Passwords given in a database URL's query string stay out of the worker's log lines."""

from __future__ import annotations

import logging

import pytest

from taskq import App
from taskq.worker.relay_process import ensure_table
from tests.conftest import POSTGRES_URL


def test_a_missing_table_is_reported_without_the_query_string_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a PostgreSQL URL with the password as a query parameter (libpq accepts it;
    # SQLAlchemy's own masking only knows the user-info password)
    separator = "&" if "?" in POSTGRES_URL else "?"
    app = App("passwords", database_url=f"{POSTGRES_URL}{separator}password=Zq9secret")
    try:
        # When the relay finds its table missing
        with caplog.at_level(logging.ERROR):
            assert ensure_table(app, "taskq_no_such_table", "the test") is False
    finally:
        app.close()

    # Then the line names the database, password masked
    assert "password=***" in caplog.text
    assert "Zq9secret" not in caplog.text


def test_an_idempotency_error_names_the_database_without_the_query_string_password() -> None:
    # Given an idempotency table the database cannot show (this schema has none)
    from taskq.db import create_engine
    from taskq.errors import IdempotencyError
    from taskq.idempotency import IdempotencyStore

    separator = "&" if "?" in POSTGRES_URL else "?"
    engine = create_engine(f"{POSTGRES_URL}{separator}options=-csearch_path%3Dnone"
                           "&password=Zq9secret")
    store = IdempotencyStore(engine)
    try:
        # When a check fails
        with pytest.raises(IdempotencyError) as caught:
            store.is_done("k")
    finally:
        store.close()
        engine.dispose()

    # Then the error names the database, password masked
    assert "password=***" in str(caught.value)
    assert "Zq9secret" not in str(caught.value)
