"""Who may read and change anything, and CSRF protection (docs/dashboard.md, "Safety").

* Every request must name a host the dashboard answers (:mod:`taskq.dashboard.hosts`: its
  own address, ``localhost``, allowed names), or it is refused with 400 (DNS rebinding).
* Reading needs nothing when :class:`~taskq.dashboard.server.DashboardServer` serves it on
  a loopback address; on any other address, and from a bare
  :func:`~taskq.dashboard.web.create_app` given a token, every page needs the token too.
* Replay and purge need the token. In the browser it is given once on ``/login`` and kept
  in the session, a signed cookie (``HttpOnly``, ``SameSite=Strict``) whose key is drawn at
  random when the dashboard starts, so a restart logs everyone out. Each form carries the
  session's CSRF token, compared in constant time; a request whose ``Origin`` is another
  site is refused as well. The JSON API takes the token as ``Authorization: Bearer TOKEN``
  and never looks at cookies for a change, so a cross-site page cannot act with it.
* Without a token, or with ``--read-only``, actions are hidden and refused.
* Every refused token (at login, on a read, on an action) is logged at WARNING with the
  client's address and the request, never with the token given.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from flask import abort, request, session

from taskq.dashboard.hosts import AllowedHosts

logger = logging.getLogger(__name__)
ENV_TOKEN = "TASKQ_DASHBOARD_TOKEN"
CSRF_FIELD = "csrf_token"

# Sent with every response: no inline script or style, no framing, no referrer.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Guard:
    """The dashboard's rules: its token, read-only mode, whether reading needs the token,
    and the ``Host`` names it answers."""

    token: str | None
    read_only: bool = False
    reads_need_login: bool = False
    hosts: AllowedHosts = field(default_factory=AllowedHosts)

    @property
    def actions_enabled(self) -> bool:
        """Replay and purge are offered (a token is set and not read-only)."""
        return self.token is not None and not self.read_only

    @property
    def actions_disabled_reason(self) -> str | None:
        if self.read_only:
            return "read-only mode: replay and purge are disabled"
        if self.token is None:
            return ("no token: start the dashboard with --token or TASKQ_DASHBOARD_TOKEN to "
                    "enable replay and purge")
        return None

    def token_matches(self, given: str | None) -> bool:
        return bool(self.token and given) and hmac.compare_digest(
            str(given).encode(), str(self.token).encode())

    def logged_in(self) -> bool:
        return self.token is not None and session.get("auth") is True

    def login(self, given: str | None) -> bool:
        """Check ``given`` against the token; on success mark the session logged in."""
        if not self.token_matches(given):
            _log_refusal("wrong token at login")
            return False
        session.clear()
        session["auth"] = True
        session[CSRF_FIELD] = secrets.token_urlsafe(32)
        return True

    def check_form_action(self) -> None:
        """Abort with 403 unless this form POST may change something."""
        self.check_enabled()
        check_csrf()
        if not self.logged_in():
            abort(403, "replay and purge need the dashboard token: log in first")

    def check_api_action(self) -> None:
        """Abort with 403 unless this API call carries the token."""
        self.check_enabled()
        if not self.token_matches(_bearer()):
            _log_refusal("API action without the right bearer token")
            abort(403, "replay and purge need the dashboard token: send it as "
                       "'Authorization: Bearer TOKEN'")

    def check_host(self) -> None:
        """Abort with 400 unless the request names a host this dashboard answers."""
        if not self.hosts.allows(request.host):
            # Werkzeug gives "" for a Host it cannot parse: name what the client sent
            why = self.hosts.refusal(request.headers.get("Host") or request.host)
            logger.warning("dashboard: %s from %s (%s %s)", why, request.remote_addr,
                           request.method, request.path)
            abort(400, why)

    def check_read(self) -> None:
        """Abort with 403 when pages need the token and this request has none."""
        if not self.reads_need_login or self.logged_in():
            return
        given = _bearer()
        if self.token_matches(given):
            return
        if given is not None:
            _log_refusal("read with a wrong bearer token")
        abort(403, "every page of this dashboard needs its token: log in on /login, or send "
                   "'Authorization: Bearer TOKEN'")

    def check_enabled(self) -> None:
        reason = self.actions_disabled_reason
        if reason:
            abort(403, reason)


def _log_refusal(what: str) -> None:
    logger.warning("dashboard: %s from %s (%s %s) refused", what, request.remote_addr,
                   request.method, request.path)


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[len("Bearer "):] if header.startswith("Bearer ") else None


def csrf_token() -> str:
    """The session's CSRF token (created on first use), for the forms."""
    token = session.get(CSRF_FIELD)
    if not isinstance(token, str):
        token = session[CSRF_FIELD] = secrets.token_urlsafe(32)
    return token


def check_csrf() -> None:
    """Abort with 403 unless the form's CSRF token is the session's and the origin is ours."""
    origin = request.headers.get("Origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.host:
        abort(403, f"cross-site request from {origin} refused")
    expected = session.get(CSRF_FIELD)
    given = request.form.get(CSRF_FIELD, "")
    if not isinstance(expected, str) or not hmac.compare_digest(given.encode(),
                                                                expected.encode()):
        abort(403, "the form's CSRF token is missing or stale: reload the page and try again")
