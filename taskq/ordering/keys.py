"""Ordering keys and partitions: the fixed hash, the partition queue names. Pure, no I/O.

The partition of a key is ``crc32(key.encode("utf-8")) % partitions`` (zlib's CRC-32, the
one of zip, PNG and Ethernet: every language has it), so a producer in another language can
route exactly as taskq does. Python's ``hash()`` is salted per process and must not be used.
"""

from __future__ import annotations

import re
import uuid
import zlib
from typing import Any

from taskq.errors import ConfigurationError

#: Most partitions one ordered queue may have.
MAX_PARTITIONS = 1024
#: Declare argument holding the partition count, so that a changed count meets the
#: broker's PRECONDITION_FAILED instead of silently re-spreading the keys.
PARTITIONS_ARGUMENT = "x-taskq-partitions"
#: Longest ordering key, in characters (it travels as an AMQP header and a table column).
KEY_MAX_CHARS = 255

_PARTITION_RE = re.compile(r"^(?P<queue>.+)\.p(?P<index>0|[1-9][0-9]*)$")


def validate_partitions(partitions: int, *, max_priority: int | None = None) -> int:
    """Return ``partitions`` if it is an int in 1..MAX_PARTITIONS, else raise.

    An ordered queue has no priorities: a message with a higher priority would overtake
    earlier ones of its key.
    """
    if max_priority is not None:
        raise ConfigurationError(
            "an ordered queue (partitions=...) has no priorities: a message with a higher "
            "priority would overtake earlier ones of its key; drop max_priority"
        )
    if (
        not isinstance(partitions, int)
        or isinstance(partitions, bool)
        or not 1 <= partitions <= MAX_PARTITIONS
    ):
        raise ConfigurationError(
            f"partitions must be an int from 1 to {MAX_PARTITIONS}, not {partitions!r}"
        )
    return partitions


def partition_of(key: str, partitions: int) -> int:
    """The partition (0-based) of ordering key ``key`` among ``partitions``."""
    return zlib.crc32(key.encode("utf-8")) % partitions


def partition_queue_name(queue: str, index: int) -> str:
    """The name of partition ``index`` of the ordered queue ``queue``: ``queue.p<index>``."""
    return f"{queue}.p{index}"


def split_partition_queue(name: str) -> tuple[str, int] | None:
    """``("ledger", 3)`` for ``"ledger.p3"``; ``None`` if ``name`` is not shaped so."""
    match = _PARTITION_RE.match(name)
    if match is None:
        return None
    return match["queue"], int(match["index"])


def normalize_key(value: Any, *, task: str, queue: str) -> str:
    """An ordering key as the ``str`` that is hashed and sent.

    ``str`` keys are used as they are; ``int`` and ``uuid.UUID`` values (account ids) become
    their ``str()``, so ``42`` and ``"42"`` are the same key.

    Raises:
        ConfigurationError: another type, an empty key or one longer than 255 characters.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, uuid.UUID)):
        raise ConfigurationError(
            f"task {task!r} for ordered queue {queue!r}: the ordering key must be a str, int "
            f"or UUID, not {type(value).__name__}",
            task=task, queue=queue,
        )
    key = value if isinstance(value, str) else str(value)
    if not key or len(key) > KEY_MAX_CHARS:
        raise ConfigurationError(
            f"task {task!r} for ordered queue {queue!r}: the ordering key must have 1 to "
            f"{KEY_MAX_CHARS} characters, got {len(key)}",
            task=task, queue=queue,
        )
    return key

