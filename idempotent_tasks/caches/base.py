"""The optional cache contract: a fast path for replays of SUCCESS records.

A cache only ever holds finished, successful results; the store stays the source of truth.
Every cache failure is swallowed by the handler (counted and logged), so a cache can only
help.  Implementations may raise anything on failure; they never need to translate errors.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Cache(Protocol):
    #: Label for metrics and logs.
    name: str

    def get(self, key: str) -> bytes | None:
        ...

    def set(self, key: str, value: bytes, ttl: float) -> None:
        """Store ``value`` for ``ttl`` seconds."""
        ...

    def delete(self, key: str) -> None:
        ...
