"""``Outbox``: the outbox tables of one database and table prefix, as the relay and operators
use them — the schema, the relay's batch, moving rows to SENT, counting failed attempts and
poisoning, clean-up, and the operator's list / retry / drop.

Every statement runs in a short transaction of its own on the store's SQLAlchemy engine
(never the connection of a body).  Writes are conditional on the row's status, so an
operator's ``drop`` or ``retry`` running next to a relay never resurrects or double-counts a
row.  Driver errors become the library's errors at this boundary: a missing table is
``CONFIGURATION_ERROR`` ("run ``idempotent-tasks migrate``"), anything else
``STORE_UNAVAILABLE``.

Ordering: a batch is the due PENDING rows, oldest first (``due``); the relay publishes the
rows of one parent scope and kind one after the other.  When a row is refused and must wait
for a retry, the later rows of the same parent and kind are held back until the same moment
(``settle``), so none of them overtakes it in a later batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from .._core.errors import ConfigurationError
from ..stores.sql.protocol import DEFAULT_TABLE_PREFIX, translate
from . import _schema
from ._schema import RowStatus
from ._targets import decode_fields

#: The most rows ``pending_count`` counts (the gauge saturates there instead of scanning).
PENDING_COUNT_CAP = 100_000

_COLUMNS = ("id", "tenant", "operation", "parent_key", "parent_token", "position", "key", "kind",
            "destination", "message", "body", "status", "attempts", "created_at",
            "available_at", "sent_at", "expires_at", "last_error")
_STATUS = {s.value: s for s in RowStatus}
_PENDING = RowStatus.PENDING.value
_POISONED = RowStatus.POISONED.value


class OutboxRow(NamedTuple):
    """One staged message as stored (``message``: its fields as JSON, see ``fields``)."""

    id: int
    tenant: str
    operation: str
    parent_key: str
    parent_token: int | None
    position: int
    key: str
    kind: str
    destination: str
    message: bytes
    body: bytes | None
    status: RowStatus
    attempts: int
    created_at: float
    available_at: float
    sent_at: float | None
    expires_at: float | None
    last_error: str | None

    @property
    def fields(self) -> dict[str, Any]:
        """The target's fields (decoded on each access)."""
        return decode_fields(self.message)

    @property
    def stream(self) -> tuple[str, str, str, str]:
        """What is ordered: one parent scope's messages to one kind of broker."""
        return (self.tenant, self.operation, self.parent_key, self.kind)


def _rows(result: Any, binary_scope: bool) -> list[OutboxRow]:
    """Rows of a ``SELECT`` of :data:`_COLUMNS`, positionally (no per-row mapping)."""
    made = []
    for found in result:
        r = (found[0], *(_text(v) for v in found[1:4]), *found[4:]) if binary_scope else found
        made.append(OutboxRow._make((*r[:11], _STATUS[r[11]], *r[12:])))
    return made


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else str(value)


