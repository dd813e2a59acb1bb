"""The README's first section, followed literally, gets a newcomer to a task that ran.

The test reads "Start here" from README.md, writes its ``# tasks.py`` block to a file and
runs its shell blocks, in order, as one ``bash -e`` script in a new directory outside the
repository: a new virtualenv, ``pip install`` of this checkout with the ``postgres`` extra,
``taskq db create``, a worker in the background, ``delay().get()``, ``taskq status``, the
worker's warm stop and ``taskq teardown``. Two words of it are the reader's own, and the test
fills them in: the path of the clone (``/path/to/taskq``) and the PostgreSQL database (a
schema of the test's own instead of ``postgresql://localhost/shop``). ``TASKQ_BROKER_URL``,
``TASKQ_NAMESPACE`` and ``TASKQ_DEFAULT_QUEUE`` keep the run off other tests' queues, as a
reader's environment may set them. Slow: pip installs taskq's dependencies.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from taskq import App
from tests.conftest import BROKER_URL, postgres_schema, schema_url
from tests.system.workers import ROOT

PLACEHOLDER_CLONE = "/path/to/taskq"
PLACEHOLDER_DATABASE = "postgresql://localhost/shop"


def first_section() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Start here.*?(?=^## )", text, re.S | re.M)
    assert match, "README.md has no 'Start here' section"
    return match.group(0)


def blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", section, re.S | re.M)


@pytest.fixture
def bare_schema() -> Iterator[str]:
    with postgres_schema("tqreadme", taskq_tables=False) as schema:
        yield schema_url(schema)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_first_section_runs_a_task_from_nothing(
    tmp_path: Path, bare_schema: str, namespace: str, make_app: Callable[..., App]
) -> None:
    # Given the README's own words, with the clone's path and a database of this test's own
    section = first_section()
    (app_block,) = [b for b in blocks(section, "python") if b.startswith("# tasks.py")]
    script = "\n".join(blocks(section, "sh"))
    assert PLACEHOLDER_CLONE in script and PLACEHOLDER_DATABASE in script
    script = script.replace(PLACEHOLDER_CLONE, str(ROOT)).replace(
        PLACEHOLDER_DATABASE, f"'{bare_schema}'"
    )
    # The reader writes tasks.py where the README's first block left them (mkdir shop).
    script = script.replace("mkdir shop && cd shop", "mkdir shop && cd shop && cp ../tasks.py .")
    (tmp_path / "tasks.py").write_text(app_block)
    # Deletes the queues if the script stops before its own teardown.
    make_app("readme", namespace=namespace, default_queue=f"{namespace}.default")
    env = {
        **{k: v for k, v in os.environ.items()
           if not k.startswith(("TASKQ_", "VIRTUAL_ENV", "PYTHONPATH"))},
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace,
        "TASKQ_DEFAULT_QUEUE": f"{namespace}.default",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }

    # When a newcomer runs it
    process = subprocess.Popen(
        ["bash", "-e", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=540)
    finally:
        if process.poll() is None or _group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)  # the script's own group: the worker
            process.wait()

    # Then every step worked: the tables, the result, the status, the warm stop, teardown
    assert process.returncode == 0, output[-4000:]
    lines = output.splitlines()
    assert "5" in lines, output[-4000:]
    assert any(line.startswith("taskq tables ready in") for line in lines)
    assert "taskq status of app shop" in output
    assert "deleted" in output and "queues and exchanges" in output
    assert "Error" not in output


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
