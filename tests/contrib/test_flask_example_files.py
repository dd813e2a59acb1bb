"""The Flask example keeps its files in its own directory (issue 28, item 7).

Its README's `flask init-db`, run from the repository root, wrote ``instance/`` at the root,
where .gitignore does not cover it (Flask puts the instance folder beside the top-level
package, ``examples/``). The command runs here as the README gives it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.contrib.conftest import ROOT

EXAMPLE_INSTANCE = ROOT / "examples" / "flask_shop" / "instance"


def test_flask_init_db_writes_the_database_under_the_example() -> None:
    database = EXAMPLE_INSTANCE / "flask_shop.sqlite3"
    root_instance = ROOT / "instance"
    existed = database.exists(), root_instance.exists()
    env = {
        **{k: v for k, v in os.environ.items()
           if not k.startswith(("TASKQ_", "SHOP_", "FLASK_"))},
        "PYTHONPATH": str(ROOT),
        "FLASK_APP": "examples.flask_shop.shop",
    }
    try:
        result = subprocess.run(
            [sys.executable, "-m", "flask", "init-db"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=60,
        )

        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"tables ready in sqlite:///{database}"
        assert database.exists()
        assert root_instance.exists() == existed[1]
        ignored = subprocess.run(["git", "check-ignore", "-q", str(database)], cwd=ROOT)
        assert ignored.returncode == 0, f"{database} is not ignored by git"
    finally:
        if not existed[0] and database.exists():
            database.unlink()
        if not existed[1] and root_instance.exists():  # made by this test (on main)
            shutil.rmtree(root_instance)
