"""taskq on a 3-node RabbitMQ cluster with quorum queues: node faults lose and duplicate nothing.

Issue 15's five scenarios, and the RabbitMQ 3.10 dead-lettering fault behind scenario 5
(docs/cluster.md "Known limits"). Each scenario prints a counts line (lost / unexpected / duplicate
effects, which must be 0, executions per task, the highest ``x-delivery-count`` a task saw)
and the failover figure it measures. Every client (producer App, workers, relay) gets all
three node URLs in ``broker_url``; queues, their ``.dlq`` and the delay tiers are quorum.

Run them with ``pytest -m cluster tests/cluster`` (about 5 minutes here; docs/cluster.md);
``TASKQ_CLUSTER_REPEAT=N`` runs scenario 5 and the fault test N times each.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests.cluster import tasks
from tests.cluster.harness import ClusterScenario
from tests.support.broker import BrokerAdmin
from tests.support.rabbitmq_nodes import RabbitCluster
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]

# Issue 15: processing resumes within 15 s of a node's death.
RESUME_LIMIT_S = 15.0
DONE_TIMEOUT_S = 180.0
# Scenario 5: a retry held back by a node's death arrives this long after the node's return
# at the latest (docs/cluster.md "Known limits": RabbitMQ 3.10's dead-letter worker tries a
# refused forward again every 5 s in the test cluster, BROKER_SETTINGS in conftest.py).
RETRY_LATE_LIMIT_S = 20.0


def _declare_and_start(scenario: ClusterScenario, workers: int = 3) -> None:
    """Declare the quorum queue (one task through it), then start the workers."""
    work = scenario.task(tasks.work)
    scenario.delay(work, 0)
    scenario.start_workers(workers)
    scenario.wait_all_done(60)


def test_queue_leader_killed_while_producers_delay_2000_tasks(scenario_factory) -> None:
    # Given workers on the cluster and producers delay()ing 2,000 tasks
    scenario = scenario_factory("leader-kill-delay")
    _declare_and_start(scenario)
    work = scenario.task(tasks.work)
    leader = scenario.cluster.queue_leader(scenario.queue)
    producers = scenario.produce(work, 1999, 0, threads=2, pace_s=0.003)
    scenario.wait_until(lambda: scenario.completed_count() >= 400, 120, "400 tasks done")

    # When the node holding the queue's leader is killed (-9) mid-way
    killed_at = time.time()
    leader.kill()
    producers.join(DONE_TIMEOUT_S)
    scenario.wait_all_done(DONE_TIMEOUT_S)

    # Then every task ran once in effect, and processing stalled less than 15 s
    stall_s = scenario.longest_stall_s(killed_at)
    new_leader = scenario.cluster.queue_leader(scenario.queue)
    scenario.notes.update(killed=leader.name, new_leader=new_leader.name,
                          longest_stall_after_kill_s=f"{stall_s:.2f}")
    scenario.finish()
    assert new_leader is not leader
    assert stall_s < RESUME_LIMIT_S


def test_queue_leader_killed_while_the_relay_flushes_5000_rows(scenario_factory) -> None:
    # Given 5,000 committed outbox rows, workers, and a relay flushing them
    scenario = scenario_factory("leader-kill-relay")
    _declare_and_start(scenario)
    scenario.enqueue_rows(5000)
    leader = scenario.cluster.queue_leader(scenario.queue)
    scenario.start_relay()
    scenario.wait_until(lambda: scenario.outbox_rows() <= 4000, 120, "the relay flushing")

    # When the leader's node is killed (-9) while the relay publishes
    killed_at = time.time()
    leader.kill()
    scenario.wait_all_done(DONE_TIMEOUT_S)
    scenario.wait_until(lambda: scenario.outbox_rows() == 0, 60, "an empty outbox")

    # Then every row's task ran once in effect; processing stalled less than 15 s
    stall_s = scenario.longest_stall_s(killed_at)
    scenario.notes.update(killed=leader.name, longest_stall_after_kill_s=f"{stall_s:.2f}")
    scenario.finish()
    assert stall_s < RESUME_LIMIT_S


def test_minority_node_partitioned_away_for_10s_and_healed(scenario_factory) -> None:
    # Given a steady load on the cluster
    scenario = scenario_factory("partition")
    _declare_and_start(scenario)
    work = scenario.task(tasks.work)
    minority = scenario.cluster.queue_leader(scenario.queue)
    producers = scenario.produce(work, 1500, 0, threads=2, pace_s=0.01)
    scenario.wait_until(lambda: scenario.completed_count() >= 200, 120, "200 tasks done")
    # (each worker has one process, which has connected once so far: where it consumes)
    short_name = minority.name.split("@")[0]
    on_cut_node = scenario.consumer_connects().get(short_name, 0)
    producer_cut = scenario.producer_node() == short_name

    # When the node holding the leader is cut off for 10 s (on 3.10 pause_minority pauses
    # it; 4.3 has no such mode), then healed; times are those the node did it at (its CLI
    # takes seconds to reach it)
    cut_at = minority.partition()
    time.sleep(max(0.0, cut_at + 10.0 - time.time()))  # the fault's length
    healed_at = minority.heal()
    scenario.cluster.wait_formed(via=minority)
    formed_s = time.time() - cut_at
    producers.join(DONE_TIMEOUT_S)
    scenario.wait_all_done(DONE_TIMEOUT_S)

    # Then nothing was lost or duplicated, and processing resumed within 15 s of the cut;
    # on Khepri, when the producer or every worker was on the cut node, within 15 s of the
    # heal: that node is not paused and keeps its clients; the queue's new leader on the
    # majority (elected within 0.3 s) cannot reach them, and they get neither deliveries
    # nor confirms until the heal or, for the producer, its confirm timeout (10 s)
    # (docs/cluster.md "RabbitMQ 4.3 (Khepri): what differs")
    stall_s = scenario.longest_stall_s(cut_at)
    stranded = scenario.cluster.install.khepri_only and (on_cut_node == 3 or producer_cut)
    after_heal_s = scenario.longest_stall_s(healed_at)
    scenario.notes.update(partitioned=minority.name, workers_on_cut_node=f"{on_cut_node}/3",
                          producer_on_cut_node=str(producer_cut).lower(),
                          cut_s=f"{healed_at - cut_at:.1f}", cut_to_formed_s=f"{formed_s:.1f}",
                          longest_stall_after_cut_s=f"{stall_s:.2f}",
                          longest_stall_after_heal_s=f"{after_heal_s:.2f}")
    scenario.finish()
    if stranded:
        assert after_heal_s < RESUME_LIMIT_S
    else:
        assert stall_s < RESUME_LIMIT_S


def test_rolling_restart_of_all_three_nodes_under_steady_load(scenario_factory) -> None:
    # Given a steady load that lasts longer than the restart
    scenario = scenario_factory("rolling-restart")
    _declare_and_start(scenario)
    work = scenario.task(tasks.work)
    producers = scenario.produce(work, 2000, 0, threads=2, pace_s=0.03)
    scenario.wait_until(lambda: scenario.completed_count() >= 100, 120, "100 tasks done")

    # When each node in turn is stopped and started again, once the others hold a majority
    started_at = time.time()
    restarts = []
    for node in scenario.cluster.nodes:
        scenario.wait_until(lambda node=node: not node.is_quorum_critical(), 120,
                            f"{node.name} not quorum-critical")
        node.stop()
        restarts.append(f"{node.start():.1f}")
        scenario.cluster.wait_formed()
    producers.join(DONE_TIMEOUT_S)
    scenario.wait_all_done(DONE_TIMEOUT_S)

    # Then nothing was lost or duplicated and processing never stalled for 15 s
    stall_s = scenario.longest_stall_s(started_at)
    scenario.notes.update(node_restart_s="/".join(restarts),
                          longest_stall_s=f"{stall_s:.2f}")
    scenario.finish()
    assert stall_s < RESUME_LIMIT_S


@pytest.mark.parametrize("run", range(int(os.environ.get("TASKQ_CLUSTER_REPEAT", "1"))))
def test_delayed_retries_in_quorum_tiers_survive_a_node_death(scenario_factory, run: int) -> None:
    # Given 300 tasks whose first attempt fails: each waits 2 s in the quorum delay tiers
    scenario = scenario_factory("retries-node-death")
    _declare_and_start(scenario)
    fails_once = scenario.task(tasks.fails_once)
    scenario.produce(fails_once, 300, threads=2).join(120)

    def retries_waiting() -> bool:
        # One line for the declaring task, then one per first attempt (each schedules a retry)
        lines = scenario.execution_lines()
        return len(lines) >= 1 + 240

    scenario.wait_until(retries_waiting, 120, "most first attempts failed")

    # When the node holding the work queue's leader dies while the retries wait, and is
    # started again at once (as an orchestrator restarts a dead broker)
    victim = scenario.cluster.queue_leader(scenario.queue)
    killed_at = time.time()
    victim.kill()
    victim.start()
    scenario.cluster.wait_formed()
    back_at = time.time()
    held = scenario.tier_messages()  # RabbitMQ 3.10.8 can hold retries until now
    scenario.wait_all_done(DONE_TIMEOUT_S)

    # Then every retry arrived and ran: nothing lost in the tiers, nothing dead-lettered,
    # none early, none later than the node's absence plus 20 s
    late_ms = scenario.lateness_ms()
    down_s = back_at - killed_at
    last_s = max(scenario.effect_times()) - back_at
    scenario.notes.update(
        killed=victim.name, node_down_s=f"{down_s:.1f}", tiers_held_at_return=str(held),
        last_effect_after_return_s=f"{last_s:.1f}",
        retry_late_ms=f"p50={late_ms[len(late_ms) // 2]},max={late_ms[-1]}" if late_ms else "-",
    )
    counts = scenario.finish()
    # The declaring task ran once; every other one failed once, then succeeded (at least twice)
    assert counts.executions.get(1, 0) == 1
    assert len(late_ms) >= 300 and late_ms[0] >= 0
    assert late_ms[-1] < (down_s + RETRY_LATE_LIMIT_S) * 1000


def test_a_classic_queue_on_a_dead_node_takes_the_publish_once_its_node_is_back(
    cluster: RabbitCluster,
) -> None:
    import threading
    import uuid

    from taskq import App

    # Given classic queues, declared on the node the producer is connected to
    namespace = f"tqc{uuid.uuid4().hex[:8]}"
    app = App("taskq-cluster", broker_url=cluster.broker_url, namespace=namespace,
              default_queue=f"{namespace}.work", publish_timeout_s=60.0, connect_timeout_s=2.0)

    @app.task
    def noop() -> None: ...

    try:
        noop.delay()
        port = app.publisher._link.connection._impl.params.port  # type: ignore[union-attr]
        home = next(node for node in cluster.nodes if node.port == port)

        # When that node dies and comes back a few seconds later
        home.kill()
        restart = threading.Thread(target=home.start)
        restart.start()
        started = time.monotonic()
        task_id = noop.delay().id  # meanwhile: 404 "home node ... down", retried

        # Then the publish waited for the node (no PublishError), and the queue holds both
        waited_s = time.monotonic() - started
        restart.join()
        print(f"classic queue on a dead node: the publish waited {waited_s:.1f}s")
        admin = BrokerAdmin(home.url)
        try:
            ids = [p.message_id for _, p, _ in admin.get_all(f"{namespace}.work")]
        finally:
            admin.close()
        assert ids[-1] == task_id and len(ids) == 2
        assert waited_s > 1.0
    finally:
        app.close()


@pytest.mark.parametrize("run", range(int(os.environ.get("TASKQ_CLUSTER_REPEAT", "1"))))
def test_a_quorum_tier_held_by_a_node_death_moves_on_once_the_node_is_back(
    cluster: RabbitCluster, run: int,
) -> None:
    """RabbitMQ 3.10's at-least-once dead-lettering, under taskq's quorum tier arguments.

    The broker fault behind docs/cluster.md "Known limits", without taskq's clients: a
    quorum tier dead-lettering into a quorum work queue, both leaders on the node killed.
    On 3.10.8 the tier often (2 of 3 runs measured) holds its expired messages while the
    node is down; with ``dead_letter_worker_publisher_confirm_timeout`` at 5 s (the test
    cluster's setting) they must all arrive within seconds of the node's return, none lost.
    """
    import json
    import threading
    import uuid

    import pika

    from taskq.broker import topology as topo

    ns = f"tqc{uuid.uuid4().hex[:8]}"
    work, entry = f"{ns}.work", f"{ns}.entry"
    wait_until(lambda: all(n.is_alive() for n in cluster.nodes), timeout_s=5)
    tier = topo.delay_tier_name(ns, 0, "quorum")
    home, other, producer_node = cluster.nodes[run % 3], cluster.nodes[(run + 1) % 3], \
        cluster.nodes[(run + 2) % 3]

    def channel_on(node: Any) -> tuple[pika.BlockingConnection, Any]:
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        return connection, connection.channel()

    # Given a tier (taskq's tier-00 arguments: TTL, at-least-once dead-lettering to the app's
    # exchange) and the work queue, both declared on one node, so both lead there
    connection, channel = channel_on(home)
    channel.exchange_declare(ns, "direct", durable=True)
    channel.exchange_declare(entry, "direct", durable=True)
    channel.queue_declare(work, durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_bind(work, ns, work)
    channel.queue_declare(tier, durable=True,
                          arguments=topo.delay_tier_queue_arguments(ns, 0, "quorum"))
    channel.queue_bind(tier, entry, work)  # the routing key is the destination, as in taskq
    connection.close()
    assert cluster.queue_leader(work) is home and cluster.queue_leader(tier) is home

    # ... and a producer on another node sending 1,500 confirmed messages through the tier
    confirmed: list[str] = []

    def produce() -> None:
        conn, ch = channel_on(producer_node)
        ch.confirm_delivery()
        for n in range(1500):
            message_id = f"m-{n}"
            while True:  # a nack (the tier electing a leader): the same id again
                try:
                    ch.basic_publish(entry, work, b"x", pika.BasicProperties(
                        delivery_mode=2, message_id=message_id))
                    break
                except pika.exceptions.NackError:
                    time.sleep(0.05)
            confirmed.append(message_id)
            time.sleep(0.002)  # a steady flow, not a wait for a condition
        conn.close()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    wait_until(lambda: len(confirmed) >= 200, timeout_s=60)

    # When the node holding both leaders is killed mid-flow, and comes back after the flow
    home.kill()
    producer.join(120)
    assert len(confirmed) == 1500

    def tier_messages() -> int:
        rows = json.loads(other.ctl("list_queues", "name", "messages", "--formatter", "json"))
        return sum(int(r["messages"]) for r in rows if r["name"] == tier)

    held = tier_messages()
    home.start()
    cluster.wait_formed()
    back = time.monotonic()
    wait_until(lambda: tier_messages() == 0, timeout_s=60)
    drained_s = time.monotonic() - back

    # Then every message reached the work queue (duplicates allowed: at least once), and a
    # held tier moved on within seconds of the node's return
    admin = BrokerAdmin(other.url)
    try:
        arrived = {str(p.message_id) for _, p, _ in admin.get_all(work)}
    finally:
        admin.close()
    print(f"quorum tier after a node death: held {held} of 1500 while the node was down; "
          f"empty {drained_s:.1f}s after its return; {len(arrived)} distinct arrived")
    assert arrived == set(confirmed)
    assert drained_s < 20.0
