"""RabbitMQ adapters: connections, topology, publishing and consuming (pika lives here only)."""

# Before any connection exists: no header value may abort a connection (see the module).
from taskq.broker import _pika_fields as _pika_fields
