"""The dead-letter runbook: list, replay and purge ``Q.dlq`` and ``ns.unroutable``.

``taskq dlq`` (:mod:`taskq.cli`) delegates here; docs/dlq.md is the runbook for humans.

* **list** fetches messages without acking and closes the channel, so every one returns to
  the queue: nothing is removed. While listed they are briefly invisible to a concurrent
  replay, and they are redelivered (``redelivered`` flag set); RabbitMQ puts returned
  messages back in their original place, so the order is kept in practice but not promised.
* **replay** republishes each selected message through the app's exchange -- to ``Q`` for
  ``Q.dlq``, to its original routing key for ``ns.unroutable`` -- and removes the parked copy
  only after the broker confirmed the new one. It looks at the messages that were in the
  queue when it started (so a message that fails again, or is unroutable again, is not met a
  second time in the same run). Messages that do not match ``--id``/``--task``, or that are
  past ``--limit``, stay where they are. One message is in flight at a time: an interrupted
  replay (Ctrl-C, a lost connection, a killed process) loses nothing and leaves at most that
  one message in both queues (see :mod:`taskq.broker.parked`).
* **purge** deletes every message of the queue.

A replayed dead letter starts over: ``taskq-retries`` is 0 again, and the ``taskq-error-*``
headers and RabbitMQ's ``x-death`` family are dropped (docs/delays.md). An unroutable message
keeps its ``taskq-retries``: it never failed, it only found no queue.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from taskq._suggest import did_you_mean
from taskq.broker.parked import Parked, ParkedQueue
from taskq.broker.topology import DELAY_LEVEL_HEADER_PREFIX, dlq_name, validate_queue_name
from taskq.errors import ConfigurationError
from taskq.message import (
    ATTEMPTS,
    DEAD_LETTER_HEADERS,
    ERROR,
    ERROR_TYPE,
    FAILED_AT,
    ORDERING_KEY,
    RETRIES,
    TASK,
    WireMessage,
)
from taskq.republish import republish_headers

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)

# The delayed-message plugin's header: meaningless once a message is republished directly.
_X_DELAY = "x-delay"


@dataclass(frozen=True)
class ParkedInfo:
    """What ``taskq dlq list`` shows of one parked message.

    Args:
        task_id: The message id (task id), if any.
        task: The ``taskq-task`` header, if any.
        attempts: ``taskq-attempts`` of a dead letter.
        retries: ``taskq-retries``.
        error_type: ``taskq-error-type`` of a dead letter.
        error: ``taskq-error`` of a dead letter.
        age_s: Seconds since it failed (``taskq-failed-at``), else since it was published.
        destination: Where a replay sends it: ``Q``, or the original routing key.
    """

    task_id: str | None
    task: str | None
    attempts: int | None
    retries: int | None
    error_type: str | None
    error: str | None
    age_s: float | None
    destination: str

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``--json``)."""
        return asdict(self)


@dataclass
class ReplayReport:
    """Counts of one replay; filled in as it goes, so an interrupted one still tells.

    Attributes:
        examined: Messages looked at.
        replayed: Republished (confirmed) and removed from the parking queue.
        skipped: Left in place: not selected by ``--id``/``--task``.
        unroutable: Left in ``ns.unroutable``: their destination queue does not exist.
        source: The parking queue replayed.
        total: Messages in it when the replay started.
        parked_tasks: How many examined messages each task name had.
        parked_ids: The task ids of the examined messages.
    """

    examined: int = 0
    replayed: int = 0
    skipped: int = 0
    unroutable: int = 0
    source: str = ""
    total: int = 0
    parked_tasks: Counter[str] = field(default_factory=Counter)
    parked_ids: set[str] = field(default_factory=set)

    def unmatched(self, *, ids: Collection[str] = (), tasks: Collection[str] = ()) -> str:
        """What of ``--id``/``--task`` matched no parked message, for the user; ``""`` if all
        did, or if the replay stopped (``--limit``) before it looked at every message."""
        if self.examined < self.total:
            return ""
        problems = []
        for task in sorted(set(tasks) - set(self.parked_tasks)):
            problems.append(f"no message of task {task!r} is parked in {self.source}"
                            f"{did_you_mean(task, self.parked_tasks)}")
        for task_id in sorted(set(ids) - self.parked_ids):
            problems.append(f"no message in {self.source} has task id {task_id!r}")
        if not problems:
            return ""
        parked = ", ".join(f"{name} ({count})"
                           for name, count in sorted(self.parked_tasks.items())) or "nothing"
        return f"{'; '.join(problems)}. Parked there by task: {parked}"


