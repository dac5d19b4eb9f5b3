"""The raw floors: hand-written minimal statements, no library, same machine, same run.

* PostgreSQL: psycopg 3 autocommit ``INSERT … ON CONFLICT DO NOTHING RETURNING`` + a
  conditional ``UPDATE`` (claim + complete), and the one-statement claim-or-get
  ``WITH ins AS (INSERT … ON CONFLICT DO NOTHING RETURNING …) SELECT …`` on an existing key
  (replay).  They run on a table created by the library's own ``SQLStore.create_schema`` (same
  columns, collation and indexes), so the only difference left is the library.
* Redis: one EVALSHA claim-or-get (``SET NX`` or ``GET``) + one ``SET XX`` (claim + complete),
  and the EVALSHA claim-or-get alone on an existing key (replay).
* SQLite: the same pair as PostgreSQL on a WAL file with ``synchronous=NORMAL``.
* Minimal floors (``floor_ops(..., minimal=True)``, PostgreSQL and Redis): a bare table of
  the unique key and the returned columns, prepared; the Lua claim on a single-connection client.

Each ``*_floor_ops`` context manager yields per-op callables ``fn(i)`` (``i`` a fresh index)
that the runner interleaves with the library's own operations.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._timing import Op

_HASH = "a" * 64
_RESPONSE = b'{"ok":true}'

_INSERT = (
    "INSERT INTO {t} (tenant, operation, key, status, request_hash, "
    "fencing_token, created_at, updated_at, lease_expires_at) "
    "VALUES ({p}, {p}, {p}, 'PROCESSING', {p}, {p}, {p}, {p}, {p}) "
    "ON CONFLICT DO NOTHING RETURNING fencing_token"
)
_UPDATE = (
    "UPDATE {t} SET status = 'SUCCESS', response = {p}, updated_at = {p}, "
    "expires_at = {p}, lease_expires_at = NULL WHERE tenant = {p} AND operation = {p} "
    "AND key = {p} AND status = 'PROCESSING' AND fencing_token = {p}"
)
_CLAIM_OR_GET = (
    "WITH ins AS (INSERT INTO {t} (tenant, operation, key, status, "
    "request_hash, fencing_token, created_at, updated_at, lease_expires_at) "
    "VALUES (%s, %s, %s, 'PROCESSING', %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING "
    "RETURNING status, request_hash, response, fencing_token) "
    "SELECT * FROM ins UNION ALL SELECT status, request_hash, response, "
    "fencing_token FROM {t} WHERE tenant = %s AND operation = %s AND key = %s "
    "AND NOT EXISTS (SELECT 1 FROM ins)"
)


class _ThreadConnections:
    """One autocommit psycopg connection per calling thread (a worker with several threads
    must not serialise the floor on one connection; the store has one per thread too)."""

    def __init__(self, url: str) -> None:
        self._dsn = url.replace("postgresql+psycopg://", "postgresql://")
        self._local = threading.local()
        self._all: list[Any] = []

    def __call__(self) -> Any:
        import psycopg

        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = psycopg.connect(self._dsn, autocommit=True)
            self._all.append(conn)
        return conn

    def close(self) -> None:
        for conn in self._all:
            with contextlib.suppress(Exception):
                conn.close()


def pg_floor_fns(url: str, table: str) -> tuple[dict[str, Op], _ThreadConnections]:
    """The PostgreSQL floor ops on an existing store-created ``table``, on connections of
    their own (returned, for the caller to close)."""
    conns = _ThreadConnections(url)
    insert = _INSERT.format(t=table, p="%s")
    update = _UPDATE.format(t=table, p="%s")
    claim_or_get = _CLAIM_OR_GET.format(t=table)
    tag = f"floor-{uuid.uuid4().hex[:6]}"

    def first(i: int) -> None:
        key = f"{tag}-{i}"
        conn = conns()
        conn.execute(insert, ("t", "op", key, _HASH, 7, 1.0, 1.0, 2.0)).fetchone()
        conn.execute(update, (_RESPONSE, 1.0, 9.0, "t", "op", key, 7))

    def replay(_: int) -> None:
        conns().execute(
            claim_or_get, ("t", "op", "done", _HASH, 8, 1.0, 1.0, 2.0, "t", "op", "done")
        ).fetchone()

    return {"claim+complete": first, "claim-or-get": replay}, conns


@contextlib.contextmanager
def pg_floor_ops(url: str) -> Iterator[dict[str, Op]]:
    """``claim+complete`` and ``claim-or-get`` on a store-created table of its own."""
    from idempotent_tasks import SQLStore

    from ._services import drop_store

    store = SQLStore(url, table_prefix=f"floor_{uuid.uuid4().hex[:8]}")
    store.create_schema()
    ops, conns = pg_floor_fns(url, f"{store.table_prefix}_records")
    ops["claim+complete"](-1)
    table = f"{store.table_prefix}_records"
    conn = conns()
    conn.execute(_INSERT.format(t=table, p="%s"), ("t", "op", "done", _HASH, 7, 1.0, 1.0, 2.0))
    conn.execute(_UPDATE.format(t=table, p="%s"), (_RESPONSE, 1.0, 9.0, "t", "op", "done", 7))
    try:
        yield ops
    finally:
        conns.close()
        drop_store(store, "postgresql", store.table_prefix)


_REDIS_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
"""


