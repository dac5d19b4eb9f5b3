"""Recovery points: ``ctx.step(name, fn)`` runs ``fn`` once per (scope, name).

A body that calls a card processor, sends an e-mail and then writes a ledger row can die
between any two of them; the takeover (or the retry after a transient failure) runs the
body again.  Wrapping each external effect in a step records its result under the scope
before the next step starts, fenced by the attempt's token, so a later attempt of the same
scope returns the recorded results and runs only what had not happened — Stripe's recovery
points and the durable-execution engines' journals, for a task body.

What is exactly-once and what is not:

* a step whose result was recorded never runs again for the scope (while its counter lives);
* a step whose process died after ``fn``'s effect and before its result was recorded runs
  again on the next attempt: that window is one step wide instead of the whole body (pass
  ``ctx.derived_key(name)`` to the other service as its idempotency key to close it there);
* a step result that cannot be serialised poisons the scope (:class:`StepNotRecordable`):
  the effect happened and cannot be replayed, so nothing re-runs it automatically;
* a result the store refuses (a newer attempt owns the scope) or cannot take (it is down)
  stops the body with that error: the first is the stale owner's ``superseded``, the second
  a counted transient failure whose next attempt re-runs this one step.

The steps of a scope live beside its retry counter (``stores.effects``): a release keeps
them, and they go with the counter (expiry, ``unpoison``, a new attempt after a policy's
``reopen``).  Bodies that use no step pay nothing: the journal is built on the first call.
The blob also keeps the library's own parts, under names no step may take (they start with
NUL): the scope's past attempts (:mod:`.attempts`).  The journal re-saves every part it
loaded, so recording a step never drops them.

A transactional body (``transactional=True``) cannot use steps: its database writes are
exactly-once already, and a step recorded outside its transaction could outlive writes the
transaction rolled back (a lost write on the next attempt), while one recorded inside it would
not outlive the external effect it stands for.  Such a body gets CONFIGURATION_ERROR; external
calls from it take ``ctx.derived_key(name)`` as their idempotency key instead.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError, ErrorCode, make_error
from .records import LazyCountContext, Scope
from .signals import Poison
from .store_calls import LoadSteps, SaveSteps, StoreCall

if TYPE_CHECKING:
    from .engine import Engine

_LENGTH = struct.Struct(">I")
#: Names starting with NUL are the library's own parts of the steps blob, never a step's.
RESERVED = "\x00"
#: The part that keeps the scope's past attempts (:mod:`.attempts`).
HISTORY_PART = RESERVED + "attempts"


class StepNotRecordable(Poison):
    """A step's result cannot be serialised: its effect happened and cannot be replayed, so
    the scope is poisoned rather than run again."""


def encode_steps(steps: dict[str, bytes]) -> bytes:
    """The map of step names to encoded results as one blob (length-prefixed entries)."""
    parts: list[bytes] = []
    for name, value in steps.items():
        raw = name.encode("utf-8")
        parts += (_LENGTH.pack(len(raw)), raw, _LENGTH.pack(len(value)), value)
    return b"".join(parts)


def decode_steps(blob: bytes | None) -> dict[str, bytes]:
    """``encode_steps``'s inverse; ``None`` (no steps yet) is the empty map."""
    steps: dict[str, bytes] = {}
    view, at = memoryview(blob or b""), 0
    while at < len(view):
        (size,) = _LENGTH.unpack_from(view, at)
        name = bytes(view[at + 4 : at + 4 + size]).decode("utf-8")
        at += 4 + size
        (size,) = _LENGTH.unpack_from(view, at)
        steps[name] = bytes(view[at + 4 : at + 4 + size])
        at += 4 + size
    return steps


