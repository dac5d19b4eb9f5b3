"""The shared vocabulary of the public API: durations, the permanent-error rule, per-call
options.  Import these to type your own wrappers (``from idempotent_tasks.typing import
Permanent``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from ._core.errors import ConfigurationError

#: A duration: seconds, or a ``timedelta``.
Seconds = float | dt.timedelta
#: What poisons a scope: a tuple of exception types, or a predicate ``exc -> bool``.
Permanent = tuple[type[BaseException], ...] | Callable[[BaseException], bool]
#: What a crashed attempt (expired lease) leads to: count a retry and run again, or poison.
OnStuck = Literal["retry", "fail"]


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

    def merged(
        self,
        *,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> Options:
        """These options with the given ones replacing theirs (``None``: keep)."""
        if ttl is None and lease_timeout is None and max_retries is None and on_stuck is None:
            return self
        changes: dict[str, Any] = {}
        if ttl is not None:
            changes["ttl"] = seconds(ttl)
        if lease_timeout is not None:
            changes["lease_timeout"] = seconds(lease_timeout)
        if max_retries is not None:
            changes["max_retries"] = max_retries
        if on_stuck is not None:
            changes["on_stuck"] = on_stuck
        merged = replace(self, **changes)
        merged.validate()
        return merged

    def validate(self) -> None:
        """CONFIGURATION_ERROR for values the algorithm cannot honour."""
        if self.ttl <= 0 or self.lease_timeout <= 0:
            raise ConfigurationError("ttl and lease_timeout must be positive")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ConfigurationError("max_retries must be an integer")
        if self.max_retries < 1:
            raise ConfigurationError("max_retries must be at least 1")
        if self.on_stuck not in ("retry", "fail"):
            raise ConfigurationError("on_stuck must be 'retry' or 'fail'")


__all__ = ["OnStuck", "Options", "Permanent", "Seconds", "seconds"]
