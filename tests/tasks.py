"""Tasks for worker subprocesses in the system tests (``-A tests.tasks:app``).

The app takes its namespace, queue and broker from ``TASKQ_*`` variables, which each test
sets for its own worker. Tasks prove that they ran by appending one line per run to a file
whose path is an argument: ``O_APPEND`` writes of a short line are atomic, so a test counts
runs exactly even with several processes writing.
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from taskq import App, Reject, SoftTimeLimitExceeded

app = App("taskq-tests")


def append_line(path: str, *words: object) -> None:
    """Append one line (``words`` joined by spaces, then the pid) to ``path``."""
    line = " ".join(str(word) for word in (*words, os.getpid())) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_lines(path: str) -> list[list[str]]:
    """The lines :func:`append_line` wrote, split into words (``[]`` if none yet)."""
    try:
        with open(path, encoding="utf-8") as file:
            return [line.split() for line in file if line.strip()]
    except FileNotFoundError:
        return []


@app.task
def noop() -> None:
    """Do nothing (benchmarks)."""


@app.task
def record(path: str, tag: str = "-") -> None:
    """Record one run: ``ran <tag> <pid>``."""
    append_line(path, "ran", tag)


@app.task
def slow(path: str, seconds: float, tag: str = "-") -> None:
    """Record ``start``, sleep, record ``done``."""
    append_line(path, "start", tag)
    time.sleep(seconds)
    append_line(path, "done", tag)


@app.task
def crash(path: str) -> None:
    """Record the run, then kill the process without any cleanup."""
    append_line(path, "crash")
    os._exit(1)


@app.task
def fail(path: str) -> None:
    """Record the run, then raise."""
    append_line(path, "fail")
    raise ValueError("the answer is not 42")


@app.task
def reject(path: str) -> None:
    """Record the run, then reject the message."""
    append_line(path, "reject")
    raise Reject("the order was cancelled")


@app.task(time_limit_s=1.0, max_retries=0)
def overrun(path: str) -> None:
    """Record the start, then run far past the 1 s hard limit (no retries: dead-lettered)."""
    append_line(path, "start")
    time.sleep(60)
    append_line(path, "done")


@app.task(soft_time_limit_s=0.5, time_limit_s=10.0)
def soft_overrun(path: str) -> None:
    """Run past the 0.5 s soft limit; record that the exception arrived, then re-raise."""
    append_line(path, "start")
    try:
        time.sleep(5)
    except SoftTimeLimitExceeded:
        append_line(path, "caught")
        raise
    append_line(path, "done")


# -- money transfers: transactional tasks (exactly-once effects in the database) ----------

bank = sa.MetaData()
accounts = sa.Table(
    "test_accounts",
    bank,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("balance", sa.BigInteger, nullable=False),
)
applied = sa.Table(
    "test_transfers_applied",
    bank,
    sa.Column("transfer_id", sa.Integer, nullable=False),  # no unique key on purpose
)


@app.task(transactional=True)
def transfer(transfer_id: int, source: int, target: int, amount: int, *, session: Any) -> None:
    """Move ``amount`` between two accounts in the task's transaction (with its key)."""
    # Lock rows in id order so that concurrent transfers never deadlock.
    for account, delta in sorted(((source, -amount), (target, amount))):
        session.execute(
            accounts.update()
            .where(accounts.c.id == account)
            .values(balance=accounts.c.balance + delta)
        )
    session.execute(applied.insert().values(transfer_id=transfer_id))


@app.task(transactional=True)
def slow_transfer(
    transfer_id: int, path: str, seconds: float, *, session: Any
) -> None:
    """Record the start, hold the transaction open a while, then apply (one row)."""
    append_line(path, "start", transfer_id)
    time.sleep(seconds)
    session.execute(applied.insert().values(transfer_id=transfer_id))


@app.task(transactional=True)
def failing_transfer(transfer_id: int, *, session: Any) -> None:
    """Write, then fail: the write and the key must both roll back."""
    session.execute(applied.insert().values(transfer_id=transfer_id))
    raise RuntimeError("the payment provider said no")


# -- retries (tests/system/test_worker_retries.py) -------------------------------------------


