"""The ``taskq`` command line: parse, build settings, delegate.

Commands only translate flags into settings overrides (which win over the app's own
settings and the environment) and hand over to the library; defaults live in
:class:`~taskq.settings.Settings`, never here. One module per family of commands;
``main`` gathers them.
"""

from __future__ import annotations

import click

from taskq.cli._common import parse_duration
from taskq.cli.beat import beat
from taskq.cli.dashboard import dashboard
from taskq.cli.database import db
from taskq.cli.dead_letters import dlq
from taskq.cli.inspecting import inspect, status
from taskq.cli.running import relay, worker
from taskq.cli.teardown import teardown

__all__ = ["main", "parse_duration"]


@click.group()
@click.version_option(package_name="taskq", message="taskq %(version)s")
def main() -> None:
    """taskq: a task queue on RabbitMQ where nothing is silently lost."""


for _command in (worker, relay, beat, status, inspect, db, dlq, dashboard, teardown):
    main.add_command(_command)
