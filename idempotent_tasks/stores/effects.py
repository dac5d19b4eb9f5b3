"""The optional store primitives behind effects outside the database: recorded steps and
the UNCERTAIN status.

``ctx.step(name, fn)`` records each step's result so that a later attempt of the same scope
(after a transient failure, a crash, a takeover) replays it instead of calling ``fn`` again;
``on_stuck="reconcile"`` may park a scope as UNCERTAIN for an operator to resolve.  A store
that implements these serves both; one that does not still serves everything else (the
handler answers ``CONFIGURATION_ERROR`` when a body or an operation asks for them).  Every
built-in store implements them; :class:`idempotent_tasks.testing.StoreContract` checks them
on any store that has them.

The rules:

* **Steps follow the retry counter.**  A scope's steps are one opaque blob (the handler
  encodes the map of step names to results) kept *with the scope's retry counter*: a release
  keeps them, and whatever removes or resets the counter removes them too — replacing an
  expired record, ``reopen``, ``reset_retry_count`` (``unpoison``), the counter cleanup of
  ``delete_expired``.  Counting an attempt (``take_over``, ``record_failure``) keeps them.
* ``save_steps`` is fenced: it writes only while the scope's record is PROCESSING with
  ``token`` (atomically with that check: a takeover that commits first makes it write
  nothing and return False); it creates the counter at 0 when there is none.
* ``mark_uncertain``: PROCESSING + ``token`` → UNCERTAIN, keeping ``detail`` as the record's
  response, with no lease and no ``expires_at`` (an UNCERTAIN record waits for an operator).
* ``resolve_uncertain``: only an UNCERTAIN record changes: ``"done"`` → SUCCESS with
  ``response`` and ``expires_at``; ``"fail"`` → FAILED with ``expires_at`` (the detail kept
  as its response); ``"retry"`` → the record is deleted (counter and steps kept, so the next
  delivery runs as a new attempt that replays the recorded steps).  Its fencing token stays
  as it was.  False when the record is not UNCERTAIN (nothing changed).
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from .._core.records import Scope

Resolution = Literal["done", "retry", "fail"]


@runtime_checkable
class StepStore(Protocol):
    """A store that keeps a scope's recorded steps beside its retry counter."""

    def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool:
        """Replace the scope's steps blob, fenced by ``token`` (see the module docstring)."""
        ...

    def load_steps(self, scope: Scope) -> bytes | None:
        """The scope's steps blob, or ``None`` when it has none."""
        ...


@runtime_checkable
class UncertainStore(Protocol):
    """A store that can park a scope as UNCERTAIN and resolve it."""

    def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool: ...

    def resolve_uncertain(
        self,
        scope: Scope,
        *,
        resolution: Resolution,
        now: float,
        response: bytes | None = None,
        expires_at: float | None = None,
    ) -> bool: ...


@runtime_checkable
class AsyncStepStore(Protocol):
    """:class:`StepStore` with coroutine methods."""

    async def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool: ...

    async def load_steps(self, scope: Scope) -> bytes | None: ...


@runtime_checkable
class AsyncUncertainStore(Protocol):
    """:class:`UncertainStore` with coroutine methods."""

    async def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool: ...

    async def resolve_uncertain(
        self,
        scope: Scope,
        *,
        resolution: Resolution,
        now: float,
        response: bytes | None = None,
        expires_at: float | None = None,
    ) -> bool: ...


__all__ = ["AsyncStepStore", "AsyncUncertainStore", "Resolution", "StepStore", "UncertainStore"]
