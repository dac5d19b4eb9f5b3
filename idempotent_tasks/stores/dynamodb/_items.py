"""DynamoDBStore's items: keys, attribute names, and the conversions to and from records.

Everything that says how a record, a counter or a lock looks in the table lives here, so the
store's modules speak in primitives and the layout is written once (``__init__``'s spec
sheet shows it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any, Final

from ..._core.errors import StoreUnavailableError
from ..._core.records import Scope, Status, StoredRecord

#: The global secondary index maintenance reads (``gp`` = partition, ``gs`` = sort).
INDEX: Final = "status-time"
#: Record attributes the index carries (everything but the response).
INDEX_ATTRIBUTES: Final = ("t", "o", "k", "st", "rh", "tk", "ca", "ua", "le", "ex")
#: The DynamoDB TTL attribute (epoch seconds by AWS's clock): garbage collection only.
GC: Final = "gc"
_STATUS_TAG: Final = {
    Status.PROCESSING: "P", Status.SUCCESS: "S", Status.FAILED: "F", Status.UNCERTAIN: "U"
}
STATUS: Final[Mapping[str, Status]] = {s.value: s for s in Status}
#: What a tombstone keeps: the key, the scope's last fencing token and the GC time.
TOMBSTONE_REMOVE: Final = "REMOVE t, o, k, st, rh, rs, ca, ua, le, ex, gp, gs"
OWNED: Final = "st = :processing AND tk = :token"
LEASE_EXPIRED: Final = " AND (attribute_not_exists(le) OR le <= :now)"


def n(value: float | int) -> dict[str, str]:
    """A DynamoDB number; ``repr`` is the shortest exact form of a float."""
    return {"N": repr(value) if isinstance(value, float) else str(value)}


def s(value: str) -> dict[str, str]:
    return {"S": value}


class Keys:
    """The key of every item of one store (``prefix`` namespaces several stores in a table)."""

    def __init__(self, prefix: str, shards: int) -> None:
        self.prefix = prefix
        self.shards = shards
        self.tokens = {"pk": s(f"{prefix}#T")}

    def digest(self, scope: Scope) -> str:
        """First 32 hex digits of SHA-256 of the length-prefixed (collision-free) scope."""
        raw = scope.encoded().encode("utf-8", "surrogatepass")
        return hashlib.sha256(raw).hexdigest()[:32]

    def record(self, digest: str) -> dict[str, Any]:
        return {"pk": s(f"{self.prefix}#R#{digest}")}

    def counter(self, digest: str) -> dict[str, Any]:
        return {"pk": s(f"{self.prefix}#C#{digest}")}

    def lock(self, name: str) -> dict[str, Any]:
        return {"pk": s(f"{self.prefix}#L#{name}")}

    def shard(self, digest: str) -> int:
        return int(digest[:4], 16) % self.shards

    def partition(self, tag: str, shard: int) -> str:
        """An index partition: ``<prefix>#P#<shard>`` (PROCESSING, sorted by ``updated_at``),
        ``#S#``/``#F#`` (SUCCESS/FAILED, sorted by ``expires_at``), ``#U#`` (UNCERTAIN,
        sorted by ``updated_at``), ``#C#`` (counters, sorted by their last change)."""
        return f"{self.prefix}#{tag}#{shard}"

    def status_partition(self, status: Status, digest: str) -> dict[str, str]:
        return s(self.partition(_STATUS_TAG[status], self.shard(digest)))

    def partitions(self, tag: str) -> list[str]:
        return [self.partition(tag, i) for i in range(self.shards)]

    def record_prefix(self) -> str:
        return f"{self.prefix}#R#"


def gc_at(seconds_from_now: float, gc_ttl: float) -> dict[str, str]:
    """The TTL attribute: ``gc_ttl`` past the logical end, by the wall clock (AWS deletes by
    its own clock, so a relative lifetime survives a handler clock that is not wall time)."""
    return {"N": str(int(time.time() + max(seconds_from_now, 0.0) + gc_ttl))}


def scope_attrs(scope: Scope) -> dict[str, Any]:
    return {"t": s(scope.tenant), "o": s(scope.operation), "k": s(scope.key)}


def claim_item(
    keys: Keys, scope: Scope, digest: str, request_hash: str, token: int, now: float,
    lease: float, gc_ttl: float,
) -> dict[str, Any]:
    """A fresh PROCESSING record, owned by ``token``."""
    return {
        **keys.record(digest), **scope_attrs(scope),
        "st": s(Status.PROCESSING.value), "rh": s(request_hash), "tk": n(token),
        "ca": n(now), "ua": n(now), "le": n(lease),
        "gp": keys.status_partition(Status.PROCESSING, digest), "gs": n(now),
        GC: gc_at(lease - now, gc_ttl),
    }


def num(item: Mapping[str, Any], name: str) -> float | None:
    value = item.get(name)
    return None if value is None else float(value["N"])


def is_record(item: Mapping[str, Any] | None) -> bool:
    """A live or finished record (a tombstone has no status)."""
    return item is not None and "st" in item


def record(scope: Scope, item: Mapping[str, Any]) -> StoredRecord:
    """The StoredRecord of a record item, checking that it is this scope's (a digest
    collision must never serve another scope's record)."""
    if (item["t"]["S"], item["o"]["S"], item["k"]["S"]) != tuple(scope):
        raise StoreUnavailableError("dynamodb store: two scopes share a digest")
    response = item.get("rs")
    return StoredRecord(
        scope=scope,
        status=STATUS[item["st"]["S"]],
        request_hash=item["rh"]["S"],
        response=None if response is None else bytes(response["B"]),
        fencing_token=int(item["tk"]["N"]),
        created_at=float(item["ca"]["N"]),
        updated_at=float(item["ua"]["N"]),
        lease_expires_at=num(item, "le"),
        expires_at=num(item, "ex"),
    )


def scoped_record(item: Mapping[str, Any]) -> StoredRecord:
    return record(Scope(item["t"]["S"], item["o"]["S"], item["k"]["S"]), item)


def live(rec: StoredRecord, now: float) -> bool:
    """Not expired: a record whose ``expires_at`` passed counts as absent."""
    return rec.expires_at is None or rec.expires_at > now
