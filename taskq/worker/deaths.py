"""The death ledger: which messages killed a worker process, and how.

When a worker process dies holding a message, the broker redelivers that message -- possibly
to a process that dies the same way. To break such a crash loop the supervisor records each
death in a small state directory (one file per delivery key: the message id, or a digest
of the message when it has no id; see :func:`taskq.worker.time_limits.delivery_key`), and
a worker process that gets a *redelivered* message looks it up there: after
``max_process_deaths`` deaths the message goes to ``Q.dlq`` instead of running again, and a
hard time-limit kill counts as a failed attempt under the task's retry policy (a delayed
retry, or ``Q.dlq`` when none is left).

Counts live per supervisor (the directory is created at start and removed at exit): two
``taskq worker`` commands on one queue each count only the deaths of their own processes, so
a poison message may run up to ``max_process_deaths`` times per supervisor.

File names are a hash of the key, never the id itself, which comes from the network.
Methods take the key as ``bytes``, or a message id as ``str`` (the key of that id).
Only the supervisor writes (atomically, via rename); worker processes read and delete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

from taskq.worker.time_limits import message_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeathRecord:
    """What the supervisor saw of a message's processes.

    Args:
        deaths: How many worker processes died while holding the message.
        time_limit_s: Set when the last death was a hard time-limit kill: the limit (with
            ``by_broker``: how long the delivery had been held).
        by_broker: The last death ended a run whose delivery the broker had taken back
            (RabbitMQ 4.3's consumer timeout on a quorum queue).
    """

    deaths: int
    time_limit_s: float | None = None
    by_broker: bool = False


class DeathLedger:
    """Death records of one supervisor, kept as files in ``directory``.

    Args:
        directory: The supervisor's state directory (see :meth:`create`).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @classmethod
    def create(cls) -> DeathLedger:
        """Make a fresh private state directory."""
        return cls(tempfile.mkdtemp(prefix="taskq-worker-"))

    def remove(self) -> None:
        """Delete the state directory and every record in it."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def record_death(
        self, message_id: bytes | str, *, time_limit_s: float | None = None,
        by_broker: bool = False,
    ) -> DeathRecord:
        """Count one more death for ``message_id`` (supervisor only).

        Args:
            message_id: The delivery key of the message the dead process held (or its id).
            time_limit_s: The hard limit, when the supervisor killed it for running past it.
            by_broker: The kill ended a run the broker had taken the delivery back from.

        Returns:
            The updated record.
        """
        previous = self.read(message_id)
        record = DeathRecord(
            deaths=(previous.deaths if previous else 0) + 1, time_limit_s=time_limit_s,
            by_broker=by_broker,
        )
        path = self._path(message_id)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"deaths": record.deaths, "time_limit_s": record.time_limit_s,
                       "by_broker": record.by_broker}, file)
        os.replace(temporary, path)
        return record

    def read(self, message_id: bytes | str) -> DeathRecord | None:
        """Return the record of ``message_id``, or ``None`` if no process died holding it."""
        try:
            with open(self._path(message_id), encoding="utf-8") as file:
                data = json.load(file)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            logger.warning("unreadable death record for message %r", message_id, exc_info=True)
            return None
        return DeathRecord(deaths=int(data["deaths"]), time_limit_s=data.get("time_limit_s"),
                           by_broker=bool(data.get("by_broker")))

    def forget(self, message_id: bytes | str) -> None:
        """Drop the record of ``message_id`` (after it was dead-lettered)."""
        try:
            os.unlink(self._path(message_id))
        except FileNotFoundError:
            pass

    def _path(self, message_id: bytes | str) -> str:
        key = message_key(message_id) if isinstance(message_id, str) else message_id
        digest = hashlib.sha256(key).hexdigest()
        return os.path.join(self.directory, digest[:32])
