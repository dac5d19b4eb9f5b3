"""The project's demo: duplicate, concurrent, failing and crashing deliveries through the core
handler and real Celery and Dramatiq workers, on an embedded SQLite store by default.

Run it with ``idempotent-tasks demo`` or ``python -m idempotent_tasks.demo``.  Each section
is a module with ``run_scenario(store_url, workdir) -> list[ScenarioLine]``
(:mod:`.core_scenario`, ``celery_scenario``, ``dramatiq_scenario``); :mod:`.run` orchestrates
them and prints the report.  Importing this package imports no framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._report import ScenarioLine

if TYPE_CHECKING:
    from .run import run_demo


def __getattr__(name: str) -> Any:
    if name == "run_demo":
        from .run import run_demo

        return run_demo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ScenarioLine", "run_demo"]
