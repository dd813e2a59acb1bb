"""The transactional outbox: enqueue in the caller's transaction, relay to the broker."""
