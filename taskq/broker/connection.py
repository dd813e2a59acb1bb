"""The only place pika connections are built, and where topology is declared.

Every process opens its own connections (a forked child must never write to its parent's
socket). Heartbeats are negotiated from the settings; the worker keeps them flowing from an
I/O thread while tasks run.
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
from typing import Any, TypeVar
from urllib.parse import quote

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from taskq.broker import _management as management
from taskq.broker.partition_check import check_partition_count
from taskq.broker.specs import QueueSpec
from taskq.broker.topology import Declarations
from taskq.broker.versions import BrokerFacts
from taskq.errors import BrokerConnectionError, TopologyError
from taskq.settings import Settings, redact_url

logger = logging.getLogger(__name__)
# ``reason`` of a BrokerConnectionError: every node refused the user and password, or none
# answered (or they failed in different ways).
LOGIN_REFUSED = "login_refused"
UNREACHABLE = "unreachable"

_T = TypeVar("_T")


def connection_parameters(
    settings: Settings,
    *,
    client_name: str,
    heartbeat_s: int | None = None,
    url: str | None = None,
) -> pika.URLParameters:
    """Build pika parameters for one node plus taskq's timeouts.

    Args:
        settings: Timeouts, and ``broker_url``.
        client_name: Shown in the management UI's connection list.
        heartbeat_s: Overrides ``settings.heartbeat_s``.
        url: The node to use; by default the first one of ``settings.broker_url``.
    """
    url = settings.broker_urls[0] if url is None else url
    try:
        params = pika.URLParameters(url)
    except Exception as exc:  # pika raises several types for malformed URLs
        # Not the parser's own words: they may quote a piece of the password ("Port could
        # not be cast to integer value as 's3cr'" for an unescaped '/').
        raise BrokerConnectionError(
            f"invalid broker URL {redact_url(url)} ({type(exc).__name__}); "
            "expected amqp://user:password@host:port/vhost, with characters such as / ? # @ "
            "in the user or password percent-encoded (e.g. / as %2F), several nodes "
            "separated by ';'",
            url=redact_url(url),
        ) from None
    params.heartbeat = settings.heartbeat_s if heartbeat_s is None else heartbeat_s
    params.socket_timeout = settings.connect_timeout_s
    params.stack_timeout = settings.connect_timeout_s * 2
    params.blocked_connection_timeout = settings.blocked_connection_timeout_s
    params.connection_attempts = 1
    params.client_properties = {
        "connection_name": f"{client_name} pid={os.getpid()} host={socket.gethostname()}",
        "product": "taskq",
    }
    return params


def node_order(nodes: list[_T], *, rand: random.Random | None = None) -> list[_T]:
    """``nodes`` from a random start, in order (a cluster's clients spread over its nodes)."""
    start = (rand or random).randrange(len(nodes)) if nodes else 0
    return nodes[start:] + nodes[:start]


def open_connection(
    settings: Settings,
    *,
    client_name: str,
    heartbeat_s: int | None = None,
    broker: BrokerFacts | None = None,
) -> pika.BlockingConnection:
    """Open a blocking connection to one of the broker nodes named in ``settings``.

    With several nodes (``broker_url`` holding ``;``-separated URLs) they are tried from a
    random start, in order, each within ``connect_timeout_s``; the first that answers wins.

    Args:
        settings: Where to connect and with which timeouts.
        client_name: Shown in the management UI's connection list.
        heartbeat_s: Overrides ``settings.heartbeat_s`` (tests use short heartbeats).
        broker: Learns the broker's version and capabilities from the server properties
            of the connection (:mod:`taskq.broker.versions`); no extra round trip.

    Raises:
        BrokerConnectionError: no node could be reached or every one refused the login; the
            message names each URL (password masked) with its failure.
    """
    urls = settings.broker_urls
    # Parse every URL first: a malformed one is a configuration error, whichever node is up.
    params = [
        connection_parameters(
            settings, client_name=client_name, heartbeat_s=heartbeat_s, url=url
        )
        for url in urls
    ]
    failures: list[tuple[str, BaseException]] = []
    for url, node in node_order(list(zip(urls, params, strict=True))):
        try:
            connection = pika.BlockingConnection(node)
        except (pika.exceptions.AMQPError, AMQPConnectorException, OSError) as exc:
            # AMQPConnectorException: a handshake that timed out (a blackholed network) or
            # was aborted reaches us as pika's connector exception, not as an AMQPError.
            failures.append((url, exc))
            if len(urls) > 1:
                logger.info("broker node %s did not answer (%s: %s)", redact_url(url),
                            type(exc).__name__, _detail(exc))
            continue
        if failures:
            logger.warning("connected to broker node %s after %d other node(s) failed",
                           redact_url(url), len(failures))
        if broker is not None:
            met = broker.learn(connection._impl.server_properties)  # sent in connection.start
            logger.debug("broker node %s is %s", redact_url(url), met)
        return connection
    raise _connect_error(settings, failures)


def check_login(settings: Settings, *, client_name: str) -> None:
    """Open and close one connection: is the broker there, and does it accept the login?

    Raises:
        BrokerConnectionError: ``reason`` is ``LOGIN_REFUSED`` (a configuration error:
            waiting does not fix it) or ``UNREACHABLE``.
    """
    connection = open_connection(settings, client_name=client_name)
    try:
        connection.close()
    except (pika.exceptions.AMQPError, OSError):
        logger.debug("closing the login check's connection failed", exc_info=True)


def _connect_error(
    settings: Settings, failures: list[tuple[str, BaseException]]
) -> BrokerConnectionError:
    masked = redact_url(settings.broker_url)
    refused = [exc for _, exc in failures
               if isinstance(exc, pika.exceptions.ProbableAuthenticationError)]
    last = failures[-1][1]
    if len(refused) == len(failures):
        error = BrokerConnectionError(
            f"RabbitMQ at {masked} refused the login: check the "
            "user and password in TASKQ_BROKER_URL",
            url=masked,
            reason=LOGIN_REFUSED,
        )
    elif len(failures) == 1:
        error = BrokerConnectionError(
            f"cannot connect to RabbitMQ at {masked} "
            f"({type(last).__name__}: {_detail(last)}); is the broker running and "
            "is TASKQ_BROKER_URL right?",
            url=masked,
            reason=UNREACHABLE,
        )
    else:
        each = "; ".join(
            f"{redact_url(url)}: {type(exc).__name__}: {_detail(exc)}" for url, exc in failures
        )
        error = BrokerConnectionError(
            f"cannot connect to any of the {len(failures)} RabbitMQ nodes ({each}); are the "
            "nodes running and is TASKQ_BROKER_URL right?",
            url=masked,
            reason=UNREACHABLE,
        )
    error.__cause__ = refused[-1] if len(refused) == len(failures) else last
    return error


def _detail(exc: BaseException) -> str:
    # pika's AMQPConnectionError prints as "" and keeps the real reason (refused, timed
    # out, reset) in its args.
    text = str(exc).strip()
    if not text and exc.args:
        text = "; ".join(str(arg) or repr(arg) for arg in exc.args)
    return text or "no detail"


def declare(channel: BlockingChannel, declarations: Declarations) -> BlockingChannel:
    """Declare exchanges, queues and bindings idempotently.

    Returns the channel to keep using (today always ``channel``; the return value leaves room
    for a reopened one).

    Raises:
        TopologyError: an ordered queue exists with another partition count
            (:mod:`taskq.broker.partition_check`), or an exchange or queue exists with other
            arguments (the broker answered
            PRECONDITION_FAILED). Its text names the object and both argument sets;
            attributes: ``name``, ``kind``, ``queue`` (for queues), ``expected``,
            ``actual`` (what is known of the existing arguments), ``actual_complete``,
            ``broker_reply``, and ``channel``: pika closes a channel on that error, so a
            fresh channel of the same connection (``None`` if the connection is gone).
    """
    for queue_name, partitions in declarations.partition_checks:
        check_partition_count(channel.connection, queue_name, partitions)
    for exchange in declarations.exchanges:
        _guarded(
            channel, "exchange", exchange.name, {"type": exchange.type, **exchange.arguments}
        )
    for queue in declarations.queues:
        if queue.adoptable and _adopted(channel.connection, queue):
            continue
        _guarded(channel, "queue", queue.name, queue.arguments)
    for binding in declarations.bindings:
        channel.queue_bind(binding.queue, binding.exchange, routing_key=binding.routing_key)
    return channel


def _guarded(channel: BlockingChannel, kind: str, name: str, expected: dict[str, Any]) -> None:
    try:
        _declare_one(channel, kind, name, expected)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 406:
            raise
        connection = channel.connection
        raise _topology_error(
            kind,
            name,
            expected,
            exc.reply_text,
            connection,
            connection.channel() if connection.is_open else None,
        ) from None


def _adopted(connection: pika.BlockingConnection, queue: QueueSpec) -> bool:
    """Declare ``queue`` on throwaway channels, giving up adoptable arguments it lacks.

    An older taskq declared quorum queues without the arguments :mod:`taskq.broker.quorum`
    adds for safety, and RabbitMQ refuses to change a queue's arguments: such a queue is used
    as it is, with a warning that says what it lacks and how to get it. Throwaway channels,
    because a refused declare closes its channel.

    Returns:
        ``True`` when the queue is declared (as asked, or adopted); ``False`` when it differs
        in an argument that is not adoptable: the caller declares it again to report that.
    """
    candidate = dict(queue.arguments)
    given_up: dict[str, Any] = {}
    for _ in range(len(queue.adoptable) + 1):
        probe = connection.channel()
        try:
            _declare_one(probe, "queue", queue.name, candidate)
        except pika.exceptions.ChannelClosedByBroker as exc:
            match = _INEQUIVALENT_RE.search(exc.reply_text) if exc.reply_code == 406 else None
            if match is None or match["arg"] not in queue.adoptable:
                if exc.reply_code != 406:
                    raise
                return False
            arg = match["arg"]
            current = _parse_value(match["current"], candidate.get(arg))
            given_up[arg] = candidate.pop(arg, None)
            if current is not _ABSENT:
                candidate[arg] = current
            continue
        probe.close()
        if given_up:
            _warn_adopted(queue.name, given_up, candidate)
        return True
    return False


def _warn_adopted(name: str, given_up: dict[str, Any], kept: dict[str, Any]) -> None:
    lacks = ", ".join(
        f"{arg}={value!r} (it has {kept.get(arg, 'none')!r})"
        for arg, value in sorted(given_up.items())
    )
    logger.warning(
        "queue %r exists with other arguments than this taskq declares (%s): using it as it "
        "is. What that means and how to get them (a policy, or re-creating the drained "
        "queue): docs/rabbitmq.md, 'Broker versions: what taskq decides at connect'",
        name, lacks, extra={"queue": name},
    )


# RabbitMQ names only the first differing argument, e.g. "inequivalent arg 'x-max-priority'
# for queue 'q' in vhost '/': received '10' but current is '5'". A value is spelt '10',
# "the value '5' of type 'signedint'" (when the types differ) or "none" (absent).
_INEQUIVALENT_RE = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for \w+ '.*' in vhost '.*': "
    r"received (?P<received>.+) but current is (?P<current>.+)$"
)
_TYPED_VALUE_RE = re.compile(r"^the value '(?P<value>.*)' of type '(?P<type>\w+)'$")
_INT_TYPES = frozenset(
    {"byte", "short", "signedint", "long", "unsignedbyte", "unsignedshort", "unsignedint"}
)
_ABSENT = object()
# The management API is only used to describe a TopologyError better.
_MANAGEMENT_TIMEOUT_S = 1.0


