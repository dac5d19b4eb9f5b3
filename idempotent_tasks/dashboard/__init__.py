"""The operator dashboard: a small server-rendered web UI over an idempotency store.

``pip install 'idempotent-tasks[dashboard]'``, then ``idempotent-tasks dashboard --store URL``
(it listens on ``127.0.0.1:8044`` unless told otherwise), or mount
:func:`create_app` in an existing ASGI app.  It shows the counts per operation and status, the
stuck records, a filtered list and each record's details; with an operator token
(``IDEMPOTENT_TASKS_DASHBOARD_TOKEN``) a signed-in operator can unpoison a FAILED record and
resolve an UNCERTAIN one, each after a confirmation step, through the handler's audited calls.

Plain HTML and one CSS block: no JavaScript, no build step.  Sessions live in the serving
process, so serve it from one process (the command does).
"""

from __future__ import annotations

try:
    from ._app import create_app
    from ._security import TOKEN_ENV
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    if exc.name not in ("starlette", "jinja2", "multipart", "python_multipart"):
        raise
    raise ImportError(
        "the dashboard needs its extra: pip install 'idempotent-tasks[dashboard]'"
    ) from exc

#: Where ``idempotent-tasks dashboard`` listens unless told otherwise: loopback only.
DEFAULT_HOST = "127.0.0.1"
#: Its default port.
DEFAULT_PORT = 8044

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "TOKEN_ENV", "create_app"]
