"""The demo's tasks: an order lane and a notification lane.

Each run appends one line to the file named by ``TASKQ_DEMO_RECORD`` so the demo can show
progress and say which process ran what; a real app would do real work here.
"""

from __future__ import annotations

import os
import random
import time

import sqlalchemy as sa

from taskq import App

# No database_url: the outbox lives in the embedded default, sqlite:///taskq.sqlite3.
NAMESPACE = os.environ.get("TASKQ_DEMO_NAMESPACE", "taskq-demo")
app = App("demo", namespace=NAMESPACE)

shop = sa.MetaData()
orders = sa.Table(
    "demo_orders",
    shop,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),
)

# Queue names carry no namespace of their own: prefix them, so that no other app (nor a
# test run with another namespace) meets these queues.
ORDERS = f"{NAMESPACE}.orders"
EMAILS = f"{NAMESPACE}.emails"

# Orders are the critical lane; notifications may be shed first under load.
app.queue(ORDERS, max_priority=10)
app.queue(EMAILS, max_priority=10, max_length=10_000, overflow="reject-publish")


def _record(queue: str, name: str, priority: int, seq: int) -> None:
    line = f"{os.getpid()} {queue} {name} {priority} {seq} {time.time():.6f}\n"
    fd = os.open(os.environ["TASKQ_DEMO_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: lines never interleave
    finally:
        os.close(fd)


@app.task(name="demo.charge_order", queue=ORDERS)
def charge_order(order_id: int, amount_cents: int, priority: int, seq: int) -> None:
    """Pretend to charge a card (5-15 ms of work)."""
    time.sleep(random.uniform(0.005, 0.015))
    _record(ORDERS, "charge_order", priority, seq)


@app.task(name="demo.send_email", queue=EMAILS)
def send_email(order_id: int, template: str, priority: int, seq: int) -> None:
    """Pretend to send an email (2-8 ms of work)."""
    time.sleep(random.uniform(0.002, 0.008))
    _record(EMAILS, "send_email", priority, seq)


def place_order(conn: sa.Connection, order_id: int, amount_cents: int, priority: int) -> None:
    """Save an order and enqueue its two tasks in the same transaction (the outbox)."""
    conn.execute(orders.insert().values(id=order_id, amount_cents=amount_cents,
                                        priority=priority))
    charge_order.apply_async((order_id, amount_cents, priority, order_id * 2),
                             priority=priority, session=conn)
    send_email.apply_async((order_id, "order-confirmation", priority, order_id * 2 + 1),
                           priority=priority, session=conn)
