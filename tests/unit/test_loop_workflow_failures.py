"""A failure while handling a failure: failing a dead-lettered member's workflow raises.

The store records what it can refuse (a link_error or a next step that cannot be enqueued,
tests/integration/test_workflow_refusals.py); should anything else go wrong while the
workflow of a dead-lettered member is failed, the delivery is still dead-lettered exactly
once and acked, and nothing escapes to the loop (which would stop the process). The
publisher is the recorder of tests/unit/test_loop.py; the system test
tests/system/test_workflow_unenqueueable.py runs the real thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taskq.message import WORKFLOW, Envelope, encode
from tests.unit.test_loop import QUEUE, Recorder, _App, app, delivery, make_loop, recorder

__all__ = ["app", "recorder"]  # fixtures of test_loop, used here


def test_an_error_while_failing_the_workflow_dead_letters_once_and_acks(
    app: _App, recorder: Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = make_loop(app, recorder, tmp_path)

    def broken(*_: Any) -> None:
        raise RuntimeError("a bug while failing the workflow")

    monkeypatch.setattr(loop._workflows, "failed", broken)
    member = encode(Envelope(task_id="id-1", task="bad", args=[],
                             headers={WORKFLOW: "wf-1"}))

    loop.handle(delivery(recorder, member))

    (publish, exchange, routing_key, letter), settle = recorder.events
    assert (publish, exchange, routing_key) == ("publish", "ns.dlx", QUEUE)
    assert letter.headers["taskq-error-type"] == "KeyError"
    assert settle == ("settle", 7, 0)  # acked: never run or dead-lettered again
