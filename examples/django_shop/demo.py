"""Place one order three times with the same ``Idempotency-Key`` — no server, no broker
(SQLite and Celery's eager mode): one order row, one shipment row, the same answer thrice.

    python demo.py        (from examples/django_shop)
"""

import json
import os
import uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
os.environ.setdefault("SHOP_EAGER", "1")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from orders.models import Order, Shipment  # noqa: E402

from idempotent_tasks.django import get_handler  # noqa: E402


def main() -> None:
    call_command("migrate", verbosity=0)
    client, key, order_id = Client(), str(uuid.uuid4()), f"o-{uuid.uuid4().hex[:8]}"
    answers = [
        client.post(f"/orders/{order_id}", data=json.dumps({"amount": 42}),
                    content_type="application/json",
                    headers={"Idempotency-Key": key, "X-Customer": "acme"})
        for _ in range(3)
    ]
    record = get_handler().get_record(operation="POST /orders/{id}", tenant="acme", key=key)
    print(f"statuses={[a.status_code for a in answers]} "
          f"replayed={[a.get('Idempotent-Replayed') == 'true' for a in answers]} "
          f"same_body={len({a.content for a in answers}) == 1} "
          f"orders={Order.objects.filter(order_id=order_id).count()} "
          f"shipments={Shipment.objects.filter(order__order_id=order_id).count()} "
          f"record={record.status.value if record else None}")


if __name__ == "__main__":
    main()
