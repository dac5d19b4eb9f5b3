"""DynamoDBStore's recorded steps and UNCERTAIN status (``stores.effects``).

The steps are the ``steps`` binary attribute of the scope's counter item, so every write
that deletes the counter (replacing an expired record, ``reopen``, ``reset_retry_count``,
the purge of stale counters) removes them, and counting an attempt (an update of the
counter) keeps them.  ``save_steps`` is one ``TransactWriteItems``: a ``ConditionCheck`` of
the record (PROCESSING with the caller's token) and the counter's ``Update`` — a takeover
that commits first makes the check fail and nothing is written.

An UNCERTAIN record has no lease, no expiry and no TTL attribute: it waits for an operator
in the index partition ``<prefix>#U#<shard>`` (sorted by ``updated_at``), which recovery
and the purge never query.  Marking it also removes its counter's TTL attribute (in the
same transaction), so DynamoDB never collects the recorded steps while it waits; once the
record is resolved and gone, the counter is purged by ``delete_expired`` like any counter
without a record.
"""

from __future__ import annotations

from typing import Any

from ..._core.errors import StoreUnavailableError
from ..._core.records import Scope, Status
from ..effects import Resolution
from ._items import GC, OWNED, TOMBSTONE_REMOVE, gc_at, n, s, scope_attrs
from ._maintenance import DynamoDBMaintenance
from ._plumbing import ATTEMPTS, FAILED_CHECK, Refused

_UNCERTAIN_CHECK = "st = :uncertain"


