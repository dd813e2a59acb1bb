"""PostgresWaker (LISTEN/NOTIFY) and the psycopg floor that setup.cfg declares for it."""

from __future__ import annotations

import configparser
import ctypes.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskq.outbox.relay import PostgresWaker
from taskq.outbox.store import NOTIFY_CHANNEL

ROOT = Path(__file__).resolve().parents[2]
# The tests that need psycopg's notifies(timeout=, stop_after=): run again on the floor.
WAKER_TESTS = [
    f"{Path(__file__).relative_to(ROOT)}::"
    "test_postgres_waker_returns_at_a_notify_and_after_its_timeout",
    "tests/integration/test_outbox.py::test_notify_wakes_an_idle_relay_quickly",
]


def test_postgres_waker_returns_at_a_notify_and_after_its_timeout(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    waker = PostgresWaker(engine)
    try:
        # Nothing sent by this test: returns at its timeout. (The channel is shared by every
        # relay on this PostgreSQL, so another run's commit may wake one wait early.)
        waits_s = []
        for _ in range(5):
            started = time.monotonic()
            waker.wait(0.2)
            waits_s.append(time.monotonic() - started)
            if waits_s[-1] >= 0.19:
                break
        assert max(waits_s) >= 0.19 and max(waits_s) < 5, waits_s

        with engine.begin() as conn:  # a producer's commit notifies
            conn.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, "")))
        started = time.monotonic()
        waker.wait(30)
        assert time.monotonic() - started < 5, "the waker slept through a NOTIFY"
    finally:
        waker.close()
        engine.dispose()


def declared_psycopg_floor() -> str:
    """The lowest psycopg version setup.cfg allows (every mention must agree)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    floors = {
        match.group(1)
        for value in extras.values()
        for match in re.finditer(r"^psycopg(?:\[[^\]]*\])?>=([\d.]+)", value, re.MULTILINE)
    }
    assert len(floors) == 1, f"setup.cfg names different psycopg floors: {sorted(floors)}"
    return floors.pop()


def _release(version: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in version.split(".")[:3])
    return parts + (0,) * (3 - len(parts))


@pytest.mark.slow
def test_the_declared_psycopg_floor_runs_the_waker(tmp_path: Path) -> None:
    # Given: psycopg at exactly the floor setup.cfg declares, in a throwaway directory put
    # ahead of the installed one (pure Python psycopg on the system libpq, so that no
    # psycopg-binary wheel for this interpreter is needed).
    assert ctypes.util.find_library("pq"), (
        "libpq is not installed; install it (apt-get install libpq5) to test the psycopg floor"
    )
    floor = declared_psycopg_floor()
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--target", str(site), f"psycopg=={floor}"],
        check=True, timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "PSYCOPG_IMPL": "python"}
    found = subprocess.run(
        [sys.executable, "-c", "import psycopg; print(psycopg.__version__)"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()
    assert _release(found) == _release(floor), f"psycopg {found} ran, not the floor {floor}"

    # When: the tests that use notifies(timeout=, stop_after=) run on it
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *WAKER_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )

    # Then
    assert proc.returncode == 0, (
        f"on psycopg {floor} (the floor in setup.cfg):\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    )
