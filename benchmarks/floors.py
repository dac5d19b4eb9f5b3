"""The raw floors: hand-written minimal statements, no library, same machine, same run.

* PostgreSQL: psycopg 3 autocommit ``INSERT … ON CONFLICT DO NOTHING RETURNING`` + a
  conditional ``UPDATE`` (claim + complete), and the one-statement claim-or-get
  ``WITH ins AS (INSERT …) SELECT …`` on an existing key (replay).
* Redis: one EVALSHA claim-or-get (``SET NX`` or ``GET``) + one ``SET XX`` (claim + complete),
  and the EVALSHA claim-or-get alone on an existing key (replay).
* SQLite: the same pair as PostgreSQL on a WAL file with ``synchronous=NORMAL``.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._timing import per_op_us

_PG_DDL = """
CREATE TABLE IF NOT EXISTS {t} (
  tenant TEXT NOT NULL, operation TEXT NOT NULL, key TEXT NOT NULL,
  status TEXT NOT NULL, request_hash TEXT NOT NULL, response BYTEA,
  fencing_token BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
  updated_at DOUBLE PRECISION NOT NULL, lease_expires_at DOUBLE PRECISION,
  expires_at DOUBLE PRECISION, PRIMARY KEY (tenant, operation, key))
"""
_HASH = "a" * 64


def pg_floor(dsn: str, n: int) -> dict[str, float]:
    import psycopg

    table = f"floor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_PG_DDL.format(t=table))
        try:
            insert = (
                f"INSERT INTO {table} (tenant, operation, key, status, request_hash, "
                "fencing_token, created_at, updated_at, lease_expires_at) "
                "VALUES (%s, %s, %s, 'PROCESSING', %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING RETURNING fencing_token"
            )
            update = (
                f"UPDATE {table} SET status = 'SUCCESS', response = %s, updated_at = %s, "
                "expires_at = %s, lease_expires_at = NULL WHERE tenant = %s AND operation = %s "
                "AND key = %s AND status = 'PROCESSING' AND fencing_token = %s"
            )
            claim_or_get = (
                f"WITH ins AS (INSERT INTO {table} (tenant, operation, key, status, "
                "request_hash, fencing_token, created_at, updated_at, lease_expires_at) "
                "VALUES (%s, %s, %s, 'PROCESSING', %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING "
                "RETURNING status, request_hash, response, fencing_token) "
                "SELECT * FROM ins UNION ALL SELECT status, request_hash, response, "
                f"fencing_token FROM {table} WHERE tenant = %s AND operation = %s AND key = %s "
                "AND NOT EXISTS (SELECT 1 FROM ins)"
            )

            def first(i: int) -> None:
                key = f"f{i}"
                cur = conn.execute(insert, ("t", "op", key, _HASH, 7, 1.0, 1.0, 2.0))
                cur.fetchone()
                conn.execute(update, (b'{"ok":true}', 1.0, 9.0, "t", "op", key, 7))

            def replay(_: int) -> None:
                conn.execute(
                    claim_or_get, ("t", "op", "f0", _HASH, 8, 1.0, 1.0, 2.0, "t", "op", "f0")
                ).fetchone()

            return {
                "claim+complete": per_op_us(first, n),
                "claim-or-get": per_op_us(replay, n),
            }
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


_REDIS_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
"""


def redis_floor(url: str, n: int) -> dict[str, float]:
    import redis

    client: Any = redis.Redis.from_url(url)
    script = client.register_script(_REDIS_CLAIM)
    prefix = f"floor:{uuid.uuid4().hex[:8]}"
    try:
        def first(i: int) -> None:
            key = f"{prefix}:{i}"
            script(keys=[key], args=[b"PROCESSING|" + _HASH.encode(), 600_000])
            client.set(key, b'SUCCESS|{"ok":true}', xx=True, px=600_000)

        def replay(_: int) -> None:
            script(keys=[f"{prefix}:0"], args=[b"PROCESSING", 600_000])

        return {"claim+complete": per_op_us(first, n), "claim-or-get": per_op_us(replay, n)}
    finally:
        for k in client.scan_iter(f"{prefix}:*"):
            client.delete(k)
        client.close()


def sqlite_floor(path: Path, n: int) -> dict[str, float]:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(_PG_DDL.format(t="floor").replace("BYTEA", "BLOB"))
    insert = (
        "INSERT INTO floor (tenant, operation, key, status, request_hash, fencing_token, "
        "created_at, updated_at, lease_expires_at) VALUES (?, ?, ?, 'PROCESSING', ?, ?, ?, ?, ?) "
        "ON CONFLICT DO NOTHING RETURNING fencing_token"
    )
    update = (
        "UPDATE floor SET status = 'SUCCESS', response = ?, updated_at = ?, expires_at = ?, "
        "lease_expires_at = NULL WHERE tenant = ? AND operation = ? AND key = ? "
        "AND status = 'PROCESSING' AND fencing_token = ?"
    )

    def first(i: int) -> None:
        key = f"f{i}"
        conn.execute(insert, ("t", "op", key, _HASH, 7, 1.0, 1.0, 2.0)).fetchone()
        conn.execute(update, (b'{"ok":true}', 1.0, 9.0, "t", "op", key, 7))

    try:
        return {"claim+complete": per_op_us(first, n)}
    finally:
        conn.close()


FLOORS: dict[str, Callable[..., dict[str, float]]] = {
    "postgresql": pg_floor,
    "redis": redis_floor,
    "sqlite": sqlite_floor,
}
