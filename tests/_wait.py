"""One budget for every wait in the tests, so they pass on a busy machine.

A test waits on an event, or polls a condition another thread or process makes true, with a
deadline only to fail loudly instead of hanging.  Every deadline is ``budget(seconds)``: the
figure a quiet machine needs, times ``IDEMPOTENT_TASKS_TEST_TIMEOUT_SCALE`` (default 1, and
3 under ``CI=true``: a CI runner is shared).  A passing run never waits longer for it; only a
failing wait takes longer to report.  ``make test-loaded`` runs suites beside CPU-burning
processes with the scale raised (docs/guarantees.md, "On a busy machine").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from tests._services import IN_CI

SCALE_ENV = "IDEMPOTENT_TASKS_TEST_TIMEOUT_SCALE"
SCALE = float(os.environ.get(SCALE_ENV) or ("3" if IN_CI else "1"))


def budget(seconds: float) -> float:
    """A deadline of ``seconds`` on a quiet machine, scaled for this one."""
    return seconds * SCALE


def wait_until(condition: Callable[[], object], what: str, timeout: float,
               poll: float = 0.02) -> object:
    """Poll ``condition`` until it is truthy (returned); ``AssertionError`` after
    ``budget(timeout)``."""
    limit = budget(timeout)
    deadline = time.monotonic() + limit
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:.0f}s waiting for {what}")
        time.sleep(poll)  # polling state another thread or process produces
    return value
