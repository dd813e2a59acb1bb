"""Checks the supervisor makes once before any worker process starts.

* A task's time limit longer than the broker's consumer timeout is warned about (the broker
  would close the channel under a long task); on RabbitMQ 4.3+ the timeout quorum queues'
  consumers ask for is logged instead (:mod:`taskq.worker.consumer_timeout`).
* Idempotent tasks need ``taskq_processed``: checked (on SQLite, created) here once, rather
  than raced for by every process; missing, it is a :class:`ConfigurationError` that says
  how to create it.
* ``taskq worker -Q`` names only queues the app knows (:func:`check_known_queues`), checked
  before anything is declared: a typo would otherwise create a queue and its ``.dlq`` and
  wait on it, while the tasks of the queue meant are never run.
"""

from __future__ import annotations

import difflib
import logging
from typing import TYPE_CHECKING

from taskq.broker.topology import Topology
from taskq.db import describe_database_error, missing_tables_message, reach_advice
from taskq.errors import ConfigurationError
from taskq.ordering.keys import partition_queue_name
from taskq.settings import redact_url
from taskq.worker.consumer_timeout import consumer_timeout_warnings, extension_note
from taskq.worker.relay_process import ensure_table

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)


# The flag of ``taskq worker`` that lets a worker consume queues the app's code does not name.
DECLARE_NEW_QUEUES_FLAG = "--declare-new-queues"


def check_known_queues(app: App, queues: tuple[str, ...], *, allow_new: bool = False) -> None:
    """Refuse queues that neither the app's code nor its ordered queues' partitions name.

    Known: :meth:`App.queue_names` (configured queues, the tasks' queues, the default
    queue) and the partition queues of its ordered queues (``ledger.p3``).

    Args:
        app: The worker's app, its task modules imported.
        queues: The queues the worker was asked to consume.
        allow_new: Consume (and so declare) unknown queues anyway, each with a warning: for
            tasks sent there with ``apply_async(queue=...)`` by code this app does not hold.

    Raises:
        ConfigurationError: an unknown queue and ``allow_new`` is false; the message lists
            the known queues and the closest match.
    """
    names = app.queue_names()
    topology = app.topology
    partitions = [p for name in names for p in topology.partition_queues(name)]
    known = set(names) | set(partitions)
    unknown = [queue for queue in queues if queue not in known]
    if not unknown:
        return
    if allow_new:
        for queue in unknown:
            logger.warning(
                "queue %r is not named by app %s's code; declaring and consuming it (%s)",
                queue, app.name, DECLARE_NEW_QUEUES_FLAG,
            )
        return
    it = "it" if len(unknown) == 1 else "them"
    raise ConfigurationError(
        f"{_unknown_queues(unknown, [*names, *partitions])}; app {app.name} knows "
        f"{_known_queues(names, topology)}. A worker would create {it} and wait on {it} "
        "while the tasks of the queue meant are never run, so nothing was declared. Fix -Q, "
        "declare the queue in the app's code (app.queue(name)), or pass "
        f"{DECLARE_NEW_QUEUES_FLAG} to consume a queue the app's code does not name",
        queue=unknown[0],
    )


def _unknown_queues(unknown: list[str], candidates: list[str]) -> str:
    parts = []
    for queue in unknown:
        close = difflib.get_close_matches(queue, candidates, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        parts.append(f"{queue!r}{hint}")
    noun = "queue" if len(unknown) == 1 else "queues"
    return f"unknown {noun} {', '.join(parts)}"


def _known_queues(names: list[str], topology: Topology) -> str:
    described = []
    for name in names:
        count = topology.partitions(name)
        if count:
            first, last = partition_queue_name(name, 0), partition_queue_name(name, count - 1)
            described.append(f"{name} (partitions {first}..{last})")
        else:
            described.append(name)
    return ", ".join(described)


def warn_about_long_time_limits(app: App, queues: tuple[str, ...]) -> None:
    """Log what the broker's consumer timeout means for these queues (after a connect)."""
    for warning in consumer_timeout_warnings(app, queues):
        logger.warning("%s", warning)
    note = extension_note(app, queues)
    if note is not None:
        logger.info("%s", note)


def ensure_idempotency_table(app: App) -> None:
    """Raise :class:`ConfigurationError` when idempotent tasks cannot find their table."""
    if not any(task.options.idempotent for task in app.registry):
        return
    try:
        ready = ensure_table(app, "taskq_processed", "idempotent tasks")
    except ConfigurationError:
        raise  # a URL that cannot work says so itself
    except Exception as exc:  # SQLAlchemy's: unreachable, unknown database, refused login
        raise ConfigurationError(
            f"cannot reach the database {redact_url(app.settings.database_url)} "
            f"(database_url, TASKQ_DATABASE_URL): {describe_database_error(exc)}. The "
            f"worker keeps idempotency keys there: {reach_advice(app.settings.database_url)}"
        ) from exc
    finally:
        app.close()  # no pooled connection may be inherited by a process
    if not ready:
        raise ConfigurationError(
            missing_tables_message(app.settings.database_url, ["taskq_processed"])
            + " (idempotent tasks keep their keys there)"
        )
