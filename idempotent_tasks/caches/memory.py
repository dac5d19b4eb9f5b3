"""A bounded, thread-safe, in-process LRU cache with per-entry expiry.

Replays served from here cost no store round trip.  Entries expire by ``clock`` (the
handler's clock is used when the cache is handed to a handler without one of its own), and
the least recently used entry is evicted beyond ``max_entries``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from .._core.errors import ConfigurationError

DEFAULT_MAX_ENTRIES = 10_000


class MemoryCache:
    name = "memory"
    #: Never blocks (a dict under a lock): the async path calls it inline, on the loop.
    in_process = True

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if max_entries < 1:
            raise ConfigurationError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.clock: Callable[[], float] = clock or time.time
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[1] <= self.clock():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def set(self, key: str, value: bytes, ttl: float) -> None:
        with self._lock:
            self._entries[key] = (value, self.clock() + ttl)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def delete(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
