"""Waiting on and signalling the processes tests start (tests.support.processes).

CI of ff5344a failed in tests/cluster/test_failover.py with ``ProcessLookupError``: the
check whether a killed node had exited saw ``/proc/PID/stat`` exist, and the node was reaped
before the file was read. These tests make a process exit at each step of such a check.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import kill_process, process_gone


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child process that runs until it is killed; reaped at the end."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait(10)


class _Looks:
    """Counts the looks at one process and makes it exit (killed and reaped) just before
    the ``exit_before``-th one; ``exited`` says whether it did."""

    def __init__(self, process: subprocess.Popen[bytes], exit_before: int) -> None:
        self.process = process
        self.exit_before = exit_before
        self.count = 0
        self.exited = False
        self._inside = False

    def wrap(self, real: Callable[..., Any], concerns: Callable[..., bool]) -> Callable[..., Any]:
        """``real``, counted as a look when ``concerns(*args)``; a look made inside another
        (``read_text`` opens the file) is the same look."""

        def look(*args: Any, **kwargs: Any) -> Any:
            if self._inside or not concerns(*args):
                return real(*args, **kwargs)
            self.count += 1
            if self.count == self.exit_before:
                self.process.kill()
                self.process.wait(10)  # reaped: /proc/PID is gone
                self.exited = True
            self._inside = True
            try:
                return real(*args, **kwargs)
            finally:
                self._inside = False

        return look


@contextmanager
def exits_before_look(
    process: subprocess.Popen[bytes], n: int, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_Looks]:
    """While active, ``process`` exits just before the ``n``-th look at it: a signal-0
    probe, a pidfd opened or signalled, or a look at a file under ``/proc/PID``."""
    looks = _Looks(process, n)
    pid, proc_dir = process.pid, f"/proc/{process.pid}/"
    with monkeypatch.context() as patch:
        patch.setattr(os, "kill", looks.wrap(os.kill, lambda p, s: p == pid and s == 0))
        patch.setattr(os, "pidfd_open", looks.wrap(os.pidfd_open, lambda p, *a: p == pid))
        patch.setattr(signal, "pidfd_send_signal",
                      looks.wrap(signal.pidfd_send_signal, lambda *a: True))
        for name in ("exists", "is_file", "read_text", "read_bytes", "open"):
            patch.setattr(Path, name, looks.wrap(getattr(Path, name),
                                                 lambda path, *a: str(path).startswith(proc_dir)))
        yield looks


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_a_process_that_exits_at_any_step_of_the_check_is_gone_never_an_error(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    # main: exiting between "does /proc/PID/stat exist?" and reading it raised
    # FileNotFoundError (ProcessLookupError in CI, when it vanished while being read)
    with exits_before_look(sleeper, n, monkeypatch) as looks:
        gone = process_gone(sleeper.pid)

    # Gone once it has exited; still there if the check was over before it exited
    assert gone is looks.exited


def test_a_zombie_not_yet_reaped_counts_as_gone(sleeper: subprocess.Popen[bytes]) -> None:
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped

    assert process_gone(sleeper.pid)


def test_a_running_process_is_not_gone(sleeper: subprocess.Popen[bytes]) -> None:
    assert not process_gone(sleeper.pid)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_process_that_exits_at_any_step_of_a_kill_is_not_signalled(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    # Given a kill that pins the process, checks its parent and signals it: three steps
    with exits_before_look(sleeper, n, monkeypatch) as looks:
        sent = kill_process(sleeper.pid, parent=os.getpid(), signum=signal.SIGTERM)

    # Then it reports the signal sent only to a process that was there to get it
    assert looks.exited
    assert sent is False


def test_a_process_is_signalled_only_while_it_is_the_child_meant(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert kill_process(sleeper.pid, parent=sleeper.pid) is False  # not the parent named
    assert sleeper.poll() is None

    assert kill_process(sleeper.pid, parent=os.getpid()) is True
    assert sleeper.wait(10) == -signal.SIGKILL

    # reaped: its PID is free for any newcomer, which is never signalled
    assert kill_process(sleeper.pid, parent=os.getpid()) is False
