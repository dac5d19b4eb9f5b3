"""PostgreSQL's statement texts: every primitive is one statement (CTEs for the multi-row ones).

Fencing tokens come from the sequence ``<prefix>_fencing_seq`` (``CACHE 1``, so values grow
in real-time order across sessions): ``nextval`` in the claim's VALUES, in the SET list that
replaces an expired record (evaluated only once the conflicting row is locked) and in
``take_over``'s and ``reopen``'s UPDATEs.  A value drawn by an insert that then conflicted
is a gap.
"""

from __future__ import annotations

import re
from typing import Final

import sqlalchemy as sa

from ..._core.errors import ConfigurationError
from . import _statements as q
from ._schema import fencing_sequence

_NULLS = "NULL::text, NULL::text, NULL::bytea, fencing_token, NULL::float8, NULL::float8, "
_NULLS += "NULL::float8, NULL::float8"


def _claim_sql(r: str, token: str) -> str:
    """The hot path, one round trip: insert, or read the existing record.  DO NOTHING takes
    no row lock on a duplicate (DO UPDATE ... WHERE would lock it even when the WHERE is
    false, turning every replay into a write).  The row to insert is only formed (and its
    token drawn) when no record is visible: a replay stays a pure read, never a ``nextval``
    (which WAL-logs the sequence every 32 values and then flushes WAL at commit).  Zero rows
    means the conflicting row is newer than this statement's snapshot: the caller runs it
    again."""
    return q.pyformat(
        f"WITH ins AS (INSERT INTO {r} {q.INSERT_COLS} SELECT {q.new_values(token)[1:-1]} "
        f"WHERE NOT EXISTS (SELECT 1 FROM {r} WHERE {q.SCOPE}) "
        "ON CONFLICT (tenant, operation, key) DO NOTHING RETURNING fencing_token) "
        f"SELECT true, {_NULLS} FROM ins "
        f"UNION ALL SELECT false, {q.RECORD_COLS} FROM {r} "
        f"WHERE {q.SCOPE} AND NOT EXISTS (SELECT 1 FROM ins)"
    )


def _create_sql(r: str, c: str, token: str) -> str:
    """The rare path, when the record read back had expired: insert, or replace an expired
    record (drawing its token after the row lock, and resetting its counter) atomically,
    or read the live one."""
    ins = (
        f"INSERT INTO {r} AS r {q.INSERT_COLS} VALUES {q.new_values(token)} "
        f"ON CONFLICT (tenant, operation, key) DO UPDATE SET {q.replace_set(token)} "
        "WHERE r.expires_at IS NOT NULL AND r.expires_at <= :now "
        "RETURNING (r.xmax = 0) AS inserted, r.fencing_token"
    )
    return q.pyformat(
        f"WITH ins AS ({ins}), "
        f"reset AS (DELETE FROM {c} WHERE {q.SCOPE} "
        "AND EXISTS (SELECT 1 FROM ins WHERE NOT inserted)) "
        f"SELECT true, {_NULLS} FROM ins "
        f"UNION ALL SELECT false, {q.RECORD_COLS} FROM {r} "
        f"WHERE {q.SCOPE} AND NOT EXISTS (SELECT 1 FROM ins)"
    )


