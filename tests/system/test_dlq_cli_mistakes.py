"""`taskq dlq` given the wrong queue, task name or id (issue 28, item 5): the real CLI says
what is there instead and exits non-zero; nothing is moved that was not asked for."""

from __future__ import annotations

from taskq import App
from taskq.broker import topology as topo
from tests.system.test_dlq_cli import park_dead_letters, taskq
from tests.system.workers import declare_topology


def test_list_without_a_queue_names_the_apps_queues(app: App) -> None:
    result = taskq(app, "list", "-A", "tests.tasks:app")

    assert result.returncode == 2
    assert "e.g. emails" not in result.stderr
    assert "give the work queue whose dead letters to use" in result.stderr
    assert f"app taskq-tests's queues: {app.settings.default_queue}" in result.stderr
    assert f"or --unroutable for {app.topology.unroutable}" in result.stderr


def test_replay_of_a_task_name_not_parked_names_the_parked_ones_and_fails(
    app: App, broker
) -> None:
    queue, dlq = app.settings.default_queue, topo.dlq_name(app.settings.default_queue)
    park_dead_letters(app, broker, [("a1", "shop.tasks.send"), ("a2", "shop.tasks.send"),
                                    ("b1", "shop.tasks.charge")])

    result = taskq(app, "replay", queue, "-A", "tests.tasks:app", "--task", "send")

    assert result.returncode == 1
    assert "0 replayed, 3 not selected (left in place); 3 examined" in result.stdout
    assert result.stderr.strip().splitlines() == [
        f"Error: no message of task 'send' is parked in {dlq} (did you mean "
        "'shop.tasks.send'?). Parked there by task: shop.tasks.charge (1), "
        "shop.tasks.send (2)"
    ]
    assert broker.depth(dlq) == 3
    assert broker.depth(queue) == 0


def test_replay_of_an_unknown_id_beside_a_known_task_replays_the_task_and_fails(
    app: App, broker
) -> None:
    queue, dlq = app.settings.default_queue, topo.dlq_name(app.settings.default_queue)
    park_dead_letters(app, broker, [("a1", "t.a"), ("b1", "t.b")])

    result = taskq(app, "replay", queue, "-A", "tests.tasks:app", "--task", "t.a",
                   "--id", "a1", "--id", "zz9")

    assert result.returncode == 1
    assert "1 replayed, 1 not selected (left in place); 2 examined" in result.stdout
    assert f"no message in {dlq} has task id 'zz9'" in result.stderr
    assert "Parked there by task: t.a (1), t.b (1)" in result.stderr
    assert [p.message_id for _, p, _ in broker.get_all(queue)] == ["a1"]


def test_a_replay_that_matched_prints_no_progress_line_when_piped(app: App, broker) -> None:
    queue = app.settings.default_queue
    park_dead_letters(app, broker, [("a1", "t.a"), ("a2", "t.a")])

    result = taskq(app, "replay", queue, "-A", "tests.tasks:app", "--task", "t.a")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "2 replayed, 0 not selected (left in place); 2 examined\n"
    assert result.stderr == ""


def test_a_limit_that_stops_early_does_not_call_the_rest_unmatched(app: App, broker) -> None:
    queue = app.settings.default_queue
    park_dead_letters(app, broker, [("a1", "t.a"), ("a2", "t.a"), ("b1", "t.b")])

    result = taskq(app, "replay", queue, "-A", "tests.tasks:app", "--task", "t.a",
                   "--task", "t.b", "--limit", "1")

    assert result.returncode == 0, result.stderr
    assert "1 replayed" in result.stdout


def test_replay_of_an_empty_queue_with_a_task_name_says_nothing_is_parked(app: App) -> None:
    declare_topology(app)
    dlq = topo.dlq_name(app.settings.default_queue)

    result = taskq(app, "replay", app.settings.default_queue, "-A", "tests.tasks:app",
                   "--task", "t.a")

    assert result.returncode == 1
    assert (f"no message of task 't.a' is parked in {dlq}. Parked there by task: nothing"
            in result.stderr)
