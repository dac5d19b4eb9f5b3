import json

from django.db import transaction
from django.http import JsonResponse

from idempotent_tasks.enqueue import enqueue_once

from .models import Order
from .tasks import ship_order


def customer_of(request):
    """The tenant of a request.  A real shop returns ``str(request.user.pk)`` (the middleware
    runs after AuthenticationMiddleware); the example trusts a header to stay short."""
    return request.headers.get("X-Customer")


def place_order(request, order_id):
    """``POST /orders/<id>`` with ``Idempotency-Key``: a retried request replays this answer
    and enqueues nothing more; the shipment task is published once the order is committed."""
    amount = int(json.loads(request.body or b"{}").get("amount", 0))
    with transaction.atomic():
        order = Order.objects.create(order_id=order_id, customer=customer_of(request),
                                     amount=amount)
        enqueue_once(ship_order, order_id)  # published on commit, with a derived key
    return JsonResponse({"order": order.order_id, "amount": amount}, status=201)
