"""The pure side of the delay backends: binary decomposition, tier routing, validation."""

from __future__ import annotations

import logging
import random
import time
from datetime import datetime, timedelta, timezone

import msgpack
import pytest

from taskq import ConfigurationError, PublishError
from taskq.broker import topology as topo
from taskq.delay.backend import DelayedMessage
from taskq.delay.choosing import choose_backend
from taskq.delay.maths import (
    delay_ms_from_s,
    epoch_ms,
    eta_ms_of,
    tier_headers,
    tier_levels,
    x_delay,
)
from taskq.delay.plugin import PluginDelay
from taskq.delay.tiers import CLOCK_SLICE, TierDelay
from taskq.message import ETA, WireMessage
from taskq.settings import Settings

DAY_MS = 86_400_000
NS = "shop"


def walk(namespace: str, queue_type: str, entry: str, headers: dict, routing_key: str):
    """Route a message through the declared tiers like RabbitMQ would, without waiting.

    Returns (total TTL waited in ms, tier queues visited, the exchange it leaves to).
    """
    declared = topo.delay_tier_declarations(namespace, queue_type)
    queues = {q.name: q.arguments for q in declared.declarations.queues}
    bindings: dict[str, list[topo.HeaderBindingSpec]] = {}
    for binding in declared.header_bindings:
        bindings.setdefault(binding.source, []).append(binding)
    waited, visited, exchange = 0, [], entry
    while exchange in bindings:
        matches = [
            b
            for b in bindings[exchange]
            if all(headers.get(k) == v for k, v in b.arguments.items() if k != "x-match")
        ]
        assert len(matches) == 1, f"{exchange}: a message must take exactly one route"
        [match] = matches
        if match.to_exchange:
            exchange = match.destination
        else:
            arguments = queues[match.destination]
            assert "x-dead-letter-routing-key" not in arguments  # the key stays the queue
            waited += arguments["x-message-ttl"]
            visited.append(match.destination)
            exchange = arguments["x-dead-letter-exchange"]
    return waited, visited, exchange, routing_key


def tiers_backend(queue_type: str = "classic") -> TierDelay:
    return TierDelay(topo.Topology(NS), None, None, queue_type=queue_type)  # type: ignore[arg-type]


def message(eta_ms: int, queue: str = "emails", headers: dict | None = None) -> DelayedMessage:
    return DelayedMessage(WireMessage(b"\x80", "id-1", dict(headers or {})), queue, eta_ms)


@pytest.mark.parametrize(
    ("delay_ms", "levels"),
    [
        (0, []),
        (1, [0]),
        (2, [1]),
        (5000, [12, 9, 8, 7, 3]),
        (2**36 - 1, list(range(35, -1, -1))),
    ],
)
def test_levels_are_the_set_bits_longest_first(delay_ms: int, levels: list[int]) -> None:
    assert tier_levels(delay_ms) == levels


def test_levels_add_up_to_the_delay_and_each_tier_is_used_once() -> None:
    rng = random.Random(4)
    for delay_ms in [*range(0, 300), *(rng.randrange(2**36) for _ in range(2000))]:
        levels = tier_levels(delay_ms)
        assert sum(2**level for level in levels) == delay_ms
        assert len(set(levels)) == len(levels)


def test_thirty_days_decomposes_into_tiers_that_route_to_the_queue() -> None:
    delay_ms = 30 * DAY_MS  # 2_592_000_000 ms
    entry, key, wire = tiers_backend().item(message(1_000 + delay_ms), now_ms=1_000)

    waited, visited, leaves_to, routing_key = walk(NS, "classic", entry, wire.headers, key)

    assert entry == "shop.delay.classic.31"
    # 2_592_000_000 = 0b10011010011111101100100000000000
    assert tier_levels(delay_ms) == [31, 28, 27, 25, 22, 21, 20, 19, 18, 17, 15, 14, 11]
    assert waited == delay_ms
    assert visited == [topo.delay_tier_name(NS, level) for level in tier_levels(delay_ms)]
    assert leaves_to == "shop"  # the app's exchange, whose alternate exchange parks strays
    assert routing_key == "emails"
    assert wire.headers[ETA] == 1_000 + delay_ms


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_every_delay_walks_down_to_the_app_exchange_in_exactly_its_time(queue_type: str) -> None:
    rng = random.Random(7)
    backend = tiers_backend(queue_type)
    delays = [1, 2, 3, 1000, 13_000, 600_000, *(rng.randrange(1, 2**36) for _ in range(200))]
    for delay_ms in delays:
        entry, key, wire = backend.item(message(delay_ms), now_ms=0)
        waited, visited, leaves_to, _ = walk(NS, queue_type, entry, wire.headers, key)
        assert (waited, leaves_to) == (delay_ms, "shop"), delay_ms
        assert len(visited) == bin(delay_ms).count("1")


