"""What an idempotent taskiq task declares, and how a message's (tenant, key, payload) are
found: labels first (any producer can set them), then the task's own functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._core.errors import ErrorCode, IdempotencyError, InvalidInputError
from .._core.policies import given_policies
from ..typing import OnFailure, OnInProgress, OnStuck, OnSuccess, Permanent, Seconds

#: The message labels a producer sets (``kicker().with_labels(**idempotency_labels(...))``).
KEY_LABEL = "idempotency_key"
TENANT_LABEL = "idempotency_tenant"
#: The task label :func:`idempotent` sets, which marks the task for the middleware.
MARK_LABEL = "idempotent"
#: How many times the middleware has sent a message back (its backoff attempt).
ATTEMPT_LABEL = "idempotency_attempt"
#: The attribute of a wrapped task function that holds its :class:`TaskSpec`.
SPEC_ATTRIBUTE = "__idempotency_spec__"
#: The label the result carries: the outcome's kind (``executed``, ``replayed``, …).
OUTCOME_LABEL = "idempotency_outcome"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """The options of one idempotent task (``operation`` is its task name unless given)."""

    permanent: Permanent = ()
    key: Callable[..., Any] | None = None
    tenant: str | Callable[..., Any] | None = None
    payload: Callable[..., Any] | None = None
    require_key: bool = True
    ttl: Seconds | None = None
    lease_timeout: Seconds | None = None
    max_retries: int | None = None
    on_stuck: OnStuck | None = None
    operation: str | None = None
    on_in_progress: OnInProgress | None = None
    wait_timeout: Seconds | None = None
    on_success: OnSuccess | None = None
    reuse_after: Seconds | None = None
    on_failure: OnFailure | None = None

    @property
    def overrides(self) -> dict[str, Any]:
        """The per-operation options given (``handler.register_operation`` takes them)."""
        options = {"ttl": self.ttl, "lease_timeout": self.lease_timeout,
                   "max_retries": self.max_retries, "on_stuck": self.on_stuck}
        return {**{k: v for k, v in options.items() if v is not None}, **self.policies}

    @property
    def policies(self) -> dict[str, Any]:
        """The per-operation policies this task sets (they win over the middleware's)."""
        return given_policies(self)


@dataclass(frozen=True, slots=True)
class Resolved:
    tenant: Any
    key: Any
    payload: Any


def resolve(spec: TaskSpec, message: Any, default_tenant: str | None) -> Resolved:
    """(tenant, key, payload) of a taskiq message: the wire arguments, not the ones taskiq
    injects (dependencies are not part of what the caller asked for)."""
    args, kwargs = list(message.args), dict(message.kwargs)
    labels = message.labels
    key = labels.get(KEY_LABEL)
    if key is None and spec.key is not None:
        key = _call(spec.key, args, kwargs, "idempotency key", ErrorCode.INVALID_KEY)
    if key is None and not spec.require_key:
        key = message.task_id  # stable across broker redelivery and the middleware's resends
    tenant = labels.get(TENANT_LABEL)
    if tenant is None:
        if callable(spec.tenant):
            tenant = _call(spec.tenant, args, kwargs, "tenant", ErrorCode.INVALID_TENANT)
        else:
            tenant = spec.tenant if spec.tenant is not None else default_tenant
    if spec.payload is not None:
        payload = _call(spec.payload, args, kwargs, "payload", ErrorCode.INVALID_PAYLOAD)
    else:
        payload = {"args": args, "kwargs": kwargs}
    return Resolved(tenant=tenant, key=key, payload=payload)


def _call(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], what: str,
          code: ErrorCode) -> Any:
    try:
        return fn(*args, **kwargs)
    except IdempotencyError:
        raise
    except Exception as exc:
        raise InvalidInputError(f"{what} function failed: {exc!r}", code=code) from exc


def idempotency_labels(key: str, tenant: str | None = None) -> dict[str, str]:
    """The labels that carry a call's key (and tenant):
    ``task.kicker().with_labels(**idempotency_labels(key, "acme")).kiq(...)``.

    Args:
        key: The call's idempotency key, made once per logical operation.
        tenant: The call's tenant (``None``: the label is left out).

    Returns:
        The labels, as keyword arguments of ``with_labels``.
    """
    labels = {KEY_LABEL: key}
    if tenant is not None:
        labels[TENANT_LABEL] = tenant
    return labels


__all__ = [
    "ATTEMPT_LABEL", "KEY_LABEL", "MARK_LABEL", "OUTCOME_LABEL", "SPEC_ATTRIBUTE",
    "TENANT_LABEL", "Resolved",
    "TaskSpec", "idempotency_labels", "resolve",
]
