"""Helpers of the ordered-queue system tests: the test's app, sending, reading the effects."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import sqlalchemy as sa

from taskq import App
from taskq.task import Task
from tests import ordering_tasks


def bound(app: App, task: Task[Any, Any], queue: str) -> Task[Any, Any]:
    """``task`` of :mod:`tests.ordering_tasks` sent through the test's app to ``queue``."""
    options = dataclasses.replace(task.options, queue=queue)
    return Task(app, task.fn, name=task.name, options=options)


def effects(url: str) -> list[Any]:
    """Every effect row, in the order they were written."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            table = ordering_tasks.effects
            return list(conn.execute(sa.select(table).order_by(table.c.n)))
    finally:
        engine.dispose()


def effect_count(url: str) -> int:
    """How many effect rows there are."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(
                sa.select(sa.func.count()).select_from(ordering_tasks.effects)
            ).scalar_one())
    finally:
        engine.dispose()


def order_problems(rows: list[Any], expected: dict[str, list[int]]) -> list[str]:
    """Keys whose effects are not exactly ``expected[key]`` in that order (gaps, repeats,
    swaps, unexpected keys), one line each."""
    seen: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        seen[row.key].append(row.seq)
    problems = [
        f"{key}: expected {want}, got {seen.get(key, [])}"
        for key, want in sorted(expected.items()) if seen.get(key, []) != want
    ]
    problems += [f"{key}: unexpected key" for key in sorted(set(seen) - set(expected))]
    return problems


def max_parallel_partitions(rows: list[Any]) -> int:
    """The most partitions whose runs overlapped in time at one moment."""
    events = sorted(
        [(row.started, 1, row.queue) for row in rows]
        + [(row.finished, -1, row.queue) for row in rows],
        key=lambda event: (event[0], event[1]),  # an end before a start at the same instant
    )
    running: dict[str, int] = defaultdict(int)
    best = 0
    for _, change, queue in events:
        running[queue] += change
        best = max(best, sum(1 for count in running.values() if count > 0))
    return best