Progress = Callable[[int, int], None]


def source_queue(app: App, queue: str | None, *, unroutable: bool) -> str:
    """The parking queue to work on: ``queue``'s ``.dlq``, or the app's unroutable queue.

    Raises:
        ConfigurationError: neither or both given, or an invalid queue name.
    """
    if unroutable:
        if queue:
            raise ConfigurationError("give a queue or --unroutable, not both")
        return app.topology.unroutable
    if not queue:
        names = ", ".join(app.queue_names())
        raise ConfigurationError(
            f"give the work queue whose dead letters to use (app {app.name}'s queues: "
            f"{names}), or --unroutable for {app.topology.unroutable}"
        )
    return dlq_name(validate_queue_name(queue))


def depth(app: App, queue: str | None, *, unroutable: bool = False) -> int:
    """How many messages wait in the parking queue.

    Raises:
        BrokerError: the broker is unreachable or the queue does not exist.
    """
    with ParkedQueue(app.settings, source_queue(app, queue, unroutable=unroutable)) as lot:
        return lot.depth


def list_parked(
    app: App, queue: str | None, *, unroutable: bool = False, limit: int = 50
) -> list[ParkedInfo]:
    """Describe up to ``limit`` parked messages, oldest first, without removing any.

    Raises:
        BrokerError: the broker is unreachable or the queue does not exist.
    """
    infos: list[ParkedInfo] = []
    with ParkedQueue(app.settings, source_queue(app, queue, unroutable=unroutable)) as lot:
        now_s = time.time()
        while len(infos) < min(limit, lot.depth):
            parked = lot.get()
            if parked is None:
                break
            infos.append(describe(parked, queue, now_s=now_s))
    return infos


def replay(
    app: App,
    queue: str | None,
    *,
    unroutable: bool = False,
    ids: Collection[str] = (),
    tasks: Collection[str] = (),
    limit: int | None = None,
    progress: Progress | None = None,
    report: ReplayReport | None = None,
) -> ReplayReport:
    """Move selected parked messages back to their queue (see the module docstring).

    Args:
        app: Its exchange and namespace are used.
        queue: The work queue whose ``.dlq`` to replay (``None`` with ``unroutable``).
        unroutable: Replay ``ns.unroutable`` to each message's original routing key.
        ids: Only these task ids (all when empty).
        tasks: Only these task names (all when empty).
        limit: Replay at most this many.
        progress: Called with ``(examined, total)`` after each message looked at.
        report: Filled in as the replay goes (pass one to read it after an interruption).

    Returns:
        The counts.

    Raises:
        BrokerError: the broker is unreachable, the queue does not exist, or a republish
            was not confirmed (that message stays parked).
    """
    report = report if report is not None else ReplayReport()
    select = _selector(set(ids), set(tasks))
    exchange = app.topology.exchange
    with ParkedQueue(app.settings, source_queue(app, queue, unroutable=unroutable)) as lot:
        report.source = lot.queue
        total = report.total = lot.depth
        exists = functools.lru_cache(maxsize=1024)(lot.queue_exists)
        while report.examined < total and (limit is None or report.replayed < limit):
            parked = lot.get()
            if parked is None:
                report.total = report.examined  # fewer than counted (another consumer)
                break
            report.examined += 1
            report.parked_tasks[_str(parked.message.headers.get(TASK)) or "(no task name)"] += 1
            if parked.message.message_id:
                report.parked_ids.add(parked.message.message_id)
            destination = _destination(app, queue, parked)
            if not select(parked):
                report.skipped += 1
            elif unroutable and not (destination and exists(destination)):
                report.unroutable += 1  # replaying it would only park it again
            else:
                wire = replay_copy(parked.message, reset_retries=not unroutable)
                lot.publish(wire, exchange=exchange, routing_key=destination)
                lot.ack(parked)
                report.replayed += 1
            if progress is not None:
                progress(report.examined, total)
    return report


