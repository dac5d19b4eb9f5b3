"""What the stores cost beyond the *minimal* floor, one factor at a time (a probe, not a
section: ``python -m benchmarks.floor_gap [--n 2000]``).

Every row of a table is interleaved with the others in batches of 25 (``_timing.interleave``);
the ratio is the median of the paired batch ratios to the first row, the minimal floor
(``floors.floor_ops(..., minimal=True)``).  From the top of each table down, one thing
changes per row:

* PostgreSQL (every statement prepared, autocommit, constant fencing token unless it says
  ``nextval``): the bare table with the ``"C"`` collation; a table with all the store's
  columns but only the primary key; plus the partial index recovery needs; the store's own
  table (plus the ``expires_at`` index and the status check); the store's claim statement
  on it; with ``nextval``; ``SQLStore.create`` (+ ``mark_success``); ``execute()``.
* Redis (one held connection unless it says pooled): the minimal claim through redis-py's
  pooled ``Script`` (the older floor); the minimal claim sent on the store's transport; the
  store's own scripts sent by hand; ``RedisStore.create`` (+ ``mark_success``);
  ``execute()``.

It also prints ``EXPLAIN (ANALYZE)`` of the two replay statements (minimal and the store's).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

from idempotent_tasks._core.records import Scope

from ._services import POSTGRES_URL, REDIS_URL
from ._store_cpu_probe import store_ops
from ._timing import Op, interleave
from .core import make_handler, open_store
from .floors import (
    _CLAIM_OR_GET,
    _HASH,
    _MIN_CLAIM,
    _MIN_DONE,
    _MIN_TABLE,
    _RESPONSE,
    _UPDATE,
    pg_minimal_ops,
    redis_minimal_ops,
)

_COLS = (
    "CREATE TABLE {t} (tenant text COLLATE \"C\", operation text COLLATE \"C\", "
    "key text COLLATE \"C\", status varchar(16) NOT NULL, request_hash text NOT NULL, "
    "response bytea, fencing_token bigint NOT NULL, created_at float8 NOT NULL, "
    "updated_at float8 NOT NULL, lease_expires_at float8, expires_at float8, "
    "PRIMARY KEY (tenant, operation, key))"
)
_PROC_IDX = (
    "CREATE INDEX ON {t} (updated_at, tenant, operation, key) WHERE status = 'PROCESSING'"
)


def _body() -> dict[str, bool]:
    return {"ok": True}


def _pg_pair(
    conn: Any, table: str, claim: str, done: str, tag: str, token_at: int = 3
) -> tuple[Op, Op]:
    """(first delivery, replay) of a claim statement in psycopg's named style (its rows have
    the token at ``token_at``) and the completion ``UPDATE``, both prepared, on ``table``
    (``{t}`` in the texts)."""
    claim, done = claim.format(t=table), done.format(t=table)
    now = time.time()

    def params(key: str) -> dict[str, Any]:
        return {"tenant": "t", "operation": "op", "key": key, "request_hash": _HASH,
                "now": now, "lease": now + 300}

    def first(i: int) -> None:
        key = f"{tag}-{i}"
        row = conn.execute(claim, params(key), prepare=True).fetchone()
        conn.execute(done, {"tenant": "t", "operation": "op", "key": key,
                            "token": row[token_at], "response": _RESPONSE, "now": now,
                            "expires_at": now + 86400}, prepare=True)

    first(-1)
    first_done = f"{tag}-done"
    row = conn.execute(claim, params(first_done)).fetchone()
    conn.execute(done, {"tenant": "t", "operation": "op", "key": first_done,
                        "token": row[token_at], "response": _RESPONSE, "now": now,
                        "expires_at": now + 86400})

    def replay(_: int) -> None:
        conn.execute(claim, params(first_done), prepare=True).fetchone()

    return first, replay


def _named(positional: str, names: list[str]) -> str:
    """A ``%s`` statement of ``floors`` in psycopg's named style."""
    out = positional
    for name in names:
        out = out.replace("%s", f"%({name})s", 1)
    return out


_SCOPE = ["tenant", "operation", "key"]
_MIN_CLAIM_N = _named(_MIN_CLAIM.replace("%s, %s)", "%s, 7)", 1),
                      [*_SCOPE, "request_hash", *_SCOPE])
