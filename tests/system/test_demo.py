"""`make demo`'s program runs every task once and says what each part of its output shows.

Run as ``python -m examples.demo`` in a directory of the test's own (its SQLite database
lands there) with a namespace of its own. Slow: 400 tasks through a 3-process worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from taskq import App
from tests.conftest import BROKER_URL
from tests.system.workers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_explains_its_output(
    tmp_path: Path, namespace: str, make_app: Callable[..., App]
) -> None:
    demo = make_app("demo", namespace=namespace)  # deletes the demo's queues afterwards
    demo.queue(f"{namespace}.orders")
    demo.queue(f"{namespace}.emails")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_DEMO_NAMESPACE": namespace,
    }

    done = subprocess.run([sys.executable, "-m", "examples.demo"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "demo finished: every task ran once." in out
    assert "progress: tasks finished so far" in out
    assert "What ran where: tasks run by each worker process (by pid), per queue" in out
    assert "Priorities: the position at which tasks ran in their queue (0 ran first)" in out
    assert f"{namespace}.orders: priority 9 ran at position" in out
    assert "outbox rows left: 0 (committed tasks the relay has not published yet)" in out
    assert (tmp_path / "taskq.sqlite3").exists()


def test_make_demo_installs_taskq_without_extras() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(DEMO_STAMP): setup.cfg setup.py"):]
    recipe = recipe[: recipe.index("\n\n")]

    assert "pip install $(PIP_QUIET) -e .\n" in recipe + "\n"
    assert "demo: $(DEMO_STAMP)\n" in makefile
