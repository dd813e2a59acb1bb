"""A broker that refuses the login (issue 28, item 5): `taskq relay` behaves and advises as
`taskq worker` does.

At start a refused login is a configuration error, not an outage: both commands print the
same one-line error and exit 1 (the relay used to log "enqueue again" and retry forever). A
relay whose login is refused after it started (a password rotated under it) keeps its rows
and retries, as a worker's consumers reconnect; its log says what to fix, never "enqueue
again" (the rows are still in the outbox).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App
from tests.conftest import BROKER_URL
from tests.system.cli_user import run_taskq

WRONG_BROKER_URL = re.sub(r"//([^:/@]+):[^@]*@", r"//\1:not-the-password@", BROKER_URL)
MASKED = re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", BROKER_URL)


def _env(app: App) -> dict[str, str]:
    return {
        "TASKQ_BROKER_URL": WRONG_BROKER_URL,
        "TASKQ_NAMESPACE": app.settings.namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DATABASE_URL": app.settings.database_url,
    }


def test_relay_and_worker_refuse_a_wrong_password_at_start_with_the_same_error(
    app: App, tmp_path: Path
) -> None:
    expected = (f"Error: RabbitMQ at {MASKED} refused the login: check the user and "
                "password in TASKQ_BROKER_URL")

    relay = run_taskq(tmp_path, "relay", "-A", "tests.tasks:app", env=_env(app))
    worker = run_taskq(tmp_path, "worker", "-A", "tests.tasks:app", "-c", "1",
                       env=_env(app))

    assert (relay.returncode, worker.returncode) == (1, 1)
    assert relay.stderr.strip().splitlines()[-1] == expected
    assert worker.stderr.strip().splitlines()[-1] == expected
    assert "enqueue again" not in relay.stderr
    assert "outbox relay started" not in relay.stderr


def test_a_relay_refused_after_start_keeps_its_rows_and_says_what_to_fix(
    make_app, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a row in the outbox, and a broker that now refuses the relay's login...
    producer = make_app()
    producer.create_tables()

    @producer.task
    def noop() -> None:
        """Never runs: the row stays in the outbox."""

    with Session(producer.engine) as session, session.begin():
        noop.apply_async(session=session)
    refused = make_app(broker_url=WRONG_BROKER_URL)

    # ...when the relay tries to publish it...
    with caplog.at_level(logging.WARNING, logger="taskq.outbox.relay"):
        pause_s = refused.relay().step()

    # ...the row stays, the relay backs off, and the one error names what to fix.
    with producer.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM taskq_outbox")).scalar() == 1
    assert pause_s > 0
    records = [r for r in caplog.records if r.name == "taskq.outbox.relay"]
    assert [r.levelname for r in records] == ["ERROR"]
    message = records[0].getMessage()
    assert (f"outbox relay cannot publish: RabbitMQ at {MASKED} refused the login: check "
            "the user and password in TASKQ_BROKER_URL; rows stay in the outbox") in message
    assert "enqueue again" not in message
