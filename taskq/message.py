"""The envelope of a task and its AMQP form: wire protocol v1 (docs/PROTOCOL.md).

:class:`Envelope` is what taskq code works with; :class:`WireMessage` is what travels: a
body (see :mod:`taskq.codec`), a few AMQP properties and ``taskq-*`` headers. It stays
broker-neutral: the publisher turns it into ``pika.BasicProperties`` (``delivery_mode=2``).
:func:`encode` and :func:`decode` convert between the two and sit on the hot path, so they
do a handful of dict operations and nothing else.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, NoReturn

from taskq.codec import decode_body, encode_body
from taskq.errors import ConfigurationError, DecodeError

PROTOCOL_VERSION = 1
CONTENT_TYPE = "application/x-msgpack"

# Headers of every task message.
TASKQ_VERSION = "taskq-v"
TASK = "taskq-task"
RETRIES = "taskq-retries"
IDEMPOTENCY_KEY = "taskq-idempotency-key"
ETA = "taskq-eta"
# Ordered queues: the key whose tasks run in order (its hash picks the partition).
ORDERING_KEY = "taskq-ordering-key"

# Informational headers of a periodic task's run (taskq.schedules): the schedule's name and
# the tick's time (ISO 8601 UTC).
SCHEDULE = "taskq-schedule"
SCHEDULE_TICK = "taskq-schedule-tick"

# Set on the members of a workflow (chain, group, chord): the workflow id (taskq.workflows).
WORKFLOW = "taskq-workflow"

# Headers a dead letter adds (see dead_letter_headers).
ERROR_TYPE = "taskq-error-type"
ERROR = "taskq-error"
TRACEBACK = "taskq-traceback"
ATTEMPTS = "taskq-attempts"
FAILED_AT = "taskq-failed-at"
ORIGIN_QUEUE = "taskq-origin-queue"

# Set by RabbitMQ on each dead-lettering; never republished (docs/delays.md).
X_DEATH = "x-death"
_X_DEATH_PREFIXES = ("x-first-death-", "x-last-death-")

ENVELOPE_HEADERS = frozenset({TASKQ_VERSION, TASK, RETRIES, IDEMPOTENCY_KEY, ETA})
DEAD_LETTER_HEADERS = (ERROR_TYPE, ERROR, TRACEBACK, ATTEMPTS, FAILED_AT, ORIGIN_QUEUE)

MAX_PRIORITY = 9
# Highest taskq-retries read: one more (the next retry, taskq-attempts) still fits any
# AMQP integer type, and no retry policy counts that far.
MAX_RETRIES = 2**31 - 2
# Longest idempotency key: the width of taskq_processed.key (taskq.schema).
KEY_MAX_CHARS = 255
# Error messages can be huge (a repr of a large object); headers must fit in one AMQP frame.
ERROR_MAX_CHARS = 1000

# A random UUID's variant digit: "10" then two random bits (RFC 4122), from any hex digit.
_UUID4_VARIANT_DIGIT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MILLISECOND = timedelta(milliseconds=1)


# Not frozen: a frozen dataclass sets each field through object.__setattr__, which costs
# about 1 µs per message on the enqueue hot path (benchmarks/README.md). Treat both as
# immutable; copy with dataclasses.replace or WireMessage.with_headers.
@dataclass(slots=True)
class WireMessage:
    """One message as it goes over AMQP, independent of the client library.

    Args:
        body: The msgpack body.
        message_id: The task id (AMQP ``message_id``).
        headers: AMQP headers: ``taskq-*`` and any extra ones.
        priority: AMQP priority, 0..9.
        timestamp: AMQP timestamp, epoch seconds.
        app_id: Name of the app that published the message.
        content_type: ``application/x-msgpack`` for taskq messages.
    """

    body: bytes
    message_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None
    timestamp: int | None = None
    app_id: str | None = None
    content_type: str | None = None

    def with_headers(self, headers: dict[str, Any]) -> WireMessage:
        """The same message (body and properties) with ``headers`` instead of its own."""
        return WireMessage(
            self.body,
            self.message_id,
            headers,
            self.priority,
            self.timestamp,
            self.app_id,
            self.content_type,
        )


@dataclass(slots=True)
class Envelope:
    """One task call: what to run, with which arguments, and its delivery metadata.

    Args:
        task_id: Unique id of this call (a UUID string); the AMQP ``message_id``.
        task: Registered task name.
        args: Positional arguments.
        kwargs: Keyword arguments.
        priority: 0 (lowest) to 9.
        retries: Retries already done; 0 on the first run.
        idempotency_key: Key recorded once the task succeeded; ``None`` means the task id.
            :func:`decode` always fills it in.
        eta: Aware datetime before which the task must not run, or ``None``.
        timestamp: Epoch seconds when the call was made; :func:`encode` uses the current
            time when ``None``.
        app_id: Name of the publishing app.
        headers: Extra application headers, carried unchanged.
    """

    task_id: str
    task: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    retries: int = 0
    idempotency_key: str | None = None
    eta: datetime | None = None
    timestamp: int | None = None
    app_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)


def new_task_id() -> str:
    """A new task id: what ``str(uuid.uuid4())`` gives (same source, ``os.urandom``; same
    bits; same text), without building a ``UUID`` object."""
    return new_task_ids(1)[0]


def new_task_ids(count: int) -> list[str]:
    """``count`` new task ids (see :func:`new_task_id`) from one ``os.urandom`` call."""
    h = os.urandom(16 * count).hex()
    variant = _UUID4_VARIANT_DIGIT
    # Version digit 4; the variant digit keeps its two low random bits under "10" (8, 9, a, b).
    return [
        f"{h[i:i + 8]}-{h[i + 8:i + 12]}-4{h[i + 13:i + 16]}-{variant[h[i + 16]]}"
        f"{h[i + 17:i + 20]}-{h[i + 20:i + 32]}"
        for i in range(0, 32 * count, 32)
    ]


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while many envelopes and messages are built at once.

    Each task call allocates a handful of container objects (envelope, argument list,
    header dicts, message), so building thousands triggers a young-generation collection
    every few hundred calls: about a third of the CPU of building an envelope (2.7 of
    7.5 µs, benchmarks/README.md). Nothing built here is garbage; collection resumes (if it
    was on) when the block ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# -- encode -----------------------------------------------------------------------------------


def encode(envelope: Envelope) -> WireMessage:
    """Turn an envelope into the message to publish.

    Extra headers are copied, minus RabbitMQ's ``x-death`` family: a republished message must
    not carry them (RabbitMQ before 4.0.1 drops messages whose ``x-death`` shows a cycle).

    Args:
        envelope: The task call.

    Returns:
        The wire message, with ``content_type`` set and ``timestamp`` filled in.

    Raises:
        ConfigurationError: The priority is not an int in 0..9, ``eta`` is naive, or an extra
            header uses a name taskq reserves.
        SerializationError: An argument cannot be encoded (nothing must be published).
    """
    priority = envelope.priority
    if priority.__class__ is not int or not 0 <= priority <= MAX_PRIORITY:
        raise ConfigurationError(
            f"task {envelope.task!r}: priority must be an int from 0 to {MAX_PRIORITY}, "
            f"got {priority!r}",
            task=envelope.task,
            task_id=envelope.task_id,
        )
    body = encode_body(envelope.args, envelope.kwargs, task=envelope.task)
    headers = _extra_headers(envelope) if envelope.headers else {}
    headers[TASKQ_VERSION] = PROTOCOL_VERSION
    headers[TASK] = envelope.task
    headers[RETRIES] = envelope.retries
    headers[IDEMPOTENCY_KEY] = envelope.idempotency_key or envelope.task_id
    if envelope.eta is not None:
        headers[ETA] = _eta_ms(envelope)
    timestamp = envelope.timestamp
    # Positional (field order) because keywords cost a measurable share of this hot path.
    return WireMessage(
        body,
        envelope.task_id,
        headers,
        priority,
        int(time.time()) if timestamp is None else timestamp,
        envelope.app_id,
        CONTENT_TYPE,
    )


def _extra_headers(envelope: Envelope) -> dict[str, Any]:
    reserved = ENVELOPE_HEADERS.intersection(envelope.headers)
    if reserved:
        raise ConfigurationError(
            f"task {envelope.task!r}: header {sorted(reserved)[0]!r} is reserved by taskq; "
            "give the extra header another name",
            task=envelope.task,
            task_id=envelope.task_id,
        )
    headers = strip_x_death(envelope.headers)
    for name, value in headers.items():
        problem = _ROUTING_HEADERS.get(name) or _header_problem(name, value)
        if problem:
            raise ConfigurationError(
                f"task {envelope.task!r}: header {str(name)[:60]!r} {problem}",
                task=envelope.task,
                task_id=envelope.task_id,
            )
    return headers


# Top-level headers RabbitMQ reads itself (sender-selected distribution): extra routing keys
# the message is copied to, refused with a channel-closing 406 unless an array of strings.
# taskq routes each message to one queue (and drops both from every copy it republishes),
# so it refuses them at the call rather than let the publish fail or copy the task.
_ROUTING_HEADERS = {
    name: (
        f"is read by RabbitMQ itself as extra routing keys (sender-selected distribution: "
        f"{name} must be an array of strings, and would copy the task to other queues); "
        "taskq sends each task to one queue, so give the header another name"
    )
    for name in ("CC", "BCC")
}

# What an AMQP field table carries (RabbitMQ's field types as pika writes them).
_HEADER_SCALARS = (str, bytes, bool, int, Decimal, datetime, type(None))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _header_problem(name: object, value: object, depth: int = 0) -> str | None:
    """Why ``name: value`` cannot travel as an AMQP header, or ``None`` when it can."""
    if not isinstance(name, str):
        return "has a name that is not a str"
    if len(name.encode()) > 255:
        return "has a name longer than 255 bytes (AMQP short string); shorten it"
    if depth > 20:
        return "nests deeper than 20 levels"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _header_problem(key, item, depth + 1)
            if problem:
                return f"holds a field {str(key)[:60]!r} that {problem}"
        return None
    if isinstance(value, list):
        for item in value:
            problem = _header_problem("item", item, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, int) and not isinstance(value, bool) and not (
        _INT64_MIN <= value <= _INT64_MAX
    ):
        return "holds an int outside the signed 64-bit range; send it as a str"
    if not isinstance(value, _HEADER_SCALARS):
        return (
            f"holds a {type(value).__name__}, which AMQP headers cannot carry; use str, "
            "bytes, bool, int, Decimal, datetime, None, or lists and dicts of them"
        )
    return None


def _eta_ms(envelope: Envelope) -> int:
    eta = envelope.eta
    if eta is None or eta.utcoffset() is None:
        raise ConfigurationError(
            f"task {envelope.task!r}: eta {eta!r} is a naive datetime; pass an aware one, "
            "e.g. datetime.now(timezone.utc) + timedelta(minutes=5)",
            task=envelope.task,
            task_id=envelope.task_id,
        )
    return (eta - _EPOCH) // _MILLISECOND


# -- decode -----------------------------------------------------------------------------------


def decode(wire: WireMessage) -> Envelope:
    """Read a received message back into an envelope.

    A missing ``taskq-retries`` means 0 and a missing ``taskq-idempotency-key`` means the task
    id. Unknown headers (including ``x-death``) land in ``Envelope.headers``. A priority above
    9 is read as 9, as RabbitMQ itself treats priorities above a queue's maximum.

    Args:
        wire: The message as received.

    Returns:
        The envelope.

    Raises:
        DecodeError: The message is not a taskq v1 message or is malformed; ``reason`` says
            why in words, ``task_id`` and ``task`` are set when they could be read.
    """
    task_id = wire.message_id
    extra = dict(wire.headers) if wire.headers else {}
    # pop() reads each envelope header and leaves exactly the extra ones behind.
    version = extra.pop(TASKQ_VERSION, None)
    task = extra.pop(TASK, None)
    retries = extra.pop(RETRIES, 0)
    key = extra.pop(IDEMPOTENCY_KEY, None)
    eta_ms = extra.pop(ETA, None)
    if version.__class__ is not int and not _is_int(version) or version != PROTOCOL_VERSION:
        _reject_version(version, task_id)
    if task.__class__ is not str or not task:
        _reject(f"header {TASK} is {_describe(task)}, expected the task name", task_id, None)
    if task_id.__class__ is not str or not task_id:
        _reject("the message_id property (the task id) is missing", None, task)
    if retries.__class__ is not int:
        if not _is_int(retries):
            _reject(f"header {RETRIES} is {_describe(retries)}, expected an int >= 0", task_id,
                    task)
        retries = int(retries)
    if not 0 <= retries <= MAX_RETRIES:
        _reject(f"header {RETRIES} is {_describe(retries)}, expected an int >= 0 (at most "
                f"{MAX_RETRIES})", task_id, task)
    if key is None:
        key = task_id
    elif key.__class__ is not str:
        _reject(f"header {IDEMPOTENCY_KEY} is {_describe(key)}, expected a str", task_id, task)
    if len(key) > KEY_MAX_CHARS or "\x00" in key:
        _reject_key(key, task_id, task)
    if wire.content_type not in (CONTENT_TYPE, None):
        _reject(f"content type is {wire.content_type!r}, expected {CONTENT_TYPE!r}", task_id, task)
    try:
        args, kwargs = decode_body(wire.body)
    except DecodeError as exc:
        # Same error, now naming the message and the task.
        _reject(getattr(exc, "reason", str(exc)), task_id, task)
    priority = wire.priority or 0
    eta = None if eta_ms is None else _eta_from_ms(eta_ms, task_id, task)
    # Positional (field order) because keywords cost a measurable share of this hot path.
    return Envelope(
        task_id,
        task,
        args,
        kwargs,
        priority if priority <= MAX_PRIORITY else MAX_PRIORITY,
        retries,
        key,
        eta,
        wire.timestamp,
        wire.app_id,
        extra,
    )


def _is_int(value: Any) -> bool:
    # Any AMQP integer type: pika reads a long-long ("l") as its own int subclass. Not bool.
    return isinstance(value, int) and value.__class__ is not bool


def _eta_from_ms(eta_ms: Any, task_id: str, task: str) -> datetime:
    # pika reads an AMQP long-long (epoch ms do not fit in 32 bits) as its own int subclass.
    if isinstance(eta_ms, int) and eta_ms.__class__ is not bool:
        try:
            return _EPOCH + int(eta_ms) * _MILLISECOND
        except OverflowError:
            pass
    _reject(f"header {ETA} is {_describe(eta_ms)}, expected epoch milliseconds", task_id, task)


def _reject_key(key: str, task_id: str, task: str) -> NoReturn:
    # The key is written to taskq_processed; a key the table cannot hold would make every
    # delivery of the message fail there and return to the queue forever.
    problem = (
        f"is {len(key)} characters long, more than the {KEY_MAX_CHARS} the idempotency table "
        "holds" if len(key) > KEY_MAX_CHARS else "contains a NUL character"
    )
    _reject(
        f"the idempotency key (header {IDEMPOTENCY_KEY}, else the message_id) {problem}",
        task_id, task,
    )


def _reject_version(version: Any, task_id: str | None) -> NoReturn:
    if version is None:
        reason = f"header {TASKQ_VERSION} is missing: not a taskq message"
    else:
        reason = (
            f"unsupported protocol version {version!r} in header {TASKQ_VERSION}; "
            f"this worker reads version {PROTOCOL_VERSION}"
        )
    _reject(reason, task_id, None)


def _reject(reason: str, task_id: str | None, task: str | None) -> NoReturn:
    raise DecodeError(
        f"message {task_id or '(no id)'} cannot be decoded: {reason}",
        reason=reason,
        task_id=task_id,
        task=task,
    )


def _describe(value: Any) -> str:
    if value is None:
        return "missing"
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({type(value).__name__})"


# -- dead letters and republishing ----------------------------------------------------------


def strip_x_death(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Copy headers without ``x-death``, ``x-first-death-*`` and ``x-last-death-*``.

    Use it for every republish (retry, delay hop, replay): RabbitMQ before 4.0.1 silently
    drops a message whose ``x-death`` shows a dead-letter cycle.

    Args:
        headers: AMQP headers, or ``None``.

    Returns:
        A new dict.
    """
    if not headers:
        return {}
    return {
        name: value
        for name, value in headers.items()
        if name != X_DEATH
        and not (name.__class__ is str and name.startswith(_X_DEATH_PREFIXES))
    }
