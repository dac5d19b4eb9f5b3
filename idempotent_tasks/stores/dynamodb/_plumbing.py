"""DynamoDBStore's plumbing: options, the lazily built client, calls with their errors
translated and their expected refusals told apart, parallel batches, and the table itself."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from ..._core.errors import ConfigurationError
from ._client import TokenBlocks, build_client, error_code, translated
from ._items import GC, INDEX, INDEX_ATTRIBUTES, Keys

DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_READ_TIMEOUT: Final = 10.0
#: Garbage-collection lifetime past a record's logical end (must exceed the handler's ``ttl``
#: and ``lease_timeout``).
DEFAULT_GC_TTL: Final = 7 * 86400.0
DEFAULT_INDEX_SHARDS: Final = 8
DEFAULT_BATCH_CONCURRENCY: Final = 16
_PREFIX_RE: Final = re.compile(r"[A-Za-z0-9_.-]{0,40}")
_TABLE_RE: Final = re.compile(r"[A-Za-z0-9_.-]{3,255}")
#: Cancellation reasons the store answers itself: a failed condition (it re-reads) and a
#: conflict with another transaction on the same item (it tries again).
_RETRY_REASONS: Final = frozenset({"ConditionalCheckFailed", "TransactionConflict"})
#: A transaction item's reason code when its own condition failed.
FAILED_CHECK: Final = "ConditionalCheckFailed"
#: How often a write runs again after losing a race (a conflict, a replaced record).
ATTEMPTS: Final = 50

_T = TypeVar("_T")


class Refused(Exception):
    """A conditional write whose condition failed; ``item`` is the item as it was (ALL_OLD),
    ``reasons`` a cancelled transaction's per-item codes."""

    def __init__(self, item: dict[str, Any] | None, reasons: list[str | None]) -> None:
        super().__init__("condition failed")
        self.item = item
        self.reasons = reasons


