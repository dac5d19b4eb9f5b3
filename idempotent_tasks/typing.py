"""The shared vocabulary of the public API: durations, the permanent-error rule, per-call
options.  Import these to type your own wrappers (``from idempotent_tasks.typing import
Permanent``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ._core.errors import ConfigurationError

#: A duration: seconds, or a ``timedelta``.
Seconds = float | dt.timedelta
#: What poisons a scope: a tuple of exception types, or a predicate ``exc -> bool``.
Permanent = tuple[type[BaseException], ...] | Callable[[BaseException], bool]
#: What a crashed attempt (expired lease) leads to: count a retry and run again, or poison.
OnStuck = Literal["retry", "fail", "reconcile"]
#: What a duplicate that finds the scope running does: come back later, or wait for its outcome.
OnInProgress = Literal["retry", "wait"]
#: What a duplicate of a succeeded scope gets: the stored result, or a refusal.
OnSuccess = Literal["replay", "reject"]
#: What a delivery of a poisoned scope gets: the refusal, or a new attempt.
OnFailure = Literal["reject", "allow_new_attempt"]
#: ``on_stuck="reconcile"``: ``reconcile(ctx) -> Reconciled``, or a coroutine function for
#: async bodies (``idempotent_tasks.Reconciled``).
Reconcile = Callable[..., Any]

DEFAULT_WAIT_TIMEOUT = 10.0


def seconds(value: Seconds) -> float:
    """Durations are seconds everywhere; a ``timedelta`` is accepted too."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return float(value)


@dataclass(frozen=True, slots=True)
class Options:
    """Per-operation settings; precedence: call site > registered operation > handler."""

    ttl: float
    lease_timeout: float
    max_retries: int
    on_stuck: OnStuck
    #: The per-operation policies (docs/design.md, "Per-operation policies").
    on_in_progress: OnInProgress = "retry"
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT
    on_success: OnSuccess = "replay"
    reuse_after: float | None = None
    on_failure: OnFailure = "reject"
    #: ``on_stuck="reconcile"``: ``reconcile(ctx) -> Reconciled`` (or a coroutine function).
    reconcile: Reconcile | None = None
    #: True when a policy differs from the defaults (computed; a replay checks one flag).
    has_policies: bool = field(init=False, repr=False, compare=False, default=False)

    def merged(
        self,
        *,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
        **policies: Any,
    ) -> Options:
        """These options with the given ones replacing theirs (``None``: keep).
        ``policies``: ``on_in_progress``, ``wait_timeout``, ``on_success``, ``reuse_after``,
        ``on_failure``, ``reconcile``."""
        changes: dict[str, Any] = {
            name: value for name, value in policies.items() if value is not None
        }
        if ttl is not None:
            changes["ttl"] = seconds(ttl)
        if lease_timeout is not None:
            changes["lease_timeout"] = seconds(lease_timeout)
        if max_retries is not None:
            changes["max_retries"] = max_retries
        if on_stuck is not None:
            changes["on_stuck"] = on_stuck
        if not changes:
            return self
        unknown = set(changes) - _FIELDS
        if unknown:
            raise ConfigurationError(f"unknown option(s): {', '.join(sorted(unknown))}")
        for name in ("wait_timeout", "reuse_after"):
            if name in changes:
                changes[name] = seconds(changes[name])
        merged = replace(self, **changes)
        merged.validate()
        return merged

    def __post_init__(self) -> None:
        object.__setattr__(self, "has_policies", (
            self.on_in_progress != "retry" or self.on_success != "replay"
            or self.reuse_after is not None or self.on_failure != "reject"
        ))

    def validate(self) -> None:
        """CONFIGURATION_ERROR for values the algorithm cannot honour."""
        if self.ttl <= 0 or self.lease_timeout <= 0:
            raise ConfigurationError("ttl and lease_timeout must be positive")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ConfigurationError("max_retries must be an integer")
        if self.max_retries < 1:
            raise ConfigurationError("max_retries must be at least 1")
        if self.on_stuck not in ("retry", "fail", "reconcile"):
            raise ConfigurationError("on_stuck must be 'retry', 'fail' or 'reconcile'")
        if self.on_stuck == "reconcile" and not callable(self.reconcile):
            raise ConfigurationError("on_stuck='reconcile' needs reconcile=fn(ctx) -> Reconciled")
        self._validate_policies()

    def _validate_policies(self) -> None:
        if self.on_in_progress not in ("retry", "wait"):
            raise ConfigurationError("on_in_progress must be 'retry' or 'wait'")
        if self.on_success not in ("replay", "reject"):
            raise ConfigurationError("on_success must be 'replay' or 'reject'")
        if self.on_failure not in ("reject", "allow_new_attempt"):
            raise ConfigurationError("on_failure must be 'reject' or 'allow_new_attempt'")
        if self.wait_timeout <= 0:
            raise ConfigurationError("wait_timeout must be positive")
        if self.reuse_after is not None and self.reuse_after < 0:
            raise ConfigurationError("reuse_after must be zero or positive")


#: The names ``Options.merged`` accepts.
_FIELDS = frozenset(
    ("ttl", "lease_timeout", "max_retries", "on_stuck", "on_in_progress", "wait_timeout",
     "on_success", "reuse_after", "on_failure", "reconcile")
)


__all__ = [
    "DEFAULT_WAIT_TIMEOUT", "OnFailure", "OnInProgress", "OnStuck", "OnSuccess", "Options",
    "Permanent", "Reconcile", "Seconds", "seconds",
]
