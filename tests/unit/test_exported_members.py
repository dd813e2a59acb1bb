from __future__ import annotations

import subprocess
import sys

import taskq


def test_all_matches_the_public_names() -> None:
    public = {name for name in vars(taskq) if not name.startswith("_")} | {"__version__"}
    modules = {
        name
        for name, value in vars(taskq).items()
        if type(value).__name__ in {"module", "_Feature"}  # submodules, __future__ flags
    }

    assert sorted(taskq.__all__) == taskq.__all__
    assert set(taskq.__all__) == public - modules


def test_import_opens_nothing_and_imports_no_framework() -> None:
    code = (
        "import sys, taskq; "
        "bad = [m for m in ('flask', 'django') if m in sys.modules]; "
        "print(','.join(bad))"
    )

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()

    assert out == ""
