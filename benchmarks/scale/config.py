"""Sizes of every scale scenario; ``--quick`` shrinks them to a smoke test of a few minutes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ScaleConfig:
    """Counts and repetitions of ``python -m benchmarks.scale``."""

    runs: int = 3
    #: Pre-filled queue sizes drained by ``taskq worker -c 2``: the small one is the baseline.
    backlog_sizes: tuple[int, ...] = (20_000, 1_000_000)
    #: Worker RSS is compared at these totals of tasks done (taken from the largest backlog).
    rss_checkpoints: tuple[int, ...] = (100_000, 1_000_000)
    #: Tasks each peer (Celery, Dramatiq) drains for its RSS figure.
    peer_memory_tasks: int = 200_000
    #: Outbox rows waiting when one relay starts: the small one is the baseline.
    relay_sizes: tuple[int, ...] = (5_000, 1_000_000)
    #: Keys in taskq_processed for the check latency and the prune.
    idempotency_keys: int = 10_000_000
    idempotency_samples: int = 20_000
    #: Delayed tasks through the tiers, delays spread uniformly over the range (seconds).
    delayed_tasks: int = 100_000
    delay_range_s: tuple[float, float] = (1.0, 600.0)
    #: Enqueue-to-start latency at a steady rate with one delay() per task.
    latency_rate: float = 1_000.0
    latency_tasks: int = 30_000
    #: End-to-end no-op tasks per scaling point.
    scaling_tasks: int = 40_000
    scaling_processes: tuple[int, ...] = (1, 2, 4)

    @classmethod
    def quick(cls) -> ScaleConfig:
        return cls(
            runs=1, backlog_sizes=(2_000, 20_000), rss_checkpoints=(2_000, 20_000),
            peer_memory_tasks=5_000, relay_sizes=(2_000, 20_000), idempotency_keys=200_000,
            idempotency_samples=2_000, delayed_tasks=1_000, delay_range_s=(1.0, 10.0),
            latency_rate=500.0, latency_tasks=1_500, scaling_tasks=5_000,
        )