class StepJournal:
    """The recorded steps of one attempt's scope, loaded on the first step."""

    __slots__ = ("engine", "recorded", "scope", "token", "used")

    def __init__(self, engine: Engine, scope: Scope, token: int) -> None:
        self.engine = engine
        self.scope = scope
        self.token = token
        self.recorded: dict[str, bytes] | None = None
        self.used: set[str] = set()

    def _claim_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("a step needs a non-empty name")
        if name.startswith(RESERVED):
            raise ConfigurationError("step names starting with NUL are reserved")
        if name in self.used:
            raise ConfigurationError(f"step {name!r} ran twice in one body: names are unique")
        self.used.add(name)

    def _encoded(self, name: str, value: Any) -> bytes:
        try:
            encoded = self.engine._dumps(value)
            if len(encoded) > self.engine.max_response_bytes:
                raise ValueError(f"larger than {self.engine.max_response_bytes} bytes")
        except Exception as exc:
            raise StepNotRecordable(
                message=f"step {name!r} result cannot be stored: {exc}"
            ) from exc
        return encoded

    def _save(self, name: str, encoded: bytes) -> SaveSteps:
        assert self.recorded is not None
        self.recorded[name] = encoded
        return SaveSteps(self.scope, self.token, encode_steps(self.recorded), self.engine.clock())

    def _saved(self, name: str, ok: bool) -> None:
        if not ok:
            raise make_error(
                ErrorCode.REQUEST_IN_PROGRESS,
                f"step {name!r} not recorded: a newer attempt owns the scope",
                tenant=self.scope.tenant, operation=self.scope.operation, key=self.scope.key,
            )

    # ------------------------------------------------------------------ sync
    def run(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any, call: Any) -> Any:
        """``ctx.step``: ``call(store_call)`` makes the store calls (blocking)."""
        self._claim_name(name)
        if self.recorded is None:
            self.recorded = decode_steps(call(LoadSteps(self.scope)))
        if name in self.recorded:
            return self.engine._loads(self.recorded[name])
        encoded = self._encoded(name, fn(*args, **kwargs))
        self._saved(name, call(self._save(name, encoded)))
        return self.engine._loads(encoded)

    # ------------------------------------------------------------------ async
    async def run_async(
        self, name: str, afn: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
    ) -> Any:
        """``await ctx.step_async``: store calls awaited (no blocking call on the loop)."""
        self._claim_name(name)
        io = self.engine.io
        if self.recorded is None:
            self.recorded = decode_steps(await io.call_async(LoadSteps(self.scope)))
        if name in self.recorded:
            return self.engine._loads(self.recorded[name])
        encoded = self._encoded(name, await afn(*args, **kwargs))
        self._saved(name, await io.call_async(self._save(name, encoded)))
        return self.engine._loads(encoded)


def blocking_caller(
    engine: Engine, loop: asyncio.AbstractEventLoop | None
) -> Callable[[StoreCall], Any]:
    """How a sync ``ctx.step`` makes a store call: directly, or — for a body bound to an
    event loop (``run_async``) and called from another thread — on that loop.  On the loop's
    own thread a blocking call would stall every coroutine: refused."""
    if loop is None:
        return engine.io.call
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise ConfigurationError(
            "ctx.step on the event loop would block it with store calls: "
            "use `await current_context().step_async(...)`"
        )

    def on_the_loop(cmd: StoreCall) -> Any:
        return asyncio.run_coroutine_threadsafe(engine.io.call_async(cmd), loop).result()

    return on_the_loop


def supports_steps(engine: Engine) -> bool:
    return hasattr(engine.store, "save_steps") and hasattr(engine.store, "load_steps")


class BodyContext(LazyCountContext):
    """The context of a body the handler runs: a lazily read counter (the parent class)
    and the steps journal, built on the body's first step."""

    __slots__ = ("_journal", "_no_steps")

    def refuse_steps(self, reason: str) -> None:
        """Make every step of this body a CONFIGURATION_ERROR saying ``reason``."""
        self._no_steps = reason

    def _steps(self) -> StepJournal:
        journal: StepJournal | None = getattr(self, "_journal", None)  # unset until a step
        if journal is None:
            refusal: str | None = getattr(self, "_no_steps", None)
            if refusal is not None:
                raise ConfigurationError(refusal)
            engine: Engine | None = self._engine
            scope, token = self._scope, self.fencing_token
            assert engine is not None and scope is not None and token is not None
            if not supports_steps(engine):
                raise ConfigurationError(
                    f"{type(engine.store).__name__} cannot record steps (no save_steps)"
                )
            journal = self._journal = StepJournal(engine, scope, token)
        return journal

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        journal = self._steps()
        return journal.run(name, fn, args, kwargs, blocking_caller(journal.engine, self._loop))

    async def step_async(
        self, name: str, afn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any
    ) -> Any:
        return await self._steps().run_async(name, afn, args, kwargs)


__all__ = [
    "HISTORY_PART",
    "RESERVED",
    "BodyContext",
    "StepJournal",
    "StepNotRecordable",
    "blocking_caller",
    "decode_steps",
    "encode_steps",
    "supports_steps",
]
