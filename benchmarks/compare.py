"""taskq side by side with the raw pika ceiling, Celery and Dramatiq, on the same broker.

    python -m benchmarks.compare              # the full comparison (about 13 minutes)
    python -m benchmarks.compare --quick      # small counts, one run: a smoke test
    python -m benchmarks.compare --only drain_noop e2e_noop --runs 3

Needs ``pip install -e '.[bench]'`` (Celery, Dramatiq, matplotlib), RabbitMQ on
``BENCH_BROKER_URL`` (default the local one, guest/guest; the broker's CPU is read from the
process listening on its port, its memory through ``BENCH_RABBITMQCTL``: see ``_proc``) and,
for the outbox and idempotency scenarios, PostgreSQL on ``BENCH_POSTGRES_URL`` (default
``postgresql+psycopg://root@127.0.0.1:5432/test``). Every measurement uses its own queue (and
taskq namespace) and deletes them; the PostgreSQL scenarios use a schema of their own that is
dropped at the end. Writes ``benchmarks/results/latest.json`` and ``latest.png`` (``quick.*``
with ``--quick``).

Scenarios (each contender measured ``--runs`` times, contenders alternating in every round):

- ``enqueue_each``: one call per message, one confirm each where the system confirms;
- ``drain_noop``: a queue pre-filled with no-op tasks by the fastest API (whose rate is the
  ``enqueue_fast`` figure), workers started afterwards: first task start to last task end;
- ``e2e_noop``: workers running while the producer enqueues with the fastest API: first
  enqueue to last task end;
- ``drain_sleep``: like drain_noop with tasks that sleep 1 ms;
- ``outbox``: taskq through the transactional outbox on PostgreSQL (``taskq worker`` with its
  relay): first commit to last task end, rows committed 100 per transaction and 1 per
  transaction;
- ``idempotency``: taskq end-to-end with ``idempotent=True`` (``taskq_processed`` on
  PostgreSQL) and ``idempotent=False``;
- ``latency``: enqueue-to-start at a steady ``--latency-rate`` tasks/s, p50 and p99.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

from benchmarks import _probe
from benchmarks._contender_taskiq import TaskiqContender
from benchmarks._contenders import (
    BROKER_URL,
    Admin,
    CeleryContender,
    Contender,
    DramatiqContender,
    Measurement,
    RawPika,
    Taskq,
    Worker,
)
from benchmarks._proc import Broker, CpuMeter
from benchmarks._report import Results, chart, load, write_outputs

POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCENARIOS = (
    "enqueue_each", "drain_noop", "e2e_noop", "drain_sleep", "outbox", "idempotency",
    "latency",
)


@dataclass
class Config:
    """Counts and repetitions (``--quick`` shrinks them)."""

    runs: int = 3
    noop_tasks: int = 20_000
    each_tasks: int = 3_000
    confirmed_e2e_tasks: int = 5_000
    sleep_tasks: int = 5_000
    sleep_s: float = 0.001
    outbox_tasks: int = 10_000
    outbox_rows_per_txn: int = 100
    outbox_single_tasks: int = 2_000
    idempotency_tasks: int = 5_000
    latency_tasks: int = 1_000
    latency_rate: float = 200.0

    @classmethod
    def quick(cls) -> Config:
        return cls(
            runs=1, noop_tasks=3_000, each_tasks=300, confirmed_e2e_tasks=1_000,
            sleep_tasks=1_000, outbox_tasks=2_000, outbox_single_tasks=300,
            idempotency_tasks=1_000, latency_tasks=300,
        )


class MeasurementFailed(Exception):
    """A measurement did not complete; carries the worker's log tail."""


