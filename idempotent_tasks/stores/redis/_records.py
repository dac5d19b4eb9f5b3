"""RedisStore's key layout and the parsing of what its scripts reply."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from ..._core.errors import IdempotencyError
from ..._core.records import CreateOutcome, CreateResult, Scope, Status, StoredRecord

#: Hex digits of the scope digest that pick the shard (2 → 256 shards / hash slots).
SHARD_DIGITS: Final = 2
#: Hex digits of the scope digest used in key names (128 bits).
DIGEST_DIGITS: Final = 32
#: A record's fields, in the order every read asks for them.
FIELDS: Final = ("st", "rh", "rs", "tk", "ca", "ua", "le", "ea", "sc")
_STATUS: Final = {s.value.encode(): s for s in Status}


class Shard:
    """Key names of one shard (all with the shard as hash tag)."""

    __slots__ = ("base", "counter_index", "finished", "processing", "tokens")

    def __init__(self, prefix: str, shard: str) -> None:
        self.base = f"{prefix}:{{{shard}}}:"
        self.processing = f"{self.base}p"  # PROCESSING members scored by lease expiry
        self.finished = f"{self.base}f"  # SUCCESS/FAILED members scored by expires_at
        self.counter_index = f"{self.base}ci"  # counter members scored by their last change
        self.tokens = f"{self.base}t"  # the shard's fencing-token counter (never expires)


def shards(prefix: str) -> dict[str, Shard]:
    names = (f"{i:0{SHARD_DIGITS}x}" for i in range(16**SHARD_DIGITS))
    return {name: Shard(prefix, name) for name in names}


class Keys:
    """Key names of one scope (all with the scope's shard as hash tag), and the scope's
    encoded form, which the record stores and every read compares."""

    __slots__ = (
        "counter",
        "counter_index",
        "encoded",
        "finished",
        "member",
        "processing",
        "record",
        "shard",
        "tokens",
    )

    def __init__(self, scope: Scope, all_shards: dict[str, Shard]) -> None:
        self.encoded = scope.encoded().encode()
        self.member = member = hashlib.sha256(self.encoded).hexdigest()[:DIGEST_DIGITS]
        self.shard = shard = all_shards[member[:SHARD_DIGITS]]
        self.record = f"{shard.base}{member}:r"
        self.counter = f"{shard.base}{member}:c"
        self.processing = shard.processing
        self.finished = shard.finished
        self.counter_index = shard.counter_index
        self.tokens = shard.tokens

    def claim_keys(self) -> tuple[str, str, str, str, str, str]:
        """The six keys ``claim_many.lua`` takes per claim."""
        return (
            self.record, self.counter, self.processing, self.finished, self.counter_index,
            self.tokens,
        )


def _opt(raw: bytes) -> float | None:
    return float(raw) if raw else None


def record(scope: Scope, v: Sequence[bytes]) -> StoredRecord:
    """A record from its fields in ``FIELDS`` order (a flat array: no dict building)."""
    status = _STATUS[v[0]]
    return StoredRecord(
        scope=scope,
        status=status,
        request_hash=v[1].decode(),
        response=v[2] if status is Status.SUCCESS else (v[2] or None),
        fencing_token=int(v[3]),
        created_at=float(v[4]),
        updated_at=float(v[5]),
        lease_expires_at=_opt(v[6]),
        expires_at=_opt(v[7]),
    )


def unpack(scope: Scope, raw: bytes) -> StoredRecord:
    """A record packed by ``claim.lua`` (one bulk string: cheaper to read than an array)."""
    st, tk, ca, ua, le, ea, n, rest = raw.split(b"\n", 7)
    status = _STATUS[st]
    cut = int(n)
    return StoredRecord(
        scope=scope,
        status=status,
        request_hash=rest[:cut].decode(),
        response=rest[cut:] if status is Status.SUCCESS else (rest[cut:] or None),
        fencing_token=int(tk),
        created_at=float(ca),
        updated_at=float(ua),
        lease_expires_at=_opt(le),
        expires_at=_opt(ea),
    )


def scope_of(v: Sequence[bytes]) -> Scope:
    """The scope stored in a record (its ``Scope.encoded()`` form: each part
    length-prefixed, lengths in characters)."""
    text, parts, i = v[8].decode(), [], 0
    for _ in range(3):
        colon = text.index(":", i)
        start = colon + 1
        end = start + int(text[i:colon])
        parts.append(text[start:end])
        i = end + 1
    return Scope(*parts)


def claim_result(
    scope: Scope, item: Any, request_hash: str, now: float, lease: float
) -> CreateResult:
    """CREATED from our own arguments and the token the script drew (``[token]``);
    DUPLICATE from the record's fields returned by the same script call."""
    if isinstance(item, list):
        claimed = StoredRecord.claimed(scope, request_hash, int(item[0]), now, lease)
        return CreateResult(CreateOutcome.CREATED, claimed)
    if item == 0:
        raise IdempotencyError(
            "redis store: scope digest collision (another scope owns this key)",
            tenant=scope.tenant,
            operation=scope.operation,
            key=scope.key,
        )
    return CreateResult(CreateOutcome.DUPLICATE, unpack(scope, item))
