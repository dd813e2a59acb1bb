"""Delay backends: how a message waits in RabbitMQ until it is due (docs/delays.md).

:mod:`taskq.retry` decides *when* to run again; this package decides *how* to wait. Nothing
here holds a message in a process: a delayed message waits in the broker, never unacked in a
worker (RabbitMQ's ``consumer_timeout`` would close the worker's channel, and waiting
messages would fill its prefetch).

- :mod:`taskq.delay.maths`: pure delay arithmetic (epoch ms, tier bits, ``x-delay`` checks).
- :mod:`taskq.delay.backend`: the :class:`~taskq.delay.backend.DelayBackend` seam, the
  :class:`~taskq.delay.backend.DelayedMessage` it takes, and the declarer both backends share.
- :mod:`taskq.delay.tiers`: **tiers**, plugin-free fixed-TTL queues (any RabbitMQ).
- :mod:`taskq.delay.plugin`: **plugin**, ``rabbitmq_delayed_message_exchange``.
- :mod:`taskq.delay.choosing`: resolves ``delay_backend="auto"|"plugin"|"tiers"``, logs the
  choice and builds the backend.
"""
