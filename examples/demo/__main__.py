"""`python -m examples.demo`: place orders through the outbox, run a worker, show what ran where.

Steps: purge the demo queues, place 200 orders in the embedded SQLite database, each in one
publisher confirms, start ``taskq worker -c 3`` as a subprocess, show a progress line, stop
the worker with SIGTERM (warm shutdown) and print a summary.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from examples.demo.tasks import EMAILS, ORDERS, app, place_order, shop
from taskq import metadata
from taskq.settings import redact_url

TOTAL = 400
PROCESSES = 3
DEADLINE_S = 120.0


def place_orders(total_tasks: int) -> float:
    """Place orders, each in one transaction with its two outbox rows; return seconds."""
    rng = random.Random(7)
    engine = app.engine
    shop.drop_all(engine)
    shop.create_all(engine)
    app.create_tables()
    with engine.begin() as conn:  # leftovers of an interrupted earlier demo
        conn.execute(metadata.tables["taskq_outbox"].delete())
    started = time.perf_counter()
    for order_id in range(total_tasks // 2):
        with engine.begin() as conn:
            place_order(conn, order_id, rng.randint(100, 90_000),
                        rng.choice([0, 0, 0, 1, 2, 5, 9]))
    return time.perf_counter() - started


def purge_demo_queues() -> None:
    from taskq.broker.connection import declare, open_connection

    connection = open_connection(app.settings, client_name="taskq-demo")
    try:
        channel = declare(connection.channel(), app.topology.base())
        for queue in (ORDERS, EMAILS):
            channel = declare(channel, app.topology.for_queue(queue))
            channel.queue_purge(queue)
    finally:
        connection.close()


def read_records(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line]


def show_progress(path: Path, worker: subprocess.Popen[bytes]) -> list[list[str]]:
    started = time.monotonic()
    records: list[list[str]] = []
    while time.monotonic() - started < DEADLINE_S:
        records = read_records(path)
        done = len(records)
        # The rate counts from the first finished task, not from the worker's start-up.
        elapsed = time.time() - float(records[0][5]) if records else 0.0
        bar = "#" * (30 * done // TOTAL)
        sys.stdout.write(
            f"\r  [{bar:<30}] {done}/{TOTAL} done, {done / max(elapsed, 1e-6):6.0f} tasks/s"
        )
        sys.stdout.flush()
        if done >= TOTAL or worker.poll() is not None:
            break
        time.sleep(0.2)
    sys.stdout.write("\n")
    return records


def summarise(records: list[list[str]]) -> None:
    by_process: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for pid, queue, *_ in records:
        by_process[pid][queue] += 1
    print("\nWhat ran where: tasks run by each worker process (by pid), per queue. Each")
    print("process takes what it can, so the work spreads over all three:")
    print(f"  {'process':>8}  {ORDERS:>12}  {EMAILS:>12}")
    for pid, counts in sorted(by_process.items()):
        print(f"  {pid:>8}  {counts[ORDERS]:>12}  {counts[EMAILS]:>12}")
    print("\nPriorities: the position at which tasks ran in their queue (0 ran first), on")
    print("average per message priority. Orders were placed in random priority order; a")
    print("lower average for priority 9 means urgent tasks overtook the backlog:")
    for queue in (ORDERS, EMAILS):
        ranks: dict[str, list[int]] = collections.defaultdict(list)
        rows = sorted((r for r in records if r[1] == queue), key=lambda r: float(r[5]))
        for rank, row in enumerate(rows):
            ranks["priority 9" if row[3] == "9" else "priority 0-2" if int(row[3]) <= 2 else "mid"]\
                .append(rank)
        summary = ", ".join(
            f"{label} ran at position {sum(v) / len(v):.0f} of {len(rows)} on average"
            for label, v in sorted(ranks.items(), reverse=True) if label != "mid"
        )
        print(f"  {queue}: {summary}")


def main() -> int:
    print(f"taskq demo: broker {redact_url(app.settings.broker_url)}")
    record = Path(tempfile.mkdtemp(prefix="taskq-demo-")) / "runs.log"
    os.environ["TASKQ_DEMO_RECORD"] = str(record)
    purge_demo_queues()
    elapsed = place_orders(TOTAL)
    print(f"  placed {TOTAL // 2} orders in {redact_url(app.settings.database_url)}, each "
          f"committed with its 2 tasks in the outbox ({TOTAL} tasks for {ORDERS} and "
          f"{EMAILS}) in {elapsed:.2f}s")
    app.close()
    root = str(Path(__file__).resolve().parents[2])
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    command = [sys.executable, "-m", "taskq", "worker", "-A", "examples.demo.tasks:app",
               "-Q", f"{ORDERS},{EMAILS}", "-c", str(PROCESSES), "--loglevel", "WARNING"]
    print(f"  starting: taskq worker -A examples.demo.tasks:app -c {PROCESSES} "
          "(its outbox relay publishes the committed rows)")
    print("  progress: tasks finished so far, and the rate since the first one finished")
    worker = subprocess.Popen(command, env=env)
    try:
        records = show_progress(record, worker)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    summarise(records)
    print(f"\n  worker stopped with exit code {code} after a warm shutdown (SIGTERM: running "
          "tasks finished first; 0 is a clean stop)")
    backlog = app.outbox_backlog().rows
    print(f"  outbox rows left: {backlog} (committed tasks the relay has not published yet)")
    ok = len(records) == TOTAL and code == 0 and backlog == 0
    print("  demo " + ("finished: every task ran once." if ok else "FAILED: see above."))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