def redis_floor_fns(url: str, prefix: str) -> tuple[dict[str, Op], Any]:
    """The Redis floor ops on keys under ``prefix``, with a client of their own (returned,
    for the caller to close)."""
    import redis

    client: Any = redis.Redis.from_url(url)
    script = client.register_script(_REDIS_CLAIM)
    processing = b"PROCESSING|" + _HASH.encode()

    def first(i: int) -> None:
        key = f"{prefix}:{i}"
        script(keys=[key], args=[processing, 600_000])
        client.set(key, b'SUCCESS|{"ok":true}', xx=True, px=600_000)

    def replay(_: int) -> None:
        script(keys=[f"{prefix}:done"], args=[processing, 600_000])

    return {"claim+complete": first, "claim-or-get": replay}, client


@contextlib.contextmanager
def redis_floor_ops(url: str) -> Iterator[dict[str, Op]]:
    """One EVALSHA claim-or-get + one ``SET XX``; the claim-or-get alone for replays."""
    prefix = f"floor:{uuid.uuid4().hex[:8]}"
    ops, client = redis_floor_fns(url, prefix)
    ops["claim+complete"](-1)
    client.set(f"{prefix}:done", b'SUCCESS|{"ok":true}', px=600_000)
    try:
        yield ops
    finally:
        for k in client.scan_iter(f"{prefix}:*", count=1000):
            client.delete(k)
        client.close()


def attached_floor(kind: str, prefix: str, url: str) -> Op:
    """``claim+complete`` next to the records of an existing library store (its table, or
    its key prefix), for a task that runs the floor inside a worker (``e2e.py``); the
    store's own clean-up removes what it writes."""
    if kind == "postgresql":
        return pg_floor_fns(url, f"{prefix}_records")[0]["claim+complete"]
    return redis_floor_fns(url, f"{prefix}:{{floor}}")[0]["claim+complete"]  # drop_schema's pattern


@contextlib.contextmanager
def sqlite_floor_ops(path: Path) -> Iterator[dict[str, Op]]:
    """The PostgreSQL pair on a WAL SQLite file (``synchronous=NORMAL``)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE floor (tenant TEXT NOT NULL, operation TEXT NOT NULL, key TEXT NOT NULL, "
        "status TEXT NOT NULL, request_hash TEXT NOT NULL, response BLOB, "
        "fencing_token BIGINT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL, "
        "lease_expires_at REAL, expires_at REAL, PRIMARY KEY (tenant, operation, key))"
    )
    insert = _INSERT.format(t="floor", p="?")
    update = _UPDATE.format(t="floor", p="?")
    claim_or_get = (
        "INSERT INTO floor (tenant, operation, key, status, request_hash, fencing_token, "
        "created_at, updated_at, lease_expires_at) VALUES (?, ?, ?, 'PROCESSING', ?, ?, ?, ?, ?) "
        "ON CONFLICT DO NOTHING RETURNING status"
    )
    get = "SELECT status, request_hash, response, fencing_token FROM floor WHERE {}".format(
        "tenant = ? AND operation = ? AND key = ?")

    def first(i: int) -> None:
        key = f"f{i}"
        conn.execute(insert, ("t", "op", key, _HASH, 7, 1.0, 1.0, 2.0)).fetchone()
        conn.execute(update, (_RESPONSE, 1.0, 9.0, "t", "op", key, 7))

    def replay(_: int) -> None:
        if conn.execute(claim_or_get, ("t", "op", "done", _HASH, 8, 1.0, 1.0, 2.0)).fetchone():
            return
        conn.execute(get, ("t", "op", "done")).fetchone()

    first(-1)
    conn.execute(insert, ("t", "op", "done", _HASH, 7, 1.0, 1.0, 2.0)).fetchall()
    conn.execute(update, (_RESPONSE, 1.0, 9.0, "t", "op", "done", 7))
    try:
        yield {"claim+complete": first, "claim-or-get": replay}
    finally:
        conn.close()


@contextlib.contextmanager
def floor_ops(
    kind: str, workdir: Path, pg_url: str, redis_url: str, *, minimal: bool = False
) -> Iterator[dict[str, Op]]:
    """The floor ops of store ``kind`` (none for the memory store); with ``minimal``, its
    minimal floor's (PostgreSQL and Redis only, none for the others)."""
    if kind == "postgresql":
        with (pg_minimal_ops if minimal else pg_floor_ops)(pg_url) as ops:
            yield ops
    elif kind == "redis":
        with (redis_minimal_ops if minimal else redis_floor_ops)(redis_url) as ops:
            yield ops
    elif kind == "sqlite" and not minimal:
        with sqlite_floor_ops(workdir / f"floor-{uuid.uuid4().hex[:8]}.db") as ops:
            yield ops
    else:
        yield {}


