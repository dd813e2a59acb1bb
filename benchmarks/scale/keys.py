"""The idempotency check with millions of keys in ``taskq_processed``, and a prune beside it.

Keys are inserted in SQL (``generate_series``, finished 30 days ago, in batches of a
million), then the worker's own check (``IdempotencyStore.is_done``: one SELECT by primary
key) is timed for random present and absent keys: p50, p99, max. Then ``prune`` deletes every
key (``IdempotencyStore.prune``, what ``taskq db prune`` runs) while a second thread keeps
checking keys with its own connection, like a worker would; the worst and p99 check latency
during the prune show whether pruning blocks workers.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from taskq.db import create_engine
from taskq.idempotency import IdempotencyStore

INSERT_BATCH = 1_000_000


def fill(engine: sa.Engine, keys: int) -> float:
    """Insert ``keys`` keys named ``k<n>``; return the seconds it took."""
    started = time.perf_counter()
    for first in range(0, keys, INSERT_BATCH):
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO taskq_processed (key, task, finished_at) "
                "SELECT 'k' || g, 'bench.noop', now() - interval '30 days' "
                "FROM generate_series(:low, :high) AS g"
            ), {"low": first, "high": min(keys, first + INSERT_BATCH) - 1})
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE taskq_processed"))
    return time.perf_counter() - started


def check_latencies_ms(store: IdempotencyStore, keys: int, samples: int) -> list[float]:
    """Latency of ``is_done`` for ``samples`` keys, half present, half absent."""
    values = []
    for i in range(samples):
        key = f"k{random.randrange(keys)}" if i % 2 else f"absent-{i}"
        began = time.perf_counter()
        store.is_done(key)
        values.append((time.perf_counter() - began) * 1000)
    return values


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": ordered[-1],
            "mean_ms": statistics.fmean(ordered), "samples": len(ordered)}


def prune_beside_checks(url: str, keys: int) -> dict[str, Any]:
    """Prune every key while another connection checks keys; both sides' figures."""
    checker = IdempotencyStore(create_engine(url))
    latencies: list[float] = []
    stop = threading.Event()

    def check() -> None:
        while not stop.is_set():
            latencies.extend(check_latencies_ms(checker, keys, 50))

    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    pruner_engine = create_engine(url)
    began = time.perf_counter()
    try:
        deleted = IdempotencyStore(pruner_engine).prune(
            older_than=timedelta(days=7), batch_size=1000
        )
    finally:
        stop.set()
        thread.join()
        checker.close()
        pruner_engine.dispose()
    elapsed = time.perf_counter() - began
    return {"deleted": deleted, "prune_s": elapsed, "prune_rate": deleted / elapsed,
            "checks_during_prune": percentiles(latencies)}


def run(url: str, keys: int, samples: int) -> dict[str, Any]:
    engine = create_engine(url)
    try:
        fill_s = fill(engine, keys)
        store = IdempotencyStore(engine)
        check_latencies_ms(store, keys, 500)  # warm the connection and the index's top
        figures = {"keys": keys, "fill_s": fill_s,
                   "check": percentiles(check_latencies_ms(store, keys, samples))}
        store.close()
    finally:
        engine.dispose()
    figures["prune"] = prune_beside_checks(url, keys)
    return figures
