"""The start-up check of time limits and prefetch against RabbitMQ's ``consumer_timeout``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.app import App

def consumer_timeout_warnings(app: App, queues: tuple[str, ...]) -> list[str]:
    """Explain when a delivery of ``queues`` could stay unacked past ``consumer_timeout_s``.

    RabbitMQ closes the channel of a delivery left unacked longer than its
    ``consumer_timeout`` (30 minutes by default) and redelivers every message the channel
    held. The clock of a delivery starts when the broker sends it, and a worker process runs
    what it received in order: a delivery prefetched behind others waits for all of them.
    Each queue's consumer gets ``prefetch_count`` deliveries, so a process holds up to
    ``B = prefetch_count * len(queues)``, and a delivery of task T waits behind up to
    ``B - 1`` others, each running at most ``L_max``, the longest hard ``time_limit_s`` of
    the tasks of ``queues``, before its own run of at most ``L_T``::

        worst_s(T) = (B - 1) * L_max + L_T        (at most B * L_max, for the longest task)

    One warning (or none) names the tasks whose ``worst_s`` exceeds the timeout, and
    suggests the largest prefetch with ``B * L_max`` within it or the timeout to set. Tasks
    without a hard time limit have no bound and are not counted.
    """
    limit_s = app.settings.consumer_timeout_s
    prefetch = app.settings.prefetch_count
    limited = [
        (task.name, task.options.time_limit_s) for task in app.registry
        if task.queue in queues and task.options.time_limit_s is not None
    ]
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