_MIN_DONE_N = _named(_MIN_DONE.replace("fencing_token = %s", "fencing_token = %(token)s"),
                     ["response", *_SCOPE])
_FLOOR_CLAIM_N = _named(_CLAIM_OR_GET.replace("%s, %s, %s, %s, %s)", "%s, 7, %s, %s, %s)", 1),
                        [*_SCOPE, "request_hash", "now", "now", "lease", *_SCOPE])
_FLOOR_DONE_N = _named(_UPDATE.format(t="{t}", p="%s"),
                       ["response", "now", "expires_at", *_SCOPE, "token"])


@contextlib.contextmanager
def _pg_tables(conn: Any) -> Iterator[dict[str, str]]:
    tag = uuid.uuid4().hex[:8]
    tables = {"min_c": f"gap_{tag}_minc", "cols": f"gap_{tag}_cols", "proc": f"gap_{tag}_proc"}
    try:
        conn.execute(_MIN_TABLE.replace("text NOT NULL", 'text COLLATE "C" NOT NULL', 3)
                     .format(t=tables["min_c"]))
        for name in ("cols", "proc"):
            conn.execute(_COLS.format(t=tables[name]))
        conn.execute(_PROC_IDX.format(t=tables["proc"]))
        yield tables
    finally:
        for t in tables.values():
            with contextlib.suppress(Exception):
                conn.execute(f"DROP TABLE IF EXISTS {t}")


def pg_rows(n: int) -> dict[str, Any]:
    """The PostgreSQL decomposition: {measure: {row: (µs, ratio)}}, and EXPLAIN lines."""
    import psycopg

    conn = psycopg.connect(POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://"),
                           autocommit=True)
    with (
        contextlib.closing(conn), pg_minimal_ops(POSTGRES_URL) as minimal,
        _pg_tables(conn) as t, open_store("postgresql", None) as store,  # type: ignore[arg-type]
    ):
        plans = store._plans
        ours_t = f"{store.table_prefix}_records"
        ours_claim = plans.sql.claim.replace(ours_t, "{t}")
        seq = f"nextval('\"{store.table_prefix}_fencing_seq\"')"
        const_claim = ours_claim.replace(seq, "7")
        done = plans.common.mark_success.replace(ours_t, "{t}")
        v = {
            "minimal floor (bare table, default collation)": (
                minimal["claim+complete"], minimal["claim-or-get"]),
            "the same, \"C\" collation": _pg_pair(conn, t["min_c"], _MIN_CLAIM_N, _MIN_DONE_N,
                                                  "a"),
            "floor statements, all columns, primary key only": _pg_pair(
                conn, t["cols"], _FLOOR_CLAIM_N, _FLOOR_DONE_N, "b"),
            "  + the partial PROCESSING index": _pg_pair(conn, t["proc"], _FLOOR_CLAIM_N,
                                                         _FLOOR_DONE_N, "c"),
            "  + expires_at index, status check (the store's table)": _pg_pair(
                conn, ours_t, _FLOOR_CLAIM_N, _FLOOR_DONE_N, "d"),
            "the store's statements (constant token)": _pg_pair(conn, ours_t, const_claim,
                                                                done, "e", 4),
            "the store's statements (nextval: as shipped)": _pg_pair(conn, ours_t, ours_claim,
                                                                     done, "f", 4),
        }
        v.update(_store_rows(store))
        out = _measure(v, n)
        out["explain"] = _explain(conn, {
            "minimal": (_MIN_CLAIM_N.format(t=t["min_c"]), "a-done"),
            "store": (ours_claim.format(t=ours_t), "f-done")})
        return out


def _store_rows(store: Any) -> dict[str, tuple[Op, Op]]:
    """``store.create`` (+ ``mark_success``) and ``execute()`` on ``store``."""
    tag = uuid.uuid4().hex[:6]
    ops = store_ops(store)
    h = make_handler(store)

    def ex_first(i: int) -> None:
        h.execute(_body, operation="gap", tenant="t", key=f"x{tag}-{i}", payload={"a": 1})

    ex_first(-1)

    def ex_replay(_: int) -> None:
        h.execute(_body, operation="gap", tenant="t", key=f"x{tag}--1", payload={"a": 1})

    return {"store.create (+ mark_success)": (ops["first"], ops["replay"]),
            "execute()": (ex_first, ex_replay)}


