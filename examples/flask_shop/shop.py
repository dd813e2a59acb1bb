"""A Flask shop: ``POST /orders`` saves an order and enqueues its confirmation, atomically.

The view adds the order and calls ``send_confirmation.delay(order.id)`` in the same
``db.session`` transaction: the task's outbox row commits with the order or not at all. The
worker (``flask --app examples.flask_shop.shop taskq worker``) runs the task inside an
application context, where it uses ``db.session`` and ``current_app`` like a view does.

Configuration comes from the environment: ``SHOP_DATABASE_URL`` (default: SQLite in the
instance folder) and taskq's ``TASKQ_*`` variables (``TASKQ_BROKER_URL``...).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from flask import Flask, abort, current_app, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from taskq.contrib.flask import TaskQ

logger = logging.getLogger(__name__)


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
taskq = TaskQ(db=db, name="flask-shop")


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "flask_shop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    total_cents: Mapped[int]
    confirmation: Mapped[str | None]


@taskq.task
def send_confirmation(order_id: int) -> None:
    """Send (here: log) the confirmation of an order and note it on the order."""
    order = db.session.get(Order, order_id)
    if order is None:
        raise LookupError(f"order {order_id} does not exist")
    text = (
        f"{current_app.config['SHOP_NAME']}: order #{order.id} confirmed, "
        f"{order.total_cents / 100:.2f} EUR"
    )
    logger.info("confirmation to %s: %s", order.email, text)
    order.confirmation = text
    db.session.commit()


def place_order(email: str, total_cents: int) -> Order:
    """Add an order to ``db.session`` and enqueue its confirmation (the caller commits)."""
    order = Order(email=email, total_cents=total_cents)
    db.session.add(order)
    db.session.flush()  # assigns order.id
    send_confirmation.delay(order.id)
    return order


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """The shop's Flask app; ``config`` overrides the defaults and the environment."""
    # Flask puts the instance folder beside the top-level package (examples/), which is the
    # repository root here: keep it in the example's own directory instead.
    app = Flask(__name__, instance_path=str(Path(__file__).resolve().parent / "instance"))
    app.config.from_mapping(
        SHOP_NAME="Flask shop",
        SQLALCHEMY_DATABASE_URI=os.environ.get(
            "SHOP_DATABASE_URL", "sqlite:///flask_shop.sqlite3"
        ),
    )
    app.config.update(config or {})
    db.init_app(app)
    taskq.init_app(app)

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        data = request.get_json(force=True)
        order = place_order(str(data["email"]), int(data["total_cents"]))
        db.session.commit()
        return {"id": order.id}, 201

    @app.get("/orders/<int:order_id>")
    def show_order(order_id: int) -> dict[str, Any]:
        order = db.session.get(Order, order_id) or abort(404)
        return {"id": order.id, "email": order.email, "confirmation": order.confirmation}

    @app.cli.command("init-db")
    def init_db() -> None:
        """Create the shop's and taskq's tables."""
        db.create_all()
        taskq.taskq_app.create_tables()
        print(f"tables ready in {db.engine.url.render_as_string()}")

    return app


app = create_app()
