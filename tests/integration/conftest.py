"""Database fixtures: SQLite under tmp_path, PostgreSQL in a schema of this session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from taskq.schema import metadata
from tests.conftest import POSTGRES_URL


@pytest.fixture(scope="session")
def pg_schema_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a schema only this test session uses."""
    schema = f"tq_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    engine = sa.create_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    try:
        yield url
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _truncate(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """Each test using this runs on the embedded SQLite default and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/taskq.sqlite3"
    url: str = request.getfixturevalue("pg_schema_url")
    _truncate(url)
    return url


@pytest.fixture
def postgres_url(pg_schema_url: str) -> str:
    """PostgreSQL only (SKIP LOCKED, LISTEN/NOTIFY), with empty tables."""
    _truncate(pg_schema_url)
    return pg_schema_url