class DynamoDBPlumbing:
    """Everything of DynamoDBStore but its primitives (see the package docstring)."""

    name = "dynamodb"

    def __init__(
        self,
        table_name: str,
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        prefix: str = "",
        gc_ttl: float = DEFAULT_GC_TTL,
        index_shards: int = DEFAULT_INDEX_SHARDS,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        batch_concurrency: int = DEFAULT_BATCH_CONCURRENCY,
    ) -> None:
        _check(table_name, prefix, gc_ttl, index_shards, connect_timeout, read_timeout,
               batch_concurrency)
        self.table_name = table_name
        self.prefix = prefix
        self.gc_ttl = float(gc_ttl)
        self._client = client
        self._owns_client = client is None
        self._client_pid = os.getpid()
        self._client_args = (endpoint_url, region_name, float(connect_timeout),
                             float(read_timeout), batch_concurrency + 2)
        self._keys = Keys(prefix, index_shards)
        self._tokens = TokenBlocks(self._keys, table_name, self.gc_ttl)
        self._concurrency = batch_concurrency
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def __repr__(self) -> str:
        return f"DynamoDBStore({self.table_name!r}, prefix={self.prefix!r})"

    # -- calls ------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The boto3 DynamoDB client, built on first use (constructors never connect) and
        again in a forked child (the parent's pooled sockets are not the child's to use)."""
        if self._client is None or (self._owns_client and self._client_pid != os.getpid()):
            with self._lock, translated("connect", self.table_name):
                if self._client is None or self._client_pid != os.getpid():
                    self._client = build_client(*self._client_args)
                    self._client_pid = os.getpid()
        return self._client

    def _call(self, what: str, fn: Callable[[Any], _T]) -> _T:
        """``fn(client)`` with every driver error translated at the boundary."""
        with translated(what, self.table_name):
            return fn(self.client)

    def _write(self, method: str, **request: Any) -> dict[str, Any]:
        """A conditional write; a failed condition raises :class:`Refused` with the item as
        it was (one request: ``ReturnValuesOnConditionCheckFailure=ALL_OLD``)."""
        client = self.client
        try:
            answer: dict[str, Any] = getattr(client, method)(
                TableName=self.table_name, ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **request,
            )
            return answer
        except Exception as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            item = getattr(exc, "response", {}).get("Item")
            raise Refused(item, []) from None

    def _transact(self, items: list[dict[str, Any]]) -> None:
        """``TransactWriteItems``; a cancellation raises :class:`Refused` with each item's
        reason code (None where that item's condition held)."""
        for item in items:
            next(iter(item.values()))["TableName"] = self.table_name
        try:
            self.client.transact_write_items(TransactItems=items)
        except Exception as exc:
            if error_code(exc) != "TransactionCanceledException":
                raise
            reasons = getattr(exc, "response", {}).get("CancellationReasons") or []
            codes = [r.get("Code") if r.get("Code") not in (None, "None") else None
                     for r in reasons]
            if not codes or any(c not in _RETRY_REASONS for c in codes if c is not None):
                raise  # throttling, capacity, validation: translated by the caller
            raise Refused(None, codes) from None

    def _parallel(self, fn: Callable[[Any], _T], items: Sequence[Any]) -> list[_T]:
        """``fn`` over ``items`` on up to ``batch_concurrency`` threads, results in order."""
        if len(items) <= 1:
            return [fn(item) for item in items]
        with self._lock:
            if self._pool is None or self._pool_pid != os.getpid():
                self._pool = ThreadPoolExecutor(self._concurrency, "idempotent-tasks-dynamodb")
                self._pool_pid = os.getpid()
            pool = self._pool
        return list(pool.map(fn, items))

    # -- the table ----------------------------------------------------------------------------
    def create_table(self, *, wait_seconds: float = 60.0) -> None:
        """Create the table (on-demand capacity), its ``status-time`` index and its TTL
        attribute if missing; idempotent.  A table of that name with another key schema or
        without the index is refused with :class:`ConfigurationError`."""
        self._call("create_table", lambda c: self._create_table(c, wait_seconds))

    def _create_table(self, client: Any, wait_seconds: float) -> None:
        try:
            client.create_table(**self._table_definition())
        except Exception as exc:
            if error_code(exc) != "ResourceInUseException":
                raise
        deadline = time.monotonic() + wait_seconds
        while True:
            table = client.describe_table(TableName=self.table_name)["Table"]
            if table.get("TableStatus") == "ACTIVE":
                break
            if time.monotonic() > deadline:
                raise ConfigurationError(f"table {self.table_name!r} did not become ACTIVE")
            time.sleep(0.2)  # polling the service for a table coming up
        self._refuse_mismatch(table)
        ttl = client.describe_time_to_live(TableName=self.table_name)["TimeToLiveDescription"]
        if ttl.get("TimeToLiveStatus") in (None, "DISABLED"):
            client.update_time_to_live(
                TableName=self.table_name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": GC},
            )

    def _table_definition(self) -> dict[str, Any]:
        return {
            "TableName": self.table_name,
            "AttributeDefinitions": [
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "gp", "AttributeType": "S"},
                {"AttributeName": "gs", "AttributeType": "N"},
            ],
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "GlobalSecondaryIndexes": [{
                "IndexName": INDEX,
                "KeySchema": [{"AttributeName": "gp", "KeyType": "HASH"},
                              {"AttributeName": "gs", "KeyType": "RANGE"}],
                "Projection": {"ProjectionType": "INCLUDE",
                               "NonKeyAttributes": list(INDEX_ATTRIBUTES)},
            }],
            "BillingMode": "PAY_PER_REQUEST",
        }

    def _refuse_mismatch(self, table: dict[str, Any]) -> None:
        keys = [(k["AttributeName"], k["KeyType"]) for k in table.get("KeySchema", [])]
        indexes = {i["IndexName"]: i for i in table.get("GlobalSecondaryIndexes", [])}
        problems = []
        if keys != [("pk", "HASH")]:
            problems.append(f"key schema is {keys}, expected [('pk', 'HASH')]")
        index = indexes.get(INDEX)
        if index is None:
            problems.append(f"index {INDEX!r} is missing")
        elif [k["AttributeName"] for k in index["KeySchema"]] != ["gp", "gs"]:
            problems.append(f"index {INDEX!r} is not keyed on (gp, gs)")
        if problems:
            raise ConfigurationError(
                f"table {self.table_name!r} exists but does not match DynamoDBStore: "
                f"{'; '.join(problems)}. Use another table, or drop that one."
            )

    def drop_table(self) -> None:
        """Delete the table (tests, clean-up); idempotent."""

        def drop(client: Any) -> None:
            try:
                client.delete_table(TableName=self.table_name)
            except Exception as exc:
                if error_code(exc) != "ResourceNotFoundException":
                    raise

        self._call("drop_table", drop)

    def create_schema(self) -> None:
        """``create_table()``: what ``idempotent-tasks migrate`` runs."""
        self.create_table()

    def drop_schema(self) -> None:
        self.drop_table()

    def close(self) -> None:
        """Stop the batch threads; close the client when the store built it."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=True)
        if self._owns_client and self._client is not None:
            close = getattr(self._client, "close", None)
            if callable(close):
                close()
            self._client = None


def _check(
    table: str, prefix: str, gc_ttl: float, shards: int, connect_timeout: float,
    read_timeout: float, concurrency: int,
) -> None:
    if not isinstance(table, str) or not _TABLE_RE.fullmatch(table):
        raise ConfigurationError(f"table_name {table!r}: 3-255 of [A-Za-z0-9_.-]")
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ConfigurationError(f"prefix {prefix!r}: at most 40 of [A-Za-z0-9_.-]")
    if gc_ttl <= 0 or shards < 1 or connect_timeout <= 0 or read_timeout <= 0 or concurrency < 1:
        raise ConfigurationError(
            "gc_ttl, connect_timeout and read_timeout must be > 0; index_shards and "
            "batch_concurrency >= 1"
        )
