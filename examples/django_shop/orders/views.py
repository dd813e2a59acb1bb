from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

from orders.models import Order
from orders.tasks import send_confirmation


def place_order(email: str, total_cents: int) -> Order:
    """Save an order and enqueue its confirmation; call inside ``transaction.atomic()``."""
    order = Order.objects.create(email=email, total_cents=total_cents)
    result = send_confirmation.enqueue(order.id)  # an outbox row in this transaction
    order.confirmation_task_id = result.id
    return order


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    data = json.loads(request.body)
    with transaction.atomic():
        order = place_order(str(data["email"]), int(data["total_cents"]))
    return JsonResponse({"id": order.id, "task_id": order.confirmation_task_id}, status=201)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> JsonResponse:
    order = get_object_or_404(Order, pk=order_id)
    return JsonResponse(
        {"id": order.id, "email": order.email, "confirmation": order.confirmation}
    )


@require_GET
def show_task(request: HttpRequest, task_id: str) -> JsonResponse:
    result = send_confirmation.get_result(task_id)
    return JsonResponse({
        "id": result.id,
        "status": str(result.status),
        "attempts": result.attempts,
        "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
    })
