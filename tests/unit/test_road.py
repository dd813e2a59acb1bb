"""The one road (taskq.road): every producer refuses at the call what a worker could not run.

Nothing here reaches a broker or a database: each refusal must come before any I/O. The
app's broker is a closed port, so a message that got past the checks would fail with a
PublishError (or OutboxError), not with the error the test expects.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskq import App, ConfigurationError, chain, chord, group
from taskq.message import ORDERING_KEY
from taskq.ordering.keys import partition_of, partition_queue_name

CLOSED = "amqp://guest:guest@127.0.0.1:1/%2F"


@pytest.fixture
def app(tmp_path: Path) -> App:
    app = App("road", broker_url=CLOSED, database_url=f"sqlite:///{tmp_path}/db.sqlite3",
              default_queue="work")
    app.queue("ledger", partitions=4)
    app.queue("billing", type="quorum")
    # As if a connection had met RabbitMQ 3.10, whose quorum queues take no priorities.
    app.topology.broker.learn({"product": "RabbitMQ", "version": "3.10.8"})
    return app


def test_a_call_that_does_not_fit_the_function_raises_type_error_at_delay(app: App) -> None:
    @app.task(name="record")
    def record(n: int, source: str) -> None: ...

    for call, why in [
        (lambda: record.delay(1), "missing a required argument: 'source'"),  # type: ignore[call-arg]
        (lambda: record.delay(1, "a", 3), "too many positional arguments"),  # type: ignore[call-arg]
        (lambda: record.apply_async((1, "a"), {"sauce": "x"}),
         "unexpected keyword argument 'sauce'"),
        (lambda: record.apply_async((1, "a"), {"n": 2}), "multiple values for argument 'n'"),
        (lambda: record.starmap([(1, "a"), (2,)]), "missing a required argument: 'source'"),
        (lambda: record.map([1]), "missing a required argument: 'source'"),
    ]:
        with pytest.raises(TypeError) as refused:
            call()
        assert "task 'record' cannot be called" in str(refused.value)
        assert why in str(refused.value)
        assert "nothing was enqueued" in str(refused.value)


def test_calls_that_fit_are_accepted_by_the_check(app: App) -> None:
    @app.task(name="shaped")
    def shaped(a: int, b: int = 0, *rest: int, c: int, **more: Any) -> None: ...

    @app.task(name="bound", bind=True)
    def bound(self: Any, x: int) -> None: ...

    @app.task(name="tx", transactional=True)
    def tx(x: int, *, session: Any) -> None: ...

    for task, args, kwargs in [
        (shaped, (1, 2, 3, 4), {"c": 5, "d": 6}),
        (shaped, (1,), {"c": 5}),
        (bound, (1,), None),
        (tx, (1,), None),  # the worker passes session itself
    ]:
        task.check_call(args, kwargs)
    with pytest.raises(TypeError, match="missing a required argument: 'c'"):
        shaped.check_call((1,), None)
    with pytest.raises(TypeError, match="too many positional arguments"):
        bound.check_call((1, 2), None)


@pytest.mark.parametrize("name", ["CC", "BCC"])
@pytest.mark.parametrize("value", ["audit", ["audit"], {"a": 1}, 5])
def test_cc_and_bcc_headers_are_refused_at_enqueue(app: App, name: str, value: Any) -> None:
    @app.task(name="mail")
    def mail() -> None: ...

    with pytest.raises(ConfigurationError) as refused:
        mail.apply_async(headers={name: value})
    text = str(refused.value)
    assert f"task 'mail': header {name!r}" in text
    assert "read by RabbitMQ itself" in text and "another name" in text
    mail.envelope(headers={"cc": "lower case is an ordinary header", "X-CC": ["a"]})


def test_the_ordering_key_and_partition_are_derived_by_the_road(app: App) -> None:
    @app.task(name="post", queue="ledger", ordering_key="account")
    def post(account: str, amount: int) -> None: ...

    outgoing = app.road.build(post, ("acct-7", 5))

    assert outgoing.envelope.headers[ORDERING_KEY] == "acct-7"
    assert outgoing.queue == "ledger"
    assert outgoing.destination == partition_queue_name("ledger", partition_of("acct-7", 4))


def test_a_schedule_of_a_keyed_task_on_an_ordered_queue_carries_its_key(app: App) -> None:
    @app.task(name="post", queue="ledger", ordering_key="account")
    def post(account: str, amount: int) -> None: ...

    definition = app.add_periodic_task(60, post, name="nightly", args=("acct-9", 1))
    outgoing = definition.outgoing(definition.schedule.next_after(_now()))  # type: ignore[union-attr]

    assert outgoing.envelope.headers[ORDERING_KEY] == "acct-9"
    assert outgoing.destination == partition_queue_name("ledger", partition_of("acct-9", 4))


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"queue": "billing", "priority": 3}, "'billing' is a quorum queue"),
        ({"queue": "ledger", "priority": 3}, "'ledger' is ordered"),
    ],
)
def test_a_schedule_that_could_never_be_enqueued_is_refused_when_defined(
    app: App, options: dict[str, Any], why: str
) -> None:
    @app.task(name="post", queue="ledger", ordering_key="account")
    def post(account: str, amount: int) -> None: ...

    @app.task(name="plain")
    def plain(n: int) -> None: ...

    with pytest.raises(ConfigurationError, match=f"periodic task 'p1'.*{why}"):
        app.add_periodic_task(60, post if options["queue"] == "ledger" else plain, name="p1",
                              args=("a", 1) if options["queue"] == "ledger" else (1,), **options)
    with pytest.raises(TypeError, match="periodic task 'p2'.*missing a required argument"):
        app.add_periodic_task(60, post, name="p2", args=("a",))
    with pytest.raises(ConfigurationError, match="ordering key"):
        app.add_periodic_task(60, plain, name="p3", args=(1,), queue="ledger")
    assert len(app.schedules) == 0


def test_a_workflow_is_refused_at_apply_when_any_member_or_errback_could_not_be_enqueued(
    app: App,
) -> None:
    @app.task(name="post", queue="ledger", ordering_key="account")
    def post(account: str, amount: int) -> str:
        return account

    @app.task(name="plain")
    def plain(n: int) -> int:
        return n

    @app.task(name="on_error")
    def on_error(workflow_id: str, failed_task_id: str, error: str, note: str) -> None: ...

    cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        # a later step's priority on an ordered queue
        (lambda: chain(plain.s(1), post.si("a", 1).set(priority=4)).apply_async(),
         ConfigurationError, "'ledger' is ordered"),
        # a chord callback whose arguments cannot fit
        (lambda: chord([plain.s(1), plain.s(2)], plain.s(3)).apply_async(),
         TypeError, "task 'plain' cannot be called"),
        # a group member on a quorum queue with a priority
        (lambda: group(plain.s(1), plain.s(2).set(queue="billing", priority=2)).apply_async(),
         ConfigurationError, "'billing' is a quorum queue"),
        # an errback that could not be enqueued when a member fails
        (lambda: chain(plain.s(1)).apply_async(link_error=on_error.s()),
         TypeError, "task 'on_error' cannot be called"),
        (lambda: chain(plain.s(1)).apply_async(link_error=on_error.si("x", "y", "z", "n")
                                               .set(queue="ledger")),
         ConfigurationError, "without an ordering key"),
        # a member whose argument cannot be encoded
        (lambda: chain(plain.s(1), plain.si(object())).apply_async(),
         Exception, "cannot be encoded|cannot encode|serializ"),
    ]
    for apply, error, why in cases:
        with pytest.raises(error, match=why):
            apply()


def test_a_later_step_keyed_by_the_previous_result_is_accepted_at_apply(app: App) -> None:
    @app.task(name="post", queue="ledger", ordering_key="account")
    def post(account: str, amount: int) -> str:
        return account

    @app.task(name="pick")
    def pick() -> str:
        return "acct-1"

    # The key of step 2 is step 1's result: unknown at apply, checked with a placeholder;
    # the refusal that follows is the closed broker's (the workflow's rows are written to
    # SQLite first), not a ConfigurationError.
    from taskq.workflows.messages import PREVIOUS_RESULT, WorkflowMessages
    from taskq.workflows.store import MemberCall

    messages = WorkflowMessages(app, {"post": post})
    call = MemberCall(task_id="t", task="post", queue="ledger", priority=0, args=[5], kwargs={},
                      immutable=False, countdown_s=None, step=1, position=0, in_group=False)
    messages.check_step([call], has_previous=True)
    assert PREVIOUS_RESULT


def _now() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)
