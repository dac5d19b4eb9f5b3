"""What an idempotent actor declared, and how one message resolves to a scope.

Actor options (declared by :class:`~idempotent_tasks.dramatiq.IdempotencyMiddleware`) are
read once per actor into an :class:`ActorSpec`.  Per message, the key and tenant come from
``message.options`` first (so any producer, in any language, can set them), then from the
actor's ``key=`` / ``tenant=`` options, then from the middleware's ``default_tenant`` or,
only with ``require_key=False``, the Dramatiq message id (stable across broker redelivery
and Dramatiq retries, which re-enqueue the same message).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._core import keys
from .._core.errors import ErrorCode, InvalidInputError
from .._core.policies import given_policies
from ..typing import (
    OnFailure,
    OnInProgress,
    OnStuck,
    OnSuccess,
    Permanent,
    Reconcile,
    Seconds,
)

#: Message options a producer sets (``send_with_options(idempotency_key=..., tenant=...)``).
KEY_OPTION = keys.KEY_OPTION
TENANT_OPTIONS = ("tenant", keys.TENANT_OPTION)

#: Actor options the middleware declares.  ``idempotency_max_retries`` is the store's
#: failed-attempt count before poisoning (Dramatiq's own ``max_retries`` is a different thing
#: and never ends an idempotent actor's message first); likewise the ``on_success`` /
#: ``on_failure`` policies are ``idempotency_on_success`` / ``idempotency_on_failure``
#: (Dramatiq's ``Callbacks`` middleware owns the plain names: actors to notify).  ``unique``,
#: ``unique_until`` and ``unique_lease_timeout`` are :class:`UniqueActor`'s (any actor).
ACTOR_OPTIONS = frozenset(
    {
        "idempotent",
        "operation",
        "permanent",
        "key",
        "tenant",
        "payload",
        "ttl",
        "lease_timeout",
        "on_stuck",
        "on_in_progress",
        "wait_timeout",
        "idempotency_on_success",
        "reuse_after",
        "idempotency_on_failure",
        "reconcile",
        "require_key",
        "idempotency_max_retries",
        "transactional",
        "unique",
        "unique_until",
        "unique_lease_timeout",
    }
)

KeyFn = Callable[..., Any]
TenantOption = str | Callable[..., Any] | None


@dataclass(frozen=True, slots=True)
class ActorSpec:
    """The idempotency settings of one actor, read from its options at declaration."""

    operation: str
    permanent: Permanent = ()
    key: KeyFn | None = None
    tenant: TenantOption = None
    payload: Callable[..., Any] | None = None
    require_key: bool = True
    transactional: bool = False
    ttl: Seconds | None = None
    lease_timeout: Seconds | None = None
    max_retries: int | None = None
    on_stuck: OnStuck | None = None
    on_in_progress: OnInProgress | None = None
    wait_timeout: Seconds | None = None
    on_success: OnSuccess | None = None
    reuse_after: Seconds | None = None
    on_failure: OnFailure | None = None
    reconcile: Reconcile | None = None

    @classmethod
    def from_options(cls, actor_name: str, options: Mapping[str, Any]) -> ActorSpec:
        return cls(
            operation=options.get("operation") or actor_name,
            permanent=options.get("permanent") or (),
            key=options.get("key"),
            tenant=options.get("tenant"),
            payload=options.get("payload"),
            require_key=bool(options.get("require_key", True)),
            transactional=bool(options.get("transactional", False)),
            ttl=options.get("ttl"),
            lease_timeout=options.get("lease_timeout"),
            max_retries=options.get("idempotency_max_retries"),
            on_stuck=options.get("on_stuck"),
            on_in_progress=options.get("on_in_progress"),
            wait_timeout=options.get("wait_timeout"),
            on_success=options.get("idempotency_on_success"),
            reuse_after=options.get("reuse_after"),
            on_failure=options.get("idempotency_on_failure"),
            reconcile=options.get("reconcile"),
        )

    @property
    def overrides(self) -> dict[str, Any]:
        """The per-actor defaults to register with the handler (decorator > handler)."""
        values = {
            "ttl": self.ttl,
            "lease_timeout": self.lease_timeout,
            "max_retries": self.max_retries,
            "on_stuck": self.on_stuck,
        }
        given = {name: value for name, value in values.items() if value is not None}
        return {**given, **given_policies(self)}


@dataclass(slots=True)  # not frozen: built per message, and a frozen __init__ costs more
class Resolved:
    """One message's scope parts and payload, before the handler validates them."""

    tenant: Any
    key: Any
    payload: Any


def resolve(
    spec: ActorSpec,
    options: Mapping[str, Any],
    message_id: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    default_tenant: str | None,
) -> Resolved:
    """Key, tenant and payload of one message (see the module docstring for precedence)."""
    return Resolved(
        tenant=given_tenant(spec, options, args, kwargs, default_tenant),
        key=_key(spec, options, message_id, args, kwargs),
        payload=_payload(spec, args, kwargs),
    )


def _key(
    spec: ActorSpec,
    options: Mapping[str, Any],
    message_id: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> Any:
    key = given_key(spec, options, args, kwargs)
    if key is None and not spec.require_key:
        key = message_id
    return key


def given_key(
    spec: ActorSpec, options: Mapping[str, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """The key the producer or the actor names: the message option, else ``key=`` (no
    fallback to the message id: a producer asking for ``unique=True`` has none yet)."""
    key = options.get(KEY_OPTION)
    if key is None and spec.key is not None:
        key = _call(spec.key, args, kwargs, ErrorCode.INVALID_KEY, "key")
    return key


def given_tenant(
    spec: ActorSpec,
    options: Mapping[str, Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    default_tenant: str | None,
) -> Any:
    """The message's tenant option, else the actor's ``tenant=`` (a constant or a function of
    the arguments), else ``default_tenant``."""
    for name in TENANT_OPTIONS:
        if options.get(name) is not None:
            return options[name]
    tenant: Any = spec.tenant
    if callable(tenant):
        tenant = _call(tenant, args, kwargs, ErrorCode.INVALID_TENANT, "tenant")
    return tenant if tenant is not None else default_tenant


def _payload(spec: ActorSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if spec.payload is not None:
        return _call(spec.payload, args, kwargs, ErrorCode.INVALID_PAYLOAD, "payload")
    return {"args": list(args), "kwargs": dict(kwargs)}


def _call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    code: ErrorCode,
    what: str,
) -> Any:
    """Run a user's key/tenant/payload function; its failure is bad input, not a crash."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise InvalidInputError(
            f"the actor's {what}= function failed: {exc!r}", code=code
        ) from exc
