"""SQLStore on SQLite: one autocommit statement where possible, else ``BEGIN IMMEDIATE``.

A claim reads first: a duplicate (a replay, a delivery while the attempt runs) is one read,
which in WAL mode takes no lock, so replays never queue behind the one writer; a first
delivery then inserts (``ON CONFLICT DO NOTHING``, the atomic claim).  In-process, a
statement is no network round trip: the read costs less than the write lock an
insert-first claim takes on every replay.

Fencing tokens: the one-row table ``<prefix>_fencing`` holds the last token drawn; a claim
draws ``last_token + 1`` inside its own INSERT (SQLite takes the write lock at the start of a
write statement, so that read is consistent; ``take_over`` and ``reopen`` draw it the same
way in their UPDATE), and two triggers on the records table raise
``last_token`` to every token written (``AFTER INSERT`` and ``AFTER UPDATE OF
fencing_token``).  A duplicate writes nothing: ``ON CONFLICT DO NOTHING`` fires no trigger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from ..._core.records import CreateResult, Scope
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from . import _statements as q

BEGIN = "BEGIN IMMEDIATE"


class SQLiteOps:
    """The SQLite statements of the primitives that differ between the dialects."""

    def __init__(self, r: str, c: str, fencing: str, common: q.Common) -> None:
        self._c = common
        token = f"(SELECT last_token FROM {fencing}) + 1"
        self._insert_new_sql = (
            f"INSERT INTO {r} {q.INSERT_COLS} VALUES {q.new_values(token)} "
            "ON CONFLICT (tenant, operation, key) DO NOTHING RETURNING fencing_token"
        )
        self._replace_sql = (
            f"INSERT INTO {r} AS r {q.INSERT_COLS} VALUES {q.new_values(token)} "
            "ON CONFLICT (tenant, operation, key) DO UPDATE "
            f"SET {q.replace_set('excluded.fencing_token')} RETURNING fencing_token"
        )
        self._take_over_sql = (
            f"UPDATE {r} SET fencing_token = {token}, lease_expires_at = :lease, "
            f"updated_at = :now WHERE {q.OWNED}{q.LEASE_EXPIRED} RETURNING fencing_token"
        )
        self._reopen_sql = q.reopen_sql(r, token)
        self._owned_sql = f"SELECT 1 FROM {r} WHERE {q.OWNED}"
        self._delete_records_sql = (
            f"DELETE FROM {r} WHERE rowid IN (SELECT rowid FROM {r} "
            "WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit)"
        )
        self._delete_counters_sql = (
            f"DELETE FROM {c} WHERE rowid IN (SELECT cc.rowid FROM {c} AS cc "
            "WHERE cc.updated_at < :before AND NOT EXISTS (SELECT 1 FROM "
            f"{r} AS r WHERE r.tenant = cc.tenant AND r.operation = cc.operation "
            "AND r.key = cc.key) ORDER BY cc.updated_at LIMIT :limit)"
        )

    def create(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult | None:
        """Read first, for speed: a duplicate of a live record (a replay, a delivery while
        the attempt runs) is one read, which in WAL mode takes no lock and never waits for
        the writer; a scope with no record is one ``INSERT … ON CONFLICT DO NOTHING`` (the
        atomic claim).  An expired record, or an insert that lost a race, is claimed under
        the write lock."""
        row = q.one(cur, self._c.get, p)
        if row is None:
            row = q.one(cur, self._insert_new_sql, p)
            if row is not None:
                return q.created(scope, p, row[0])  # the common first delivery
        else:
            duplicate = q.live_duplicate(scope, row, p["now"])
            if duplicate is not None:
                return duplicate
        cur.execute(BEGIN)
        result = self._claim_locked(cur, scope, p)
        cur.execute("COMMIT")
        return result

    def _claim_locked(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult:
        """Claim under the write lock: read, then insert or replace an expired record."""
        row = q.one(cur, self._c.get, p)
        if row is not None:
            duplicate = q.live_duplicate(scope, row, p["now"])
            if duplicate is not None:
                return duplicate
            cur.execute(self._c.reset_count, p)  # re-created after expiry: a fresh counter
        return q.created(scope, p, q.one(cur, self._replace_sql, p)[0])

    def create_many(
        self, cur: Any, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> list[CreateResult | None]:
        cur.execute(BEGIN)
        results: list[CreateResult | None] = [
            self._claim_locked(cur, c.scope, q.claim_params(c.scope, c.request_hash, now, lease))
            for c in claims
        ]
        cur.execute("COMMIT")
        return results

    def mark_success_many(
        self, cur: Any, writes: Sequence[SuccessWrite], now: float
    ) -> list[bool]:
        """Every conditional ``UPDATE`` in one transaction (one commit)."""
        cur.execute(BEGIN)
        done = []
        for w in writes:
            p = q.scope_params(w.scope)
            p.update(token=w.token, response=w.response, now=now, expires_at=w.expires_at)
            cur.execute(self._c.mark_success, p)
            done.append(cur.rowcount == 1)
        cur.execute("COMMIT")
        return done

    def take_over(self, cur: Any, p: Mapping[str, Any]) -> TakeOver | None:
        cur.execute(BEGIN)
        row = q.one(cur, self._take_over_sql, p)
        taken = None
        if row is not None:
            taken = TakeOver(int(q.one(cur, self._c.bump, p)[0]), int(row[0]))
        cur.execute("COMMIT")
        return taken

    def reopen(self, cur: Any, p: Mapping[str, Any]) -> int | None:
        """The settled record to a new attempt (its token drawn in the UPDATE) and the
        counter reset, under one write lock."""
        cur.execute(BEGIN)
        row = q.one(cur, self._reopen_sql, p)
        if row is not None:
            cur.execute(self._c.reset_count, p)
        cur.execute("COMMIT")
        return None if row is None else int(row[0])

    def record_failure(
        self, cur: Any, p: Mapping[str, Any], only_if_lease_expired: bool
    ) -> FailureResult | None:
        cur.execute(BEGIN)
        owned = self._owned_sql + (q.LEASE_EXPIRED if only_if_lease_expired else "")
        result = None
        if q.one(cur, owned, p) is not None:
            count = int(q.one(cur, self._c.bump, p)[0])
            poisoned = count >= p["max_retries"]
            cur.execute(self._c.mark_failed if poisoned else self._c.release, p)
            result = FailureResult(count, poisoned=poisoned)
        cur.execute("COMMIT")
        return result

    def delete_expired(self, cur: Any, p: Mapping[str, Any]) -> int:
        cur.execute(self._delete_records_sql, p)
        purged = int(cur.rowcount)
        cur.execute(self._delete_counters_sql, p)
        return purged


# -- schema -----------------------------------------------------------------------------------
def fencing_table(prefix: str) -> sa.Table:
    """The one-row table of the last fencing token drawn (SQLite only)."""
    return sa.Table(
        f"{prefix}_fencing",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("last_token", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name=f"{prefix}_fencing_one_row_ck"),
    )


def create_fencing(conn: sa.Connection, table: sa.Table, records: str) -> None:
    """Create the fencing table (seeded above every token already in the records table:
    earlier versions drew random 62-bit tokens) and its triggers, where missing.  Runs inside
    ``create_schema``'s transaction, which holds SQLite's write lock."""
    quote = conn.dialect.identifier_preparer.quote
    fencing = quote(table.name)
    if not sa.inspect(conn).has_table(table.name):
        table.create(conn)
        conn.exec_driver_sql(
            f"INSERT INTO {fencing} (id, last_token) "
            f"SELECT 1, max(coalesce(max(fencing_token), 0), 0) FROM {records}"
        )
    raise_to_new = (
        f"BEGIN UPDATE {fencing} SET last_token = NEW.fencing_token "
        "WHERE last_token < NEW.fencing_token; END"
    )
    prefix = table.name.removesuffix("_fencing")
    for name, event in (("insert", "INSERT"), ("update", "UPDATE OF fencing_token")):
        trigger = quote(f"{prefix}_records_fencing_{name}")
        conn.exec_driver_sql(
            f"CREATE TRIGGER IF NOT EXISTS {trigger} AFTER {event} ON {records} "
            f"FOR EACH ROW {raise_to_new}"
        )
