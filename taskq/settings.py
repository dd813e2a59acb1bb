"""Settings: the one home of every default.

Precedence, lowest first:

1. the defaults below;
2. ``TASKQ_<SETTING>`` environment variables (``TASKQ_BROKER_URL``, ``TASKQ_PREFETCH_COUNT``...);
3. values given in code (``App(..., prefetch_count=32)``, or what contrib reads from Flask or
   Django configuration);
4. command-line flags (``taskq worker --prefetch 64``).

Units are in the names: ``_s`` is float seconds, ``_bytes`` a size. Unknown names and
values of the wrong type raise :class:`~taskq.errors.ConfigurationError` when the App is
built, never later.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from taskq.errors import ConfigurationError

ENV_PREFIX = "TASKQ_"
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
# The delayed-message plugin's limit (2**32 - 1 ms); the delay tiers hold longer.
_MAX_DELAY_HORIZON_S = (2**32 - 1) / 1000


@dataclass(frozen=True)
class Settings:
    """Validated, immutable configuration of one App.

    Build it with :meth:`Settings.load`, which applies environment variables and overrides.
    """

    # Prefix of every exchange and queue taskq declares (docs/PROTOCOL.md, Topology).
    namespace: str = "taskq"
    # AMQP URL of RabbitMQ, or several nodes of one cluster separated by ";" (a list in
    # code is joined so); the password never appears in logs or errors.
    broker_url: str = "amqp://guest:guest@localhost:5672/%2F"
    # SQLAlchemy URL for the outbox, idempotency and result tables.
    database_url: str = "sqlite:///taskq.sqlite3"
    # Queue of tasks that do not name one.
    default_queue: str = "default"
    # Type of work queues not configured with app.queue(): "classic" or "quorum"
    # (replicated over a cluster's nodes; no message priorities).
    default_queue_type: str = "classic"
    # x-max-priority of classic queues; message priorities are 0..9.
    default_max_priority: int = 10
    # Largest encoded body accepted at enqueue and by the worker.
    max_message_size_bytes: int = 1024 * 1024
    # How long one publish attempt waits for the broker's confirm.
    publish_confirm_timeout_s: float = 10.0
    # How long a publish keeps trying (a nack, a connection lost before the confirm, a
    # confirm timeout: the same message id again, on another node if need be) before
    # PublishError. Covers a quorum queue's leader election and a node's failover.
    publish_timeout_s: float = 20.0
    # TCP connect and AMQP handshake timeout.
    connect_timeout_s: float = 5.0
    # AMQP heartbeat negotiated with the broker; the worker's I/O thread keeps it alive.
    heartbeat_s: int = 60
    # Give up on a connection the broker keeps blocked (memory or disk alarm) this long.
    blocked_connection_timeout_s: float = 60.0
    # Worker processes per `taskq worker`; 0 means one per CPU core.
    worker_processes: int = 0
    # Unacked messages each worker process may hold (basic_qos prefetch_count).
    prefetch_count: int = 16
    # Replace a worker process after it ran this many tasks; 0 means never.
    max_tasks_per_child: int = 0
    # Warm shutdown: how long running tasks may take to finish after SIGTERM.
    shutdown_timeout_s: float = 30.0
    # A message that killed its worker process this many times goes to Q.dlq.
    max_process_deaths: int = 3
    # The broker's consumer_timeout; tasks with a longer time limit are warned about.
    consumer_timeout_s: float = 1800.0
    # Longest traceback text kept in a dead letter's taskq-traceback header.
    traceback_max_chars: int = 4000
    # Retries a failing task gets after its first run (task option max_retries); 0 = none.
    task_max_retries: int = 3
    # Exponential backoff base: retry n (0-based) waits task_retry_backoff_s * 2**n.
    task_retry_backoff_s: float = 1.0
    # Upper bound of one retry's backoff delay.
    task_retry_backoff_max_s: float = 600.0
    # Draw each backoff from [delay/2, delay] so tasks that failed together spread out.
    task_retry_jitter: bool = True
    # Upper bound of the exponential reconnect backoff.
    reconnect_max_delay_s: float = 30.0
    # Outbox rows the relay claims and publishes per transaction.
    outbox_batch_size: int = 200
    # Safety-net poll of an idle relay (PostgreSQL LISTEN/NOTIFY wakes it sooner).
    outbox_poll_interval_s: float = 1.0
    # Upper bound of the backoff of a row (or a broker) that keeps failing.
    outbox_retry_max_s: float = 60.0
    # Keep every task's state and result in taskq_results (tasks may opt in one by one).
    store_results: bool = False
    # Record what each worker saw happen to every task in taskq_task_states (written in
    # batches off the task's path; read by `taskq inspect` and the dashboard).
    track_task_states: bool = True
    # How often a worker process writes the task states it gathered (one upsert each time).
    task_states_flush_s: float = 1.0
    # Idempotency keys older than this are deleted by `taskq db prune` (7 days).
    processed_retention_s: float = 7 * 24 * 3600.0
    # How delayed messages wait: "auto" (the delayed-message plugin when the broker has it
    # enabled, else tiers), "plugin" or "tiers" (see taskq.delay and docs/delays.md).
    delay_backend: str = "auto"
    # Queue type of the delay tiers: "classic", or "quorum" to replicate delayed messages.
    # Unset (""), it follows default_queue_type: an app whose work queues are quorum gets
    # replicated tiers too.
    delay_tier_queue_type: str = ""
    # Outbox rows due further ahead than this stay in the database; nearer ones are handed
    # to the delay backend by the relay.
    outbox_delay_horizon_s: float = 3600.0
    # Periodic tasks (taskq beat): a tick the scheduler reaches later than this was missed,
    # and the schedule's missed= policy decides ("once", "skip" or "all").
    beat_grace_s: float = 1.0
    # missed="all" enqueues at most this many missed runs per schedule (the newest).
    beat_max_catchup_runs: int = 100
    # How often a scheduler refreshes its taskq_schedulers row; on SQLite another one may
    # take over after three heartbeats without one.
    beat_heartbeat_s: float = 5.0
    # Comma-separated names the dashboard answers besides its address and localhost (rebinding).
    dashboard_allowed_hosts: str = ""
    # Tests only: run each enqueued task in-process, synchronously, after the same encoding
    # and decoding as in production (outbox enqueues run when their transaction commits).
    # See taskq.testing.
    task_always_eager: bool = False

    def __post_init__(self) -> None:
        given: object = self.broker_url  # a list or tuple in code
        if isinstance(given, (list, tuple)):
            object.__setattr__(self, "broker_url", _join_urls(given))
        # Not a field: whether delay_tier_queue_type was left to follow default_queue_type.
        object.__setattr__(self, "_tiers_follow", not self.delay_tier_queue_type)
        if not self.delay_tier_queue_type:
            object.__setattr__(self, "delay_tier_queue_type", self.default_queue_type)
        _validate(self)

    @property
    def broker_urls(self) -> list[str]:
        """Every node of ``broker_url``, in the order given."""
        return split_urls(self.broker_url)

    @classmethod
    def names(cls) -> frozenset[str]:
        """Return the names of every setting."""
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Settings:
        """Build settings from defaults, ``TASKQ_*`` variables and ``overrides``.

        Args:
            overrides: Values given in code; ``None`` values are ignored.
            environ: The environment to read (``os.environ`` when omitted).

        Raises:
            ConfigurationError: an unknown name or a value that cannot be converted.
        """
        environ = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - cls.names())
        if unknown:
            raise ConfigurationError(
                f"unknown taskq setting(s): {', '.join(unknown)}; "
                f"known settings are: {', '.join(sorted(cls.names()))}",
                settings=unknown,
            )
        values: dict[str, Any] = {}
        for field in fields(cls):
            raw = environ.get(ENV_PREFIX + field.name.upper())
            if raw is not None and raw != "":
                values[field.name] = _convert(field.name, raw, type(field.default))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied (``None`` values are ignored)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = sorted(set(changes) - self.names())
        if unknown:
            raise ConfigurationError(f"unknown taskq setting(s): {', '.join(unknown)}")
        if getattr(self, "_tiers_follow", False):
            changes.setdefault("delay_tier_queue_type", "")  # keeps following
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        parts = []
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_url"):
                value = redact_url(value)
            parts.append(f"{field.name}={value!r}")
        return f"Settings({', '.join(parts)})"


# Where the next of several ';'-separated URLs starts (a ';' inside a password does not).
_NEXT_URL_RE = re.compile(r";(?=\s*[A-Za-z][A-Za-z0-9+.\-]*://)")
# A query parameter whose name says it holds a secret, and its value: up to the next
# parameter that has a name and a '=' (an unescaped '&' in the secret does not end it).
_SECRET_PARAM_RE = re.compile(
    r"(?P<name>[?&;][^=&;#?]*(?:pass|pwd|secret|token)[^=&;#?]*=)"
    r"(?P<value>.*?)(?=[&;][^=&;#?]+=|$)",
    re.IGNORECASE | re.DOTALL,
)
_MASK = "***"


def split_urls(url: str) -> list[str]:
    """Split a ``;``-separated list of full URLs (a ``;`` inside a password does not split).

    Blanks around each URL and empty entries (a trailing ``;``) are dropped.
    """
    parts = (part.strip().rstrip(";").strip() for part in _NEXT_URL_RE.split(url))
    return [part for part in parts if part]


def _join_urls(urls: list[str] | tuple[str, ...]) -> str:
    if not urls or not all(isinstance(url, str) and url.strip() for url in urls):
        raise ConfigurationError(
            "broker_url given as a list must hold at least one non-empty URL string, e.g. "
            "['amqp://user:password@rabbit1:5672/%2F', 'amqp://user:password@rabbit2:5672/%2F']",
            settings=["broker_url"],
        )
    for url in urls:
        if len(split_urls(url)) != 1:
            raise ConfigurationError(
                f"broker_url list entry {redact_url(url)!r} holds several URLs; give one "
                "URL per entry", settings=["broker_url"],
            )
    return ";".join(url.strip() for url in urls)


def redact_url(url: str) -> str:
    """Return ``url`` with every password replaced by ``***`` (for logs, errors and status).

    Masks the password of the user info, whatever characters it holds (SQLAlchemy accepts
    an unescaped ``/``, ``?`` or ``#`` there), and the value of every query parameter named
    like a secret (``password``, ``passwd``, ``pwd``, ``*token*``, ``*secret*``). Several URLs
    separated by ``;`` (a multi-node ``broker_url``) are masked one by one. Where the end of
    a password is ambiguous, more is masked, never less.
    """
    return ";".join(_redact_one(part) for part in _NEXT_URL_RE.split(url))


def _redact_one(url: str) -> str:
    scheme, separator, rest = url.partition("://")
    if not separator:
        return _mask_secret_params(url)
    at = rest.find("@")
    if at >= 0:
        # The user info ends at the last '@' before the query or fragment that follows the
        # first '@': a password may hold '/', '?', '#' or '@', a host never holds '@'.
        query_at = min((i for i in (rest.find("?", at), rest.find("#", at)) if i >= 0),
                       default=len(rest))
        at = rest.rfind("@", 0, query_at)
        user, colon, _ = rest[:at].partition(":")
        userinfo = f"{user}:{_MASK}" if colon else user
        rest = f"{userinfo}@{rest[at + 1:]}"
    return f"{scheme}://{_mask_secret_params(rest)}"


def _mask_secret_params(text: str) -> str:
    return _SECRET_PARAM_RE.sub(lambda match: match["name"] + _MASK, text)


def _convert(name: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(raw)
            return lowered in {"1", "true", "yes", "on"}
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return raw
    except ValueError:
        raise ConfigurationError(
            f"environment variable {ENV_PREFIX}{name.upper()}={raw!r} is not a valid "
            f"{kind.__name__}",
            settings=[name],
        ) from None


def _validate(settings: Settings) -> None:
    for field in fields(settings):
        value = getattr(settings, field.name)
        expected = type(field.default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(settings, field.name, float(value))
            continue
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigurationError(
                f"setting {field.name} must be {expected.__name__}, got {value!r}",
                settings=[field.name],
            )
    if not _NAMESPACE_RE.match(settings.namespace):
        raise ConfigurationError(
            f"namespace {settings.namespace!r} may use only letters, digits, '_' and '-'"
        )
    _validate_broker(settings)  # default_queue_type first: the tiers may follow it
    _validate_delays(settings)
    if not 1 <= settings.default_max_priority <= 255:
        raise ConfigurationError("default_max_priority must be between 1 and 255")
    positive = (
        "max_message_size_bytes",
        "prefetch_count",
        "max_process_deaths",
        "heartbeat_s",
        "outbox_batch_size",
        "beat_max_catchup_runs",
    )
    for name in positive:
        if getattr(settings, name) < 1:
            raise ConfigurationError(f"setting {name} must be at least 1")
    non_negative = (
        "worker_processes",
        "max_tasks_per_child",
        "shutdown_timeout_s",
        "publish_confirm_timeout_s",
        "publish_timeout_s",
        "connect_timeout_s",
        "outbox_poll_interval_s",
        "task_states_flush_s",
        "outbox_retry_max_s",
        "outbox_delay_horizon_s",
        "task_max_retries",
        "task_retry_backoff_s",
        "task_retry_backoff_max_s",
        "beat_grace_s",
    )
    for name in non_negative:
        if getattr(settings, name) < 0:
            raise ConfigurationError(f"setting {name} must not be negative")
    if settings.beat_heartbeat_s <= 0:
        raise ConfigurationError("setting beat_heartbeat_s must be positive")


def _validate_broker(settings: Settings) -> None:
    urls = split_urls(settings.broker_url)
    if not urls:
        raise ConfigurationError("broker_url is empty", settings=["broker_url"])
    for url in urls:
        if not url.lower().startswith(("amqp://", "amqps://")):
            raise ConfigurationError(
                f"broker_url entry {redact_url(url)!r} is not an AMQP URL; give full "
                "amqp:// or amqps:// URLs, several nodes separated by ';'",
                settings=["broker_url"],
            )
    if settings.default_queue_type not in ("classic", "quorum"):
        raise ConfigurationError(
            "default_queue_type must be 'classic' or 'quorum', not "
            f"{settings.default_queue_type!r}",
            settings=["default_queue_type"],
        )


def _validate_delays(settings: Settings) -> None:
    if settings.delay_backend not in ("auto", "plugin", "tiers"):
        raise ConfigurationError(
            f"delay_backend must be 'auto', 'plugin' or 'tiers', not {settings.delay_backend!r}",
            settings=["delay_backend"],
        )
    if settings.delay_tier_queue_type not in ("classic", "quorum"):
        raise ConfigurationError(
            "delay_tier_queue_type must be 'classic' or 'quorum', not "
            f"{settings.delay_tier_queue_type!r}",
            settings=["delay_tier_queue_type"],
        )
    if settings.outbox_delay_horizon_s > _MAX_DELAY_HORIZON_S:
        raise ConfigurationError(
            f"outbox_delay_horizon_s must be at most {_MAX_DELAY_HORIZON_S:.0f} (about 49 "
            "days: the longest delay every delay backend holds)",
            settings=["outbox_delay_horizon_s"],
        )