def _topology_error(
    kind: str,
    name: str,
    expected: dict[str, Any],
    reply_text: str,
    connection: pika.BlockingConnection,
    channel: BlockingChannel | None,
) -> TopologyError:
    actual = _existing_arguments(connection, kind, name)
    if actual is None and connection.is_open:
        actual = _probe_arguments(connection, kind, name, expected, reply_text)
    complete = actual is not None
    if actual is not None:
        existing = f"the existing {kind} has {_describe(actual)}"
    else:
        actual, existing = _reported_difference(reply_text, expected, kind)
    attributes: dict[str, Any] = {"queue": name} if kind == "queue" else {}
    return TopologyError(
        f"{kind} {name!r} already exists with other arguments than taskq declares: taskq "
        f"declares {_describe(expected)}; {existing}. Delete the {kind} (drain it first: "
        f"its messages go with it) so that taskq re-creates it, or change the app's queue "
        "options to match the existing one.",
        name=name,
        kind=kind,
        expected=dict(expected),
        actual=actual,
        actual_complete=complete,
        broker_reply=reply_text,
        channel=channel,
        **attributes,
    )


# Flags the broker also compares; a probe cannot vary them (taskq always declares durable).
_FLAGS = frozenset({"durable", "auto_delete", "exclusive", "internal"})
_MAX_PROBES = 12


