"""Signals to and from worker processes: names for any signal a child died of, and sending.

The supervisor signals only the PIDs of the processes it started.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

# Longest wait for a process SIGKILLed for its time limit to be gone (a process blocked in
# the kernel dies when it gets back from it, and cannot touch its slot before).
KILL_WAIT_S = 1.0


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, ``SIGRTMIN+3`` for a real-time signal, the number otherwise.

    ``signal.Signals`` knows no real-time signal but the first and last: asking it for the
    name of any signal a child died of would raise ``ValueError`` in the watch loop.
    """
    try:
        return signal.Signals(signum).name
    except ValueError:
        pass
    rt_min, rt_max = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1)
    if rt_min < signum <= rt_max:
        return f"SIGRTMIN+{signum - rt_min}"
    return str(signum)


def kill_and_wait(process: BaseProcess) -> None:
    """SIGKILL ``process`` and wait (briefly) until it is gone.

    Called holding the process's slot lock: until the kernel has ended the process, one of
    its threads already on a CPU could otherwise still take the lock once it is released.
    """
    if process.pid is not None:
        send_signal(process.pid, signal.SIGKILL)
        multiprocessing.connection.wait([process.sentinel], timeout=KILL_WAIT_S)


def send_signal(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid``; a process that already exited is not an error."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # exited meanwhile; the watch loop reaps it
