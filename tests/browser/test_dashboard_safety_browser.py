"""The dashboard's guards against other sites, in a real Chromium: a name rebound to
127.0.0.1 is refused (DNS rebinding), and login never redirects off the dashboard."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from taskq import App
from tests.browser.conftest import CHROMIUM

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
