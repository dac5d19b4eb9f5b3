"""``Outcome``: the one result type of the engine, whatever the integration.

``handler.run`` returns an :class:`Outcome` for every expected result — a fresh execution, a
replay, a refusal, a recorded failure — and never raises for one; ``unwrap()`` turns it back
into a return value or the exception ``execute`` raises.  Integrations map ``kind`` to their
framework's action through one table (docs/design.md, "One outcome, one table"):

===================  =====================================================================
kind                 meaning
===================  =====================================================================
executed             the body ran now and its outcome is recorded (``result``)
replayed             the scope already succeeded: ``result`` is the stored result
in_progress          another attempt holds a live lease: come back later, nothing counted
failed               the body raised a transient error: counted, scope released for a retry
poisoned             the scope is FAILED: a permanent error, retries exhausted, a crashed
                     attempt with ``on_stuck="fail"``, a result that cannot be stored
rejected             bad input (key, tenant, payload), key reuse, or a configuration error:
                     nothing ran
store_unavailable    the store could not be reached (the body did not run), or the body ran
                     and its outcome could not be written (``OUTCOME_NOT_RECORDED``)
superseded           the body ran, but its outcome was fenced off: a newer attempt owns the
                     scope (this one's lease expired and was taken over), so nothing of it
                     was recorded.  Not settled: redeliver later, the newer attempt's record
                     answers (every integration treats it like ``in_progress``)
===================  =====================================================================

``retry_count``: for ``failed`` and ``poisoned`` outcomes of an attempt that ran, the scope's
counter *after* this attempt was counted; for a ``poisoned`` duplicate, the counter the record
has; otherwise the count as the claim saw it (0 for a fresh claim; a takeover's includes the
crashed attempt it took over).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import ErrorCode, IdempotencyError, make_error
from .records import IdempotencyContext

OutcomeKind = Literal[
    "executed",
    "replayed",
    "in_progress",
    "failed",
    "poisoned",
    "rejected",
    "store_unavailable",
    "superseded",
]

#: The message is done: commit / ack it (after dead-lettering when asked).
SETTLED_KINDS: frozenset[str] = frozenset({"executed", "replayed", "poisoned", "rejected"})
#: The message goes to the dead letters before it is committed / acked.
DEAD_LETTER_KINDS: frozenset[str] = frozenset({"poisoned", "rejected"})
#: The message is *not* committed / acked: the same message is tried again later.
RETRY_KINDS: frozenset[str] = frozenset(
    {"in_progress", "failed", "store_unavailable", "superseded"}
)

#: The kinds whose outcome carries a result.
_RESULT_KINDS: frozenset[str] = frozenset({"executed", "replayed"})
#: The kind of a library refusal, by code, when nothing ran.  Codes not listed: "rejected".
_REFUSAL_KINDS: dict[ErrorCode, OutcomeKind] = {
    ErrorCode.REQUEST_IN_PROGRESS: "in_progress",
    ErrorCode.STORE_UNAVAILABLE: "store_unavailable",
    ErrorCode.OUTCOME_NOT_RECORDED: "store_unavailable",
    ErrorCode.REQUEST_FAILED: "poisoned",
    ErrorCode.RESPONSE_NOT_SERIALIZABLE: "poisoned",
    ErrorCode.INTERNAL_ERROR: "poisoned",
}


def refusal_kind(code: ErrorCode, *, ran: bool) -> OutcomeKind:
    """The kind of a refusal with ``code``.  A configuration error after the body ran (it
    ended the shared transaction itself) poisons; before, nothing ran: rejected."""
    if code is ErrorCode.CONFIGURATION_ERROR and ran:
        return "poisoned"
    return _REFUSAL_KINDS.get(code, "rejected")


@dataclass(slots=True)
class Outcome:
    """What happened to one call (or message, request, task delivery).  Treat it as
    read-only (it is not frozen only because a frozen dataclass costs a microsecond to build).

    ``error_code`` is the library's code for every kind but ``executed`` / ``replayed``
    (a transient body failure has none: its ``error`` names the exception class).
    ``exception`` is the body's own exception object, when the body raised.  ``detail`` is a
    sentence for logs and dead-letter headers.  ``retry_count`` is as the module docstring
    says (the counter after a counted attempt; the claim's count otherwise);
    ``fencing_token`` the token of the attempt that ran (for a replay: of the execution
    replayed).
    """

    kind: OutcomeKind
    result: Any = None
    error_code: ErrorCode | None = None
    error: str | None = None
    detail: str | None = None
    exception: BaseException | None = field(default=None, compare=False)
    tenant: str | None = None
    operation: str | None = None
    key: str | None = None
    retry_count: int = 0
    fencing_token: int | None = None
    #: The payload's hash (``None`` when the input was refused before it was hashed).
    request_hash: str | None = None
    #: True when the body ran in this call (whatever it then returned or raised).
    ran: bool = field(default=False, compare=False)
    #: The library's own error for a refusal (raised by ``unwrap``, its cause kept).
    refusal: IdempotencyError | None = field(default=None, repr=False, compare=False)
    #: The context the body saw (``current_context()``), or ``None`` when no body ran.
    body_context: IdempotencyContext | None = field(default=None, repr=False, compare=False)
    #: For a replay: the W3C ``traceparent`` of the execution whose result it returns, when
    #: that execution was traced (OpenTelemetry); its span links to it.
    replayed_from: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def refused(
        cls,
        error: IdempotencyError,
        *,
        operation: str | None = None,
        tenant: str | None = None,
        key: str | None = None,
    ) -> Outcome:
        """The outcome of a call refused before the engine ran anything (a key, tenant or
        payload an integration could not read, two key headers…): the kind its code means
        (``rejected`` for bad input), the error kept for ``unwrap``.  The scope defaults to
        the error's own."""
        return cls(
            refusal_kind(error.code, ran=False), error_code=error.code, detail=error.message,
            tenant=tenant if tenant is not None else error.tenant,
            operation=operation if operation is not None else error.operation,
            key=key if key is not None else error.key, refusal=error,
        )

    @property
    def lease_lost(self) -> bool:
        """True for a stale owner (``superseded``): kept for code written before that kind."""
        return self.kind == "superseded"

    @property
    def settled(self) -> bool:
        """True when the message is done: commit / ack it (dead-letter first if asked)."""
        return self.kind in SETTLED_KINDS

    @property
    def dead_letter(self) -> bool:
        """True for ``poisoned`` and ``rejected``: the message goes to the dead letters."""
        return self.kind in DEAD_LETTER_KINDS

    @property
    def retry(self) -> bool:
        """True when the message must come back later (not committed / acked)."""
        return self.kind in RETRY_KINDS

    @property
    def context(self) -> IdempotencyContext:
        """The :class:`IdempotencyContext` integrations attach to a task, message or request:
        the body's own context when it ran (its counter stays lazy), else a new one."""
        ctx = self.body_context
        if ctx is None:
            return IdempotencyContext(
                tenant=self.tenant, operation=self.operation or "", key=self.key,
                request_hash=self.request_hash, outcome=self.kind, retry_count=self.retry_count,
                fencing_token=self.fencing_token,
            )
        return ctx

    def unwrap(self) -> Any:
        """The result (executed, replayed), or raise: the library's ``IdempotencyError`` for a
        refusal, else the body's own exception — exactly what ``execute`` does."""
        if self.kind in _RESULT_KINDS or (self.kind == "superseded" and self.exception is None):
            return self.result  # a stale owner gets its own body's result back
        if self.refusal is None and self.exception is not None:
            raise self.exception
        raise self.error_object()

    def error_object(self) -> IdempotencyError:
        """The library's error for this outcome (its ``refusal``, or one built from the
        code, for outcomes made without it)."""
        if self.refusal is not None:
            return self.refusal
        return make_error(
            self.error_code or ErrorCode.INTERNAL_ERROR, self.detail or self.kind,
            tenant=self.tenant, operation=self.operation, key=self.key,
        )


__all__ = [
    "DEAD_LETTER_KINDS",
    "RETRY_KINDS",
    "SETTLED_KINDS",
    "Outcome",
    "OutcomeKind",
    "refusal_kind",
]
