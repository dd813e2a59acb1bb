"""A newcomer's project in a temporary directory, and ``taskq`` run from it as a subprocess.

The errors of issue 28 are what a user sees in a shell: each test writes the user's modules
into its own directory, runs ``python -m taskq ...`` there (the command imports ``-A`` from
the working directory, like the console script) and reads stdout, stderr and the exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.system.workers import ROOT


def write_module(directory: Path, relative: str, source: str) -> Path:
    """Write ``source`` (dedented) to ``directory/relative``, with the packages' __init__s."""
    path = directory / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(directory).parents:
        if str(parent) != ".":
            (directory / parent / "__init__.py").touch()
    path.write_text(textwrap.dedent(source))
    return path


def run_taskq(
    cwd: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None,
    timeout_s: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m taskq ARGS`` in ``cwd``; taskq itself comes from this checkout."""
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "taskq", *args], cwd=cwd, env=environment, input=stdin,
        capture_output=True, text=True, timeout=timeout_s,
    )
