"""Database fixtures: SQLite under tmp_path, PostgreSQL in a schema of this session."""

from __future__ import annotations

import pytest

from tests.conftest import truncate_taskq_tables


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """Each test using this runs on the embedded SQLite default and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/taskq.sqlite3"
    url: str = request.getfixturevalue("pg_schema_url")
    truncate_taskq_tables(url)
    return url
