"""Time limits and prefetch against RabbitMQ's consumer timeout: start-up check, extension.

Before RabbitMQ 4.3 the broker closes the channel of a delivery held past
``consumer_timeout``, for every queue type: the worker can only warn at start
(:func:`consumer_timeout_warnings`). On 4.3 only quorum queues time out, and a consumer may
carry its own ``x-consumer-timeout``, which wins over the queue's argument, a
``consumer-timeout`` policy and the node's ``consumer_timeout`` (*measured* on 4.3.6, above
and below each): taskq's consumers of quorum queues ask for
:func:`consumer_timeout_for`, at least ``consumer_timeout_s`` and above the longest hold
their hard time limits allow, so the broker never takes back a delivery whose task is still
within its limits. A task without a hard limit that runs longer is ended as if it had one
(:mod:`taskq.worker.crash_loops`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.app import App

# Added to the longest hold when taskq asks for a consumer timeout: the supervisor's kill
# and the broker's timer both run on ticks (about a second each).
EXTENSION_MARGIN_S = 60.0


def _limited(app: App, queues: tuple[str, ...]) -> list[tuple[str, float]]:
    return [
        (task.name, task.options.time_limit_s) for task in app.registry
        if task.queue in queues and task.options.time_limit_s is not None
    ]


def consumer_timeout_for(app: App, queues: tuple[str, ...]) -> float:
    """The ``x-consumer-timeout`` (seconds) a worker process consuming ``queues`` asks for.

    ``consumer_timeout_s``, or the longest hold (``prefetch_count * len(queues)`` deliveries
    of up to the longest hard ``time_limit_s``, see :func:`consumer_timeout_warnings`) plus a
    minute when that is more.
    """
    limited = _limited(app, queues)
    if not limited:
        return app.settings.consumer_timeout_s
    longest_s = max(limit_s for _, limit_s in limited)
    worst_s = app.settings.prefetch_count * len(queues) * longest_s
    return max(app.settings.consumer_timeout_s, worst_s + EXTENSION_MARGIN_S)


def extension_note(app: App, queues: tuple[str, ...]) -> str | None:
    """The start-up line of a worker on RabbitMQ 4.3+ whose quorum queues get a timeout."""
    topology = app.topology
    if not topology.broker.known.per_consumer_timeout:
        return None
    quorum = [q for q in queues if topology.options(q).type == "quorum"]
    if not quorum:
        return None
    timeout_s = consumer_timeout_for(app, queues)
    unlimited = sorted(task.name for task in app.registry
                       if task.queue in quorum and task.options.time_limit_s is None)
    note = (f"consumers of quorum queue(s) {', '.join(quorum)} ask {topology.broker.known} "
            f"for a consumer timeout of {timeout_s:g}s (x-consumer-timeout)")
    if unlimited:
        more = f" and {len(unlimited) - 5} more" if len(unlimited) > 5 else ""
        note += (f"; task(s) {', '.join(unlimited[:5])}{more} have no time_limit_s: a run "
                 "holding its delivery longer is ended and counted as a failed attempt")
    return note

def consumer_timeout_warnings(app: App, queues: tuple[str, ...]) -> list[str]:
    """Explain when a delivery of ``queues`` could stay unacked past ``consumer_timeout_s``.

    None on RabbitMQ 4.3+ (see the module docstring). Before, RabbitMQ closes the channel
    of a delivery left unacked longer than its ``consumer_timeout`` (30 minutes by default)
    and redelivers every message the channel held. The clock of a delivery starts when the
    broker sends it, and a worker process runs what it received in order: a delivery
    prefetched behind others waits for all of them.
    Each queue's consumer gets ``prefetch_count`` deliveries, so a process holds up to
    ``B = prefetch_count * len(queues)``, and a delivery of task T waits behind up to
    ``B - 1`` others, each running at most ``L_max``, the longest hard ``time_limit_s`` of
    the tasks of ``queues``, before its own run of at most ``L_T``::

        worst_s(T) = (B - 1) * L_max + L_T        (at most B * L_max, for the longest task)

    One warning (or none) names the tasks whose ``worst_s`` exceeds the timeout, and
    suggests the largest prefetch with ``B * L_max`` within it or the timeout to set. Tasks
    without a hard time limit have no bound and are not counted.
    """
    version = app.topology.broker.known
    if version.consumer_timeout_cancels:
        # 4.3: classic queues never time out; quorum ones are extended (consumer_timeout_for)
        return []
    limit_s = app.settings.consumer_timeout_s
    prefetch = app.settings.prefetch_count
    limited = _limited(app, queues)
    if not limited:
        return []
    longest_name, longest_s = max(limited, key=lambda item: item[1])
    held = prefetch * len(queues)
    at_risk = [name for name, own_s in limited if (held - 1) * longest_s + own_s > limit_s]
    if not at_risk:
        return []
    worst_s = held * longest_s
    fitting = int(limit_s // (longest_s * len(queues)))
    lower = f"lower --prefetch to {fitting}, or " if 0 < fitting < prefetch else ""
    shown = ", ".join(sorted(at_risk)[:5]) + (f" and {len(at_risk) - 5} more"
                                               if len(at_risk) > 5 else "")
    return [
        f"task(s) {shown} may keep a delivery unacked for up to {worst_s:g}s, longer than "
        f"the broker's consumer_timeout ({limit_s:g}s): a worker process holds up to {held} "
        f"deliveries (prefetch {prefetch} x {len(queues)} queue(s)) and runs them in order, "
        f"so one waits behind up to {held - 1} others of up to {longest_s:g}s each (task "
        f"{longest_name} has time_limit_s={longest_s:g}) before its own run. RabbitMQ would "
        "close the channel and redeliver every message it held. To avoid it, "
        f"{lower}raise consumer_timeout in rabbitmq.conf, e.g. "
        f"'consumer_timeout = {int(worst_s * 1000) + 60_000}' (milliseconds), restart "
        "RabbitMQ, and set TASKQ_CONSUMER_TIMEOUT_S to match"
    ]
