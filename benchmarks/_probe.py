"""Cheap task timestamps shared by every system's bench tasks, read back by the harness.

Each (process, thread) that runs tasks owns one small file in ``$BENCH_PROBE_DIR``. A task
calls :func:`begin` at its start and :func:`end` at its end; ``end`` overwrites the file's 24
bytes (first start, last end, count) with one ``pwrite`` -- about a microsecond, no lock, no
flush, and nothing lost when a pool kills its children with ``os._exit``. :func:`started`
appends the enqueue-to-start latency of one task to a second file. The harness sums the
counts to see when a run is done and takes the earliest start and the latest end.

Clocks: ``time.time()`` (one clock for every process of the machine; the latency tasks carry
the producer's ``time.time()`` at the enqueue call).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_RECORD = struct.Struct("<ddq")
_LATENCY = struct.Struct("<dd")
_state = threading.local()


class _Writer:
    """The probe files of one (process, thread)."""

    def __init__(self, directory: str) -> None:
        name = f"{os.getpid()}-{threading.get_ident()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.pid = os.getpid()
        self.fd = os.open(os.path.join(directory, name + ".rec"), flags, 0o644)
        self.latency_fd = os.open(
            os.path.join(directory, name + ".lat"), flags | os.O_APPEND, 0o644
        )
        self.first = 0.0
        self.count = 0


def _writer() -> _Writer:
    writer: _Writer | None = getattr(_state, "writer", None)
    if writer is None or writer.pid != os.getpid():  # first call, or a forked pool child
        writer = _state.writer = _Writer(os.environ["BENCH_PROBE_DIR"])
    return writer


def begin() -> None:
    """A task starts."""
    writer = _writer()
    if not writer.first:
        writer.first = time.time()


def end() -> None:
    """A task ends: publish first start, last end and count of this thread."""
    writer = _writer()
    writer.count += 1
    os.pwrite(writer.fd, _RECORD.pack(writer.first, time.time(), writer.count), 0)


def started(sent_at: float) -> None:
    """A latency task starts: record ``sent_at`` and ``now - sent_at`` (seconds)."""
    now = time.time()
    writer = _writer()
    if not writer.first:
        writer.first = now
    os.write(writer.latency_fd, _LATENCY.pack(sent_at, now - sent_at))


@dataclass(frozen=True)
class Totals:
    """What every task thread of a run recorded so far."""

    count: int
    first_start: float
    last_end: float


def read(directory: Path) -> Totals:
    """Sum the records in ``directory``."""
    count, first, last = 0, float("inf"), 0.0
    for path in directory.glob("*.rec"):
        data = path.read_bytes()
        if len(data) < _RECORD.size:
            continue
        start, stop, n = _RECORD.unpack_from(data)
        count += n
        first = min(first, start)
        last = max(last, stop)
    return Totals(count, first, last)


def latencies(directory: Path, sent_after: float = 0.0) -> list[float]:
    """The enqueue-to-start latencies (seconds) of the tasks sent after ``sent_after``."""
    values: list[float] = []
    for path in directory.glob("*.lat"):
        data = path.read_bytes()
        usable = len(data) - len(data) % _LATENCY.size
        values.extend(v for sent, v in _LATENCY.iter_unpack(data[:usable]) if sent >= sent_after)
    return values
