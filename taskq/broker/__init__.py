"""RabbitMQ adapters: connections, topology, publishing and consuming (pika lives here only)."""
