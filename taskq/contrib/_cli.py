"""Run a ``taskq`` command from a framework's command line, with the app filled in."""

from __future__ import annotations

from collections.abc import Sequence

import click

from taskq.cli import main


def run_taskq_command(args: Sequence[str], *, app_path: str, prog_name: str) -> None:
    """Run ``taskq <args>``, adding ``-A app_path`` to the command unless it has one.

    ``flask taskq worker -c 2`` and ``manage.py taskq worker -c 2`` become
    ``taskq worker -A <app_path> -c 2``; ``db create`` and other nested commands too.
    Exits like the ``taskq`` command (``SystemExit``).
    """
    main.main(args=with_app(list(args), app_path), prog_name=prog_name)


def with_app(args: list[str], app_path: str) -> list[str]:
    """Insert ``-A app_path`` after the command named in ``args`` if it takes ``-A``."""
    command: click.Command = main
    depth = 0
    context = click.Context(main)
    while isinstance(command, click.Group) and depth < len(args):
        sub = command.get_command(context, args[depth])
        if sub is None:
            break
        command, depth = sub, depth + 1
    takes_app = any(param.name == "app_path" for param in command.params)
    given = any(arg in ("-A", "--app") or arg.startswith("--app=") for arg in args)
    if not takes_app or given:
        return args
    return [*args[:depth], "-A", app_path, *args[depth:]]
