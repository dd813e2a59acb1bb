"""The JSON API under ``/api/`` (docs/dashboard.md lists every endpoint).

Reads return the same dictionaries the pages render; ``/api/status`` is exactly
``taskq status --json``. Replay and purge are ``POST`` with ``Authorization: Bearer TOKEN``
and a JSON body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import Blueprint, abort, jsonify, request

from taskq import dlq
from taskq.dashboard import data
from taskq.dashboard.context import dashboard
from taskq.dashboard.pages import add_parked_rules, known_source

if TYPE_CHECKING:
    from flask.typing import ResponseReturnValue

blueprint = Blueprint("api", __name__)


@blueprint.get("/status")
def status() -> ResponseReturnValue:
    return jsonify(data.status(dashboard().app))


@blueprint.get("/overview")
def overview() -> ResponseReturnValue:
    return jsonify(dashboard().overview())


@blueprint.get("/queues/<queue>")
def queue(queue: str) -> ResponseReturnValue:
    known_source(queue)
    view = dashboard().overview()
    row = next((q for q in view["status"].get("queues", []) if q["name"] == queue), None)
    return jsonify({"queue": row, "rates": view["rates"]["queues"].get(queue),
                    "rate_notes": view["rates"]["notes"],
                    "tasks": sorted(t.name for t in dashboard().app.registry
                                    if t.queue == queue)})


def _list(queue: str | None) -> ResponseReturnValue:
    source = known_source(queue)
    return jsonify(data.dead_letters(dashboard().app, source,
                                     task=request.args.get("task") or None))


def _message(queue: str | None, task_id: str) -> ResponseReturnValue:
    source = known_source(queue)
    message = data.dead_letter(dashboard().app, source, task_id)
    if message is None:
        abort(404, f"no message {task_id!r} in {source.label}")
    return jsonify(message)


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        abort(400, "send a JSON object as the request body")
    return body


def _strings(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        abort(400, f"{name!r} must be a list of strings")
    return value


def _replay(queue: str | None) -> ResponseReturnValue:
    source = known_source(queue)
    dashboard().guard.check_api_action()
    body = _body()
    ids, tasks = _strings(body, "ids"), _strings(body, "tasks")
    limit = body.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        abort(400, "'limit' must be a positive integer")
    if not ids and not tasks and body.get("all") is not True:
        abort(400, "give 'ids', 'tasks' or \"all\": true")
    report = dlq.replay(dashboard().app, source.queue, unroutable=source.unroutable,
                        ids=ids, tasks=tasks, limit=limit)
    # The examined ids stay out (a whole queue's worth); what matched nothing is said instead.
    answer = {name: value for name, value in vars(report).items() if name != "parked_ids"}
    answer["unmatched"] = report.unmatched(ids=ids, tasks=tasks)
    return jsonify(answer)


def _purge(queue: str | None) -> ResponseReturnValue:
    source = known_source(queue)
    dashboard().guard.check_api_action()
    if _body().get("confirm") != source.label:
        abort(400, f"to purge, send {{\"confirm\": \"{source.label}\"}}")
    count = dlq.purge(dashboard().app, source.queue, unroutable=source.unroutable)
    return jsonify({"purged": count})


add_parked_rules(blueprint, [
    ("", "list", _list, ("GET",)),
    ("/m/<task_id>", "message", _message, ("GET",)),
    ("/replay", "replay", _replay, ("POST",)),
    ("/purge", "purge", _purge, ("POST",)),
])


@blueprint.get("/tasks/<task_id>")
def task(task_id: str) -> ResponseReturnValue:
    return jsonify(data.task(dashboard().app, task_id))


@blueprint.get("/outbox")
def outbox() -> ResponseReturnValue:
    return jsonify(data.outbox(dashboard().app))