def _probe_arguments(
    connection: pika.BlockingConnection,
    kind: str,
    name: str,
    expected: dict[str, Any],
    reply_text: str,
) -> dict[str, Any] | None:
    """Learn the existing object's arguments over AMQP, or ``None`` when that fails.

    AMQP cannot read arguments back, and each PRECONDITION_FAILED names only the first
    differing one, in the broker's own order (``x-dead-letter-exchange`` comes before
    ``x-max-priority``). So re-declare on throwaway channels, each time adopting the value the
    broker reported as current, until a declare is accepted: the arguments then equal the
    existing ones (as far as the broker compares arguments). A declare that is accepted
    changes nothing on an existing object.
    """
    candidate = dict(expected)
    seen: set[str] = set()
    for _ in range(_MAX_PROBES):
        match = _INEQUIVALENT_RE.search(reply_text)
        if match is None or match["arg"] in _FLAGS or match["arg"] in seen:
            return None
        arg = match["arg"]
        seen.add(arg)
        current = _parse_value(match["current"], expected.get(arg))
        if current is _ABSENT:
            candidate.pop(arg, None)
        else:
            candidate[arg] = current
        try:
            probe = connection.channel()
            _declare_one(probe, kind, name, candidate)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 406:
                return None
            reply_text = exc.reply_text
            continue
        except pika.exceptions.AMQPError:
            return None
        probe.close()
        return candidate
    return None


