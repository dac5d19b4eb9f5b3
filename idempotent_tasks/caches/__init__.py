"""Optional caches in front of the store (SUCCESS records only).  ``RedisCache`` needs the
``[redis]`` extra and is imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Cache
from .memory import MemoryCache

if TYPE_CHECKING:
    from .redis import RedisCache


def __getattr__(name: str) -> Any:
    if name == "RedisCache":
        from .redis import RedisCache

        return RedisCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Cache", "MemoryCache", "RedisCache"]
