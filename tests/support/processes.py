"""Waiting on, and signalling, processes a test started: without check-then-act races.

A process may exit, and its parent reap it, between any two steps of a test: between "does
``/proc/PID/stat`` exist?" and reading it (the ``beam.smp`` of a killed RabbitMQ node
vanished there, and the read raised ``ProcessLookupError``), or between finding a PID and
signalling it, by which time the PID may belong to another process (``pid_max`` is 32,768
here, and other test runs spawn processes all the time). So:

- :func:`process_gone` reads ``/proc/PID/stat`` once and takes any "no such process" answer
  as gone;
- :func:`kill_process` pins the process with a pidfd before it checks whose child it is, and
  signals through that pidfd: a process that has exited is never signalled, and neither is
  a newcomer that got its PID.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.waiting import wait_until

# The states of /proc/PID/stat that mean "has exited": zombie (not reaped yet), dead.
_EXITED_STATES = (b"Z", b"X")


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie its parent has not reaped counts as gone)."""
    fields = _stat_fields(pid)
    return fields is None or fields[0] in _EXITED_STATES


def wait_gone(pid: int, *, timeout_s: float, what: str) -> None:
    """Wait until process ``pid`` has exited.

    Raises:
        AssertionError: it still runs after ``timeout_s``; ``what`` names it.
    """
    wait_until(lambda: process_gone(pid), timeout_s=timeout_s, interval_s=0.02,
               message=f"{what} (pid {pid}) to exit")


def kill_process(pid: int, *, parent: int | None, signum: int = signal.SIGKILL) -> bool:
    """Send ``signum`` to ``pid`` if it is still the process meant; return whether it was sent.

    Args:
        pid: The process.
        parent: The PID of its parent (a process this test started), checked after the
            process is pinned; ``None`` for a child of this process (``subprocess.Popen``
            keeps its PID until it is reaped, so no other process can have it).
        signum: The signal.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if parent is not None:
            fields = _stat_fields(pid)
            # A newcomer that got the PID after the pidfd was opened may be read here: then
            # the pidfd's process has exited, and the signal below reaches no one.
            if fields is None or fields[0] in _EXITED_STATES or int(fields[1]) != parent:
                return False
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except ProcessLookupError:
            return False
        return True
    finally:
        os.close(pidfd)


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first, then the
    parent's PID), or ``None`` when there is no such process.

    One read: no check that the file exists first (the process may vanish in between), and
    either error a vanishing process gives (the file gone, or ESRCH on reading it) is "none".
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it.
    return stat.rpartition(b")")[2].split()