def _create_many_sql(r: str, c: str, token: str) -> str:
    """A whole batch in one statement; one row per claim in input order: (created, token
    drawn, the existing record's columns).  Scopes with a live record are left out of the
    INSERT, so a replayed batch draws no tokens.  The columns come as array literals
    (``_arrays``), cast to arrays here."""
    return q.pyformat(
        "WITH input AS (SELECT * FROM unnest(:tenants::text::text[], "
        ":operations::text::text[], :keys::text::text[], :hashes::text::text[]) WITH ORDINALITY "
        "AS i(tenant, operation, key, request_hash, ord)), "
        f"ins AS (INSERT INTO {r} AS r {q.INSERT_COLS} "
        f"SELECT tenant, operation, key, 'PROCESSING', request_hash, NULL, {token}, "
        ":now, :now, :lease, NULL FROM input WHERE NOT EXISTS (SELECT 1 FROM "
        f"{r} AS live WHERE live.tenant = input.tenant AND live.operation = input.operation "
        "AND live.key = input.key AND (live.expires_at IS NULL OR live.expires_at > :now)) "
        "ORDER BY tenant, operation, key "
        f"ON CONFLICT (tenant, operation, key) DO UPDATE SET {q.replace_set(token)} "
        "WHERE r.expires_at IS NOT NULL AND r.expires_at <= :now "
        "RETURNING r.tenant, r.operation, r.key, (r.xmax = 0) AS inserted, r.fencing_token), "
        f"reset AS (DELETE FROM {c} AS c USING ins WHERE NOT ins.inserted "
        "AND c.tenant = ins.tenant AND c.operation = ins.operation AND c.key = ins.key) "
        "SELECT ins.tenant IS NOT NULL, ins.fencing_token, "
        + ", ".join(f"r.{col}" for col in q.RECORD_COLS.split(", "))
        + " FROM input i LEFT JOIN ins ON ins.tenant = i.tenant "
        "AND ins.operation = i.operation AND ins.key = i.key "
        f"LEFT JOIN {r} r ON ins.tenant IS NULL AND r.tenant = i.tenant "
        "AND r.operation = i.operation AND r.key = i.key ORDER BY i.ord"
    )


def _mark_success_many_sql(r: str) -> str:
    """One set-based UPDATE; it returns the input positions (1-based) it wrote."""
    return q.pyformat(
        "WITH input AS (SELECT * FROM unnest(:tenants::text::text[], "
        ":operations::text::text[], :keys::text::text[], :tokens::text::bigint[], "
        ":responses::text::bytea[], :expires::text::float8[]) WITH ORDINALITY "
        "AS i(tenant, operation, key, fencing_token, response, expires_at, ord)) "
        f"UPDATE {r} AS r SET status = 'SUCCESS', response = i.response, "
        "updated_at = :now, lease_expires_at = NULL, expires_at = i.expires_at "
        "FROM input i WHERE r.tenant = i.tenant AND r.operation = i.operation "
        "AND r.key = i.key AND r.status = 'PROCESSING' "
        "AND r.fencing_token = i.fencing_token RETURNING i.ord"
    )


def _bump(c: str, src: str) -> str:
    """Count one attempt for the scope, if ``src`` (a CTE) has a row."""
    return (
        f"INSERT INTO {c} AS c (tenant, operation, key, count, updated_at) "
        f"SELECT :tenant, :operation, :key, 1, :now FROM {src} "
        "ON CONFLICT (tenant, operation, key) DO UPDATE "
        "SET count = c.count + 1, updated_at = excluded.updated_at RETURNING c.count"
    )


def _take_over_sql(r: str, c: str, token: str) -> str:
    return q.pyformat(
        f"WITH upd AS (UPDATE {r} SET fencing_token = {token}, "
        "lease_expires_at = :lease, updated_at = :now "
        f"WHERE {q.OWNED}{q.LEASE_EXPIRED} RETURNING fencing_token), "
        f"bump AS ({_bump(c, 'upd')}) "
        "SELECT bump.count, upd.fencing_token FROM bump CROSS JOIN upd"
    )


def _reopen_sql(r: str, c: str, token: str) -> str:
    """A settled record to a new attempt and its counter reset, in one statement: a
    concurrent reopen of the same attempt waits for the row lock, then finds it PROCESSING."""
    return q.pyformat(
        f"WITH upd AS ({q.reopen_sql(r, token)}), "
        f"reset AS (DELETE FROM {c} WHERE {q.SCOPE} AND EXISTS (SELECT 1 FROM upd)) "
        "SELECT fencing_token FROM upd"
    )


def _record_failure_sql(r: str, c: str, cond: str) -> str:
    return q.pyformat(
        f"WITH target AS (SELECT 1 FROM {r} WHERE {q.OWNED}{cond} FOR UPDATE), "
        f"bump AS ({_bump(c, 'target')}), "
        f"poison AS (UPDATE {r} SET status = 'FAILED', updated_at = :now, "
        f"lease_expires_at = NULL, expires_at = :expires_at WHERE {q.OWNED} "
        "AND EXISTS (SELECT 1 FROM bump WHERE count >= :max_retries) RETURNING 1), "
        f"released AS (DELETE FROM {r} WHERE {q.OWNED} "
        "AND EXISTS (SELECT 1 FROM bump WHERE count < :max_retries) RETURNING 1) "
        "SELECT count FROM bump"
    )


