"""The dashboard's guards against other sites, in a real Chromium: a name rebound to
127.0.0.1 is refused (DNS rebinding), and login never redirects off the dashboard."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from taskq import App
from tests.browser.conftest import CHROMIUM, TOKEN, Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EVIL = "evil.example"


def test_a_page_whose_name_points_at_127_0_0_1_cannot_read_the_dashboard(
    app: App, browser: Any, serve_dashboard: Any
) -> None:
    # Given a dashboard on loopback without a token (reading needs none there), and a
    # Chromium whose resolver maps evil.example to 127.0.0.1, as a rebinding DNS server does
    app.create_tables()
    base = serve_dashboard(token=None)
    port = urlsplit(base).port
    rebound = browser.browser_type.launch(
        executable_path=CHROMIUM, args=[f"--host-resolver-rules=MAP {EVIL} 127.0.0.1"])
    try:
        page = rebound.new_page()

        # When that site's page reads the dashboard under its own name
        response = page.goto(f"http://{EVIL}:{port}/api/outbox")

        # Then it is refused, saying which Host and how to allow it
        assert response is not None and response.status == 400
        error = response.json()["error"]
        assert f"'{EVIL}:{port}' refused" in error and f"--allow-host {EVIL}" in error
        assert page.goto(f"http://{EVIL}:{port}/").status == 400

        # While the dashboard's own names are answered
        assert page.goto(f"http://localhost:{port}/api/outbox").status == 200
        assert page.goto(f"{base}/api/outbox").status == 200
    finally:
        rebound.close()


def test_login_with_a_hostile_next_stays_on_the_dashboard(
    browser: Any, page: Page, serve_dashboard: Any
) -> None:
    # Given a dashboard with a token and two browsers: one that does not apply the
    # dashboard's CSP (as a browser without form-action on redirects), so the server's
    # Location alone decides where a login goes, and one that applies it
    base = serve_dashboard()
    no_csp = browser.new_context(bypass_csp=True)
    try:
        for tab in (no_csp.new_page(), page.page):
            requested: list[str] = []
            tab.on("request", lambda request, seen=requested: seen.append(request.url))

            # When the operator follows a login link whose next holds a tab (Chromium drops
            # it, which turns /<TAB>/evil.example/x into //evil.example/x) and logs in
            tab.goto(f"{base}/login?next=/%09/{EVIL}/x")
            _log_in(tab)

            # Then the browser asked nothing of the other site and shows the overview
            assert [url for url in requested if EVIL in urlsplit(url).netloc] == []
            assert urlsplit(tab.url).netloc == urlsplit(base).netloc, tab.url
            assert tab.locator("#queues").count() == 1

            # And the same when the form itself posts that next (the server checks it too)
            tab.goto(f"{base}/login")
            tab.locator("input[name=next]").evaluate("(el, v) => { el.value = v; }",
                                                     f"/\t/{EVIL}/x")
            _log_in(tab)
            assert [url for url in requested if EVIL in urlsplit(url).netloc] == []
            assert urlsplit(tab.url).netloc == urlsplit(base).netloc, tab.url
    finally:
        no_csp.close()


def _log_in(page: Any) -> None:
    """Log in on the open login form and wait until its redirect has been followed
    (wherever it led: on a browser applying the CSP, an aborted one stays on /login)."""
    page.fill("input[name=token]", TOKEN)
    page.click("button[name=login]")
    page.wait_for_url(lambda url: urlsplit(url).path != "/login", timeout=10_000)
    page.wait_for_load_state()