def test_each_tier_queue_has_one_ttl_so_none_blocks_another() -> None:
    declared = topo.delay_tier_declarations(NS, "classic").declarations
    ttls = {q.name: q.arguments["x-message-ttl"] for q in declared.queues}

    assert len(ttls) == topo.DELAY_TIER_LEVELS
    assert sorted(ttls.values()) == [2**level for level in range(topo.DELAY_TIER_LEVELS)]


def test_quorum_tiers_dead_letter_at_least_once() -> None:
    [top, *_] = topo.delay_tier_declarations(NS, "quorum").declarations.queues

    assert top.name == "shop.delay.quorum.35"
    assert top.arguments["x-queue-type"] == "quorum"
    assert top.arguments["x-dead-letter-strategy"] == "at-least-once"
    assert top.arguments["x-overflow"] == "reject-publish"


def test_tier_exchanges_park_what_they_cannot_route() -> None:
    exchanges = topo.delay_tier_declarations(NS, "classic").declarations.exchanges

    assert {e.type for e in exchanges} == {"headers"}
    assert {e.arguments["alternate-exchange"] for e in exchanges} == {"shop.unroutable"}


def test_a_message_without_tier_headers_matches_no_binding() -> None:
    # RabbitMQ then hands it to the alternate exchange: parked, not lost.
    declared = topo.delay_tier_declarations(NS, "classic")
    assert all(len(b.arguments) == 2 for b in declared.header_bindings)


def test_headers_name_only_the_tiers_below_the_entry() -> None:
    assert tier_headers(0b1010) == {
        "taskq-delay-level-03": 1,
        "taskq-delay-level-02": 0,
        "taskq-delay-level-01": 1,
        "taskq-delay-level-00": 0,
    }


@pytest.mark.parametrize("bad", [-1, 2**36, 1.5, True, "10"])
def test_delays_outside_the_tiers_are_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError):
        tier_levels(bad)  # type: ignore[arg-type]


def test_longest_delay_and_longest_queue_name_fit_in_amqp_limits() -> None:
    queue = "q" * 200  # the longest name validate_queue_name accepts
    entry, key, wire = tiers_backend().item(message(topo.DELAY_TIERS_MAX_MS, queue), now_ms=0)

    assert len(key.encode()) <= 255  # the routing key stays the queue name
    assert len(entry.encode()) <= 255
    assert len(wire.headers) == topo.DELAY_TIER_LEVELS + 1  # + taskq-eta
    assert len(msgpack.packb(wire.headers)) < 2048  # far below a frame (128 KiB)


def test_longer_than_the_tiers_is_a_configuration_error_naming_the_outbox() -> None:
    with pytest.raises(ConfigurationError, match="outbox"):
        tiers_backend().item(message(topo.DELAY_TIERS_MAX_MS + 1), now_ms=0)


def test_republished_delay_drops_x_death_and_stale_tier_bits() -> None:
    stale = {
        "x-death": [{"count": 1}],
        "x-first-death-queue": "shop.delay.classic.09",
        "taskq-delay-level-20": 1,
        "x-delay": 5,
        "trace": "abc",
    }
    _, _, wire = tiers_backend().item(message(3, headers=stale), now_ms=0)

    assert wire.headers == {
        "trace": "abc",
        ETA: 3,
        "taskq-delay-level-01": 1,
        "taskq-delay-level-00": 1,
    }


def test_a_due_message_goes_straight_to_the_app_exchange() -> None:
    entry, key, wire = tiers_backend().item(message(500), now_ms=900)

    assert (entry, key) == ("shop", "emails")
    assert wire.headers == {ETA: 500}


# -- plugin --------------------------------------------------------------------------------


@pytest.mark.parametrize("delay_ms", [0, 1, 2**31, 2**32 - 1])
def test_x_delay_accepts_whole_milliseconds_up_to_the_plugin_limit(delay_ms: int) -> None:
    assert x_delay(delay_ms) == delay_ms


@pytest.mark.parametrize("bad", [1.5, "100", True, None, -1, 2**32])
def test_x_delay_refuses_what_crashes_or_fools_the_plugin(bad: object) -> None:
    # A non-integer x-delay crashes the plugin and closes the connection; one above
    # 2**32 - 1 ms is delivered at once.
    with pytest.raises(ConfigurationError):
        x_delay(bad)  # type: ignore[arg-type]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list] = []

    def publish_many(self, items, **kwargs) -> None:  # noqa: ANN001, ANN003
        self.calls.append(list(items))

    def close(self) -> None:
        pass


def test_plugin_sends_longer_delays_through_the_tiers() -> None:
    plugin, tiers = Recorder(), Recorder()
    backend = PluginDelay(topo.Topology(NS), plugin, tiers)  # type: ignore[arg-type]
    short, long = message(2**32 - 1), message(2**32)

    backend.publish_many([short, long], now_ms=0)

    [[(exchange, key, wire)]] = plugin.calls
    assert (exchange, key) == ("shop.delayed", "emails")
    assert wire.headers["x-delay"] == 2**32 - 1
    assert tiers.calls == [[long]]