class DynamoDBEffects(DynamoDBMaintenance):
    """The ``StepStore`` and ``UncertainStore`` halves of :class:`DynamoDBStore`."""

    # -- steps ---------------------------------------------------------------------------------
    def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool:
        digest = self._keys.digest(scope)
        check = {"ConditionCheck": {
            "Key": self._keys.record(digest), "ConditionExpression": OWNED,
            "ExpressionAttributeValues": {":processing": s(Status.PROCESSING.value),
                                          ":token": n(token)},
        }}
        values = {**{f":{k}": v for k, v in scope_attrs(scope).items()},
                  ":steps": {"B": steps}, ":zero": n(0), ":now": n(now),
                  ":cp": s(self._keys.partition("C", self._keys.shard(digest))),
                  ":cgc": gc_at(0.0, self.gc_ttl)}
        update = {"Update": {  # a counter made here starts at 0, indexed like a counted one
            "Key": self._keys.counter(digest),
            "UpdateExpression": "SET steps = :steps, n = if_not_exists(n, :zero), "
                                "ua = if_not_exists(ua, :now), gs = if_not_exists(gs, :now), "
                                f"t = :t, o = :o, k = :k, gp = :cp, {GC} = :cgc",
            "ExpressionAttributeValues": values,
        }}
        return self._call("save_steps", lambda _: self._fenced("save_steps", [check, update]))

    def _fenced(self, what: str, items: list[dict[str, Any]]) -> bool:
        """Commit ``items`` (the first one the record's condition); False when that condition
        failed, again after a conflict with another transaction."""
        for _attempt in range(ATTEMPTS):
            try:
                self._transact(items)
            except Refused as refused:
                if refused.reasons and refused.reasons[0] == FAILED_CHECK:
                    return False
                continue
            return True
        raise StoreUnavailableError(f"dynamodb store: {what} kept racing concurrent writers")

    def load_steps(self, scope: Scope) -> bytes | None:
        key = self._keys.counter(self._keys.digest(scope))

        def run(client: Any) -> bytes | None:
            item = client.get_item(TableName=self.table_name, Key=key, ConsistentRead=True,
                                   ProjectionExpression="steps").get("Item")
            return None if not item or "steps" not in item else bytes(item["steps"]["B"])

        return self._call("load_steps", run)

    # -- UNCERTAIN ------------------------------------------------------------------------------
    def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool:
        digest = self._keys.digest(scope)
        values: dict[str, Any] = {":processing": s(Status.PROCESSING.value), ":token": n(token),
                  ":uncertain": s(Status.UNCERTAIN.value), ":now": n(now),
                  ":gp": self._keys.status_partition(Status.UNCERTAIN, digest)}
        update, gone = "SET st = :uncertain, ua = :now, gp = :gp, gs = :now", f"le, ex, {GC}"
        if detail is None:
            gone += ", rs"
        else:
            values[":rs"] = {"B": detail}
            update += ", rs = :rs"
        record = {"Update": {"Key": self._keys.record(digest), "ConditionExpression": OWNED,
                             "UpdateExpression": f"{update} REMOVE {gone}",
                             "ExpressionAttributeValues": values}}
        counter = {"Update": {"Key": self._keys.counter(digest),
                              "ConditionExpression": "attribute_exists(n)",
                              "UpdateExpression": f"REMOVE {GC}"}}

        def run(_: Any) -> bool:
            for _attempt in range(ATTEMPTS):
                try:  # the common case: a counted attempt (or steps) left a counter
                    self._transact([record, counter])
                except Refused as refused:
                    if refused.reasons and refused.reasons[0] == FAILED_CHECK:
                        return False
                    if len(refused.reasons) > 1 and refused.reasons[1] == FAILED_CHECK:
                        return self._update_record(record["Update"])  # no counter to keep
                    continue
                return True
            raise StoreUnavailableError("dynamodb store: mark_uncertain kept racing concurrent "
                                        "writers")

        return self._call("mark_uncertain", run)

    def _update_record(self, update: dict[str, Any]) -> bool:
        """One conditional ``UpdateItem`` of the request a transaction item describes."""
        request = {k: v for k, v in update.items() if k != "TableName"}
        try:
            self._write("update_item", **request)
        except Refused:
            return False
        return True

    def resolve_uncertain(
        self,
        scope: Scope,
        *,
        resolution: Resolution,
        now: float,
        response: bytes | None = None,
        expires_at: float | None = None,
    ) -> bool:
        """One conditional ``UpdateItem`` on an UNCERTAIN record: settled as SUCCESS/FAILED
        (indexed and collected as any finished record), or a tombstone for ``retry`` (it
        keeps the token; the counter and its steps stay for the next attempt)."""
        digest = self._keys.digest(scope)
        values: dict[str, Any] = {":uncertain": s(Status.UNCERTAIN.value)}
        if resolution == "retry":
            values[":gc"] = gc_at(0.0, self.gc_ttl)
            update = f"{TOMBSTONE_REMOVE} SET {GC} = :gc"
        else:
            update = self._settle(digest, resolution, now, response, expires_at, values)
        request = {"Key": self._keys.record(digest), "ConditionExpression": _UNCERTAIN_CHECK,
                   "UpdateExpression": update, "ExpressionAttributeValues": values}
        return self._call("resolve_uncertain", lambda _: self._update_record(request))

    def _settle(
        self, digest: str, resolution: Resolution, now: float, response: bytes | None,
        expires_at: float | None, values: dict[str, Any],
    ) -> str:
        """The update (its values added to ``values``) of a ``done``/``fail`` resolution:
        a finished record's attributes, its index partition and TTL ("fail" keeps the
        detail as its response)."""
        status = Status.SUCCESS if resolution == "done" else Status.FAILED
        end = now if expires_at is None else expires_at
        values.update({":st": s(status.value), ":now": n(now), ":end": n(end),
                       ":gp": self._keys.status_partition(status, digest),
                       ":gc": gc_at(end - now, self.gc_ttl)})
        update = f"SET st = :st, ua = :now, gp = :gp, gs = :end, {GC} = :gc"
        if expires_at is not None:
            update += ", ex = :end"
        if resolution != "done":
            return update
        if response is None:
            return update + " REMOVE rs"
        values[":rs"] = {"B": response}
        return update + ", rs = :rs"

__all__ = ["DynamoDBEffects"]
