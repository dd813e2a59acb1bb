"""mypy checks a user's code against the development install (issue 28, item 7).

`make venv` installs taskq in editable mode; with setuptools' default import hook mypy could
not see the package at all ("Cannot find implementation or library stub for module named
'taskq'") although it ships py.typed. The project below lives outside the repository and
uses only the interpreter that runs these tests, as a user's project in the same venv would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.system.cli_user import write_module

USER_CODE = """
    import taskq

    app = taskq.App("shop")


    @app.task
    def charge(order_id: int, cents: int) -> str:
        return f"{order_id}: {cents}"


    charge.delay(1, 4200)
    charge.delay("1", 4200)
"""


def test_mypy_sees_taskq_of_the_dev_install_and_checks_delay_calls(tmp_path: Path) -> None:
    write_module(tmp_path, "shop_tasks.py", USER_CODE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}

    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
         "shop_tasks.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )

    assert "Cannot find implementation or library stub" not in result.stdout, (
        f"{result.stdout}\nbuild the venv with `make venv` (editable_mode=compat)"
    )
    assert result.stdout.splitlines() == [
        'shop_tasks.py:13: error: Argument 1 to "delay" of "Task" has incompatible type '
        '"str"; expected "int"  [arg-type]',
        "Found 1 error in 1 file (checked 1 source file)",
    ]
    assert result.returncode == 1
