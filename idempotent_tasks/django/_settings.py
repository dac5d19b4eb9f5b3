"""``IDEMPOTENT_TASKS`` in ``settings.py``, checked once, and the process's handler.

::

    IDEMPOTENT_TASKS = {
        "DATABASE": "default",        # the alias DjangoStore runs on
        "TTL": 86_400,                # seconds a SUCCESS/FAILED record is kept
        "LEASE_TIMEOUT": 300,         # seconds before a silent attempt counts as crashed
        "MAX_RETRIES": 3,             # failed attempts before a scope is poisoned
        "CACHE": None,                # None, "redis://…", a dotted path or a Cache object
        "HTTP": {"GET_TENANT": "myapp.auth.tenant_of", "ROUTES": [("POST", "/orders/{id}")],
                 "PROFILE": "guide"},
    }

Optional keys: ``HEARTBEAT_INTERVAL``, ``ON_STUCK`` and the per-operation policies
``ON_IN_PROGRESS``, ``WAIT_TIMEOUT``, ``ON_SUCCESS``, ``REUSE_AFTER``, ``ON_FAILURE`` (the
handler's defaults), and ``HANDLER`` — a dotted path to an ``IdempotencyHandler`` (or a
function returning one) to use instead of building one on ``DjangoStore`` (another store,
say Redis); it excludes the handler keys above.  ``HTTP`` also takes ``GET_PAYLOAD``,
``REQUIRE_KEY``, ``STATUS_MAP``, ``PERMANENT``, ``REPLAY_ERRORS``, ``PROBLEM_TYPE_BASE``,
``MAX_RESPONSE_BYTES``, ``REPLAY_HEADERS`` and the five policy keys (the HTTP middlewares'
options of the same names; ``Route(...)`` objects in ``ROUTES`` carry per-route policies).
An unknown key or a bad value is ``ImproperlyConfigured`` naming it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import import_string

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler

SETTING: Final = "IDEMPOTENT_TASKS"
_HANDLER_KEYS: Final = {
    "DATABASE": "database",
    "TTL": "ttl",
    "LEASE_TIMEOUT": "lease_timeout",
    "MAX_RETRIES": "max_retries",
    "CACHE": "cache",
    "HEARTBEAT_INTERVAL": "heartbeat_interval",
    "ON_STUCK": "on_stuck",
    "ON_IN_PROGRESS": "on_in_progress",
    "WAIT_TIMEOUT": "wait_timeout",
    "ON_SUCCESS": "on_success",
    "REUSE_AFTER": "reuse_after",
    "ON_FAILURE": "on_failure",
}
#: The per-operation policies, accepted in both blocks: at the top level the handler's
#: defaults, under ``HTTP`` the middleware's (which win for HTTP requests).
_POLICY_KEYS: Final = ("ON_IN_PROGRESS", "WAIT_TIMEOUT", "ON_SUCCESS", "REUSE_AFTER", "ON_FAILURE")
_KEYS: Final = frozenset({*_HANDLER_KEYS, "HTTP", "HANDLER"})
HTTP_KEYS: Final = {
    "GET_TENANT": "get_tenant",
    "GET_PAYLOAD": "get_payload",
    "ROUTES": "routes",
    "PROFILE": "profile",
    "REQUIRE_KEY": "require_key",
    "STATUS_MAP": "status_map",
    "PERMANENT": "permanent",
    "REPLAY_ERRORS": "replay_errors",
    "PROBLEM_TYPE_BASE": "problem_type_base",
    "MAX_RESPONSE_BYTES": "max_response_bytes",
    "REPLAY_HEADERS": "replay_headers",
    **{name: _HANDLER_KEYS[name] for name in _POLICY_KEYS},
}
_CALLABLE_HTTP_KEYS: Final = frozenset({"GET_TENANT", "GET_PAYLOAD"})

_lock = threading.Lock()
_handler: IdempotencyHandler | None = None


def improperly(where: str, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{SETTING}{where}: {message}")


def raw_settings() -> Mapping[str, Any]:
    """``settings.IDEMPOTENT_TASKS`` (``{}`` when absent), its keys checked."""
    value = getattr(settings, SETTING, {})
    if not isinstance(value, Mapping):
        raise improperly("", f"must be a dict, not {type(value).__name__}")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise improperly("", f"unknown key(s) {unknown}; known: {sorted(_KEYS)}")
    return value


def database_alias() -> str:
    alias = raw_settings().get("DATABASE", DEFAULT_DB_ALIAS)
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        raise improperly("['DATABASE']", f"{alias!r} is not an alias of settings.DATABASES")
    return alias


def resolve(where: str, value: Any) -> Any:
    """A dotted path (``"myapp.auth.tenant_of"``) → the object it names; other values as
    they are."""
    if not isinstance(value, str):
        return value
    try:
        return import_string(value)
    except ImportError as exc:
        raise improperly(where, f"cannot import {value!r}: {exc}") from exc


def get_handler() -> IdempotencyHandler:
    """The process's handler, built once from ``IDEMPOTENT_TASKS`` (a ``DjangoStore`` on
    ``DATABASE``, or the ``HANDLER`` given); ``ImproperlyConfigured`` for a bad setting.
    Tests that change the setting with ``override_settings`` get a fresh one."""
    global _handler
    with _lock:
        if _handler is None:
            _handler = _build_handler(raw_settings())
        return _handler


def forget_handler() -> None:
    """Build the handler again on the next ``get_handler()`` (the setting changed); the old
    one is closed (its heartbeat and executor threads end)."""
    global _handler
    with _lock:
        old, _handler = _handler, None
    close = getattr(old, "close", None)
    if callable(close):
        close()


def _build_handler(config: Mapping[str, Any]) -> IdempotencyHandler:
    if "HANDLER" in config:
        return _given_handler(config)
    from ._store import DjangoStore

    options = {_HANDLER_KEYS[k]: v for k, v in config.items() if k in _HANDLER_KEYS}
    options.pop("database", None)
    options["cache"] = _cache(options.get("cache"))
    try:
        return IdempotencyHandler(DjangoStore(using=database_alias()), **options)
    except ConfigurationError as exc:
        raise improperly("", exc.message) from exc
    except (TypeError, ValueError) as exc:
        raise improperly("", str(exc)) from exc


def _given_handler(config: Mapping[str, Any]) -> IdempotencyHandler:
    clashing = sorted(set(config) & set(_HANDLER_KEYS))
    if clashing:
        raise improperly("['HANDLER']", f"excludes {clashing}: configure that handler itself")
    value = resolve("['HANDLER']", config["HANDLER"])
    if not isinstance(value, IdempotencyHandler) and callable(value):
        value = value()
    if not isinstance(value, IdempotencyHandler):
        raise improperly("['HANDLER']", f"must name an IdempotencyHandler, not {value!r}")
    return value


def _cache(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str) and value.startswith(("redis://", "rediss://", "unix://")):
        from ..caches.redis import RedisCache

        return RedisCache(value)
    cache = resolve("['CACHE']", value)
    if not hasattr(cache, "get") and callable(cache):
        cache = cache()
    if not (callable(getattr(cache, "get", None)) and callable(getattr(cache, "set", None))):
        raise improperly("['CACHE']", f"{value!r} is not a cache (get/set/delete)")
    return cache


def http_options() -> dict[str, Any]:
    """The middleware options from ``IDEMPOTENT_TASKS["HTTP"]`` (callables imported)."""
    http = raw_settings().get("HTTP", {})
    if not isinstance(http, Mapping):
        raise improperly("['HTTP']", f"must be a dict, not {type(http).__name__}")
    unknown = sorted(set(http) - set(HTTP_KEYS))
    if unknown:
        raise improperly("['HTTP']", f"unknown key(s) {unknown}; known: {sorted(HTTP_KEYS)}")
    options: dict[str, Any] = {}
    for name, given in http.items():
        where = f"['HTTP']['{name}']"
        value = given
        if name == "ROUTES" and isinstance(given, list | tuple):  # JSON-ish [["POST", "/x"]]
            value = [tuple(r) if isinstance(r, list) else r for r in given]
        if name in _CALLABLE_HTTP_KEYS or (name == "PERMANENT" and isinstance(given, str)):
            value = resolve(where, given)
            if not callable(value):
                raise improperly(where, f"must be a callable or its dotted path, not {given!r}")
        options[HTTP_KEYS[name]] = value
    return options


__all__ = [
    "HTTP_KEYS",
    "SETTING",
    "database_alias",
    "forget_handler",
    "get_handler",
    "http_options",
    "improperly",
    "raw_settings",
    "resolve",
]
