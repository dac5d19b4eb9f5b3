"""The optional store primitive behind the per-operation reuse policies.

``on_success`` with ``reuse_after`` ("at most once per window") and
``on_failure="allow_new_attempt"`` start a new execution of a scope whose record is already
settled.  That needs one more atomic, conditional write than the hot path has: *reopen* a
SUCCESS or FAILED record as a new attempt.  A store that implements it serves those policies;
one that does not still serves every default (the handler answers ``CONFIGURATION_ERROR``
when an operation asks for a policy its store cannot honour).  Every built-in store
implements it, and :class:`idempotent_tasks.testing.StoreContract` checks it on any store
that has it.

The rules:

* Atomic and conditional: only a record whose status is SUCCESS or FAILED **and** whose
  fencing token is ``expected_token`` is reopened; of concurrent callers with the same
  expected token exactly one succeeds, the others get ``None`` and change nothing.
* The reopened record is PROCESSING with a new fencing token (greater than every earlier
  attempt's of the scope, drawn as ``create`` draws one), ``lease_expires_at`` as given,
  ``created_at`` and ``updated_at`` = ``now``, no response and no ``expires_at``; the request
  hash stays (the policies only reopen a scope for the same payload).
* The scope's retry counter is reset (a new execution starts counting afresh); any other
  state kept beside the counter is the policy's to decide, not the store's.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._core.records import Scope


@runtime_checkable
class ReopenStore(Protocol):
    """A store that can give a settled scope to a new attempt (see the module docstring)."""

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None:
        """SUCCESS/FAILED + ``expected_token`` → PROCESSING with a new token (returned) and
        a fresh lease, counter reset; ``None`` when the condition did not hold."""
        ...


@runtime_checkable
class AsyncReopenStore(Protocol):
    """:class:`ReopenStore` with a coroutine method."""

    async def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None: ...


__all__ = ["AsyncReopenStore", "ReopenStore"]
