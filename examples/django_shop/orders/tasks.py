"""``ship_order``: a ``transactional=True`` task — its ORM writes and its SUCCESS record
commit in one ``transaction.atomic()``, so the shipment row exists exactly once however often
the message is delivered, and a worker killed mid-body leaves nothing behind."""

from celery import shared_task

from idempotent_tasks import current_context
from idempotent_tasks.celery import IdempotentTask

from .models import Order, Shipment


@shared_task(base=IdempotentTask, name="orders.ship_order", transactional=True)
def ship_order(order_id: str) -> dict:
    order = Order.objects.get(order_id=order_id)
    shipment = Shipment.objects.create(order=order, fencing_token=current_context().fencing_token)
    return {"order": order_id, "shipment": shipment.pk}
