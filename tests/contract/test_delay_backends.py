"""Delay backends against the real broker: one contract, run per backend (docs/delays.md).

The plugin backend's run is skipped, with the reason, on a broker without
``rabbitmq_delayed_message_exchange`` (like the test broker); the tier backends always run.
Lateness is measured against each message's ``taskq-eta`` header by a consumer that records
arrival times (tests.support.arrivals).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from taskq import App, PublishError
from taskq.broker import topology as topo
from taskq.broker.delayed import declare_now
from taskq.broker.publisher import OUTAGE_REASONS
from taskq.delay.backend import CLOCK_SLICE, DelayedMessage, merge_declarations
from taskq.delay.maths import epoch_ms
from taskq.message import CONTENT_TYPE, ETA, WireMessage
from tests.conftest import BROKER_URL
from tests.support.arrivals import ArrivalRecorder
from tests.support.delay_plugin import auto_delay_backend, plugin_enabled
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_until

# Late by less than this (docs/delays.md: measured p99 ~35 ms classic, ~50 ms quorum tiers).
PRECISION_MS = 150

def declare_queue(app: App, queue: str) -> None:
    """Declare ``queue`` as the app would, so that a consumer can start before any publish."""
    declare_now(app.settings, app.topology.base())
    declare_now(app.settings, app.topology.for_queue(queue))


def wire(message_id: str, headers: dict[str, Any] | None = None) -> WireMessage:
    return WireMessage(b"\x82\xa4args\x90\xa6kwargs\x80", message_id, dict(headers or {}),
                       content_type=CONTENT_TYPE)


class DelayBackendContract:
    """What every delay backend guarantees; subclasses choose the backend via ``settings``."""

    settings: ClassVar[dict[str, Any]] = {}
    # Latest acceptable arrival after the eta (never early): the bound for tiers.
    precision_ms: ClassVar[int] = PRECISION_MS

    @pytest.fixture
    def app(self, make_app: Callable[..., App]) -> App:
        app = make_app("delays", **self.settings)

        @app.task(name="tick")
        def tick(n: float) -> None:
            return None

        return app

    @pytest.fixture
    def queue(self, app: App) -> str:
        return app.settings.default_queue

    @pytest.fixture
    def arrivals(self, app: App, queue: str) -> Iterator[ArrivalRecorder]:
        declare_queue(app, queue)
        recorder = ArrivalRecorder(BROKER_URL, queue).start()
        self.warm_up(app, queue, recorder)
        yield recorder
        recorder.stop()

    def warm_up(self, app: App, queue: str, recorder: ArrivalRecorder) -> None:
        """Backend-specific: bring freshly declared delay queues to their steady state."""

    def assert_held_by_broker(self, app: App, broker: Any, delay_ms: int) -> None:
        """Backend-specific: the broker (not a process) holds a message of ``delay_ms``."""

    @pytest.mark.parametrize(
        "delays_s",
        [
            pytest.param((5.0, 2.0, 0.5), id="5-2-0.5s"),
            pytest.param((13.0, 5.0, 2.0, 0.5), id="13-5-2-0.5s", marks=pytest.mark.slow),
        ],
    )
    def test_published_in_reverse_they_arrive_in_delay_order_never_early(
        self, app: App, arrivals: ArrivalRecorder, delays_s: tuple[float, ...]
    ) -> None:
        tick = app.registry.get("tick")

        ids = [tick.apply_async((d,), countdown=d).id for d in delays_s]  # longest first

        wait_until(lambda: len(arrivals.arrivals) == len(ids), timeout_s=max(delays_s) + 5,
                   message=lambda: f"arrived: {arrivals.arrivals}")
        assert arrivals.ids() == list(reversed(ids))
        for arrival in arrivals.arrivals:
            assert 0 <= arrival.late_ms < self.precision_ms, arrival

    def test_a_long_delay_does_not_hold_back_a_short_one(
        self, app: App, arrivals: ArrivalRecorder
    ) -> None:
        tick = app.registry.get("tick")

        long = tick.apply_async((60,), countdown=60).id
        short = tick.apply_async((1,), countdown=1).id

        wait_until(lambda: short in arrivals.by_id(), timeout_s=5)
        assert 0 <= arrivals.by_id()[short].late_ms < self.precision_ms
        assert long not in arrivals.by_id()

    def test_a_delayed_message_waits_in_the_broker_not_in_a_process(
        self, app: App, queue: str, broker: Any
    ) -> None:
        # Given a delayed message published by an app that then goes away
        declare_queue(app, queue)
        # 3 s: the first delayed publish may spend a second or more declaring quorum tiers
        # on a busy machine, and the message must still be waiting when it is looked for.
        result = app.registry.get("tick").apply_async((1,), countdown=3.0)
        app.close()

        # Then nothing is in (or unacked from) the work queue: the broker holds it
        assert broker.depth(queue) == 0
        self.assert_held_by_broker(app, broker, 3000)

        # When a consumer that never saw the publisher starts, it gets the message on time
        recorder = ArrivalRecorder(BROKER_URL, queue).start()
        try:
            wait_until(lambda: recorder.ids() == [result.id], timeout_s=8)
            assert 0 <= recorder.arrivals[0].late_ms < self.precision_ms
        finally:
            recorder.stop()

    def test_a_message_for_a_queue_that_is_gone_lands_in_unroutable(
        self, app: App, queue: str, broker: Any
    ) -> None:
        # Long enough that the queue is surely gone before the message is due, even when
        # the first delayed publish spends a second declaring quorum tiers.
        result = app.registry.get("tick").apply_async((1,), countdown=3.0)
        broker.delete_queue(queue)  # gone before the message is due

        unroutable = topo.unroutable_name(app.settings.namespace)
        # Quorum tiers dead-letter at-least-once through a broker worker that settles in
        # rounds: parking can take a few seconds there (classic tiers: milliseconds).
        wait_until(lambda: broker.depth(unroutable) == 1, timeout_s=30)
        [(_, properties, _)] = broker.get_all(unroutable)
        assert properties.message_id == result.id
        assert properties.headers[ETA] >= epoch_ms() - 1000

    def test_publish_delayed_drops_x_death_and_sets_the_eta(
        self, app: App, queue: str, arrivals: ArrivalRecorder
    ) -> None:
        # The worker's retry path: an encoded message that was dead-lettered before.
        old = wire("retry-1", {"x-death": [{"queue": "old", "count": 3}], "trace": "t-1"})
        before_ms = epoch_ms()

        app.publish_delayed(old, queue=queue, delay_s=0.3)

        wait_until(lambda: arrivals.ids() == ["retry-1"], timeout_s=5)
        [arrival] = arrivals.arrivals
        assert arrival.eta_ms is not None and arrival.eta_ms >= before_ms + 300
        # Never early, and delivered through the delay backend, not held elsewhere; precision
        # has its own tests (several arrivals each). One sample here came in 166-175 ms late
        # in two CI runs on a freshly installed clone, never in isolation.
        assert 0 <= arrival.late_ms < 1000
        assert arrival.headers["trace"] == "t-1"
        deaths = arrival.headers.get("x-death") or []
        assert all(death["queue"] != "old" for death in deaths)  # only the tiers' own hops

    def test_a_batch_mixes_due_and_delayed_messages(
        self, app: App, queue: str, arrivals: ArrivalRecorder
    ) -> None:
        # The delay topology declared first (by a message 1 ms away), so that declaring it
        # on a busy machine does not eat the 300 ms between the batch's due times
        app.publish_delayed_many([DelayedMessage(wire("warm-up"), queue, epoch_ms() + 1)])
        wait_until(lambda: len(arrivals.arrivals) == 1, timeout_s=10)
        now = epoch_ms()
        batch = [
            DelayedMessage(wire("later"), queue, now + 600),
            DelayedMessage(wire("soon"), queue, now + 300),
            DelayedMessage(wire("due"), queue, now - 1000),
        ]

        app.publish_delayed_many(batch)

        wait_until(lambda: len(arrivals.arrivals) == 4, timeout_s=5)
        assert arrivals.ids()[1:] == ["due", "soon", "later"], arrivals.arrivals
        for arrival in arrivals.arrivals[1:]:
            assert arrival.late_ms >= 0, arrival
        assert arrivals.by_id()["later"].late_ms < self.precision_ms


    def test_a_refused_due_message_does_not_keep_the_delayed_ones_from_being_sent(
        self, app: App, queue: str, arrivals: ArrivalRecorder
    ) -> None:
        # Given a queue that refuses publishes once full (x-overflow=reject-publish), full
        full = f"{app.settings.namespace}.full"
        app.queue(full, max_length=1, overflow="reject-publish")
        app.publish_delayed_many([DelayedMessage(wire("filler"), full, epoch_ms() - 1)])

        # When one call publishes a due message for it and a delayed one for another queue
        now = epoch_ms()
        with pytest.raises(PublishError) as caught:
            app.publish_delayed_many([
                DelayedMessage(wire("refused"), full, now - 1),
                DelayedMessage(wire("later"), queue, now + 300),
            ])

        # Then the error names the refused one, and the delayed one was sent all the same
        # (main: it was never sent, and the error did not name it)
        assert caught.value.unconfirmed_ids == ["refused"]  # type: ignore[attr-defined]
        wait_until(lambda: arrivals.ids() == ["later"], timeout_s=10,
                   message=lambda: f"arrived: {arrivals.arrivals}")
        assert arrivals.arrivals[0].late_ms >= 0

    def test_an_outage_at_the_due_part_names_every_message_of_the_call(
        self, make_app: Callable[..., App]
    ) -> None:
        with TcpProxy.for_url(BROKER_URL) as proxy:
            # Given an app whose delay backend is chosen, then a broker it cannot reach
            app = make_app("delays", broker_url=proxy.url(BROKER_URL), publish_timeout_s=1.0,
                           connect_timeout_s=1.0, **self.settings)
            queue = app.settings.default_queue
            app.publish_delayed_many([DelayedMessage(wire("first"), queue, epoch_ms() + 60_000)])
            proxy.cut()

            # When one call publishes a due message and delayed ones
            now = epoch_ms()
            with pytest.raises(PublishError) as caught:
                app.publish_delayed_many([
                    DelayedMessage(wire("due"), queue, now - 1),
                    DelayedMessage(wire("later-1"), queue, now + 60_000),
                    DelayedMessage(wire("later-2"), queue, now + 120_000),
                ])

        # Then none was confirmed, and the error says so of every one (main: only "due",
        # so a caller would take the delayed ones for sent)
        error = caught.value
        assert error.reason in OUTAGE_REASONS  # type: ignore[attr-defined]
        assert sorted(error.unconfirmed_ids) == ["due", "later-1", "later-2"]  # type: ignore[attr-defined]
        assert "2 delayed message(s)" in str(error)


class TestClassicTierDelay(DelayBackendContract):
    """The plugin-free backend on classic queues (works on any RabbitMQ)."""

    settings: ClassVar[dict[str, Any]] = {"delay_backend": "tiers"}

    def assert_held_by_broker(self, app: App, broker: Any, delay_ms: int) -> None:
        # A short delay may already have moved on from its entry tier on a busy machine,
        # so count it in whichever tier holds it; no tier at or above the delay may.
        kind = app.settings.delay_tier_queue_type
        ns = app.settings.namespace
        top = delay_ms.bit_length() - 1
        depths = {
            level: broker.depth(topo.delay_tier_name(ns, level, kind))
            for level in range(top + 1)
            if broker.exists(topo.delay_tier_name(ns, level, kind))
        }
        assert sum(depths.values()) == 1, depths

    @pytest.mark.slow
    def test_the_last_messages_of_a_large_batch_are_not_late_by_its_sending_time(
        self, app: App, queue: str, arrivals: ArrivalRecorder
    ) -> None:
        # Given the tiers declared, and 4,000 messages due 3-19 s from now, one per 4 ms, so
        # that the tiers and the consumer keep up with them even on a busy machine (CI of
        # 5d26253, one per millisecond: the consumer fell behind, the last 500 came in
        # 300 ms later than the first 500 while the batch was sent in 410 ms)
        app.publish_delayed_many([DelayedMessage(wire("warm-up"), queue, epoch_ms() + 1)])
        wait_until(lambda: len(arrivals.arrivals) == 1, timeout_s=10)
        arrivals.arrivals.clear()
        count, now = 4_000, epoch_ms()
        batch = [DelayedMessage(wire(f"m{i}"), queue, now + 3_000 + 4 * i) for i in range(count)]

        # When they are published in one call (sending them takes a while)
        began = time.monotonic()
        app.publish_delayed_many(batch)
        sending_ms = (time.monotonic() - began) * 1000

        # Then none is early, and the last ones are not later than the first ones by the
        # call's sending time: each slice of the batch is measured from when it is sent
        wait_until(lambda: len(arrivals.arrivals) == count, timeout_s=30,
                   message=lambda: f"{len(arrivals.arrivals)} of {count} arrived")
        assert min(a.late_ms for a in arrivals.arrivals) >= 0
        late = {int(a.message_id[1:]): a.late_ms for a in arrivals.arrivals}
        first = statistics.median(late[i] for i in range(500))
        last = statistics.median(late[i] for i in range(count - 500, count))
        assert last - first < max(sending_ms / 3, 50), (first, last, sending_ms)

    def test_thirty_days_wait_in_tier_31(self, app: App, broker: Any) -> None:
        app.registry.get("tick").apply_async((1,), countdown=30 * 86400)

        # 30 days = 2**31 + ... ms: the message enters at the 2**31 ms (24.9 days) tier.
        self.assert_held_by_broker(app, broker, 30 * 86_400_000)


class TestQuorumTierDelay(TestClassicTierDelay):
    """The plugin-free backend on quorum queues (delayed messages replicated)."""

    # Quorum queues expire and dead-letter through Raft: usually as prompt as classic
    # tiers, but p99 reached ~230 ms in one benchmark run of three (docs/delays.md).
    precision_ms: ClassVar[int] = 500

    settings: ClassVar[dict[str, Any]] = {
        "delay_backend": "tiers",
        "delay_tier_queue_type": "quorum",
    }

    def warm_up(self, app: App, queue: str, recorder: ArrivalRecorder) -> None:
        # Freshly declared quorum tiers hold their first message 200-350 ms late (measured:
        # the first of four batches here, then 10-20 ms; docs/delays.md); a deployment's
        # tiers live on. Each test declares new ones, so one message first walks the ten
        # tiers below 1,024 ms, where the tests' short delays pass.
        app.publish_delayed(wire("warm-up"), queue=queue, delay_s=1.023)
        wait_until(lambda: recorder.ids() == ["warm-up"], timeout_s=10,
                   message="the warm-up message did not arrive through the quorum tiers")
        recorder.arrivals.clear()

    def test_the_last_messages_of_a_large_batch_are_not_late_by_its_sending_time(
        self, app: App, queue: str, arrivals: ArrivalRecorder
    ) -> None:
        pytest.skip(
            "quorum tiers dead-letter bursts of expiries at their own pace (8,000 due within "
            "2 s: 846 ms late at the median with the batch sent in 325 ms), so the clock is "
            "not what limits them (docs/delays.md); the classic tiers' run checks the slicing"
        )


@pytest.mark.plugin
class TestPluginDelay(DelayBackendContract):
    """The delayed-message plugin; skipped, with the reason, where the broker lacks it."""

    settings: ClassVar[dict[str, Any]] = {"delay_backend": "plugin"}

    @pytest.fixture(autouse=True)
    def _needs_plugin(self) -> None:
        if not plugin_enabled():
            pytest.skip(
                "rabbitmq_delayed_message_exchange is not enabled on the test broker "
                f"({BROKER_URL.split('@')[-1]}); enable it (rabbitmq-plugins enable "
                "rabbitmq_delayed_message_exchange) to run the plugin backend's contract"
            )

    def test_a_message_for_a_queue_that_is_gone_lands_in_unroutable(
        self, app: App, queue: str, broker: Any
    ) -> None:
        pytest.skip(
            "a documented cost of the plugin: its exchange cannot have an alternate exchange "
            "(it would get an immediate copy of every message), so a message whose queue is "
            "gone when it is due is dropped by the broker (docs/delays.md)"
        )

    @pytest.mark.slow
    def test_each_slice_of_a_batch_over_many_queues_is_as_late_as_the_first(
        self, app: App
    ) -> None:
        # The plugin publisher declares a slice's queues again before sending it (a queue
        # deleted meanwhile would drop its delayed messages silently): that must happen
        # before the slice's clock is read. (The tiers declare once per process; their
        # slicing is checked by the classic tiers' large batch.)
        # Given 200 queues, declared and consumed
        queues = [f"{app.settings.namespace}.q{n:03d}" for n in range(200)]
        for name in queues:
            app.queue(name)
        declare_now(app.settings, merge_declarations(
            [app.topology.base(), *(app.topology.for_queue(name) for name in queues)]
        ))
        recorder = ArrivalRecorder(BROKER_URL, queues).start()
        try:
            # and 3,000 messages over them, due 15-27 s from now, one per 4 ms (sending them
            # took 5-11 s on a busy machine: none may be due before it is sent)
            count, now = 3_000, epoch_ms()
            batch = [DelayedMessage(wire(f"m{i}"), queues[i % len(queues)], now + 15_000 + 4 * i)
                     for i in range(count)]

            # When they are published in one call (6 slices of CLOCK_SLICE messages, each
            # for all 200 queues)
            app.publish_delayed_many(batch)

            wait_until(lambda: len(recorder.arrivals) == count, timeout_s=60,
                       message=lambda: f"{len(recorder.arrivals)} of {count} arrived")
        finally:
            recorder.stop()

        # Then none is early, and the later slices are about as late as the first: a
        # slice's queues are declared before its clock is read (main, plugin backend, on a
        # busy machine: the first slice 30-47 ms late at the median, the later ones 296-1,783
        # ms; after: mostly 19-120 ms, but a single slice of a run up to 350 ms, a stall of
        # the broker or the machine, hence the later slices' median)
        late = {int(a.message_id[1:]): a.late_ms for a in recorder.arrivals}
        assert min(late.values()) >= 0
        medians = [statistics.median(late[i] for i in range(first, min(first + CLOCK_SLICE, count)))
                   for first in range(0, count, CLOCK_SLICE)]
        print(f"{type(self).__name__}: median lateness of each slice (ms): {medians}")
        assert statistics.median(medians[1:]) - medians[0] < 150, medians


def test_auto_picks_what_the_broker_has_and_logs_it(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="taskq.delay")
    app = make_app("delays")  # delay_backend="auto" is the default

    expected = auto_delay_backend()
    assert app.delay_backend_name == expected
    assert app.delay_backend.name == expected
    assert f"delay backend: {expected} (auto: " in caplog.text
    if not plugin_enabled():  # 3.x: not enabled; 4.3: cannot exist (no Mnesia)
        assert ("rabbitmq_delayed_message_exchange is not enabled" in caplog.text
                or "which has no delayed-message plugin" in caplog.text), caplog.text


def test_a_delayed_publish_to_an_unreachable_broker_is_a_publish_error(
    make_app: Callable[..., App],
) -> None:
    app = make_app("delays", broker_url="amqp://guest:guest@127.0.0.1:1/%2F",
                   connect_timeout_s=1.0)

    @app.task(name="tick")
    def tick(n: float) -> None:
        return None

    with pytest.raises(PublishError) as caught:
        tick.apply_async((1,), countdown=5)
    assert caught.value.reason == "unreachable"  # type: ignore[attr-defined]
    assert "guest:***@" in str(caught.value)
