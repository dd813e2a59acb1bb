"""Dashboard parts without services: templates (schedules, escaping), rates, binding rules."""

from __future__ import annotations

from typing import Any

import pytest
from flask import render_template

from taskq import App
from taskq.dashboard.data import shorten
from taskq.dashboard.hosts import is_loopback
from taskq.dashboard.rates import FINISHED_NOTE, METRICS_NOTE, PUBLISH_NOTE, RateTracker
from taskq.dashboard.server import check_binding
from taskq.dashboard.web import create_app
from taskq.errors import ConfigurationError


def _view(**status: Any) -> dict[str, Any]:
    base = {
        "app": "shop", "broker_url": "amqp://guest:***@127.0.0.1:5672/%2F",
        "database_url": "sqlite:///x", "source": "amqp", "broker_error": None,
        "queues": [{"name": "emails", "exists": True, "ready": 7, "unacked": None,
                    "consumers": 2, "dead_letters": 1}],
        "unroutable": 0, "delayed": 3, "delay_backend": "tiers", "consumers": 2,
        "outbox": {"rows": 4, "oldest_age_s": 150.0, "failing_rows": 1, "error": None},
        **status,
    }
    return {
        "status": base,
        "rates": {"queues": {"emails": {"published_per_s": None, "acked_per_s": None,
                                        "acked_source": None, "ready_change_per_s": 0.5,
                                        "finished_per_s": None}}, "notes": [PUBLISH_NOTE]},
        "workers": {"served_from_worker": True, "processes": 2, "alive": 2, "restarts": 1,
                    "healthy": True},
        "schedules": base.get("schedules") or [],
        "schedulers": base.get("schedulers") or [],
    }


def _render(view: dict[str, Any]) -> str:
    web = create_app(App("shop", broker_url="amqp://guest:pw@127.0.0.1:5672/%2F"))
    with web.test_request_context("/"):
        return render_template("overview.html", view=view)


def test_overview_renders_schedules_and_schedulers_when_the_status_has_them() -> None:
    html = _render(_view(
        schedules=[{"name": "nightly-report", "task": "shop.report", "schedule": "0 3 * * *",
                    "next_run": "2026-12-02T03:00:00+00:00", "last_run": None}],
        schedulers=[{"id": "b1", "host": "web-1", "pid": 42,
                     "last_seen": "2026-12-01T12:00:00+00:00"}],
    ))
    assert '<table id="schedules">' in html
    assert "<td>nightly-report</td><td>shop.report</td><td>0 3 * * *</td>" in html
    assert "<td>2026-12-02T03:00:00+00:00</td><td>never</td>" in html
    assert "b1 on web-1 (pid 42" in html


def test_overview_has_no_schedules_section_without_schedules() -> None:
    assert 'id="schedules"' not in _render(_view())
    assert 'id="schedules"' not in _render(_view(schedules=[]))


def test_overview_warns_when_schedules_exist_but_no_scheduler_reports() -> None:
    html = _render(_view(schedules=[{"name": "n", "task": "t", "schedule": "every 60s",
                                     "next_run": None, "last_run": None}]))
    assert "no scheduler has reported" in html


def test_values_from_the_status_are_escaped() -> None:
    html = _render(_view(schedules=[{"name": "<script>alert(1)</script>", "task": "t",
                                     "schedule": "x", "next_run": None, "last_run": None}]))
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_overview_shows_counts_unknowns_and_worker_processes() -> None:
    html = _render(_view())
    assert '<td class="n" data-field="ready">7</td>' in html
    assert '<td class="n" data-field="unacked">n/a</td>' in html
    assert "processes alive: <span data-live=\"workers.alive\">2</span> of 2" in html
    assert "2.5 min" in html  # the outbox's oldest row


def test_shorten_cuts_long_values_and_says_how_much() -> None:
    assert shorten("abc") == "abc"
    assert shorten([1, 2]) == "[1, 2]"
    assert shorten("x" * 310, 300) == "x" * 300 + "... (10 more characters)"


