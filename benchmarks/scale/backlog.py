"""Drain rate against the backlog's size, and worker RSS against tasks done.

A queue is pre-filled with N no-op tasks (``Task.starmap`` in chunks, windowed confirms),
then ``taskq worker -c 2`` drains it: rate = N / (last task end - first task start). While it
drains, a sampler reads every task-running process's RSS (/proc) beside the number of tasks
that process has run (its probe file), so RSS can be read at any total of tasks done. The
same sampler measures Celery's and Dramatiq's processes draining their own backlog.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _probe
from benchmarks._contenders import Contender
from benchmarks._proc import rss_mb
from benchmarks.compare import Harness

FILL_CHUNK = 50_000


@dataclass
class RssSample:
    """One reading: seconds since the drain began, tasks done (all processes), RSS per pid."""

    at_s: float
    done: int
    rss_mb: dict[int, float]


@dataclass
class Sampler:
    """Reads the probe directory and /proc every ``interval_s`` in a thread of its own."""

    probe_dir: Path
    interval_s: float = 0.25
    samples: list[RssSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._began = time.monotonic()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        counts = per_pid_counts(self.probe_dir)
        rss = {pid: value for pid in counts if (value := rss_mb(pid)) is not None}
        if rss:
            self.samples.append(
                RssSample(time.monotonic() - self._began, sum(counts.values()), rss)
            )


def per_pid_counts(directory: Path) -> dict[int, int]:
    """Tasks run so far by each process, from the probe files (``<pid>-<thread>.rec``)."""
    counts: dict[int, int] = {}
    for path in directory.glob("*.rec"):
        data = path.read_bytes()
        if len(data) < _probe._RECORD.size:
            continue
        pid = int(path.name.split("-", 1)[0])
        counts[pid] = counts.get(pid, 0) + _probe._RECORD.unpack_from(data)[2]
    return counts


def fill(contender: Contender, n: int) -> None:
    """Enqueue ``n`` no-op tasks with the contender's fastest API, in chunks."""
    for first in range(0, n, FILL_CHUNK):
        contender.publish_fast("noop", min(FILL_CHUNK, n - first))


def drain(h: Harness, contender: Contender, n: int) -> dict[str, Any]:
    """Pre-fill ``n`` tasks, drain them; the rate and the RSS samples."""
    with h.measurement(contender) as m:
        started = time.time()
        fill(contender, n)
        landed = h.wait_depth(m.queue, n, timeout_s=120 + n / 1_000)
        with h.workers(contender, m, "noop", ready=False) as worker, Sampler(m.probe_dir) as s:
            totals = h.wait_done(m, n, worker)
    return {
        "tasks": n,
        "fill_rate": n / (landed - started),
        "drain_rate": n / (totals.last_end - totals.first_start),
        "samples": [
            {"at_s": round(x.at_s, 2), "done": x.done,
             "rss_mb": {str(pid): round(v, 1) for pid, v in x.rss_mb.items()}}
            for x in s.samples
        ],
    }


def rss_at(samples: list[dict[str, Any]], done: int) -> float | None:
    """Largest task-process RSS (MiB) at the first sample with ``done`` tasks done."""
    for sample in samples:
        if sample["done"] >= done:
            return max(sample["rss_mb"].values())
    return None
