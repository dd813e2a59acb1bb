"""Which URLs name the same outbox (taskq.outbox.binding): the equivalences of 3.12."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taskq.outbox.binding import url_id

PG = "postgresql+psycopg://app:secret@db.example:5432/shop"


@pytest.mark.parametrize("other", [
    "postgresql://app:secret@db.example:5432/shop",  # no driver: taskq uses psycopg
    "postgres://app:secret@db.example/shop",  # the old alias, the default port
    "postgresql+psycopg://app:other@db.example:5432/shop",  # another password
    "postgresql+psycopg://relay@db.example:5432/shop",  # another user, no password
    "postgresql+psycopg://app@DB.example:5432/shop?connect_timeout=5&sslmode=require",
    "postgresql+psycopg://app@db.example/shop?application_name=relay",
])
def test_urls_that_reach_the_same_postgresql_outbox_match(other: str) -> None:
    assert url_id(other) == url_id(PG)


@pytest.mark.parametrize("other", [
    "postgresql+psycopg://app:secret@db.example:5432/shop_test",  # another database
    "postgresql+psycopg://app:secret@db2.example:5432/shop",  # another server
    "postgresql+psycopg://app:secret@db.example:5433/shop",  # another port
    "postgresql+psycopg://app:secret@db.example:5432/shop?options=-csearch_path%3Dtenant",
])
def test_urls_that_reach_another_postgresql_outbox_differ(other: str) -> None:
    assert url_id(other) != url_id(PG)


def test_search_path_is_read_from_libpq_options_however_written() -> None:
    written = [
        "postgresql://h/db?options=-csearch_path%3Dtenant",
        "postgresql://h/db?options=-c%20search_path%3Dtenant",
        "postgresql://h/db?options=-c%20statement_timeout%3D5s%20-csearch_path%3Dtenant",
        "postgresql://h/db?options=--search_path%3Dtenant",
    ]
    assert len({url_id(url) for url in written}) == 1
    assert url_id(written[0]) != url_id("postgresql://h/db?options=-csearch_path%3Dother")


def test_loopback_and_the_unix_socket_are_one_local_server() -> None:
    local = [
        "postgresql://u@localhost/shop",
        "postgresql://u@127.0.0.1:5432/shop",
        "postgresql://u@[::1]/shop",
        "postgresql:///shop?host=/var/run/postgresql",
        "postgresql://u@/shop",
    ]
    assert len({url_id(url) for url in local}) == 1


def test_a_missing_postgresql_database_name_is_the_user_name() -> None:
    assert url_id("postgresql://shop@db.example") == url_id("postgresql://shop@db.example/shop")


def test_sqlite_paths_are_compared_absolute_and_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "sub", tmp_path / "link")

    same = [
        f"sqlite:///{tmp_path}/sub/taskq.db",
        "sqlite:///sub/taskq.db",
        "sqlite+pysqlite:///./sub/../sub/taskq.db?timeout=5",
        "sqlite:///link/taskq.db",
        f"sqlite:///file:{tmp_path}/sub/taskq.db?uri=true",
    ]
    assert len({url_id(url) for url in same}) == 1
    assert url_id("sqlite:///taskq.db") != url_id("sqlite:///sub/taskq.db")


def test_in_memory_sqlite_databases_match_only_each_other() -> None:
    assert url_id("sqlite://") == url_id("sqlite:///:memory:")
    assert url_id("sqlite://") != url_id("sqlite:///taskq.db")
    assert url_id("sqlite:///file:a?mode=memory&uri=true") != url_id(
        "sqlite:///file:b?mode=memory&uri=true"
    )


def test_an_unparsable_url_has_no_identity() -> None:
    assert url_id("not a url") is None
