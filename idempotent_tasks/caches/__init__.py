from .base import Cache
from .memory import MemoryCache
from .redis import RedisCache

__all__ = ["Cache", "MemoryCache", "RedisCache"]