class Outbox:
    """The outbox tables ``<prefix>_outbox`` / ``<prefix>_outbox_sent`` of a database.

    ``source``: a ``SQLStore`` (its engine and table prefix), a SQLAlchemy ``Engine`` or a
    database URL (as ``SQLStore`` takes it); ``table_prefix`` defaults to the store's.
    """

    def __init__(self, source: Any, *, table_prefix: str | None = None) -> None:
        self._owned: Any = None
        engine = getattr(source, "engine", None)
        if isinstance(source, str):
            from ..stores.sql import SQLStore

            self._owned = SQLStore(source, table_prefix=table_prefix or DEFAULT_TABLE_PREFIX)
            engine = self._owned.engine
        elif isinstance(source, sa.Engine):
            engine = source
        if not isinstance(engine, sa.Engine):
            raise ConfigurationError(
                f"Outbox needs a SQLStore, a SQLAlchemy Engine or a database URL, not "
                f"{type(source).__name__} (a DjangoStore's outbox: Outbox(<the database URL>))"
            )
        self.engine = engine
        self.table_prefix: str = str(
            table_prefix or getattr(source, "table_prefix", None) or DEFAULT_TABLE_PREFIX
        )
        self.table = _schema.outbox_table(self.table_prefix)
        self.sent = _schema.sent_table(self.table_prefix)
        self.dialect: str = engine.dialect.name
        self._binary = self.dialect in ("mysql", "mariadb")

    def __repr__(self) -> str:
        url = self.engine.url.render_as_string(hide_password=True)
        return f"Outbox({url!r}, table_prefix={self.table_prefix!r})"

    @staticmethod
    def _select(t: Any) -> sa.Select[Any]:
        return sa.select(*(t.c[name] for name in _COLUMNS))

    @contextlib.contextmanager
    def _begin(self, what: str) -> Iterator[sa.Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except (sa.exc.SQLAlchemyError, OSError) as exc:
            raise translate(self.dialect, self.table_prefix, f"outbox {what}", exc) from exc

    def _ids(self, t: Any, ids: Sequence[int]) -> Any:
        """``id IN (...)``; on PostgreSQL ``id = ANY(array)``: one parameter, not hundreds."""
        if self.dialect == "postgresql":
            return t.c.id == sa.any_(sa.literal(list(ids), sa.ARRAY(sa.BigInteger())))
        return t.c.id.in_(list(ids))

    # -- schema --------------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Create the tables and their indexes where missing (idempotent; also run by
        ``SQLStore.create_schema()`` once this package is imported, and by
        ``idempotent-tasks migrate``)."""
        with self._begin("create_schema") as conn:
            _schema.create_schema(conn, self.table_prefix)

    def drop_schema(self) -> None:
        with self._begin("drop_schema") as conn:
            _schema.drop_schema(conn, self.table_prefix)

    # -- the relay -----------------------------------------------------------------------------
    def due(self, *, now: float, limit: int, kinds: Collection[str]) -> list[OutboxRow]:
        """The next batch: due PENDING rows of ``kinds``, oldest first."""
        if not kinds:
            return []
        t = self.table
        query = (self._select(t)
                 .where(t.c.status == _PENDING, t.c.available_at <= now,
                        t.c.kind.in_(sorted(kinds)))
                 .order_by(t.c.id).limit(limit))
        with self._begin("due") as conn:
            return _rows(conn.execute(query), self._binary)

    def settle(self, *, sent: Sequence[int], failed: Sequence[tuple[OutboxRow, str, float | None]],
               now: float, expires_at: float) -> None:
        """One batch's results in one transaction: ``sent`` ids move to the SENT table (kept
        until ``expires_at``); each ``(row, error, retry_at)`` of ``failed`` counts an attempt
        and waits until ``retry_at`` — with the later rows of its parent and kind — or, with
        ``retry_at=None``, is POISONED (and its successors go on)."""
        with self._begin("settle") as conn:
            if sent:
                self._move_sent(conn, sent, now, expires_at)
            for row, error, retry_at in failed:
                self._failed(conn, row, error, retry_at)

    def _move_sent(self, conn: sa.Connection, ids: Sequence[int], now: float,
                   expires_at: float) -> None:
        t, s = self.table, self.sent
        picked = sa.and_(self._ids(t, ids), t.c.status == _PENDING)
        columns = [c for c in _COLUMNS if c not in ("status", "attempts", "sent_at",
                                                     "expires_at", "last_error")]
        copied = sa.select(
            *(t.c[c] for c in columns), sa.literal(RowStatus.SENT.value),
            t.c.attempts + 1, sa.literal(now, sa.Double()), sa.literal(expires_at, sa.Double()),
            sa.null(),
        ).where(picked)
        target = [*columns, "status", "attempts", "sent_at", "expires_at", "last_error"]
        conn.execute(s.insert().from_select(target, copied))
        conn.execute(t.delete().where(picked))

    def _failed(self, conn: sa.Connection, row: OutboxRow, error: str,
                retry_at: float | None) -> None:
        t = self.table
        values: dict[str, Any] = {"attempts": t.c.attempts + 1, "last_error": error[:2000]}
        if retry_at is None:
            values["status"] = _POISONED
        else:
            values["available_at"] = retry_at
        conn.execute(t.update().where(t.c.id == row.id, t.c.status == _PENDING).values(**values))
        if retry_at is not None:  # its successors wait with it: none may overtake it
            conn.execute(t.update().where(
                t.c.status == _PENDING, t.c.tenant == row.tenant,
                t.c.operation == row.operation, t.c.parent_key == row.parent_key,
                t.c.kind == row.kind, t.c.id > row.id, t.c.available_at < retry_at,
            ).values(available_at=retry_at))

    def cleanup(self, *, now: float, limit: int = 1000) -> int:
        """Delete up to ``limit`` SENT rows whose ``expires_at`` has passed."""
        s = self.sent
        ids = sa.select(s.c.id).where(s.c.expires_at <= now).limit(limit)
        if self._binary:  # MySQL: no LIMIT in a subquery of IN
            ids = sa.select(ids.subquery().c.id)
        with self._begin("cleanup") as conn:
            return int(conn.execute(s.delete().where(s.c.id.in_(ids))).rowcount)

    def pending_count(self, cap: int = PENDING_COUNT_CAP) -> int:
        t = self.table
        inner = sa.select(t.c.id).where(t.c.status == _PENDING).limit(cap)
        with self._begin("pending_count") as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(inner.subquery()))
                       .scalar_one())

    # -- operators -----------------------------------------------------------------------------
    def rows(self, *, status: RowStatus | str | None = None, kind: str | None = None,
             tenant: str | None = None, limit: int = 100, offset: int = 0) -> list[OutboxRow]:
        """Rows of both tables, oldest first, filtered by status, kind and tenant."""
        wanted = None if status is None else RowStatus(status)
        parts = []
        for table, holds in ((self.table, (RowStatus.PENDING, RowStatus.POISONED)),
                             (self.sent, (RowStatus.SENT,))):
            if wanted is not None and wanted not in holds:
                continue
            query = self._select(table)
            if wanted is not None:
                query = query.where(table.c.status == wanted.value)
            if kind is not None:
                query = query.where(table.c.kind == kind)
            if tenant is not None:
                query = query.where(table.c.tenant == tenant)
            parts.append(query)
        union = parts[0] if len(parts) == 1 else sa.union_all(*parts)
        query = sa.select(union.subquery()).order_by(sa.text("id")).limit(limit).offset(offset)
        with self._begin("list") as conn:
            return _rows(conn.execute(query), self._binary)

    def get(self, row_id: int) -> OutboxRow | None:
        with self._begin("get") as conn:
            for table in (self.table, self.sent):
                found = _rows(conn.execute(self._select(table).where(table.c.id == row_id)),
                              self._binary)
                if found:
                    return found[0]
        return None

    def counts(self) -> dict[tuple[str, RowStatus], int]:
        """(kind, status) -> rows."""
        out: dict[tuple[str, RowStatus], int] = {}
        with self._begin("counts") as conn:
            for t in (self.table, self.sent):
                query = sa.select(t.c.kind, t.c.status, sa.func.count()).group_by(t.c.kind,
                                                                                  t.c.status)
                out.update({(k, _STATUS[s]): int(n) for k, s, n in conn.execute(query)})
        return out

    def retry(self, ids: Sequence[int], *, now: float) -> int:
        """POISONED rows back to PENDING with a fresh attempt budget, due at once."""
        t = self.table
        query = t.update().where(t.c.id.in_(list(ids)), t.c.status == _POISONED)
        with self._begin("retry") as conn:
            return int(conn.execute(query.values(
                status=_PENDING, attempts=0, available_at=now,
            )).rowcount)

    def drop(self, ids: Sequence[int]) -> list[OutboxRow]:
        """Delete POISONED rows; returns what was deleted."""
        t = self.table
        where = (t.c.id.in_(list(ids)), t.c.status == _POISONED)
        with self._begin("drop") as conn:
            rows = _rows(conn.execute(self._select(t).where(*where)), self._binary)
            conn.execute(t.delete().where(t.c.id.in_([r.id for r in rows]), where[1]))
        return rows

    def close(self) -> None:
        """Close the store this outbox made from a URL (an engine passed in is the caller's)."""
        if self._owned is not None:
            self._owned.close()


__all__ = ["PENDING_COUNT_CAP", "Outbox", "OutboxRow"]
