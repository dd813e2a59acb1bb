"""OutboxRelay: claim due rows, publish them with pipelined confirms, delete what was confirmed.

One batch is one database transaction on PostgreSQL: the claimed rows stay locked
(``FOR UPDATE SKIP LOCKED``) while they are published, so several relays never publish the
same row in normal operation, and a relay that dies mid-batch releases its rows to the next
one. The worst case is a row published and not deleted (a crash between the broker's
confirm and the commit): it is published again, and the idempotency key in its headers lets
the worker skip the second run. Nothing is deleted before the broker confirmed it.

On SQLite (one relay at a time) the rows are read, published, then deleted in a second short
transaction, so producers' commits are never blocked for the length of a publish.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from taskq.broker.publisher import OUTAGE_REASONS, Publisher
from taskq.db import describe_database_error, utcnow
from taskq.delay.backend import DelayBackend, DelayedMessage
from taskq.delay.maths import eta_ms_of
from taskq.errors import BrokerError, ConfigurationError, PublishError, TopologyError
from taskq.message import CONTENT_TYPE, WireMessage
from taskq.outbox.store import NOTIFY_CHANNEL, OutboxRow, OutboxStore

logger = logging.getLogger(__name__)

MIN_PAUSE_S = 0.02
# Refusals whose unconfirmed_ids are exactly the refused messages: no need to look further.
_REFUSED_PER_MESSAGE = ("nack", "returned", "unencodable")

_T = TypeVar("_T")
# A row to publish: its message id, its queue, and what the publish call takes for it.
_Entry = tuple[str, str, _T]


class Waker(Protocol):
    """Blocks an idle relay until rows may be waiting."""

    def wait(self, timeout_s: float) -> None:
        """Return when woken or after ``timeout_s`` seconds."""

    def close(self) -> None:
        """Release resources."""


class EventWaker:
    """Waits on an in-process event (set by this process's commits) or the poll timeout."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event or threading.Event()

    def wait(self, timeout_s: float) -> None:
        """Return when the event is set or after ``timeout_s``."""
        if self.event.wait(timeout_s):
            self.event.clear()

    def close(self) -> None:
        """Nothing to release."""


class PostgresWaker:
    """LISTENs on the outbox channel; producers NOTIFY inside their transactions."""

    def __init__(self, engine: Engine) -> None:
        import psycopg

        url = engine.url.set(drivername="postgresql")
        self._conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
        self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")

    def wait(self, timeout_s: float) -> None:
        """Return at the first notification (draining any burst) or after ``timeout_s``."""
        for _ in self._conn.notifies(timeout=timeout_s, stop_after=1):
            pass

    def close(self) -> None:
        """Close the LISTEN connection."""
        try:
            self._conn.close()
        except Exception:  # best effort at shutdown
            logger.debug("error closing LISTEN connection", exc_info=True)


@dataclass(frozen=True)
class RelayConfig:
    """Knobs of one relay (defaults come from Settings)."""

    batch_size: int = 200
    poll_interval_s: float = 1.0
    retry_base_s: float = 0.5
    retry_max_s: float = 60.0


class OutboxRelay:
    """Moves committed outbox rows to the broker.

    Args:
        engine: Engine of the database holding ``taskq_outbox``.
        publisher: Publishes with confirms; used only from the relay's thread.
        exchange: The exchange tasks are published to.
        app_id: AMQP ``app_id`` of relayed messages.
        config: Batch size, poll interval and backoff bounds.
        clock: Returns the current aware UTC time (injected by tests).
        delay: Returns the delay backend for rows whose eta is still ahead (called only when
            such a row is claimed). Without one, such rows wait in the table until due.
    """

    def __init__(
        self,
        engine: Engine,
        publisher: Publisher,
        *,
        exchange: str,
        app_id: str,
        config: RelayConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        delay: Callable[[], DelayBackend] | None = None,
    ) -> None:
        self.engine = engine
        self.publisher = publisher
        self.exchange = exchange
        self.app_id = app_id
        self.config = config or RelayConfig()
        self.clock = clock
        self.delay = delay
        self.store = OutboxStore()
        self.published_total = 0
        #: Called with the number of rows each batch published (metrics hook).
        self.on_published: Callable[[int], None] | None = None
        self._broker_down_since: float | None = None
        self._failures = 0
        self._is_postgres = engine.dialect.name == "postgresql"

    # -- one batch ---------------------------------------------------------------------------

    def run_once(self) -> int:
        """Publish one batch of due rows; return how many were confirmed and deleted.

        Raises:
            BrokerError: the broker could not be reached; no row was deleted.
        """
        if self._is_postgres:
            with self.engine.begin() as conn:
                rows = self.store.claim(conn, limit=self.config.batch_size, now=self.clock())
                return self._publish_and_settle(conn, rows)
        with self.engine.begin() as conn:
            rows = self.store.claim(conn, limit=self.config.batch_size, now=self.clock())
        if not rows:
            return 0
        with self.engine.begin() as conn:
            return self._publish_and_settle(conn, rows)

    def _publish_and_settle(self, conn: Connection, rows: list[OutboxRow]) -> int:
        if not rows:
            return 0
        now = self.clock()
        failed: dict[str, str] = {}
        items, delayed, kept = self._sort(conn, rows, now, failed)
        if items or delayed:
            failed.update(self._publish(items, delayed))
        confirmed = [row.id for row in rows if row.id not in failed and row.id not in kept]
        self.store.delete(conn, confirmed)
        for row in rows:
            if row.id in failed:
                delay_s = self._row_backoff_s(row.attempts)
                logger.warning(
                    "outbox row %s (task %s, queue %s) was not published (attempt %d): %s; "
                    "retrying in %.1fs",
                    row.id, row.task, row.queue, row.attempts + 1, failed[row.id], delay_s,
                )
                self.store.defer(
                    conn, row, next_attempt_at=now + timedelta(seconds=delay_s),
                    error=failed[row.id],
                )
        self.published_total += len(confirmed)
        if self.on_published is not None and confirmed:
            self.on_published(len(confirmed))
        return len(confirmed)

    def _sort(
        self, conn: Connection, rows: list[OutboxRow], now: datetime, failed: dict[str, str]
    ) -> tuple[list[tuple[str, str, WireMessage]], list[DelayedMessage], set[str]]:
        """Split claimed rows: due ones to publish, ones to delay, ones kept in the table."""
        items: list[tuple[str, str, WireMessage]] = []
        delayed: list[DelayedMessage] = []
        kept: set[str] = set()
        for row in rows:
            if row.headers is None:
                failed[row.id] = "the stored headers are not a msgpack map; fix or delete the row"
            elif row.eta is None or row.eta <= now:
                items.append((self.exchange, row.queue, self._wire(row)))
            elif self.delay is not None:
                # Claimed within outbox_delay_horizon_s of its eta: from here the broker
                # holds it (the delay backend), with its taskq-eta header.
                delayed.append(DelayedMessage(self._wire(row), row.queue, eta_ms_of(row.eta)))
            else:
                self.store.reschedule(conn, row, next_attempt_at=row.eta)
                kept.add(row.id)
        return items, delayed, kept

    def _publish(
        self,
        items: list[tuple[str, str, WireMessage]],
        delayed: list[DelayedMessage],
    ) -> dict[str, str]:
        """Publish due rows and delayed rows; return {message id: reason} of refused rows.

        A lost connection raises (the whole batch stays in the outbox; rows confirmed before
        it are published again: duplicates, never losses); a refusal of particular rows
        marks only those rows (:meth:`_publish_rows`).
        """
        failed: dict[str, str] = {}
        if items:
            entries = [(str(wire.message_id), key, (exchange, key, wire))
                       for exchange, key, wire in items]
            failed.update(self._publish_rows(self.publisher.publish_many, entries))
        if delayed and self.delay is not None:
            # The backend measures each delay from the moment it publishes (the real clock,
            # not self.clock: a relay's clock only decides which rows are due).
            try:
                backend = self.delay()
                entries_d = [(str(m.wire.message_id), m.queue, m) for m in delayed]
                failed.update(self._publish_rows(backend.publish_many, entries_d))
            except ConfigurationError as exc:
                # e.g. delay_backend='plugin' on a broker without it: mark the rows (their
                # last_error says why) instead of stopping the relay.
                failed.update(dict.fromkeys((str(m.wire.message_id) for m in delayed),
                                            str(exc)))
        return failed

    def _publish_rows(
        self, publish: Callable[[list[_T]], None], entries: list[_Entry[_T]]
    ) -> dict[str, str]:
        """Publish ``entries`` (message id, queue, what ``publish`` takes) in one call.

        Returns {message id: reason} of the rows not confirmed: only a message the broker
        confirmed may have its row deleted, so an error that names no ids counts for all.

        Raises:
            PublishError: the broker is unreachable or stalled (``OUTAGE_REASONS``).
        """
        if not entries:
            return {}
        try:
            publish([entry for _, _, entry in entries])
            return {}
        except PublishError as exc:
            reason = getattr(exc, "reason", None)
            if reason in OUTAGE_REASONS:
                raise  # keep the whole batch; the relay backs off
            named = {str(i) for i in getattr(exc, "unconfirmed_ids", None) or ()}
            unconfirmed = [e for e in entries if e[0] in named] if named else entries
            if reason in _REFUSED_PER_MESSAGE:
                own = getattr(exc, "failures", None) or {}
                why = f"not confirmed by RabbitMQ ({reason})"
                return {e[0]: own.get(e[0], why) for e in unconfirmed}
            error: BrokerError = exc
        except TopologyError as exc:
            unconfirmed, error = entries, exc
        if len(entries) == 1:
            return {entries[0][0]: error.message}
        logger.warning(
            "RabbitMQ refused a batch of %d outbox rows as a whole (%s); publishing it in "
            "parts to find the row(s) at fault", len(entries), error.message,
        )
        return self._isolate(publish, unconfirmed, error)

    def _isolate(
        self, publish: Callable[[list[_T]], None], entries: list[_Entry[_T]], error: BrokerError
    ) -> dict[str, str]:
        """Find the rows a refusal of the whole call belongs to; publish the others.

        A queue that exists with other arguments names itself: its rows fail together. A
        channel the broker closed (an oversized message, a ``CC`` header that is not an
        array, a deleted exchange) names no message: the call is split in halves until each
        failing row stands alone, a few publishes for one bad row among many.
        """
        queue = getattr(error, "queue", None)
        if isinstance(error, TopologyError) or getattr(error, "reason", None) == "topology":
            if queue is not None and any(e[1] == queue for e in entries):
                failed = {e[0]: error.message for e in entries if e[1] == queue}
                rest = [e for e in entries if e[1] != queue]
                return {**failed, **self._publish_rows(publish, rest)}
        half = len(entries) // 2
        return {**self._publish_rows(publish, entries[:half]),
                **self._publish_rows(publish, entries[half:])}

    def _wire(self, row: OutboxRow) -> WireMessage:
        return WireMessage(
            body=row.body,
            message_id=row.id,
            headers=row.headers or {},
            priority=row.priority,
            timestamp=int(row.created_at.timestamp()),
            app_id=self.app_id,
            content_type=CONTENT_TYPE,
        )

    def _row_backoff_s(self, attempts: int) -> float:
        base = min(self.config.retry_max_s, self.config.retry_base_s * 2.0**attempts)
        return float(base * random.uniform(0.5, 1.0))

    # -- the loop ----------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], waker: Waker | None = None) -> None:
        """Relay until ``should_stop()`` is true; back off while the broker is down."""
        waker = waker or self._default_waker()
        logger.info("outbox relay started (batch %d)", self.config.batch_size)
        try:
            while not should_stop():
                pause_s = self.step()
                if pause_s > 0 and not should_stop():
                    waker.wait(pause_s)
        finally:
            waker.close()
            logger.info("outbox relay stopped; %d rows published", self.published_total)

    def step(self) -> float:
        """Run one batch; return how long to wait before the next (0 = go on at once)."""
        try:
            published = self.run_once()
            pause_s = 0.0 if published >= self.config.batch_size else self._idle_wait_s()
        except BrokerError as exc:
            return self._broker_failed("cannot publish", exc)
        except sa.exc.DBAPIError as exc:
            return self._broker_failed("cannot reach the database", exc)
        self._broker_recovered()
        return pause_s

    def _idle_wait_s(self) -> float:
        with self.engine.connect() as conn:
            due = self.store.next_due_at(conn)
        if due is None:
            return self.config.poll_interval_s
        until_due = (due - self.clock()).total_seconds()
        # Due rows left over mean another relay holds them (SKIP LOCKED): look again soon,
        # without spinning.
        return max(MIN_PAUSE_S, min(self.config.poll_interval_s, until_due))

    def _broker_failed(self, what: str, exc: BaseException) -> float:
        self._failures += 1
        delay_s = min(self.config.retry_max_s, self.config.retry_base_s * 2.0**self._failures)
        delay_s *= random.uniform(0.5, 1.0)
        if self._broker_down_since is None:
            self._broker_down_since = time.monotonic()
            # The publisher's own advice ("enqueue again") is for producers; here the rows
            # wait in the outbox, so only what happened is kept. A refused login is logged
            # as an error: waiting does not fix it, the credentials must be.
            refused = getattr(exc, "reason", None) == "login_refused"
            logger.log(
                logging.ERROR if refused else logging.WARNING,
                "outbox relay %s: %s; rows stay in the outbox and are published once it "
                "succeeds, retrying with backoff up to %.0fs",
                what, _cause(exc), self.config.retry_max_s,
            )
        return delay_s

    def _broker_recovered(self) -> None:
        if self._broker_down_since is not None:
            logger.warning(
                "outbox relay publishing again after %.1fs",
                time.monotonic() - self._broker_down_since,
            )
        self._broker_down_since = None
        self._failures = 0

    def _default_waker(self) -> Waker:
        if self._is_postgres:
            try:
                return PostgresWaker(self.engine)
            except Exception:
                logger.warning("LISTEN unavailable; the relay polls", exc_info=True)
        return EventWaker()


def _cause(exc: BaseException) -> str:
    """What went wrong, without advice meant for someone else (a producer's "enqueue again")."""
    what = getattr(exc, "what", None)
    if isinstance(what, str):
        return what
    if isinstance(exc, sa.exc.SQLAlchemyError):
        return describe_database_error(exc)
    return str(exc)
