"""The raw pika ceiling's consumer: ``python -m benchmarks._apps.raw_consumer QUEUE KIND [N]``.

N processes (default 1), each a ``BlockingConnection`` with ``basic_qos(prefetch_count)`` and
one manual ``basic_ack`` per delivery, sent after the "task" ran. KIND: ``noop``, ``sleep``
(body: seconds, a little-endian double) or ``latency`` (body: the producer's ``time.time()``).
SIGTERM stops them.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time

import pika

from benchmarks import _probe

_DOUBLE = struct.Struct("<d")


def consume(queue: str, kind: str) -> None:
    prefetch = int(os.environ.get("BENCH_PREFETCH", "16"))
    connection = pika.BlockingConnection(pika.URLParameters(os.environ["BENCH_BROKER_URL"]))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)

    def on_message(ch, method, properties, body):  # noqa: ANN001, ANN202 - pika callback
        if kind == "latency":
            _probe.started(_DOUBLE.unpack(body)[0])
        else:
            _probe.begin()
            if kind == "sleep":
                time.sleep(_DOUBLE.unpack(body)[0])
        _probe.end()
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    signal.signal(signal.SIGTERM, lambda *_: channel.stop_consuming())
    channel.start_consuming()
    connection.close()


def main() -> None:
    queue, kind = sys.argv[1], sys.argv[2]
    processes = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    if processes == 1:
        consume(queue, kind)
        return
    children = [
        subprocess.Popen([sys.executable, "-m", __spec__.name, queue, kind])
        for _ in range(processes)
    ]
    signal.signal(signal.SIGTERM, lambda *_: [child.terminate() for child in children])
    for child in children:
        child.wait()


if __name__ == "__main__":
    main()
