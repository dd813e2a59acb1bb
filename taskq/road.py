"""The one road of every new message: built, checked and routed in one place.

Whatever asks for a task to run — ``delay``/``apply_async``, ``map``/``starmap``, an
outbox enqueue, a schedule's tick, a workflow's step or errback, the ``django.tasks``
backend — gets its message from :meth:`Road.build`, which:

1. checks the call against the task function's signature (the ``TypeError`` calling the
   function would raise; :mod:`taskq.calls`),
2. resolves the options (call > task > app) and checks the priority against the target
   queue (a quorum or ordered queue takes none),
3. derives the ordering key (the call's, else the task's key argument) and the partition,
4. encodes the body and headers (arguments taskq cannot encode, reserved header names, and
   headers RabbitMQ itself would refuse, such as a top-level ``CC``) and checks the size.

Every refusal is raised here, at the call (or when a schedule is defined or a workflow is
applied, which build each of their messages once to check them), so nothing is accepted
that a worker would later have to dead-letter for a reason knowable at the call. What a
producer then does with the :class:`Outgoing` — publish it now, delayed, in bulk, or add it
to the outbox — is the app's business (:class:`~taskq.app.App`). Copies of messages that
already took this road (retries, delay hops, replays, the relay's rows) are not rebuilt:
their destination is re-derived by :meth:`Road.reroute`.

Pure: no I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from taskq.broker.topology import Topology, validate_queue_name
from taskq.errors import ConfigurationError, MessageTooLarge
from taskq.message import (
    MAX_PRIORITY,
    ORDERING_KEY,
    TASK,
    Envelope,
    WireMessage,
    encode,
    new_task_id,
)
from taskq.ordering.routing import route

logger = logging.getLogger(__name__)


class RoadTask(Protocol):
    """What the road needs of a task (:class:`~taskq.task.Task` provides it)."""

    name: str

    @property
    def queue(self) -> str:
        """The task's queue when the call names none."""

    @property
    def default_priority(self) -> int:
        """The task's priority when the call sets none."""

    def check_call(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> None:
        """Raise ``TypeError`` when the function could not take this call."""

    def ordering_key_of(
        self, args: Sequence[Any], kwargs: Mapping[str, Any] | None, queue: str,
        given: Any = None,
    ) -> str | None:
        """The call's ordering key, or ``None``."""


@dataclass(slots=True)
class Outgoing:
    """One new message, checked and routed, not yet sent.

    Args:
        envelope: The call, as taskq code reads it.
        wire: Its encoded form (what is published or stored in the outbox).
        queue: The queue the call asked for (an ordered queue's own name).
        destination: Where it is published: ``queue``, or the partition of its key.
    """

    envelope: Envelope
    wire: WireMessage
    queue: str
    destination: str


class Road:
    """Builds, checks and routes the new messages of one app.

    Whether a quorum queue takes priorities depends on the broker's version (none on
    RabbitMQ 3.x), which the app's connections learn at connect (``topology.broker``). A
    call that needs it before any connection of this process -- a priority for a quorum
    queue enqueued through the outbox first thing -- has ``learn_broker`` open one short
    connection, once; every later call decides from what is known, with no round trip.
    When the broker cannot be reached then, the priority is accepted (the outbox is there
    to take work during an outage) with a warning: on RabbitMQ 3.x it will be ignored.

    Args:
        app_name: Sent as every message's ``app_id``.
        topology: The app's queues (kinds, partitions), read at each call.
        max_message_size_bytes: Largest encoded body accepted.
        learn_broker: Connects once to learn the broker's version into
            ``topology.broker`` (errors are its own to handle); ``None``: never connect.
    """

    def __init__(
        self,
        *,
        app_name: str,
        topology: Topology,
        max_message_size_bytes: int,
        learn_broker: Callable[[], None] | None = None,
    ) -> None:
        self.app_name = app_name
        self.topology = topology
        self.max_message_size_bytes = max_message_size_bytes
        self._learn_broker = learn_broker
        self._valid_queues: set[str] = set()

    def build(
        self,
        task: RoadTask,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        task_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        eta: datetime | None = None,
        ordering_key: Any = None,
    ) -> Outgoing:
        """Build the message of one call of ``task``, or refuse it with the reason.

        Raises:
            TypeError: the task function could not be called with ``args, kwargs``.
            ConfigurationError: a bad queue name, task id, priority (or one the queue does
                not take), ordering key (missing for an ordered queue, given for another),
                header or eta.
            SerializationError: an argument cannot be encoded.
            MessageTooLarge: the encoded arguments exceed ``max_message_size_bytes``.
        """
        target = queue or task.queue
        self.check_queue(target)
        if not isinstance(args, (list, tuple)):
            raise ConfigurationError(
                f"args of task {task.name!r} must be a list or tuple, not {type(args).__name__}",
                task=task.name, queue=target,
            )
        task.check_call(args, kwargs)
        chosen = task.default_priority if priority is None else _priority(priority, task.name)
        if chosen:
            self.check_priority(target, chosen, task.name)
        key = task.ordering_key_of(args, kwargs, target, ordering_key)
        extra = dict(headers) if headers else {}
        if key is not None:
            extra[ORDERING_KEY] = key
        envelope = Envelope(
            task_id=new_task_id() if task_id is None else _task_id(task_id, task.name),
            task=task.name,
            args=list(args),
            kwargs=dict(kwargs) if kwargs else {},
            priority=chosen,
            retries=0,
            idempotency_key=idempotency_key,
            eta=eta,
            timestamp=int(time.time()),
            app_id=self.app_name,
            headers=extra,
        )
        wire = encode(envelope)
        self.check_size(envelope, target, len(wire.body))
        destination = route(self.topology, extra, target, task.name)
        return Outgoing(envelope, wire, target, destination)

    def check_priority(self, queue: str, priority: int, task: str) -> None:
        """Refuse ``priority`` where ``queue`` would ignore it (see the class docstring).

        Raises:
            ConfigurationError: an ordered queue, or a quorum queue on RabbitMQ 3.x.
        """
        if self._needs_broker(queue) and self._learn_broker is not None:
            self._learn_broker()
        if self._needs_broker(queue):
            logger.warning(
                "task %s: priority %d for quorum queue %r accepted without knowing the "
                "broker's version (it could not be reached): RabbitMQ 4.x honours it, 3.x "
                "runs the task in arrival order", task, priority, queue,
                extra={"task": task, "queue": queue},
            )
            return
        self.topology.check_priority(queue, priority, task)

    def takes_priorities(self, queue: str) -> bool:
        """Whether ``queue`` honours priorities on this app's broker (learnt if need be)."""
        if self._needs_broker(queue) and self._learn_broker is not None:
            self._learn_broker()
        return self.topology.takes_priorities(queue) or self._needs_broker(queue)

    def _needs_broker(self, queue: str) -> bool:
        """Whether a priority for ``queue`` depends on a broker version not known yet."""
        options = self.topology.options(queue)
        return (
            options.type == "quorum" and options.partitions is None
            and self.topology.broker.version is None
        )

    def reroute(self, wire: WireMessage, queue: str) -> str:
        """Where a copy of a message that already took this road goes for ``queue``.

        A partition name stays as it is; an ordered queue's own name leads to the partition
        of the copy's ordering key.

        Raises:
            ConfigurationError: the copy no longer fits ``queue`` (e.g. the queue became
                ordered and the copy has no key).
        """
        self.check_queue(queue)
        return route(self.topology, wire.headers or {}, queue, str((wire.headers or {}).get(TASK)))

    def check_queue(self, queue: str) -> None:
        """Refuse a queue name RabbitMQ or taskq cannot use (checked once per name)."""
        if queue not in self._valid_queues:
            validate_queue_name(queue)
            self._valid_queues.add(queue)

    def check_size(self, envelope: Envelope, queue: str, size_bytes: int) -> None:
        """Refuse a body larger than ``max_message_size_bytes``."""
        limit = self.max_message_size_bytes
        if size_bytes > limit:
            raise MessageTooLarge(
                f"task {envelope.task!r} (id {envelope.task_id}) for queue {queue!r}: the "
                f"encoded arguments are {size_bytes} bytes, above max_message_size_bytes="
                f"{limit}; pass a reference (a database id, an object-store key) instead of "
                "the data",
                task=envelope.task,
                task_id=envelope.task_id,
                queue=queue,
                size_bytes=size_bytes,
            )


def _priority(priority: Any, task: str) -> int:
    if priority.__class__ is not int or not 0 <= priority <= MAX_PRIORITY:
        raise ConfigurationError(
            f"task {task!r}: priority must be an int from 0 to {MAX_PRIORITY}, not {priority!r}",
            task=task,
        )
    return int(priority)


def _task_id(task_id: Any, task: str) -> str:
    # 63 chars are at most 252 UTF-8 bytes: no need to encode the common UUID.
    if task_id.__class__ is not str or (
        len(task_id) > 63 and len(task_id.encode()) > 255
    ):
        raise ConfigurationError(
            f"task {task!r}: task_id must be a str of at most 255 bytes (it is the AMQP "
            f"message_id), got {str(task_id)[:60]!r}",
            task=task,
        )
    return str(task_id)
