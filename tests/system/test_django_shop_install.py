"""examples/django_shop installs and migrates with the commands its README gives.

On the README's platform (Debian 12, Python 3.11) pip picks Django 5.2, which needs the
``django-tasks`` backport for ``django.tasks``; Python 3.12 and newer get Django 6.1, which has
it. Each run makes a new virtualenv outside the repository, activates it and runs the
README's ``pip install`` and ``migrate`` lines as written (read from the README, so the test
follows it), with the SQLite database in the test's own directory. Slow: pip installs
Django and taskq's dependencies (about a minute each).
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.system.workers import ROOT

EXAMPLE = ROOT / "examples" / "django_shop"


def readme_commands() -> list[str]:
    """The README's ``pip install`` and ``manage.py migrate`` lines, comments removed."""
    text = (EXAMPLE / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block, "examples/django_shop/README.md has no sh block"
    lines = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    steps = ("pip install", "python manage.py migrate")
    wanted = [line for line in lines if line.startswith(steps)]
    assert len(wanted) == 2, wanted
    return wanted


def interpreter(version: str) -> str | None:
    """An interpreter of exactly ``version`` (PATH, then pyenv), or ``None``."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(p / "bin" / "python3") for p in pyenv.glob(f"{version}.*"))
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("python", "django"), [("3.11", "5.2"), ("3.12", "6.1")])
def test_the_readme_commands_install_and_migrate(tmp_path: Path, python: str, django: str) -> None:
    found = interpreter(python)
    if found is None:
        pytest.skip(f"no Python {python} on this machine (PATH or pyenv)")
    venv = tmp_path / "venv"
    subprocess.run([found, "-m", "venv", str(venv)], check=True, timeout=120)
    database = tmp_path / "shop.sqlite3"
    env = {
        # A user's shell, not this session's: the Django tests before this one leave their
        # DJANGO_SETTINGS_MODULE and the example's SHOP_DATABASE_* (PostgreSQL) in os.environ,
        # which manage.py and the example's settings would take over the README's SQLite.
        **{k: v for k, v in os.environ.items()
           if not k.startswith(("TASKQ_", "PYTHON", "DJANGO_", "SHOP_"))},
        "SHOP_SQLITE_PATH": str(database),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }

    # The README's lines, run as a user would: from the example's directory, venv active.
    script = " && ".join([f". {venv}/bin/activate", *readme_commands()])
    done = subprocess.run(["bash", "-c", script], cwd=EXAMPLE, env=env, capture_output=True,
                          text=True, timeout=840)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Applying taskq.0001_initial... OK" in done.stdout
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import django, importlib; importlib.import_module('django.tasks' if django.VERSION"
         " >= (6,) else 'django_tasks'); print('%d.%d' % django.VERSION[:2])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert version == django
    with sqlite3.connect(database) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"taskq_outbox", "taskq_processed", "orders_order"} <= tables
