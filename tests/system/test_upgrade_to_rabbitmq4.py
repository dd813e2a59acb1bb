"""A topology taskq declared on RabbitMQ 3.10 keeps working when the broker becomes 4.3.

RabbitMQ cannot carry a 3.10 data directory to 4.3 (each minor upgrades only from the one
before it: 3.10 -> 3.11 -> 3.12 -> 3.13 -> 4.0 -> 4.1 -> 4.2 -> 4.3, with feature flags
enabled at each step), so what is tested is the blue-green route of docs/rabbitmq.md: a
private 3.10 node holds a full taskq topology (default classic queue, classic priority
queue, quorum queue, ordered queue of 4 partitions, classic and quorum delay tiers) with
tasks waiting in it, some of them delayed; its definitions are exported and imported into a
vhost of the 4.3 node; taskq declares everything again there (every argument must be
equivalent, or the declare fails with PRECONDITION_FAILED); shovels on the old node move the
waiting messages across (a delay tier's message into the tier exchange of the same name, so
its routing key, the destination, is kept); a worker on 4.3 runs every task once. The same
topology declared afresh on 4.3 gets the same queue types and arguments as on 3.10.

Slow layer (a private node boots in 10-20 s). Skips, saying why, where the 4.3 node is not
reachable at ``TASKQ_TEST_RABBITMQ4_URL`` (tests/support/rabbitmq4.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from taskq import App
from taskq.broker import topology as topo
from taskq.broker.delayed import declare_now
from taskq.delay.backend import merge_declarations
from taskq.task import Task
from tests import upgrade_tasks
from tests.support.rabbitmq4 import Rabbit4, list_queues
from tests.support.rabbitmq_nodes import RabbitCluster, RabbitNode
from tests.support.rabbitmq_root import HOST
from tests.support.waiting import wait_until
from tests.system.workers import Worker, count_runs
from tests.tasks import read_lines

pytestmark = pytest.mark.slow


@pytest.fixture
def rabbit4() -> Rabbit4:
    node = Rabbit4()
    reason = node.unavailable_reason()
    if reason is not None:
        print(f"skipping: {reason}")  # shown with -s, and in the skip reason
        pytest.skip(reason)
    return node


def make_upgrade_app(url: str, namespace: str, database_url: str) -> App:
    """An App configured like ``tests.upgrade_tasks:app`` for ``namespace`` on ``url``."""
    app = App("taskq-upgrade-tests", broker_url=url, namespace=namespace,
              default_queue=upgrade_tasks.queues(namespace)["default"],
              database_url=database_url, delay_backend="tiers")
    upgrade_tasks.configure(app, namespace)
    return app


def declare_everything(app: App) -> None:
    """What taskq declares for the app: base, every queue kind, both kinds of delay tiers."""
    names = upgrade_tasks.queues(app.settings.namespace).values()
    declare_now(app.settings, merge_declarations(
        [app.topology.base(), *(app.topology.for_queue(name) for name in names)]
    ))
    for queue_type in ("classic", "quorum"):
        tiers = app.topology.delay_tiers(queue_type)
        declare_now(app.settings, tiers.declarations, tiers.header_bindings)


def bound(app: App, task: Task[Any, Any]) -> Task[Any, Any]:
    """``task`` of :mod:`tests.upgrade_tasks`, sent through ``app``."""
    return Task(app, task.fn, name=task.name, options=task.options)


def send_one_of_each(app: App, runs: str, era: str) -> list[str]:
    """Enqueue tasks to every queue kind (and three delayed ones); return their tags."""
    names = upgrade_tasks.queues(app.settings.namespace)
    record = bound(app, upgrade_tasks.record)
    ordered = bound(app, upgrade_tasks.record_ordered)
    tags = []
    for kind in ("default", "priority", "quorum"):
        for i in range(3):
            tag = f"{era}-{kind}-{i}"
            record.apply_async((runs, tag), queue=names[kind],
                               priority=3 * i if kind == "priority" else None)
            tags.append(tag)
    for i in range(6):
        tag = f"{era}-ordered-{i}"
        ordered.apply_async((runs, f"key{i % 3}", tag), queue=names["ordered"])
        tags.append(tag)
    for i, countdown in enumerate((3, 9, 20)):
        tag = f"{era}-delayed-{i}"
        record.apply_async((runs, tag), countdown=countdown)
        tags.append(tag)
    return tags


def taskq_queues(queues: dict[str, dict[str, Any]], namespace: str) -> dict[str, Any]:
    """The queues of ``namespace``, named without it; 4.x's added ``x-queue-type: classic``
    (it writes the default type into every imported or declared classic queue) dropped."""
    found = {}
    for name, queue in queues.items():
        if name.startswith(f"{namespace}."):
            arguments = dict(queue["arguments"])
            if arguments.get("x-queue-type") == "classic":
                del arguments["x-queue-type"]
            found[name[len(namespace):]] = (queue["type"], arguments)
    return found


def shovel_everything(old: RabbitNode, definitions: dict[str, Any], namespace: str,
                      target_url: str, workdir: Path) -> None:
    """A dynamic shovel on the old node per queue of the namespace, in one definitions import.

    Work, partition and parking queues go to the queue of the same name; a delay tier's
    messages go to the tier's exchange of the same name, which keeps their routing key (the
    destination queue) and routes them by their level header back into that tier. (One
    ``rabbitmqctl set_parameter`` per shovel takes seconds each on a busy machine: the
    import sets them all at once.)
    """
    tiers = {q["name"] for q in definitions["queues"]
             if q["name"].startswith(topo.delay_tier_prefix(namespace))}
    parameters = []
    for queue in definitions["queues"]:
        name = queue["name"]
        destination = {"dest-exchange": name} if name in tiers else {"dest-queue": name}
        parameters.append({"vhost": "/", "component": "shovel", "name": f"move-{name}",
                           "value": {"src-protocol": "amqp091", "src-uri": "amqp://",
                                     "src-queue": name, "dest-protocol": "amqp091",
                                     "dest-uri": target_url, **destination}})
    path = workdir / "shovels.json"
    path.write_text(json.dumps({"parameters": parameters}))
    old.ctl("import_definitions", str(path))


def depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


@pytest.mark.timeout(600)
def test_a_topology_declared_on_3_10_with_tasks_waiting_runs_on_4_3(
    rabbit4: Rabbit4, namespace: str, tmp_path: Path, database_file_url: str,
    start_worker: Callable[..., Worker],
) -> None:
    runs = str(tmp_path / "runs.txt")
    # the old broker is the machine's 3.10 whatever TASKQ_TEST_RABBITMQ_ROOT says
    with RabbitCluster(1, install=HOST) as cluster:
        # Given a 3.10 node (with the shovel plugin) holding taskq's whole topology, and
        # tasks waiting in every queue kind and in the delay tiers
        (cluster.root / "enabled_plugins").write_text("[rabbitmq_shovel].\n")
        cluster.start()
        [old] = cluster.nodes
        old_app = make_upgrade_app(old.url, namespace, database_file_url)
        declare_everything(old_app)
        waiting = send_one_of_each(old_app, runs, "old")
        old_app.close()
        old_queues = taskq_queues(
            list_queues(old.ctl("list_queues", "--formatter", "json", "name", "type",
                                "arguments")), namespace)
        exported = json.loads(old.ctl("export_definitions", "-"))
        definitions = {kind: [item for item in exported[kind]
                              if str(item.get("name", item.get("source", ""))).startswith(
                                  namespace)
                              or str(item.get("destination", "")).startswith(namespace)]
                       for kind in ("queues", "exchanges", "bindings")}

        with rabbit4.vhost(f"upgrade-{namespace}") as vhost:
            # When its definitions are imported into 4.3 and taskq declares everything again
            rabbit4.import_topology(definitions, vhost)
            new_url = rabbit4.vhost_url(vhost)
            assert taskq_queues(rabbit4.queues(vhost), namespace) == old_queues
            new_app = make_upgrade_app(new_url, namespace, database_file_url)
            declare_everything(new_app)  # raises TopologyError on any inequivalent argument

            # Then the same topology declared afresh on 4.3 has the same types and arguments
            fresh = f"{namespace}f"
            fresh_app = make_upgrade_app(new_url, fresh, database_file_url)
            declare_everything(fresh_app)
            fresh_app.close()
            renamed = {name: (kind, {k: (v.replace(fresh, namespace) if isinstance(v, str)
                                         else v) for k, v in arguments.items()})
                       for name, (kind, arguments) in
                       taskq_queues(rabbit4.queues(vhost), fresh).items()}
            assert renamed == old_queues

            # When shovels on the old node move the waiting messages across and a worker
            # runs on 4.3, beside tasks sent on 4.3
            shovel_everything(old, definitions, namespace, new_url, tmp_path)
            worker = start_worker("-c", "2", app_path="tests.upgrade_tasks:app",
                                  env={"TASKQ_BROKER_URL": new_url})
            sent_new = send_one_of_each(new_app, runs, "new")
            new_app.close()

            # Then every task, old and new, delayed or not, runs exactly once on 4.3
            expected = waiting + sent_new
            wait_until(lambda: count_runs(runs) >= len(expected), timeout_s=120,
                       message=lambda: (f"{len(expected)} runs, saw {count_runs(runs)}: "
                                        f"{sorted(line[1] for line in read_lines(runs))}; "
                                        f"worker log:\n{worker.log()[-3000:]}"))
            assert sorted(line[1] for line in read_lines(runs)) == sorted(expected)
            # and nothing is left behind on the old node
            for queue in definitions["queues"]:
                assert depth(old.url, queue["name"]) == 0, queue["name"]
            worker.kill_tree()
