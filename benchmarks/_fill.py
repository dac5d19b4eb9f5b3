"""Filling a store with many SUCCESS records fast, for the memory and scaling sections.

Every record is claimed through the store's own ``create_many`` (batches of 1,000; the
store draws each claim's fencing token) and then completed with the store's own
``mark_success_many`` under the tokens it returned (one round trip per batch: a million
single-row ``mark_success`` round trips would take longer than the rest of the run).
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from idempotent_tasks._core.records import CreateResult, Scope, Status
from idempotent_tasks.stores.base import ClaimRequest, SuccessWrite

from ._services import retry_on_connection_loss

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
    server is back: claiming is idempotent (a re-claim answers DUPLICATE with the record, whose
    token the completion then uses) and the completion only touches records still
    PROCESSING with that token."""
    all_scopes = scopes(n)
    for start in range(0, n, CHUNK):
        chunk = all_scopes[start : start + CHUNK]
        retry_on_connection_loss(
            f"fill/{kind}: chunk at {start}",
            partial(_fill_chunk, store, kind, chunk, now, expires_at),
            attempts=3,
        )


def _fill_chunk(store: Any, kind: str, chunk: list[Scope], now: float, expires_at: float) -> None:
    _complete(store, kind, claim(store, chunk, now), now, expires_at)


def claim(store: Any, chunk: list[Scope], now: float) -> list[tuple[Scope, int]]:
    """Claim ``chunk`` in one ``create_many``: each scope with the token to complete it
    under (the store's new token, or, for a scope a lost chunk already claimed, the token of
    its PROCESSING record; scopes already SUCCESS are left out)."""
    results = store.create_many([ClaimRequest(s, HASH) for s in chunk], now=now,
                                lease_expires_at=now + 300)
    return [(s, r.record.fencing_token) for s, r in zip(chunk, results, strict=True)
            if _ours(r)]


def _ours(result: CreateResult) -> bool:
    return result.created or (result.record.status is Status.PROCESSING
                              and result.record.request_hash == HASH)


def _complete(store: Any, kind: str, claimed: list[tuple[Scope, int]], now: float,
              expires_at: float) -> None:
    """The successes through the store's own ``mark_success_many`` (PostgreSQL: one
    set-based ``UPDATE``; SQLite: one transaction; Redis: ``mark_success.lua`` pipelined),
    each under the token its claim returned."""
    writes = [SuccessWrite(s, token, RESPONSE, expires_at) for s, token in claimed]
    if not all(store.mark_success_many(writes, now=now)):
        raise RuntimeError(f"fill/{kind}: a success was refused")
