"""AsyncRedisStore's maintenance and operator scans: the same index walks and scripts as
RedisStore's (``stores/redis/_maintenance.py``), awaited."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..._core.records import Status, StoredRecord
from ..redis._client import unavailable
from ..redis._plumbing import SCAN_CHUNK
from ..redis._records import FIELDS, record, scope_of
from ._plumbing import AsyncRedisPlumbing


class AsyncRedisMaintenance(AsyncRedisPlumbing):
    """The maintenance and operator half of AsyncRedisStore."""

    async def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        """Candidates from each shard's processing index in lease-expiry order, each re-read
        and kept only if its own fields say it is stuck; oldest ``updated_at`` first."""
        if limit <= 0:
            return []
        try:
            found = await self._scan_stuck(now, heartbeat_before, limit)
        except self._errors as exc:
            raise unavailable("find_stuck", exc) from exc
        found.sort(key=lambda r: r.updated_at)
        return found[:limit]

    async def _scan_stuck(
        self, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        page = max(limit, 100)
        offsets = dict.fromkeys(self._shards, 0)
        found: list[StoredRecord] = []
        while offsets and len(found) < limit:
            commands = [
                ("ZRANGEBYSCORE", self._shards[s].processing, "-inf", now, "LIMIT", off, page)
                for s, off in offsets.items()
            ]
            pages = dict(zip(offsets, await self._pipeline(commands), strict=True))
            for shard, members in pages.items():
                kept, dropped = await self._check_stuck(shard, members, now, heartbeat_before)
                found += kept
                offsets[shard] += len(members) - dropped
                if len(members) < page:
                    del offsets[shard]
        return found

    async def _check_stuck(
        self, shard: str, members: Sequence[bytes], now: float, heartbeat_before: float | None
    ) -> tuple[list[StoredRecord], int]:
        kept: list[StoredRecord] = []
        dropped = 0
        base, processing = self._shards[shard].base, self._shards[shard].processing
        rows = await self._read_records(base, members)
        for member, v in zip(members, rows, strict=True):
            if v[0] != b"PROCESSING" or (v[6] and float(v[6]) > now):
                record_key = f"{base}{member.decode()}:r"
                await self._eval("prune_processing", (record_key, processing), ())
                dropped += 1
                continue
            found = record(scope_of(v), v)
            if heartbeat_before is None or found.updated_at < heartbeat_before:
                kept.append(found)
        return kept, dropped

    async def _read_records(self, base: str, members: Sequence[bytes]) -> list[Sequence[bytes]]:
        rows: list[Sequence[bytes]] = []
        for i in range(0, len(members), SCAN_CHUNK):
            rows += await self._pipeline(
                [("HMGET", f"{base}{m.decode()}:r", *FIELDS) for m in members[i : i + SCAN_CHUNK]]
            )
        return rows

    async def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        """One purge script per shard that has work (found with one pipelined ``ZCOUNT``
        round), each re-checking every candidate against the record itself."""
        try:
            return await self._purge(now, counters_before, max(limit, 0))
        except self._errors as exc:
            raise unavailable("delete_expired", exc) from exc

    async def _purge(self, now: float, counters_before: float, limit: int) -> int:
        commands: list[tuple[object, ...]] = []
        for s in self._shards.values():
            commands.append(("ZCOUNT", s.finished, "-inf", now))
            commands.append(("ZCOUNT", s.counter_index, "-inf", f"({counters_before!r}"))
        counts = iter(await self._pipeline(commands))
        busy = [s for s in self._shards.values() if next(counts) + next(counts) > 0]
        purged = 0
        for s in busy:
            args = (now, counters_before, limit - purged, max(limit, 1), s.base)
            reply = await self._eval("purge_shard", (s.finished, s.counter_index), args)
            purged += int(reply[0])
        return purged

    async def _all_records(self) -> list[StoredRecord]:
        commands: list[tuple[object, ...]] = []
        for s in self._shards.values():
            commands.append(("ZRANGE", s.processing, 0, -1))
            commands.append(("ZRANGE", s.finished, 0, -1))
        pages = iter(await self._pipeline(commands))
        found: list[StoredRecord] = []
        for s in self._shards.values():
            members = sorted(set(next(pages)) | set(next(pages)))
            for v in await self._read_records(s.base, members):
                if v[0] is not None and v[8] is not None:
                    found.append(record(scope_of(v), v))
        return found

    async def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        try:
            rows = [
                r
                for r in await self._all_records()
                if (status is None or r.status is status)
                and (operation is None or r.scope.operation == operation)
                and (tenant is None or r.scope.tenant == tenant)
            ]
        except self._errors as exc:
            raise unavailable("list_records", exc) from exc
        rows.sort(key=lambda r: (r.created_at, r.scope.tenant, r.scope.operation, r.scope.key))
        return rows[offset : offset + limit]

    async def stats(self) -> Mapping[tuple[str, Status], int]:
        counts: dict[tuple[str, Status], int] = {}
        try:
            for r in await self._all_records():
                k = (r.scope.operation, r.status)
                counts[k] = counts.get(k, 0) + 1
        except self._errors as exc:
            raise unavailable("stats", exc) from exc
        return counts

    async def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        args = (owner, now, now + ttl, self._gc_ms)
        return bool(await self._run("acquire_lock", None, (self._lock_key(name),), args))

    async def release_lock(self, name: str, *, owner: str) -> None:
        await self._run("release_lock", None, (self._lock_key(name),), (owner,))

    def _lock_key(self, name: str) -> str:
        return f"{self.prefix}:{{lock}}:{name}"