# -- the minimal floors: nothing but the unique key and what a claim returns ------------------
#: A bare table: the unique key and the four columns a claim-or-get returns; no timestamps,
#: no secondary index, no check constraint, no sequence, the database's default collation.
_MIN_TABLE = (
    "CREATE TABLE {t} (tenant text NOT NULL, operation text NOT NULL, key text NOT NULL, "
    "status text NOT NULL, request_hash text NOT NULL, response bytea, "
    "fencing_token bigint NOT NULL, PRIMARY KEY (tenant, operation, key))"
)
_MIN_CLAIM = (
    "WITH ins AS (INSERT INTO {t} (tenant, operation, key, status, request_hash, "
    "fencing_token) VALUES (%s, %s, %s, 'PROCESSING', %s, %s) ON CONFLICT DO NOTHING "
    "RETURNING status, request_hash, response, fencing_token) "
    "SELECT * FROM ins UNION ALL SELECT status, request_hash, response, fencing_token "
    "FROM {t} WHERE tenant = %s AND operation = %s AND key = %s AND NOT EXISTS "
    "(SELECT 1 FROM ins)"
)
_MIN_DONE = ("UPDATE {t} SET status = 'SUCCESS', response = %s WHERE tenant = %s "
             "AND operation = %s AND key = %s AND fencing_token = %s")


@contextlib.contextmanager
def pg_minimal_ops(url: str) -> Iterator[dict[str, Op]]:
    """The minimal PostgreSQL floor on a bare table of its own (dropped after): claim-or-get
    in one statement and completion in one ``UPDATE``, each prepared (psycopg
    ``prepare=True``), on one autocommit connection; a constant fencing token."""
    import psycopg

    table = f"minfloor_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                           autocommit=True)
    claim, done = _MIN_CLAIM.format(t=table), _MIN_DONE.format(t=table)
    tag = f"min-{uuid.uuid4().hex[:6]}"

    def first(i: int) -> None:
        key = f"{tag}-{i}"
        conn.execute(claim, ("t", "op", key, _HASH, 7, "t", "op", key), prepare=True).fetchone()
        conn.execute(done, (_RESPONSE, "t", "op", key, 7), prepare=True)

    def replay(_: int) -> None:
        conn.execute(claim, ("t", "op", "done", _HASH, 8, "t", "op", "done"),
                     prepare=True).fetchone()

    try:
        conn.execute(_MIN_TABLE.format(t=table))
        first(-1)
        conn.execute(claim, ("t", "op", "done", _HASH, 7, "t", "op", "done"))
        conn.execute(done, (_RESPONSE, "t", "op", "done", 7))
        yield {"claim+complete": first, "claim-or-get": replay}
    finally:
        with contextlib.suppress(Exception):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()


@contextlib.contextmanager
def redis_minimal_ops(url: str) -> Iterator[dict[str, Op]]:
    """The minimal Redis floor: the same Lua claim-or-get as the floor, sent with
    ``evalsha`` on a ``single_connection_client`` (no pool checkout, no script wrapper),
    then ``SET XX``; the claim alone on an existing key for replays."""
    import redis

    client: Any = redis.Redis.from_url(url, single_connection_client=True)
    sha = client.script_load(_REDIS_CLAIM)
    prefix = f"minfloor:{uuid.uuid4().hex[:8]}"
    processing = b"PROCESSING|" + _HASH.encode()

    def first(i: int) -> None:
        key = f"{prefix}:{i}"
        client.evalsha(sha, 1, key, processing, 600_000)
        client.set(key, b'SUCCESS|{"ok":true}', xx=True, px=600_000)

    def replay(_: int) -> None:
        client.evalsha(sha, 1, f"{prefix}:done", processing, 600_000)

    client.set(f"{prefix}:done", b'SUCCESS|{"ok":true}', px=600_000)
    try:
        yield {"claim+complete": first, "claim-or-get": replay}
    finally:
        for k in client.scan_iter(f"{prefix}:*", count=1000):
            client.delete(k)
        client.close()


