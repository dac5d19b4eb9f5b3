from __future__ import annotations

from django.db import models


class Charge(models.Model):
    """One row per charge a body performed: the tests count these."""

    order_id = models.CharField(max_length=64)
    amount = models.IntegerField(default=0)
    attempt = models.IntegerField(default=0)

    class Meta:
        app_label = "orders"
