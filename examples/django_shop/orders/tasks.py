"""Tasks of the orders app: ``django.tasks`` functions, run by taskq's worker.

``TASKS`` in the settings points ``django.tasks`` at ``TaskqBackend``; Django 4.2 to 5.2
take the same code from the ``django-tasks`` backport.
"""

from __future__ import annotations

import logging

from django.conf import settings

from orders.models import Order

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task

logger = logging.getLogger(__name__)


@task(max_retries=3, autoretry_for=(ConnectionError,))
def send_confirmation(order_id: int) -> str:
    """Send (here: log) the confirmation of an order, note it on the order and return it."""
    order = Order.objects.get(pk=order_id)
    text = f"{settings.SHOP_NAME}: order #{order.id} confirmed, {order.total_cents / 100:.2f} EUR"
    logger.info("confirmation to %s: %s", order.email, text)
    Order.objects.filter(pk=order_id).update(confirmation=text)
    return text