def test_rates_come_from_two_observations_at_least_a_second_apart() -> None:
    now = [100.0]
    finished = [{"emails": 10.0}]
    tracker = RateTracker(lambda: finished[0], clock=lambda: now[0])
    status = {"queues": [{"name": "emails", "ready": 10}]}

    first = tracker.observe(status)
    assert first["queues"]["emails"]["ready_change_per_s"] is None
    now[0], finished[0] = 102.0, {"emails": 30.0}
    status["queues"][0]["ready"] = 16
    second = tracker.observe(status)["queues"]["emails"]
    assert second == {"published_per_s": None, "acked_per_s": 10.0,
                      "acked_source": "this worker", "ready_change_per_s": 3.0,
                      "finished_per_s": 10.0}


def test_the_brokers_rates_are_shown_when_the_management_api_gives_them() -> None:
    now = [0.0]
    tracker = RateTracker(lambda: {"emails": 5.0}, clock=lambda: now[0])
    status = {"queues": [{"name": "emails", "ready": 4, "published_per_s": 12.5,
                          "acked_per_s": 11.0}]}
    first = tracker.observe(status)
    assert first["queues"]["emails"]["published_per_s"] == 12.5  # no second look needed
    now[0] = 2.0
    rates = tracker.observe(status)
    emails = rates["queues"]["emails"]
    # every consumer's acks (the broker's), not only this worker's finished tasks
    assert (emails["acked_per_s"], emails["acked_source"]) == (11.0, "broker")
    assert emails["finished_per_s"] == 0.0
    assert PUBLISH_NOTE not in rates["notes"]
    assert not any("--metrics-port" in note for note in rates["notes"])


def test_overview_shows_the_brokers_rates_and_where_acked_comes_from() -> None:
    view = _view(source="management")
    view["rates"] = {"queues": {"emails": {
        "published_per_s": 12.5, "acked_per_s": 11.0, "acked_source": "broker",
        "ready_change_per_s": 0.5, "finished_per_s": None}}, "notes": []}
    html = _render(view)
    assert '<td class="n" data-rate="published_per_s">12.5</td>' in html
    assert '<td class="n" data-rate="acked_per_s">11.0</td>' in html


def test_without_worker_metrics_the_acked_rate_is_unknown_with_a_reason() -> None:
    now = [0.0]
    tracker = RateTracker(clock=lambda: now[0])
    tracker.observe({"queues": [{"name": "q", "ready": 1}]})
    now[0] = 5.0
    rates = tracker.observe({"queues": [{"name": "q", "ready": 1}]})
    assert rates["queues"]["q"]["finished_per_s"] is None
    assert rates["queues"]["q"]["acked_per_s"] is None
    assert PUBLISH_NOTE in rates["notes"]
    assert any("--metrics-port" in note for note in rates["notes"])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_hosts_need_no_token(host: str) -> None:
    assert is_loopback(host)
    check_binding(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "dashboard.example"])
def test_other_hosts_need_a_token(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigurationError, match="without a token"):
        check_binding(host, None)
    check_binding(host, "a-token")


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="token is empty"):
        check_binding("127.0.0.1", "  ")


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil.example",
                                    "evil", "/ok\r\nSet-Cookie: x=1", ""])
def test_login_never_redirects_off_site(target: str) -> None:
    from taskq.dashboard.pages import local_path

    assert local_path(target) is None


def test_login_redirects_to_a_path_of_the_site() -> None:
    from taskq.dashboard.pages import local_path

    path = "/queues/emails/dead-letters/?task=t"
    assert local_path(path) == path


def test_a_worker_served_dashboard_is_never_told_to_be_served_from_a_worker() -> None:
    # Given the tracker of a dashboard a worker serves: with metrics, and without
    now = [0.0]
    with_metrics = RateTracker(lambda: {"q": 1.0}, clock=lambda: now[0])
    without_metrics = RateTracker(lambda: None, clock=lambda: now[0])
    status = {"queues": [{"name": "q", "ready": 1}]}

    # When each renders its first overview (no earlier observation yet)
    first = with_metrics.observe(status)["notes"]
    bare = without_metrics.observe(status)["notes"]

    # Then neither says "serve the dashboard from taskq worker"; the one without metrics
    # asks for --metrics-port, the first only for a second observation
    assert FINISHED_NOTE not in first and FINISHED_NOTE not in bare
    assert [note for note in first if "metrics" in note] == []
    assert any("rates need two observations" in note for note in first)
    assert METRICS_NOTE in bare
