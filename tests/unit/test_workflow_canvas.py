"""Building signatures, chains, groups and chords: shapes, options and refused input."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from taskq import App, ConfigurationError, Signature, chain, chord, group
from taskq.workflows.canvas import Chain, _calls


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    return make_app()


def test_s_is_partial_and_si_immutable(app: App) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    partial, fixed = add.s(1), add.si(1, 2)

    assert isinstance(partial, Signature) and partial.args == (1,) and not partial.immutable
    assert fixed.immutable and fixed.args == (1, 2)
    assert repr(partial) == f"{add.name}.s(1)"
    assert repr(add.si(1, y=2)) == f"{add.name}.si(1, y=2)"


def test_steps_of_a_chain_holding_groups_and_chords(app: App) -> None:
    @app.task
    def t(*args: int) -> int:
        return 0

    workflow = chain(t.s(1), group(t.s(2), t.s(3)), t.s(), chord([t.s(4)], t.s()))

    calls = _calls(workflow._steps(), None, None, None)
    assert [[c.args for c in step] for step in calls] == [[[1]], [[2], [3]], [[]], [[4]], [[]]]
    assert [step[0].in_group for step in calls] == [False, True, False, True, False]
    assert [c.position for c in calls[1]] == [0, 1]
    assert len({c.task_id for step in calls for c in step}) == 6  # one id per member


def test_pipe_builds_a_chain(app: App) -> None:
    @app.task
    def t(x: int) -> int:
        return x

    workflow = t.s(1) | t.s() | group(t.s(), t.s())

    assert isinstance(workflow, Chain)
    assert [len(sigs) for sigs, _ in workflow._steps()] == [1, 1, 2]


def test_options_resolve_signature_then_call_then_task(app: App) -> None:
    @app.task(queue=f"{app.settings.namespace}.slow", priority=3)
    def t() -> None:
        pass

    own = t.s().set(queue=f"{app.settings.namespace}.fast", priority=7, countdown=2)
    calls = _calls(Chain(own, t.s(), t.s())._steps(), None, 5, 10.0)

    assert [(c.queue.rsplit(".")[-1], c.priority, c.countdown_s) for step in calls
            for c in step] == [("fast", 7, 2.0), ("slow", 5, None), ("slow", 5, None)]
    first_only = _calls(Chain(t.s(), t.s())._steps(), None, None, 10.0)
    assert [step[0].countdown_s for step in first_only] == [10.0, None]
    assert first_only[0][0].priority == 3


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda t: group(), "a group needs at least one member"),
        (lambda t: group(t.s(), group(t.s())), "a chain or group inside a group"),
        (lambda t: chain(), "a chain needs at least one signature"),
        (lambda t: chain(t.s(), "not a signature"), "a chain holds signatures"),
        (lambda t: chord([t.s()], group(t.s())), "a chord's callback is a signature"),
        (lambda t: t.s().set(priority=12), "priority must be an int from 0 to 9"),
        (lambda t: t.s().set(countdown=-1), "countdown must be seconds >= 0"),
    ],
)
def test_bad_workflows_are_refused_with_a_reason(
    app: App, build: Callable[..., object], message: str
) -> None:
    @app.task
    def t() -> None:
        pass

    with pytest.raises(ConfigurationError, match=message):
        build(t)


def test_eager_mode_refuses_workflows(make_app: Callable[..., App]) -> None:
    app = make_app(task_always_eager=True)

    @app.task
    def t() -> None:
        pass

    with pytest.raises(ConfigurationError, match="task_always_eager=True cannot run a chain"):
        chain(t.s(), t.s()).apply_async()


def test_a_bad_queue_of_a_later_step_is_refused_at_start(app: App) -> None:
    @app.task
    def t() -> None:
        pass

    with pytest.raises(ConfigurationError, match="queue name .bad name!. is invalid"):
        chain(t.s(), t.s().set(queue="bad name!")).apply_async()
