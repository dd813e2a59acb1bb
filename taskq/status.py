"""``taskq status``: what waits where, and who is consuming it.

:func:`collect` gathers one :class:`Status`: per work queue ready and unacked messages and
consumers, each ``Q.dlq``'s depth, ``<ns>.unroutable``, messages waiting in the delay tiers,
the delay backend, and the outbox backlog; the broker's version and what taskq decided from
it (:func:`broker_decisions`). It never raises for a part that cannot be read:
the part carries an error line instead, so a database outage still shows the broker's side.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from taskq._table import aligned
from taskq.broker import topology as topo
from taskq.broker.inspect import QueueStats, snapshot
from taskq.broker.versions import BrokerVersion
from taskq.errors import TaskqError
from taskq.ordering.status import (
    OrderedQueueStatus,
    ordered_part,
    partition_names,
    render_ordered,
    totals,
)
from taskq.schedules import report as schedule_report
from taskq.schedules.report import SchedulerStatus, ScheduleStatus
from taskq.settings import redact_url

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueStatus:
    """One work queue and its parking lot."""

    name: str
    exists: bool
    ready: int
    unacked: int | None
    consumers: int
    dead_letters: int
    #: Messages per second into the queue and acked from it, as the management plugin
    #: averages them (``None`` without the management API: AMQP does not count them).
    published_per_s: float | None = None
    acked_per_s: float | None = None


@dataclass(frozen=True)
class OutboxStatus:
    """The outbox backlog (``error`` set when the database could not be read)."""

    rows: int | None = None
    oldest_age_s: float | None = None
    failing_rows: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Status:
    """Everything ``taskq status`` shows."""

    app: str
    broker_url: str
    database_url: str
    source: str | None
    queues: list[QueueStatus] = field(default_factory=list)
    unroutable: int | None = None
    delayed: int | None = None
    delay_backend: str | None = None
    #: The broker as it introduced itself (``RabbitMQ 4.3.6``), and what taskq decided from it.
    broker_version: str | None = None
    decisions: list[str] = field(default_factory=list)
    outbox: OutboxStatus = field(default_factory=OutboxStatus)
    broker_error: str | None = None
    schedules: list[ScheduleStatus] = field(default_factory=list)
    schedulers: list[SchedulerStatus] = field(default_factory=list)
    ordered: list[OrderedQueueStatus] = field(default_factory=list)  # partitions, active

    @property
    def consumers(self) -> int:
        """Consumers across the work queues (one per worker process and queue)."""
        return sum(q.consumers for q in self.queues)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (``--json``)."""
        data = asdict(self)
        data["consumers"] = self.consumers
        return data


def collect(app: App, queues: list[str] | None = None) -> Status:
    """Gather the status of ``queues`` (default: every queue the app knows)."""
    names = queues or app.queue_names()
    broker = _broker_part(app, names)
    periodic = schedule_report.collect(app)
    return Status(
        app=app.name,
        broker_url=redact_url(app.settings.broker_url),
        database_url=redact_url(app.settings.database_url),
        outbox=_outbox_part(app),
        schedules=periodic.schedules,
        schedulers=periodic.schedulers,
        **broker,
    )


def _tier_names(app: App) -> list[str]:
    """The tiers this app publishes to (each missing one costs a passive declare)."""
    ns, kind = app.settings.namespace, app.settings.delay_tier_queue_type
    return [topo.delay_tier_name(ns, level, kind) for level in range(topo.DELAY_TIER_LEVELS)]


def _broker_part(app: App, names: list[str]) -> dict[str, Any]:
    unroutable = topo.unroutable_name(app.settings.namespace)
    tiers = _tier_names(app)
    wanted = [*names, *(topo.dlq_name(n) for n in names), unroutable, *tiers,
              *partition_names(app, names)]
    try:
        shot = snapshot(app.settings, wanted)
    except TaskqError as exc:
        return {"source": None, "broker_error": str(exc)}
    ordered = ordered_part(app, names, shot.queues)
    stats = {**shot.queues, **{n: t for n in names if (t := totals(n, ordered))}}
    empty = QueueStats("", 0, None, 0)
    queues = [
        QueueStatus(
            name=name,
            exists=name in stats,
            ready=q.ready,
            unacked=q.unacked,
            consumers=q.consumers,
            dead_letters=stats.get(topo.dlq_name(name), empty).ready,
            published_per_s=q.published_per_s,
            acked_per_s=q.acked_per_s,
        )
        for name in names
        for q in (stats.get(name, empty),)
    ]
    return {
        "source": shot.source,
        "queues": queues,
        "unroutable": stats.get(unroutable, empty).ready,
        "delayed": sum(stats[t].ready + (stats[t].unacked or 0) for t in tiers if t in stats),
        "delay_backend": (backend := _delay_backend(app)),
        "ordered": ordered,
        **_version_part(app, backend),
    }


