"""DynamoDBStore's primitives: the store contract as conditional writes (see the package
docstring for the item layout and what each call costs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ..._core.errors import StoreUnavailableError
from ..._core.records import CreateOutcome, CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ._effects import DynamoDBEffects
from ._items import (
    GC,
    LEASE_EXPIRED,
    OWNED,
    TOMBSTONE_REMOVE,
    claim_item,
    gc_at,
    is_record,
    live,
    n,
    record,
    s,
    scope_attrs,
)
from ._plumbing import ATTEMPTS, FAILED_CHECK, Refused

#: A record may be written over when there is none (or a tombstone of an older attempt).
_CLAIMABLE: Final = "attribute_not_exists(st) AND (attribute_not_exists(tk) OR tk < :token)"


class DynamoDBStore(DynamoDBEffects):
    """The store contract on one DynamoDB table; see the package docstring."""

    # -- claims -----------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        return self._call("create", lambda _: self._create(scope, request_hash, now,
                                                           lease_expires_at))

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        """One conditional ``PutItem`` per claim, sent in parallel."""
        return self._call("create_many", lambda _: self._parallel(
            lambda c: self._create(c.scope, c.request_hash, now, lease_expires_at), claims))

    def _create(self, scope: Scope, request_hash: str, now: float, lease: float) -> CreateResult:
        digest = self._keys.digest(scope)
        above = 0
        for _ in range(ATTEMPTS):
            token = self._draw(above)
            item = claim_item(self._keys, scope, digest, request_hash, token, now, lease,
                              self.gc_ttl)
            try:
                self._write("put_item", Item=item, ConditionExpression=_CLAIMABLE,
                            ExpressionAttributeValues={":token": n(token)})
                return _created(scope, request_hash, token, now, lease)
            except Refused as refused:
                old = refused.item or {}
            old_token = int(old["tk"]["N"]) if "tk" in old else 0
            if not is_record(old):
                above = old_token  # a tombstone of a newer attempt: draw above it
                continue
            found = record(scope, old)
            if live(found, now):
                return CreateResult(CreateOutcome.DUPLICATE, found)
            replaced = self._replace_expired(scope, digest, found, request_hash, now, lease)
            if replaced is not None:
                return replaced
        raise StoreUnavailableError("dynamodb store: create kept racing concurrent writers")

    def _replace_expired(
        self, scope: Scope, digest: str, old: StoredRecord, request_hash: str, now: float,
        lease: float,
    ) -> CreateResult | None:
        """Replace an expired record and reset its counter, atomically (a transaction: twice
        the write capacity of a claim, and only when cleanup has not purged it yet)."""
        token = self._draw(old.fencing_token)
        item = claim_item(self._keys, scope, digest, request_hash, token, now, lease, self.gc_ttl)
        try:
            self._transact([
                {"Put": {"Item": item, "ConditionExpression": "st = :st AND tk = :old",
                         "ExpressionAttributeValues": {":st": s(old.status.value),
                                                       ":old": n(old.fencing_token)}}},
                {"Delete": {"Key": self._keys.counter(digest)}},
            ])
        except Refused:
            return None  # changed meanwhile: read it again
        return _created(scope, request_hash, token, now, lease)

    def _draw(self, above: int) -> int:
        """A token above a token stored in the table (so one of the store's blocks)."""
        token = self._tokens.draw(self.client, above)
        if token is None:
            raise StoreUnavailableError(
                f"dynamodb store: a stored token ({above}) lies above every token block "
                "(was the token item deleted?)"
            )
        return token

    def get(self, scope: Scope) -> StoredRecord | None:
        key = self._keys.record(self._keys.digest(scope))
        item = self._call("get", lambda c: c.get_item(
            TableName=self.table_name, Key=key, ConsistentRead=True).get("Item"))
        return record(scope, item) if is_record(item) else None

    # -- conditional writes -------------------------------------------------------------------
    def _update(self, what: str, scope: Scope, condition: str, update: str,
                values: dict[str, Any]) -> bool:
        """One conditional ``UpdateItem`` on the scope's record; False when refused."""
        key = self._keys.record(self._keys.digest(scope))

        def run(_: Any) -> bool:
            try:
                self._write("update_item", Key=key, ConditionExpression=condition,
                            UpdateExpression=update, ExpressionAttributeValues=values)
            except Refused:
                return False
            return True

        return self._call(what, run)

    def _owner(self, token: int, now: float | None = None) -> dict[str, Any]:
        values = {":processing": s(Status.PROCESSING.value), ":token": n(token)}
        if now is not None:
            values[":now"] = n(now)
        return values

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        values = {**self._owner(token, now), ":lease": n(lease_expires_at),
                  ":gc": gc_at(lease_expires_at - now, self.gc_ttl)}
        return self._update("heartbeat", scope, OWNED,
                            f"SET le = :lease, ua = :now, gs = :now, {GC} = :gc", values)

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        update, values = self._finish(scope, Status.SUCCESS, token, now, expires_at, response)
        return self._update("mark_success", scope, OWNED, update, values)

    def _finish(
        self, scope: Scope, status: Status, token: int, now: float, expires_at: float,
        response: bytes | None,
    ) -> tuple[str, dict[str, Any]]:
        """The SET of a SUCCESS/FAILED record: indexed by its expiry, GC'd after it."""
        values = {**self._owner(token, now), ":st": s(status.value), ":ex": n(expires_at),
                  ":gp": self._keys.status_partition(status, self._keys.digest(scope)),
                  ":gc": gc_at(expires_at - now, self.gc_ttl)}
        update = f"SET st = :st, ua = :now, ex = :ex, gp = :gp, gs = :ex, {GC} = :gc"
        if response is not None:
            values[":rs"] = {"B": response}
            update += ", rs = :rs"
        return update + " REMOVE le", values

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        """One conditional ``UpdateItem`` per write, sent in parallel."""
        return self._call("mark_success_many", lambda _: self._parallel(
            lambda w: self.mark_success(w.scope, token=w.token, response=w.response, now=now,
                                        expires_at=w.expires_at), writes))

    def mark_failed(
        self,
        scope: Scope,
        *,
        token: int,
        now: float,
        expires_at: float,
        only_if_lease_expired: bool = False,
        response: bytes | None = None,
    ) -> bool:
        update, values = self._finish(scope, Status.FAILED, token, now, expires_at, response)
        condition = OWNED + (LEASE_EXPIRED if only_if_lease_expired else "")
        return self._update("mark_failed", scope, condition, update, values)

    def release(self, scope: Scope, *, token: int) -> bool:
        """The record becomes a tombstone: it keeps only the last fencing token (so the
        scope's next attempt gets a greater one) until the TTL collects it."""
        values = {**self._owner(token), ":gc": gc_at(0.0, self.gc_ttl)}
        return self._update("release", scope, OWNED, f"{TOMBSTONE_REMOVE} SET {GC} = :gc",
                            values)

    # -- counted attempts (transactions) ------------------------------------------------------
    def _count(self, digest: str) -> int:
        item = self.client.get_item(TableName=self.table_name, Key=self._keys.counter(digest),
                                    ConsistentRead=True, ProjectionExpression="n").get("Item")
        return int(item["n"]["N"]) if item else 0

    def _bump(self, scope: Scope, digest: str, seen: int, now: float) -> dict[str, Any]:
        """The counter's increment from ``seen``, conditional on it still being ``seen``."""
        values = {**scope_attrs_values(scope), ":n": n(seen + 1), ":now": n(now),
                  ":cp": {"S": self._keys.partition("C", self._keys.shard(digest))},
                  ":cgc": gc_at(0.0, self.gc_ttl)}
        values[":seen"] = n(seen)
        # a counter made by save_steps starts at 0 (it has n); one never counted has no n
        condition = "n = :seen" if seen else "attribute_not_exists(n) OR n = :seen"
        return {"Update": {
            "Key": self._keys.counter(digest), "ConditionExpression": condition,
            "UpdateExpression": f"SET n = :n, ua = :now, t = :t, o = :o, k = :k, gp = :cp, "
                                f"gs = :now, {GC} = :cgc",
            "ExpressionAttributeValues": values,
        }}

    def _counted(self, what: str, scope: Scope, write: Any) -> Any:
        """Run ``write(digest, seen)`` — a transaction of the record's conditional update and
        the counter's increment — until it commits; None when the record refused (the
        attempt no longer owns the scope: nothing was counted)."""
        digest = self._keys.digest(scope)

        def run(_: Any) -> Any:
            for _attempt in range(ATTEMPTS):
                seen = self._count(digest)
                try:
                    return write(digest, seen)
                except Refused as refused:
                    if refused.reasons and refused.reasons[0] == FAILED_CHECK:
                        return None
            raise StoreUnavailableError(f"dynamodb store: {what} kept racing the counter")

        return self._call(what, run)

    def take_over(
        self,
        scope: Scope,
        *,
        expected_token: int,
        now: float,
        lease_expires_at: float,
    ) -> TakeOver | None:
        def write(digest: str, seen: int) -> TakeOver | None:
            token = self._tokens.draw(self.client, expected_token)
            if token is None:
                return None  # no attempt ever had ``expected_token``: the record cannot
            values = {**self._owner(expected_token, now), ":new": n(token),
                      ":lease": n(lease_expires_at),
                      ":gc": gc_at(lease_expires_at - now, self.gc_ttl)}
            self._transact([
                {"Update": {"Key": self._keys.record(digest),
                            "ConditionExpression": OWNED + LEASE_EXPIRED,
                            "UpdateExpression": "SET tk = :new, le = :lease, ua = :now, "
                                                f"gs = :now, {GC} = :gc",
                            "ExpressionAttributeValues": values}},
                self._bump(scope, digest, seen, now),
            ])
            return TakeOver(seen + 1, token)

        result: TakeOver | None = self._counted("take_over", scope, write)
        return result

    def record_failure(
        self,
        scope: Scope,
        *,
        token: int,
        now: float,
        max_retries: int,
        expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> FailureResult | None:
        condition = OWNED + (LEASE_EXPIRED if only_if_lease_expired else "")

        def write(digest: str, seen: int) -> FailureResult:
            poisoned = seen + 1 >= max_retries
            if poisoned:
                update, values = self._finish(scope, Status.FAILED, token, now, expires_at, None)
            else:  # released: a tombstone (DynamoDB refuses values no expression uses)
                update = f"{TOMBSTONE_REMOVE} SET {GC} = :gc"
                values = {**self._owner(token, now if only_if_lease_expired else None),
                          ":gc": gc_at(0.0, self.gc_ttl)}
            self._transact([
                {"Update": {"Key": self._keys.record(digest), "ConditionExpression": condition,
                            "UpdateExpression": update, "ExpressionAttributeValues": values}},
                self._bump(scope, digest, seen, now),
            ])
            return FailureResult(seen + 1, poisoned=poisoned)

        result: FailureResult | None = self._counted("record_failure", scope, write)
        return result

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None:
        """The settled record of ``expected_token`` to a new attempt (a token drawn as
        ``take_over`` draws one) and its counter deleted, in one ``TransactWriteItems``; a
        transaction that lost a conflict runs again with a fresh token."""
        digest = self._keys.digest(scope)

        def run(_: Any) -> int | None:
            for _attempt in range(ATTEMPTS):
                token = self._tokens.draw(self.client, expected_token)
                if token is None:
                    return None  # no attempt ever had ``expected_token``: the record cannot
                try:
                    self._transact([self._reopened(digest, expected_token, token, now,
                                                   lease_expires_at),
                                    {"Delete": {"Key": self._keys.counter(digest)}}])
                except Refused as refused:
                    if refused.reasons and refused.reasons[0] == FAILED_CHECK:
                        return None
                    continue
                return token
            raise StoreUnavailableError("dynamodb store: reopen kept racing concurrent writers")

        result: int | None = self._call("reopen", run)
        return result

    def _reopened(
        self, digest: str, expected: int, token: int, now: float, lease: float
    ) -> dict[str, Any]:
        """The record's update of a reopen: SUCCESS/FAILED of ``expected`` → PROCESSING."""
        values = {":success": s(Status.SUCCESS.value), ":failed": s(Status.FAILED.value),
                  ":processing": s(Status.PROCESSING.value), ":token": n(expected),
                  ":new": n(token), ":now": n(now), ":lease": n(lease),
                  ":gp": self._keys.status_partition(Status.PROCESSING, digest),
                  ":gc": gc_at(lease - now, self.gc_ttl)}
        return {"Update": {
            "Key": self._keys.record(digest),
            "ConditionExpression": "(st = :success OR st = :failed) AND tk = :token",
            "UpdateExpression": "SET st = :processing, tk = :new, ca = :now, ua = :now, "
                                f"le = :lease, gp = :gp, gs = :now, {GC} = :gc REMOVE rs, ex",
            "ExpressionAttributeValues": values,
        }}

    def get_retry_count(self, scope: Scope) -> int:
        digest = self._keys.digest(scope)
        return self._call("get_retry_count", lambda _: self._count(digest))


def scope_attrs_values(scope: Scope) -> dict[str, Any]:
    return {f":{name}": value for name, value in scope_attrs(scope).items()}


def _created(scope: Scope, request_hash: str, token: int, now: float, lease: float
             ) -> CreateResult:
    return CreateResult(CreateOutcome.CREATED,
                        StoredRecord.claimed(scope, request_hash, token, now, lease))
