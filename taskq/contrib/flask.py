"""Flask integration: configuration from ``app.config``, the request's transaction, app context.

.. code-block:: python

    db = SQLAlchemy()
    taskq = TaskQ(db=db)                    # or TaskQ(app, db=db) without a factory

    @taskq.task
    def send_confirmation(order_id: int) -> None: ...

    def create_app() -> Flask:
        app = Flask(__name__)
        app.config.from_mapping(SQLALCHEMY_DATABASE_URI=..., TASKQ_BROKER_URL=...)
        db.init_app(app)
        taskq.init_app(app)                 # after db.init_app
        return app

- ``TASKQ_<SETTING>`` keys of ``app.config`` become the App's settings (they win over
  ``TASKQ_*`` environment variables; ``taskq worker`` flags win over them). Without
  ``TASKQ_DATABASE_URL`` the outbox lives in Flask-SQLAlchemy's database.
- Inside an application or request context, ``task.delay(...)`` adds a row to the outbox in
  ``db.session``'s transaction: it is published after ``db.session.commit()`` and never if
  the session rolls back. A request that enqueued and ended without committing logs a
  warning. Outside a context, ``delay()`` publishes directly.
- In the worker every task runs inside ``app.app_context()``, so it can use ``db.session``
  and ``current_app`` (commit what it writes, including tasks it enqueues).
- ``flask taskq worker`` (``relay``, ``db create``...) runs ``taskq`` with the app filled in;
  ``taskq worker -A yourmodule:taskq`` works as well.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import click
import sqlalchemy as sa
from flask import Flask, current_app, has_app_context

from taskq.app import App
from taskq.errors import ConfigurationError
from taskq.settings import ENV_PREFIX, Settings

__all__ = ["TaskQ", "settings_from_config"]

logger = logging.getLogger(__name__)

EXTENSION_KEY = "taskq"
# session.info keys: tasks enqueued in the open transaction; listener installed.
_ENQUEUED = "taskq_enqueued"
_WATCHED = "taskq_watched"


class TaskQ:
    """The taskq extension of a Flask application.

    Args:
        app: The Flask app; or call :meth:`init_app` later (application factories).
        db: Flask-SQLAlchemy's ``SQLAlchemy`` object; ``delay()`` in a request enqueues
            through its session. Without it, ``delay()`` always publishes directly.
        taskq_app: An existing :class:`~taskq.App`; by default one is created.
        name: Name of the created App (``app_id``); defaults to the Flask app's name.

    Attributes:
        taskq_app: The :class:`~taskq.App` (``taskq worker -A module:ext`` finds it here).
        task: ``taskq_app.task``, the decorator.
        queue: ``taskq_app.queue``.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        db: Any = None,
        taskq_app: App | None = None,
        name: str | None = None,
    ) -> None:
        if taskq_app is None:
            taskq_app = App(name or (app.name if app is not None else "flask"))
        self.taskq_app = taskq_app
        self.db = db
        # Each init_app starts again from these (constructor, environment), so that a
        # second Flask app (tests, factories) does not inherit the first one's config.
        self._base_settings = dataclasses.asdict(taskq_app.settings)
        self.task = taskq_app.task
        self.queue = taskq_app.queue
        self._context_hook: Callable[[], AbstractContextManager[Any]] | None = None
        if app is not None:
            self.init_app(app)

    def __repr__(self) -> str:
        return f"<TaskQ {self.taskq_app!r}>"

    def init_app(self, app: Flask) -> None:
        """Configure the App from ``app.config`` and hook it into ``app``.

        Call it after ``db.init_app(app)``. The App serves one Flask app at a time: the
        last one given here runs the tasks in the worker.

        Raises:
            ConfigurationError: an unknown ``TASKQ_*`` key or an invalid value.
        """
        settings = settings_from_config(app.config)
        if "database_url" not in settings and self.db is not None:
            with app.app_context():
                url = self.db.engine.url
            settings["database_url"] = url.render_as_string(hide_password=False)
        self.taskq_app.configure(**{**self._base_settings, **settings})
        app.extensions[EXTENSION_KEY] = self
        hooks = self.taskq_app.task_context
        if self._context_hook in hooks:
            hooks.remove(self._context_hook)
        self._context_hook = app.app_context
        hooks.append(app.app_context)
        if self.db is not None:
            self.taskq_app.session_provider = self._current_session
            app.teardown_appcontext(self._warn_if_uncommitted)
        app.cli.add_command(_taskq_command)

    def _current_session(self) -> Any:
        """``db.session`` inside one of our apps' contexts, else ``None`` (publish directly)."""
        if not has_app_context() or current_app.extensions.get(EXTENSION_KEY) is not self:
            return None
        session = self.db.session()
        if _WATCHED not in session.info:
            session.info[_WATCHED] = True
            sa.event.listen(session, "after_transaction_end", _transaction_ended)
        session.info[_ENQUEUED] = True
        return session

    def _warn_if_uncommitted(self, exc: BaseException | None) -> None:
        # Runs before Flask-SQLAlchemy's own teardown (registered earlier, called later),
        # which rolls the session back. An exception means the rollback is the point.
        if exc is not None or not self.db.session.registry.has():
            return
        session = self.db.session()
        # The flag is set when delay() asked for the session, the transaction check tells
        # whether it got as far as writing (an argument that failed to encode did not).
        if session.info.get(_ENQUEUED) and session.in_transaction():
            logger.warning(
                "a task was enqueued in db.session, but the session was not committed "
                "before the end of the request (application context); the outbox row is "
                "discarded and the task will not run. Call db.session.commit() after "
                "task.delay(...)"
            )


