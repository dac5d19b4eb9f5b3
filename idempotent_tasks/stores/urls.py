"""Build a store from a URL: one string that the CLI, the demo and integrations all accept.

Operators configure a store with a single setting (``--store`` / ``IDEMPOTENT_TASKS_STORE``),
so the scheme alone decides the backend:

* ``sqlite:///path.db``, ``postgresql://…``, ``postgresql+psycopg://…``, ``postgres://…``,
  ``mysql://…``, ``mysql+pymysql://…``, ``mariadb+pymysql://…``
  → :class:`~idempotent_tasks.SQLStore` (``table_prefix=``);
* ``dynamodb://TABLE[?region=…&endpoint_url=…]`` → :class:`~idempotent_tasks.DynamoDBStore`
  (``prefix=`` namespaces the store's items inside the table);
* ``redis://…``, ``rediss://…``, ``unix://…``, ``redis+cluster://…``
  → :class:`~idempotent_tasks.RedisStore` (``prefix=``);
* ``memory://`` → a fresh :class:`~idempotent_tasks.MemoryStore`; ``memory://NAME`` → the
  process-wide memory store called NAME, so that several components of one process (a demo,
  a test) share it.  Nothing survives the process.

``table_prefix`` and ``prefix`` are synonyms: each is passed on under the name the chosen
store expects, so one ``--prefix`` setting works whatever the backend.  Like the store
constructors themselves, nothing here connects: a URL pointing at a dead server builds fine
and fails with ``STORE_UNAVAILABLE`` on first use.
"""

from __future__ import annotations

import threading
from typing import Any

from .._core.errors import ConfigurationError
from .base import Store
from .memory import MemoryStore

SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb")
DYNAMODB_SCHEME = "dynamodb"
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster")
MEMORY_SCHEME = "memory"

_NAMED_MEMORY: dict[str, MemoryStore] = {}
_NAMED_LOCK = threading.Lock()


def url_scheme(url: str) -> str:
    """The scheme without a driver suffix: ``postgresql+psycopg`` → ``postgresql``.

    ``redis+cluster`` keeps its suffix: it names a different client, not a driver.
    """
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise ConfigurationError(
            f"not a store URL: {redact_url(url)!r} "
            "(expected e.g. sqlite:///idempotency.db, postgresql+psycopg://…, redis://…, memory://)"
        )
    scheme = scheme.lower()
    if scheme == "redis+cluster":
        return scheme
    return scheme.split("+", 1)[0]


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``: safe to print and log."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, path = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{path}"


def _prefix_option(opts: dict[str, Any], name: str) -> dict[str, Any]:
    """Accept ``table_prefix`` or ``prefix`` and pass it on as ``name``; ``None`` = default."""
    table_prefix = opts.pop("table_prefix", None)
    prefix = opts.pop("prefix", None)
    if table_prefix is not None and prefix is not None and table_prefix != prefix:
        raise ConfigurationError("table_prefix and prefix are synonyms; give one of them")
    value = table_prefix if table_prefix is not None else prefix
    if value is not None:
        opts[name] = value
    return opts


def _memory_store(url: str, opts: dict[str, Any]) -> MemoryStore:
    # Settings that mean nothing in memory are accepted, so one configuration fits all URLs.
    for name in ("table_prefix", "prefix", "connect_timeout"):
        opts.pop(name, None)
    if opts:
        raise ConfigurationError(f"memory:// takes no options (got {sorted(opts)})")
    name = url.partition("://")[2].strip("/")
    if not name:
        return MemoryStore()
    with _NAMED_LOCK:
        store = _NAMED_MEMORY.get(name)
        if store is None:
            store = _NAMED_MEMORY[name] = MemoryStore()
        return store


def _sql_store(url: str, opts: dict[str, Any]) -> Store:
    from .. import SQLStore

    sql: Store = SQLStore(url, **_prefix_option(opts, "table_prefix"))
    return sql


def _redis_store(url: str, opts: dict[str, Any]) -> Store:
    from .. import RedisStore

    redis: Store = RedisStore(url, **_prefix_option(opts, "prefix"))
    return redis


def _dynamodb_store(url: str, opts: dict[str, Any]) -> Store:
    from urllib.parse import parse_qs, urlsplit

    from .. import DynamoDBStore

    parts = urlsplit(url)
    table = parts.netloc or parts.path.strip("/")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"region", "region_name", "endpoint_url"}
    if unknown:
        raise ConfigurationError(
            f"dynamodb:// takes region and endpoint_url, not {sorted(unknown)}"
        )
    opts = _prefix_option(opts, "prefix")
    dynamo: Store = DynamoDBStore(
        table, endpoint_url=query.get("endpoint_url"),
        region_name=query.get("region") or query.get("region_name"), **opts,
    )
    return dynamo


def store_from_url(url: str, **opts: Any) -> Store:
    """The store a URL names (see the module docstring), built without connecting.

    ``opts`` go to the store's constructor (``table_prefix``/``prefix``, ``connect_timeout``,
    …); ``None`` values mean "the store's default".  An unknown scheme, a bad option or a
    missing driver raises :class:`~idempotent_tasks.ConfigurationError` naming the fix.
    """
    scheme = url_scheme(url)
    clean = {k: v for k, v in opts.items() if v is not None}
    if scheme == MEMORY_SCHEME:
        return _memory_store(url, clean)
    if scheme in SQL_SCHEMES:
        build = _sql_store
    elif scheme in REDIS_SCHEMES:
        build = _redis_store
    elif scheme == DYNAMODB_SCHEME:
        build = _dynamodb_store
    else:
        raise ConfigurationError(
            f"unknown store URL scheme {scheme!r} in {redact_url(url)!r}: use sqlite://, "
            "postgresql://, mysql+pymysql://, redis://, dynamodb:// or memory://"
        )
    try:
        return build(url, clean)
    except ImportError as exc:
        raise ConfigurationError(str(exc)) from exc
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot build a store from {redact_url(url)!r}: {exc}") from exc


__all__ = ["redact_url", "store_from_url", "url_scheme"]
