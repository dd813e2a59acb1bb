"""The consumer loop of one worker process: delivery -> checks -> execute -> one action.

For each delivery, in order: size check, crash-loop and time-limit check (redeliveries
only), decode, early-eta check, registry lookup, execute, then exactly one outcome action:
ack on success; a retry the policy allows (:mod:`taskq.retry`) is published through the delay
backend (confirmed) and *then* the delivery acked (:mod:`~taskq.worker.retrying`); otherwise a
copy goes to the dead-letter exchange (confirmed) and *then* the delivery is acked
(:mod:`~taskq.worker.dead_letters`). Redelivered messages that killed their processes are
settled by :mod:`~taskq.worker.crash_loops`. If a publish fails the delivery is held and
the publish retried, never acked unpublished; a delivery that met an infrastructure fault
before its task ran (taskq's database unreachable) goes back to its queue without using an
attempt (:mod:`~taskq.worker.infra_faults`), so nothing is ever dropped silently.

This is the hot path. Everything that can be is computed once in ``__init__`` (task plans,
log-level checks, the size limit); per message there are no imports, no string formatting
unless the log level is enabled, and no database calls.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from taskq.errors import DecodeError, IdempotencyError, ResultError, Retry
from taskq.message import IDEMPOTENCY_KEY, TASK, WORKFLOW, Envelope, decode
from taskq.ordering.in_place import InPlaceRetrier
from taskq.received import normalize_received
from taskq.request import Request
from taskq.retry import (
    Decision,
    GiveUp,
    RetryOverrides,
    RetryPolicy,
    decide,
    resolve_policy,
)
from taskq.worker.crash_loops import CrashLoopGuard
from taskq.worker.dead_letters import DeadLetterer, log_fields
from taskq.worker.dedupe import Busy, Deduplicator, Duplicate, Unavailable
from taskq.worker.events import Observers, TaskEvent
from taskq.worker.execution import (
    Failed,
    Outcome,
    Rejected,
    Succeeded,
    execute,
)
from taskq.worker.infra_faults import FaultBackoff, Hold, SendBack
from taskq.worker.plans import Plan, plan_of
from taskq.worker.time_limits import RunInHand
from taskq.workflows.completion import WorkflowHooks

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.broker.delivery import Delivery
    from taskq.broker.subscription import Subscription
    from taskq.worker.deaths import DeathLedger
    from taskq.worker.time_limits import Slot, SoftTimeLimit

logger = logging.getLogger(__name__)

# Longest wait for the I/O thread to write a failure's settlement before the next delivery.
SETTLEMENT_SEND_WAIT_S = 1.0
# How long get() blocks before the loop looks at its flags again (stop, parent alive).
_IDLE_POLL_S = 0.5
# A delivery due later than this is sent back to wait in the broker instead of run early
# (a delay backend hiccup); clocks of producer and worker may differ by less.
_EARLY_TOLERANCE_S = 1.0


class WorkerLoop:
    """Runs deliveries from a :class:`~taskq.broker.subscription.Subscription`.

    Args:
        app: The app whose registry decides what may run.
        subscription: Where deliveries come from and acks go.
        slot: Shared with the supervisor: message in hand and hard deadline.
        sibling_slots: The other worker processes' slots (read on redeliveries only).
        ledger: The supervisor's death records (read on redeliveries only).
        soft_limit: The process's SIGALRM timer for soft time limits.
        observers: Told about task events (results, metrics); none by default.
    """

    def __init__(
        self,
        app: App,
        subscription: Subscription,
        *,
        slot: Slot,
        ledger: DeathLedger,
        soft_limit: SoftTimeLimit,
        sibling_slots: Sequence[Slot] = (),
        observers: Observers | None = None,
    ) -> None:
        settings = app.settings
        self._app = app
        self._subscription = subscription
        self._slot = slot
        self.run_in_hand = RunInHand(slot)  # the I/O thread ends it on a consumer timeout
        self._soft_limit = soft_limit
        self._max_size = settings.max_message_size_bytes
        self._max_tasks = settings.max_tasks_per_child
        self._plans = {task.name: plan_of(task) for task in app.registry}
        self._dedupe = Deduplicator(app)
        # Deliveries whose idempotency keys are claimed and checked together (0: no
        # idempotent task).
        checkable = any(p.idempotent and not p.transactional for p in self._plans.values())
        self._batch_max = max(0, settings.prefetch_count - 1) if checkable else 0
        self._default_policy = RetryPolicy.from_settings(settings)
        self._debug = logger.isEnabledFor(logging.DEBUG)
        self._info = logger.isEnabledFor(logging.INFO)
        self._parent_pid = os.getppid()
        self._observers = observers if observers is not None else Observers()
        hold = self._hold = Hold(lambda: subscription.generation, self._is_stopping)
        self._workflows = WorkflowHooks(app)
        self._dead_letters = DeadLetterer(app, self._observers, hold=hold,
                                          workflows=self._workflows)
        self._retrier = InPlaceRetrier(  # plain Retrier for unordered queues' deliveries
            app, hold=hold, dead_letters=self._dead_letters, is_stopping=self._is_stopping,
            generation=lambda: subscription.generation, alive_at=slot.alive_at,
        )
        self._send_back = SendBack(self._retrier.send_back)
        # A copy found claimed by another process waits about this long before it is due.
        self._busy_send_back = SendBack(
            self._retrier.send_back, FaultBackoff(2.0, 2.0),
            kind="it may run there; if that copy fails or dies, this one runs",
        )
        self._crash_loops = CrashLoopGuard(
            ledger, sibling_slots, max_deaths=settings.max_process_deaths,
            dead_letters=self._dead_letters, retrier=self._retrier, decide=self._decide,
        )
        self.stop_requested = False
        self.tasks_done = 0
        self._unsent_settlement = False

    def request_stop(self) -> None:
        """Warm stop: finish the task in hand, then return. Safe in a signal handler."""
        self.stop_requested = True
        self._subscription.stop_consuming()

    def run(self) -> None:
        """Consume until asked to stop, ``max_tasks_per_child`` is reached or the parent dies.

        Whatever a message carries (properties and headers of any AMQP type, from any
        client), it must not take the process down: properties and header names are made
        ``str`` before any check, and an exception nobody foresaw while handling one delivery
        is contained to it (logged, the delivery dead-lettered as ``WorkerError``); the loop
        goes on with the next.

        Raises:
            TopologyError: the queues cannot be declared as configured.
        """
        get, handle, gives_back = self._subscription.get, self.handle, self._retrier.gives_back
        subscription, max_tasks = self._subscription, self._max_tasks
        subscription.watch_progress(self._slot.io_at)  # the supervisor replaces a stalled one
        alive_at = self._slot.alive_at
        batch_max = self._batch_max
        while not self.stop_requested:
            delivery = get(_IDLE_POLL_S)
            if delivery is None:
                self._check_parent()
                if subscription.is_connected:
                    alive_at.value = time.monotonic()
                continue
            alive_at.value = time.monotonic()
            batch = [delivery]
            if batch_max:
                batch += subscription.get_ready(batch_max)
                # Even for one delivery: it also forgets the previous batch's checks, whose
                # deliveries may not have run (stale channel, stop) and may come back later.
                self._precheck_or_skip(batch)
            try:
                for item in batch:
                    if self._is_stopping():
                        break  # unacked: the broker requeues what was not started
                    if item.generation != subscription.generation:
                        # Its channel died; the broker already put the message back.
                        logger.info("message %s from %s not run: its channel is gone; the "
                                    "broker redelivers it", item.message.message_id, item.queue)
                        continue
                    if gives_back(item):
                        continue  # behind an earlier delivery of its partition (in_place.py)
                    try:
                        handle(item)
                    except Exception as exc:  # a taskq bug, or a message nobody foresaw
                        self._contain(item, exc)
                    if max_tasks and self.tasks_done >= max_tasks:
                        logger.info("ran %d tasks (max_tasks_per_child); recycling",
                                    self.tasks_done)
                        return
            finally:  # claims of deliveries that did not run end here (dropped, stopped)
                self._dedupe.end_batch()

    def _is_stopping(self) -> bool:
        # A method, not the attribute: a signal handler may set it between two deliveries.
        return self.stop_requested

    def _precheck_or_skip(self, batch: list[Delivery]) -> None:
        """:meth:`_precheck`; should it fail, each task checks its own key when it runs."""
        try:
            self._precheck(batch)
        except Exception:
            logger.exception("the idempotency pre-check of %d deliveries failed; each task "
                             "checks its key when it runs", len(batch))
            self._dedupe.precheck([])  # forget the previous batch's checks all the same

    def _precheck(self, batch: list[Delivery]) -> None:
        """One SELECT for the idempotency keys of the deliveries in hand (see Deduplicator)."""
        keys = []
        plans = self._plans
        for delivery in batch:
            message = delivery.message = normalize_received(delivery.message)
            headers = message.headers
            name = headers.get(TASK)
            # Any AMQP type may arrive here; a list or table is unhashable.
            plan = plans.get(name) if name.__class__ is str else None
            if plan is not None and plan.idempotent and not plan.transactional:
                key = headers.get(IDEMPOTENCY_KEY) or message.message_id
                if isinstance(key, str):
                    keys.append(key)
        self._dedupe.precheck(keys)

    def _contain(self, delivery: Delivery, exc: Exception) -> None:
        """Settle a delivery whose handling raised (a worker bug): park it with the reason.

        Everything after a delivery's ack or dead letter is logging and observers (which
        isolate their own failures), so a delivery that got here is not settled yet.
        """
        self._slot.release()  # it may have failed with the task in hand: no hard limit now
        self._unsent_settlement = True
        self._dead_letters.park_worker_error(delivery, exc)

    def handle(self, delivery: Delivery) -> None:
        """Take one delivery to exactly one outcome action.

        After a delivery settled otherwise than by a success (a dead letter, a retry, a
        postponement), its ack is on the wire before the next delivery is handled: if the
        next task crashed the process first, the broker would redeliver the settled message
        and its dead letter or retry would be published twice (and a crash-loop count, which
        is forgotten once the message is parked, would start over). A success needs no
        wait: a redelivery of it is a duplicate its idempotency key absorbs, and
        ``idempotent=False`` tasks are documented to run again then.
        """
        if self._unsent_settlement:
            self._unsent_settlement = False
            self._subscription.wait_sent(SETTLEMENT_SEND_WAIT_S)
        self._unsent_settlement = not self._handle(delivery)
        while self._retrier.take_again(delivery):  # an ordered task retried in place
            self._unsent_settlement = not self._handle(delivery)

    def _handle(self, delivery: Delivery) -> bool:
        """:meth:`handle`; ``True`` when settled by a success (or as a duplicate)."""
        prepared = self._prepare(delivery)
        if prepared is None:
            return False
        envelope, plan = prepared
        name = envelope.task
        observers = self._observers
        if observers:
            event = TaskEvent(envelope.task_id, name, delivery.queue, envelope.retries)
            held = observers.held(event) if delivery.is_redelivered else None
            if held is not None:
                # It ran here already and went back only because its result could not be
                # stored (database unreachable): store it now instead of running it again.
                self._report_success(delivery, envelope, Succeeded(*held))
                return True
            observers.started(event)  # the store ignores it for a finished task (duplicate)
        if plan.idempotent or WORKFLOW in envelope.headers:  # members count with their key
            outcome = self._run_idempotent(delivery, plan, envelope)
            if outcome is None:
                return True  # a duplicate, or sent back: a redelivery is absorbed by its key
        else:
            outcome = self._execute(plan, envelope, envelope.kwargs, delivery)
        self.tasks_done += 1
        if outcome.__class__ is Succeeded:
            if self._info or observers:
                self._report_success(delivery, envelope, outcome)
            else:
                delivery.ack()
            return True
        self._settle_failure(delivery, name, envelope.task_id, envelope.retries, outcome)
        return False

    def _prepare(self, delivery: Delivery) -> tuple[Envelope, Plan] | None:
        """Checks before running: size, crash loops, envelope, eta, registry.

        Returns ``None`` when the delivery was settled here (dead-lettered or sent back to
        wait), else the envelope and the task's plan.
        """
        # Before anything reads it: str properties and header names, whoever sent it.
        message = delivery.message = normalize_received(delivery.message)
        size = len(message.body)
        if size > self._max_size:
            self._dead_letters.dead_letter(
                delivery, "MessageTooLarge",
                f"body of {size} bytes exceeds max_message_size_bytes={self._max_size}",
            )
            return None
        if delivery.is_redelivered and self._crash_loops.settle(delivery):
            return None
        try:
            envelope = decode(message)
        except DecodeError as exc:
            reason = getattr(exc, "reason", str(exc))
            self._dead_letters.dead_letter(delivery, "DecodeError", reason)
            return None
        name = envelope.task
        if self._debug:
            logger.debug(
                "task %s[%s] received from %s (redelivered=%s)",
                name, envelope.task_id, delivery.queue, delivery.is_redelivered,
            )
        if envelope.eta is not None and self._postponed(delivery, name, envelope.eta):
            return None
        plan = self._plans.get(name) or self._lookup(name)
        if plan is None:
            self._dead_letters.dead_letter(
                delivery, "TaskNotRegistered", f"task {name!r} is not registered in this worker"
            )
            return None
        if self._debug:
            logger.debug("task %s[%s] from %s started", name, envelope.task_id, delivery.queue)
        return envelope, plan

    def _report_success(self, delivery: Delivery, envelope: Envelope, outcome: Outcome) -> None:
        """Store the result, *then* ack (a crash between them leaves a duplicate, not a task
        STARTED forever), then log and tell the observers.

        A result that cannot reach the database is an infrastructure fault
        (docs/reliability.md): the delivery is held and the write retried with backoff (the
        task does not run again).
        Only when it can no longer be held (channel lost, worker stopping) does it go back to
        the queue; the observers hold the outcome, so if it comes back to this process it is
        stored without running again.
        """
        assert isinstance(outcome, Succeeded)  # narrowing for mypy; handle() checked it
        name, task_id = envelope.task, envelope.task_id
        event = TaskEvent(task_id, name, delivery.queue, envelope.retries)
        observers = self._observers
        if observers and self._hold.retry(
            delivery, lambda: observers.completed(event, outcome.duration_s, outcome.result),
            what=f"task {name}[{task_id}] from {delivery.queue}: its result", done="stored",
            faults=(ResultError,), repair="the connection to taskq's database",
        ) is not None:
            logger.error(
                "task %s[%s] from %s succeeded but its result could not be stored before its "
                "delivery had to be given up; returning it to the queue: if it comes back to "
                "this process the held result is stored without running the task again",
                name, task_id, delivery.queue,
                extra=log_fields(task_id, name, delivery.queue, envelope.retries),
            )
            delivery.reject(requeue=True)
            return
        delivery.ack()
        if self._info:
            logger.info(
                "task %s[%s] from %s succeeded in %.3fs (attempt %d)",
                name, task_id, delivery.queue, outcome.duration_s, envelope.retries + 1,
                extra=log_fields(task_id, name, delivery.queue, envelope.retries,
                              outcome.duration_s),
            )
        if self._observers:
            self._observers.succeeded(event, outcome.duration_s, outcome.result)

    def _run_idempotent(
        self, delivery: Delivery, plan: Plan, envelope: Envelope
    ) -> Outcome | None:
        """Run through the idempotency table; ``None`` when the delivery is settled here."""
        task_id, name = envelope.task_id, envelope.task
        key = envelope.idempotency_key or task_id
        result = self._dedupe.run(
            key,
            name,
            envelope.kwargs,
            lambda kwargs: self._execute(plan, envelope, kwargs, delivery),
            transactional=plan.transactional,
            completion=self._workflows.completion_of(envelope),
            retry_record=lambda record: self._hold.retry(
                delivery, record, faults=(IdempotencyError,), done="recorded",
                what=f"task {name}[{task_id}] from {delivery.queue}: its idempotency key",
                repair="the connection to taskq's database",
            ) is None,
        )
        if isinstance(result, Duplicate):
            delivery.ack()
            if self._info:
                logger.info(
                    "task %s[%s] from %s is a duplicate (key %s already done); skipped",
                    name, task_id, delivery.queue, key,
                    extra=log_fields(task_id, name, delivery.queue, envelope.retries),
                )
            if self._observers:
                self._observers.duplicate(
                    TaskEvent(task_id, name, delivery.queue, envelope.retries, key)
                )
            return None
        if isinstance(result, Busy):
            self._busy_send_back(
                delivery, task=name, task_id=task_id,
                reason=f"key {key} is claimed by another worker process running a copy",
            )
            return None
        if isinstance(result, Unavailable):
            self._send_back(delivery, task=name, task_id=task_id, reason=result.error)
            return None
        self._send_back.recovered()
        return result

    def _execute(
        self, plan: Plan, envelope: Envelope, kwargs: dict[str, Any], delivery: Delivery
    ) -> Outcome:
        task_id = envelope.task_id
        request = Request(
            task_id,
            envelope.task,
            envelope.retries,
            delivery.queue,
            envelope.idempotency_key or task_id,
            envelope.eta,
            envelope.headers,
            delivery.is_redelivered,
        )
        self.run_in_hand.begin(delivery, plan.time_limit_s)
        outcome = execute(
            plan.fn,
            envelope.args,
            kwargs,
            soft_time_limit_s=plan.soft_time_limit_s,
            soft_limit=self._soft_limit,
            request=request,
        )
        self.run_in_hand.end()
        return outcome

    def _settle_failure(
        self, delivery: Delivery, name: str, task_id: str, retries: int, outcome: Outcome
    ) -> None:
        if isinstance(outcome, Rejected):
            logger.error(
                "task %s[%s] from %s rejected itself: %s",
                name, task_id, delivery.queue, outcome.reason,
            )
            self._dead_letters.dead_letter(delivery, "Reject", outcome.reason, attempts=retries + 1)
            return
        if isinstance(outcome, Failed):
            decision = self._decide(name, outcome.exc, retries)
            if isinstance(decision, GiveUp):
                logger.error(
                    "task %s[%s] from %s failed after %.3fs, not retried (%s): %s: %s\n%s",
                    name, task_id, delivery.queue, outcome.duration_s, decision.reason,
                    outcome.exc_type, outcome.message, outcome.traceback.rstrip(),
                )
                self._dead_letters.dead_letter(
                    delivery, outcome.exc_type, outcome.message,
                    traceback=outcome.traceback, attempts=retries + 1,
                )
                return
            reason = f"{outcome.exc_type}: {outcome.message}"
            retried = self._retrier.retry(
                delivery, task=name, retries=retries, delay_s=decision.delay_s, reason=reason
            )
            if retried and self._observers:
                self._observers.retrying(
                    TaskEvent(task_id, name, delivery.queue, retries), decision.delay_s,
                    reason, outcome.traceback,
                )

    def _postponed(self, delivery: Delivery, name: str, eta: datetime) -> bool:
        """Send a delivery that is not due yet back to the broker; ``True`` if settled."""
        early_s = eta.timestamp() - time.time()
        if early_s <= _EARLY_TOLERANCE_S:
            return False
        self._retrier.postpone(delivery, task=name, delay_s=early_s)
        return True

    def _decide(self, name: Any, exc: BaseException | None, retries: int) -> Decision:
        """Ask the task's retry policy (the call's ``max_retries`` wins) what follows."""
        plan = self._plans.get(name) if isinstance(name, str) else None
        policy = plan.policy if plan is not None else self._default_policy
        if exc is None:
            return GiveUp("the failure is unknown")
        if isinstance(exc, Retry) and exc.max_retries is not None:
            policy = resolve_policy(policy, RetryOverrides(max_retries=exc.max_retries))
        return decide(policy, exc, retries)

    def _lookup(self, name: str) -> Plan | None:
        task = self._app.registry.lookup(name)
        if task is None:
            return None
        plan = self._plans[name] = plan_of(task)
        return plan

    def _check_parent(self) -> None:
        if os.getppid() != self._parent_pid:
            logger.warning("the supervisor process is gone; stopping")
            self.request_stop()
