"""taskq on a 3-node RabbitMQ cluster with quorum queues: node faults lose and duplicate nothing.

Issue 15's five scenarios. Each one prints a counts line (lost / unexpected / duplicate
effects, which must be 0, executions per task, the highest ``x-delivery-count`` a task saw)
and the failover figure it measures. Every client (producer App, workers, relay) gets all
three node URLs in ``broker_url``; queues, their ``.dlq`` and the delay tiers are quorum.

Run them with ``pytest -m cluster tests/cluster`` (about 2 minutes here; docs/cluster.md).
"""

from __future__ import annotations

import os
import time

import pytest

from tests.cluster import tasks
from tests.cluster.harness import ClusterScenario
from tests.support.broker import BrokerAdmin
from tests.support.rabbitmq_nodes import RabbitCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]

# Issue 15: processing resumes within 15 s of a node's death.
RESUME_LIMIT_S = 15.0
DONE_TIMEOUT_S = 180.0


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

    # When the node holding the leader is cut off for 10 s (pause_minority pauses it), then
    # healed
    cut_at = time.time()
    minority.partition()
    time.sleep(10.0)  # the fault's length, not a wait for a condition
    minority.heal()
    scenario.cluster.wait_formed(via=minority)
    healed_s = time.time() - cut_at
    producers.join(DONE_TIMEOUT_S)
    scenario.wait_all_done(DONE_TIMEOUT_S)

    # Then nothing was lost or duplicated; the majority kept processing
    stall_s = scenario.longest_stall_s(cut_at)
    scenario.notes.update(partitioned=minority.name, cut_to_formed_s=f"{healed_s:.1f}",
                          longest_stall_after_cut_s=f"{stall_s:.2f}")
    scenario.finish()
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


@pytest.mark.skipif(
    os.environ.get("TASKQ_CLUSTER_BROKER_BUGS") != "1",
    reason="RabbitMQ 3.10.8: after a node death one quorum delay tier can stop handing its "
    "expired messages on (at-least-once dead-lettering; 5 of 11 runs here, stuck for the "
    "rest of a 60-240 s wait): see docs/cluster.md 'Known limits'. Run it with "
    "TASKQ_CLUSTER_BROKER_BUGS=1",
)
def test_delayed_retries_in_quorum_tiers_survive_a_node_death(scenario_factory) -> None:
    # Given 300 tasks whose first attempt fails: each waits 2 s in the quorum delay tiers
    scenario = scenario_factory("retries-node-death")
    _declare_and_start(scenario)
    fails_once = scenario.task(tasks.fails_once)
    scenario.produce(fails_once, 300, threads=2).join(120)

    def retries_waiting() -> bool:
        # One line for the declaring task, then one per first attempt (each schedules a retry)
        lines = scenario.executions_path.read_text().splitlines()
        return len(lines) >= 1 + 240

    scenario.wait_until(retries_waiting, 120, "most first attempts failed")

    # When the node holding the work queue's leader dies while the retries wait
    victim = scenario.cluster.queue_leader(scenario.queue)
    killed_at = time.time()
    victim.kill()
    scenario.wait_all_done(DONE_TIMEOUT_S)

    # Then every retry arrived and ran: nothing lost in the tiers, nothing dead-lettered
    scenario.notes.update(killed=victim.name,
                          first_effect_after_kill_s=f"{scenario.first_effect_after(killed_at)}")
    counts = scenario.finish()
    # The declaring task ran once; every other one failed once, then succeeded (at least twice)
    assert counts.executions.get(1, 0) == 1


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