def _delete_records_sql(r: str) -> str:
    return q.pyformat(
        f"WITH doomed AS (SELECT tenant, operation, key FROM {r} "
        "WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED) "
        f"DELETE FROM {r} AS r USING doomed WHERE r.tenant = doomed.tenant "
        "AND r.operation = doomed.operation AND r.key = doomed.key"
    )


def _delete_counters_sql(r: str, c: str) -> str:
    # Joined on the primary key (as for records): a row-value ``IN (subquery … LIMIT)`` was
    # planned as a nested loop over the whole counters table (its cost grew with the table;
    # docs/performance.md has the figures).
    return q.pyformat(
        f"WITH doomed AS (SELECT tenant, operation, key FROM {c} AS cc "
        "WHERE cc.updated_at < :before "
        f"AND NOT EXISTS (SELECT 1 FROM {r} AS r WHERE r.tenant = cc.tenant "
        "AND r.operation = cc.operation AND r.key = cc.key) "
        "ORDER BY cc.updated_at LIMIT :limit FOR UPDATE SKIP LOCKED) "
        f"DELETE FROM {c} AS c USING doomed WHERE c.tenant = doomed.tenant "
        "AND c.operation = doomed.operation AND c.key = doomed.key"
    )


#: A valid ``table_prefix`` (it becomes part of quoted identifiers).
PREFIX_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


class Statements:
    """The PostgreSQL statements of the primitives whose SQL differs between the dialects
    (pure text: the plans in ``protocol.py`` send them)."""

    __slots__ = (
        "claim", "create", "create_many", "delete_counters", "delete_records",
        "mark_success_many", "record_failure", "record_failure_expired", "reopen", "take_over",
    )

    def __init__(self, r: str, c: str, sequence: str) -> None:
        token = f"nextval('{sequence}')"  # ``sequence`` is a quoted, validated identifier
        self.claim = _claim_sql(r, token)
        self.create = _create_sql(r, c, token)
        self.create_many = _create_many_sql(r, c, token)
        self.mark_success_many = _mark_success_many_sql(r)
        self.take_over = _take_over_sql(r, c, token)
        self.reopen = _reopen_sql(r, c, token)
        self.record_failure = _record_failure_sql(r, c, "")
        self.record_failure_expired = _record_failure_sql(r, c, q.LEASE_EXPIRED)
        self.delete_records = _delete_records_sql(r)
        self.delete_counters = _delete_counters_sql(r, c)


# -- schema -----------------------------------------------------------------------------------
def create_fencing_sequence(conn: sa.Connection, prefix: str, records: str) -> None:
    """Create ``<prefix>_fencing_seq`` if missing, starting above every token already in the
    records table (earlier versions drew random 62-bit tokens).  Runs inside
    ``create_schema``'s transaction, under its advisory lock."""
    sequence = fencing_sequence(prefix)
    kind = _relkind(conn, sequence)
    if kind is not None:
        if kind != "S":
            raise ConfigurationError(
                f"{sequence.name!r} exists but is not a sequence: use another table_prefix, "
                "or drop that relation"
            )
        return
    highest = conn.exec_driver_sql(f"SELECT max(fencing_token) FROM {records}").scalar()
    start = max(int(highest or 0), 0) + 1
    conn.execute(sa.schema.CreateSequence(fencing_sequence(prefix, start=start)))


def drop_fencing_sequence(conn: sa.Connection, prefix: str) -> None:
    """Drop the sequence if there is one (never another relation of that name)."""
    sequence = fencing_sequence(prefix)
    if _relkind(conn, sequence) == "S":
        conn.execute(sa.schema.DropSequence(sequence))


def _relkind(conn: sa.Connection, sequence: sa.Sequence) -> str | None:
    """What the relation named like ``sequence`` is (``"S"``: a sequence), or None."""
    kind = conn.exec_driver_sql(
        "SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%(name)s)",
        {"name": conn.dialect.identifier_preparer.format_sequence(sequence)},
    ).scalar()
    return None if kind is None else str(kind)
