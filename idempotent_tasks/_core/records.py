"""Value types shared by the handler and every store: statuses, scopes, records, outcomes."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, Protocol

from .errors import ConfigurationError
from .keys import derive_key


class Status(enum.StrEnum):
    PROCESSING = "PROCESSING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    #: A crashed attempt whose effects could not be reconciled: no automatic re-run, an
    #: operator resolves it (``handler.resolve``).
    UNCERTAIN = "UNCERTAIN"


class Scope(NamedTuple):
    """(tenant, operation, key): two scopes that differ in any part never share a record.

    A named tuple: built and hashed on every delivery (a frozen dataclass costs several
    times more)."""

    tenant: str
    operation: str
    key: str

    def encoded(self) -> str:
        """A collision-free single-string form: each part length-prefixed.

        ``("a:b", "c", k)`` and ``("a", "b:c", k)`` encode differently because the lengths
        differ, whatever characters the parts contain.
        """
        t, o, k = self.tenant, self.operation, self.key
        return f"{len(t)}:{t}|{len(o)}:{o}|{len(k)}:{k}"


@dataclass(slots=True)
class StoredRecord:
    """A record as a store returns it: the response still encoded (``bytes``), no counter.
    Treat it as read-only (not frozen: a frozen dataclass is slow to build)."""

    scope: Scope
    status: Status
    request_hash: str
    response: bytes | None
    fencing_token: int
    created_at: float
    updated_at: float
    lease_expires_at: float | None
    expires_at: float | None

    @classmethod
    def claimed(
        cls, scope: Scope, request_hash: str, token: int, now: float, lease_expires_at: float
    ) -> StoredRecord:
        """The record a successful ``create`` writes: PROCESSING, owned by ``token``."""
        return cls(
            scope=scope, status=PROCESSING, request_hash=request_hash, response=None,
            fencing_token=token, created_at=now, updated_at=now,
            lease_expires_at=lease_expires_at, expires_at=None,
        )


@dataclass(frozen=True, slots=True)
class Record:
    """The public view of one scope's state (``handler.get_record``).

    ``response`` is the decoded value (what a replay returns); ``retry_count`` reads the
    counter, which lives apart from the record.  Timestamps are epoch seconds from the
    handler's clock.  An UNCERTAIN record has no result to replay (``response`` is ``None``):
    ``detail`` holds why reconciliation could not tell (the ``Reconciled.unknown`` detail, or
    the exception ``reconcile`` raised), as text, for the operator who resolves it; it is
    ``None`` for every other status.
    """

    tenant: str
    operation: str
    key: str
    status: Status
    request_hash: str
    response: Any
    retry_count: int
    fencing_token: int
    created_at: float
    updated_at: float
    lease_expires_at: float | None
    expires_at: float | None
    detail: str | None = None


class CreateOutcome(enum.StrEnum):
    CREATED = "CREATED"
    DUPLICATE = "DUPLICATE"


# The members every delivery compares or builds with, read once.  Done for speed: on
# Python 3.11 each read of a member off its class (``Status.SUCCESS``) passes through the
# slot hook of ``EnumType.__getattr__``: ~1,000 instructions, against ~50 for a global.
PROCESSING: Final = Status.PROCESSING
SUCCESS: Final = Status.SUCCESS
CREATED: Final = CreateOutcome.CREATED
DUPLICATE: Final = CreateOutcome.DUPLICATE


@dataclass(slots=True)
class CreateResult:
    """What ``Store.create`` returns: CREATED (we own ``fencing_token``) or DUPLICATE with the
    existing record, read in the same round trip."""

    outcome: CreateOutcome
    record: StoredRecord

    @property
    def created(self) -> bool:
        return self.outcome is CREATED


@dataclass(slots=True)
class IdempotencyContext:
    """What the library decided for the body running in this thread/task.

    ``outcome`` is one of ``"executing"``, ``"executed"``, ``"replayed"``, ``"unkeyed"``,
    ``"failed"``, ``"poisoned"``, ``"in_progress"``, ``"rejected"``.
    """

    tenant: str | None
    operation: str
    key: str | None
    request_hash: str | None
    outcome: str
    retry_count: int = 0
    fencing_token: int | None = None

    async def retry_count_async(self) -> int:
        """``retry_count`` for a coroutine: never a blocking store call on the event loop
        (a lazily read counter is awaited; see :class:`LazyCountContext`)."""
        return self.retry_count

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per (scope, ``name``): a later attempt of the
        same scope gets the recorded result without calling ``fn`` (docs/guarantees.md,
        "Effects outside the database").  Only inside a keyed body the handler runs."""
        raise ConfigurationError("steps need a keyed body run by the handler")

    async def step_async(
        self, name: str, afn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any
    ) -> Any:
        """``step`` for a coroutine function ``afn``, awaited (store calls awaited too)."""
        raise ConfigurationError("steps need a keyed body run by the handler")

    def derived_key(self, name: str) -> str:
        """A key for a downstream call, stable per (tenant, operation, key, ``name``): the
        same on every attempt of the scope, never equal for two different inputs."""
        return derive_key(self.tenant or "", self.operation, self.key or "", "derived", name)


