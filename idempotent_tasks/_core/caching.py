"""The optional cache in front of the store: SUCCESS records only, failures swallowed.

An entry is ``<request_hash>\n<stored response>`` (the store's form: with the traceparent of
the execution when it was traced); a hash that differs from the call's is left to the store,
which is the truth and answers KEY_REUSED.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .answers import replayed
from .commands import CacheGet, CachePut, Command
from .engine import Call, Engine
from .outcome import Outcome
from .records import Status
from .tracing import unwrap

Step = Generator[Command, Any, Any]


def cached(engine: Engine, call: Call) -> Generator[Command, Any, Outcome | None]:
    try:
        entry = yield CacheGet(call.scope.encoded())
    except Exception as exc:
        _cache_failed(engine, "get", exc)
        return None
    if entry is None:
        return None
    stored_hash, _, body = entry.partition(b"\n")
    if len(stored_hash) != 64 or stored_hash.decode("ascii", "replace") != call.request_hash:
        return None  # let the store decide (and answer KEY_REUSED): it is the truth
    encoded, parent = unwrap(body)
    try:
        value = engine.serializer.loads(encoded)
    except Exception:
        return None
    engine.metrics.cache_hit(call.scope.operation)
    engine.metrics.duplicate(call.scope.operation, Status.SUCCESS.value)
    engine.debug("duplicate_replayed", call, status="SUCCESS", source="cache")
    outcome = replayed(call, value, None)
    outcome.replayed_from = parent
    return outcome


def cache_put(engine: Engine, call: Call, encoded: bytes, expires_at: float) -> Step:
    ttl = expires_at - engine.clock()
    if ttl <= 0:
        return
    try:
        yield CachePut(call.scope.encoded(), call.request_hash.encode() + b"\n" + encoded, ttl)
    except Exception as exc:
        _cache_failed(engine, "set", exc)


def _cache_failed(engine: Engine, op: str, exc: Exception) -> None:
    name = getattr(engine.cache, "name", "cache")
    engine.metrics.cache_error(name)
    engine.log.warning("cache_unavailable", cache=name, call=op, error=repr(exc))



__all__ = ["cache_put", "cached"]
