"""A worker process's body (``process._serve``) against the real broker."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable
from pathlib import Path

import pytest

from taskq import App
from taskq.worker import process
from taskq.worker.loop import WorkerLoop
from taskq.worker.time_limits import Slot


def test_an_unexpected_failure_of_the_consumer_is_logged_and_the_process_exits_to_be_replaced(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    # Failures of one delivery are contained by the loop; this is the loop itself failing.
    def run(self: WorkerLoop) -> None:
        raise RuntimeError("the consumer's I/O thread failed")

    monkeypatch.setattr(WorkerLoop, "run", run)
    monkeypatch.setattr(process, "_install_signal_handlers", lambda loop: None)  # pytest's own
    app = make_app()
    spec = process.ChildSpec(
        app_path="tests.tasks:app", queues=(app.settings.default_queue,), index=1,
        state_dir=str(tmp_path),
    )

    with caplog.at_level(logging.ERROR, logger="taskq.worker.process"):
        code = process._serve(app, spec, [Slot(multiprocessing.get_context("spawn"))])

    assert code == process.EXIT_FAILED != process.EXIT_FATAL  # replaced, not a config stop
    assert "worker process 1 failed; exiting so that the supervisor replaces it" in caplog.text
    assert "RuntimeError: the consumer's I/O thread failed" in caplog.text  # the traceback
