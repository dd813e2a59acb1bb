"""Logs each django.tasks signal, so that tests can count them in a worker's log."""

from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig

logger = logging.getLogger(__name__)


class DjappConfig(AppConfig):
    name = "tests.contrib.djapp"
    label = "djapp"

    def ready(self) -> None:
        from taskq.contrib.django.tasks._api import task_enqueued, task_finished, task_started

        for signal, label in ((task_enqueued, "task_enqueued"), (task_started, "task_started"),
                              (task_finished, "task_finished")):
            signal.connect(_logger_of(label), weak=False, dispatch_uid=f"djapp-{label}")


def _logger_of(label: str) -> Any:
    def log(sender: Any, task_result: Any, **kwargs: Any) -> None:
        logger.info("signal %s %s %s attempts=%s sender=%s", label, task_result.id,
                    task_result.status, task_result.attempts, sender.__name__)
        if label == "task_finished" and task_result.args == ["receiver-raises"]:
            raise RuntimeError("a receiver's own bug")

    return log
