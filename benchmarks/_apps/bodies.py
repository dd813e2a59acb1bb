"""The three bench task bodies, one copy for every system's bench app.

Each app registers them under its own names (``bench.noop``, ``bench_noop``, ...); the bodies
only stamp the probe (see :mod:`benchmarks._probe`), so every system runs the same work.
"""

from __future__ import annotations

import time

from benchmarks import _probe


def noop() -> None:
    _probe.begin()
    _probe.end()


def sleep(seconds: float) -> None:
    _probe.begin()
    time.sleep(seconds)
    _probe.end()


def latency(sent_at: float) -> None:
    _probe.started(sent_at)
    _probe.end()
