"""``enqueue_once`` inside a Django transaction: published by ``transaction.on_commit``.

A task enqueued from a view running in ``transaction.atomic()`` (or ``ATOMIC_REQUESTS``) or
from a ``transactional=True`` body must not reach a worker before the writes it depends on
are committed — nor at all when they roll back.  The deferrer below (installed by the app's
``ready()``) hands the publish to ``transaction.on_commit`` of the open atomic block: the
idempotency ``DATABASE``'s when it has one open, else the first connection of this thread
that has.  Outside any atomic block it declines, and ``enqueue_once`` publishes at once.

A publish that fails after the commit is logged (``enqueue_after_commit_failed``) and not
raised: the writes are committed and the request or task has succeeded; raising there would
make a client retry a request whose effects already happened.  The derived key makes a
manual re-enqueue of that task safe.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction

from .._core.logging import default_logger
from . import _settings

_log = default_logger()


def on_commit_deferrer(publish: Callable[[], object]) -> bool:
    """The :class:`~idempotent_tasks.enqueue.PublishDeferrer` of Django projects."""
    alias = _open_alias()
    if alias is None:
        return False
    transaction.on_commit(functools.partial(_publish, publish, alias), using=alias)
    return True


def _open_alias() -> str | None:
    """The alias whose atomic block the publish waits for, or ``None``."""
    open_aliases = [c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block]
    if not open_aliases:
        return None
    try:
        preferred = _settings.database_alias()
    except ImproperlyConfigured:
        preferred = None
    return preferred if preferred in open_aliases else open_aliases[0]


def _publish(publish: Callable[[], object], alias: str) -> None:
    try:
        publish()
    except Exception as exc:
        _log.error("enqueue_after_commit_failed", database=alias, error=repr(exc))


__all__ = ["on_commit_deferrer"]
