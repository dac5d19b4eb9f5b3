from .base import Cache
from .memory import MemoryCache

__all__ = ["Cache", "MemoryCache"]
