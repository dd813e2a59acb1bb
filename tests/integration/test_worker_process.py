"""A worker process's body (``process._serve``) against the real broker."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from taskq.worker import process
from taskq.worker.loop import WorkerLoop
from taskq.worker.time_limits import Slot
from tests.support.delay_plugin import auto_delay_backend


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


def test_worker_and_relay_processes_take_the_supervisors_delay_backend_without_probing(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from taskq.delay import choosing
    from taskq.worker.supervisor import Supervisor

    # Given delay_backend="auto", and a count of the broker probes for the plugin
    probes: list[str] = []
    real_probe = choosing.probe_delayed_message_plugin

    def counting_probe(*args: Any) -> bool | None:
        probes.append("probe")
        return real_probe(*args)

    monkeypatch.setattr(choosing, "probe_delayed_message_plugin", counting_probe)
    app = make_app(delay_backend="auto")
    supervisor = Supervisor(app, app_path="tests.tasks:app", queues=(app.settings.default_queue,),
                            overrides={"delay_backend": "auto"}, relay=True)

    # When the supervisor declares at start (probing once), then a child loads the app
    supervisor._declare_topology()
    spec = supervisor._spec
    child_app = process.load_spec_app(spec)
    try:
        kind = child_app.delay_backend_name
    finally:
        child_app.configure()  # the shared tests.tasks app: a fresh sender, nothing adopted

    # Then the child uses the supervisor's choice without asking the broker again, and the
    # relay process gets the same spec
    assert spec.delay_backend == app.delay_backend_name == kind == auto_delay_backend()
    assert supervisor._relay is not None and supervisor._relay._spec == spec
    assert probes == ["probe"]
