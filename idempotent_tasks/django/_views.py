"""Which Django requests the middleware protects: the ``ROUTES`` setting, and per-view
decorators the way Django's own ``csrf_exempt`` works.

* ``@idempotency_exempt`` — never protected, whatever ``ROUTES`` says.
* ``@idempotent_view(...)`` — protected on its methods (default POST, PUT, PATCH, DELETE)
  even when ``ROUTES`` does not list it, with its own options on top of the middleware's.
  Its operation is ``operation=`` when given, else the ``ROUTES`` operation of the request
  when one matches, else ``"METHOD /<the URL pattern>"`` (``"POST /orders/<int:pk>/"``), so
  every order id shares one operation and the key is what tells requests apart.
* Otherwise ``ROUTES`` decides (path templates ``"/orders/{id}"``, ``("POST",
  "/orders/{id}")`` or :class:`~idempotent_tasks.http.Route`; default: every unsafe method
  on every path, the operation being ``"METHOD /concrete/path"``).

The view is found with Django's own ``resolve()`` of ``request.path_info`` (and
``request.urlconf``), only for requests a decorator could change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.urls import Resolver404, resolve

from ..http._routes import (
    UNSAFE_METHODS,
    RouteMatch,
    RouteSettings,
    RouteTable,
    StatusPolicy,
    as_predicate,
)

_ATTRIBUTE: Final = "idempotency_view"
_EXEMPT: Final = "exempt"
V = TypeVar("V", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class ViewOptions:
    """What ``@idempotent_view`` declares (``None``: the middleware's)."""

    operation: str | None
    methods: frozenset[str]
    require_key: bool | None
    status_map: Mapping[str, int] | None
    permanent: StatusPolicy | None


def _marked(view: V, mark: object) -> V:
    """A wrapper of ``view`` carrying ``mark`` (the original is left untouched), sync or
    async like the view."""
    if iscoroutinefunction(view):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await view(*args, **kwargs)

        wrapper: Any = markcoroutinefunction(functools.wraps(view)(async_wrapper))
    else:

        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return view(*args, **kwargs)

        wrapper = functools.wraps(view)(sync_wrapper)
    setattr(wrapper, _ATTRIBUTE, mark)
    return wrapper  # type: ignore[no-any-return]


def idempotency_exempt(view: V) -> V:
    """Never protect this view (e.g. a webhook that deduplicates by its own event ids)."""
    return _marked(view, _EXEMPT)


def idempotent_view(
    view: V | None = None,
    *,
    operation: str | None = None,
    methods: Collection[str] = UNSAFE_METHODS,
    require_key: bool | None = None,
    status_map: Mapping[str, int] | None = None,
    permanent: StatusPolicy | None = None,
) -> Any:
    """Protect this view (``@idempotent_view`` or ``@idempotent_view(operation=...)``)."""
    if isinstance(methods, str):
        raise TypeError("methods is a collection of method names, not a string")
    options = ViewOptions(
        operation, frozenset(m.upper() for m in methods), require_key, status_map, permanent
    )

    def decorate(fn: V) -> V:
        return _marked(fn, options)

    return decorate(view) if view is not None else decorate


class Planner:
    """``plan(request)`` → the protected route of a request, or ``None`` (pass through)."""

    def __init__(self, routes: RouteTable) -> None:
        self.routes = routes

    def plan(self, request: Any) -> RouteMatch | None:
        method = str(request.method).upper()
        path = str(request.path_info)
        match = self.routes.match(method, path)
        if match is None and method not in UNSAFE_METHODS:
            return None  # no decorator protects a safe method by default: skip resolving
        found = _view_of(request, path)
        mark = None if found is None else getattr(found.func, _ATTRIBUTE, None)
        if mark == _EXEMPT:
            return None
        if not isinstance(mark, ViewOptions):
            return match
        if method not in mark.methods:
            return None
        return self._decorated(method, found, match, mark)

    def _decorated(
        self, method: str, found: Any, match: RouteMatch | None, mark: ViewOptions
    ) -> RouteMatch:
        base = match.settings if match is not None else self.routes.defaults
        if self.routes.protect_all:
            match = None  # "every unsafe method": name the operation after the URL pattern
        status_map = {**base.status_map, **dict(mark.status_map or {})}
        settings = RouteSettings(
            require_key=base.require_key if mark.require_key is None else mark.require_key,
            status_map=status_map,
            permanent=base.permanent if mark.permanent is None else as_predicate(mark.permanent),
            policies=base.policies,
        )
        template = match.template if match is not None else "/" + str(found.route or "")
        operation = mark.operation or (
            match.operation if match is not None else f"{method} {template}"
        )
        params = match.path_params if match is not None else {
            k: str(v) for k, v in found.kwargs.items()
        }
        return RouteMatch(operation, template, params, settings)


def _view_of(request: Any, path: str) -> Any:
    try:
        return resolve(path, getattr(request, "urlconf", None))
    except Resolver404:
        return None


__all__ = ["Planner", "ViewOptions", "idempotency_exempt", "idempotent_view"]
