"""Filling a store with many SUCCESS records fast, for the memory and scaling sections.

Every record is claimed through the store's own ``create_many`` (batches of 1,000) and then
completed with exactly the fields ``mark_success`` writes:

* SQL stores: one set-based ``UPDATE`` per batch with the values ``mark_success`` sets
  (status, response, updated_at, lease_expires_at = NULL, expires_at) — a million single-row
  ``mark_success`` round trips would take longer than the rest of the run;
* Redis: the store's own ``mark_success.lua`` script, pipelined 1,000 calls per round trip;
* memory: ``mark_success`` itself.
"""

from __future__ import annotations

import uuid
from typing import Any

from idempotent_tasks._records import Scope
from idempotent_tasks.stores.base import ClaimRequest

from ._services import NOISE, is_connection_error, wait_for_services

HASH = "b" * 64
RESPONSE = b'{"charged":true,"amount":100}'
TENANT, OPERATION = "acme", "payments.charge"
CHUNK = 1000


def scopes(n: int, tag: str | None = None) -> list[Scope]:
    """``n`` scopes with UUID-v4-like keys (36 characters), as clients send them."""
    tag = tag or uuid.uuid4().hex[:8]
    return [Scope(TENANT, OPERATION, f"{tag}-{i:08d}-4000-8000-{i:012d}"[:36]) for i in range(n)]


def fill(store: Any, kind: str, n: int, *, now: float, expires_at: float) -> None:
    """``n`` SUCCESS records expiring at ``expires_at`` (claimed at ``now``).  A chunk that
    fails on a lost connection (another session restarting PostgreSQL) is run again once the
    server is back: claiming is idempotent (a re-claim answers DUPLICATE) and the completion
    only touches records still PROCESSING with our token."""
    all_scopes = scopes(n)
    for start in range(0, n, CHUNK):
        chunk = all_scopes[start : start + CHUNK]
        for attempt in range(3):
            try:
                _fill_chunk(store, kind, chunk, now, expires_at)
                break
            except Exception as exc:
                if attempt == 2 or not is_connection_error(exc):
                    raise
                NOISE.append(f"fill/{kind}: chunk at {start} retried after {type(exc).__name__}")
                wait_for_services()


def _fill_chunk(store: Any, kind: str, chunk: list[Scope], now: float, expires_at: float) -> None:
    claims = [ClaimRequest(s, HASH, token=7) for s in chunk]
    store.create_many(claims, now=now, lease_expires_at=now + 300)
    _complete(store, kind, chunk, now, expires_at)


def _complete(store: Any, kind: str, chunk: list[Scope], now: float, expires_at: float) -> None:
    if kind in ("postgresql", "sqlite"):
        _complete_sql(store, kind, chunk, now, expires_at)
    elif kind == "redis":
        _complete_redis(store, chunk, now, expires_at)
    else:
        for s in chunk:
            store.mark_success(s, token=7, response=RESPONSE, now=now, expires_at=expires_at)


def _complete_sql(store: Any, kind: str, chunk: list[Scope], now: float, expires_at: float) -> None:
    table = f"{store.table_prefix}_records"
    keys = [s.key for s in chunk]
    with store.engine.begin() as conn:
        if kind == "postgresql":
            conn.exec_driver_sql(
                f"UPDATE {table} SET status = 'SUCCESS', response = %(r)s, updated_at = %(now)s, "
                "lease_expires_at = NULL, expires_at = %(ea)s WHERE tenant = %(t)s "
                "AND operation = %(o)s AND key = ANY(%(keys)s) AND status = 'PROCESSING' "
                "AND fencing_token = 7",
                {"r": RESPONSE, "now": now, "ea": expires_at, "t": TENANT, "o": OPERATION,
                 "keys": keys},
            )
        else:
            conn.exec_driver_sql(
                f"UPDATE {table} SET status = 'SUCCESS', response = ?, updated_at = ?, "
                "lease_expires_at = NULL, expires_at = ? WHERE tenant = ? AND operation = ? "
                "AND key = ? AND status = 'PROCESSING' AND fencing_token = 7",
                [(RESPONSE, now, expires_at, TENANT, OPERATION, k) for k in keys],
            )


def _complete_redis(store: Any, chunk: list[Scope], now: float, expires_at: float) -> None:
    script = store._scripts["mark_success"]
    pipe = store._conn().pipeline(transaction=False)
    for s in chunk:
        k = store._keys(s)
        pipe.execute_command(
            "EVALSHA", script.sha, 4, k.record, k.counter, k.processing, k.finished,
            7, RESPONSE, now, expires_at, store._gc_ms,
        )
    pipe.execute()
