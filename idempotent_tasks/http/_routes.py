"""Which requests are protected, and under which operation name.

The middleware runs *before* the framework's router, so it matches path templates itself.
The syntax is the common subset of Starlette/FastAPI and Flask-style templates, kept small
on purpose:

* ``{name}`` matches one non-empty path segment (no ``/``); ``{name:str}`` is the same;
* ``{name:int}`` matches digits only;
* ``{name:path}`` matches the rest of the path, slashes included;
* everything else is literal and matched exactly (a trailing slash is significant).

Routes are tried in the order given; the first that matches wins.  The operation is
``"METHOD /template"`` (e.g. ``"POST /payments/{id}"``), so one key used on two routes, or
with two methods, is two independent scopes.  Without ``routes`` every unsafe method on every
path is protected and the operation is ``"METHOD /concrete/path"``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._core.errors import ConfigurationError
from .._core.policies import given_policies
from ..typing import OnFailure, OnInProgress, OnSuccess, Seconds

#: Methods protected by default: the ones that change state.
UNSAFE_METHODS: tuple[str, ...] = ("POST", "PUT", "PATCH", "DELETE")

#: 4xx statuses that say "try again later", so they never poison a key by default.
RETRYABLE_CLIENT_STATUSES: frozenset[int] = frozenset({408, 425, 429})

#: Which non-2xx statuses poison the scope: a collection of statuses or a predicate.
StatusPolicy = Collection[int] | Callable[[int], bool]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([A-Za-z]+))?\}")
_CONVERTERS = {"str": r"[^/]+", "int": r"[0-9]+", "path": r".+"}


def default_permanent(status: int) -> bool:
    """4xx is permanent (the request itself is wrong), except 408/425/429 which ask for a
    retry; 5xx and anything else non-2xx is transient (released and counted)."""
    return 400 <= status < 500 and status not in RETRYABLE_CLIENT_STATUSES


def as_predicate(policy: StatusPolicy | None) -> Callable[[int], bool]:
    """Normalise ``permanent=``: ``None`` → :func:`default_permanent`."""
    if policy is None:
        return default_permanent
    if callable(policy):
        return policy
    statuses = frozenset(policy)
    return statuses.__contains__


@dataclass(frozen=True, slots=True)
class Route:
    """A protected route with optional per-route overrides (``None`` = middleware default).

    ``Route("/payments/{id}", methods=("POST",), status_map={"REQUEST_IN_PROGRESS": 425})``.
    The per-operation policies (``on_in_progress="wait"`` with ``wait_timeout``,
    ``on_success``, ``reuse_after``, ``on_failure``) apply to this route's requests; a
    route's own value wins over the middleware's, which wins over the handler's.
    """

    template: str
    methods: tuple[str, ...] = UNSAFE_METHODS
    require_key: bool | None = None
    status_map: Mapping[str, int] | None = None
    permanent: StatusPolicy | None = None
    on_in_progress: OnInProgress | None = None
    wait_timeout: Seconds | None = None
    on_success: OnSuccess | None = None
    reuse_after: Seconds | None = None
    on_failure: OnFailure | None = None


#: What ``routes=`` accepts: ``"/path/{id}"`` (every unsafe method), ``("POST", "/path")``
#: or a :class:`Route`.
RouteSpec = str | tuple[str, str] | Route


@dataclass(frozen=True, slots=True)
class RouteSettings:
    """A route's effective options: per-route value, else the middleware's."""

    require_key: bool
    status_map: Mapping[str, int]
    permanent: Callable[[int], bool]
    #: The policy options passed to every ``handler.run`` of the route (names as ``run``'s).
    policies: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """A protected request: its operation name, path parameters and options."""

    operation: str
    template: str
    path_params: dict[str, str]
    settings: RouteSettings


@dataclass(frozen=True, slots=True)
class _Compiled:
    template: str
    methods: frozenset[str]
    pattern: re.Pattern[str]
    settings: RouteSettings


def compile_template(template: str) -> re.Pattern[str]:
    """Turn a path template into an anchored regular expression (see module docstring)."""
    if not template.startswith("/"):
        raise ConfigurationError(f"route template must start with '/': {template!r}")
    parts: list[str] = []
    position = 0
    for m in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[position : m.start()]))
        converter = m.group(2) or "str"
        if converter not in _CONVERTERS:
            raise ConfigurationError(
                f"unsupported converter {converter!r} in {template!r} (use str, int or path)"
            )
        parts.append(f"(?P<{m.group(1)}>{_CONVERTERS[converter]})")
        position = m.end()
    rest = template[position:]
    if "{" in rest or "}" in rest:
        raise ConfigurationError(f"malformed placeholder in route template {template!r}")
    parts.append(re.escape(rest))
    try:
        return re.compile("".join(parts))
    except re.error as exc:  # e.g. the same placeholder twice
        raise ConfigurationError(f"invalid route template {template!r}: {exc}") from exc


def _as_route(spec: RouteSpec) -> Route:
    if isinstance(spec, Route):
        return spec
    if isinstance(spec, str):
        return Route(spec)
    if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(p, str) for p in spec):
        return Route(spec[1], methods=(spec[0],))
    raise ConfigurationError(f"a route is a template, (METHOD, template) or Route: {spec!r}")


class RouteTable:
    """The protected routes, compiled once; ``match`` is called on every request."""

    def __init__(self, routes: Iterable[RouteSpec] | None, defaults: RouteSettings) -> None:
        self.defaults = defaults
        self.protect_all = routes is None
        self._routes = [self._compile(_as_route(s)) for s in routes or ()]

    def _compile(self, route: Route) -> _Compiled:
        if isinstance(route.methods, str):
            raise ConfigurationError("Route.methods is a tuple of method names, not a string")
        status_map = dict(self.defaults.status_map)
        status_map.update(route.status_map or {})
        settings = RouteSettings(
            require_key=(
                self.defaults.require_key if route.require_key is None else route.require_key
            ),
            status_map=status_map,
            permanent=(
                self.defaults.permanent
                if route.permanent is None
                else as_predicate(route.permanent)
            ),
            policies=MappingProxyType({**self.defaults.policies, **given_policies(route)}),
        )
        methods = frozenset(m.upper() for m in route.methods)
        return _Compiled(route.template, methods, compile_template(route.template), settings)

    def all_settings(self) -> list[RouteSettings]:
        """Every route's settings (the defaults first): checked once at construction."""
        return [self.defaults, *(route.settings for route in self._routes)]

    def match(self, method: str, path: str) -> RouteMatch | None:
        """The protected route for this request, or ``None`` (pass through untouched)."""
        method = method.upper()
        if self.protect_all:
            if method not in UNSAFE_METHODS:
                return None
            return RouteMatch(f"{method} {path}", path, {}, self.defaults)
        for route in self._routes:
            if method not in route.methods:
                continue
            m = route.pattern.fullmatch(path)
            if m is not None:
                operation = f"{method} {route.template}"
                return RouteMatch(operation, route.template, m.groupdict(), route.settings)
        return None


__all__ = [
    "RETRYABLE_CLIENT_STATUSES",
    "UNSAFE_METHODS",
    "Route",
    "RouteMatch",
    "RouteSettings",
    "RouteSpec",
    "RouteTable",
    "StatusPolicy",
    "as_predicate",
    "compile_template",
    "default_permanent",
]
