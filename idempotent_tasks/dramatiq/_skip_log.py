"""Keep Dramatiq's "Message … was skipped." warning for skips it means, not for replays.

A replay ends its delivery with ``SkipMessage`` (the body must not run, the message must be
acked, and the stored result becomes the message's result), and Dramatiq's worker thread logs
every ``SkipMessage`` as a WARNING.  A replay is the library working as intended — it is
logged as ``dramatiq_message_replayed`` at debug level — so its warning is noise that trains
operators to ignore the one that matters.

The filter drops exactly the worker's skip record whose message carries a *replayed*
:class:`~idempotent_tasks.IdempotencyContext` (attached by the middleware before it raises);
every other skip warning (e.g. the ``AgeLimit`` middleware's) and every other record pass
unchanged.  If a future Dramatiq words or places the warning differently, nothing matches and
the warning simply shows again.
"""

from __future__ import annotations

import logging
import threading

#: The format string of Dramatiq's warning (``dramatiq/worker.py``).
SKIPPED_MESSAGE = "Message %s was skipped."
#: The worker thread class whose logger (``dramatiq.worker.<class name>``) logs it: named
#: ``WorkerThread`` in Dramatiq 2, ``_WorkerThread`` in Dramatiq 1.
_WORKER_THREAD_CLASSES = ("WorkerThread", "_WorkerThread")
_CONTEXT_ATTRIBUTE = "idempotency_context"

_install_lock = threading.Lock()


def is_replay_skip(record: logging.LogRecord) -> bool:
    """Whether ``record`` is Dramatiq's skip warning for a message this library replayed."""
    if record.msg != SKIPPED_MESSAGE or not isinstance(record.args, tuple) or not record.args:
        return False
    context = getattr(record.args[0], _CONTEXT_ATTRIBUTE, None)
    return getattr(context, "outcome", None) == "replayed"


class ReplaySkipFilter(logging.Filter):
    """Drops Dramatiq's skip warning for replayed messages (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_replay_skip(record)


REPLAY_SKIP_FILTER = ReplaySkipFilter()


def worker_thread_loggers() -> list[logging.Logger]:
    """The loggers of the installed Dramatiq's worker threads."""
    from dramatiq import worker

    return [logging.getLogger(f"{worker.__name__}.{name}")
            for name in _WORKER_THREAD_CLASSES if hasattr(worker, name)]


def install_replay_skip_filter() -> None:
    """Attach the filter to the worker threads' logger, once per process."""
    with _install_lock:
        for logger in worker_thread_loggers():
            if REPLAY_SKIP_FILTER not in logger.filters:
                logger.addFilter(REPLAY_SKIP_FILTER)
