from __future__ import annotations

import pytest

from taskq import App, ConfigurationError
from taskq.settings import Settings, redact_url


def test_defaults_need_no_configuration() -> None:
    settings = Settings.load(environ={})

    assert settings.broker_url == "amqp://guest:guest@localhost:5672/%2F"
    assert settings.database_url == "sqlite:///taskq.sqlite3"
    assert settings.namespace == "taskq"
    assert settings.max_message_size_bytes == 1024 * 1024


def test_environment_fills_what_code_does_not_say() -> None:
    environ = {
        "TASKQ_BROKER_URL": "amqp://u:p@rabbit:5672/%2F",
        "TASKQ_PREFETCH_COUNT": "64",
        "TASKQ_SHUTDOWN_TIMEOUT_S": "2.5",
    }

    settings = Settings.load({"prefetch_count": 8}, environ=environ)

    assert settings.broker_url == "amqp://u:p@rabbit:5672/%2F"
    assert settings.prefetch_count == 8  # code wins over the environment
    assert settings.shutdown_timeout_s == 2.5


def test_app_kwargs_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKQ_BROKER_URL", "amqp://env-host/%2F")
    monkeypatch.setenv("TASKQ_NAMESPACE", "fromenv")

    app = App("shop", broker_url="amqp://code-host/%2F")

    assert app.settings.broker_url == "amqp://code-host/%2F"
    assert app.settings.namespace == "fromenv"


def test_configure_applies_cli_overrides_last() -> None:
    app = App("shop", prefetch_count=8)

    app.configure(prefetch_count=100, worker_processes=None)

    assert app.settings.prefetch_count == 100
    assert app.settings.worker_processes == 0


def test_unknown_setting_is_rejected_with_the_known_names() -> None:
    with pytest.raises(ConfigurationError, match="unknown taskq setting.*prefetch"):
        App("shop", prefech_count=3)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="TASKQ_PREFETCH_COUNT='many'"):
        Settings.load(environ={"TASKQ_PREFETCH_COUNT": "many"})


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"prefetch_count": 0}, "prefetch_count must be at least 1"),
        ({"namespace": "a b"}, "namespace"),
        ({"heartbeat_s": "10"}, "heartbeat_s must be int"),
        ({"default_max_priority": 300}, "default_max_priority"),
    ],
)
def test_invalid_values_are_rejected_when_the_app_is_built(
    changes: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        Settings.load(changes, environ={})


def test_password_never_in_repr() -> None:
    settings = Settings.load(
        {
            "broker_url": "amqp://user:s3cret@rabbit:5672/%2F",
            "database_url": "postgresql://db:hunter2@pg/app",
        },
        environ={},
    )

    text = repr(settings)

    assert "s3cret" not in text and "hunter2" not in text
    assert "amqp://user:***@rabbit:5672/%2F" in text


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("amqp://guest:guest@localhost:5672/%2F", "amqp://guest:***@localhost:5672/%2F"),
        ("amqp://localhost/%2F", "amqp://localhost/%2F"),
        ("amqp://user@localhost/%2F", "amqp://user@localhost/%2F"),
        ("amqp://:only-pw@h/", "amqp://:***@h/"),
        ("amqp://u:@h/", "amqp://u:***@h/"),
        ("sqlite:///taskq.sqlite3", "sqlite:///taskq.sqlite3"),
        ("postgresql+psycopg://u:p%40ss@h/db", "postgresql+psycopg://u:***@h/db"),
        # Unescaped '/', '?', '#', '@' and ':' in the password (SQLAlchemy accepts them).
        ("postgresql+psycopg://app:s3cr/et@db/x", "postgresql+psycopg://app:***@db/x"),
        ("amqp://u:s3c?ret@h:5672/%2F", "amqp://u:***@h:5672/%2F"),
        ("amqp://u:s3c#ret@h/v", "amqp://u:***@h/v"),
        ("amqp://u:s3c@ret@h/v", "amqp://u:***@h/v"),
        ("amqp://u:s3:c/r?e#t@h/v?heartbeat=5", "amqp://u:***@h/v?heartbeat=5"),
        ("amqps://u:pw@[::1]:5671/%2F", "amqps://u:***@[::1]:5671/%2F"),
        # Passwords in the query string, in any case and spelling.
        ("postgresql://h/db?user=u&password=s3cret", "postgresql://h/db?user=u&password=***"),
        ("postgresql://h/db?PassWord=s3cret&sslmode=require",
         "postgresql://h/db?PassWord=***&sslmode=require"),
        ("mysql://h/db?passwd=s3cret", "mysql://h/db?passwd=***"),
        ("odbc://h/db?pwd=s3cret;app=x", "odbc://h/db?pwd=***;app=x"),
        ("amqp://h/?x_password=s3c&ret#frag", "amqp://h/?x_password=***"),
        ("amqp://u:pw@h/?auth_token=s3cret", "amqp://u:***@h/?auth_token=***"),
        # Several broker URLs separated by ';' (docs/cluster.md): each one is masked.
        (
            "amqp://u:pw1@n1:5672/%2F;amqp://u:pw2@n2:5672/%2F; amqps://v:p/w3@n3/%2F",
            "amqp://u:***@n1:5672/%2F;amqp://u:***@n2:5672/%2F; amqps://v:***@n3/%2F",
        ),
        # A ';' inside a password is not mistaken for the start of the next URL.
        ("amqp://u:pw;1@n1/%2F;amqp://u:pw2@n2/%2F", "amqp://u:***@n1/%2F;amqp://u:***@n2/%2F"),
        # An '@' in the query after the user info is not taken for the end of the password...
        ("amqp://u:pw@h/v?x=a@b", "amqp://u:***@h/v?x=a@b"),
        # ...but where a parser may read a password (SQLAlchemy: '5672/v?x=a'), it is masked.
        ("amqp://h:5672/v?x=a@b", "amqp://h:***@b"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:s3cr/et@db/x",
        "amqp://u:s3c?ret@h/%2F",
        "amqp://u:s3c#ret@h/%2F",
        "amqp://u:s3c@ret@h/%2F",
        "amqp://h/?password=s3c&ret",
        "amqp://a:b@n1/;amqp://u:s3c/ret@n2/%2F",
    ],
)
def test_redacted_url_never_contains_the_secret(url: str) -> None:
    redacted = redact_url(url)

    assert "s3c" not in redacted and "ret@" not in redacted and "ret&" not in redacted