class Preparing(Recorder):
    """A plugin publisher whose every ``publish_many`` takes ``send_ms`` of the clock."""

    def __init__(self, clock: list[int], send_ms: int) -> None:
        super().__init__()
        self.clock, self.send_ms = clock, send_ms
        self.sent_at: list[int] = []

    def prepare(self, queues: object) -> None:
        pass

    def publish_many(self, items, **kwargs) -> None:  # noqa: ANN001, ANN003
        self.sent_at.append(self.clock[0])
        super().publish_many(items)
        self.clock[0] += self.send_ms


def test_plugin_measures_each_slice_of_a_large_batch_from_when_it_sends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Measured once before sending, the last messages of a batch that takes a while to
    # send would be late by that sending time (the tiers' twin of this is tested on the
    # broker: TestClassicTierDelay).
    clock = [1_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0] * 1_000_000)
    plugin = Preparing(clock, send_ms=100)
    backend = PluginDelay(topo.Topology(NS), plugin, Recorder())  # type: ignore[arg-type]
    eta_ms = clock[0] + 60_000

    backend.publish_many([message(eta_ms) for _ in range(3 * CLOCK_SLICE)])

    assert [len(call) for call in plugin.calls] == [CLOCK_SLICE] * 3
    for sent_at, call in zip(plugin.sent_at, plugin.calls, strict=True):
        assert {wire.headers["x-delay"] for _, _, wire in call} == {eta_ms - sent_at}


def test_plugin_lists_the_later_slices_of_a_batch_as_unsent_when_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class RefusingSecond(Preparing):
        def publish_many(self, items, **kwargs) -> None:  # noqa: ANN001, ANN003
            super().publish_many(items)
            if len(self.calls) == 2:
                raise PublishError("nacked", reason="nacked",
                                   unconfirmed_ids=[w.message_id for _, _, w in items])

    clock = [1_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0] * 1_000_000)
    plugin = RefusingSecond(clock, send_ms=10)
    backend = PluginDelay(topo.Topology(NS), plugin, Recorder())  # type: ignore[arg-type]
    messages = [
        DelayedMessage(WireMessage(b"\x80", f"id-{i}", {}), "emails", clock[0] + 60_000)
        for i in range(3 * CLOCK_SLICE)
    ]

    with pytest.raises(PublishError) as caught:
        backend.publish_many(messages)

    assert len(plugin.calls) == 2  # the third slice is not sent after a refusal
    assert caught.value.unconfirmed_ids == [m.wire.message_id for m in messages[CLOCK_SLICE:]]
    assert "not sent" in caught.value.message


def test_plugin_exchange_has_no_alternate_exchange_and_binds_each_queue() -> None:
    declared = topo.delayed_exchange_declarations(NS, "emails")

    [exchange] = declared.exchanges
    assert exchange.type == "x-delayed-message"
    assert exchange.arguments == {"x-delayed-type": "direct"}
    assert declared.bindings == (topo.BindingSpec("emails", "shop.delayed", "emails"),)


# -- time --------------------------------------------------------------------------------------


def test_seconds_round_up_to_milliseconds() -> None:
    assert delay_ms_from_s(0.0011) == 2
    assert delay_ms_from_s(0) == 0
    assert delay_ms_from_s(2) == 2000


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), "5", True, None])
def test_a_delay_that_is_not_a_finite_number_is_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError):
        delay_ms_from_s(bad)  # type: ignore[arg-type]


def test_eta_rounds_up_and_now_rounds_down() -> None:
    at = datetime(2030, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=1_500)

    assert eta_ms_of(at) == epoch_ms(at) + 1
    assert epoch_ms(at) == 1_893_456_000_001


# -- choosing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "found", "chosen"),
    [("auto", True, "plugin"), ("auto", False, "tiers"), ("auto", None, "tiers"),
     ("plugin", True, "plugin"), ("plugin", None, "plugin")],
)
def test_choice_follows_the_setting_and_the_broker(
    setting: str, found: bool | None, chosen: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="taskq.delay")

    assert choose_backend(Settings(delay_backend=setting), probe=lambda: found) == chosen
    assert f"delay backend: {chosen}" in caplog.text


def test_tiers_setting_never_asks_the_broker() -> None:
    def probe() -> bool:
        raise AssertionError("probed")

    assert choose_backend(Settings(delay_backend="tiers"), probe=probe) == "tiers"


def test_plugin_setting_without_the_plugin_says_how_to_enable_it() -> None:
    with pytest.raises(ConfigurationError, match="rabbitmq-plugins enable"):
        choose_backend(Settings(delay_backend="plugin"), probe=lambda: False)


@pytest.mark.parametrize(
    "settings",
    [{"delay_backend": "redis"}, {"delay_tier_queue_type": "stream"},
     {"outbox_delay_horizon_s": -1.0}, {"outbox_delay_horizon_s": 90 * 86400.0}],
)
def test_bad_delay_settings_are_refused(settings: dict) -> None:
    with pytest.raises(ConfigurationError):
        Settings(**settings)
