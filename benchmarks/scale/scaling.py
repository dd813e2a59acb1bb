"""End-to-end no-op rate with 1, 2 and 4 worker processes and with two supervisors, with the
CPU seconds per task of the producer, the workers and the broker (from /proc).

The producer enqueues with ``Task.starmap`` while the workers run; rate = tasks / (first
enqueue to last task end). The broker's and the workers' CPU are read before the workers
stop, so the figures show which of them the 2-core machine runs out of first.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks._contenders import Measurement, Taskq, Worker
from benchmarks.compare import Harness
from benchmarks.scale._proc import Broker, tree_cpu_s


class Supervisors:
    """Several ``taskq worker`` commands driven as one (``Harness.workers`` needs one)."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    def stop(self, timeout_s: float = 20.0) -> None:
        for worker in self.workers:
            worker.stop(timeout_s)

    def alive(self) -> bool:
        return all(worker.alive() for worker in self.workers)

    def tail(self, chars: int = 3000) -> str:
        return "\n".join(worker.tail(chars) for worker in self.workers)

    def cpu_s(self) -> float:
        return sum(tree_cpu_s(worker.process.pid) for worker in self.workers)


class ScaledTaskq(Taskq):
    """taskq with ``-c processes`` per supervisor and ``supervisors`` supervisors."""

    def __init__(self, processes: int, supervisors: int = 1) -> None:
        super().__init__(label=f"taskq {supervisors} x -c {processes}", processes=processes)
        self.supervisors = supervisors
        self.consumers = processes * supervisors

    def start(self, m: Measurement, kind: str) -> Any:
        return Supervisors([Taskq.start(self, m, kind) for _ in range(self.supervisors)])


def run_point(h: Harness, processes: int, supervisors: int, n: int) -> dict[str, Any]:
    c = ScaledTaskq(processes, supervisors)
    broker = Broker.find()
    with h.measurement(c) as m, h.workers(c, m, "noop") as workers:
        broker_before, workers_before = broker.cpu_s(), workers.cpu_s()
        started, producer_before = time.time(), time.process_time()
        c.publish_fast("noop", n)
        producer_s = time.process_time() - producer_before
        totals = h.wait_done(m, n, workers)
        workers_s = workers.cpu_s() - workers_before
        broker_after = broker.cpu_s()
    broker_s = None if broker_before is None or broker_after is None else (
        broker_after - broker_before)
    elapsed = totals.last_end - started
    return {
        "processes": processes, "supervisors": supervisors, "tasks": n, "rate": n / elapsed,
        "cpu_us_per_task": {
            "producer": producer_s / n * 1e6, "workers": workers_s / n * 1e6,
            "broker": None if broker_s is None else broker_s / n * 1e6,
        },
        "cpu_share_of_elapsed": {
            "workers": workers_s / elapsed,
            "broker": None if broker_s is None else broker_s / elapsed,
        },
    }