# -- several broker nodes (docs/cluster.md) --------------------------------------------------

_NODES = [
    "amqp://u:pw;1@n1:5672/%2F",
    "amqp://u:p/w2@n2:5672/%2F",
    "amqps://u:pw3@n3:5671/%2F",
]


def test_broker_url_with_several_nodes_from_the_environment() -> None:
    environ = {"TASKQ_BROKER_URL": " ; ".join(_NODES) + ";"}

    settings = Settings.load(environ=environ)

    assert settings.broker_urls == _NODES


def test_broker_url_as_a_list_in_code_is_joined() -> None:
    app = App("shop", broker_url=list(_NODES))

    assert app.settings.broker_url == ";".join(_NODES)
    assert app.settings.broker_urls == _NODES


def test_several_broker_urls_are_masked_in_repr() -> None:
    settings = Settings.load({"broker_url": list(_NODES)}, environ={})

    text = repr(settings)

    assert "pw;1" not in text and "p/w2" not in text and "pw3" not in text
    assert text.count(":***@") >= 3


@pytest.mark.parametrize(
    ("broker_url", "fragment"),
    [
        ([], "at least one"),
        (["amqp://u:pw@n1/%2F", ""], "at least one"),
        (["amqp://u:pw@n1/%2F;amqp://u:pw@n2/%2F"], "one URL per entry"),
        ("rabbit2:5672;amqp://u:s3cret@n1/%2F", "not an AMQP URL"),
        ("", "empty"),
    ],
)
def test_invalid_broker_url_lists_are_rejected_without_the_password(
    broker_url: object, fragment: str
) -> None:
    with pytest.raises(ConfigurationError, match=fragment) as caught:
        Settings.load({"broker_url": broker_url}, environ={})

    assert "s3cret" not in str(caught.value) and "pw@" not in str(caught.value)


def test_publish_timeout_and_default_queue_type_settings() -> None:
    settings = Settings.load(
        environ={"TASKQ_PUBLISH_TIMEOUT_S": "7.5", "TASKQ_DEFAULT_QUEUE_TYPE": "quorum"}
    )

    assert settings.publish_timeout_s == 7.5
    assert settings.default_queue_type == "quorum"
    with pytest.raises(ConfigurationError, match="default_queue_type"):
        Settings.load({"default_queue_type": "stream"}, environ={})
    with pytest.raises(ConfigurationError, match="publish_timeout_s must not be negative"):
        Settings.load({"publish_timeout_s": -1}, environ={})


def test_delay_tier_queue_type_follows_default_queue_type_unless_set() -> None:
    # Unset: the tiers take the work queues' type (a quorum app gets replicated tiers)
    assert Settings.load({}, environ={}).delay_tier_queue_type == "classic"
    quorum = Settings.load({"default_queue_type": "quorum"}, environ={})
    assert quorum.delay_tier_queue_type == "quorum"
    from_env = Settings.load(environ={"TASKQ_DEFAULT_QUEUE_TYPE": "quorum"})
    assert from_env.delay_tier_queue_type == "quorum"
    # ... and keeps following it through replace()
    assert quorum.replace(default_queue_type="classic").delay_tier_queue_type == "classic"

    # Set explicitly (in code or in the environment), it wins and stays
    mixed = Settings.load(
        {"default_queue_type": "quorum", "delay_tier_queue_type": "classic"}, environ={}
    )
    assert mixed.delay_tier_queue_type == "classic"
    assert mixed.replace(default_queue_type="classic", namespace="x").delay_tier_queue_type == (
        "classic"
    )
    pinned = Settings.load(
        {"default_queue_type": "quorum"}, environ={"TASKQ_DELAY_TIER_QUEUE_TYPE": "classic"}
    )
    assert pinned.delay_tier_queue_type == "classic"
    assert Settings.load({"delay_tier_queue_type": "quorum"}, environ={}).replace(
        default_queue_type="classic").delay_tier_queue_type == "quorum"
