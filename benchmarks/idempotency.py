"""Cost of the idempotency table per task on PostgreSQL (and SQLite for comparison).

    python -m benchmarks.idempotency [--keys 5000]

Measures, per task, what the worker adds for an ``idempotent=True`` task: one SELECT
(``IdempotencyStore.is_done``) before running and one INSERT in its own transaction
(``IdempotencyStore.record``) after; and for ``transactional=True`` the claim, i.e. BEGIN +
INSERT ... ON CONFLICT + COMMIT around the task's own work. Uses a schema of its own and
drops it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

import sqlalchemy as sa

from taskq.db import create_engine
from taskq.idempotency import IdempotencyStore
from taskq.schema import metadata

POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"


def measure(store: IdempotencyStore, keys: int) -> dict[str, float]:
    ids = [str(uuid.uuid4()) for _ in range(keys)]
    figures: dict[str, float] = {}
    started = time.perf_counter()
    for key in ids:
        store.is_done(key)
    figures["check (SELECT)"] = (time.perf_counter() - started) / keys * 1e6
    started = time.perf_counter()
    for key in ids:
        store.record(key, "bench")
    figures["record (INSERT + COMMIT)"] = (time.perf_counter() - started) / keys * 1e6
    started = time.perf_counter()
    for _ in range(keys):
        session = store.begin(str(uuid.uuid4()), "bench")
        assert session is not None
        session.commit()
        session.close()
    figures["transactional claim (BEGIN, INSERT, COMMIT)"] = (
        (time.perf_counter() - started) / keys * 1e6
    )
    return figures


def run(url: str, keys: int, runs: int) -> dict[str, float]:
    engine = create_engine(url)
    metadata.create_all(engine)
    store = IdempotencyStore(engine)
    results = [measure(store, keys) for _ in range(runs)]
    engine.dispose()
    return {name: statistics.median(r[name] for r in results) for name in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    schema = f"b{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        pg = run(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}", args.keys, args.runs)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    with tempfile.TemporaryDirectory() as tmp:
        lite = run(f"sqlite:///{tmp}/bench.sqlite3", args.keys, args.runs)
    print(f"{'per task (µs, median of ' + str(args.runs) + ')':<46} {'PostgreSQL':>11} "
          f"{'SQLite':>8}")
    for name in pg:
        print(f"{name:<46} {pg[name]:>11.0f} {lite[name]:>8.0f}")
    print(f"{'idempotent=True total (check + record)':<46} "
          f"{pg['check (SELECT)'] + pg['record (INSERT + COMMIT)']:>11.0f} "
          f"{lite['check (SELECT)'] + lite['record (INSERT + COMMIT)']:>8.0f}")


if __name__ == "__main__":
    main()
