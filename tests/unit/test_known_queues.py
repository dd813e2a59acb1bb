"""``check_known_queues``: what ``taskq worker -Q`` accepts (issue 26, 3.13)."""

from __future__ import annotations

import logging

import pytest

from taskq import App, ConfigurationError
from taskq.worker.preflight import check_known_queues


@pytest.fixture
def shop() -> App:
    app = App("shop", default_queue="default")
    app.queue("nc_work")
    app.queue("ledger", partitions=4)

    @app.task(queue="emails")
    def send(to: str) -> None: ...

    return app


def test_known_queues_and_partitions_pass(shop: App) -> None:
    check_known_queues(shop, ("default", "emails", "nc_work", "ledger", "ledger.p3"))


def test_every_unknown_queue_is_named_with_its_closest_known_one(shop: App) -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_known_queues(shop, ("nc_wrk", "emails", "ledger.p4", "zzz"))

    message = str(refused.value)
    assert message.startswith(
        "unknown queues 'nc_wrk' (did you mean 'nc_work'?), 'ledger.p4' (did you mean "
    )
    assert (", 'zzz'; app shop knows default, emails, ledger (partitions "
            "ledger.p0..ledger.p3), nc_work.") in message
    assert "would create them" in message
    assert "--declare-new-queues" in message
    assert refused.value.exit_code == 2


def test_declare_new_queues_lets_them_through_with_a_warning(
    shop: App, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="taskq.worker.preflight"):
        check_known_queues(shop, ("nc_wrk", "default"), allow_new=True)

    assert [r.getMessage() for r in caplog.records] == [
        "queue 'nc_wrk' is not named by app shop's code; declaring and consuming it "
        "(--declare-new-queues)"
    ]
