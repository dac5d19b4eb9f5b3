"""What ``setup`` attaches to a Celery app, and how the rest of the integration finds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import celery

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.runner import MaintenanceRunner, MaintenanceSchedule

RECOVER_TASK = "idempotency.recover_stuck"
CLEANUP_TASK = "idempotency.cleanup_expired"
ATTRIBUTE = "_idempotent_tasks_state"

Maintenance = Literal["beat", "worker"]


@dataclass(slots=True)
class CeleryState:
    """What ``setup`` attached to one Celery app."""

    handler: IdempotencyHandler
    default_tenant: str | None
    maintenance: Maintenance
    schedule: MaintenanceSchedule
    runner: MaintenanceRunner | None = None
    risks: list[str] = field(default_factory=list)


def state_for(app: celery.Celery) -> CeleryState:
    """The state ``setup`` attached; CONFIGURATION_ERROR when it was never called."""
    state = getattr(app, ATTRIBUTE, None)
    if not isinstance(state, CeleryState):
        raise ConfigurationError(
            "idempotent_tasks.celery.setup(app, handler) was not called for this Celery app"
        )
    return state


def get_handler(app: celery.Celery) -> IdempotencyHandler:
    """The handler ``setup`` attached to ``app``.

    Args:
        app: The Celery app ``setup(app, handler)`` was called with.

    Returns:
        That handler.

    Raises:
        ConfigurationError: ``setup`` was never called for ``app``.
    """
    return state_for(app).handler


__all__ = ["CLEANUP_TASK", "RECOVER_TASK", "CeleryState", "get_handler", "state_for"]
