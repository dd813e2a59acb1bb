"""``taskq dashboard``: a web page for operators (docs/dashboard.md).

Server-rendered pages and a JSON API under ``/api/`` over what ``taskq status``, ``taskq dlq``
and ``taskq inspect`` already read: queues, dead letters (with replay and purge), the
outbox, task results, worker processes and schedules. Built on Flask (the ``dashboard``
extra); nothing here is imported by the core, and :mod:`taskq.cli.dashboard` imports it only
when the command runs.

* :mod:`taskq.dashboard.data`: the figures, as JSON-ready dictionaries (no Flask).
* :mod:`taskq.dashboard.rates`: rates from successive observations, labelled honestly.
* :mod:`taskq.dashboard.security`: the token, the session and CSRF protection;
  :mod:`taskq.dashboard.hosts`: which ``Host`` it answers (DNS rebinding).
* :mod:`taskq.dashboard.web`: the Flask app factory; :mod:`~taskq.dashboard.pages` and
  :mod:`~taskq.dashboard.api` hold the views.
* :mod:`taskq.dashboard.server`: the WSGI server, standalone or on a supervisor thread.
"""