class Harness:
    """Runs measurements: fresh names, workers, waiting, cleanup."""

    def __init__(self, config: Config, postgres_url: str) -> None:
        self.config = config
        self.admin = Admin()
        self.run_id = uuid.uuid4().hex[:6]
        self.counter = 0
        self.workdir = Path(tempfile.mkdtemp(prefix=f"taskq-compare-{self.run_id}-"))
        self.postgres_url = postgres_url
        self.schema: str | None = None
        self.database_url: str | None = None
        self.broker = Broker.find(BROKER_URL)

    # -- PostgreSQL --------------------------------------------------------------------------

    def create_schema(self) -> str:
        """A schema of our own with taskq's tables; returns the app's database URL."""
        import sqlalchemy as sa

        from benchmarks._apps.taskq_app import make_app

        self.schema = f"cmp_{self.run_id}"
        engine = sa.create_engine(self.postgres_url)
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{self.schema}"'))
        engine.dispose()
        self.database_url = f"{self.postgres_url}?options=-csearch_path%3D{self.schema}"
        app = make_app(database_url=self.database_url, namespace=f"cmp{self.run_id}")
        app.create_tables()
        app.close()
        return self.database_url

    def drop_schema(self) -> None:
        if self.schema is None:
            return
        import sqlalchemy as sa

        engine = sa.create_engine(self.postgres_url)
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
        engine.dispose()
        self.schema = None

    def postgres_version(self) -> str:
        import sqlalchemy as sa

        engine = sa.create_engine(self.postgres_url)
        try:
            with engine.connect() as conn:
                return str(conn.execute(sa.text("SHOW server_version")).scalar_one())
        finally:
            engine.dispose()

    # -- one measurement ---------------------------------------------------------------------

    @contextlib.contextmanager
    def measurement(self, contender: Contender, *, database: bool = False) -> Iterator[
        Measurement
    ]:
        self.counter += 1
        slug = contender.system.replace(" ", "")
        queue = f"cmp{self.run_id}.{slug}{self.counter}"
        probe_dir = self.workdir / f"{self.counter:03d}-probe"
        probe_dir.mkdir()
        m = Measurement(
            queue, probe_dir, self.workdir / f"{self.counter:03d}-{slug}.log",
            self.database_url if database else None,
        )
        contender.open(m)
        try:
            yield m
        finally:
            with contextlib.suppress(Exception):
                contender.close()
            contender.cleanup(self.admin)

    def wait_consumers(self, queue: str, expected: int, worker: Worker,
                       timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            counts = self.admin.counts(queue)
            if counts is not None and counts[1] >= expected:
                return
            self._check_alive(worker)
            self.admin.sleep(0.05)
        raise MeasurementFailed(f"{expected} consumers not up on {queue}\n{worker.tail()}")

    def wait_depth(self, queue: str, expected: int, timeout_s: float = 60.0) -> float:
        """``time.time()`` when ``queue`` holds ``expected`` ready messages."""
        deadline = time.monotonic() + timeout_s
        while True:
            counts = self.admin.counts(queue)
            if counts is not None and counts[0] >= expected:
                return time.time()
            if time.monotonic() > deadline:
                raise MeasurementFailed(f"{queue}: {counts} instead of {expected} messages")
            self.admin.sleep(0.005)

    def wait_done(self, m: Measurement, expected: int, worker: Worker) -> _probe.Totals:
        """Wait until the tasks recorded ``expected`` ends; return the totals."""
        deadline = time.monotonic() + 60 + expected / 100
        while True:
            totals = _probe.read(m.probe_dir)
            if totals.count >= expected:
                time.sleep(0.05)
                return _probe.read(m.probe_dir)
            if time.monotonic() > deadline:
                raise MeasurementFailed(
                    f"only {totals.count} of {expected} tasks ran\n{worker.tail()}"
                )
            self._check_alive(worker)
            time.sleep(0.02)

    @staticmethod
    def _check_alive(worker: Worker) -> None:
        if not worker.alive():
            raise MeasurementFailed(f"the workers exited\n{worker.tail()}")

    @contextlib.contextmanager
    def workers(self, contender: Contender, m: Measurement, kind: str,
                ready: bool = True) -> Iterator[Worker]:
        worker = contender.start(m, kind)
        try:
            if ready:
                self.wait_consumers(m.queue, contender.consumers, worker)
            yield worker
        finally:
            worker.stop()

    def close(self) -> None:
        self.admin.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


# -- scenarios ---------------------------------------------------------------------------------


def enqueue_each(h: Harness, r: Results, c: Contender) -> None:
    n = h.config.each_tasks
    with h.measurement(c) as m:
        started = time.time()
        c.publish_each("noop", n)
        landed = h.wait_depth(m.queue, n)
    r.add("enqueue_each", c, n / (landed - started), n, api=c.each_api)


def drain(h: Harness, r: Results, c: Contender, kind: str) -> None:
    n = h.config.noop_tasks if kind == "noop" else h.config.sleep_tasks
    arg = h.config.sleep_s if kind == "sleep" else 0.0
    with h.measurement(c) as m:
        started = time.time()
        c.publish_fast(kind, n, arg)
        landed = h.wait_depth(m.queue, n)
        with h.workers(c, m, kind, ready=False) as worker:
            totals = h.wait_done(m, n, worker)
    if kind == "noop":
        producer = c.name
        if isinstance(c, DramatiqContender):  # the thread count is the workers' business
            producer = f"dramatiq (confirms {'on' if c.confirm else 'off'})"
        r.add("enqueue_fast", c, n / (landed - started), n, api=c.fast_api, label=producer)
    r.add(f"drain_{kind}", c, n / (totals.last_end - totals.first_start), n)


def e2e(h: Harness, r: Results, c: Contender, scenario: str = "e2e_noop",
        n: int | None = None, database: bool = False) -> None:
    confirmed_each = isinstance(c, (CeleryContender, DramatiqContender)) and c.confirm
    confirmed_each = confirmed_each or (isinstance(c, Taskq) and c.each)
    if n is None:
        n = h.config.confirmed_e2e_tasks if confirmed_each else h.config.noop_tasks
    with h.measurement(c, database=database) as m, h.workers(c, m, "noop") as worker:
        cpu = CpuMeter(h.broker, worker.process.pid)
        started = time.time()
        c.publish_fast("noop", n)
        cpu.producer_done()
        totals = h.wait_done(m, n, worker)
        per_task = cpu.per_task_us(n)  # before the workers stop: their CPU is read live
    api = c.each_api if isinstance(c, Taskq) and c.each else c.fast_api
    r.add(scenario, c, n / (totals.last_end - started), n, api=api, cpu=per_task)


def outbox(h: Harness, r: Results, c: Taskq, rows_per_txn: int) -> None:
    from sqlalchemy.orm import Session

    n = h.config.outbox_tasks if rows_per_txn > 1 else h.config.outbox_single_tasks
    label = f"taskq outbox, {rows_per_txn} row{'s' if rows_per_txn > 1 else ''}/transaction"
    with h.measurement(c, database=True) as m, h.workers(c, m, "noop") as worker:
        task, engine = c.tasks["noop"], c.app.engine
        started = time.time()
        for first in range(0, n, rows_per_txn):
            with Session(engine) as session, session.begin():
                for _ in range(min(rows_per_txn, n - first)):
                    task.delay_on(session)
        committed = time.time()
        totals = h.wait_done(m, n, worker)
    r.add("outbox", c, n / (totals.last_end - started), n, label=label,
          api=f"apply_async(session=...), commit {n / (committed - started):,.0f} rows/s")


def latency(h: Harness, r: Results, c: Contender) -> None:
    n, rate, warmup = h.config.latency_tasks, h.config.latency_rate, 20
    with h.measurement(c) as m, h.workers(c, m, "latency") as worker:
        for _ in range(warmup):  # connections and first-call costs out of the way
            c.publish_one("latency")
        h.wait_done(m, warmup, worker)
        sent_after = time.time()
        started = time.perf_counter()
        for i in range(n):
            pause = started + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            c.publish_one("latency")
        h.wait_done(m, warmup + n, worker)
        values = sorted(v * 1000 for v in _probe.latencies(m.probe_dir, sent_after))
    r.add_latency(c, values, n, rate)


@dataclass
class Plan:
    """Which contender runs in which scenario."""

    name: str
    contenders: list[Contender]
    run: Callable[[Harness, Results, Contender], None]


def build_plans(idempotency_available: bool) -> list[Plan]:
    raw, taskq = RawPika(), Taskq()
    celery, celery_c = CeleryContender(confirm=False), CeleryContender(confirm=True)
    dq1, dq8 = (DramatiqContender(threads=t, confirm=False) for t in (1, None))
    dq1c, dq8c = (DramatiqContender(threads=t, confirm=True) for t in (1, None))
    taskq_delay = Taskq(each=True, label="taskq (delay(), one confirm each)")
    tiq, tiq_best = TaskiqContender(best=False), TaskiqContender(best=True)
    plans = [
        Plan("enqueue_each", [raw, taskq, celery_c, dq1c, tiq], enqueue_each),
        Plan("drain_noop", [raw, taskq, celery, dq1, dq8, tiq, tiq_best],
             lambda h, r, c: drain(h, r, c, "noop")),
        Plan("e2e_noop", [raw, taskq, taskq_delay, celery, celery_c, dq1, dq8, dq1c, dq8c,
                          tiq, tiq_best], e2e),
        Plan("drain_sleep", [raw, taskq, celery, dq1, dq8],
             lambda h, r, c: drain(h, r, c, "sleep")),
        Plan("outbox", [Taskq(relay=True, label="taskq outbox")], lambda h, r, c: (
            outbox(h, r, c, h.config.outbox_rows_per_txn), outbox(h, r, c, 1))),
        Plan("latency", [raw, taskq, celery, dq8, tiq_best], latency),
    ]
    if idempotency_available:
        idem_on = Taskq(idempotent=True, label="taskq idempotent=True (PostgreSQL)")
        idem_off = Taskq(idempotent=False, label="taskq idempotent=False")
        plans.insert(5, Plan("idempotency", [idem_off, idem_on], lambda h, r, c: e2e(
            h, r, c, "idempotency", h.config.idempotency_tasks, database=True)))
    return plans


def run(config: Config, only: list[str], postgres_url: str, output: Path) -> Results:
    from benchmarks._apps.taskq_app import HAS_IDEMPOTENCY

    harness = Harness(config, postgres_url)
    results = Results(config=asdict(config))
    results.environment(harness.admin.server_version(), harness.postgres_version())
    # Which broker, and how busy the machine was: figures of a shared machine are only
    # comparable with the load they were taken under.
    results.env["broker"] = {"url_host": _host_port(BROKER_URL), "pid": harness.broker.pid}
    results.env["loadavg_start"] = os.getloadavg()
    if not HAS_IDEMPOTENCY:
        results.note("idempotency: not available: this taskq has no idempotent task option")
    plans = [p for p in build_plans(HAS_IDEMPOTENCY) if not only or p.name in only]
    try:
        if any(p.name in ("outbox", "idempotency") for p in plans):
            harness.create_schema()
        for round_index in range(config.runs):
            for plan in plans:
                shift = round_index % len(plan.contenders)
                order = plan.contenders[shift:] + plan.contenders[:shift]
                for contender in order:
                    _measure(harness, results, plan, contender, round_index)
    finally:
        harness.drop_schema()
        harness.close()
    results.env["loadavg_end"] = os.getloadavg()
    write_outputs(results, output)
    return results


def _host_port(url: str) -> str:
    """``host:port`` of an AMQP URL (no credentials in the results)."""
    parsed = urlparse(url)
    return f"{parsed.hostname}:{parsed.port or 5672}"


def _measure(h: Harness, r: Results, plan: Plan, c: Contender, round_index: int) -> None:
    began = time.monotonic()
    try:
        plan.run(h, r, c)
    except Exception as exc:  # record and go on: one broken contender must not end the run
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if not isinstance(exc, MeasurementFailed):
            detail += "\n" + traceback.format_exc(limit=6)
        r.error(plan.name, c.name, detail)
        print(f"  ! {plan.name} / {c.name}: {detail[:2000]}", file=sys.stderr)
    print(f"round {round_index + 1} {plan.name:<13} {c.name:<48} "
          f"{time.monotonic() - began:5.1f}s  {r.last_line()}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, one run")
    parser.add_argument("--runs", type=int, help="runs per figure (default 3)")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=[],
                        help="run these scenarios only")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--output", type=Path,
                        help="JSON path (default benchmarks/results/latest.json, "
                        "quick.json with --quick); the PNG goes beside it")
    parser.add_argument("--replot", action="store_true",
                        help="only redraw the PNG from the JSON of an earlier run")
    args = parser.parse_args(argv)
    if args.replot:
        path = args.output or RESULTS_DIR / ("quick.json" if args.quick else "latest.json")
        chart(load(path), path.with_suffix(".png"))
        print(load(path).markdown())
        return
    config = Config.quick() if args.quick else Config()
    if args.runs:
        config.runs = args.runs
    output = args.output or RESULTS_DIR / ("quick.json" if args.quick else "latest.json")
    started = time.monotonic()
    results = run(config, args.only, args.postgres_url, output)
    print(results.markdown())
    print(f"\nwrote {output} and {output.with_suffix('.png')} "
          f"in {(time.monotonic() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()

