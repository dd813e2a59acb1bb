"""Tasks of the orders app (imported by taskq when Django is ready)."""

from __future__ import annotations

import logging

from django.conf import settings
from shopsite.taskq_app import app

from orders.models import Order

logger = logging.getLogger(__name__)


@app.task
def send_confirmation(order_id: int) -> None:
    """Send (here: log) the confirmation of an order and note it on the order."""
    order = Order.objects.get(pk=order_id)
    text = f"{settings.SHOP_NAME}: order #{order.id} confirmed, {order.total_cents / 100:.2f} EUR"
    logger.info("confirmation to %s: %s", order.email, text)
    Order.objects.filter(pk=order_id).update(confirmation=text)
