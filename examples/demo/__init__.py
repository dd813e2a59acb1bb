"""The `make demo` example: a shop that sends work to two queues."""
