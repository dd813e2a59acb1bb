"""A process the supervisor runs beside the worker processes (the relay, the scheduler).

It is started with the startup signals blocked, watched through its sentinel, restarted when
it dies (after a pause if it died young), left down when it exits ``EXIT_FATAL`` (its
configuration cannot work: the workers go on without it), asked to stop with SIGTERM and
killed with SIGKILL at the end.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from taskq.worker.process import (
    EXIT_FATAL,
    STARTUP_BLOCKED_SIGNALS,
    ChildSpec,
    _die_with_parent,
    configure_logging,
    load_spec_app,
)

logger = logging.getLogger(__name__)

#: A side process that dies younger than this waits this long before it is started again.
RESTART_PAUSE_S = 1.0


def run_side_process(
    spec: ChildSpec, run: Callable[[Any, Callable[[], bool]], int], label: str
) -> None:
    """Body of a side process: load the app, ``run(app, should_stop)``, exit with its code.

    SIGTERM asks ``run`` to stop after its current step; the process also stops when its
    supervisor is gone (its parent pid changed), and Linux sends it SIGTERM then too.
    """
    configure_logging(spec.loglevel, spec.log_format)
    _die_with_parent(spec.supervisor_pid)
    stop = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    def should_stop() -> bool:
        if not stop and spec.supervisor_pid and os.getppid() != spec.supervisor_pid:
            logger.warning("the supervisor process is gone; stopping the %s", label)
            return True
        return stop

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STARTUP_BLOCKED_SIGNALS)
    sys.exit(run(load_spec_app(spec), should_stop))


class SupervisedProcess:
    """Starts, watches and restarts one side process for the supervisor.

    Args:
        context: The multiprocessing context of the supervisor.
        spec: What the process needs to load the app.
        target: The process's entry point, called with ``spec``.
        name: The process name (``relay``, ``beat``).
        label: What the logs call it (``outbox relay``, ``scheduler``).
    """

    def __init__(self, context: Any, spec: ChildSpec, *, target: Callable[[ChildSpec], None],
                 name: str, label: str) -> None:
        self._context = context
        self._spec = spec
        self._target = target
        self.name = name
        self.label = label
        self.process: BaseProcess | None = None
        self._started_at = 0.0
        self._restart_at = 0.0

    @property
    def sentinel(self) -> int | None:
        """What the supervisor waits on, or ``None`` when no process runs."""
        return self.process.sentinel if self.process is not None else None

    def start(self) -> None:
        """Start the process (signals blocked until its handlers are installed)."""
        process = self._context.Process(target=self._target, args=(self._spec,), name=self.name)
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STARTUP_BLOCKED_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        self.process, self._started_at = process, time.monotonic()
        logger.info("started %s process (pid %d)", self.label, process.pid)

    def check(self, now: float, *, stopping: bool) -> None:
        """Reap an exited process and restart it unless shutting down or misconfigured."""
        process = self.process
        if process is None:
            if self._restart_at and now >= self._restart_at and not stopping:
                self._restart_at = 0.0
                self.start()
            return
        if process.exitcode is None:
            return
        code = process.exitcode
        process.join()
        process.close()
        self.process = None
        if stopping:
            return
        if code == EXIT_FATAL:
            logger.error("%s cannot run (see above); the workers go on without it", self.label)
            return
        logger.error("%s process died (exit %s); restarting it", self.label, code)
        quick = now - self._started_at < RESTART_PAUSE_S
        self._restart_at = now + (RESTART_PAUSE_S if quick else 0.0)

    def terminate(self) -> None:
        """Ask the process to stop after its current step (a batch, a tick)."""
        if self.process is not None and self.process.pid is not None:
            _signal(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        """Stop the process at once (its open transaction rolls back; nothing is lost)."""
        process = self.process
        if process is not None and process.exitcode is None and process.pid is not None:
            _signal(process.pid, signal.SIGKILL)
        if process is not None:
            process.join(5)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
