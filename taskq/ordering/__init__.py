"""Ordered queues: tasks with the same ordering key run one at a time, in enqueue order.

``app.queue("ledger", partitions=16)`` declares 16 partition queues (``ledger.p0`` ..
``ledger.p15``), each with ``x-single-active-consumer``. A message's partition is a fixed hash
of its ordering key (:mod:`taskq.ordering.keys`), computed by :mod:`taskq.ordering.routing`
for ``delay()``, bulk enqueue and the outbox alike. Workers consume every partition
(:mod:`taskq.ordering.spread` decides which ones each process registers for first), run one
delivery at a time, and retry a failed ordered task in place (:mod:`taskq.ordering.in_place`).
See docs/ordering.md.
"""
