"""The ``outbox`` argument: a Celery task, Dramatiq actor or consumer body that declares a
parameter named ``outbox`` gets the running transaction's outbox as that keyword argument
(as a Celery task declaring ``conn`` gets the connection)."""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable
from typing import Any

from ._staging import current_outbox

PARAMETER = "outbox"
_SEEN: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def wants_outbox(fn: Callable[..., Any]) -> bool:
    """Does ``fn`` declare an ``outbox`` parameter?  (Remembered per function.)"""
    key = getattr(fn, "__func__", fn)
    try:
        return _SEEN[key]
    except (KeyError, TypeError):
        pass
    try:
        wanted = PARAMETER in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        wanted = False
    with contextlib.suppress(TypeError):  # not weak-referenceable: asked again next time
        _SEEN[key] = wanted
    return wanted


def outbox_kwargs(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{"outbox": current_outbox()}`` when ``fn`` asks for it, else ``{}``."""
    return {PARAMETER: current_outbox()} if wants_outbox(fn) else {}


def with_outbox_argument(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with ``outbox=`` added when it declares that parameter."""
    if not wants_outbox(fn):
        return fn

    def called(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs, **{PARAMETER: current_outbox()})

    return called


__all__ = ["PARAMETER", "outbox_kwargs", "wants_outbox", "with_outbox_argument"]