def _version_part(app: App, backend: str | None) -> dict[str, Any]:
    version = app.topology.broker.version  # learnt by the delay backend's probe
    if version is None:
        return {}
    return {"broker_version": str(version),
            "decisions": broker_decisions(version, app.settings.delay_backend, backend)}


def broker_decisions(version: BrokerVersion, wanted: str, backend: str | None) -> list[str]:
    """What taskq decided from the broker's version, one line each (``taskq status``)."""
    if wanted != "auto" or backend is None:
        delays = f"{backend or 'unknown'} (delay_backend={wanted!r})"
    elif backend == "plugin":
        delays = "plugin (auto: rabbitmq_delayed_message_exchange is enabled)"
    elif not version.may_have_delay_plugin:
        delays = (f"tiers (auto: {version} cannot run the delayed-message plugin: it needs "
                  "Mnesia, removed in 4.3)")
    else:
        delays = "tiers (auto: rabbitmq_delayed_message_exchange is not enabled)"
    levels = version.quorum_priority_levels
    priorities = {
        0: "none (a priority above 0 on a quorum queue is refused; RabbitMQ 4.0+ has them)",
        2: "two levels (0-4 normal, 5-9 high)", 10: "each of 0-9, in strict order",
    }.get(levels, f"{levels} levels")
    if version.consumer_timeout_cancels:
        timeout = ("quorum queues only, by cancelling the consumer; taskq's consumers ask "
                   "for x-consumer-timeout; classic queues never time out")
    else:
        timeout = "every queue type; the broker closes the channel (see consumer_timeout_s)"
    limit = ("20 by default; taskq declares its quorum work queues with their own "
             "(delivery_limit) and its parking lots with none (-1)"
             if version.quorum_default_delivery_limit else "none by default")
    return [f"delay backend: {delays}", f"quorum queue priorities: {priorities}",
            f"consumer timeout: {timeout}", f"quorum delivery limit: {limit}"]


def _delay_backend(app: App) -> str | None:
    try:
        return str(app.delay_backend_name)
    except TaskqError as exc:
        logger.debug("delay backend unknown: %s", exc)
        return None


def _outbox_part(app: App) -> OutboxStatus:
    try:
        backlog = app.outbox_backlog()
    except Exception as exc:  # OutboxError, or the engine cannot even be built
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return OutboxStatus(
            error=f"cannot read the outbox at {redact_url(app.settings.database_url)}: "
            f"{first_line}"
        )
    return OutboxStatus(backlog.rows, backlog.oldest_age_s(), backlog.failing_rows)


def _amqp_source(status: Status) -> str:
    # An amqps broker's management API is asked over HTTPS only (broker/_management.py).
    https = " with its HTTPS listener on port 15671" if status.broker_url.startswith(
        "amqps://") else ""
    return ("AMQP passive declare (unacked and publish/ack rates unknown: enable "
            f"rabbitmq_management{https})")


def _per_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(status: Status) -> str:
    """The human-readable table ``taskq status`` prints."""
    lines = [f"taskq status of app {status.app}"]
    if status.broker_error:
        lines.append(f"  broker: ERROR {status.broker_error}")
    else:
        how = "management API" if status.source == "management" else _amqp_source(status)
        lines.append(f"  broker: {status.broker_url} via {how}")
        if status.broker_version:
            lines.append(f"  broker version: {status.broker_version}")
            lines.extend(f"    {decision}" for decision in status.decisions)
        rates = status.source == "management"
        rows = [["queue", "ready", "unacked", "consumers", "dead"]
                + (["publish/s", "ack/s"] if rates else [])]
        for q in status.queues:
            unacked = "-" if q.unacked is None else str(q.unacked)
            name = q.name if q.exists else f"{q.name} (not declared)"
            rows.append([name, str(q.ready), unacked, str(q.consumers), str(q.dead_letters)]
                        + ([_per_s(q.published_per_s), _per_s(q.acked_per_s)] if rates else []))
        lines.extend(aligned(rows, right=range(1, len(rows[0]))))
        lines.extend(render_ordered(status.ordered))
        lines.append(f"  unroutable (parked): {status.unroutable}")
        lines.append(f"  delayed (in delay tiers): {status.delayed}; delay backend: "
                     f"{status.delay_backend or 'unknown'}")
        lines.append(f"  workers: {status.consumers} consumers on these queues")
    outbox = status.outbox
    if outbox.error:
        lines.append(f"  outbox: ERROR {outbox.error}")
    else:
        lines.append(f"  outbox ({status.database_url}): {outbox.rows} rows waiting, oldest "
                     f"{outbox.oldest_age_s or 0:.1f}s, {outbox.failing_rows} failing")
    lines.extend(schedule_report.render(
        schedule_report.ScheduleReport(status.schedules, [], status.schedulers)))
    return "\n".join(lines)
