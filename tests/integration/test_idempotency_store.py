"""IdempotencyStore on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq.db import create_engine
from taskq.idempotency import IdempotencyStore
from taskq.schema import metadata, processed_table


@pytest.fixture
def store(database_url: str) -> IdempotencyStore:
    engine = create_engine(database_url)
    metadata.create_all(engine)
    store = IdempotencyStore(engine)
    yield store
    store.close()
    engine.dispose()


def test_recorded_key_is_done(store: IdempotencyStore) -> None:
    assert not store.is_done("k1")

    assert store.record("k1", "ship") is True
    assert store.record("k1", "ship") is False

    assert store.is_done("k1")
    assert store.count() == 1


def test_claim_commits_with_the_callers_transaction(store: IdempotencyStore) -> None:
    with Session(store.engine) as session:
        assert store.claim(session, "k2", "ship") is True
        session.rollback()
    assert not store.is_done("k2")

    with Session(store.engine) as session, session.begin():
        store.claim(session, "k2", "ship")
    assert store.is_done("k2")


def test_prune_removes_only_old_keys(store: IdempotencyStore) -> None:
    now = datetime.now(timezone.utc)
    with store.engine.begin() as conn:
        conn.execute(processed_table.insert(), [
            {"key": f"old{n}", "task": "t", "finished_at": now - timedelta(days=8)}
            for n in range(25)
        ] + [{"key": "new", "task": "t", "finished_at": now - timedelta(days=6)}])

    deleted = store.prune(older_than=timedelta(days=7), batch_size=10, now=now)

    assert deleted == 25
    with store.engine.connect() as conn:
        keys = conn.execute(sa.select(processed_table.c.key)).scalars().all()
    assert keys == ["new"]


def test_concurrent_claims_of_one_key_let_one_win(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    store = IdempotencyStore(engine)
    first_claimed = threading.Event()
    results: dict[str, bool] = {}

    def second() -> None:
        first_claimed.wait(10)
        with Session(engine) as session, session.begin():
            results["second"] = store.claim(session, "same", "ship")  # blocks on the key

    thread = threading.Thread(target=second)
    thread.start()
    with Session(engine) as session, session.begin():
        results["first"] = store.claim(session, "same", "ship")
        first_claimed.set()
        # the second claim is now waiting on our uncommitted key; committing decides it
    thread.join(timeout=30)
    engine.dispose()

    assert results == {"first": True, "second": False}


def test_done_among_checks_many_keys_in_one_query(store: IdempotencyStore) -> None:
    store.record("a", "t")
    store.record("c", "t")

    assert store.done_among(["a", "b", "c", "d"]) == {"a", "c"}
    assert store.done_among([]) == set()
