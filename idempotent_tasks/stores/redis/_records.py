"""RedisStore's key layout and the parsing of what its scripts reply."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from ..._core.errors import IdempotencyError
from ..._core.records import (
    CREATED,
    DUPLICATE,
    PROCESSING,
    SUCCESS,
    CreateResult,
    Scope,
    Status,
    StoredRecord,
)

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
        self.finished = f"{self.base}f"  # SUCCESS/FAILED by expires_at, UNCERTAIN at +inf
        self.counter_index = f"{self.base}ci"  # counter members scored by their last change
        self.tokens = f"{self.base}t"  # the shard's fencing-token counter (never expires)


def shards(prefix: str) -> dict[str, Shard]:
    names = (f"{i:0{SHARD_DIGITS}x}" for i in range(16**SHARD_DIGITS))
    return {name: Shard(prefix, name) for name in names}


class Keys:
    """Key names of one scope (all with the scope's shard as hash tag), and the scope's
    encoded form, which the record stores and every read compares."""

    __slots__ = (
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
        self.processing = shard.processing
        self.finished = shard.finished
        self.counter_index = shard.counter_index
        self.tokens = shard.tokens

    @property
    def counter(self) -> str:
        """The retry counter's key (built when asked for: a claim does not need it)."""
        return f"{self.shard.base}{self.member}:c"

    def claim_keys(self) -> tuple[str, str, str, str, str, str]:
        """The six keys ``claim_many.lua`` takes per claim."""
        return (
            self.record, self.counter, self.processing, self.finished, self.counter_index,
            self.tokens,
        )


def record(scope: Scope, v: Sequence[bytes]) -> StoredRecord:
    """A record from its fields in ``FIELDS`` order (a flat array: no dict building)."""
    status = _STATUS[v[0]]
    return StoredRecord(
        scope,
        status,
        v[1].decode(),
        v[2] if status is SUCCESS else (v[2] or None),
        int(v[3]),
        float(v[4]),
        float(v[5]),
        float(v[6]) if v[6] else None,
        float(v[7]) if v[7] else None,
    )


def unpack(scope: Scope, raw: bytes) -> StoredRecord:
    """A record packed by ``claim.lua`` (one bulk string: cheaper to read than an array;
    the replay's hot path, so the record is built positionally)."""
    st, tk, ca, ua, le, ea, n, rest = raw.split(b"\n", 7)
    status = _STATUS[st]
    cut = int(n)
    return StoredRecord(
        scope,
        status,
        rest[:cut].decode(),
        rest[cut:] if status is SUCCESS else (rest[cut:] or None),
        int(tk),
        float(ca),
        float(ua),
        float(le) if le else None,
        float(ea) if ea else None,
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
    if isinstance(item, list):  # StoredRecord.claimed(...), built positionally: the hot path
        token = int(item[0])
        claimed = StoredRecord(scope, PROCESSING, request_hash, None, token, now, now, lease, None)
        return CreateResult(CREATED, claimed)
    if type(item) is int:  # 0: the digest is another scope's
        raise IdempotencyError(
            "redis store: scope digest collision (another scope owns this key)",
            tenant=scope.tenant,
            operation=scope.operation,
            key=scope.key,
        )
    return CreateResult(DUPLICATE, unpack(scope, item))
