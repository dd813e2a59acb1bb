"""`taskq status` figures against states the test creates, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session

from taskq import App
from taskq.broker import topology as topo
from taskq.cli import main
from taskq.message import encode
from taskq.status import collect, render
from tests.conftest import BROKER_URL
from tests.support.delay_plugin import auto_delay_backend

ROOT = Path(__file__).resolve().parents[2]


def test_status_reports_what_the_test_put_there(
    make_app: Callable[..., App], broker: Any
) -> None:
    # Given 4 unconsumed messages, 3 dead letters, 1 parked message, 5 outbox rows, 1 consumer
    app = make_app()
    app.create_tables()
    task = app.task(name="ship")(lambda n: None)
    queue = task.queue
    for n in range(4):
        task.delay(n)
    for n in range(3):
        app.publisher.publish(encode(task.envelope((n,))), exchange=app.topology.dlx,
                              routing_key=queue)
    # (taskq's own publisher would declare a queue for the key: publish raw instead)
    broker.channel.basic_publish(app.topology.exchange, f"{queue}-nowhere", b"x")
    with Session(app.engine) as session, session.begin():
        for n in range(5):
            task.delay_on(session, n)
    consumer = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        channel = consumer.channel()
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(queue, lambda *a: None)  # holds 1 message unacked
        consumer.process_data_events(time_limit=0.2)

        # When status is collected
        status = collect(app)
    finally:
        consumer.close()

    # Then it shows exactly that
    [q] = [q for q in status.queues if q.name == queue]
    assert status.source == "amqp"
    assert q.exists and q.consumers == 1 and q.dead_letters == 3
    assert q.ready + (q.unacked or 0) in (3, 4)  # passive declare counts ready only
    assert status.unroutable == 1
    assert status.outbox.rows == 5 and status.outbox.error is None
    assert status.delay_backend == auto_delay_backend()  # the broker may have the plugin
    assert status.consumers == 1
    text = render(status)
    assert "unacked and publish/ack rates unknown: enable rabbitmq_management" in text
    assert "5 rows waiting" in text


def test_status_of_a_stopped_worker_shows_no_consumers(make_app: Callable[..., App]) -> None:
    app = make_app()
    app.task(name="ship")(lambda n: None).delay(1)

    [q] = collect(app).queues

    assert q.consumers == 0 and q.ready == 1


def _status_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "taskq", "status", "-A", "tests.tasks:app", "--json"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60,
    )


def test_unreachable_broker_and_database_are_one_line_errors_without_passwords(
    tmp_path: Path,
) -> None:
    result = _status_cli({
        "TASKQ_BROKER_URL": "amqp://guest:s3cret@127.0.0.1:1/%2F",
        "TASKQ_DATABASE_URL": "postgresql://taskq:hunter2@127.0.0.1:1/nowhere",
        "TASKQ_CONNECT_TIMEOUT_S": "1",
    })

    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert "cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:1/%2F" in (
        report["broker_error"]
    )
    assert "cannot read the outbox at postgresql://taskq:***@127.0.0.1:1/nowhere" in (
        report["outbox"]["error"]
    )
    assert "s3cret" not in result.stdout + result.stderr
    assert "hunter2" not in result.stdout + result.stderr


def test_status_cli_text_output(namespace: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "taskq", "status", "-A", "tests.tasks:app"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
             "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": BROKER_URL,
             "TASKQ_NAMESPACE": namespace, "TASKQ_DEFAULT_QUEUE": f"{namespace}.default",
             "TASKQ_DATABASE_URL": f"sqlite:///{tmp_path}/t.db"},
    )
    assert "taskq status of app taskq-tests" in result.stdout
    assert f"{namespace}.default (not declared)" in result.stdout
    assert topo.unroutable_name(namespace) not in result.stdout  # shown as "unroutable"


def test_status_cli_shows_the_brokers_version_and_what_taskq_decided_from_it(
    namespace: str, tmp_path: Path, broker: Any
) -> None:
    from taskq.broker.versions import BrokerVersion

    broker.channel  # noqa: B018 - connects
    version = BrokerVersion.from_server_properties(broker._connection._impl.server_properties)
    # When `taskq status` runs against the test broker (3.10 or 4.3), as text and as JSON
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
           "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": BROKER_URL,
           "TASKQ_NAMESPACE": namespace, "TASKQ_DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}
    command = [sys.executable, "-m", "taskq", "status", "-A", "tests.tasks:app"]
    text = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=env)
    as_json = subprocess.run([*command, "--json"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env=env)

    # Then it names the broker's version and what taskq chose from it, and why
    # (it exits 1 here: the outbox table is missing, which it reports on its own line)
    assert f"broker version: {version}" in text.stdout, text.stdout + text.stderr
    if version.may_have_delay_plugin:
        assert "delay backend: " in text.stdout and "(auto: rabbitmq_delayed_message_exchange" \
            in text.stdout
        assert "quorum queue priorities: none (a priority above 0" in text.stdout
        assert "consumer timeout: every queue type; the broker closes the channel" in text.stdout
    else:
        assert (f"delay backend: tiers (auto: {version} cannot run the delayed-message "
                "plugin") in text.stdout
        assert "quorum queue priorities: each of 0-9, in strict order" in text.stdout
        assert "consumer timeout: quorum queues only, by cancelling the consumer" in text.stdout
    report = json.loads(as_json.stdout)
    assert report["broker_version"] == str(version)
    assert report["decisions"][0].startswith("delay backend: ")
    assert len(report["decisions"]) == 4


_HOSTILE_BROKER_URLS = [
    # Unescaped '/', '?', '#' and '@' in the password, a password in the query string, and
    # several ';'-separated URLs (the wrong password: the login is refused or the host is
    # not found, and the error line names the URL).
    "amqp://guest:Zq9/x?y#w@127.0.0.1:5672/%2F",
    "amqp://guest:Zq9@x@127.0.0.1:5672/%2F",
    "amqp://127.0.0.1:5672/%2F?password=Zq9x",
    "amqp://guest:guest@127.0.0.1:1/%2F;amqp://guest:Zq9/x@127.0.0.1:1/%2F",
]


@pytest.mark.parametrize("broker_url", _HOSTILE_BROKER_URLS)
@pytest.mark.parametrize("as_json", [False, True])
def test_status_cli_never_prints_a_password(
    broker_url: str, as_json: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an app whose broker and database URLs hold passwords with unescaped specials
    # (SQLAlchemy reads the database password as 'Qk7/y?z#v'; PostgreSQL trusts root)
    module = f"leaky_app_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        "from taskq import App\n"
        f"app = App('leaky', broker_url={broker_url!r},\n"
        "          database_url='postgresql+psycopg://root:Qk7/y?z#v@127.0.0.1:5432/test',\n"
        "          connect_timeout_s=1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    # When `taskq status` runs
    result = CliRunner().invoke(
        main, ["status", "-A", f"{module}:app", *(["--json"] if as_json else [])]
    )

    # Then it reports both sides, and no part of either password appears anywhere
    output = result.output + repr(result.exception or "")
    assert "guest:***@" in output or "password=***" in output, output
    assert "root:***@127.0.0.1:5432/test" in output, output
    for fragment in ("Zq9", "x?y", "y#w", "Qk7", "y?z", "z#v"):
        assert fragment not in output, output


def test_status_of_an_amqps_broker_without_management_says_https(
    make_app: Callable[..., App],
) -> None:
    from dataclasses import replace

    status = collect(make_app())
    assert status.source == "amqp"  # the shared broker has no management listener here

    text = render(replace(status, broker_url="amqps://guest:***@rabbit:5671/%2F"))

    assert "enable rabbitmq_management with its HTTPS listener on port 15671" in text
    assert "HTTPS" not in render(status)