def settings_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the taskq settings among ``config``'s ``TASKQ_<SETTING>`` keys.

    Raises:
        ConfigurationError: a ``TASKQ_`` key that names no setting.
    """
    names = Settings.names()
    settings: dict[str, Any] = {}
    unknown = []
    for key, value in config.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name in names:
            settings[name] = value
        else:
            unknown.append(key)
    if unknown:
        raise ConfigurationError(
            f"unknown taskq setting(s) in the Flask config: {', '.join(sorted(unknown))}; "
            f"known keys are TASKQ_ + one of: {', '.join(sorted(n.upper() for n in names))}",
            settings=sorted(unknown),
        )
    return settings


def _transaction_ended(session: Any, transaction: Any) -> None:
    if transaction.parent is None:  # committed or rolled back: no row left in doubt
        session.info.pop(_ENQUEUED, None)


@click.command(
    "taskq",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def _taskq_command(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Run taskq commands for this app: worker, relay, db create... (see --help)."""
    from flask.cli import ScriptInfo

    from taskq.contrib._cli import run_taskq_command

    info = ctx.find_object(ScriptInfo)
    if info is not None and info.app_import_path:
        # Worker processes start fresh interpreters, which find the Flask app the same way.
        os.environ["FLASK_APP"] = info.app_import_path
    run_taskq_command(
        args or ("--help",), app_path=f"{__name__}:{_CLI_APP}", prog_name="flask taskq"
    )


# `-A taskq.contrib.flask:flask_cli_app` (given by `flask taskq ...`) resolves to the App of
# the Flask app that `flask` would load: the current one, or in a fresh worker process the
# one FLASK_APP (or wsgi.py / app.py) names.
_CLI_APP = "flask_cli_app"


def __getattr__(name: str) -> Any:
    if name != _CLI_APP:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if has_app_context():
        flask_app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    else:
        from flask.cli import ScriptInfo

        flask_app = ScriptInfo(app_import_path=os.environ.get("FLASK_APP")).load_app()
    extension = flask_app.extensions.get(EXTENSION_KEY)
    if not isinstance(extension, TaskQ):
        raise ConfigurationError(
            f"the Flask app {flask_app.name!r} has no taskq extension; call "
            "TaskQ(app) or taskq.init_app(app) when creating it"
        )
    return extension.taskq_app
