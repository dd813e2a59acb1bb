"""Where a ``taskq worker`` process spends its CPU draining no-op tasks (py-spy, sampled).

    python -m benchmarks.profile_worker [--tasks 200000] [--processes 1] [--rate 250]

Pre-fills a queue of its own with ``Task.starmap``, starts ``taskq worker -c N`` on it, attaches
``py-spy record --nonblocking`` to each worker process once it consumes, stops it when the
queue is empty and prints the functions with the most samples: *self* (the frame on top of
the stack) and *inclusive* (anywhere on it), per thread summed. Idle samples (a thread
waiting in ``select`` or on a lock) are not recorded, so the figures are CPU time. The raw
collapsed stacks stay in ``--out`` (default a temporary directory) for a flame graph
(``flamegraph.pl``, speedscope). Needs ``py-spy`` on PATH (``pip install py-spy``) and the
local RabbitMQ; the queue and its namespace are deleted at the end.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

from benchmarks._apps.taskq_app import make_app
from benchmarks._contenders import BROKER_URL, Admin
from benchmarks._proc import children

FILL_CHUNK = 50_000
# "function (path/to/file.py:123)" -> "function (path/to/file.py)": functions, not lines.
_LINE = re.compile(r":\d+\)$")


def depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def run(tasks: int, processes: int, rate: int, out: Path) -> list[Path]:
    namespace = f"prof{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}.q"
    app = make_app(idempotent=False, broker_url=BROKER_URL, namespace=namespace,
                   default_queue=queue)
    noop = app.registry.get("bench.noop")
    worker: subprocess.Popen[bytes] | None = None
    spies: list[subprocess.Popen[bytes]] = []
    try:
        for first in range(0, tasks, FILL_CHUNK):
            noop.starmap([()] * min(FILL_CHUNK, tasks - first))
        env = {**os.environ, "TASKQ_BROKER_URL": BROKER_URL, "TASKQ_NAMESPACE": namespace,
               "TASKQ_DEFAULT_QUEUE": queue, "BENCH_IDEMPOTENT": "0"}
        env["BENCH_PROBE_DIR"] = str(out / "probe")  # the bench tasks record their runs
        (out / "probe").mkdir(exist_ok=True)
        worker = subprocess.Popen(
            [sys.executable, "-m", "taskq", "worker", "-A", "benchmarks._apps.taskq_app:app",
             "-c", str(processes), "--no-relay", "--loglevel", "WARNING"], env=env,
        )
        deadline = time.monotonic() + 60
        while depth(BROKER_URL, queue) >= tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [pid for pid in children(worker.pid) if _is_worker_process(pid)]
        outputs = [out / f"worker-{pid}.txt" for pid in pids]
        spies = [subprocess.Popen(["py-spy", "record", "--nonblocking", "--format", "raw",
                                   "-r", str(rate), "-p", str(pid), "-o", str(path)],
                                  stdout=subprocess.DEVNULL)
                 for pid, path in zip(pids, outputs, strict=True)]
        began = time.monotonic()
        while depth(BROKER_URL, queue) > 0:
            time.sleep(0.1)
        print(f"drained in {time.monotonic() - began:.1f} s after py-spy attached "
              f"({processes} processes)")
        return outputs
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(30)
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
        app.close()
        Admin().delete_taskq_app(namespace, queue)


def _is_worker_process(pid: int) -> bool:
    """A spawned worker process, not multiprocessing's resource tracker."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"spawn_main" in cmdline and b"resource_tracker" not in cmdline


def summarise(paths: list[Path], top: int) -> None:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
            total += n
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    if not total:
        print("no samples")
        return
    for title, counter in (("self", own), ("inclusive", inclusive)):
        print(f"\n{title} (of {total} samples)")
        for frame, n in counter.most_common(top):
            print(f"  {100 * n / total:5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, help="keep the raw stacks here")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not on PATH: pip install py-spy")
    out = args.out or Path(tempfile.mkdtemp(prefix="taskq-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    summarise(run(args.tasks, args.processes, args.rate, out), args.top)
    print(f"\nraw stacks in {out}")


if __name__ == "__main__":
    main()
