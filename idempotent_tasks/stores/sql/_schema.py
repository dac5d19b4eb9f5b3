"""SQLStore's schema: SQLAlchemy tables, the fencing sequence, the documented DDL, and the
check that refuses a mismatched table."""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement

from ..._core.errors import ConfigurationError

DEFAULT_TABLE_PREFIX: Final = "idempotency"


def _scope_text() -> sa.types.TypeEngine[str]:
    # "C" collation on PostgreSQL: byte order (= code point order, like the memory store) and
    # cheaper comparisons; equality is the same under every deterministic collation.
    return sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


_SCOPE: Final = ("tenant", "operation", "key")


def _scope_columns() -> list[sa.Column[str]]:
    """(tenant, operation, key): the primary key of the records and of the counters."""
    return [sa.Column(name, _scope_text(), primary_key=True) for name in _SCOPE]


class StatusCheck(ColumnElement[bool]):
    """The records' status check: ``status IN ('PROCESSING', …)``, which SQLite spells
    ``status = 'PROCESSING' OR …`` (for speed: SQLite evaluates a constant ``IN`` list of
    more than two values by building a temporary b-tree of it, on every insert and every
    update of a record; that was a quarter of the instructions of a first delivery's
    statements)."""

    inherit_cache = True
    type = sa.Boolean()
    statuses: Final = ("PROCESSING", "SUCCESS", "FAILED", "UNCERTAIN")


@compiles(StatusCheck)
def _status_in(element: StatusCheck, compiler: Any, **kw: Any) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in element.statuses) + ")"


@compiles(StatusCheck, "sqlite")
def _status_or(element: StatusCheck, compiler: Any, **kw: Any) -> str:
    return " OR ".join(f"status = '{s}'" for s in element.statuses)


def build_metadata(prefix: str = DEFAULT_TABLE_PREFIX) -> sa.MetaData:
    """The three tables (records, retry counters, maintenance locks) as SQLAlchemy Core."""
    md = sa.MetaData()
    sa.Table(
        f"{prefix}_records",
        md,
        *_scope_columns(),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("response", sa.LargeBinary(), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("lease_expires_at", sa.Double(), nullable=True),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint(*_SCOPE, name=f"{prefix}_records_pkey"),
        sa.CheckConstraint(StatusCheck(), name=f"{prefix}_records_status_ck"),
        # Recovery's scan (find_stuck): PROCESSING records oldest first.  Partial, so only
        # records in flight have entries (a completed record leaves it), and the
        # ORDER BY … LIMIT stops after ``limit`` expired leases however many are stuck.
        sa.Index(
            f"{prefix}_records_processing_idx", "updated_at", "tenant", "operation", "key",
            postgresql_where=sa.text("status = 'PROCESSING'"),
            sqlite_where=sa.text("status = 'PROCESSING'"),
        ),
        # The expiry clean-up's scan.  Partial on SQLite, for speed: a claim inserts its
        # record with no expiry, so it writes no entry here (one index page fewer per
        # claim) and completion adds the one entry; ``expires_at <= :now`` implies
        # ``IS NOT NULL``, so the clean-up's query still uses it.
        sa.Index(
            f"{prefix}_records_expires_idx", "expires_at",
            sqlite_where=sa.text("expires_at IS NOT NULL"),
        ),
    )
    sa.Table(
        f"{prefix}_retry_counters",
        md,
        *_scope_columns(),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        # The scope's recorded steps (one opaque blob): on the counter row, so whatever
        # deletes or resets the counter removes them too.
        sa.Column("steps", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint(*_SCOPE, name=f"{prefix}_retry_counters_pkey"),
        sa.Index(f"{prefix}_retry_counters_updated_idx", "updated_at"),
    )
    sa.Table(
        f"{prefix}_locks",
        md,
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=f"{prefix}_locks_pkey"),
    )
    return md


def fencing_sequence(prefix: str = DEFAULT_TABLE_PREFIX, *, start: int = 1) -> sa.Sequence:
    """PostgreSQL's source of fencing tokens.  ``CACHE 1`` (no per-session blocks of
    values), so tokens grow in the real-time order in which attempts draw them."""
    return sa.Sequence(f"{prefix}_fencing_seq", start=start, cache=1, data_type=sa.BigInteger())


def postgresql_ddl(prefix: str = DEFAULT_TABLE_PREFIX) -> str:
    """The DDL ``create_schema()`` emits on a fresh PostgreSQL database, as one script."""
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex, CreateSequence, CreateTable

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    metadata = build_metadata(prefix)
    blocks = []
    for name in ("records", "retry_counters", "locks"):
        table = metadata.tables[f"{prefix}_{name}"]
        statements = [CreateTable(table)] + [
            CreateIndex(i) for i in sorted(table.indexes, key=lambda i: str(i.name))
        ]
        blocks.append(";\n".join(_tidy(str(s.compile(dialect=dialect))) for s in statements))
    blocks.append(_tidy(str(CreateSequence(fencing_sequence(prefix)).compile(dialect=dialect))))
    return ";\n\n".join(blocks) + ";"


def _tidy(ddl: str) -> str:
    lines = (line.rstrip().replace("\t", "    ") for line in ddl.strip().splitlines())
    return "\n".join(lines)


def create_missing_indexes(conn: sa.Connection, metadata: sa.MetaData) -> None:
    """Indexes of ``metadata`` that an existing table lacks (a schema made by an earlier
    version): ``create_all`` only indexes the tables it creates itself."""
    inspector = sa.inspect(conn)
    for table in metadata.sorted_tables:
        present = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in present:
                index.create(conn)


def rebuild_partial_indexes(conn: sa.Connection, metadata: sa.MetaData) -> None:
    """SQLite: an index this release makes partial that an earlier release created full
    (the records' expires index) is dropped and created again, inside the caller's
    transaction."""
    for table in metadata.sorted_tables:
        for index in table.indexes:
            if index.dialect_options["sqlite"]["where"] is None:
                continue
            sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?",
                (index.name,),
            ).scalar()
            if sql is not None and " WHERE " not in str(sql).upper():
                index.drop(conn)
                index.create(conn)