# -- the stores past one machine (scaleout.py) ------------------------------------------------
_MY_INSERT = (
    "INSERT IGNORE INTO {t} (tenant, operation, `key`, status, request_hash, created_at, "
    "updated_at, lease_expires_at) VALUES (%s, %s, %s, 'PROCESSING', %s, %s, %s, %s)"
)
_MY_UPDATE = (
    "UPDATE {t} SET status = 'SUCCESS', response = %s, updated_at = %s, expires_at = %s, "
    "lease_expires_at = NULL WHERE tenant = %s AND operation = %s AND `key` = %s "
    "AND status = 'PROCESSING' AND fencing_token = %s"
)
_MY_GET = (
    "SELECT status, request_hash, response, fencing_token FROM {t} "
    "WHERE tenant = %s AND operation = %s AND `key` = %s"
)


def mysql_floor_fns(url: str, table: str) -> tuple[dict[str, Op], Any]:
    """MariaDB/MySQL, PyMySQL autocommit on a store-created ``table``: ``INSERT`` (the token
    from ``lastrowid``) + conditional ``UPDATE`` (first delivery); ``INSERT IGNORE`` that
    finds the row + ``SELECT`` (replay: MySQL has no one-statement claim-or-get)."""
    import pymysql
    import sqlalchemy as sa

    u = sa.make_url(url)
    conn = pymysql.connect(host=u.host, port=u.port or 3306, user=u.username,
                           password=u.password or "", database=u.database, autocommit=True,
                           client_flag=pymysql.constants.CLIENT.FOUND_ROWS)
    cur = conn.cursor()
    insert, update, get = (s.format(t=table) for s in (_MY_INSERT, _MY_UPDATE, _MY_GET))
    tag = f"floor-{uuid.uuid4().hex[:6]}"

    def first(i: int) -> None:
        key = f"{tag}-{i}"
        cur.execute(insert, ("t", "op", key, _HASH, 1.0, 1.0, 2.0))
        cur.execute(update, (_RESPONSE, 1.0, 9.0, "t", "op", key, cur.lastrowid))

    def replay(_: int) -> None:
        if cur.execute(insert, ("t", "op", "done", _HASH, 1.0, 1.0, 2.0)) == 0:
            cur.execute(get, ("t", "op", "done"))
            cur.fetchone()

    first(-1)
    cur.execute(insert, ("t", "op", "done", _HASH, 1.0, 1.0, 2.0))
    cur.execute(update, (_RESPONSE, 1.0, 9.0, "t", "op", "done", cur.lastrowid))
    return {"claim+complete": first, "claim-or-get": replay}, conn


_DDB_CLAIMABLE = "attribute_not_exists(st) AND (attribute_not_exists(tk) OR tk < :t)"


def dynamodb_floor_fns(client: Any, table: str) -> dict[str, Op]:
    """DynamoDB through the same boto3 client, on the store's table: a conditional
    ``PutItem`` + a conditional ``UpdateItem`` (first delivery); the conditional ``PutItem``
    refused with ``ALL_OLD`` (replay: one request).  The items have the store's attributes,
    index ones included, so the service does the same work; only the library is missing."""
    tag = f"floor-{uuid.uuid4().hex[:6]}"

    def item(key: str) -> dict[str, Any]:
        return {"pk": {"S": key}, "t": {"S": "t"}, "o": {"S": "op"}, "k": {"S": key},
                "st": {"S": "PROCESSING"}, "rh": {"S": _HASH}, "tk": {"N": "7"},
                "ca": {"N": "1.0"}, "ua": {"N": "1.0"}, "le": {"N": "2.0"},
                "gp": {"S": "floor#P#0"}, "gs": {"N": "1.0"}, "gc": {"N": "4000000000"}}

    def put(key: str) -> None:
        client.put_item(TableName=table, Item=item(key), ConditionExpression=_DDB_CLAIMABLE,
                        ExpressionAttributeValues={":t": {"N": "7"}},
                        ReturnValuesOnConditionCheckFailure="ALL_OLD")

    def first(i: int) -> None:
        key = f"{tag}-{i}"
        put(key)
        client.update_item(
            TableName=table, Key={"pk": {"S": key}},
            ConditionExpression="st = :p AND tk = :t",
            UpdateExpression="SET st = :s, rs = :r, ua = :u, ex = :e, gp = :g, gs = :e, "
                             "gc = :c REMOVE le",
            ExpressionAttributeValues={":p": {"S": "PROCESSING"}, ":t": {"N": "7"},
                                       ":s": {"S": "SUCCESS"}, ":r": {"B": _RESPONSE},
                                       ":u": {"N": "1.0"}, ":e": {"N": "9.0"},
                                       ":g": {"S": "floor#S#0"}, ":c": {"N": "4000000000"}},
        )

    def replay(_: int) -> None:
        try:
            put(f"{tag}-done")
        except client.exceptions.ConditionalCheckFailedException:
            return
        raise AssertionError("the floor's replay must find its record")

    first(-1)
    put(f"{tag}-done")
    return {"claim+complete": first, "claim-or-get": replay}
