"""What the outbox chaos processes share: their configuration (JSON in an environment
variable), the handler they build and the ledger write every hop makes.

Ledger rows (the chaos suite's ledger table: profile, key, token, pid) are written through
the body's transaction only, so every row is an effect that committed with its SUCCESS:
``hop1`` by the charge, ``hop2-celery`` / ``hop2-dramatiq`` / ``hop2-kafka`` by the receivers
of the charge's three follow-ups (the key is the charge's key in every row).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, SQLStore

ENV = "OUTBOX_CHAOS_CONFIG"
TENANT = "chaos"
CHARGE = "outbox.charge"
CAPTURE = "outbox.capture"
SHIP = "outbox.ship"
AUDIT = "outbox.audit"
HOPS = ("hop1", "hop2-celery", "hop2-dramatiq", "hop2-kafka")


@dataclass(frozen=True)
class ChaosConfig:
    store_url: str
    prefix: str
    ledger: str
    broker_url: str
    charge_queue: str
    capture_queue: str
    ship_queue: str
    kafka: dict[str, Any] = field(default_factory=dict)
    topic: str = ""
    group: str = ""
    lease: float = 3.0
    heartbeat: float = 1.0
    max_retries: int = 50

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> ChaosConfig:
        return cls(**json.loads(os.environ[ENV]))


def make_handler(cfg: ChaosConfig) -> IdempotencyHandler:
    return IdempotencyHandler(SQLStore(cfg.store_url, table_prefix=cfg.prefix),
                              lease_timeout=cfg.lease, heartbeat_interval=cfg.heartbeat,
                              max_retries=cfg.max_retries, metrics=None)


def write(cfg: ChaosConfig, conn: sa.Connection, hop: str, key: str) -> str:
    """One ledger row in the body's transaction; returns the execution's token."""
    token = uuid.uuid4().hex
    conn.execute(sa.text(f"INSERT INTO {cfg.ledger} (profile, key, token, pid) "
                         "VALUES (:hop, :key, :token, :pid)"),
                 {"hop": hop, "key": key, "token": token, "pid": os.getpid()})
    return token
