"""``python manage.py taskq worker|relay|db ...``: the ``taskq`` command for this project.

Everything after ``taskq`` goes to the ``taskq`` command line, with
``-A taskq.contrib.django.worker:app`` added, so every worker process sets Django up.
``db prune`` also deletes the ``django.tasks`` records (``taskq_django_tasks``) whose
results it pruned.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from taskq.contrib._cli import run_taskq_command
from taskq.contrib.django.worker import APP_PATH

# Django's own options, already applied by manage.py (DJANGO_SETTINGS_MODULE, sys.path).
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


class Command(BaseCommand):
    help = (
        "Run taskq for this project: worker, relay, db create|prune ... "
        "(`manage.py taskq worker --help` for the options)."
    )
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "taskq_args", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS]...",
            help="A taskq command and its options, e.g. worker -c 2.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        taskq_args = _without_django_options(list(options["taskq_args"] or ["--help"]))
        try:
            run_taskq_command(taskq_args, app_path=APP_PATH, prog_name="manage.py taskq")
        except SystemExit as exc:
            code = exc.code
            if code not in (None, 0):
                raise CommandError(
                    f"taskq {' '.join(taskq_args[:1])} exited with status {code}",
                    returncode=code if isinstance(code, int) else 1,
                ) from None
        if taskq_args[:2] == ["db", "prune"] and "--help" not in taskq_args:
            deleted = _prune_task_records(_option(taskq_args, "--older-than"))
            self.stdout.write(f"deleted {deleted} django.tasks records whose results were pruned")


def _without_django_options(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DJANGO_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in _DJANGO_OPTIONS)):
            kept.append(arg)
    return kept


def _option(args: list[str], name: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
    return None


def _prune_task_records(older_than: str | None) -> int:
    """Delete records last attempted before the cutoff whose ``taskq_results`` row is gone.

    Records of tasks that never started are kept: they may still wait in the broker.
    """
    from datetime import timedelta

    from django.utils import timezone

    from taskq.cli import parse_duration
    from taskq.contrib.django import get_app
    from taskq.contrib.django.models import TaskRecord, TaskResult

    app = get_app()
    age_s = parse_duration(older_than) if older_than else app.settings.processed_retention_s
    cutoff = timezone.now() - timedelta(seconds=age_s)
    database = str(getattr(app.session_provider, "alias", "default"))
    finished = TaskRecord.objects.using(database).filter(last_attempted_at__lt=cutoff).exclude(
        id__in=TaskResult.objects.using(database).values("task_id")
    )
    deleted, _ = finished.delete()
    return int(deleted)
