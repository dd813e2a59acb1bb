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
from benchmarks._proc import CpuMeter, tree_cpu_s
from benchmarks.compare import Harness


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
    with h.measurement(c) as m, h.workers(c, m, "noop") as workers:
        meters = [CpuMeter(h.broker, w.process.pid) for w in workers.workers]
        started = time.time()
        c.publish_fast("noop", n)
        for meter in meters:
            meter.producer_done()
        totals = h.wait_done(m, n, workers)
        readings = [meter.per_task_us(n) for meter in meters]
    elapsed = totals.last_end - started
    cpu = {**readings[0], "workers": sum(r["workers"] or 0.0 for r in readings)}
    return {
        "processes": processes, "supervisors": supervisors, "tasks": n, "rate": n / elapsed,
        "cpu_us_per_task": cpu,
        # CPU seconds per second of the run: 1.0 is one whole core of the two
        "cores_busy": {side: None if v is None else v * n / 1e6 / elapsed
                       for side, v in cpu.items()},
    }
