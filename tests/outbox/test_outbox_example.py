"""``examples/payment_saga`` runs end to end on RabbitMQ (a vhost of our own) and Kafka
(Tansu), on SQLite and PostgreSQL: every step exactly once despite duplicates everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._services import POSTGRES_URL, require

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_outbox_payment_saga_example(store: str, rabbit_url: str, kafka_bootstrap: str) -> None:
    extra = []
    if store == "postgres":
        require("postgres")
        extra = ["--store", POSTGRES_URL]
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/payment_saga/run.py"), "--broker", rabbit_url,
         "--kafka", kafka_bootstrap, "--orders", "10", *extra],
        capture_output=True, text=True, timeout=240, check=False, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "charged=10 shipped=10 marked=10 republished=20" in out.stdout
