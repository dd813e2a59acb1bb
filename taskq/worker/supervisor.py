"""The supervisor: the parent of ``taskq worker``; starts, watches and replaces processes.

It declares the topology once (then closes that connection, so no child could inherit it),
starts N worker processes with the *spawn* method and watches them every 100 ms:

* a process that died is replaced at once (after a 1 s pause if it died within a second of
  starting, so a broken environment does not spin); if it held a message, the death is
  written to the :class:`~taskq.worker.deaths.DeathLedger` so that the redelivered message
  is dead-lettered after ``max_process_deaths`` deaths instead of looping;
* a process past its task's hard ``time_limit_s`` is killed (SIGKILL), recorded the same way
  with reason ``TimeLimitExceeded``, and replaced;
* a process that holds no delivery and whose broker consumer has shown no progress for a
  while (:func:`~taskq.worker.monitoring.stalled_after_s`: its consumer thread stopped, or
  the process is frozen) is killed and replaced, never left alive consuming nothing;
* a process that exits 0 after ``max_tasks_per_child`` tasks is recycled, not counted as dead.

Signal handlers only set flags. First SIGTERM or SIGINT: warm shutdown -- SIGTERM to every
process, which finishes its task in hand, acks it and exits 0. A second signal (at least a
second after the first: a signal sent to the whole process group arrives twice at once), or
``shutdown_timeout_s`` passing, SIGKILLs what is left: their unacked messages return to the
queue. Exit status: 0 after a warm shutdown, 1 when processes had to be killed, 78 when a
process reported a configuration error.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from dataclasses import dataclass, replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from taskq.broker.connection import declare, open_connection
from taskq.settings import redact_url
from taskq.worker.deaths import DeathLedger
from taskq.worker.monitoring import (
    HEALTH_STALE_S,
    Monitoring,
    SupervisorMonitor,
    stalled_after_s,
)
from taskq.worker.preflight import ensure_idempotency_table, warn_about_long_time_limits
from taskq.worker.process import (
    EXIT_FATAL,
    STARTUP_BLOCKED_SIGNALS,
    ChildSpec,
    child_main,
)
from taskq.worker.relay_process import RelayProcess
from taskq.worker.signals import kill_and_wait, send_signal, signal_name
from taskq.worker.time_limits import Slot, SlotState, describe_key

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from taskq.app import App

logger = logging.getLogger(__name__)

EXIT_FORCED = 1
# A repeated signal this soon after the first is the same request delivered twice (to the
# process and to its group), not a second Ctrl-C.
DUPLICATE_SIGNAL_WINDOW_S = 1.0
# How often the watch loop wakes up when no process exits.
_WATCH_INTERVAL_S = 0.1
# A process that dies sooner than this after starting is restarted only after this long.
_MIN_LIFETIME_S = 1.0


@dataclass
class _Child:
    """One worker process position: its current process and shared slot."""

    index: int
    slot: Slot
    process: BaseProcess | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    # The slot state the supervisor killed the process in, for a hard time limit.
    killed: SlotState | None = None


class Supervisor:
    """Runs and watches the worker processes of one ``taskq worker`` command.

    Args:
        app: The app, already configured with the command-line overrides.
        app_path: ``module:app`` the children import the app from.
        queues: Work queues to consume.
        overrides: The command-line settings, applied again in each child.
        loglevel: Logging level name for the children.
        relay: Also run the outbox relay as a supervised process.
        monitoring: Metrics port and health file, when asked for.
        log_format: ``text`` or ``json`` log lines in the processes.
        beat: Also run the scheduler of periodic tasks as a supervised process.
    """

    def __init__(
        self,
        app: App,
        *,
        app_path: str,
        queues: tuple[str, ...],
        overrides: dict[str, Any],
        loglevel: str = "INFO",
        relay: bool = False,
        monitoring: Monitoring | None = None,
        log_format: str = "text",
        beat: bool = False,
    ) -> None:
        self.app = app
        self.settings = app.settings
        self.queues = queues
        self._context = multiprocessing.get_context("spawn")
        self._spec = ChildSpec(
            app_path=app_path,
            overrides=dict(overrides),
            queues=queues,
            loglevel=loglevel,
            supervisor_pid=os.getpid(),
            log_format=log_format,
        )
        self._children: list[_Child] = []
        self._relay = RelayProcess(self._context, self._spec) if relay else None
        # Supervised beside the worker processes: started, watched, restarted, stopped alike.
        self._side_processes: list[Any] = [
            p for p in (self._relay, _beat_process(self._context, self._spec) if beat else None)
            if p is not None
        ]
        self._monitoring = monitoring or Monitoring()
        self._monitor = SupervisorMonitor(self._monitoring, self.healthy)
        self._restarts = 0
        self._ledger: DeathLedger | None = None
        self._signals: list[tuple[int, float]] = []
        self._first_signal_at = 0.0
        self._stopping_at = 0.0
        self._forced = False
        self._killed_running = False
        self._fatal = False
        self._stalled_after_s = stalled_after_s(self.settings)

    @property
    def process_count(self) -> int:
        """How many worker processes run (``worker_processes``; 0 means one per CPU)."""
        return self.settings.worker_processes or os.cpu_count() or 1

    def run(self) -> int:
        """Declare, start the processes, watch them until shut down; return the exit status.

        Raises:
            TopologyError: a queue or exchange exists with other arguments.
            BrokerConnectionError: the broker cannot be reached at start.
            ConfigurationError: ``delay_backend='plugin'`` and the broker lacks the plugin.
        """
        self._declare_topology()
        warn_about_long_time_limits(self.app, self.queues)  # after a connect: the broker known
        ensure_idempotency_table(self.app)
        ledger = self._ledger = DeathLedger.create()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STARTUP_BLOCKED_SIGNALS}
        try:
            logger.info(
                "taskq worker for app %s: %d process%s consuming %s from %s (prefetch %d)",
                self.app.name, self.process_count, "" if self.process_count == 1 else "es",
                ", ".join(self.queues),
                redact_url(self.settings.broker_url), self.settings.prefetch_count,
            )
            self._children = [
                _Child(index, Slot(self._context)) for index in range(1, self.process_count + 1)
            ]
            self._monitor.start_metrics(
                alive=self.alive, restarts=lambda: self._restarts,
                backlog=self.app.outbox_backlog if self._relay is not None else None,
            )
            for sidecar in self._monitoring.sidecars:
                sidecar.start(self)
            for child in self._children:
                self._start(child)
            for side in self._side_processes:
                side.start()
            return self._watch()
        finally:
            self._kill_all()
            self._monitor.stop()
            for sidecar in self._monitoring.sidecars:
                sidecar.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            ledger.remove()

    # -- start-up --------------------------------------------------------------------------

    def _declare_topology(self) -> None:
        topology = self.app.topology
        connection = open_connection(
            self.settings, client_name="taskq supervisor", broker=topology.broker
        )
        try:
            # With the plugin, Q is bound to the delayed exchange wherever it is declared.
            delayed = self._hand_on_delay_backend() == "plugin"
            channel = declare(connection.channel(), topology.base())
            for queue in self.queues:
                channel = declare(channel, topology.for_queue(queue, delayed=delayed))
        finally:
            # Closed before any child starts: children open their own connections.
            if connection.is_open:
                connection.close()

    def _hand_on_delay_backend(self) -> str:
        """Choose the delay backend once here; children take it instead of probing again."""
        kind = self.app.delay_backend_name
        self._spec = replace(self._spec, delay_backend=kind)
        if self._relay is not None:
            self._relay = RelayProcess(self._context, self._spec)
        return kind

    def _start(self, child: _Child) -> None:
        child.slot.clear()
        child.killed = None
        spec = replace(
            self._spec, index=child.index, process_count=self.process_count,
            state_dir=self._ledger_dir(),
        )
        process = self._context.Process(
            target=child_main,
            args=(spec, [c.slot for c in self._children]),
            name=f"worker-{child.index}",
        )
        # Blocked signals are inherited through fork and exec: the child unblocks them once
        # its own handlers are installed, so a Ctrl-C during its start-up is not a traceback.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STARTUP_BLOCKED_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        child.process, child.started_at = process, time.monotonic()
        logger.info("started worker process %d (pid %d)", child.index, process.pid)

    def _ledger_dir(self) -> str:
        return self._ledger.directory if self._ledger else ""

    # -- watching ----------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append((signum, time.monotonic()))

    def _watch(self) -> int:
        handled_signals = 0
        while True:
            while len(self._signals) > handled_signals:
                self._on_shutdown_signal(*self._signals[handled_signals])
                handled_signals += 1
            alive = [c.process.sentinel for c in self._children if c.process is not None]
            alive += [p.sentinel for p in self._side_processes if p.sentinel is not None]
            if not alive and self._stopping_at:
                break
            multiprocessing.connection.wait(alive, timeout=_WATCH_INTERVAL_S)
            now = time.monotonic()
            for child in self._children:
                self._check(child, now)
            self._monitor.touch_health_file(now)
            for side in self._side_processes:
                side.check(now, stopping=bool(self._stopping_at))
            if self._stopping_at and now >= self._stopping_at and not self._forced:
                logger.error(
                    "shutdown timeout (%gs) passed with tasks still running; killing them",
                    self.settings.shutdown_timeout_s,
                )
                self._force()
        logger.info("all worker processes stopped")
        if self._fatal:
            return EXIT_FATAL
        return EXIT_FORCED if self._killed_running else 0

    def _on_shutdown_signal(self, signum: int, received_at: float) -> None:
        name = signal.Signals(signum).name
        if not self._first_signal_at:
            self._first_signal_at = received_at
            self._begin_shutdown(f"{name} received")
        elif received_at - self._first_signal_at < DUPLICATE_SIGNAL_WINDOW_S:
            # `timeout`, `kill -- -PGID` and systemd's control-group kill signal the whole
            # group at once: the same request arrives twice. It is not a second request.
            logger.debug("%s received again within %gs: same request", name,
                         DUPLICATE_SIGNAL_WINDOW_S)
        elif not self._forced:
            logger.warning("%s received again: killing worker processes now", name)
            self._force()

    def _begin_shutdown(self, reason: str) -> None:
        if self._stopping_at:
            return
        logger.info(
            "%s: warm shutdown, waiting up to %gs for running tasks",
            reason, self.settings.shutdown_timeout_s,
        )
        self._stopping_at = time.monotonic() + self.settings.shutdown_timeout_s
        for child in self._children:
            child.restart_at = 0.0
            if child.process is not None and child.process.pid is not None:
                send_signal(child.process.pid, signal.SIGTERM)
        for side in self._side_processes:
            side.terminate()

    def _force(self) -> None:
        self._forced = True
        if not self._stopping_at:
            self._stopping_at = time.monotonic()
        self._killed_running = self._kill_all()

    def _check(self, child: _Child, now: float) -> None:
        process = child.process
        if process is None:
            if child.restart_at and now >= child.restart_at and not self._stopping_at:
                self._start(child)
            return
        if process.exitcode is not None:
            process.join()
            self._on_exit(child, process, now)
            return
        if child.killed is None:
            self._kill_if_overdue(child, process, now)
        if child.killed is None and not self._stopping_at:
            self._kill_if_stalled(child, process, now)

    def _kill_if_stalled(self, child: _Child, process: BaseProcess, now: float) -> None:
        """Replace a process that holds no delivery and whose consumer shows no progress.

        Its consumer stopped (its I/O thread is gone or stuck) or the whole process is
        frozen: alive, it would consume nothing, and the broker may have handed its
        partitions to nobody else (a single-active-consumer queue keeps a registered
        consumer active while its connection lives).
        """
        if process.pid is None or not child.slot.is_stalled(now, self._stalled_after_s):
            return
        logger.error(
            "worker process %d (pid %d) has consumed nothing and shown no progress of its "
            "broker consumer for over %.0fs (its consumer thread stopped or the process is "
            "frozen); killing it so that it is replaced", child.index, process.pid,
            self._stalled_after_s,
        )
        kill_and_wait(process)

    def _kill_if_overdue(self, child: _Child, process: BaseProcess, now: float) -> None:
        pid = process.pid
        if pid is None:
            return
        # Decided and sent under the slot's lock: the process cannot end this run (and queue
        # its ack) or start the next delivery's between the check and the SIGKILL.
        killed = child.slot.kill_if_overdue(now, lambda state: kill_and_wait(process))
        if killed is None:
            return
        child.killed = killed
        why = ("whose delivery the broker took back after %.0fs (consumer timeout)"
               if killed.by_broker else "past its hard time limit of %gs")
        logger.error("worker process %d (pid %d) ran message %s " + why + "; killed it",
                     child.index, pid, describe_key(killed.key), killed.time_limit_s)

    def _on_exit(self, child: _Child, process: BaseProcess, now: float) -> None:
        pid, code = process.pid or 0, process.exitcode or 0
        process.close()
        child.process = None
        state = child.slot.state()  # final: its only writer is dead
        if code == EXIT_FATAL:
            logger.error("worker process %d cannot run (configuration); stopping", child.index)
            self._fatal = True
            self._begin_shutdown("configuration error")
        elif self._forced or (code == 0 and state is not None and not state.key):
            if not self._stopping_at:
                logger.info("worker process %d (pid %d) recycled", child.index, pid)
                child.restart_at = now
        else:
            self._record_death(child, pid, code, state)
            if not self._stopping_at:
                quick = now - child.started_at < _MIN_LIFETIME_S
                child.restart_at = now + (_MIN_LIFETIME_S if quick else 0.0)
        # Cleared only once the death is in the ledger: a process that gets the message
        # redelivered waits while a sibling's slot still holds it (see loop.py).
        child.slot.clear()

    # -- monitoring ----------------------------------------------------------------------------

    def healthy(self, now: float | None = None) -> bool:
        """Every worker process runs and consumes (or is busy with a task); not stopping."""
        now = time.monotonic() if now is None else now
        if self._stopping_at or not self._children:
            return False
        return all(
            child.process is not None and child.slot.is_healthy(now, HEALTH_STALE_S)
            for child in self._children
        )

    @property
    def restarts(self) -> int:
        """Worker processes replaced after dying since :meth:`run` began."""
        return self._restarts

    def alive(self) -> int:
        """How many worker processes run now."""
        return sum(1 for child in self._children if child.process is not None)

    def _record_death(
        self, child: _Child, pid: int, code: int, state: SlotState | None
    ) -> None:
        self._restarts += 1
        self._monitor.process_died(pid)
        how = f"signal {signal_name(-code)}" if code < 0 else f"exit code {code}"
        if state is None or not state.key:
            torn = " while writing its slot" if state is None else ""
            logger.error(
                "worker process %d (pid %d) died (%s)%s; replacing it", child.index, pid, how,
                torn,
            )
            return
        time_limit_s, by_broker = None, False
        if child.killed is not None and child.killed.version == state.version:
            time_limit_s, by_broker = child.killed.time_limit_s, child.killed.by_broker
        deaths = 1
        if self._ledger is not None:
            deaths = self._ledger.record_death(
                state.key, time_limit_s=time_limit_s, by_broker=by_broker).deaths
        logger.error(
            "worker process %d (pid %d) died (%s) while running message %s (death %d, "
            "max_process_deaths=%d); replacing it; the broker redelivers the message",
            child.index, pid, how, describe_key(state.key), deaths,
            self.settings.max_process_deaths,
        )

    def _kill_all(self) -> bool:
        """SIGKILL every live worker process; return whether there was any."""
        killed = False
        for child in self._children:
            process = child.process
            if process is not None and process.exitcode is None and process.pid is not None:
                send_signal(process.pid, signal.SIGKILL)
                killed = True
        for child in self._children:
            if child.process is not None:
                child.process.join(5)
        for side in self._side_processes:
            side.kill()
        return killed


def _beat_process(context: Any, spec: ChildSpec) -> Any:
    # Imported here: taskq.schedules.beat_process imports taskq.worker.process, whose package
    # (taskq.worker) imports this module.
    from taskq.schedules.beat_process import BeatProcess

    return BeatProcess(context, spec)
