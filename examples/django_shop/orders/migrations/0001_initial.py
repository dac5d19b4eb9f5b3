from typing import Any, ClassVar

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("order_id", models.CharField(max_length=64, unique=True)),
                ("customer", models.CharField(max_length=64)),
                ("amount", models.IntegerField()),
            ],
        ),
        migrations.CreateModel(
            name="Shipment",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("fencing_token", models.BigIntegerField()),
                ("order", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                            related_name="shipments", to="orders.order")),
            ],
        ),
    ]
