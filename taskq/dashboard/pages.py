"""The HTML pages: overview, queue, dead letters (replay, purge), task, outbox, login."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from taskq import dlq
from taskq.dashboard import data
from taskq.dashboard.context import dashboard
from taskq.dashboard.data import Source

if TYPE_CHECKING:
    from flask.typing import ResponseReturnValue

blueprint = Blueprint("pages", __name__)


def known_source(queue: str | None) -> Source:
    """The parking queue of ``queue`` (``None``: unroutable); 404 for a queue the app does
    not know."""
    if queue is not None and queue not in dashboard().app.queue_names():
        abort(404, f"unknown queue {queue!r}: this app knows "
                   f"{', '.join(dashboard().app.queue_names())}")
    return Source(queue)


#: Where parked messages are browsed: a queue's dead letters, and ``ns.unroutable``.
PARKED_PREFIXES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("/queues/<queue>/dead-letters", "dlq", {}),
    ("/unroutable", "unroutable", {"queue": None}),
)


def add_parked_rules(
    blueprint: Blueprint, rules: list[tuple[str, str, Callable[..., Any], tuple[str, ...]]]
) -> None:
    """Add each ``(suffix, endpoint, view, methods)`` for dead letters and unroutable alike.

    At ``/queues/<queue>/dead-letters<suffix>`` as endpoint ``dlq_<endpoint>`` and at
    ``/unroutable<suffix>`` as ``unroutable_<endpoint>`` (its views get ``queue=None``).
    """
    for prefix, kind, defaults in PARKED_PREFIXES:
        for suffix, endpoint, view, methods in rules:
            blueprint.add_url_rule(prefix + suffix, f"{kind}_{endpoint}", view,
                                   defaults=defaults, methods=list(methods))


def parked_url(source: Source, view: str, **values: Any) -> str:
    """URL of a dead-letter ``view`` (list, message, replay, purge) of ``source``."""
    if source.queue is None:
        return url_for(f"pages.unroutable_{view}", **values)
    return url_for(f"pages.dlq_{view}", queue=source.queue, **values)


@blueprint.app_context_processor
def _helpers() -> dict[str, object]:
    return {"parked_url": parked_url}


@blueprint.get("/")
def overview() -> ResponseReturnValue:
    return render_template("overview.html", view=dashboard().overview())


@blueprint.get("/queues/<queue>")
def queue_page(queue: str) -> ResponseReturnValue:
    known_source(queue)
    view = dashboard().overview()
    row = next((q for q in view["status"].get("queues", []) if q["name"] == queue), None)
    tasks = sorted(t.name for t in dashboard().app.registry if t.queue == queue)
    return render_template("queue.html", view=view, queue=queue, row=row, tasks=tasks,
                           rates=view["rates"]["queues"].get(queue, {}))


def _list(queue: str | None) -> ResponseReturnValue:
    source = known_source(queue)
    task = request.args.get("task") or None
    listing = data.dead_letters(dashboard().app, source, task=task)
    return render_template("dead_letters.html", source=source, listing=listing)


def _message(queue: str | None, task_id: str) -> ResponseReturnValue:
    source = known_source(queue)
    message = data.dead_letter(dashboard().app, source, task_id)
    if message is None:
        abort(404, f"no message {task_id!r} in {source.label} (replayed or purged already?)")
    return render_template("message.html", source=source, message=message)


def _replay(queue: str | None) -> ResponseReturnValue:
    source = known_source(queue)
    dashboard().guard.check_form_action()
    ids = [i for i in request.form.getlist("id") if i]
    tasks = [t for t in request.form.getlist("task") if t]
    if not ids and not tasks and request.form.get("all") != "yes":
        abort(400, "choose what to replay: a message, a task, or all")
    report = dlq.replay(dashboard().app, source.queue, unroutable=source.unroutable,
                        ids=ids, tasks=tasks)
    flash(f"replayed {report.replayed} of {report.examined} messages looked at from "
          f"{source.label} ({report.skipped} not selected, {report.unroutable} still "
          f"without a queue)")
    return redirect(parked_url(source, "list"))


def _purge_form(queue: str | None) -> ResponseReturnValue:
    source = known_source(queue)
    dashboard().guard.check_enabled()
    depth = dlq.depth(dashboard().app, source.queue, unroutable=source.unroutable)
    return render_template("purge.html", source=source, depth=depth)


def _purge(queue: str | None) -> ResponseReturnValue:
    source = known_source(queue)
    dashboard().guard.check_form_action()
    if request.form.get("confirm", "").strip() != source.label:
        flash(f"not purged: type {source.label} to confirm")
        return redirect(parked_url(source, "purge"))
    count = dlq.purge(dashboard().app, source.queue, unroutable=source.unroutable)
    flash(f"purged {count} messages from {source.label}")
    return redirect(parked_url(source, "list"))


add_parked_rules(blueprint, [
    ("/", "list", _list, ("GET",)),
    ("/m/<task_id>", "message", _message, ("GET",)),
    ("/replay", "replay", _replay, ("POST",)),
    ("/purge", "purge", _purge_form, ("GET",)),
    ("/purge", "purge_post", _purge, ("POST",)),
])


@blueprint.get("/tasks")
def task_search() -> ResponseReturnValue:
    task_id = request.args.get("id", "").strip()
    if not task_id:
        abort(400, "give a task id")
    return redirect(url_for("pages.task_page", task_id=task_id))


@blueprint.get("/tasks/<task_id>")
def task_page(task_id: str) -> ResponseReturnValue:
    """Where a task stands (as ``taskq inspect``); 404 for an id nothing is known about."""
    app = dashboard().app
    task = data.task(app, task_id)
    page = render_template("task.html", task=task, queue_names=app.queue_names())
    return page, 200 if task["known"] else 404


@blueprint.get("/outbox")
def outbox_page() -> ResponseReturnValue:
    return render_template("outbox.html", outbox=data.outbox(dashboard().app))


def local_path(target: str) -> str | None:
    r"""``target`` when it is a path of this site, else ``None`` (never an open redirect).

    Browsers read ``//host`` and ``/\host`` as another site, drop tabs and newlines
    anywhere in a URL (so ``/\t/host`` becomes ``//host``), and Werkzeug drops them from
    the ``Location`` it sends too. So a target must start with one ``/``, hold no backslash
    and no control, format or separator character but the space, and stay so once
    percent-decoded (``/%2Fhost``, ``/%09/host``), for whatever decodes it on the way.
    """
    if not all(_plain_path(form) for form in (target, unquote(target))):
        return None
    return target


def _plain_path(path: str) -> bool:
    return (path.startswith("/") and not path.startswith("//") and "\\" not in path
            and path.isprintable())  # False for tabs, CR, LF, NUL, U+2028, U+200B...


@blueprint.get("/login")
def login_form() -> ResponseReturnValue:
    return render_template("login.html", next=local_path(request.args.get("next", "")) or "")


@blueprint.post("/login")
def login() -> ResponseReturnValue:
    from taskq.dashboard.security import check_csrf

    check_csrf()
    if not dashboard().guard.login(request.form.get("token")):
        # The form again, with the reason: a bare 403 page leaves the user nowhere to retry.
        next_path = local_path(request.form.get("next", "")) or ""
        return render_template("login.html", next=next_path,
                               error="wrong dashboard token: try again"), 403
    return redirect(local_path(request.form.get("next", "")) or url_for("pages.overview"))


@blueprint.post("/logout")
def logout() -> ResponseReturnValue:
    from flask import session

    from taskq.dashboard.security import check_csrf

    check_csrf()
    session.clear()
    return redirect(url_for("pages.overview"))
