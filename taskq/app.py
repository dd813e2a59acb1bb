"""App: settings, the task registry, queue options and the publisher of one application.

Nothing happens at construction but validation: no connection is opened until the first
publish, and each process (a forked child included) opens its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from taskq.broker.connection import open_connection
from taskq.broker.publisher import Publisher
from taskq.broker.topology import QueueOptions, Topology, validate_queue_name
from taskq.broker.versions import BrokerFacts
from taskq.delay.backend import DelayBackend, DelayedMessage
from taskq.delay.maths import delay_ms_from_s, epoch_ms, eta_ms_of
from taskq.errors import BrokerConnectionError, ConfigurationError
from taskq.message import WireMessage, gc_paused
from taskq.registry import TaskRegistry
from taskq.results import AsyncResult
from taskq.road import Outgoing, Road
from taskq.schedules.definitions import PeriodicTask, Schedules
from taskq.sending import Sender
from taskq.settings import Settings
from taskq.task import Task, TaskOptions

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

_TASK_OPTIONS = frozenset(TaskOptions.__dataclass_fields__)


class App:
    """One taskq application: where tasks are registered and from where they are sent.

    Args:
        name: Application name; sent as the AMQP ``app_id``.
        broker_url: AMQP URL; defaults to ``TASKQ_BROKER_URL`` or the local broker.
        database_url: SQLAlchemy URL; defaults to ``TASKQ_DATABASE_URL`` or SQLite.
        **settings: Any :class:`~taskq.settings.Settings` field, e.g. ``prefetch_count=32``.

    Raises:
        ConfigurationError: an unknown setting or an invalid value.
    """

    def __init__(
        self,
        name: str,
        broker_url: str | None = None,
        database_url: str | None = None,
        **settings: Any,
    ) -> None:
        if not name or not isinstance(name, str):
            raise ConfigurationError("App needs a non-empty name, e.g. App('shop')")
        if len(name.encode()) > 255:
            raise ConfigurationError(
                f"App name {name[:60]!r}... is longer than 255 bytes; it travels as the AMQP "
                "app_id of every message (a short string): choose a shorter name"
            )
        self.name = name
        self.registry = TaskRegistry()
        #: The app's periodic tasks (``add_periodic_task``, ``@app.periodic``).
        self.schedules = Schedules(self)
        self._queues: dict[str, QueueOptions] = {}
        self._lock = threading.Lock()
        self._engine: Any = None
        self._engine_pid = 0
        self._store: Any = None
        self._results: Any = None
        #: Returns the session that ``delay()`` without ``session=`` should enqueue through
        #: (the outbox), or ``None`` to publish directly. Set by framework integrations.
        self.session_provider: Callable[[], Any] | None = None
        #: Context-manager factories entered around every task execution, outermost first
        #: (in the worker and in eager mode), e.g. a Flask application context. Set them
        #: before the worker starts. Set by framework integrations.
        self.task_context: list[Callable[[], AbstractContextManager[Any]]] = []
        self.settings = Settings.load(
            {"broker_url": broker_url, "database_url": database_url, **settings}
        )
        self._topology = self._build_topology()
        self._road = self._build_road()
        self._sender = Sender(self.settings, self._topology)

    def __repr__(self) -> str:
        return f"<App {self.name} namespace={self.settings.namespace}>"

    # -- configuration -------------------------------------------------------------------

    def configure(self, **changes: Any) -> None:
        """Apply setting changes (e.g. CLI flags, which win over everything else).

        The publisher and delay backends are dropped (and the delay backend chosen again)
        so that the next publish uses the new settings.
        """
        with self._lock:
            self.settings = self.settings.replace(**changes)
            self._topology = self._build_topology()
            self._road = self._build_road()
            self._sender.close()
            self._sender = Sender(self.settings, self._topology)

    @property
    def topology(self) -> Topology:
        """The broker objects this app declares (names and arguments)."""
        return self._topology

    @property
    def road(self) -> Road:
        """Where every new message of this app is built, checked and routed (:mod:`taskq.road`)."""
        return self._road

    def queue(
        self,
        name: str,
        *,
        type: str | None = None,  # noqa: A002 - mirrors x-queue-type
        max_priority: int | None = None,
        max_length: int | None = None,
        message_ttl_s: float | None = None,
        overflow: str | None = None,
        delivery_limit: int | None = None,
        partitions: int | None = None,
    ) -> QueueOptions:
        """Configure how the work queue ``name`` is declared.

        Call this before the first publish to or consume from the queue. Split lanes by
        giving critical work a quorum queue and background work a TTL and a max length.
        ``type`` defaults to the ``default_queue_type`` setting. Quorum queues take
        priorities on RabbitMQ 4.x only: on 3.x a priority raises ``ConfigurationError``
        (docs/rabbitmq.md).
        ``partitions=N`` makes an ordered queue: N partition queues with single active
        consumer; tasks of one ordering key run one at a time, in order (docs/ordering.md).

        Returns:
            The validated options.

        Raises:
            ConfigurationError: invalid name or options.
        """
        validate_queue_name(name)
        options = QueueOptions(
            type=type or self.settings.default_queue_type,  # type: ignore[arg-type]
            max_priority=max_priority,
            max_length=max_length,
            message_ttl_s=message_ttl_s,
            overflow=overflow,  # type: ignore[arg-type]
            delivery_limit=delivery_limit,
            partitions=partitions,
        )
        self._queues[name] = options
        return options

    def queue_names(self) -> list[str]:
        """Every work queue this app knows: configured ones, tasks' queues, the default."""
        names = set(self._queues)
        names.add(self.settings.default_queue)
        names.update(task.queue for task in self.registry)
        return sorted(names)

    # -- tasks -----------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, bind: Literal[True], name: str | None = None,
        **options: Any,
    ) -> Callable[[Callable[Concatenate[Any, P], R]], Task[P, R]]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, **options: Any
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(  # the overloads above carry the precise types (bind=True drops ``self``)
        self, fn: Callable[P, R] | None = None, /, *, name: str | None = None, **options: Any
    ) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(queue="emails")``.

        Args:
            fn: The function (when used without parentheses).
            name: Registered name; defaults to ``module.qualname`` of the function.
            **options: Any :class:`~taskq.task.TaskOptions` field: ``queue``, ``priority``,
                ``time_limit_s``, ``soft_time_limit_s``, ``idempotent``, ``transactional``;
                retries: ``max_retries``, ``retry_backoff`` and ``retry_backoff_max``
                (seconds), ``retry_jitter``, ``autoretry_for``, ``dont_autoretry_for``; and
                ``bind=True`` to receive the task as first argument (``self.request``,
                ``self.retry(...)``).

        Raises:
            ConfigurationError: an unknown or invalid option.
            DuplicateTaskName: another function is registered under the same name.
        """
        unknown = sorted(set(options) - _TASK_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown task option(s) {', '.join(unknown)}; "
                f"known options are: name, {', '.join(sorted(_TASK_OPTIONS))}"
            )
        task_options = TaskOptions(**options)
        if task_options.queue is not None:
            validate_queue_name(task_options.queue)

        def register(func: Callable[P, R]) -> Task[P, R]:
            if not callable(func):
                raise ConfigurationError(f"@app.task needs a function, got {func!r}")
            task_name = name or f"{func.__module__}.{func.__qualname__}"
            task: Task[P, R] = Task(self, func, name=task_name, options=task_options)
            self.registry.add(task)
            return task

        if fn is not None:
            return register(fn)
        return register

    def add_periodic_task(
        self, schedule: Any, task: Task[Any, Any] | str, *, name: str, args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None, queue: str | None = None,
        priority: int | None = None, missed: str = "once",
    ) -> PeriodicTask:
        """Run ``task`` on ``schedule`` (seconds, a ``timedelta`` or ``taskq.crontab(...)``),
        each tick enqueued once by ``taskq beat`` or ``taskq worker --beat``.

        ``name`` is unique per app; ``missed`` is ``"once"``, ``"skip"`` or ``"all"`` (what
        happens to ticks no scheduler fired, see docs/periodic.md).

        Raises:
            ConfigurationError: a bad schedule, cron string or time zone, an unknown task, a
                name already used, a bad queue, priority or policy (the message says which).
            SerializationError: ``args`` or ``kwargs`` cannot be encoded.
        """
        return self.schedules.add(schedule, task, name=name, args=args, kwargs=kwargs,
                                  queue=queue, priority=priority, missed=missed)

    def periodic(self, schedule: Any, *, name: str | None = None, **options: Any) -> Any:
        """``@app.periodic(schedule, name=...)`` above ``@app.task``: see
        :meth:`add_periodic_task` (``name`` defaults to the task's name)."""
        return self.schedules.decorator(schedule, name=name, **options)

    # -- publishing ------------------------------------------------------------------------

    @property
    def publisher(self) -> Publisher:
        """This process's publisher (created on first use; a new one after fork)."""
        return self._sender.publisher

    def send(self, outgoing: Outgoing) -> None:
        """Publish a message built by :attr:`road` now (or when due), with confirms.

        Raises:
            PublishError: the broker did not confirm the message.
        """
        envelope, wire, destination = outgoing.envelope, outgoing.wire, outgoing.destination
        if self.settings.task_always_eager:
            from taskq.eager import run

            run(self, wire, outgoing.queue)
            return
        if envelope.eta is not None:
            eta_ms = eta_ms_of(envelope.eta)
            if eta_ms > epoch_ms():
                self._sender.publish_delayed_many([DelayedMessage(wire, destination, eta_ms)])
                return
        self.publisher.publish(
            wire, exchange=self._topology.exchange, routing_key=destination, task=envelope.task
        )

    def send_many(self, outgoings: Sequence[Outgoing]) -> None:
        """Publish messages built by :attr:`road` with windowed confirms.

        Raises:
            PublishError: some messages were not confirmed; ``unconfirmed_ids`` lists them.
        """
        if self.settings.task_always_eager:
            from taskq.eager import run

            for outgoing in outgoings:
                run(self, outgoing.wire, outgoing.queue)
            return
        exchange = self._topology.exchange
        with gc_paused():
            items = [(exchange, o.destination, o.wire) for o in outgoings]
        self.publisher.publish_many(items)

    def publish_delayed(
        self, wire: WireMessage, *, queue: str, delay_s: float | timedelta
    ) -> None:
        """Publish an encoded message to be delivered to ``queue`` ``delay_s`` from now.

        Returns once the broker confirmed it; the broker holds it until it is due (the delay
        backend, see :mod:`taskq.delay`). ``x-death`` is dropped and ``taskq-eta`` set. A
        delay of 0 publishes to the queue at once. The worker's retry path uses this.

        Raises:
            ConfigurationError: a negative or too long delay (nothing is published).
            PublishError: the broker did not confirm the message.
            TopologyError: a queue or delay tier exists with other arguments.
        """
        if isinstance(delay_s, timedelta):
            delay_s = delay_s.total_seconds()
        if isinstance(delay_s, (int, float)) and not isinstance(delay_s, bool) and delay_s < 0:
            raise ConfigurationError(f"delay_s must be >= 0, not {delay_s!r}")
        eta_ms = epoch_ms() + delay_ms_from_s(delay_s)
        self.publish_delayed_many([DelayedMessage(wire, queue, eta_ms)])

    def publish_delayed_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Publish encoded messages each to be delivered at its ``eta_ms``, with confirms.

        Messages already due go straight to their queues; the others through the delay
        backend (chosen on first use). Raises like :meth:`publish_delayed`; a
        ``PublishError`` lists the ``unconfirmed_ids`` where known.
        """
        for message in messages:
            self._road.check_queue(message.queue)
        self._sender.publish_delayed_many(messages)

    @property
    def delay_backend(self) -> DelayBackend:
        """This process's delay backend, publishing through :attr:`publisher`.

        Chosen on first use from the ``delay_backend`` setting (``auto`` asks the broker
        whether the delayed-message plugin is enabled) and logged.

        Raises:
            PublishError: the broker is unreachable, so ``auto`` cannot choose.
            ConfigurationError: ``delay_backend='plugin'`` and the broker lacks the plugin.
        """
        return self._sender.delay_backend

    def adopt_delay_backend(self, kind: str) -> None:
        """Use ``kind`` (``plugin`` or ``tiers``, chosen by a parent) without probing again."""
        self._sender.adopt_delay_kind(kind)

    @property
    def delay_backend_name(self) -> str:
        """``"plugin"`` or ``"tiers"``: the delay backend in use (chosen on first use).

        Raises:
            PublishError: the broker is unreachable, so ``auto`` cannot choose.
        """
        return self._sender.delay_kind()

    def enqueue(self, session: Any, outgoing: Outgoing) -> bool:
        """Add a message built by :attr:`road` to the outbox in ``session``'s transaction.

        ``session`` is an ORM ``Session`` or a Core ``Connection`` on the database named by
        ``database_url`` (no commit); the relay publishes the row after the caller commits.
        A session bound to another database is refused: no relay would ever read its row.

        Returns:
            ``False`` when the task id or idempotency key is already in the outbox.

        Raises:
            ConfigurationError: ``session`` is bound to another database than
                ``database_url`` (:mod:`taskq.outbox.binding`).
            OutboxError: the row could not be written.
        """
        if self.settings.task_always_eager:
            from taskq.eager import run_on_commit

            run_on_commit(self, session, outgoing.wire, outgoing.queue)
            return True
        from taskq.outbox.enqueue import add_to_outbox

        return add_to_outbox(
            self._outbox_store(), session, outgoing.envelope, outgoing.wire,
            outgoing.destination, horizon_s=self.settings.outbox_delay_horizon_s,
            database_url=self.settings.database_url,
        )

    # -- database ----------------------------------------------------------------------------

    @property
    def engine(self) -> Any:
        """This process's SQLAlchemy engine for ``database_url`` (created on first use)."""
        engine = self._engine
        if engine is not None and self._engine_pid == os.getpid():
            return engine
        from taskq.db import create_engine

        with self._lock:
            if self._engine is None or self._engine_pid != os.getpid():
                self._engine = create_engine(self.settings.database_url)
                self._engine_pid = os.getpid()
            return self._engine

    @property
    def results(self) -> Any:
        """The :class:`~taskq.results.ResultStore` on ``database_url`` (this process's)."""
        from taskq.results import ResultStore

        engine = self.engine
        store = self._results
        if store is None or store.engine is not engine:
            store = self._results = ResultStore(engine)
        return store

    def result(self, task_id: str) -> AsyncResult:
        """A handle on the task ``task_id``, to read its state and (when kept) result."""
        status = self.task_state(task_id, broker=False)
        task = status.task if status is not None and status.task else "?"
        return AsyncResult(task_id, task=task, queue="?", app=self)

    def task_state(self, task_id: str, *, broker: bool = True) -> Any:
        """Where ``task_id`` stands: :func:`taskq.states.lookup` (``broker=False``: taskq's
        tables only, :func:`taskq.states.from_database`, ``None`` when they know nothing)."""
        from taskq.states import from_database, lookup

        return lookup(self, task_id) if broker else from_database(self, task_id)

    def create_tables(self) -> None:
        """Create taskq's tables in ``database_url`` if they do not exist."""
        from taskq.schema import metadata

        metadata.create_all(self.engine)

    def outbox_backlog(self) -> Any:
        """Return the outbox :class:`~taskq.outbox.store.Backlog` (rows, oldest age)."""
        return self._outbox_store().backlog(self.engine)

    def relay(self, *, publisher: Publisher | None = None) -> Any:
        """Build an :class:`~taskq.outbox.relay.OutboxRelay` for this app's outbox."""
        from taskq.outbox.relay import OutboxRelay, RelayConfig

        config = RelayConfig(
            batch_size=self.settings.outbox_batch_size,
            poll_interval_s=self.settings.outbox_poll_interval_s,
            retry_max_s=self.settings.outbox_retry_max_s,
        )
        if publisher is None:
            publisher = self._sender.relay_publisher()
        return OutboxRelay(
            self.engine,
            publisher,
            exchange=self._topology.exchange,
            app_id=self.name,
            config=config,
            delay=self._sender.delay_factory(publisher),
        )

    def _outbox_store(self) -> Any:
        if self._store is None:
            from taskq.outbox.store import OutboxStore

            self._store = OutboxStore()
        return self._store

    def close(self) -> None:
        """Close this process's broker connection and database pool (safe to repeat)."""
        with self._lock:
            self._sender.close()
            engine, self._engine = self._engine, None
            if engine is not None and self._engine_pid == os.getpid():
                engine.dispose()

    # -- internals ---------------------------------------------------------------------------

    def _build_road(self) -> Road:
        return Road(
            app_name=self.name, topology=self._topology,
            max_message_size_bytes=self.settings.max_message_size_bytes,
            learn_broker=self._learn_broker,
        )

    def _build_topology(self) -> Topology:
        known = getattr(self, "_topology", None)  # what the connections learnt stays known
        return Topology(
            namespace=self.settings.namespace,
            default_max_priority=self.settings.default_max_priority,
            queues=self._queues,
            default_queue_type=self.settings.default_queue_type,  # type: ignore[arg-type]
            broker=known.broker if known is not None else BrokerFacts(),
        )

    def _learn_broker(self) -> None:
        """Connect once to read the broker's version (see :class:`~taskq.road.Road`)."""
        try:
            connection = open_connection(
                self.settings, client_name="taskq version", broker=self._topology.broker
            )
        except BrokerConnectionError as exc:
            logger.warning("cannot read the broker's version: %s", exc.message)
            return
        try:
            connection.close()
        except Exception:  # closing is best effort: the version is read already
            logger.debug("error closing the version connection", exc_info=True)