class CountReader(Protocol):
    """Where a :class:`LazyCountContext` reads its counter from (the engine)."""

    def read_count(self, scope: Scope) -> int: ...

    async def read_count_async(self, scope: Scope) -> int: ...

    def read_count_from(self, scope: Scope, loop: asyncio.AbstractEventLoop) -> int: ...


class LazyCountContext(IdempotencyContext):
    """An :class:`IdempotencyContext` whose ``retry_count`` is read from the store on first
    access.

    A fresh claim does not know the scope's counter (earlier attempts may have been released
    and counted); reading it on every claim would cost a round trip on the hot path, so it
    is read only if the body (or an integration) asks.  While the body runs we own the
    scope, so the counter cannot change under us.

    A body run by ``run_async`` is bound to its event loop (``_loop``): no store call may
    run on that loop's thread, so there ``await ctx.retry_count_async()`` reads the counter
    (natively on an async store, on the handler's executor on a sync one) and the plain
    attribute raises ``CONFIGURATION_ERROR`` naming that call; from any other thread the
    attribute still works (it waits for the read).
    """

    __slots__ = ("_engine", "_loop", "_reader", "_scope")

    def __init__(
        self,
        tenant: str | None,
        operation: str,
        key: str | None,
        request_hash: str | None,
        outcome: str,
        retry_count: int = 0,
        fencing_token: int | None = None,
        *,
        reader: CountReader | None = None,
        scope: Scope | None = None,
        engine: Any = None,
    ) -> None:
        # The fields set directly (no dataclass __init__, no property setter): one of these is
        # built for every body that runs.
        self.tenant = tenant
        self.operation = operation
        self.key = key
        self.request_hash = request_hash
        self.outcome = outcome
        _COUNT_SLOT.__set__(self, retry_count)
        self.fencing_token = fencing_token
        self._reader = reader
        self._scope = scope
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine = engine  # what a subclass's steps record through (``.steps``)

    @property
    def retry_count(self) -> int:
        reader: CountReader | None = getattr(self, "_reader", None)
        if reader is not None:
            loop, scope = self._loop, self._scope
            assert scope is not None
            count = reader.read_count(scope) if loop is None else reader.read_count_from(
                scope, loop
            )
            self._reader = None
            _COUNT_SLOT.__set__(self, count)
        value: int = _COUNT_SLOT.__get__(self)
        return value

    @retry_count.setter
    def retry_count(self, value: int) -> None:
        _COUNT_SLOT.__set__(self, value)
        self._reader = None

    async def retry_count_async(self) -> int:
        reader: CountReader | None = getattr(self, "_reader", None)
        if reader is not None:
            assert self._scope is not None
            count = await reader.read_count_async(self._scope)
            if self._reader is not None:  # not set meanwhile by the body
                self._reader = None
                _COUNT_SLOT.__set__(self, count)
        value: int = _COUNT_SLOT.__get__(self)
        return value

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The body runs on ``loop`` (``run_async``): never read the counter on its thread."""
        self._loop = loop


_COUNT_SLOT: Any = IdempotencyContext.__dict__["retry_count"]
