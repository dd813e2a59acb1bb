"""taskiq (taskiq-aio-pika) as a contender of benchmarks.compare, default and tuned."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from benchmarks._contenders import (
    BROKER_URL,
    Admin,
    Contender,
    Measurement,
    Worker,
    start_worker,
)

#: Messages in flight at once in ``publish_fast`` (each ``kiq()`` awaits its confirm).
FAST_WINDOW = 512


class TaskiqContender(Contender):
    """``taskiq worker --workers 2``; every ``kiq()`` is confirmed (aio-pika's default)."""

    system = "taskiq"
    fast_api = f"asyncio.gather of kiq(), {FAST_WINDOW} in flight, confirms on"
    each_api = "await kiq(), confirm each"

    def __init__(self, *, best: bool) -> None:
        self.best = best
        self.name = ("taskiq (classic queue, prefetch 256)" if best else
                     "taskiq (defaults: quorum queue, prefetch 10)")

    def open(self, m: Measurement) -> None:
        from benchmarks._apps.taskiq_app import make

        super().open(m)
        self.loop = asyncio.new_event_loop()
        self.broker = make(BROKER_URL, m.queue, best=self.best)
        self.loop.run_until_complete(self.broker.startup())
        self.tasks: dict[str, Any] = {
            kind: self.broker.find_task(f"bench.{kind}") for kind in ("noop", "sleep", "latency")
        }

    def _args(self, kind: str, arg: float) -> tuple[float, ...]:
        if kind == "noop":
            return ()
        return (time.time(),) if kind == "latency" else (arg,)

    def publish_fast(self, kind: str, n: int, arg: float = 0.0) -> None:
        task = self.tasks[kind]

        async def send() -> None:
            for first in range(0, n, FAST_WINDOW):
                await asyncio.gather(*(task.kiq(*self._args(kind, arg))
                                       for _ in range(min(FAST_WINDOW, n - first))))

        self.loop.run_until_complete(send())

    def publish_one(self, kind: str, arg: float = 0.0) -> None:
        self.loop.run_until_complete(self.tasks[kind].kiq(*self._args(kind, arg)))

    def start(self, m: Measurement, kind: str) -> Worker:
        command = [sys.executable, "-m", "taskiq", "worker", "benchmarks._apps.taskiq_app:broker",
                   "--workers", "2", "--no-configure-logging"]
        env = {
            "BENCH_BROKER_URL": BROKER_URL,
            "BENCH_QUEUE": m.queue,
            "BENCH_TASKIQ_BEST": "1" if self.best else "0",
            "BENCH_PROBE_DIR": str(m.probe_dir),
        }
        return start_worker(command, env, m.log_path)

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.broker.shutdown())
        finally:
            self.loop.close()

    def cleanup(self, admin: Admin) -> None:
        queue = self.m.queue
        admin.delete_queues(queue, f"{queue}.dead_letter")
        admin.delete_exchanges(queue)