def refuse_mismatch(
    table: sa.Table, inspector: sa.Inspector, upgradable: frozenset[str] = frozenset()
) -> None:
    """Refuse a same-named table with other columns; a column in ``upgradable`` (one an
    earlier release's table lacks, which ``create_schema`` adds) may be missing."""
    problems = _column_mismatches(table, inspector, upgradable)
    if problems:
        raise ConfigurationError(
            f"table {table.name!r} exists but does not match the idempotent_tasks schema: "
            f"{'; '.join(problems)}. Use another table_prefix, or migrate or drop that table."
        )


def _type_family(type_: Any) -> str:
    """Coarse type class for comparing a reflected column with the expected one."""
    if isinstance(type_, sa.LargeBinary):
        return "binary"
    if isinstance(type_, sa.Integer):
        return "integer"
    if isinstance(type_, sa.Float | sa.Numeric):
        return "float"
    if isinstance(type_, sa.String):
        return "text"
    return type(type_).__name__.lower()


def _column_mismatches(
    table: sa.Table, inspector: sa.Inspector, upgradable: frozenset[str]
) -> list[str]:
    """Human-readable differences between ``table`` and the same-named table in the database."""
    found = {c["name"]: _type_family(c["type"]) for c in inspector.get_columns(table.name)}
    # The type this dialect creates (a ``with_variant`` type, e.g. MySQL's VARBINARY scope
    # columns, resolves to its variant), so an existing table is compared with what
    # ``create_schema`` itself would have made.
    dialect = inspector.dialect
    wanted = {c.name: _type_family(c.type.dialect_impl(dialect)) for c in table.columns}
    problems = [f"missing column {n!r}" for n in wanted if n not in found and n not in upgradable]
    problems += [f"unexpected column {n!r}" for n in found if n not in wanted]
    problems += [
        f"column {n!r} is {found[n]}, expected {family}"
        for n, family in wanted.items()
        if n in found and found[n] != family
    ]
    pk = inspector.get_pk_constraint(table.name).get("constrained_columns") or []
    expected_pk = [c.name for c in table.primary_key.columns]
    if not problems and sorted(pk) != sorted(expected_pk):
        problems.append(f"primary key is {pk}, expected {expected_pk}")
    return problems




#: Tables other parts of the library keep beside the store's, by name: each entry is
#: ``(create(conn, prefix), drop(conn, prefix))``, run inside ``create_schema``'s and
#: ``drop_schema``'s own transaction (the transactional outbox registers its two tables).
_EXTENSIONS: dict[str, tuple[Any, Any]] = {}


def register_schema_extension(name: str, create: Any, drop: Any) -> None:
    """Have ``SQLStore.create_schema()`` / ``drop_schema()`` (and so ``idempotent-tasks
    migrate``) create and drop ``name``'s tables too; registering a name again replaces it."""
    _EXTENSIONS[name] = (create, drop)


def schema_extensions() -> list[tuple[Any, Any]]:
    return list(_EXTENSIONS.values())
