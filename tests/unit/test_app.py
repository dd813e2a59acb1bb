from __future__ import annotations

import pytest

from taskq import App, ConfigurationError, DuplicateTaskName, Task, TaskNotRegistered


def test_decorator_registers_under_module_and_qualname() -> None:
    app = App("shop")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    assert isinstance(add, Task)
    assert add.name == f"{__name__}.test_decorator_registers_under_module_and_qualname.<locals>.add"
    assert app.registry.get(add.name) is add


def test_calling_a_task_runs_it_in_process() -> None:
    app = App("shop")

    @app.task(name="add", queue="math", priority=3)
    def add(x: int, y: int) -> int:
        return x + y

    assert add(2, 3) == 5
    assert add.queue == "math"
    assert add.options.priority == 3
    assert add.__name__ == "add"


def test_default_queue_comes_from_settings() -> None:
    app = App("shop", default_queue="work")

    @app.task
    def noop() -> None:
        return None

    assert noop.queue == "work"
    assert app.queue_names() == ["work"]


def test_unknown_task_option_is_rejected() -> None:
    app = App("shop")

    with pytest.raises(ConfigurationError, match="unknown task option.*retires"):

        @app.task(retires=3)
        def noop() -> None:
            return None


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 10},
        {"priority": -1},
        {"priority": True},
        {"time_limit_s": 0},
        {"time_limit_s": 5, "soft_time_limit_s": 5},
        {"queue": "bad queue"},
    ],
)
def test_invalid_task_options_are_rejected(options: dict[str, object]) -> None:
    app = App("shop")

    with pytest.raises(ConfigurationError):
        app.task(**options)


def test_two_functions_cannot_share_a_name() -> None:
    app = App("shop")

    @app.task(name="send")
    def send_email() -> None:
        return None

    with pytest.raises(DuplicateTaskName, match="'send' is already registered"):

        @app.task(name="send")
        def send_sms() -> None:
            return None


def test_unknown_task_lookup_explains_what_to_do() -> None:
    app = App("shop")

    with pytest.raises(TaskNotRegistered, match="not registered in this app") as info:
        app.registry.get("nope")

    assert info.value.task == "nope"  # type: ignore[attr-defined]
    assert app.registry.lookup("nope") is None


def test_building_an_app_opens_no_connection() -> None:
    app = App("shop", broker_url="amqp://guest:guest@127.0.0.1:1/%2F")

    @app.task
    def noop() -> None:
        return None

    assert app._sender._publisher is None  # nothing connected until the first publish
    app.close()


def test_an_app_name_longer_than_an_amqp_short_string_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="longer than 255 bytes"):
        App("ä" * 128)  # 256 bytes in UTF-8
    assert App("a" * 255).name == "a" * 255


@pytest.mark.parametrize("task_id", ["x" * 256, "ü" * 128, 42])
def test_a_task_id_that_cannot_be_a_message_id_is_refused(task_id: object) -> None:
    app = App("shop")

    @app.task
    def ping() -> None:
        return None

    with pytest.raises(ConfigurationError, match="task_id must be a str of at most 255 bytes"):
        ping.envelope((), task_id=task_id)  # type: ignore[arg-type]
    assert ping.envelope((), task_id="é" * 127).task_id == "é" * 127
