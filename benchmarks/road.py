"""What the one road (taskq.road.Road.build) costs per message, against building by hand.

Both sides build the same message of a two-argument task for an ordinary classic queue and
stop before any I/O (the app's broker is a closed port, and nothing is published):

- ``road``: ``app.road.build(task, args)``: signature check, priority and queue checks,
  ordering-key derivation, envelope, encoding, size check, routing;
- ``by hand``: the envelope and ``encode()`` alone, as a producer that checks nothing
  would build it: the floor under any road.

CPU time, so another process's load moves it less than wall time; the figure per side is
the minimum over ``--repeats`` runs of ``--count`` builds (the run least disturbed), plus
the median. Run on a quiet machine for figures to compare.

Usage::

    python -m benchmarks.road [--count 2000] [--repeats 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from taskq import App
from taskq.message import Envelope, encode, new_task_id


def _app(directory: str) -> App:
    return App("bench-road", broker_url="amqp://guest:guest@127.0.0.1:1/%2F",
               database_url=f"sqlite:///{directory}/road.sqlite3", default_queue="work")


def _per_message_us(build: Callable[[], object], count: int, repeats: int) -> list[float]:
    runs = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(count):
            build()
        runs.append((time.process_time() - started) / count * 1e6)
    return runs


def main() -> None:
    """Print µs of CPU per message for the road and for building by hand."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=40)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        app = _app(directory)

        @app.task(name="bench.record")
        def record(n: int, source: str) -> None: ...

        args = (7, "bench")

        def by_hand() -> object:
            return encode(Envelope(
                task_id=new_task_id(), task=record.name, args=list(args), kwargs={},
                priority=0, retries=0, idempotency_key=None, eta=None,
                timestamp=int(time.time()), app_id=app.name, headers={},
            ))

        def road() -> object:
            return app.road.build(record, args)

        for name, build in (("by hand", by_hand), ("road", road)):
            runs = _per_message_us(build, options.count, options.repeats)
            print(f"{name:8} min {min(runs):6.2f} µs  median {statistics.median(runs):6.2f} µs"
                  f"  ({options.repeats} x {options.count} builds, CPU time)")
        app.close()


if __name__ == "__main__":
    main()
