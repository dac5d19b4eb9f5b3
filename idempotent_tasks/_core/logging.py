"""Logging the way a library should: structlog over the stdlib logger ``idempotent_tasks``.

Levels and handlers follow the application's ``logging`` setup and nothing is printed unless
the application asks; the library never calls ``structlog.configure()``.  Any object with
structlog-style ``debug/info/warning/error(event, **fields)`` methods can replace it, and
:func:`create_logger_adapter` bridges a plain ``fn(level, message, fields)``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Literal, Protocol

LOGGER_NAME = "idempotent_tasks"

# The stdlib's advice for libraries: a NullHandler, so that nothing reaches stderr through
# logging's last-resort handler unless the application configures logging.
logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())

Level = Literal["debug", "info", "warning", "error"]


class Logger(Protocol):
    def debug(self, event: str, **fields: Any) -> Any: ...
    def info(self, event: str, **fields: Any) -> Any: ...
    def warning(self, event: str, **fields: Any) -> Any: ...
    def error(self, event: str, **fields: Any) -> Any: ...


def _to_stdlib(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """Final processor: the event name plus ``key=value`` pairs as the message, and the raw
    fields under ``extra["idempotency"]`` for structured handlers."""
    event = event_dict.pop("event", "")
    event_dict.pop("level", None)
    rendered = " ".join(f"{k}={v!r}" for k, v in event_dict.items())
    return {
        "msg": f"{event} {rendered}" if rendered else str(event),
        "extra": {"idempotency_event": event, "idempotency": dict(event_dict)},
    }


class _GatedLogger:
    """structlog over the stdlib logger, asking the stdlib level first.

    ``isEnabledFor`` is a cached dict look-up in the stdlib, so a disabled level (debug, in
    most production setups) costs a method call on the hot path, not a processor chain.
    """

    def __init__(self, std: logging.Logger) -> None:
        self._std = std
        #: Whether ``debug`` would log (the stdlib's cached check): callers on the hot path
        #: skip building its fields when it would not.
        self.debug_enabled: Callable[[], bool] = functools.partial(std.isEnabledFor, logging.DEBUG)
        import structlog  # here, not at import: importing the package stays cheap

        self._bound: Any = structlog.wrap_logger(
            std,
            processors=[structlog.stdlib.filter_by_level, _to_stdlib],
            wrapper_class=structlog.stdlib.BoundLogger,
            context_class=dict,
            cache_logger_on_first_use=True,
        )


    def debug(self, event: str, **fields: Any) -> None:
        if self._std.isEnabledFor(logging.DEBUG):
            self._bound.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        if self._std.isEnabledFor(logging.INFO):
            self._bound.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        if self._std.isEnabledFor(logging.WARNING):
            self._bound.warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        if self._std.isEnabledFor(logging.ERROR):
            self._bound.error(event, **fields)


def default_logger() -> Logger:
    return _GatedLogger(logging.getLogger(LOGGER_NAME))


class _AdapterLogger:
    def __init__(self, fn: Callable[[Level, str, Mapping[str, Any]], None]) -> None:
        self._fn = fn

    def debug(self, event: str, **fields: Any) -> None:
        self._fn("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._fn("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._fn("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._fn("error", event, fields)


def create_logger_adapter(fn: Callable[[Level, str, Mapping[str, Any]], None]) -> Logger:
    """Bridge ``fn(level, message, fields)`` (level: debug/info/warning/error) to a logger."""
    return _AdapterLogger(fn)