@app.task(autoretry_for=(ConnectionError,), retry_backoff=0.1, retry_jitter=False)
def flaky(path: str, failures: int) -> None:
    """Record ``flaky <run>``; raise ConnectionError on the first ``failures`` runs."""
    run = sum(1 for line in read_lines(path) if line[0] == "flaky") + 1
    append_line(path, "flaky", run)
    if run <= failures:
        raise ConnectionError(f"run {run}: the provider is down")


@app.task(
    autoretry_for=(ConnectionError,), max_retries=2, retry_backoff=0.05, retry_jitter=False
)
def always_down(path: str) -> None:
    """Record ``down``, then raise ConnectionError: exhausts its two retries."""
    append_line(path, "down")
    raise ConnectionError("the provider is down")


@app.task(bind=True, max_retries=5)
def asks_for_retries(self: Any, path: str, until: int) -> None:
    """Record ``attempt <retries>``; ask for a 0.2 s retry until ``until`` retries were done."""
    append_line(path, "attempt", self.request.retries)
    if self.request.retries < until:
        raise self.retry(countdown=0.2)


@app.task(time_limit_s=1.0, max_retries=1, retry_backoff=0.1)
def overrun_retried(path: str) -> None:
    """Record the start, then run past the 1 s hard limit; one retry is allowed."""
    append_line(path, "start")
    time.sleep(60)


@app.task(
    autoretry_for=(ConnectionError,), max_retries=5, retry_backoff=2.0, retry_jitter=False
)
def down_until(path: str, flag: str) -> None:
    """Record ``run``; raise ConnectionError until the file ``flag`` exists."""
    append_line(path, "run")
    if not os.path.exists(flag):
        raise ConnectionError("the provider is down")


# -- results and observability -------------------------------------------------------------


@app.task(store_result=True)
def add(x: int, y: int) -> int:
    """Return the sum (its result is stored)."""
    return x + y


@app.task(store_result=True)
def explode(path: str) -> None:
    """Record the run, then fail (the failure is stored)."""
    append_line(path, "explode")
    raise ZeroDivisionError("the numbers did not add up")


@app.task(autoretry_for=(ValueError,), max_retries=5, retry_backoff=0.1, retry_jitter=False)
def fail_first_attempt(path: str) -> None:
    """First attempt: record, wait for ``path + '.go'`` (up to 20 s), then fail; later: ok."""
    from taskq.request import current_request

    if current_request.get().retries == 0:
        append_line(path, "attempt0")
        deadline = time.monotonic() + 20
        while not os.path.exists(path + ".go") and time.monotonic() < deadline:
            time.sleep(0.05)
        raise ValueError("the first attempt always fails")
    append_line(path, "ok")


@app.task(autoretry_for=(ValueError,), max_retries=1, retry_backoff=4.0, retry_jitter=False)
def fail_once_retry_later(path: str) -> None:
    """Record ``attempt<N>``; the first attempt fails and is retried 4 s later."""
    from taskq.task import current_request

    retries = current_request.get().retries
    append_line(path, f"attempt{retries}")
    if retries == 0:
        raise ValueError("the first attempt fails")


@app.task
def blocked(path: str, tag: str = "-") -> None:
    """Record ``start``, wait for the file ``path + '.go'`` (up to 30 s), record ``done``."""
    append_line(path, "start", tag)
    deadline = time.monotonic() + 30
    while not os.path.exists(path + ".go") and time.monotonic() < deadline:
        time.sleep(0.05)
    append_line(path, "done", tag)


@app.task(idempotent=False)
def record_unkeyed(path: str, tag: str = "-") -> None:
    """Like ``record``, without the idempotency check: every delivery that starts runs."""
    append_line(path, "ran", tag)


@app.task(idempotent=False, time_limit_s=20.0, max_retries=0)
def slow_limited(path: str, seconds: float, tag: str = "-") -> None:
    """Like ``slow_unkeyed``, within a hard time limit of 20 s."""
    append_line(path, "start", tag)
    time.sleep(seconds)
    append_line(path, "done", tag)


@app.task(autoretry_for=(ValueError,), max_retries=1, retry_backoff=120.0, retry_jitter=False)
def fail_then_retry_in_two_minutes(path: str) -> None:
    """Record ``failed``, raise ValueError: its one retry is due two minutes later."""
    append_line(path, "failed")
    raise ValueError("the first attempt fails")
