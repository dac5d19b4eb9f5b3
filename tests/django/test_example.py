"""``examples/django_shop`` runs: its demo places one order three times with one key (its
own SQLite file, Celery eager) and gets one order row, one shipment row, one answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .._wait import budget

SHOP = Path(__file__).resolve().parents[2] / "examples" / "django_shop"


def test_the_shop_demo_ships_each_order_once(tmp_path: Path) -> None:
    env = {**os.environ, "SHOP_SQLITE": str(tmp_path / "shop.sqlite3"), "SHOP_EAGER": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run([sys.executable, "demo.py"], cwd=SHOP, env=env, capture_output=True,
                         text=True, timeout=budget(120), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("statuses=[201, 201, 201] replayed=[False, True, True] same_body=True orders=1 "
            "shipments=1 record=SUCCESS") in out.stdout
    check = subprocess.run([sys.executable, "manage.py", "check", "--fail-level", "WARNING"],
                           cwd=SHOP, env=env, capture_output=True, text=True, timeout=budget(120),
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
