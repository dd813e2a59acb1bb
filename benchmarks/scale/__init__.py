"""taskq at scale: backlog size, outbox backlog, idempotency keys, delays, memory, latency,
scaling (issue 19). Run ``python -m benchmarks.scale`` (``--quick`` for a smoke test)."""
