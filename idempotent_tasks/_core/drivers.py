"""The two drivers of the one algorithm: here, on this thread, or on the running event loop.

A flow (:mod:`.flow`) yields commands; a driver runs each command and sends its result back,
or throws its exception in, until the flow returns.  The drivers own no decision at all: the
async path cannot drift from the sync one because there is nothing in them to drift.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

from .commands import Command
from .engine import Engine
from .outcome import Outcome

R = TypeVar("R")


def drive(engine: Engine, flow: Generator[Command, Any, R]) -> R:
    """Run ``flow`` to its end on this thread."""
    send, throw = flow.send, flow.throw
    try:
        command = send(None)
        while True:
            try:
                value = command.sync(engine)
            except BaseException as exc:
                command = throw(exc)
            else:
                command = send(value)
    except StopIteration as stop:
        result: R = stop.value
        return result


async def drive_async(engine: Engine, flow: Generator[Command, Any, R]) -> R:
    """Run ``flow`` to its end on the running event loop (``await``-ing each command)."""
    send, throw = flow.send, flow.throw
    try:
        command = send(None)
        while True:
            try:
                value = await command.run_async(engine)
            except BaseException as exc:
                command = throw(exc)
            else:
                command = send(value)
    except StopIteration as stop:
        result: R = stop.value
        return result


def driven(engine: Engine, flow: Generator[Command, Any, Outcome] | Outcome) -> Outcome:
    """``drive`` a flow; an outcome decided before any I/O passes through."""
    return flow if isinstance(flow, Outcome) else drive(engine, flow)


async def driven_async(
    engine: Engine, flow: Generator[Command, Any, Outcome] | Outcome
) -> Outcome:
    """``drive_async`` a flow; an outcome decided before any I/O passes through."""
    return flow if isinstance(flow, Outcome) else await drive_async(engine, flow)


__all__ = ["drive", "drive_async", "driven", "driven_async"]
