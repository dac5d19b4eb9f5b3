from django.db import models


class Order(models.Model):
    order_id = models.CharField(max_length=64, unique=True)
    customer = models.CharField(max_length=64)
    amount = models.IntegerField()


class Shipment(models.Model):
    """Written by the ``ship_order`` task, exactly once per order."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="shipments")
    fencing_token = models.BigIntegerField()  # the attempt that shipped it
