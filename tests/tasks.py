"""Tasks for worker subprocesses in the system tests (``-A tests.tasks:app``).

The app takes its namespace, queue and broker from ``TASKQ_*`` variables, which each test
sets for its own worker. Tasks prove that they ran by appending one line per run to a file
whose path is an argument: ``O_APPEND`` writes of a short line are atomic, so a test counts
runs exactly even with several processes writing.
"""

from __future__ import annotations

import os
import time

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


@app.task(time_limit_s=1.0)
def overrun(path: str) -> None:
    """Record the start, then run far past the 1 s hard limit."""
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