def _measure(variants: dict[str, tuple[Op, Op]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for idx, measure in enumerate(("first delivery", "replay")):
        ops = {name: pair[idx] for name, pair in variants.items()}
        result = interleave(ops, n)
        ref = next(iter(ops))
        out[measure] = {name: (round(result.median(name), 1), round(result.ratio(name, ref), 3))
                        for name in ops}
    return out


def _explain(conn: Any, statements: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    now = time.time()
    out = {}
    for name, (sql, key) in statements.items():
        p = {"tenant": "t", "operation": "op", "key": key, "request_hash": _HASH, "now": now,
             "lease": now + 300}
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, p).fetchall()
        out[name] = [r[0] for r in rows]
    return out


def redis_rows(n: int) -> dict[str, Any]:
    """The Redis decomposition: {measure: {row: (µs, ratio)}}."""
    import redis

    from .floors import _REDIS_CLAIM

    with redis_minimal_ops(REDIS_URL) as minimal, open_store("redis", None) as store:  # type: ignore[arg-type]
        pooled: Any = redis.Redis.from_url(REDIS_URL)
        script = pooled.register_script(_REDIS_CLAIM)
        sha = pooled.script_load(_REDIS_CLAIM)
        direct = store._transport.direct
        proto = store._protocol
        base = f"{store.prefix}:{{gap}}"
        processing = b"PROCESSING|" + _HASH.encode()

        def pooled_first(i: int) -> None:
            script(keys=[f"{base}:p{i}"], args=[processing, 600_000])
            pooled.set(f"{base}:p{i}", b'SUCCESS|{"ok":true}', xx=True, px=600_000)

        def held_first(i: int) -> None:
            direct.execute("EVALSHA", sha, 1, f"{base}:h{i}", processing, 600_000)
            direct.execute("SET", f"{base}:h{i}", b'SUCCESS|{"ok":true}', "XX", "PX", 600_000)

        pooled_first(-1)
        held_first(-1)
        now = time.time()

        def scripts_first(i: int) -> None:
            scope = Scope("t", "op", f"g{i}")
            plan = proto.create(scope, _HASH, now, now + 300)
            token = int(direct.execute(*next(plan))[0])
            direct.execute(*next(proto.mark_success(scope, token, _RESPONSE, now, now + 86400)))

        scripts_first(-1)
        claim_done = next(proto.create(Scope("t", "op", "g-1"), _HASH, now, now + 300))
        variants = {
            "minimal floor (evalsha, single-connection client)": (
                minimal["claim+complete"], minimal["claim-or-get"]),
            "the floor: the same script through the pooled client's Script": (
                pooled_first, lambda _: script(keys=[f"{base}:p-1"], args=[processing, 1])),
            "the same script on the store's held connection": (
                held_first, lambda _: direct.execute("EVALSHA", sha, 1, f"{base}:h-1",
                                                     processing, 600_000)),
            "the store's scripts (claim.lua, mark_success.lua) by hand": (
                scripts_first, lambda _: direct.execute(*claim_done)),
            **_store_rows(store),
        }
        try:
            return _measure(variants, n)
        finally:
            for k in pooled.scan_iter(f"{base}:*", count=1000):
                pooled.delete(k)
            pooled.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--only", default="postgresql,redis")
    args = parser.parse_args()
    for kind, fn in (("postgresql", pg_rows), ("redis", redis_rows)):
        if kind not in args.only.split(","):
            continue
        data = fn(args.n)
        for measure in ("first delivery", "replay"):
            print(f"\n{kind}, {measure}: µs, ratio to the minimal floor")
            for name, (us, ratio) in data[measure].items():
                print(f"  {name:66} {us:8.1f} {ratio:6.2f}x")
        for name, lines in data.get("explain", {}).items():
            print(f"\nEXPLAIN (ANALYZE, BUFFERS), {name} replay:")
            print("\n".join("  " + line for line in lines))


if __name__ == "__main__":
    main()
