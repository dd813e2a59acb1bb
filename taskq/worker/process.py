"""A worker process: imports the app itself, opens its own connections, runs the loop.

Worker processes are started with the multiprocessing *spawn* method: each is a fresh
interpreter that imports the app from the same ``module:app`` string as the supervisor and
applies the same command-line overrides, so no socket, lock or thread of the parent is ever
inherited.

Signals: SIGINT is ignored (Ctrl-C reaches the whole process group; the supervisor decides
and forwards SIGTERM). The first SIGTERM is a warm stop: stop consuming, finish the task in
hand, ack it, close. A second SIGTERM (a second or more later) exits at once; unacked messages
return to the queue.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from taskq.errors import ConfigurationError, TaskqError, TopologyError

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.worker.time_limits import Slot

logger = logging.getLogger(__name__)

# Exit codes of a worker process, read by the supervisor.
EXIT_OK = 0
# The app cannot be loaded or the topology conflicts: restarting cannot help.
EXIT_FATAL = 78  # EX_CONFIG
# An unexpected error outside any one delivery: the supervisor replaces the process.
EXIT_FAILED = 1
# Second SIGTERM: left without finishing the task in hand.
EXIT_TERMINATED = 128 + signal.SIGTERM

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(processName)s[%(process)d] %(name)s: %(message)s"
# Signals the supervisor blocks while starting a process; the child unblocks them once its
# handlers are in place, so an early SIGTERM is delivered late rather than lost or fatal.
STARTUP_BLOCKED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
_PR_SET_PDEATHSIG = 1
# A SIGTERM sooner than this after the first is the same request arriving twice: once sent
# to the whole process group (`timeout`, systemd) and once forwarded by the supervisor.
_DUPLICATE_SIGNAL_WINDOW_S = 1.0


@dataclass(frozen=True)
class ChildSpec:
    """Everything a worker process needs to build itself (pickled to the child).

    Args:
        app_path: ``module:attribute`` of the App.
        overrides: Settings given on the command line (they win over everything else).
        queues: Work queues to consume.
        index: Position of the process in the supervisor (1-based), for names and logs.
        process_count: Processes of the supervisor (spreads ordered queues' partitions).
        state_dir: The supervisor's death ledger directory.
        loglevel: Logging level name.
        log_format: ``text`` or ``json``.
        supervisor_pid: The parent, to notice when it is gone.
        delay_backend: The delay backend the supervisor chose (``plugin`` or ``tiers``;
            empty: choose in the process), taken instead of probing the broker again.
    """

    app_path: str
    overrides: dict[str, Any] = field(default_factory=dict)
    queues: tuple[str, ...] = ()
    index: int = 1
    process_count: int = 1
    state_dir: str = ""
    loglevel: str = "INFO"
    supervisor_pid: int = 0
    log_format: str = "text"
    delay_backend: str = ""


def load_app(path: str) -> App:
    """Import ``module:attribute`` (``module`` alone means ``module:app``) and return the App.

    The attribute may also be an object with a ``taskq_app`` attribute, such as the Flask
    extension ``taskq.contrib.flask.TaskQ``.

    Raises:
        ConfigurationError: the module cannot be imported or the attribute is not an App;
            the message names the Apps the module has, or the dotted form of a file path.
    """
    module_name, _, attribute = path.partition(":")
    attribute = attribute or "app"
    if not module_name:
        raise ConfigurationError(f"-A {path!r}: expected module:app, e.g. -A myproject.tasks:app")
    dotted = _dotted_module(module_name)
    if dotted is not None:
        raise ConfigurationError(
            f"-A {path!r} names a file; -A takes the module's dotted name, as import would: "
            f"-A {dotted}:{attribute}"
        )
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import module {module_name!r} given with -A {path!r}: {exc}; "
            "is it on PYTHONPATH (run from the project directory)?"
        ) from exc
    except Exception as exc:  # the user's module raised while being imported
        raise ConfigurationError(
            f"importing module {module_name!r} given with -A {path!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigurationError(
                f"-A {path!r}: module {module_name} has no attribute {attribute!r}; "
                + _apps_hint(module, module_name)
            )
        target = getattr(target, part)
    target = _unwrap(target)
    if not _is_app(target):
        raise ConfigurationError(
            f"-A {path!r}: {module_name}.{attribute} is a {type(target).__name__}, not a "
            "taskq.App; " + _apps_hint(module, module_name)
        )
    app: App = target
    return app


def _is_app(value: Any) -> bool:
    from taskq.app import App

    return isinstance(value, App)


def _unwrap(value: Any) -> Any:
    # Framework integrations (taskq.contrib.flask.TaskQ) wrap an App and expose it.
    return getattr(value, "taskq_app", value)


def _apps_hint(module: Any, module_name: str) -> str:
    """Which Apps ``module`` holds, as the ``-A`` values that name them."""
    names = sorted(name for name, value in vars(module).items()
                   if not name.startswith("__") and _is_app(_unwrap(value)))
    if not names:
        return ("the module defines no taskq.App at its top level; point -A at the module "
                "that creates it (app = taskq.App(...)), as module:attribute")
    given = " or ".join(f"-A {module_name}:{name}" for name in names)
    return f"it defines {'a taskq.App' if len(names) == 1 else 'taskq.Apps'}: give {given}"


def _dotted_module(module_name: str) -> str | None:
    """The dotted module name of a file path given to -A (``pkg/tasks.py``), else ``None``."""
    if "/" not in module_name and not (module_name.endswith(".py")
                                       and os.path.isfile(module_name)):
        return None
    text = module_name[: -len(".py")] if module_name.endswith(".py") else module_name
    if os.path.isabs(text):
        try:
            text = os.path.relpath(text)
        except ValueError:
            return None
    parts = [part for part in text.replace(os.sep, "/").split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return ".".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; task event lines carry their structured fields."""

    FIELDS = ("task_id", "task", "queue", "attempt", "duration_s")

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as JSON (message, level, process and task fields)."""
        data: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for name in self.FIELDS:
            if hasattr(record, name):
                data[name] = getattr(record, name)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(loglevel: str, log_format: str = "text") -> None:
    """Log to stderr with process name and pid, at ``loglevel``, as text or JSON lines."""
    logging.basicConfig(level=loglevel.upper(), format=LOG_FORMAT, force=True)
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    # pika logs every connection hiccup at ERROR, with tracebacks; taskq reports each one
    # once in its own words, so pika's own account is kept for debugging sessions.
    debugging = loglevel.upper() == "DEBUG"
    logging.getLogger("pika").setLevel(logging.WARNING if debugging else logging.CRITICAL)


def child_main(spec: ChildSpec, slots: list[Slot]) -> None:
    """Entry point of a worker process; exits with one of the ``EXIT_*`` codes.

    Args:
        spec: What to run.
        slots: The slots of every worker process position; ``slots[spec.index - 1]`` is
            this process's own.
    """
    configure_logging(spec.loglevel, spec.log_format)
    _die_with_parent(spec.supervisor_pid)
    sys.exit(_serve(load_spec_app(spec), spec, slots))


def load_spec_app(spec: ChildSpec) -> App:
    """Import the app named by ``spec`` and apply its overrides; exit ``EXIT_FATAL`` if not.

    Restarting cannot fix an app that does not import or does not configure, so the
    supervisor stops instead of replacing the process.
    """
    try:
        app = load_app(spec.app_path)
        app.configure(**spec.overrides)
        if spec.delay_backend:
            app.adopt_delay_backend(spec.delay_backend)
    except TaskqError as exc:
        logger.error("%s", exc)
        sys.exit(EXIT_FATAL)
    return app


def _serve(app: App, spec: ChildSpec, slots: list[Slot]) -> int:
    from taskq.broker.subscription import Subscription
    from taskq.ordering.spread import STANDBY_DELAY_S, consume_order
    from taskq.worker.consumer_timeout import consumer_timeout_for
    from taskq.worker.deaths import DeathLedger
    from taskq.worker.loop import WorkerLoop
    from taskq.worker.time_limits import SoftTimeLimit

    order = consume_order(
        app.topology, spec.queues, index=spec.index, process_count=spec.process_count
    )
    subscription = Subscription(
        app.settings, app.topology, order.first, client_name=f"taskq worker {spec.index}",
        delay_backend=lambda: app.delay_backend_name,
        standby=order.standby, standby_delay_s=STANDBY_DELAY_S,
        consumer_timeout_s=consumer_timeout_for(app, spec.queues),
    )
    observers = _observers(app)
    loop = WorkerLoop(
        app,
        subscription,
        slot=slots[spec.index - 1],
        sibling_slots=[slot for i, slot in enumerate(slots, 1) if i != spec.index],
        ledger=DeathLedger(spec.state_dir),
        soft_limit=SoftTimeLimit(),
        observers=observers,
    )
    subscription.cancels.on_timed_out = loop.run_in_hand.on_timed_out
    _install_signal_handlers(loop)
    code = EXIT_OK
    subscription.start()
    try:
        loop.run()
    except (TopologyError, ConfigurationError) as exc:
        logger.error("%s", exc)
        code = EXIT_FATAL
    except Exception:
        # The loop contains what goes wrong with one delivery; this is the consumer itself
        # (e.g. its I/O thread failed). Closing returns every unacked message to the queue.
        logger.exception(
            "worker process %d failed; exiting so that the supervisor replaces it (its "
            "unacked messages return to the queue)", spec.index,
        )
        code = EXIT_FAILED
    finally:
        subscription.stop_consuming()
        subscription.close()
        observers.close()  # the task states gathered since the last write
        app.close()
    logger.debug("worker process %d exiting after %d tasks", spec.index, loop.tasks_done)
    return code


def _observers(app: App) -> Any:
    """Task states, result recording and metrics, each only when asked for."""
    from taskq.worker import metrics
    from taskq.worker.events import Observers
    from taskq.worker.observers import MetricsObserver, ResultRecorder, wants_results
    from taskq.worker.state_recorder import StateRecorder

    observers = Observers()
    if app.settings.track_task_states:
        observers.add(StateRecorder(app))
    if wants_results(app):
        observers.add(ResultRecorder(app))
    if metrics.is_enabled():
        observers.add(MetricsObserver())
    return observers


def _install_signal_handlers(loop: Any) -> None:
    first_at = 0.0

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal first_at
        now = time.monotonic()
        if not first_at:
            first_at = now
            loop.request_stop()
        elif now - first_at >= _DUPLICATE_SIGNAL_WINDOW_S:
            # Second signal: leave now; the broker requeues whatever we held unacked.
            os._exit(EXIT_TERMINATED)
        # else: the same request twice (sent to our group, then forwarded by the supervisor)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STARTUP_BLOCKED_SIGNALS)


def _die_with_parent(supervisor_pid: int) -> None:
    """Ask Linux for SIGTERM when the supervisor dies (warm stop instead of an orphan)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable", exc_info=True)
        return
    if supervisor_pid and os.getppid() != supervisor_pid:
        os.kill(os.getpid(), signal.SIGTERM)  # it died before prctl took effect