def _declare_one(
    channel: BlockingChannel, kind: str, name: str, arguments: dict[str, Any]
) -> None:
    """Declare one durable exchange (its ``type`` among ``arguments``) or queue."""
    if kind == "exchange":
        arguments = dict(arguments)
        exchange_type = arguments.pop("type", "direct")
        channel.exchange_declare(
            name, exchange_type=exchange_type, durable=True, arguments=arguments or None
        )
    else:
        channel.queue_declare(name, durable=True, arguments=arguments or None)


def _reported_difference(
    reply_text: str, expected: dict[str, Any], kind: str
) -> tuple[dict[str, Any], str]:
    """What the broker's reply says of the existing object: one argument at most."""
    match = _INEQUIVALENT_RE.search(reply_text)
    if match is None:
        return {}, f"the broker reported: {reply_text}"
    arg = match["arg"]
    current = _parse_value(match["current"], expected.get(arg))
    received = _parse_value(match["received"], expected.get(arg))
    if current is _ABSENT:
        actual: dict[str, Any] = {}
        has = f"no {arg!r}"
    else:
        actual = {arg: current}
        has = f"{arg!r} = {current!r}"
    wants = "none" if received is _ABSENT else repr(received)
    return actual, (
        f"the existing {kind} has {has} where taskq declares {wants} (the broker reports "
        "only the first differing argument, so others may differ too)"
    )


def _parse_value(text: str, like: Any) -> Any:
    text = text.strip()
    if text == "none":
        return _ABSENT
    typed = _TYPED_VALUE_RE.match(text)
    if typed is not None:
        value, kind = typed["value"], typed["type"]
    else:
        # No type given: RabbitMQ omits it when it equals the received value's type.
        value = text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "'" else text
        kind = "long" if isinstance(like, int) and not isinstance(like, bool) else ""
    if kind in _INT_TYPES and re.fullmatch(r"-?\d+", value):
        return int(value)
    if kind == "bool":
        return value == "true"
    return value


def _describe(arguments: dict[str, Any]) -> str:
    if not arguments:
        return "no arguments"
    return "{" + ", ".join(f"{k!r}: {arguments[k]!r}" for k in sorted(arguments)) + "}"


def _existing_arguments(
    connection: pika.BlockingConnection, kind: str, name: str
) -> dict[str, Any] | None:
    """Ask the management API for every argument of the existing object, or ``None``.

    AMQP cannot read a queue's arguments back, and the broker's 406 reply names only the first
    difference. The management plugin (when enabled on the broker's host) knows them all; any
    failure (plugin off, other credentials, firewall, no HTTPS listener for an ``amqps://``
    broker) silently falls back to the reply.
    """
    try:
        params = connection._impl.params  # pika keeps the parameters only on the impl
        path = f"/api/{kind}s/{management.vhost_path(params)}/{quote(name, safe='')}"
        info = management.get_json(params, path, timeout_s=_MANAGEMENT_TIMEOUT_S)
    except Exception:  # best effort by design: any failure means "not available"
        logger.debug("management API not available to describe %s %r", kind, name)
        return None
    arguments = dict(info.get("arguments") or {})
    if kind == "exchange" and "type" in info:
        arguments["type"] = info["type"]
    return arguments
