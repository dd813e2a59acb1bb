"""Pure parts of the worker: reconnect backoff, the death ledger, loading the app, the CLI."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskq.broker.subscription import reconnect_delay_s
from taskq.cli import main
from taskq.errors import ConfigurationError
from taskq.worker.deaths import DeathLedger, DeathRecord
from taskq.worker.process import load_app


def test_reconnect_delay_grows_exponentially_with_jitter_and_is_capped() -> None:
    rand = random.Random(7)
    delays = [reconnect_delay_s(attempt, 30.0, rand=rand) for attempt in range(12)]

    for attempt, delay in enumerate(delays):
        full = min(30.0, 0.5 * 2**attempt)
        assert full / 2 <= delay <= full
    assert max(delays) <= 30.0
    assert reconnect_delay_s(10_000, 5.0) <= 5.0


def test_death_ledger_counts_deaths_and_remembers_time_limit_kills(tmp_path: Path) -> None:
    ledger = DeathLedger(str(tmp_path))

    assert ledger.read("m1") is None
    ledger.record_death("m1")
    assert ledger.record_death("m1") == DeathRecord(deaths=2)
    assert ledger.record_death("m2", time_limit_s=1.5) == DeathRecord(1, time_limit_s=1.5)
    ledger.forget("m1")
    assert ledger.read("m1") is None
    assert ledger.read("m2") == DeathRecord(1, time_limit_s=1.5)


def test_death_ledger_never_uses_message_ids_as_paths(tmp_path: Path) -> None:
    ledger = DeathLedger(str(tmp_path / "state"))
    os.mkdir(ledger.directory)

    ledger.record_death("../../escape")

    assert not (tmp_path / "escape").exists()
    assert len(os.listdir(ledger.directory)) == 1
    assert ledger.read("../../escape") == DeathRecord(1)


def test_death_ledger_create_and_remove() -> None:
    ledger = DeathLedger.create()
    ledger.record_death("m")

    ledger.remove()

    assert not os.path.exists(ledger.directory)


def test_load_app_returns_the_app_named_module_colon_attribute() -> None:
    from tests import tasks

    assert load_app("tests.tasks:app") is tasks.app
    assert load_app("tests.tasks") is tasks.app


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("no_such_module_xyz:app", "cannot import module 'no_such_module_xyz'"),
        ("tests.tasks:nothing", "module tests.tasks has no attribute 'nothing'"),
        ("tests.tasks:record", "Task, not a taskq.App"),
        (":app", "expected module:app"),
    ],
)
def test_load_app_explains_what_is_wrong(path: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words.replace(".", r"\.")):
        load_app(path)


def test_worker_command_reports_an_app_it_cannot_import() -> None:
    result = CliRunner().invoke(main, ["worker", "-A", "no_such_module_xyz:app"])

    assert result.exit_code == 2
    assert "cannot import module 'no_such_module_xyz'" in result.output


def test_worker_command_rejects_an_invalid_queue_name() -> None:
    result = CliRunner().invoke(main, ["worker", "-A", "tests.tasks:app", "-Q", "bad name"])

    assert result.exit_code == 2
    assert "queue name 'bad name' is invalid" in result.output


def test_worker_help_lists_the_documented_options() -> None:
    result = CliRunner().invoke(main, ["worker", "--help"])

    assert result.exit_code == 0
    for option in ("-A", "-Q", "--declare-new-queues", "-c", "--prefetch", "--max-tasks-per-child",
                   "--shutdown-timeout", "--loglevel"):
        assert option in result.output


def test_tasks_with_time_limits_past_the_consumer_timeout_are_warned_about() -> None:
    from taskq import App
    from taskq.worker.consumer_timeout import consumer_timeout_warnings

    app = App("t", consumer_timeout_s=600, prefetch_count=1)

    @app.task(time_limit_s=3600)
    def report() -> None: ...

    @app.task(time_limit_s=60)
    def quick() -> None: ...

    warnings = consumer_timeout_warnings(app, tuple(app.queue_names()))

    assert len(warnings) == 1
    assert report.name in warnings[0]
    assert "consumer_timeout = 3660000" in warnings[0] and "rabbitmq.conf" in warnings[0]
    assert consumer_timeout_warnings(app, ("other",)) == []


def test_the_consumer_timeout_warning_counts_the_deliveries_prefetched_ahead() -> None:
    from taskq import App
    from taskq.worker.consumer_timeout import consumer_timeout_warnings

    # Each task's own limit is far below the 1800 s timeout...
    app = App("t", consumer_timeout_s=1800, prefetch_count=16)

    @app.task(time_limit_s=115)
    def report() -> None: ...

    @app.task(time_limit_s=10)
    def quick() -> None: ...

    queues = tuple(app.queue_names())
    (warning,) = consumer_timeout_warnings(app, queues)

    # ...but a delivery of report can wait behind 15 prefetched reports: 16 x 115 = 1840 s.
    # One of quick waits at most 15 x 115 + 10 = 1735 s: not at risk.
    assert "report" in warning and "quick" not in warning.split(" may keep")[0]
    assert "up to 1840s" in warning and "prefetch 16 x 1 queue(s)" in warning
    assert "lower --prefetch to 15" in warning  # 15 x 115 = 1725 s fits
    assert "consumer_timeout = 1900000" in warning
    # Within the timeout at that prefetch; and each consumed queue brings its own prefetch.
    app.configure(prefetch_count=15)
    assert consumer_timeout_warnings(app, queues) == []
    (two_queues,) = consumer_timeout_warnings(app, (*queues, "other"))
    assert "up to 3450s" in two_queues and "lower --prefetch to 7" in two_queues
    # A task longer than the timeout on its own: no prefetch can help.
    app.configure(prefetch_count=1, consumer_timeout_s=60)
    (alone,) = consumer_timeout_warnings(app, queues)
    assert "--prefetch" not in alone and "consumer_timeout = 175000" in alone


@pytest.mark.parametrize(
    ("signum", "name"),
    [(9, "SIGKILL"), (15, "SIGTERM"), (34, "SIGRTMIN"), (38, "SIGRTMIN+4"),
     (63, "SIGRTMIN+29"), (64, "SIGRTMAX"), (99, "99")],
)
def test_every_signal_a_child_can_die_of_has_a_name(signum: int, name: str) -> None:
    from taskq.worker.signals import signal_name

    assert signal_name(signum) == name