def purge(app: App, queue: str | None, *, unroutable: bool = False) -> int:
    """Delete every message of the parking queue; return how many were deleted.

    Raises:
        BrokerError: the broker is unreachable or the queue does not exist.
    """
    with ParkedQueue(app.settings, source_queue(app, queue, unroutable=unroutable)) as lot:
        count = lot.purge()
    logger.warning("purged %d messages from %s", count, lot.queue)
    return count


def replay_copy(message: WireMessage, *, reset_retries: bool) -> WireMessage:
    """The message to republish: same body and properties, headers of a fresh attempt.

    Drops ``x-death`` (and ``x-first-death-*``, ``x-last-death-*``), the ``taskq-error-*``
    headers of a dead letter, and delay routing headers; ``taskq-retries`` becomes 0 when
    ``reset_retries``.
    """
    headers = {
        name: value
        for name, value in republish_headers(message.headers).items()
        if name not in DEAD_LETTER_HEADERS
        and name != _X_DELAY
        and not name.startswith(DELAY_LEVEL_HEADER_PREFIX)
    }
    if reset_retries and RETRIES in headers:
        headers[RETRIES] = 0
    return message.with_headers(headers)


def describe(parked: Parked, queue: str | None, *, now_s: float) -> ParkedInfo:
    """What ``list`` shows of ``parked``; ``queue`` is the work queue (``None``: unroutable)."""
    headers = parked.message.headers
    failed_at_ms = _int(headers.get(FAILED_AT))
    timestamp = parked.message.timestamp
    if failed_at_ms is not None:
        age_s: float | None = max(0.0, now_s - failed_at_ms / 1000)
    elif timestamp is not None:
        age_s = max(0.0, now_s - timestamp)
    else:
        age_s = None
    return ParkedInfo(
        task_id=parked.message.message_id,
        task=_str(headers.get(TASK)),
        attempts=_int(headers.get(ATTEMPTS)),
        retries=_int(headers.get(RETRIES)),
        error_type=_str(headers.get(ERROR_TYPE)) or _broker_reason(headers),
        error=_str(headers.get(ERROR)) or _BROKER_REASONS.get(
            _str(headers.get("x-first-death-reason")) or ""
        ),
        age_s=age_s,
        destination=queue or parked.routing_key,
    )


def _destination(app: App, queue: str | None, parked: Any) -> str:
    """Where a replay sends ``parked``: ``queue``; for an ordered queue, the partition of
    the message's ordering key (its routing key, the partition it came from, if it has none)."""
    if not queue:
        return str(parked.routing_key)
    if app.topology.partitions(queue) is None:
        return queue
    headers = parked.message.headers or {}
    if isinstance(headers.get(ORDERING_KEY), str):
        return app.road.reroute(parked.message, queue)
    return str(parked.routing_key)


# Why RabbitMQ itself dead-lettered a message (x-first-death-reason), for those that carry
# no taskq-error-* headers because no worker put them there.
_BROKER_REASONS = {
    "delivery_limit": "the quorum queue's x-delivery-limit was reached: delivered that many "
    "times without an ack (process deaths, node deaths, channel closes and requeues all "
    "count); replay it once the cause is fixed",
    "expired": "its x-message-ttl ran out before a worker took it",
    "maxlen": "the queue's x-max-length was reached and it was dropped from the head",
    "rejected": "a consumer rejected it without requeue",
}


def _broker_reason(headers: dict[str, Any]) -> str | None:
    reason = _str(headers.get("x-first-death-reason"))
    return f"broker:{reason}" if reason else None


def _selector(ids: set[str], tasks: set[str]) -> Callable[[Parked], bool]:
    def select(parked: Parked) -> bool:
        if ids and parked.message.message_id not in ids:
            return False
        return not tasks or parked.message.headers.get(TASK) in tasks

    return select


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    if isinstance(value, bytes):  # pika hands AMQP long strings over as bytes at times
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
